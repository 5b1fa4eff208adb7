//! Submission validation: every rule names the field to fix, and a rejected submission creates
//! nothing (validation runs before the actor records anything).

use converge_messenger::pb::{Direction, JobSpec};

use crate::error::{Error, Result};

/// Longest image reference accepted.
pub const MAX_IMAGE: usize = 512;
/// Longest job name accepted.
pub const MAX_NAME: usize = 128;
/// Longest metric name accepted.
pub const MAX_METRIC: usize = 64;
/// Most arguments, env entries or labels accepted.
pub const MAX_ENTRIES: usize = 256;
/// Longest single argument, env or label key/value accepted.
pub const MAX_VALUE: usize = 4096;
/// Most bytes of all arguments, of all env entries, or of all labels together.
pub const MAX_TOTAL: usize = 64 * 1024;
/// Longest duration a spec may give, seconds (a year): a job's estimate or value times past it
/// are typing mistakes, and printed back in reasons they ran to hundreds of digits.
pub const MAX_SECONDS: f64 = 365.0 * 86_400.0;
/// Largest request the control API decodes; the field limits above keep a valid one far
/// below it, so an oversized field is refused by validation, naming it, not by the decoder.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// Checks an image reference by Docker's grammar (distribution/reference, `reference.go`):
/// `[HOST[:PORT]/]PATH[:TAG][@ALGORITHM:HEX]`, each PATH component lowercase letters and digits
/// joined by `.`, `_`, `__` or dashes. A reference Docker would refuse was accepted and failed
/// only at its start ("invalid reference format"), after a job had been created for it.
fn image_reference(image: &str) -> std::result::Result<(), String> {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let (algorithm, hex) = digest.split_once(':').ok_or("a digest is ALGORITHM:HEX")?;
        let lower = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let algorithm_ok = algorithm.starts_with(|c: char| c.is_ascii_lowercase())
            && algorithm.chars().all(|c| lower(c) || "+._-".contains(c));
        if !algorithm_ok {
            return Err(format!("`{algorithm}` is not a digest algorithm"));
        }
        // go-digest: lowercase hex, of the length its algorithm gives where Docker knows it.
        let length = match algorithm {
            "sha256" => Some(64),
            "sha384" => Some(96),
            "sha512" => Some(128),
            _ => None,
        };
        let hex_ok = hex.len() >= 32
            && length.is_none_or(|n| hex.len() == n)
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
        if !hex_ok {
            return Err(format!(
                "a {algorithm} digest is {} lowercase hexadecimal digits",
                length.map_or("at least 32".to_string(), |n| n.to_string())
            ));
        }
    }
    // A tag follows the last `:` after the last `/` (a `:` before it is a registry's port).
    let path_at = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[path_at..].rfind(':') {
        Some(i) => (&rest[..path_at + i], Some(&rest[path_at + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let ok = tag.len() <= 128
            && tag.chars().next().is_some_and(word)
            && tag.chars().all(|c| word(c) || c == '.' || c == '-');
        if !ok {
            return Err(format!(
                "the tag `{tag}` must be letters, digits, `_`, `.` or `-`, not starting with `.` or `-`"
            ));
        }
    }
    if name.len() > 255 {
        return Err("the name before its tag is longer than 255 characters".into());
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    // Docker's rule for a registry host: the first of several parts, with a `.` or a `:`, or
    // `localhost`, or any capital letter.
    if parts.len() > 1
        && (parts[0].contains(['.', ':'])
            || parts[0] == "localhost"
            || parts[0].chars().any(|c| c.is_ascii_uppercase()))
    {
        let host = parts.remove(0);
        // An IPv6 address in brackets, or a name; then an optional port.
        let (domain, port) = match host.strip_prefix('[').and_then(|h| h.split_once(']')) {
            Some((address, after)) => {
                if address.is_empty() || !address.chars().all(|c| c.is_ascii_hexdigit() || c == ':')
                {
                    return Err(format!("`{host}` is not a registry host"));
                }
                match after.strip_prefix(':') {
                    Some(port) => ("ipv6", Some(port)),
                    None if after.is_empty() => ("ipv6", None),
                    None => return Err(format!("`{host}` is not a registry host")),
                }
            }
            None => match host.split_once(':') {
                Some((domain, port)) => (domain, Some(port)),
                None => (host, None),
            },
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        };
        if !domain.split('.').all(label_ok) {
            return Err(format!("`{host}` is not a registry host"));
        }
        if port.is_some_and(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit())) {
            return Err(format!("`{host}` has a port that is not a number"));
        }
    }
    for part in parts {
        path_component(part).map_err(|why| format!("`{part}` {why}"))?;
    }
    Ok(())
}

/// One `/`-separated part of an image's path: lowercase letters and digits, joined by `.`,
/// `_`, `__` or one or more `-`.
fn path_component(part: &str) -> std::result::Result<(), &'static str> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !part.chars().next().is_some_and(alnum) || !part.chars().last().is_some_and(alnum) {
        return Err("must start and end with a lowercase letter or digit");
    }
    // Each run of other characters between letters and digits is one separator.
    for run in part.split(alnum).filter(|r| !r.is_empty()) {
        if !(matches!(run, "." | "_" | "__") || run.chars().all(|c| c == '-')) {
            return Err(
                "may hold only lowercase letters, digits, and `.`, `_`, `__` or dashes between them",
            );
        }
    }
    Ok(())
}

