//! Calibration: train each model at one thread and tabulate what a simulator needs to give its
//! jobs realistic curves: seconds per step, how fast the loss gets most of its improvement,
//! where it ends, memory and checkpoint size.
//!
//! Each model runs as a child process (this same binary) so that its peak RSS and CPU time are
//! its own, as they would be in a container. The numbers come from the child's progress lines
//! (parsed with the contract's own parser) and its closing log line on stderr.

use std::path::Path;
use std::process::Command;

use converge_contract::{CheckpointEvent, parse_line};

use crate::config::CalibrateArgs;
use crate::error::{Error, Result};
use crate::models::ModelKind;

/// One model's measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Model name.
    pub model: &'static str,
    /// `--size`.
    pub size: usize,
    /// Steps trained.
    pub steps: u64,
    /// Mini-batch size.
    pub batch: usize,
    /// Wall-clock training seconds per step (held-out evaluations every 1% of the run
    /// included); inflated when the machine is busy.
    pub secs_per_step: f64,
    /// CPU seconds per step of the whole process (start-up included): at one thread, the cost
    /// of a step on an otherwise idle core, whatever else the machine was doing.
    pub cpu_secs_per_step: Option<f64>,
    /// First reported step by which the loss had made 90% of its total improvement.
    pub steps_to_90: Option<u64>,
    /// Held-out loss at step 0.
    pub initial: f64,
    /// Held-out loss at the end.
    pub last: f64,
    /// Peak resident set size, KiB.
    pub peak_rss_kib: Option<u64>,
    /// Final checkpoint size, bytes.
    pub checkpoint_bytes: Option<u64>,
    /// CPU seconds / wall seconds of the whole process (shows `--threads 1` uses one core).
    pub cores_used: Option<f64>,
    /// Every reported `(step, held-out loss)`, step 0 and the last step included.
    pub curve: Vec<(u64, f64)>,
    /// How much the held-out loss scatters from one report to the next around its trend
    /// ([`loss_noise`]); `None` with too few reports.
    pub noise: Option<f64>,
}

/// Fractions of the run at which [`curve_table`] samples the held-out loss.
pub const CURVE_FRACTIONS: [f64; 11] = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0];

/// Runs the calibration and returns the markdown table.
pub fn run(args: &CalibrateArgs) -> Result<String> {
    let models: Vec<ModelKind> = if args.models.is_empty() {
        ModelKind::ALL.to_vec()
    } else {
        args.models
            .iter()
            .map(|n| {
                ModelKind::from_name(n).ok_or_else(|| Error::InvalidConfig {
                    flag: "--models",
                    why: format!("unknown model `{n}`"),
                })
            })
            .collect::<Result<_>>()?
    };
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        what: "finding the trainer binary",
        path: "/proc/self/exe".into(),
        source,
    })?;
    let mut rows = Vec::new();
    for m in models {
        let steps = ((m.defaults().steps as f64 * args.steps_scale).round() as u64).max(1);
        eprintln!("calibrate: {} ({steps} steps)...", m.name());
        rows.push(measure(&exe, m, args.size, steps)?);
    }
    Ok(format!("{}\n{}", table(&rows), curve_table(&rows)))
}

