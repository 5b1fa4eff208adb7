//! Remaining-time estimates: how much work a job has left, from what it reported, each with
//! the basis it came from and a confidence.
//!
//! Three bases from what the job reported and what other jobs did, tried in this order by
//! [`estimate`] (a driver that knows the job's declared runtime tries it, [`declared`], before
//! the third: the core does):
//! - **Steps**: the job says its step budget (`total_steps`); the work left is the steps left
//!   over its measured throughput in steps per core-second ([`Throughput`]). Turned into time by
//!   the CPU share it will get ([`Estimate::seconds_at`]).
//! - **Curve**: the job stops at convergence (a [`StopRule`]); its metric is fitted online with
//!   Optimus' form `l(k) = 1/(β0·k + β1) + β2` (Peng et al., EuroSys'18: non-negative least
//!   squares), recent points weighted more, and the step where the rule will fire is predicted
//!   ([`fit_optimus`], [`OptimusFit::stop_step`]).
//! - **Attained service**: neither is known; the mean residual size of finished jobs larger than
//!   what this one has already had (the expectation behind a Gittins index, as Tiresias uses
//!   for jobs of unknown duration), or nothing when no job has finished yet
//!   ([`ServiceHistory::expected_remaining`]).
//!
//! Work is in **core-seconds** (seconds on one core of the reference worker), so estimates of
//! jobs on different workers, or under different shares, compare directly.

use serde::{Deserialize, Serialize};

/// What an estimate rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Basis {
    /// Steps left over the measured step rate.
    Steps,
    /// A fitted metric curve and the job's stopping rule.
    Curve,
    /// Finished jobs' sizes, given the service this job has had.
    AttainedService,
    /// What the job's user declared it needs (`estimated_runtime_s`), less the service it has
    /// had.
    Declared,
}

impl Basis {
    /// Lower-case name, for users.
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Steps => "steps",
            Basis::Curve => "curve",
            Basis::AttainedService => "attained-service",
            Basis::Declared => "declared",
        }
    }
}

/// Work left, what it rests on, and how far to trust it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Core-seconds of work left (at the reference speed).
    pub work: f64,
    /// Where it comes from.
    pub basis: Basis,
    /// 0 (a guess) to 1 (as good as measured): grows with the evidence behind the estimate.
    pub confidence: f64,
}

impl Estimate {
    /// Seconds left when the job gets `cores` of a worker `speed` times the reference.
    pub fn seconds_at(&self, cores: f64, speed: f64) -> f64 {
        let rate = cores.max(1e-6) * speed.max(1e-6);
        self.work / rate
    }
}

/// One reported point: when (seconds), the step, and the metric, with the CPU the job had
/// used in all by then (core-seconds, at the reference speed).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Seconds (any fixed origin).
    pub time: f64,
    /// Step.
    pub step: u64,
    /// Metric value, if the line carried one.
    pub value: Option<f64>,
    /// Core-seconds the job had used by then.
    pub cpu_s: f64,
}

/// Steps per core-second, measured over the recent points.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Steps per core-second.
    pub steps_per_core_s: f64,
}

/// Throughput over the points of the last `window` core-seconds (at least two points). Steps
/// per *core*-second rather than per second, so that a job measured under one share predicts
/// correctly under another.
///
/// Read within one run of the job: where its steps went back (a restart from a checkpoint or
/// from the start), the points before and after are two runs, and their difference is no
/// rate. A run with no rate yet (its first point) reads the run before it: the same job at
/// the same work per step. Across a restart the rate read none, and the ETA fell back on
/// attained service (a new user's walk: "1m30s left, confidence 5%" of a 20-minute job).
pub fn throughput(points: &[Point], window: f64) -> Option<Throughput> {
    let mut end = points.len();
    while end > 0 {
        let start = (points[..end].windows(2))
            .rposition(|w| w[1].step < w[0].step)
            .map_or(0, |i| i + 1);
        if let Some(t) = run_throughput(&points[start..end], window) {
            return Some(t);
        }
        end = start;
    }
    None
}

/// [`throughput`] of one run (points whose steps never go back).
fn run_throughput(points: &[Point], window: f64) -> Option<Throughput> {
    let last = points.last()?;
    let first = points
        .iter()
        .rev()
        .find(|p| last.cpu_s - p.cpu_s >= window)
        .or(points.first())?;
    let (steps, cpu) = (last.step.checked_sub(first.step)?, last.cpu_s - first.cpu_s);
    if steps == 0 || cpu <= 0.0 {
        return None;
    }
    Some(Throughput {
        steps_per_core_s: steps as f64 / cpu,
    })
}

