//! What each experiment policy runs as: the cluster policy the manager's core runs
//! ([`converge_core::cluster::policy`]) and the configuration of every worker's node core
//! ([`converge_core::node`]), built exactly as the manager and the agent build them.
//!
//! Two things here are not cluster policies, and say so:
//! - the **oracle** (shortest remaining work first with full knowledge) is a model of CPU
//!   sharing, not a decision any shell could take: it runs the baseline's policy through the
//!   core, and the simulator's CPU model serves the shortest job first;
//! - the **GA** (value-based-allocation.txt:100-102) plans the whole workload offline, which
//!   only the simulator can (it knows the future). Its plan is carried out through the core by
//!   [`PlanPolicy`], a `ClusterPolicy` that answers each submission from the plan.

use std::collections::BTreeMap;

use converge_core::cluster::lifecycle::Job;
use converge_core::cluster::policy::placing::Placing;
use converge_core::cluster::policy::specon::SpeConPolicy;
use converge_core::cluster::policy::value::ValuePolicy;
use converge_core::cluster::policy::{Admission, ClusterPolicy, ClusterView, PolicyConfig};
use converge_core::cluster::types::{JobId, Time, WorkerId, WorkerMode};
use converge_core::node::NodeConfig;
use converge_policy::baseline::{RoundRobin, Spread};
use converge_policy::flowcon::FlowConConfig;
use converge_policy::specon::SpeConConfig;
use converge_policy::value::ValueConfig;

use crate::error::{Error, Result};
use crate::experiment::PolicySpec;

/// The cluster policy `policy` runs as (the oracle: the baseline's). `plan` is the GA's plan
/// for [`PolicySpec::ValueGa`], by job id (None: rejected).
pub fn cluster_policy(
    policy: PolicySpec,
    baseline: PolicySpec,
    plan: Option<BTreeMap<JobId, Option<(WorkerId, u32)>>>,
) -> Result<Box<dyn ClusterPolicy>> {
    let named = |name: &str| {
        converge_core::cluster::policy::by_name(name, &PolicyConfig::default())
            .map_err(Error::Invalid)
    };
    Ok(match policy {
        PolicySpec::Flowcon {
            placement: true, ..
        } => named("flowcon")?,
        // The single-worker runs: Docker Swarm's spread, FlowCon's limits on the worker.
        PolicySpec::Flowcon { .. } => Box::new(Placing::new(Box::new(Spread), WorkerMode::FlowCon)),
        PolicySpec::DockerSwarm => named("spread")?,
        PolicySpec::Kubernetes => named("round-robin")?,
        PolicySpec::Specon {
            interval,
            rebalance,
            ..
        } => Box::new(SpeConPolicy::new(
            "specon",
            Box::new(RoundRobin::default()),
            WorkerMode::Free,
            // Alg. 3 every categorization interval, as the paper runs it; never when off (the
            // core's timer then stays at infinity).
            if rebalance { interval } else { f64::INFINITY },
        )),
        PolicySpec::Oracle => match baseline {
            PolicySpec::Oracle => named("spread")?,
            b => cluster_policy(b, b, None)?,
        },
        PolicySpec::Value { stride, preemption } => Box::new(ValuePolicy::new(
            "value",
            ValueConfig { stride, preemption },
        )?),
        PolicySpec::Named {
            policy,
            rebalance_interval,
            ..
        } => converge_core::cluster::policy::by_name(
            policy.as_str(),
            &PolicyConfig {
                rebalance_interval,
                value: None,
            },
        )
        .map_err(Error::Invalid)?,
        PolicySpec::ValueGa { .. } => Box::new(PlanPolicy {
            plan: plan.ok_or_else(|| Error::Invalid("the GA policy needs its plan".into()))?,
        }),
    })
}

/// Every worker's node core configuration under `policy`: FlowCon's parameters when it runs
/// FlowCon, SpeCon's Alg. 1 parameters when it migrates. The simulated network never fails,
/// so workers never fence themselves.
pub fn node_config(policy: PolicySpec, worker: &str, cpus: f64) -> Result<NodeConfig> {
    let mut c = NodeConfig::new(worker, cpus);
    c.fence_after = 0.0;
    match policy {
        PolicySpec::Flowcon {
            alpha,
            itval,
            beta,
            adaptive,
            ..
        } => {
            c.flowcon = FlowConConfig {
                alpha,
                itval,
                beta,
                adaptive,
                ..FlowConConfig::default()
            };
            c.flowcon.validate()?;
        }
        PolicySpec::Specon {
            alpha,
            interval,
            rebalance,
        } => {
            c.specon = SpeConConfig {
                alpha,
                interval,
                rebalance,
                ..SpeConConfig::default()
            };
            c.specon.validate()?;
        }
        // As the agent builds them from its settings (agent/src/config.rs `flowcon`, `specon`).
        PolicySpec::Named {
            flowcon_interval,
            specon_interval,
            ..
        } => {
            c.flowcon = FlowConConfig {
                itval: flowcon_interval,
                adaptive: true,
                ..FlowConConfig::default()
            };
            c.flowcon.validate()?;
            c.specon = SpeConConfig {
                interval: specon_interval,
                ..SpeConConfig::default()
            };
            c.specon.validate()?;
        }
        _ => {}
    }
    Ok(c)
}

/// The FlowCon configuration `policy` runs on its workers, if it runs FlowCon.
pub fn flowcon_config(policy: PolicySpec) -> Option<FlowConConfig> {
    match policy {
        PolicySpec::Flowcon { .. } => node_config(policy, "", 1.0).ok().map(|c| c.flowcon),
        // Whatever the manager's policy asks its workers to run.
        PolicySpec::Named { .. }
            if cluster_policy(policy, policy, None)
                .is_ok_and(|p| p.worker_mode() == WorkerMode::FlowCon) =>
        {
            node_config(policy, "", 1.0).ok().map(|c| c.flowcon)
        }
        _ => None,
    }
}

/// A static plan (the GA's) carried out through the core: each submission is placed where
/// the plan says, with the plan's CPU share, or rejected. It never moves or preempts.
pub struct PlanPolicy {
    /// Per job: the worker and CPU share, or None (rejected).
    pub plan: BTreeMap<JobId, Option<(WorkerId, u32)>>,
}

impl ClusterPolicy for PlanPolicy {
    fn name(&self) -> &'static str {
        "value-ga"
    }

    fn place(&mut self, _now: Time, job: &Job, _view: ClusterView<'_>) -> Admission {
        match self.plan.get(&job.id).cloned().flatten() {
            Some((worker, cpu_shares)) => Admission::Place {
                reason: format!("placed on {worker} by the offline plan"),
                worker,
                cpu_shares,
                victims: Vec::new(),
                attributes: BTreeMap::new(),
            },
            None => Admission::Reject {
                reason: "rejected by the offline plan".into(),
            },
        }
    }

    fn place_move(&mut self, _now: Time, _job: &Job, _view: ClusterView<'_>) -> Option<WorkerId> {
        None
    }

    fn start_shares(&self, job: &str) -> u32 {
        self.plan
            .get(job)
            .cloned()
            .flatten()
            .map_or(0, |(_, shares)| shares)
    }
}
