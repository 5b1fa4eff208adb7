//! How containers on one worker share its CPU: a model of the kernel's CFS under Docker's
//! hard CPU quotas.
//!
//! Two users, one model: the simulator runs its jobs at these shares, and the cluster core's
//! ETA forecast (`converge_core::cluster::forecast`) runs a worker's queue forward at them, so
//! what the manager predicts for a job and what the simulator measures share one split.
//!
//! Each container can use at most `demand` cores (its parallelism) and at most its quota
//! (`--cpus`, cores: what the node core set, [`crate::limits`]). CFS gives runnable
//! tasks CPU in proportion to their weights (`--cpu-shares`), so capacity is water-filled: every
//! container gets its weighted share, capped by `min(demand, quota)`, and what a capped
//! container leaves flows to the others. Quotas are *hard*: what no container may take stays
//! idle. (FlowCon's papers treat limits as soft; the agent makes them work-conserving instead,
//! [`crate::limits::work_conserving`], and this model enforces what the agent
//! enforces.) This is a model, not the kernel: what sharing a core costs beyond the split
//! (caches, throttling, oversubscribed thread pools) is not modelled here but measured, and the
//! simulator's engine applies it per job (`converge_sim::measured::Sharing::factor`).

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

/// CPU cores each container gets under hard quotas (cores) and CPU weights (see the module
/// doc). Equal weights take the unweighted water-fill.
pub fn quota_share(capacity: f64, demand: &[f64], quota: &[f64], weight: &[f64]) -> Vec<f64> {
    let caps: Vec<f64> = demand
        .iter()
        .zip(quota)
        .map(|(&d, &q)| d.min(q.max(0.0)))
        .collect();
    if weight.windows(2).all(|w| w[0] == w[1]) {
        water_fill(capacity, &caps)
    } else {
        weighted_water_fill(capacity, &caps, weight)
    }
}

/// Weighted water-filling of `capacity` over containers capped at `caps` with `weights`
/// (positive): containers are served in order of `cap/weight`, each getting `left · w/W_left`
/// up to its cap, so what a capped container leaves flows to the others in proportion to their
/// weights.
pub fn weighted_water_fill(capacity: f64, caps: &[f64], weights: &[f64]) -> Vec<f64> {
    let mut out = Vec::new();
    weighted_water_fill_into(capacity, caps, weights, &mut Vec::new(), &mut out);
    out
}

/// [`weighted_water_fill`] into `out`, with `order` as scratch: the ETA forecast water-fills
/// a worker at every step of its run forward, and allocating at each step was half of the
/// allocator's samples in a profile of the simulator (`docs/performance.md`).
pub fn weighted_water_fill_into(
    capacity: f64,
    caps: &[f64],
    weights: &[f64],
    order: &mut Vec<usize>,
    out: &mut Vec<f64>,
) {
    order.clear();
    order.extend(0..caps.len());
    // The index breaks ties, so the order is total and an unstable sort (which never
    // allocates) gives the stable sort's order.
    order.sort_unstable_by(|&a, &b| {
        (caps[a] / weights[a])
            .total_cmp(&(caps[b] / weights[b]))
            .then(a.cmp(&b))
    });
    out.clear();
    out.resize(caps.len(), 0.0);
    let mut remaining = capacity.max(0.0);
    let mut weight_left: f64 = weights.iter().sum();
    for &i in order.iter() {
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
        assert_eq!(
            quota_share(4.0, &[4.0, 4.0], &[4.0, 4.0], &[1.0; 2]),
            vec![2.0, 2.0]
        );
    }

    #[test]
    fn capped_container_leaves_share_to_others() {
        // The papers' example: VAE limited to 1 of 4 cores, MNIST unlimited -> 25% / 75%.
        assert_eq!(
            quota_share(4.0, &[4.0, 4.0], &[1.0, 4.0], &[1.0; 2]),
            vec![1.0, 3.0]
        );
        // A job that cannot use its share (demand 1 core) leaves the rest.
        assert_eq!(
            quota_share(4.0, &[1.0, 4.0], &[4.0, 4.0], &[1.0; 2]),
            vec![1.0, 3.0]
        );
    }

    #[test]
    fn hard_quotas_leave_idle_capacity_idle() {
        // Both held to 1 of 4 cores: 2 cores stay idle (Docker's quotas are hard; the agent
        // scales quotas up to cover the worker before it sets them).
        assert_eq!(
            quota_share(4.0, &[4.0, 4.0], &[1.0, 1.0], &[1.0; 2]),
            vec![1.0, 1.0]
        );
    }

    #[test]
    fn cpu_shares_weight_the_split() {
        // Paper :59: ξ_j/Ξ_i of the node. 768:256 of one core.
        let a = quota_share(1.0, &[1.0, 1.0], &[1.0, 1.0], &[768.0, 256.0]);
        assert_eq!(a, vec![0.75, 0.25]);
        // A container capped by its demand leaves its slice to the others by weight: 4 cores,
        // weights 1:1:2, the first can use only 0.5 -> the rest (3.5) splits 1:2.
        let a = quota_share(4.0, &[0.5, 4.0, 4.0], &[4.0; 3], &[1.0, 1.0, 2.0]);
        let want = [0.5, 3.5 / 3.0, 7.0 / 3.0];
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-12, "{a:?}");
        }
    }

    #[test]
    fn srpt_serves_shortest_first() {
        assert_eq!(
            srpt_share(4.0, &[3.0, 3.0, 3.0], &[50.0, 10.0, 20.0]),
            vec![0.0, 3.0, 1.0]
        );
    }
}
