//! Progress and growth efficiency: FlowCon's Eq. 1 and Eq. 2, normalized so that jobs with
//! different evaluation functions can be compared.
//!
//! - Eq. 1, progress `P(t_i) = |E(t_i) - E(t_{i-1})| / (t_i - t_{i-1})`
//!   (FlowCon TCC'22 Eq. 1, flowcon-tcc2022-extended.txt:151).
//! - Eq. 2, growth efficiency `G_r(t_i) = P(t_i) / R_r(t_i)` with `R_r` the average use of
//!   resource `r` in the interval (flowcon-tcc2022-extended.txt:153-155).
//!
//! Decisions (design.md, "Where the papers are ambiguous, we decide"):
//! - P is divided by the magnitude of the job's own initial metric value, so it reads "fraction
//!   of the starting loss gained per second" and thresholds are fractions.
//! - The direction is respected instead of the paper's absolute value: a loss that rises (or an
//!   accuracy that falls) is no progress, so P is clamped at 0 rather than counted as a gain.
//! - An initial value of (almost) zero cannot normalize; such a job's progress is left
//!   unnormalized (divided by 1), which keeps it finite and monotone in the real gain.
//! - No use of the resource in the interval (or no elapsed time) means G is undefined: `None`,
//!   and the caller keeps the job in its category.

use serde::{Deserialize, Serialize};

/// Whether the metric is better when lower (loss) or higher (accuracy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Direction {
    /// Lower is better (a loss).
    #[default]
    Minimize,
    /// Higher is better (an accuracy, an inception score).
    Maximize,
}

/// One progress sample: the metric's value at a time (seconds, any fixed origin).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// When the value was observed, in seconds.
    pub time: f64,
    /// The evaluation function's value.
    pub value: f64,
}

/// A kind of resource growth efficiency can be computed against (Eq. 2's `r_i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Resource {
    /// CPU. Drivers report it as the fraction of the worker's capacity in use (the unit of the
    /// papers' CPU-usage figures and of our limits), so that the papers' α values carry over;
    /// a driver that reports cores must scale α by the worker's core count.
    #[default]
    Cpu,
    /// Memory, in bytes.
    Memory,
    /// Block I/O, in bytes per second.
    BlockIo,
    /// Network I/O, in bytes per second.
    Network,
}

/// Average resource use of one container over an interval (Eq. 2's `R_{c,r}`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Average CPU used (fraction of the worker; see [`Resource::Cpu`]).
    pub cpu: f64,
    /// Average memory bytes used.
    pub memory: f64,
    /// Average block I/O bytes per second.
    pub block_io: f64,
    /// Average network bytes per second.
    pub network: f64,
}

impl Usage {
    /// Only CPU use (the papers' experiments measure CPU only).
    pub fn cpu(cpu: f64) -> Self {
        Usage {
            cpu,
            ..Usage::default()
        }
    }

    /// The average use of `resource`.
    pub fn of(&self, resource: Resource) -> f64 {
        match resource {
            Resource::Cpu => self.cpu,
            Resource::Memory => self.memory,
            Resource::BlockIo => self.block_io,
            Resource::Network => self.network,
        }
    }
}

/// The scale progress is divided by: `|initial|`, or 1 when the initial value is ~0.
pub fn normalization_scale(initial: f64) -> f64 {
    if initial.abs() > 1e-12 && initial.is_finite() {
        initial.abs()
    } else {
        1.0
    }
}

/// Normalized gain between two samples, direction respected, never negative:
/// `max(0, improvement) / |initial|`. (SpeCon's Eq. 1 "growth" is this without the division by
/// time; specon-speculative-migration.txt:152.)
pub fn normalized_gain(prev: Sample, cur: Sample, initial: f64, direction: Direction) -> f64 {
    let improvement = match direction {
        Direction::Minimize => prev.value - cur.value,
        Direction::Maximize => cur.value - prev.value,
    };
    if !improvement.is_finite() {
        return 0.0;
    }
    improvement.max(0.0) / normalization_scale(initial)
}

/// FlowCon Eq. 1 (flowcon-tcc2022-extended.txt:151), normalized: fraction of the initial metric
/// gained per second between `prev` and `cur`. `None` when no time elapsed.
pub fn progress(prev: Sample, cur: Sample, initial: f64, direction: Direction) -> Option<f64> {
    let dt = cur.time - prev.time;
    if dt <= 0.0 || !dt.is_finite() {
        return None;
    }
    Some(normalized_gain(prev, cur, initial, direction) / dt)
}