/// What validation needs to know about the cluster.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// Largest CPU capacity of any known worker (None: no worker has registered yet).
    pub max_cpus: Option<f64>,
    /// Largest memory of any known worker.
    pub max_memory: Option<u64>,
}

/// The first bound value curve `vc` breaks, said with the number that breaks it: the whole
/// rule alone left a user to find which of three numbers was wrong.
fn curve_fault(vc: &converge_messenger::pb::ValueCurve) -> Option<String> {
    let (max, full, zero) = (vc.max_value, vc.full_value_until_s, vc.zero_value_at_s);
    if !(max.is_finite() && max > 0.0) {
        Some(format!("max_value {max} must be a number above 0"))
    } else if !(full.is_finite() && full >= 0.0) {
        Some(format!(
            "full_value_until_s {full} must be a number of seconds from 0"
        ))
    } else if !(zero.is_finite() && zero > 0.0) {
        Some(format!(
            "zero_value_at_s {zero} must be a number of seconds above 0 (a job worth nothing \
             from its submission is refused)"
        ))
    } else if zero < full {
        Some(format!(
            "zero_value_at_s {zero} comes before full_value_until_s {full}: the value falls \
             to nothing after its full value ends"
        ))
    } else if zero > MAX_SECONDS {
        Some(format!("zero_value_at_s {zero} is past a year"))
    } else {
        None
    }
}

/// What a valid `spec` asks that the manager's policy (`policy`, reading value curves or not)
/// will not do: said back to the user, as Kubernetes' API server says a warning.
pub fn warnings(spec: &JobSpec, policy: &str, reads_value_curves: bool) -> Vec<String> {
    let mut out = Vec::new();
    if spec.value_curve.is_some() && !reads_value_curves {
        out.push(format!(
            "spec.value_curve is ignored: the manager's policy `{policy}` never reads one; the \
             job runs to its end whatever its value"
        ));
    }
    out
}

