//! The contracts a workload container keeps with Converge (`shared/design.md`, "Contracts a
//! workload container keeps"), as code both sides share: the trainer writes progress lines with
//! [`ProgressLine::to_line`], the agent reads any container's stdout with [`parse_line`].
//!
//! Why a crate of its own: the agent must not depend on the trainer (an ML stack) and the
//! trainer must not depend on the agent (gRPC, Docker), yet both must agree byte for byte.
//!
//! Start at [`parse_line`]. A line that does not start with [`PROGRESS_PREFIX`] is ordinary log
//! output (`Ok(None)`); a line that does but cannot be read is a [`ContractError`] the caller
//! counts and skips, never a guess.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Every progress line starts with this word and one space, then a JSON object.
pub const PROGRESS_PREFIX: &str = "CONVERGE_PROGRESS";

/// The environment variable naming the directory a job checkpoints into and resumes from.
pub const CHECKPOINT_DIR_ENV: &str = "CONVERGE_CHECKPOINT_DIR";

/// What a job's container may count on: its checkpoint directory (at [`CHECKPOINT_DIR_ENV`])
/// and a tmpfs at `/tmp` are writable; the rest of its root is read-only; it has no
/// capabilities, cannot gain privileges (set-uid binaries do nothing) and has a bounded number
/// of processes. A job image must not expect to write elsewhere, bind ports below 1024 or
/// change users.
pub const JOB_TMPFS: &str = "/tmp";

/// The most cores a worker may offer (the agent's `--cpus`), and so a job may ask for.
pub const MAX_WORKER_CPUS: f64 = 4096.0;

/// Docker's least memory limit, bytes (it refuses a container with less).
pub const MIN_MEMORY_BYTES: u64 = 6 * 1024 * 1024;

/// A job's `user` as Docker's `User`: "UID" or "UID:GID", numeric (a scratch image has no
/// /etc/passwd to look a name up in). `Ok(None)` for empty (the image's user).
pub fn parse_user(user: &str) -> Result<Option<(u32, Option<u32>)>, String> {
    if user.is_empty() {
        return Ok(None);
    }
    let bad = || format!("`{user}` is not a numeric user id, UID or UID:GID (e.g. 1000:1000)");
    let (uid, gid) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let uid: u32 = uid.parse().map_err(|_| bad())?;
    if uid == 0 {
        return Err(format!(
            "`{user}` is root: leave it empty for the image's user, or give another id"
        ));
    }
    let gid = gid
        .map(|g| g.parse::<u32>().map_err(|_| bad()))
        .transpose()?;
    Ok(Some((uid, gid)))
}

/// Longest line the parser looks at; a longer one is malformed (a runaway print, not progress).
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// Whether a smaller or a larger metric is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Smaller is better (a loss).
    #[default]
    Minimize,
    /// Larger is better (an accuracy).
    Maximize,
}

impl Direction {
    /// Parses `minimize`/`maximize` (also `min`/`max`), case-insensitively.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "minimize" | "min" => Some(Self::Minimize),
            "maximize" | "max" => Some(Self::Maximize),
            _ => None,
        }
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minimize => "minimize",
            Self::Maximize => "maximize",
        }
    }
}

/// What a checkpoint line says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointEvent {
    /// The full training state was written (atomically) under the checkpoint directory.
    Saved,
    /// The job started from a checkpoint it found there.
    Restored,
}

/// One progress report, as a container prints it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ProgressLine {
    /// Training step (monotonic across restarts of the same job).
    pub step: u64,
    /// Steps the job will run in all, when it knows.
    pub total_steps: Option<u64>,
    /// Name of the evaluation function (`loss`, `accuracy`, ...).
    pub metric: Option<String>,
    /// Its value at `step`.
    pub value: Option<f64>,
    /// Whether smaller or larger is better, when the job says.
    pub direction: Option<Direction>,
    /// Seconds of training since the first start of the job (restarts included).
    pub elapsed_s: Option<f64>,
    /// Set on the last line of a finished job.
    pub done: bool,
    /// Set on a line reporting a checkpoint save or restore.
    pub checkpoint: Option<CheckpointEvent>,
    /// Checkpoint size in bytes, on checkpoint lines.
    pub checkpoint_bytes: Option<u64>,
}

