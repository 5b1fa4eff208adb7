//! W3C trace context (`traceparent`) as it travels in every [`crate::pb::Command`].
//!
//! The string is opaque to the protocol; this module only checks its shape so that a
//! malformed value from the wire is dropped rather than propagated.

/// True when `s` looks like a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`).
pub fn is_valid_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    matches!(parts.as_slice(), [v, t, p, f]
        if v.len() == 2 && t.len() == 32 && p.len() == 16 && f.len() == 2
            && parts.iter().all(|x| x.bytes().all(|b| b.is_ascii_hexdigit()))
            && *t != "00000000000000000000000000000000"
            && *p != "0000000000000000")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_shape_is_checked() {
        assert!(is_valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_valid_traceparent(""));
        assert!(!is_valid_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!is_valid_traceparent("00-xyz-00f067aa0ba902b7-01"));
    }
}