/// Checks `spec` and fills in defaults (metric `loss`, direction minimize).
pub fn validate(spec: Option<JobSpec>, limits: Limits) -> Result<JobSpec> {
    let mut spec = spec.ok_or_else(|| Error::invalid("spec", "required"))?;
    if spec.image.trim().is_empty() {
        return Err(Error::invalid(
            "spec.image",
            "required (e.g. \"converge/trainer:dev\")",
        ));
    }
    max_len("spec.image", &spec.image, MAX_IMAGE)?;
    image_reference(&spec.image).map_err(|why| {
        Error::invalid(
            "spec.image",
            format!(
                "`{}` is not an image reference: {why} (e.g. \"converge/trainer:dev\" or \"registry:5000/team/model@sha256:...\")",
                spec.image
            ),
        )
    })?;
    max_len("spec.name", &spec.name, MAX_NAME)?;
    if spec.name.chars().any(char::is_control) {
        return Err(Error::invalid(
            "spec.name",
            "must not contain control characters (a newline or tab would break `list`'s rows)",
        ));
    }
    if spec.metric.is_empty() {
        spec.metric = "loss".into();
    }
    max_len("spec.metric", &spec.metric, MAX_METRIC)?;
    if !spec
        .metric
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        return Err(Error::invalid(
            "spec.metric",
            format!("`{}` must be letters, digits, `_`, `-` or `.`", spec.metric),
        ));
    }
    match Direction::try_from(spec.direction) {
        Ok(Direction::Unspecified) => spec.direction = Direction::Minimize as i32,
        Ok(_) => {}
        Err(_) => {
            return Err(Error::invalid(
                "spec.direction",
                format!(
                    "unknown metric direction {}; use DIRECTION_MINIMIZE or DIRECTION_MAXIMIZE",
                    spec.direction
                ),
            ));
        }
    }
    if !(spec.cpus.is_finite() && spec.cpus > 0.0) {
        return Err(Error::invalid(
            "spec.cpus",
            format!("must be a number of cores > 0, got {}", spec.cpus),
        ));
    }
    if spec.cpus > converge_contract::MAX_WORKER_CPUS {
        return Err(Error::invalid(
            "spec.cpus",
            format!(
                "{} is over {} cores, the most a worker can offer",
                spec.cpus,
                converge_contract::MAX_WORKER_CPUS
            ),
        ));
    }
    if let Some(max) = limits.max_cpus
        && spec.cpus > max + 1e-9
    {
        return Err(Error::invalid(
            "spec.cpus",
            format!(
                "{} exceeds the largest worker's capacity ({max} {})",
                spec.cpus,
                if max == 1.0 { "core" } else { "cores" }
            ),
        ));
    }
    let min = converge_contract::MIN_MEMORY_BYTES;
    if spec.memory_bytes != 0 && !(min..=i64::MAX as u64).contains(&spec.memory_bytes) {
        return Err(Error::invalid(
            "spec.memory_bytes",
            format!(
                "{} is not a memory limit Docker takes: 0 (none) or {min} (6 MiB) to {} bytes",
                spec.memory_bytes,
                i64::MAX
            ),
        ));
    }
    if let Some(max) = limits.max_memory
        && spec.memory_bytes > max
    {
        return Err(Error::invalid(
            "spec.memory_bytes",
            format!(
                "{} exceeds the largest worker's memory ({max} bytes)",
                spec.memory_bytes
            ),
        ));
    }
    entries(
        "spec.args",
        spec.args.iter().map(|a| ("", a.as_str())),
        spec.args.len(),
    )?;
    entries(
        "spec.env",
        spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        spec.env.len(),
    )?;
    entries(
        "spec.labels",
        spec.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        spec.labels.len(),
    )?;
    if spec.labels.contains_key("") {
        return Err(Error::invalid("spec.labels", "a label's key is empty"));
    }
    if let Some(k) = spec.labels.keys().find(|k| k.starts_with("converge.")) {
        return Err(Error::invalid(
            format!("spec.labels[{k}]"),
            "the `converge.` prefix is reserved for Converge's own labels",
        ));
    }
    if let Some(k) = spec.env.keys().find(|k| k.is_empty() || k.contains('=')) {
        return Err(Error::invalid(
            "spec.env",
            format!("`{k}` is not a valid variable name"),
        ));
    }
    if let Err(e) = converge_contract::parse_user(&spec.user) {
        return Err(Error::invalid("spec.user", e));
    }
    if let Some(fault) = spec.value_curve.as_ref().and_then(curve_fault) {
        return Err(Error::invalid(
            "spec.value_curve",
            format!(
                "{fault} (a curve needs max_value > 0 and 0 <= full_value_until_s <= \
                 zero_value_at_s <= {MAX_SECONDS}, a year)"
            ),
        ));
    }
    if !(spec.estimated_runtime_s.is_finite()
        && (0.0..=MAX_SECONDS).contains(&spec.estimated_runtime_s))
    {
        return Err(Error::invalid(
            "spec.estimated_runtime_s",
            format!("must be a number of seconds from 0 to {MAX_SECONDS} (a year)"),
        ));
    }
    if let Some(r) = &spec.stop_rule {
        if !(r.min_improvement.is_finite() && r.min_improvement > 0.0 && r.min_improvement < 1.0) {
            return Err(Error::invalid(
                "spec.stop_rule.min_improvement",
                "must be a fraction between 0 and 1 (0.003 = stop when the metric improved by \
                 less than 0.3% over the window)",
            ));
        }
        if r.window_steps == 0 {
            return Err(Error::invalid(
                "spec.stop_rule.window_steps",
                "must be at least 1 (the steps the improvement is measured over)",
            ));
        }
    }
    Ok(spec)
}