/// "Stop when the metric improved by less than `min_improvement` (a fraction) over the last
/// `window_steps` steps."
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StopRule {
    /// Relative improvement below which the job has converged (0.003 = 0.3%).
    pub min_improvement: f64,
    /// Steps the improvement is measured over.
    pub window_steps: u64,
}

impl StopRule {
    /// Whether the rule fires at `step` given the metric `then` at `step - window_steps` and
    /// `now` at `step` (lower is better; pass negated values for a maximized metric).
    pub fn fires(&self, then: f64, now: f64) -> bool {
        let scale = then.abs().max(1e-12);
        (then - now) / scale < self.min_improvement
    }

    /// The relative improvement from `then` to `now`.
    pub fn improvement(then: f64, now: f64) -> f64 {
        (then - now) / then.abs().max(1e-12)
    }
}

/// Optimus' loss model `l(k) = 1/(β0·k + β1) + β2` with β ≥ 0.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimusFit {
    /// β0: how fast the loss falls.
    pub b0: f64,
    /// β1: the starting offset.
    pub b1: f64,
    /// β2: the loss the curve tends to.
    pub b2: f64,
    /// Weighted relative RMS error of the fit over the points it saw.
    pub error: f64,
}

impl OptimusFit {
    /// The modelled loss at step `k`.
    pub fn loss(&self, k: f64) -> f64 {
        1.0 / (self.b0 * k + self.b1).max(1e-12) + self.b2
    }

    /// The first step at or after `from` where `rule` fires on the modelled curve, up to
    /// `limit` (None when it does not fire by then).
    pub fn stop_step(&self, rule: &StopRule, from: u64, limit: u64) -> Option<u64> {
        let w = rule.window_steps as f64;
        let fires = |k: u64| {
            let k = k as f64;
            k >= w && rule.fires(self.loss(k - w), self.loss(k))
        };
        if from > limit {
            return None;
        }
        if fires(from) {
            return Some(from);
        }
        // The improvement over a fixed window only shrinks as k grows on this model, so the
        // first firing step is found by doubling, then bisection.
        let mut hi = from.max(1);
        while !fires(hi) {
            if hi >= limit {
                return None;
            }
            hi = hi.saturating_mul(2).min(limit);
        }
        let mut lo = from;
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fires(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }
}

/// Fits Optimus' model to `(step, loss)` points (lower is better), weighting point `i` of `n`
/// by `decay^(n-1-i)` so the recent shape counts most.
///
/// Non-negative least squares the way Optimus linearizes it: for a candidate floor β2 below
/// every loss, `1/(l - β2) = β0·k + β1` is linear in (β0, β1); β0 and β1 are solved by
/// weighted least squares (clamped at 0, and refit with the other alone when one would be
/// negative). β2 is chosen on a grid from 0 to just below the smallest loss, by the error of
/// the fitted curve in loss space. Needs at least four points with distinct steps.
pub fn fit_optimus(points: &[(u64, f64)], decay: f64) -> Option<OptimusFit> {
    if points.len() < 4 || points.iter().any(|(_, l)| !l.is_finite()) {
        return None;
    }
    let min = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    if min <= 0.0 {
        return None;
    }
    let n = points.len();
    let weights: Vec<f64> = (0..n).map(|i| decay.powi((n - 1 - i) as i32)).collect();
    let mut best: Option<OptimusFit> = None;
    const GRID: usize = 64;
    for g in 0..GRID {
        let b2 = min * (g as f64) / (GRID as f64) * 0.999;
        let Some((b0, b1)) = fit_line(points, &weights, b2) else {
            continue;
        };
        let fit = OptimusFit {
            b0,
            b1,
            b2,
            error: 0.0,
        };
        let (mut se, mut ws) = (0.0, 0.0);
        for ((k, l), w) in points.iter().zip(&weights) {
            let r = (fit.loss(*k as f64) - l) / l;
            se += w * r * r;
            ws += w;
        }
        let error = (se / ws).sqrt();
        if best.is_none_or(|b| error < b.error) {
            best = Some(OptimusFit { error, ..fit });
        }
    }
    best
}

/// Weighted least squares of `y = 1/(l - b2)` on `k`, with non-negative coefficients.
fn fit_line(points: &[(u64, f64)], weights: &[f64], b2: f64) -> Option<(f64, f64)> {
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for ((k, l), w) in points.iter().zip(weights) {
        let (x, y) = (*k as f64, 1.0 / (l - b2));
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    let det = sw * sxx - sx * sx;
    if det.abs() < 1e-12 {
        return None;
    }
    let b0 = (sw * sxy - sx * sy) / det;
    let b1 = (sxx * sy - sx * sxy) / det;
    match (b0 >= 0.0, b1 >= 0.0) {
        (true, true) => Some((b0, b1)),
        // One coefficient at its bound: the other alone.
        (true, false) => (sxx > 0.0).then(|| ((sxy / sxx).max(0.0), 0.0)),
        (false, _) => (sw > 0.0).then(|| (0.0, (sy / sw).max(0.0))),
    }
}

/// Sizes (core-seconds) of jobs that finished, for jobs whose size nothing else tells.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceHistory {
    sizes: Vec<f64>,
}

/// Finished sizes kept: enough for a stable mean residual life, bounded in memory.
const HISTORY: usize = 1024;

impl ServiceHistory {
    /// A job of `size` core-seconds finished.
    pub fn record(&mut self, size: f64) {
        if !(size.is_finite() && size >= 0.0) {
            return;
        }
        if self.sizes.len() == HISTORY {
            self.sizes.remove(0);
        }
        self.sizes.push(size);
    }

