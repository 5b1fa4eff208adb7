//! The value curve of Fig. 1 (value-based-allocation.txt:65-72).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A piecewise-linear value curve (Fig. 1, :65): `max_value` until `full_value_until_s` after
/// release, then falling linearly to 0 at `zero_value_at_s`, and 0 from then on. The fields are
/// the wire's `ValueCurve` (proto/converge/v1/common.proto).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ValueCurve {
    /// Vmax_j.
    pub max_value: f64,
    /// Seconds after release during which the job is worth `max_value`.
    pub full_value_until_s: f64,
    /// Seconds after release from which the job is worth nothing.
    pub zero_value_at_s: f64,
}

impl ValueCurve {
    /// A checked curve.
    pub fn new(max_value: f64, full_value_until_s: f64, zero_value_at_s: f64) -> Result<Self> {
        let c = ValueCurve {
            max_value,
            full_value_until_s,
            zero_value_at_s,
        };
        c.validate()?;
        Ok(c)
    }

    /// The manager's submit-time rule (manager/src/validate.rs): `max_value > 0` and
    /// `0 <= full_value_until_s <= zero_value_at_s`, all finite.
    pub fn validate(&self) -> Result<()> {
        let ok = self.max_value.is_finite()
            && self.max_value > 0.0
            && self.full_value_until_s.is_finite()
            && self.full_value_until_s >= 0.0
            && self.zero_value_at_s.is_finite()
            && self.zero_value_at_s >= self.full_value_until_s;
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidValueCurve {
                max_value: self.max_value,
                full_value_until_s: self.full_value_until_s,
                zero_value_at_s: self.zero_value_at_s,
            })
        }
    }

    /// VC_j at `since_release` seconds after release (:65: maximal from release, never
    /// increasing). With `full == zero` the curve is a step: full value up to and including
    /// that instant, 0 after. A completion that never happens (`+∞`) is worth 0.
    pub fn value_at(&self, since_release: f64) -> f64 {
        if since_release <= self.full_value_until_s {
            self.max_value
        } else if since_release >= self.zero_value_at_s || since_release.is_nan() {
            0.0
        } else {
            // Strictly inside (full, zero), so the span is positive.
            self.max_value * (self.zero_value_at_s - since_release)
                / (self.zero_value_at_s - self.full_value_until_s)
        }
    }
}

/// An amount of value as reasons write it: one decimal from 1 up, two significant digits
/// below, so that a curve worth 0.1 does not read as "worth 0.0 of its value 0.1" when its
/// job would keep 0.046 of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Amount(pub f64);

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if !v.is_finite() {
            return write!(f, "{v}");
        }
        // Below what six decimals show (float noise, -0): nothing.
        if v.abs() < 5e-7 {
            return f.write_str("0.0");
        }
        // Decimals for two significant digits: 0.046 → 3, 0.1 → 2; at least 1, at most 6.
        let mut digits = (1 - v.abs().log10().floor() as i32).clamp(1, 6) as usize;
        // Rounding may carry into a new leading digit (0.0996 → 0.100, 0.996 → 1.00).
        if digits > 1 && (v.abs() * 10f64.powi(digits as i32)).round() >= 100.0 {
            digits -= 1;
        }
        write!(f, "{v:.digits$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fig1_shape_flat_then_linear_then_zero() {
        let c = ValueCurve::new(100.0, 200.0, 600.0).unwrap();
        assert_eq!(c.value_at(-5.0), 100.0);
        assert_eq!(c.value_at(0.0), 100.0);
        assert_eq!(c.value_at(200.0), 100.0);
        assert_eq!(c.value_at(300.0), 75.0);
        assert_eq!(c.value_at(400.0), 50.0);
        assert_eq!(c.value_at(600.0), 0.0);
        assert_eq!(c.value_at(1e9), 0.0);
        assert_eq!(c.value_at(f64::INFINITY), 0.0);
    }

    #[test]
    fn step_curve_when_full_equals_zero() {
        let c = ValueCurve::new(10.0, 50.0, 50.0).unwrap();
        assert_eq!(c.value_at(50.0), 10.0);
        assert_eq!(c.value_at(50.000001), 0.0);
    }

    #[test]
    fn invalid_curves_are_refused_with_the_rule() {
        for (m, f, z) in [
            (0.0, 1.0, 2.0),
            (1.0, -1.0, 2.0),
            (1.0, 3.0, 2.0),
            (f64::NAN, 1.0, 2.0),
            (1.0, 1.0, f64::INFINITY),
        ] {
            let e = ValueCurve::new(m, f, z).unwrap_err();
            assert!(e.to_string().contains("max_value > 0"), "{e}");
        }
    }

    #[test]
    fn amounts_keep_two_significant_digits_below_one() {
        let shown = |v: f64| Amount(v).to_string();
        assert_eq!(shown(0.046), "0.046");
        assert_eq!(shown(0.1), "0.10");
        assert_eq!(shown(0.0), "0.0");
        assert_eq!(shown(9.96), "10.0");
        assert_eq!(shown(123.45), "123.5");
        assert_eq!(shown(-0.25), "-0.25");
        assert_eq!(shown(0.0996), "0.10");
        assert_eq!(shown(0.996), "1.0");
        assert_eq!(shown(-0.0), "0.0");
        assert_eq!(shown(1e-9), "0.0");
    }
}