fn max_len(field: &str, s: &str, max: usize) -> Result<()> {
    if s.len() > max {
        return Err(Error::invalid(
            field,
            format!("is {} bytes, over the {max}-byte limit", s.len()),
        ));
    }
    Ok(())
}

fn entries<'a>(
    field: &str,
    items: impl Iterator<Item = (&'a str, &'a str)>,
    count: usize,
) -> Result<()> {
    if count > MAX_ENTRIES {
        return Err(Error::invalid(
            field,
            format!("has {count} entries, over the {MAX_ENTRIES}-entry limit"),
        ));
    }
    let mut total = 0;
    for (k, v) in items {
        if k.len() > MAX_VALUE || v.len() > MAX_VALUE {
            let which = if k.is_empty() {
                String::new()
            } else {
                format!(" `{}`", k.chars().take(64).collect::<String>())
            };
            return Err(Error::invalid(
                field,
                format!(
                    "entry{which} is {} bytes, over the {MAX_VALUE}-byte limit",
                    k.len() + v.len()
                ),
            ));
        }
        total += k.len() + v.len();
    }
    if total > MAX_TOTAL {
        return Err(Error::invalid(
            field,
            format!("is {total} bytes in all, over the {MAX_TOTAL}-byte limit"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            image: "converge/trainer:dev".into(),
            cpus: 1.0,
            ..Default::default()
        }
    }

    fn field_of(r: Result<JobSpec>) -> String {
        match r {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn oversized_and_malformed_fields_are_named() {
        let mut s = spec();
        s.env.insert("BIG".into(), "x".repeat(10 << 20));
        let err = validate(Some(s), Limits::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("spec.env: entry `BIG` is 10485763 bytes"),
            "{err}"
        );
        let mut s = spec();
        for i in 0..40 {
            s.labels.insert(format!("k{i}"), "v".repeat(2000));
        }
        let err = validate(Some(s), Limits::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("spec.labels: is 80110 bytes in all, over the 65536-byte limit"),
            "{err}"
        );
        let mut s = spec();
        s.user = "root".into();
        assert_eq!(field_of(validate(Some(s), Limits::default())), "spec.user");
        let mut s = spec();
        s.user = "1000:1000".into();
        assert!(validate(Some(s), Limits::default()).is_ok());
    }

    #[test]
    fn defaults_are_filled_in() {
        let s = validate(Some(spec()), Limits::default()).unwrap();
        assert_eq!(s.metric, "loss");
        assert_eq!(s.direction, Direction::Minimize as i32);
    }

    /// References Docker takes are accepted, and those it refuses ("invalid reference
    /// format") are refused at submission, naming the field, rather than failing at start.
    #[test]
    fn an_image_reference_docker_would_refuse_is_refused() {
        let hex = "a".repeat(64);
        for ok in [
            "busybox".to_string(),
            "converge/trainer:dev".into(),
            "localhost:5000/team/model:1.0".into(),
            "[::1]:5000/team/model:1.0".into(),
            "[2001:db8::1]/model".into(),
            format!("model@sha512:{}", "0".repeat(128)),
            "Registry.Example.com/a__b/c--d/e.f_g".into(),
            format!("registry:5000/team/model@sha256:{hex}"),
            format!("model:v2@sha256:{hex}"),
        ] {
            assert_eq!(image_reference(&ok), Ok(()), "{ok}");
        }
        for bad in [
            "Bad Image!!",
            "converge/Trainer",
            "trainer:",
            "trainer:-dev",
            "a..b",
            "a._b",
            "-a",
            "a/",
            "a//b",
            "host:port/x",
            "trainer@sha256:abc",
            "trainer@:abc",
            "[::1/model",
            "[zz]:5000/model",
        ] {
            assert!(image_reference(bad).is_err(), "{bad} was accepted");
        }
        for bad in [
            format!("trainer@sha256:{}", "A".repeat(64)),
            format!("trainer@sha256:{}", "a".repeat(32)),
            format!("trainer@1sha:{}", "a".repeat(64)),
            "a".repeat(256),
        ] {
            assert!(image_reference(&bad).is_err(), "{bad} was accepted");
        }
        let err = validate(
            Some(JobSpec {
                image: "Bad Image!!".into(),
                ..spec()
            }),
            Limits::default(),
        )
        .expect_err("refused");
        assert_eq!(field_of(Err(err)), "spec.image");
    }

    #[test]
    fn each_rule_names_its_field() {
        let lim = Limits {
            max_cpus: Some(2.0),
            max_memory: Some(1 << 30),
        };
        assert_eq!(field_of(validate(None, lim)), "spec");
        assert_eq!(
            field_of(validate(
                Some(JobSpec {
                    image: " ".into(),
                    ..spec()
                }),
                lim
            )),
            "spec.image"
        );
        for cpus in [0.0, -1.0, f64::NAN, 2.5, 1e308] {
            assert_eq!(
                field_of(validate(Some(JobSpec { cpus, ..spec() }), lim)),
                "spec.cpus",
                "cpus={cpus}"
            );
        }
        assert_eq!(
            field_of(validate(
                Some(JobSpec {
                    direction: 7,
                    ..spec()
                }),
                lim
            )),
            "spec.direction"
        );
        assert_eq!(
            field_of(validate(
                Some(JobSpec {
                    name: "n".repeat(MAX_NAME + 1),
                    ..spec()
                }),
                lim
            )),
            "spec.name"
        );
        assert_eq!(
            field_of(validate(
                Some(JobSpec {
                    memory_bytes: 2 << 30,
                    ..spec()
                }),
                lim
            )),
            "spec.memory_bytes"
        );
        let mut s = spec();
        s.labels.insert("converge.job".into(), "x".into());
        assert_eq!(
            field_of(validate(Some(s), lim)),
            "spec.labels[converge.job]"
        );
        let mut s = spec();
        s.labels.insert(String::new(), "x".into());
        assert_eq!(field_of(validate(Some(s), lim)), "spec.labels");
        for name in ["line1\nline2", "tab\there", "\u{1b}[31mred"] {
            let named = JobSpec {
                name: name.into(),
                ..spec()
            };
            assert_eq!(
                field_of(validate(Some(named), lim)),
                "spec.name",
                "{name:?}"
            );
        }
        // Unicode that prints is a name like any other.
        let named = JobSpec {
            name: "ünïcødé-名前".into(),
            ..spec()
        };
        assert!(validate(Some(named), lim).is_ok());
        // Docker's least, and past what its signed field holds (which wrapped to -1).
        for memory_bytes in [1, (6 << 20) - 1, u64::MAX] {
            let sized = JobSpec {
                memory_bytes,
                ..spec()
            };
            let no_limit = Limits {
                max_memory: None,
                ..lim
            };
            assert_eq!(
                field_of(validate(Some(sized), no_limit)),
                "spec.memory_bytes",
                "{memory_bytes}"
            );
        }
        // Durations past a year.
        let forever = JobSpec {
            estimated_runtime_s: 1e300,
            ..spec()
        };
        assert_eq!(
            field_of(validate(Some(forever), lim)),
            "spec.estimated_runtime_s"
        );
        let late = JobSpec {
            value_curve: Some(converge_messenger::pb::ValueCurve {
                max_value: 5.0,
                full_value_until_s: 10.0,
                zero_value_at_s: 1e300,
            }),
            ..spec()
        };
        assert_eq!(field_of(validate(Some(late), lim)), "spec.value_curve");
        // A value curve worth nothing from the start.
        let worthless = JobSpec {
            value_curve: Some(converge_messenger::pb::ValueCurve {
                max_value: 5.0,
                ..Default::default()
            }),
            ..spec()
        };
        assert_eq!(field_of(validate(Some(worthless), lim)), "spec.value_curve");
        // Each broken bound is named with its number.
        for ((max, full, zero), says) in [
            ((0.0, 10.0, 60.0), "max_value 0 must be"),
            ((5.0, -1.0, 60.0), "full_value_until_s -1 must be"),
            ((5.0, 0.0, 0.0), "zero_value_at_s 0 must be"),
            (
                (100.0, 300.0, 60.0),
                "zero_value_at_s 60 comes before full_value_until_s 300",
            ),
            ((5.0, 10.0, 1e300), "is past a year"),
        ] {
            let curve = JobSpec {
                value_curve: Some(converge_messenger::pb::ValueCurve {
                    max_value: max,
                    full_value_until_s: full,
                    zero_value_at_s: zero,
                }),
                ..spec()
            };
            match validate(Some(curve), lim) {
                Err(Error::InvalidArgument { message, .. }) => {
                    assert!(message.contains(says), "{message}")
                }
                other => panic!("expected InvalidArgument, got {other:?}"),
            }
        }
    }

    #[test]
    fn capacity_is_not_checked_before_any_worker_registers() {
        // With no worker known yet the job waits as Pending instead of being refused; beyond
        // what any worker can offer, it is refused all the same.
        let huge = JobSpec {
            cpus: 1e308,
            ..spec()
        };
        assert_eq!(
            field_of(validate(Some(huge), Limits::default())),
            "spec.cpus"
        );
        assert!(
            validate(
                Some(JobSpec {
                    cpus: 64.0,
                    ..spec()
                }),
                Limits::default()
            )
            .is_ok()
        );
    }

    #[test]
    fn a_stop_rule_outside_its_range_names_the_field() {
        let mut spec = JobSpec {
            image: "converge/trainer:dev".into(),
            cpus: 1.0,
            stop_rule: Some(converge_messenger::pb::StopRule {
                min_improvement: 1.5,
                window_steps: 100,
            }),
            ..Default::default()
        };
        let limits = Limits {
            max_cpus: Some(2.0),
            max_memory: None,
        };
        let err = validate(Some(spec.clone()), limits).unwrap_err();
        assert!(
            err.to_string().contains("spec.stop_rule.min_improvement"),
            "{err}"
        );
        spec.stop_rule = Some(converge_messenger::pb::StopRule {
            min_improvement: 0.01,
            window_steps: 0,
        });
        let err = validate(Some(spec.clone()), limits).unwrap_err();
        assert!(
            err.to_string().contains("spec.stop_rule.window_steps"),
            "{err}"
        );
        spec.stop_rule = Some(converge_messenger::pb::StopRule {
            min_improvement: 0.01,
            window_steps: 300,
        });
        assert!(validate(Some(spec), limits).is_ok());
    }
}