    /// How many sizes are known.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// `E[S − a | S > a]` over the finished sizes: the work a job that has had `attained`
    /// core-seconds can expect to need still. When no finished job was that large, the job is
    /// the largest seen yet: as much again as it has had (the memoryless guess).
    pub fn expected_remaining(&self, attained: f64) -> Option<f64> {
        if self.sizes.is_empty() {
            return None;
        }
        // One pass, summing in the sizes' order as a collected list summed did: asked for
        // every job nothing else gives a work, at every placement.
        let (mut left, mut larger) = (0.0, 0usize);
        for s in self.sizes.iter().filter(|s| **s > attained) {
            left += s - attained;
            larger += 1;
        }
        if larger == 0 {
            return Some(attained.max(1e-3));
        }
        Some(left / larger as f64)
    }
}

/// What is known of one job, for [`estimate`].
#[derive(Debug, Clone, Copy)]
pub struct Known<'a> {
    /// Its reported points, oldest first (its metric as reported; see `maximize`).
    pub points: &'a [Point],
    /// Its step budget, when it says.
    pub total_steps: Option<u64>,
    /// Its stopping rule, when it stops at convergence.
    pub stop: Option<StopRule>,
    /// Whether its metric is maximized (then it is negated for the curve fit).
    pub maximize: bool,
    /// Core-seconds it has had.
    pub attained: f64,
}

/// Core-seconds of history a throughput is measured over.
pub const THROUGHPUT_WINDOW: f64 = 30.0;

/// The best estimate for `job` (module doc), or `None` when nothing is known yet.
pub fn estimate(job: &Known<'_>, history: &ServiceHistory) -> Option<Estimate> {
    from_points(job).or_else(|| from_attained(job.attained, history))
}

/// The estimate from the job's own points (steps over throughput, or the curve), `None` when
/// they tell nothing and [`estimate`] falls back on attained service. It reads nothing but the
/// points, the budget and the rule, so a driver may keep it until the next point arrives.
pub fn from_points(job: &Known<'_>) -> Option<Estimate> {
    let step = job.points.last().map_or(0, |p| p.step);
    let rate = throughput(job.points, THROUGHPUT_WINDOW);
    // Steps to go: the budget, or sooner where the stopping rule is predicted to fire.
    let by_curve = job.stop.and_then(|rule| {
        let sign = if job.maximize { -1.0 } else { 1.0 };
        let pts: Vec<(u64, f64)> = job
            .points
            .iter()
            .filter_map(|p| Some((p.step, sign * p.value?)))
            .collect();
        // A negated (maximized) metric is shifted positive for the fit.
        let shift = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let shift = if shift <= 0.0 { 1.0 - shift } else { 0.0 };
        let pts: Vec<(u64, f64)> = pts.into_iter().map(|(k, l)| (k, l + shift)).collect();
        let fit = fit_optimus(&pts, 0.9)?;
        let limit = job
            .total_steps
            .unwrap_or(step.saturating_mul(100).max(1_000_000));
        Some((
            fit.stop_step(&rule, step, limit).unwrap_or(limit),
            fit.error,
        ))
    });
    if let Some(rate) = rate {
        let (target, basis, fit_error) = match (by_curve, job.total_steps) {
            (Some((k, e)), Some(t)) => (k.min(t), Basis::Curve, e),
            (Some((k, e)), None) => (k, Basis::Curve, e),
            (None, Some(t)) => (t, Basis::Steps, 0.0),
            (None, None) => (0, Basis::AttainedService, 0.0),
        };
        if basis != Basis::AttainedService {
            let left = target.saturating_sub(step) as f64;
            // Evidence: the steps done against the steps still to go; a curve's fit error and
            // extrapolation cost more. The job's steps, not the rate window's: a 20-minute job
            // a quarter through, its ETA within a few percent, read "confidence 5%" (a walk)
            // when only its last 30 core-seconds counted. Not the points' span either: a
            // manager keeps the newest 32 points, half a minute of a long job.
            let seen = step as f64;
            let mut confidence = seen / (seen + left.max(1.0));
            if basis == Basis::Curve {
                confidence *= (1.0 - fit_error * 5.0).clamp(0.1, 1.0);
            }
            return Some(Estimate {
                work: left / rate.steps_per_core_s,
                basis,
                confidence: confidence.clamp(0.05, 0.99),
            });
        }
    }
    None
}

