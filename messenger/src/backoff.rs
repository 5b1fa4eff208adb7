//! Exponential backoff with jitter for reconnects.
//!
//! Why jitter: when the manager restarts, every agent loses its stream at the same instant;
//! without jitter they would all reconnect in lockstep, on every retry.

use std::time::Duration;

use rand::Rng;

/// Reconnect delays: `initial`, doubling up to `max`, each drawn uniformly from the upper half
/// of the current step (`[d/2, d]`) so that retries spread out but never collapse to zero.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A schedule starting at `initial` and capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Self {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// The next delay, drawing the jitter from `rng`; the step doubles for the call after.
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        let lo = step.as_millis() as u64 / 2;
        let hi = step.as_millis() as u64;
        Duration::from_millis(rng.random_range(lo..=hi.max(lo)))
    }

    /// Back to the first step, after a connection that worked.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn delays_double_within_jitter_and_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let mut rng = StdRng::seed_from_u64(7);
        let steps = [100u64, 200, 400, 800, 800, 800];
        for s in steps {
            let d = b.next_delay(&mut rng).as_millis() as u64;
            assert!(d >= s / 2 && d <= s, "delay {d} outside [{}, {s}]", s / 2);
        }
        b.reset();
        assert!(b.next_delay(&mut rng) <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_spreads_agents_apart() {
        // Ten agents starting at once should not all pick the same first delay.
        let mut rng = StdRng::seed_from_u64(1);
        let delays: std::collections::HashSet<_> = (0..10)
            .map(|_| {
                Backoff::new(Duration::from_millis(1000), Duration::from_secs(5))
                    .next_delay(&mut rng)
            })
            .collect();
        assert!(delays.len() > 5, "{delays:?}");
    }
}
