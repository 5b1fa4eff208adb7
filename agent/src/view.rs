//! The read-mostly view of the worker's containers that many tasks share.
//!
//! The executor owns the containers (it alone starts, stops and forgets them); the log
//! followers and the usage sampler write their measurements into the view; the session reads
//! it to build heartbeats and registrations. A `DashMap` keyed by container id fits that shape
//! (design.md: dashmap only for read-mostly views, never a second owner of decisions).

use std::collections::HashMap;
use std::sync::Arc;

use converge_messenger::agent::AgentState;
use converge_messenger::pb;
use dashmap::DashMap;
use tokio::sync::watch;
use tokio::time::Instant;

/// What the agent knows about one container right now.
#[derive(Clone, Debug)]
pub struct ContainerView {
    /// The job it runs.
    pub job_id: String,
    /// The incarnation's epoch.
    pub epoch: u64,
    /// Docker's id.
    pub container_id: String,
    /// Lifecycle state.
    pub state: pb::ContainerState,
    /// Exit code once exited.
    pub exit_code: Option<i32>,
    /// CPU limit applied, in cores.
    pub cpu_limit: Option<f64>,
    /// Average cores used over the last usage interval.
    pub cpu_cores: f64,
    /// Cumulative CPU time, ns.
    pub cpu_total_ns: u64,
    /// Memory in use, bytes.
    pub memory_bytes: u64,
    /// Last progress step seen.
    pub last_step: Option<u64>,
    /// Last metric value seen.
    pub last_value: Option<f64>,
    /// When the agent read the line carrying `last_value` (the time of FlowCon's and SpeCon's
    /// progress samples).
    pub last_value_at: Option<Instant>,
    /// The first metric value this incarnation reported (what progress is normalized by).
    pub first_value: Option<f64>,
    /// The metric's direction, when the job said.
    pub direction: Option<converge_contract::Direction>,
    /// The job printed its `"done": true` line.
    pub done: bool,
    /// Checkpoint bytes of the last checkpoint line.
    pub checkpoint_bytes: Option<u64>,
    /// Its exit as reported to the manager, once made and until the manager has it:
    /// registrations list it with the container, so that a manager reads the exit before it
    /// decides anything about the job.
    pub exit: Option<pb::ContainerExited>,
}

impl ContainerView {
    /// A container the agent just started or adopted.
    pub fn new(job_id: &str, epoch: u64, container_id: &str, state: pb::ContainerState) -> Self {
        Self {
            job_id: job_id.to_string(),
            epoch,
            container_id: container_id.to_string(),
            state,
            exit_code: None,
            cpu_limit: None,
            cpu_cores: 0.0,
            cpu_total_ns: 0,
            memory_bytes: 0,
            last_step: None,
            last_value: None,
            last_value_at: None,
            first_value: None,
            direction: None,
            done: false,
            checkpoint_bytes: None,
            exit: None,
        }
    }
}

/// Per-container views, keyed by container id.
pub type Views = Arc<DashMap<String, ContainerView>>;

/// A job's state in the worker's policy rounds, as the heartbeat reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobPolicy {
    /// The incarnation the round saw.
    pub epoch: u64,
    /// FlowCon's list, or SpeCon's category when FlowCon does not run.
    pub category: pb::Category,
    /// FlowCon's growth efficiency (None until measured, and under SpeCon alone).
    pub growth_efficiency: Option<f64>,
}

/// What the executor's policy rounds decided, for the heartbeat to read. The executor is its
/// only writer; this is a read-mostly copy of its decisions, not a second owner of them.
#[derive(Debug, Default)]
pub struct PolicyView {
    /// By job id.
    pub jobs: DashMap<String, JobPolicy>,
    /// FlowCon's threshold α and interval, seconds (None when FlowCon does not run).
    pub flowcon: std::sync::Mutex<Option<(f64, f64)>>,
}

/// What the session sends about this worker: its identity plus the live view.
pub struct WorkerState {
    /// The registration without containers; filled in per (re)connect.
    pub register: pb::Register,
    /// CPU capacity, to express limits as fractions.
    pub capacity: f64,
    /// The containers.
    pub views: Views,
    /// The policy rounds' categories, growth efficiencies, threshold and interval.
    pub policy: Arc<PolicyView>,
    /// True once the executor has adopted what was already running: registering before that
    /// would tell the manager the worker is empty and make it start jobs a second time.
    pub ready: watch::Receiver<bool>,
}

impl AgentState for WorkerState {
    async fn register(&self) -> pb::Register {
        let mut ready = self.ready.clone();
        // If the executor died before becoming ready, registering an empty worker is still
        // the truth as far as anyone can know.
        let _ = ready.wait_for(|r| *r).await;
        let mut r = self.register.clone();
        let mut containers: Vec<pb::ContainerReport> = self
            .views
            .iter()
            .map(|v| pb::ContainerReport {
                job_id: v.job_id.clone(),
                epoch: v.epoch,
                container_id: v.container_id.clone(),
                state: v.state as i32,
                exit_code: v.exit_code,
                last_step: v.last_step,
                exit: v.exit.clone(),
            })
            .collect();
        containers.sort_by(|a, b| a.job_id.cmp(&b.job_id).then(a.epoch.cmp(&b.epoch)));
        r.containers = containers;
        r
    }

