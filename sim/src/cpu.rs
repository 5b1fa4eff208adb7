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

/// Weighted water-filling of `capacity` over containers capped at `caps` with `weights`
/// (positive): containers are served in order of `cap/weight`, each getting `left · w/W_left`
/// up to its cap, so what a capped container leaves flows to the others in proportion to their
/// weights.
pub fn weighted_water_fill(capacity: f64, caps: &[f64], weights: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..caps.len()).collect();
    order.sort_by(|&a, &b| {
        (caps[a] / weights[a])
            .total_cmp(&(caps[b] / weights[b]))
            .then(a.cmp(&b))
    });
    let mut out = vec![0.0; caps.len()];
    let mut remaining = capacity.max(0.0);
    let mut weight_left: f64 = weights.iter().sum();
    for i in order {
        let share = if weight_left > 0.0 {
            remaining * weights[i] / weight_left
        } else {
            0.0
        };
        let given = caps[i].max(0.0).min(share);
        out[i] = given;
        remaining -= given;
        weight_left -= weights[i];
    }
    out
}

/// [`fair_share`] with CPU shares: each container's slice is proportional to `weight` (its
/// `--cpu-shares`), under the same soft limits. Equal weights give [`fair_share`] exactly.
pub fn weighted_fair_share(
    capacity: f64,
    demand: &[f64],
    limit: &[f64],
    weight: &[f64],
) -> Vec<f64> {
    if weight.windows(2).all(|w| w[0] == w[1]) {
        return fair_share(capacity, demand, limit);
    }
    let caps: Vec<f64> = demand
        .iter()
        .zip(limit)
        .map(|(&d, &l)| d.min(l.clamp(0.0, 1.0) * capacity))
        .collect();
    let mut alloc = weighted_water_fill(capacity, &caps, weight);
    let used: f64 = alloc.iter().sum();
    let leftover = capacity - used;
    if leftover > 1e-12 {
        let want: Vec<f64> = demand
            .iter()
            .zip(&alloc)
            .map(|(&d, &a)| (d - a).max(0.0))
            .collect();
        for (a, e) in alloc
            .iter_mut()
            .zip(weighted_water_fill(leftover, &want, weight))
        {
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
    fn cpu_shares_weight_the_split() {
        // Paper :59: ξ_j/Ξ_i of the node. 768:256 of one core.
        let a = weighted_fair_share(1.0, &[1.0, 1.0], &[1.0, 1.0], &[768.0, 256.0]);
        assert_eq!(a, vec![0.75, 0.25]);
        // A container capped by its demand leaves its slice to the others by weight: 4 cores,
        // weights 1:1:2, the first can use only 0.5 -> the rest (3.5) splits 1:2.
        let a = weighted_fair_share(4.0, &[0.5, 4.0, 4.0], &[1.0; 3], &[1.0, 1.0, 2.0]);
        let want = [0.5, 3.5 / 3.0, 7.0 / 3.0];
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-12, "{a:?}");
        }
    }

    #[test]
    fn equal_shares_are_bit_for_bit_fair_share() {
        let d = [4.0, 1.5, 3.0];
        let l = [0.25, 0.25, 1.0];
        assert_eq!(
            weighted_fair_share(4.0, &d, &l, &[1024.0; 3]),
            fair_share(4.0, &d, &l)
        );
    }

    #[test]
    fn srpt_serves_shortest_first() {
        assert_eq!(
            srpt_share(4.0, &[3.0, 3.0, 3.0], &[50.0, 10.0, 20.0]),
            vec![0.0, 3.0, 1.0]
        );
    }
}