/// A line that starts like progress but cannot be read as progress.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ContractError {
    /// The text after the prefix is not a JSON object.
    #[error("progress line is not a JSON object: {0}")]
    NotJson(String),
    /// The object has no non-negative integer `step`.
    #[error("progress line has no integer `step`")]
    NoStep,
    /// Neither the named metric nor any known metric field holds a finite number.
    #[error("progress line has no finite metric value (looked for {0})")]
    NoMetric(String),
    /// A field has the wrong type.
    #[error("progress line field `{field}` is invalid: {why}")]
    BadField {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// The line is longer than [`MAX_LINE_BYTES`].
    #[error("progress line is {0} bytes, over the {MAX_LINE_BYTES}-byte limit")]
    TooLong(usize),
}

/// Fields with a meaning of their own; any other numeric field may be the metric.
const RESERVED: &[&str] = &[
    "step",
    "total_steps",
    "metric",
    "value",
    "direction",
    "elapsed_s",
    "done",
    "checkpoint",
    "checkpoint_bytes",
];

/// Metric names tried, in order, when neither the job spec nor the line names one.
const WELL_KNOWN_METRICS: &[&str] = &["loss", "accuracy", "acc", "error"];

/// Reads one line of container output.
///
/// `expected_metric` is the metric the job was submitted with, if any: the value is read from
/// the field of that name first. Returns `Ok(None)` for ordinary log lines.
pub fn parse_line(
    line: &str,
    expected_metric: Option<&str>,
) -> Result<Option<ProgressLine>, ContractError> {
    let line = line.trim_end_matches(['\r', '\n']);
    // Docker may prefix nothing, but a job's own logger may indent; only leading spaces are
    // tolerated so that "xCONVERGE_PROGRESS" is never taken for progress.
    let Some(rest) = line.trim_start().strip_prefix(PROGRESS_PREFIX) else {
        return Ok(None);
    };
    if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return Ok(None);
    }
    if line.len() > MAX_LINE_BYTES {
        return Err(ContractError::TooLong(line.len()));
    }
    let obj: Map<String, Value> = match serde_json::from_str(rest.trim()) {
        Ok(Value::Object(o)) => o,
        Ok(other) => return Err(ContractError::NotJson(format!("got {}", kind(&other)))),
        Err(e) => return Err(ContractError::NotJson(e.to_string())),
    };
    let step = obj
        .get("step")
        .and_then(Value::as_u64)
        .ok_or(ContractError::NoStep)?;
    let total_steps = opt_u64(&obj, "total_steps")?;
    let metric_field = match obj.get("metric") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ContractError::BadField {
                field: "metric",
                why: "must be a string".into(),
            });
        }
    };
    let direction = match obj.get("direction") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Direction::parse(s).ok_or(ContractError::BadField {
            field: "direction",
            why: format!("`{s}` is neither minimize nor maximize"),
        })?),
        Some(_) => {
            return Err(ContractError::BadField {
                field: "direction",
                why: "must be a string".into(),
            });
        }
    };
    let done = match obj.get("done") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ContractError::BadField {
                field: "done",
                why: "must be true or false".into(),
            });
        }
    };
    let checkpoint = match obj.get("checkpoint") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value::<CheckpointEvent>(v.clone()).map_err(|_| {
                ContractError::BadField {
                    field: "checkpoint",
                    why: format!("{v} is neither \"saved\" nor \"restored\""),
                }
            })?,
        ),
    };
    let elapsed_s = match obj.get("elapsed_s") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_f64().filter(|x| x.is_finite() && *x >= 0.0).ok_or(
            ContractError::BadField {
                field: "elapsed_s",
                why: "must be a non-negative number".into(),
            },
        )?),
    };

    // Which field holds the metric. With the job spec's name: that field, or `value` where
    // the line names no other metric; nothing else, for a line that lacks the metric (a
    // diverged loss written as null, say) must not have its learning rate read as the loss.
    // Without: the line's own `metric` name, then `value`, then a well-known name, then the
    // only other numeric field.
    let mut candidates: Vec<&str> = Vec::new();
    match expected_metric {
        Some(name) => {
            candidates.push(name);
            if metric_field.as_deref().is_none_or(|m| m == name) {
                candidates.push("value");
            }
        }
        None => {
            candidates.extend(metric_field.as_deref());
            candidates.push("value");
            candidates.extend(WELL_KNOWN_METRICS);
        }
    }
    let mut found = candidates
        .iter()
        .find_map(|k| finite(&obj, k).map(|v| (k.to_string(), v)));
    if found.is_none() && expected_metric.is_none() {
        let others: Vec<(&String, f64)> = obj
            .iter()
            .filter(|(k, _)| !RESERVED.contains(&k.as_str()))
            .filter_map(|(k, v)| v.as_f64().filter(|x| x.is_finite()).map(|x| (k, x)))
            .collect();
        if let [(k, v)] = others.as_slice() {
            found = Some(((*k).clone(), *v));
        }
    }
    // Bookkeeping lines (a checkpoint saved, the job done) need not carry a metric.
    let (metric, value) = match found {
        Some((k, v)) => (Some(metric_field.unwrap_or(k)), Some(v)),
        None if done || checkpoint.is_some() => (metric_field, None),
        None => return Err(ContractError::NoMetric(candidates.join(", "))),
    };
    Ok(Some(ProgressLine {
        step,
        total_steps,
        metric,
        value,
        direction,
        elapsed_s,
        done,
        checkpoint,
        checkpoint_bytes: opt_u64(&obj, "checkpoint_bytes")?,
    }))
}