/// How far a user's declared runtime is trusted: more than finished jobs' sizes
/// ([`ATTAINED_CONFIDENCE`]: it is about this job), less than the job's own measured pace
/// once a few of its steps are in. A guess of ours, not measured.
pub const DECLARED_CONFIDENCE: f64 = 0.25;

/// The most an estimate from finished jobs' sizes is trusted, however many there are.
pub const ATTAINED_CONFIDENCE: f64 = 0.2;

/// The estimate from what the job's user declared: `work` core-seconds left.
pub fn declared(work: f64) -> Estimate {
    Estimate {
        work,
        basis: Basis::Declared,
        confidence: DECLARED_CONFIDENCE,
    }
}

/// The estimate from attained service alone: on average, what the finished jobs larger than
/// `attained` needed beyond it.
pub fn from_attained(attained: f64, history: &ServiceHistory) -> Option<Estimate> {
    let work = history.expected_remaining(attained)?;
    Some(Estimate {
        work,
        basis: Basis::AttainedService,
        // Other jobs' sizes tell less of this job than its user's word (DECLARED_CONFIDENCE):
        // at up to 0.5, a guess read as surer than the job's own first steps (a walk).
        confidence: (history.len() as f64 / (history.len() as f64 + 20.0)).min(ATTAINED_CONFIDENCE),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trainer's held-out loss of `mlp-digits --size 1` (trainer/README.md, calibration
    /// table "--size 1": the loss at 0, 1, 2, 5, 10, 20, 30, 50, 70, 90, 100% of 1500 steps).
    const MLP: [(f64, f64); 11] = [
        (0.0, 2.4929),
        (0.01, 2.0022),
        (0.02, 1.7283),
        (0.05, 0.8988),
        (0.10, 0.3904),
        (0.20, 0.2252),
        (0.30, 0.1737),
        (0.50, 0.1278),
        (0.70, 0.1102),
        (0.90, 0.0863),
        (1.00, 0.0875),
    ];

    /// vae-digits, same table, 3000 steps.
    const VAE: [(f64, f64); 11] = [
        (0.0, 58.4736),
        (0.01, 39.7727),
        (0.02, 33.9476),
        (0.05, 29.7467),
        (0.10, 27.4725),
        (0.20, 26.2696),
        (0.30, 25.8203),
        (0.50, 25.3923),
        (0.70, 25.2275),
        (0.90, 25.1304),
        (1.00, 25.0639),
    ];

    /// A point each second of `seconds` on one core, `per_second` steps a second, each with
    /// metric `value`.
    fn paced(
        seconds: std::ops::RangeInclusive<u64>,
        per_second: u64,
        value: Option<f64>,
    ) -> Vec<Point> {
        seconds
            .map(|i| Point {
                time: i as f64,
                step: i * per_second,
                value,
                cpu_s: i as f64,
            })
            .collect()
    }

    fn steps(curve: &[(f64, f64)], total: u64, upto: f64) -> Vec<(u64, f64)> {
        curve
            .iter()
            .filter(|(f, _)| *f <= upto)
            .map(|(f, l)| ((f * total as f64) as u64, *l))
            .collect()
    }

    #[test]
    fn optimus_fits_the_trainers_real_curves_closely() {
        for (name, curve, total) in [("mlp", &MLP, 1500), ("vae", &VAE, 3000)] {
            let fit = fit_optimus(&steps(curve, total, 1.0), 1.0).unwrap();
            assert!(fit.error < 0.15, "{name}: relative error {}", fit.error);
            assert!(fit.b0 > 0.0 && fit.b2 >= 0.0, "{name}: {fit:?}");
            // The fitted floor is below the final loss and in its neighbourhood.
            let last = curve[10].1;
            assert!(
                fit.b2 < last && fit.b2 > last * 0.3,
                "{name}: floor {} vs {last}",
                fit.b2
            );
        }
    }

    /// Fitted on the first half of the run, the stop step of "less than 1% over 300 steps" is
    /// predicted from the curve; the prediction falls where the full curve's fit puts it,
    /// within a factor that a user would still find useful.
    #[test]
    fn a_half_run_predicts_where_a_stopping_rule_fires() {
        let rule = StopRule {
            min_improvement: 0.01,
            window_steps: 300,
        };
        let half = fit_optimus(&steps(&VAE, 3000, 0.5), 0.9).unwrap();
        let full = fit_optimus(&steps(&VAE, 3000, 1.0), 0.9).unwrap();
        let predicted = half.stop_step(&rule, 1500, 100_000).unwrap();
        let reference = full.stop_step(&rule, 1500, 100_000).unwrap();
        let ratio = predicted as f64 / reference as f64;
        assert!(
            (0.5..2.0).contains(&ratio),
            "half {predicted} vs full {reference}"
        );
        // And the rule really holds on the model at that step, and not one step before.
        let l = |k: u64| half.loss(k as f64);
        assert!(rule.fires(l(predicted - 300), l(predicted)));
        assert!(predicted == 1500 || !rule.fires(l(predicted - 301), l(predicted - 1)));
    }

    #[test]
    fn throughput_is_per_core_second_so_it_survives_a_new_share() {
        // 100 steps per core-second, first at half a core, then at a whole one.
        let pts: Vec<Point> = (0..10)
            .map(|i| Point {
                time: i as f64,
                step: i * 50,
                value: None,
                cpu_s: i as f64 * 0.5,
            })
            .chain((10..20).map(|i| Point {
                time: i as f64,
                step: 450 + (i - 9) * 100,
                value: None,
                cpu_s: 4.5 + (i - 9) as f64,
            }))
            .collect();
        let t = throughput(&pts, 5.0).unwrap();
        assert!((t.steps_per_core_s - 100.0).abs() < 1e-9, "{t:?}");
    }

    /// Across a restart the rate is the current run's, or the run before's until the current
    /// one has two points: steps that went back told no rate (or a wrong one).
    #[test]
    fn throughput_reads_one_run_of_the_job() {
        let point = |step: u64, cpu_s: f64| Point {
            time: cpu_s,
            step,
            value: None,
            cpu_s,
        };
        // 10 steps per core-second up to step 1000, then a restart from step 200.
        let mut pts: Vec<Point> = (0..=10).map(|i| point(i * 100, i as f64 * 10.0)).collect();
        pts.push(point(200, 101.0));
        let t = throughput(&pts, 30.0).expect("the run before's");
        assert!((t.steps_per_core_s - 10.0).abs() < 1e-9, "{t:?}");
        // The new run goes at 20 a core-second: its own rate, not one across the restart.
        pts.push(point(400, 111.0));
        let t = throughput(&pts, 30.0).unwrap();
        assert!((t.steps_per_core_s - 20.0).abs() < 1e-9, "{t:?}");
        // Past where the old run ended, the difference across the restart (from step 900 at
        // 90 core-s to step 1200 at 151) would have read a rate of 4.9.
        pts.extend((1..=4).map(|i| point(400 + i * 200, 111.0 + i as f64 * 10.0)));
        let t = throughput(&pts, 60.0).unwrap();
        assert!((t.steps_per_core_s - 20.0).abs() < 1e-9, "{t:?}");
    }

    /// Throughput is measured over the recent window, not the whole run: a job whose rate
    /// doubled is predicted at its new rate, or its ETA would stay too long.
    #[test]
    fn throughput_reads_the_recent_window() {
        // 10 steps per core-second for 10 core-seconds, then 20.
        let pts: Vec<Point> = (0..=20u64)
            .map(|i| Point {
                time: i as f64,
                step: if i <= 10 { i * 10 } else { 100 + (i - 10) * 20 },
                value: None,
                cpu_s: i as f64,
            })
            .collect();
        let t = throughput(&pts, 5.0).unwrap();
        assert_eq!(t.steps_per_core_s, 20.0, "{t:?}");
    }

    /// A long job a quarter through at a steady pace is a quarter seen, though its rate is
    /// read over its last 30 core-seconds only and a manager keeps only its newest points
    /// (here 32, a second apart, as `converge_core`'s default).
    #[test]
    fn confidence_weighs_the_steps_done() {
        let pts = paced(269..=300, 10, None);
        let known = Known {
            points: &pts,
            total_steps: Some(12_000),
            stop: None,
            maximize: false,
            attained: 300.0,
        };
        let e = estimate(&known, &ServiceHistory::default()).unwrap();
        assert!((e.work - 900.0).abs() < 1e-9, "{e:?}");
        assert!((e.confidence - 0.25).abs() < 1e-9, "{e:?}");
    }

    #[test]
    fn steps_basis_predicts_the_work_left_and_trusts_more_evidence() {
        let pts = paced(0..=10, 10, Some(1.0));
        let known = Known {
            points: &pts,
            total_steps: Some(300),
            stop: None,
            maximize: false,
            attained: 10.0,
        };
        let e = estimate(&known, &ServiceHistory::default()).unwrap();
        assert_eq!(e.basis, Basis::Steps);
        assert!((e.work - 20.0).abs() < 1e-9, "{e:?}");
        // At half a core on a worker twice as fast: the same 20 s.
        assert!((e.seconds_at(0.5, 2.0) - 20.0).abs() < 1e-9);
        let later = Known {
            total_steps: Some(110),
            ..known
        };
        let e2 = estimate(&later, &ServiceHistory::default()).unwrap();
        assert!(e2.confidence > e.confidence);
    }

    #[test]
    fn a_job_that_stops_at_convergence_is_estimated_from_its_curve() {
        let pts: Vec<Point> = steps(&VAE, 3000, 0.5)
            .into_iter()
            .map(|(k, l)| Point {
                time: k as f64 / 100.0,
                step: k,
                value: Some(l),
                cpu_s: k as f64 / 100.0,
            })
            .collect();
        let known = Known {
            points: &pts,
            total_steps: Some(1_000_000),
            stop: Some(StopRule {
                min_improvement: 0.01,
                window_steps: 300,
            }),
            maximize: false,
            attained: 15.0,
        };
        let e = estimate(&known, &ServiceHistory::default()).unwrap();
        assert_eq!(e.basis, Basis::Curve);
        // Far less than the million-step budget would say (9,985 core-seconds).
        assert!(e.work < 500.0, "{e:?}");
    }

    #[test]
    fn without_steps_or_a_curve_finished_jobs_sizes_tell_the_mean_residual() {
        let mut h = ServiceHistory::default();
        for s in [10.0, 20.0, 30.0, 100.0] {
            h.record(s);
        }
        // Had 25: the larger ones are 30 and 100, so (5 + 75) / 2.
        assert_eq!(h.expected_remaining(25.0), Some(40.0));
        // Larger than anything seen: as much again.
        assert_eq!(h.expected_remaining(200.0), Some(200.0));
        let known = Known {
            points: &[],
            total_steps: None,
            stop: None,
            maximize: false,
            attained: 25.0,
        };
        let e = estimate(&known, &h).unwrap();
        assert_eq!((e.basis, e.work), (Basis::AttainedService, 40.0));
        assert!(estimate(&known, &ServiceHistory::default()).is_none());
    }

    /// However many finished jobs it rests on, a guess from their sizes is trusted less than
    /// the job's user's word: at up to 0.5 it read as surer than a job's own first steps.
    #[test]
    fn other_jobs_sizes_are_trusted_less_than_a_declared_runtime() {
        let mut h = ServiceHistory::default();
        for _ in 0..HISTORY {
            h.record(100.0);
        }
        let e = from_attained(10.0, &h).unwrap();
        assert_eq!(e.confidence, ATTAINED_CONFIDENCE);
        assert!(e.confidence < declared(90.0).confidence);
    }

    /// A full history of finished sizes drops its oldest to keep the newest: kept the other way,
    /// the estimates would stop learning from the jobs that finish.
    #[test]
    fn a_full_service_history_drops_its_oldest_size() {
        let mut h = ServiceHistory::default();
        h.record(500.0);
        for _ in 1..HISTORY {
            h.record(1.0);
        }
        h.record(1000.0);
        assert_eq!(h.len(), HISTORY);
        // Only the newest is larger than 10: the oldest (500) is gone.
        assert_eq!(h.expected_remaining(10.0), Some(990.0));
    }
}