/// FlowCon Eq. 2 (flowcon-tcc2022-extended.txt:155): progress per unit of resource used.
/// `None` when the resource was not used (G undefined; design.md).
pub fn growth_efficiency(progress: f64, resource_used: f64) -> Option<f64> {
    if resource_used > 1e-12 && resource_used.is_finite() && progress.is_finite() {
        Some(progress / resource_used)
    } else {
        None
    }
}

/// Per-job memory of the last sample seen at a policy round, turning a stream of samples into
/// per-interval progress. Plain data; the policies keep one per job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressTracker {
    /// The job's initial metric value (first sample's value unless given).
    pub initial: Option<f64>,
    /// The sample at the previous round.
    pub last: Option<Sample>,
    /// The metric's direction.
    pub direction: Direction,
}

impl ProgressTracker {
    /// A tracker with no samples yet.
    pub fn new(direction: Direction, initial: Option<f64>) -> Self {
        ProgressTracker {
            initial,
            last: None,
            direction,
        }
    }

    /// Records `sample` and returns the normalized gain and elapsed time since the previous
    /// recorded sample (None on the first sample, or if the sample is not newer).
    pub fn advance(&mut self, sample: Sample) -> Option<(f64, f64)> {
        let initial = *self.initial.get_or_insert(sample.value);
        match self.last {
            Some(prev) if sample.time > prev.time => {
                self.last = Some(sample);
                Some((
                    normalized_gain(prev, sample, initial, self.direction),
                    sample.time - prev.time,
                ))
            }
            Some(_) => None,
            None => {
                self.last = Some(sample);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(time: f64, value: f64) -> Sample {
        Sample { time, value }
    }

    #[test]
    fn progress_is_fraction_of_initial_loss_per_second() {
        // Loss 2.0 -> 1.5 in 10 s, starting loss 2.0: 25% in 10 s = 0.025/s.
        let p = progress(s(0.0, 2.0), s(10.0, 1.5), 2.0, Direction::Minimize).unwrap();
        assert!((p - 0.025).abs() < 1e-12);
    }

    #[test]
    fn progress_respects_direction() {
        // Accuracy 0.5 -> 0.6 in 5 s, starting 0.1: 0.1/0.1/5 = 0.2/s.
        let p = progress(s(0.0, 0.5), s(5.0, 0.6), 0.1, Direction::Maximize).unwrap();
        assert!((p - 0.2).abs() < 1e-12);
        // A rising loss is no progress (the paper's |ΔE| would count it).
        let p = progress(s(0.0, 1.0), s(5.0, 1.2), 2.0, Direction::Minimize).unwrap();
        assert_eq!(p, 0.0);
    }

    #[test]
    fn progress_undefined_without_elapsed_time() {
        assert_eq!(
            progress(s(3.0, 1.0), s(3.0, 0.5), 1.0, Direction::Minimize),
            None
        );
    }

    #[test]
    fn zero_initial_value_is_not_normalized() {
        let p = progress(s(0.0, 0.0), s(1.0, 0.3), 0.0, Direction::Maximize).unwrap();
        assert!((p - 0.3).abs() < 1e-12);
    }

    #[test]
    fn growth_efficiency_divides_by_resource_and_needs_use() {
        assert_eq!(growth_efficiency(0.02, 0.5), Some(0.04));
        assert_eq!(growth_efficiency(0.02, 0.0), None);
        let u = Usage {
            cpu: 2.0,
            memory: 1e9,
            block_io: 3.0,
            network: 4.0,
        };
        assert_eq!(u.of(Resource::Memory), 1e9);
        assert_eq!(growth_efficiency(8.0, u.of(Resource::Network)), Some(2.0));
    }

    #[test]
    fn tracker_uses_first_sample_as_initial() {
        let mut t = ProgressTracker::new(Direction::Minimize, None);
        assert_eq!(t.advance(s(0.0, 4.0)), None);
        assert_eq!(t.advance(s(10.0, 3.0)), Some((0.25, 10.0)));
        assert_eq!(t.advance(s(10.0, 2.0)), None, "not newer");
        assert_eq!(t.advance(s(20.0, 2.0)), Some((0.25, 10.0)));
    }
}