impl ProgressLine {
    /// Formats the line a container prints (no trailing newline). The metric value is written
    /// under both `value` and the metric's own name, so readers that know only the design's
    /// short form (`{"step":1,"loss":0.5}`) read it too.
    pub fn to_line(&self) -> String {
        let mut o = Map::new();
        o.insert("step".into(), self.step.into());
        if let Some(t) = self.total_steps {
            o.insert("total_steps".into(), t.into());
        }
        if let Some(m) = &self.metric {
            o.insert("metric".into(), m.clone().into());
        }
        if let Some(v) = self.value {
            o.insert("value".into(), json_f64(v));
            if let Some(m) = &self.metric
                && !RESERVED.contains(&m.as_str())
            {
                o.insert(m.clone(), json_f64(v));
            }
        }
        if let Some(d) = self.direction {
            o.insert("direction".into(), d.as_str().into());
        }
        if let Some(e) = self.elapsed_s {
            o.insert("elapsed_s".into(), json_f64((e * 1000.0).round() / 1000.0));
        }
        if self.done {
            o.insert("done".into(), true.into());
        }
        if let Some(c) = self.checkpoint {
            o.insert(
                "checkpoint".into(),
                serde_json::to_value(c).expect("enum serializes"),
            );
        }
        if let Some(b) = self.checkpoint_bytes {
            o.insert("checkpoint_bytes".into(), b.into());
        }
        format!("{PROGRESS_PREFIX} {}", Value::Object(o))
    }
}

fn json_f64(v: f64) -> Value {
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
}

fn finite(obj: &Map<String, Value>, key: &str) -> Option<f64> {
    obj.get(key)?.as_f64().filter(|x| x.is_finite())
}