fn measure(exe: &Path, m: ModelKind, size: usize, steps: u64) -> Result<Row> {
    let fail = |why: String| Error::Calibration {
        model: m.name(),
        why,
    };
    let dir = std::env::temp_dir().join(format!(
        "converge-calibrate-{}-{}",
        std::process::id(),
        m.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let report_every = (steps / 100).max(1);
    let out = Command::new(exe)
        .args(["--model", m.name(), "--threads", "1"])
        .args(["--size", &size.to_string(), "--steps", &steps.to_string()])
        .args(["--report-every", &report_every.to_string()])
        .arg("--checkpoint-dir")
        .arg(&dir)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.map_err(|e| fail(format!("starting {}: {e}", exe.display())))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(fail(format!("exited with {}: {stderr}", out.status)));
    }
    let mut points = Vec::new();
    let (mut checkpoint_bytes, mut elapsed) = (None, None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(p) = parse_line(line, Some("loss")).map_err(|e| fail(e.to_string()))? else {
            continue;
        };
        if let Some(v) = p.value {
            points.push((p.step, v));
        }
        if p.checkpoint == Some(CheckpointEvent::Saved) {
            checkpoint_bytes = p.checkpoint_bytes;
        }
        if p.done {
            elapsed = p.elapsed_s;
        }
    }
    let (Some(&(_, initial)), Some(&(_, last)), Some(elapsed)) =
        (points.first(), points.last(), elapsed)
    else {
        return Err(fail("no progress or no final line".into()));
    };
    let field = |key: &str, unit: &str| -> Option<f64> {
        let after = &stderr[stderr.rfind(key)? + key.len()..];
        after.split(unit).next()?.trim().parse().ok()
    };
    let cpu = field(" cpu ", "s");
    let cores_used = match (cpu, field(" wall ", "s")) {
        (Some(cpu), Some(wall)) if wall > 0.0 => Some(cpu / wall),
        _ => None,
    };
    Ok(Row {
        model: m.name(),
        size,
        steps,
        batch: m.defaults().batch,
        secs_per_step: elapsed / steps as f64,
        cpu_secs_per_step: cpu.map(|c| c / steps as f64),
        steps_to_90: steps_to_fraction(&points, 0.9),
        initial,
        last,
        peak_rss_kib: field("peak RSS ", "KiB").map(|v| v as u64),
        checkpoint_bytes,
        cores_used,
        noise: loss_noise(&points),
        curve: points,
    })
}

/// The first step at which a minimized metric has made `fraction` of its total improvement
/// (from the first point to the last). `None` if it never improved.
pub fn steps_to_fraction(points: &[(u64, f64)], fraction: f64) -> Option<u64> {
    let (&(_, first), &(_, last)) = (points.first()?, points.last()?);
    let total = first - last;
    if total <= 0.0 {
        return None;
    }
    points
        .iter()
        .find(|(_, v)| first - v >= fraction * total)
        .map(|&(s, _)| s)
}

/// The relative scatter of the held-out loss between reports, once past the first tenth of
/// the run (where the curve's own fall dominates): the standard deviation of `ln(loss)` about
/// its local trend, from second differences (a straight trend cancels; white noise of
/// deviation σ gives second differences of deviation σ·√6) and their median absolute
/// deviation (a robust σ: one outlier report does not make a noisy model). What a
/// simulator adds to each reported value of the curve. `None` with fewer than eight reports
/// past the first tenth, or a loss that is not positive.
///
/// Why it matters: a policy that ranks jobs by the growth of their metric between rounds
/// (FlowCon) ranks by this scatter once curves flatten. The trainer's is far from alike
/// across models (a 6-wide CNN's held-out loss jumps by about a tenth between reports, a VAE's
/// by a fraction of a percent), so a simulator with one noise level for all ranks them
/// differently from the testbed.
pub fn loss_noise(points: &[(u64, f64)]) -> Option<f64> {
    let last = points.last()?.0;
    let logs: Vec<f64> = points
        .iter()
        .filter(|(step, _)| *step * 10 >= last)
        .map(|&(_, v)| (v > 0.0 && v.is_finite()).then(|| v.ln()))
        .collect::<Option<_>>()?;
    if logs.len() < 8 {
        return None;
    }
    let second: Vec<f64> = logs.windows(3).map(|w| w[2] - 2.0 * w[1] + w[0]).collect();
    let center = median(second.clone());
    let mad = median(second.iter().map(|d| (d - center).abs()).collect());
    // 1.4826: the MAD of a normal distribution over its standard deviation, inverted.
    Some(mad * 1.4826 / 6f64.sqrt())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| model | size | steps | batch | CPU s/step | wall s/step | steps to 90% | initial loss | final loss \
         | loss noise | peak RSS (MiB) | checkpoint (KiB) | CPU / wall |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let opt = |v: Option<String>| v.unwrap_or_else(|| "n/a".into());
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} | {:.6} | {} | {:.4} | {:.4} | {} | {} | {} | {} |\n",
            r.model,
            r.size,
            r.steps,
            r.batch,
            opt(r.cpu_secs_per_step.map(|c| format!("{c:.6}"))),
            r.secs_per_step,
            opt(r.steps_to_90.map(|v| v.to_string())),
            r.initial,
            r.last,
            opt(r.noise.map(|n| format!("{n:.4}"))),
            opt(r.peak_rss_kib.map(|k| format!("{:.1}", k as f64 / 1024.0))),
            opt(r
                .checkpoint_bytes
                .map(|b| format!("{:.1}", b as f64 / 1024.0))),
            opt(r.cores_used.map(|c| format!("{c:.2}"))),
        );
    }
    s
}

/// The held-out loss at [`CURVE_FRACTIONS`] of each run (the reported point at or after each
/// fraction): the curve shape a simulator can interpolate.
pub fn curve_table(rows: &[Row]) -> String {
    let mut s = String::from("| model |");
    for f in CURVE_FRACTIONS {
        s += &format!(" {}% |", (f * 100.0).round());
    }
    s += "\n|---|";
    s += &"---:|".repeat(CURVE_FRACTIONS.len());
    s += "\n";
    for r in rows {
        s += &format!("| {} |", r.model);
        for f in CURVE_FRACTIONS {
            let at = (f * r.steps as f64).round() as u64;
            match r.curve.iter().find(|(step, _)| *step >= at) {
                Some((_, v)) => s += &format!(" {v:.4} |"),
                None => s += " n/a |",
            }
        }
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ninety_percent_point_is_the_first_step_past_it() {
        let pts = [(0, 10.0), (10, 4.0), (20, 2.0), (30, 1.5), (40, 1.0)];
        // Total improvement 9; 90% of it is reached at a loss of 1.9 or lower.
        assert_eq!(steps_to_fraction(&pts, 0.9), Some(30));
        assert_eq!(steps_to_fraction(&[(0, 1.0), (5, 2.0)], 0.9), None);
    }

    #[test]
    fn loss_noise_is_the_scatter_about_the_trend_not_the_trend() {
        // A curve falling fast at first, then a slow decline, times white noise of 5% in
        // log space (a fixed xorshift stream and Box-Muller): the fall and the decline are
        // trend, the noise is what is measured.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let trend = |k: f64| 0.1 + 2.0 * (-k / 3.0).exp() - 0.0002 * k;
        let noisy: Vec<(u64, f64)> = (0..=200u64)
            .map(|k| {
                let (u1, u2) = (uniform().max(1e-12), uniform());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (k * 10, trend(k as f64) * (0.05 * z).exp())
            })
            .collect();
        let n = loss_noise(&noisy).expect("enough reports");
        assert!((0.04..0.06).contains(&n), "{n}");
        let smooth: Vec<(u64, f64)> = (0..=200u64).map(|k| (k * 10, trend(k as f64))).collect();
        assert!(loss_noise(&smooth).unwrap() < 1e-3);
        assert_eq!(
            loss_noise(&noisy[..8]),
            None,
            "too few reports past a tenth"
        );
    }
}
