//! How containers on one worker share its CPU: a model of the kernel's CFS with soft limits.
//!
//! Each container can use at most `demand` cores (its parallelism) and has a limit, a fraction of
//! the worker. CFS gives runnable tasks equal weight, so capacity is water-filled: every container
//! gets an equal share, capped by `min(demand, limit × capacity)`, and what a capped container
//! leaves flows to the others. FlowCon's limits are *soft* (flowcon-tcc2022-extended.txt:175:
//! "the unused option will be utilized by others"): if capacity is still left once every
//! container is at its cap, it is water-filled again among those whose demand exceeds their
//! limit. This is a model, not the kernel: no scheduling latency, no cache effects, no
//! hyper-threading.

/// Equal-weight water-filling of `capacity` over containers capped at `caps`.
pub fn water_fill(capacity: f64, caps: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..caps.len()).collect();
    order.sort_by(|&a, &b| caps[a].total_cmp(&caps[b]).then(a.cmp(&b)));
    let mut out = vec![0.0; caps.len()];
    let mut remaining = capacity.max(0.0);
    for (k, &i) in order.iter().enumerate() {
        let share = remaining / (caps.len() - k) as f64;
        let given = caps[i].max(0.0).min(share);
        out[i] = given;
        remaining -= given;
    }
    out
}

/// CPU cores each container gets: fair share under soft limits (see the module doc).
pub fn fair_share(capacity: f64, demand: &[f64], limit: &[f64]) -> Vec<f64> {
    let caps: Vec<f64> = demand
        .iter()
        .zip(limit)
        .map(|(&d, &l)| d.min(l.clamp(0.0, 1.0) * capacity))
        .collect();
    let mut alloc = water_fill(capacity, &caps);
    let used: f64 = alloc.iter().sum();
    let leftover = capacity - used;
    if leftover > 1e-12 {
        let want: Vec<f64> = demand
            .iter()
            .zip(&alloc)
            .map(|(&d, &a)| (d - a).max(0.0))
            .collect();
        for (a, e) in alloc.iter_mut().zip(water_fill(leftover, &want)) {
            *a += e;
        }
    }
    alloc
}

/// The oracle's sharing: shortest remaining work first, each container up to its demand.
pub fn srpt_share(capacity: f64, demand: &[f64], remaining: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demand.len()).collect();
    order.sort_by(|&a, &b| remaining[a].total_cmp(&remaining[b]).then(a.cmp(&b)));
    let mut out = vec![0.0; demand.len()];
    let mut left = capacity;
    for i in order {
        let g = demand[i].min(left).max(0.0);
        out[i] = g;
        left -= g;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_split_without_limits() {
        assert_eq!(fair_share(4.0, &[4.0, 4.0], &[1.0, 1.0]), vec![2.0, 2.0]);
    }

    #[test]
    fn capped_container_leaves_share_to_others() {
        // The papers' example: VAE limited to 0.25 of the worker, MNIST at 1 -> 25% / 75%.
        assert_eq!(fair_share(4.0, &[4.0, 4.0], &[0.25, 1.0]), vec![1.0, 3.0]);
        // A job that cannot use its share (demand 1 core) leaves the rest.
        assert_eq!(fair_share(4.0, &[1.0, 4.0], &[1.0, 1.0]), vec![1.0, 3.0]);
    }

    #[test]
    fn soft_limits_give_away_idle_capacity() {
        // Both limited to 0.25 of 4 cores: caps 1 + 1, the 2 idle cores flow back.
        assert_eq!(fair_share(4.0, &[4.0, 4.0], &[0.25, 0.25]), vec![2.0, 2.0]);
        assert_eq!(fair_share(4.0, &[4.0, 1.5], &[0.25, 0.25]), vec![2.5, 1.5]);
    }

    #[test]
    fn srpt_serves_shortest_first() {
        assert_eq!(
            srpt_share(4.0, &[3.0, 3.0, 3.0], &[50.0, 10.0, 20.0]),
            vec![0.0, 3.0, 1.0]
        );
    }
}