fn opt_u64(obj: &Map<String, Value>, key: &'static str) -> Result<Option<u64>, ContractError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or(ContractError::BadField {
            field: key,
            why: "must be a non-negative integer".into(),
        }),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_log_lines_are_not_progress() {
        assert_eq!(parse_line("epoch 3 loss 0.5", None), Ok(None));
        assert_eq!(parse_line("XCONVERGE_PROGRESS {}", None), Ok(None));
        assert_eq!(parse_line("CONVERGE_PROGRESSED {}", None), Ok(None));
    }

    #[test]
    fn design_short_form_is_read() {
        let p = parse_line(
            r#"CONVERGE_PROGRESS {"step":120,"total_steps":5000,"loss":0.53}"#,
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.step, 120);
        assert_eq!(p.total_steps, Some(5000));
        assert_eq!(p.metric.as_deref(), Some("loss"));
        assert_eq!(p.value, Some(0.53));
    }

    #[test]
    fn expected_metric_wins_over_other_numbers() {
        let p = parse_line(
            r#"CONVERGE_PROGRESS {"step":1,"lr":0.1,"bleu":21.5}"#,
            Some("bleu"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.value, Some(21.5));
        // Without the hint two candidate fields are ambiguous: refused, not guessed.
        assert!(matches!(
            parse_line(r#"CONVERGE_PROGRESS {"step":1,"lr":0.1,"bleu":21.5}"#, None),
            Err(ContractError::NoMetric(_))
        ));
    }

    /// With the job's metric named, a line that lacks it is not read through another field:
    /// not a null loss's learning rate, not another metric, not a well-known name.
    #[test]
    fn a_line_without_the_expected_metric_is_not_read_as_it() {
        for line in [
            r#"CONVERGE_PROGRESS {"step":5,"loss":null,"lr":0.001}"#,
            r#"CONVERGE_PROGRESS {"step":5,"accuracy":0.9}"#,
            r#"CONVERGE_PROGRESS {"step":5,"metric":"accuracy","value":0.9}"#,
        ] {
            let p = parse_line(line, Some("loss"));
            assert!(
                matches!(&p, Err(ContractError::NoMetric(named)) if named.contains("loss")),
                "{line} read as: {p:?}"
            );
        }
        // `value` still carries it where the line names it, or names none.
        for line in [
            r#"CONVERGE_PROGRESS {"step":5,"metric":"loss","value":0.5}"#,
            r#"CONVERGE_PROGRESS {"step":5,"value":0.5}"#,
        ] {
            let p = parse_line(line, Some("loss")).unwrap().unwrap();
            assert_eq!(p.value, Some(0.5), "{line}");
        }
    }

    #[test]
    fn malformed_lines_name_the_problem() {
        assert!(matches!(
            parse_line("CONVERGE_PROGRESS {not json", None),
            Err(ContractError::NotJson(_))
        ));
        assert!(matches!(
            parse_line("CONVERGE_PROGRESS [1,2]", None),
            Err(ContractError::NotJson(_))
        ));
        assert_eq!(
            parse_line(r#"CONVERGE_PROGRESS {"loss":1}"#, None),
            Err(ContractError::NoStep)
        );
        assert_eq!(
            parse_line(r#"CONVERGE_PROGRESS {"step":-1,"loss":1}"#, None),
            Err(ContractError::NoStep)
        );
        assert!(matches!(
            parse_line(
                r#"CONVERGE_PROGRESS {"step":1,"loss":1,"direction":"up"}"#,
                None
            ),
            Err(ContractError::BadField {
                field: "direction",
                ..
            })
        ));
        let long = format!(
            "CONVERGE_PROGRESS {{\"step\":1,\"loss\":1,\"pad\":\"{}\"}}",
            "x".repeat(MAX_LINE_BYTES)
        );
        assert!(matches!(
            parse_line(&long, None),
            Err(ContractError::TooLong(_))
        ));
    }

    #[test]
    fn bookkeeping_lines_need_no_metric() {
        let p = parse_line(
            r#"CONVERGE_PROGRESS {"step":7,"checkpoint":"saved","checkpoint_bytes":42}"#,
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.checkpoint, Some(CheckpointEvent::Saved));
        assert_eq!(p.checkpoint_bytes, Some(42));
        assert_eq!(p.value, None);
        let p = parse_line(r#"CONVERGE_PROGRESS {"step":9,"done":true}"#, None)
            .unwrap()
            .unwrap();
        assert!(p.done);
    }

    #[test]
    fn formatted_lines_round_trip() {
        let line = ProgressLine {
            step: 300,
            total_steps: Some(1000),
            metric: Some("loss".into()),
            value: Some(0.125),
            direction: Some(Direction::Minimize),
            elapsed_s: Some(12.3456),
            done: false,
            checkpoint: Some(CheckpointEvent::Saved),
            checkpoint_bytes: Some(1234),
        };
        let text = line.to_line();
        assert!(text.starts_with("CONVERGE_PROGRESS {"));
        assert!(text.contains(r#""loss":0.125"#), "{text}");
        let back = parse_line(&text, None).unwrap().unwrap();
        assert_eq!(
            back,
            ProgressLine {
                elapsed_s: Some(12.346),
                ..line
            }
        );
    }
}