    fn heartbeat(&self) -> pb::Heartbeat {
        // One status per job: if two incarnations briefly coexist, the newest epoch wins.
        let mut jobs: HashMap<String, pb::JobStatus> = HashMap::new();
        for v in self.views.iter() {
            let policy = self
                .policy
                .jobs
                .get(&v.job_id)
                .filter(|p| p.epoch == v.epoch)
                .map(|p| p.clone());
            let status = pb::JobStatus {
                job_id: v.job_id.clone(),
                epoch: v.epoch,
                category: policy
                    .as_ref()
                    .map_or(pb::Category::Unspecified, |p| p.category)
                    as i32,
                growth_efficiency: policy.and_then(|p| p.growth_efficiency),
                // The limit the cgroup enforces (what FlowCon decided, once applied), as a
                // fraction of the worker.
                cpu_limit: v.cpu_limit.map(|c| (c / self.capacity).min(1.0)),
                cpu_usage: v.cpu_cores,
                memory_bytes: v.memory_bytes,
                state: v.state as i32,
            };
            match jobs.get(&v.job_id) {
                Some(old) if old.epoch > v.epoch => {}
                _ => {
                    jobs.insert(v.job_id.clone(), status);
                }
            }
        }
        let mut jobs: Vec<pb::JobStatus> = jobs.into_values().collect();
        jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        let flowcon = *self
            .policy
            .flowcon
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        pb::Heartbeat {
            jobs,
            alpha: flowcon.map(|(alpha, _)| alpha),
            interval_s: flowcon.map(|(_, itval)| itval),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(ready: bool) -> (WorkerState, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(ready);
        (
            WorkerState {
                register: pb::Register {
                    worker_id: "w1".into(),
                    cpu_capacity: 2.0,
                    ..Default::default()
                },
                capacity: 2.0,
                views: Views::default(),
                policy: Arc::default(),
                ready: rx,
            },
            tx,
        )
    }

    #[test]
    fn heartbeat_reports_one_status_per_job_with_limits_as_fractions() {
        let (s, _tx) = state(true);
        let mut old = ContainerView::new("j", 1, "c-old", pb::ContainerState::Exited);
        old.cpu_cores = 9.0;
        let mut new = ContainerView::new("j", 2, "c-new", pb::ContainerState::Running);
        new.cpu_limit = Some(0.5);
        new.cpu_cores = 0.4;
        new.memory_bytes = 42;
        s.views.insert("c-old".into(), old);
        s.views.insert("c-new".into(), new);
        s.views.insert(
            "c-k".into(),
            ContainerView::new("k", 1, "c-k", pb::ContainerState::Paused),
        );
        let hb = s.heartbeat();
        assert_eq!(hb.jobs.len(), 2);
        let j = &hb.jobs[0];
        assert_eq!((j.job_id.as_str(), j.epoch), ("j", 2));
        assert_eq!(j.cpu_limit, Some(0.25));
        assert_eq!(j.cpu_usage, 0.4);
        assert_eq!(j.memory_bytes, 42);
        assert_eq!(hb.jobs[1].state, pb::ContainerState::Paused as i32);
    }

    #[test]
    fn heartbeat_carries_the_policy_rounds_state_for_the_current_epoch() {
        let (s, _tx) = state(true);
        let mut v = ContainerView::new("j", 2, "c-j", pb::ContainerState::Running);
        v.cpu_limit = Some(0.5);
        s.views.insert("c-j".into(), v);
        s.views.insert(
            "c-k".into(),
            ContainerView::new("k", 1, "c-k", pb::ContainerState::Running),
        );
        s.policy.jobs.insert(
            "j".into(),
            JobPolicy {
                epoch: 2,
                category: pb::Category::Completing,
                growth_efficiency: Some(0.004),
            },
        );
        // A round's state for an older incarnation is not reported for the new one.
        s.policy.jobs.insert(
            "k".into(),
            JobPolicy {
                epoch: 0,
                category: pb::Category::New,
                growth_efficiency: Some(1.0),
            },
        );
        *s.policy.flowcon.lock().unwrap() = Some((0.02, 4.0));
        let hb = s.heartbeat();
        assert_eq!(hb.alpha, Some(0.02));
        assert_eq!(hb.interval_s, Some(4.0));
        let j = &hb.jobs[0];
        assert_eq!(j.category, pb::Category::Completing as i32);
        assert_eq!(j.growth_efficiency, Some(0.004));
        assert_eq!(j.cpu_limit, Some(0.25));
        let k = &hb.jobs[1];
        assert_eq!(k.category, pb::Category::Unspecified as i32);
        assert_eq!(k.growth_efficiency, None);
    }

    #[tokio::test]
    async fn registration_waits_until_adoption_is_done() {
        let (s, tx) = state(false);
        let s = Arc::new(s);
        let s2 = s.clone();
        let reg = tokio::spawn(async move { s2.register().await });
        tokio::task::yield_now().await;
        assert!(
            !reg.is_finished(),
            "registering before adoption would hide running jobs"
        );
        let mut v = ContainerView::new("j", 3, "c1", pb::ContainerState::Running);
        v.last_step = Some(120);
        s.views.insert("c1".into(), v);
        tx.send(true).unwrap();
        let r = reg.await.unwrap();
        assert_eq!(r.worker_id, "w1");
        assert_eq!(r.containers.len(), 1);
        assert_eq!(r.containers[0].last_step, Some(120));
        assert_eq!(r.containers[0].state, pb::ContainerState::Running as i32);
    }
}
