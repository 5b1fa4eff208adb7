//! One worker's decision core: the agent's executor as a pure state machine.
//!
//! [`NodeCore::step`] takes the time (seconds, [`Time`]) and one [`NodeInput`] and returns the
//! [`NodeEffect`]s to carry out. It owns every decision the worker makes about its jobs:
//!
//! - the command ledger ([`CommandLedger`]): a command whose epoch is older than the newest
//!   seen for its job is refused; a repeated command id is answered from a bounded cache of
//!   results (or, while the first arrival still runs, not at all: its result follows);
//! - which containers (incarnations) exist on the worker as far as decisions go: started by a
//!   command or adopted, exiting once Docker says they died, forgotten once their exit was
//!   reported ([`NodeInput::Gone`]);
//! - what each command does: a `Start` of an incarnation that already runs is answered with
//!   its container, a `Start` while another epoch runs is refused, commands for a job with no
//!   live container are refused, limits are clamped to the worker;
//! - FlowCon's rounds (TCC'22 Alg. 1-3): due every `itval` (doubled while every job
//!   completes) and at once when a container starts or dies (Alg. 2's listeners), with the
//!   limits turned into Docker quotas by [`converge_policy::limits::cpu_quotas`], the same
//!   function the simulator caps its jobs with; only the quotas that change are updated;
//! - SpeCon's Alg. 1 every categorization interval, and one migration request per converged
//!   job and epoch;
//! - self-fencing: after `fence_after` seconds without a manager (never connected counts), it
//!   checkpoints and stops every job container, so a job the manager restarts elsewhere never
//!   runs twice.
//!
//! It does no I/O and reads no clock: no tokio, no Docker, no gRPC types. The agent's executor
//! is one shell around it (Docker, the manager's stream); the simulator is another (modelled
//! containers, virtual time).
//!
//! ## Driving it
//! A shell owns one [`NodeCore`], made with [`NodeCore::new`] at time `now`, and calls
//! [`NodeCore::step`] with non-decreasing times. Every step's effects end with exactly one
//! [`NodeEffect::Wake`]: the shell keeps only the latest and sends [`NodeInput::Tick`] at
//! that time (a tick that comes early or late does no harm).
//!
//! Inputs, and when to send them:
//! - [`NodeInput::Adopted`]: at startup, once per container labelled with this worker, before
//!   anything else (so the ledger knows their epochs before any command).
//! - [`NodeInput::Session`]: whenever the stream to the manager goes up or down or a
//!   registration answer arrives, with the [`Mode`] that answer asked for.
//! - [`NodeInput::Command`]: each command from the manager, decoded.
//! - [`NodeInput::Done`]: when a [`DockerAction`] that carried a command id finished, with
//!   its outcome ([`Detail::Started`] for `Create`, [`Detail::Limits`] for a command's
//!   `UpdateCpus`, [`Detail::Saved`] for `Save`, nothing for `Pause`, `Resume`, `Stop`).
//! - [`NodeInput::Started`] / [`NodeInput::Died`]: Docker's `start` and `die` events (a
//!   modelled container starting or finishing). Send `Started` after the `Done` of its
//!   `Create`: the core ignores events of containers it does not know.
//! - [`NodeInput::Gone`]: when an exit the core asked to report ([`NodeEffect::ReportExit`])
//!   has been reported (and the container removed).
//! - [`NodeInput::Usage`]: a container's cumulative CPU-seconds, read at the step's time.
//!   FlowCon measures use over a round as Δ CPU-seconds / Δ time between the readings it had
//!   at consecutive rounds, so a shell sends fresh readings of every live container just
//!   before each `Tick`, `Started`, `Died` and `Session` (the inputs that may run a round).
//!   A simulator sends its modelled CPU-seconds the same way.
//! - [`NodeInput::Progress`]: a container's latest progress sample (time, step, metric) with
//!   the incarnation's initial metric if the shell knows it. Any time; at the latest with the
//!   usage readings before a round. Only the latest sample matters at a round.
//! - [`NodeInput::LimitFailed`]: a round's `UpdateCpus` (no command id) failed.
//!
//! Effects, and what each means:
//! - [`NodeEffect::Docker`]: carry out a [`DockerAction`]. Quick ones (create, update,
//!   pause, resume, remove) may be awaited before the next input; those that wait for an
//!   exit (stop, save) should run on their own and report with `Done`, so a slow checkpoint
//!   holds up no other job. A round's `UpdateCpus` are independent and may run together.
//! - [`NodeEffect::Answer`]: send a command's result to the manager (not for `InFlight`).
//! - [`NodeEffect::ReportExit`]: report a container's exit (the agent first lets the log
//!   follower drain and inspects the exit code), remove it if asked, then send `Gone`.
//! - [`NodeEffect::RequestMigration`]: send a migration request to the manager.
//! - [`NodeEffect::Round`]: what a FlowCon round decided (its `UpdateCpus` effects come
//!   before it in the same step). The simulator caps each job's CPU at
//!   [`Target::cpus`] from here.
//! - [`NodeEffect::Publish`]: the policy state heartbeats report (categories, growth
//!   efficiencies, α and itval), whole.
//! - [`NodeEffect::SpeConRound`], [`NodeEffect::Fencing`], [`NodeEffect::ModeChanged`]: for
//!   logs and metrics.
//! - [`NodeEffect::Wake`]: when to tick next.
//!
//! ## A simulator's loop
//! Per worker: `Session { connected: true, mode }` once; on a job placed there, `Command`
//! (`Start`) → `Docker(Create)` → `Done(Started)` then `Started`; at each `Wake`, `Usage` and
//! `Progress` for every container then `Tick`; apply every `Round`'s targets as CPU caps;
//! `RequestMigration` goes to the manager's core; a finishing container is `Died`, then
//! `Gone` after its `ReportExit`.

mod ledger;
mod rounds;
pub mod types;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use converge_policy::growth::{Direction, Sample};
use converge_policy::limits::clamp_cpus;

pub use ledger::{Admission, CommandLedger};
use rounds::{FlowConRounds, Running, SpeConRounds};
pub use types::*;

/// One container the core knows of (an incarnation of a job on this worker).
#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    /// The container.
    pub container_id: String,
    /// Its job.
    pub job_id: String,
    /// Its epoch.
    pub epoch: u64,
    /// Docker said it died; its exit is being reported.
    pub exiting: bool,
    /// A Stop, a Save or fencing asked for this exit: not a failure of the job.
    pub exit_requested: bool,
    /// Remove it once its exit is reported, even when exited containers are kept.
    pub remove_on_exit: bool,
    /// Paused by a command.
    pub paused: bool,
    /// The CPU limit in force, cores (None: unknown).
    pub cpu_limit: Option<f64>,
    /// The metric's direction from the job's spec (None for adopted containers).
    pub spec_direction: Option<Direction>,
    /// The metric's direction from its progress lines (takes precedence).
    pub line_direction: Option<Direction>,
    /// The latest progress sample.
    pub progress: Option<ProgressSample>,
    /// What progress is normalized by.
    pub initial_value: Option<f64>,
    /// The latest CPU reading: (when, cumulative CPU-seconds).
    pub cpu: Option<(Time, f64)>,
}

impl Container {
    fn new(container_id: &str, job_id: &str, epoch: u64) -> Self {
        Container {
            container_id: container_id.to_string(),
            job_id: job_id.to_string(),
            epoch,
            exiting: false,
            exit_requested: false,
            remove_on_exit: false,
            paused: false,
            cpu_limit: None,
            spec_direction: None,
            line_direction: None,
            progress: None,
            initial_value: None,
            cpu: None,
        }
    }
}

/// A command whose Docker action is under way.
#[derive(Debug, Clone)]
struct Pending {
    job_id: String,
    epoch: u64,
    action: Action,
}

/// One worker's decisions as a state machine (see the module doc for how to drive it).
#[derive(Debug, Clone)]
pub struct NodeCore {
    config: NodeConfig,
    now: Time,
    ledger: CommandLedger,
    /// By container id; ordered so that effects come in the same order every run.
    containers: BTreeMap<String, Container>,
    pending: HashMap<String, Pending>,
    mode: Mode,
    flowcon: Option<FlowConRounds>,
    specon: Option<SpeConRounds>,
    /// Since when no stream to the manager has been up (None while connected).
    disconnected_since: Option<Time>,
    /// This disconnection already fenced the containers.
    fenced: bool,
}

impl NodeCore {
    /// A worker with no containers, not connected since `now` (a worker that never reaches a
    /// manager fences what it adopted like anything else). Fails on invalid FlowCon or
    /// SpeCon parameters.
    pub fn new(config: NodeConfig, now: Time) -> Result<Self, converge_policy::Error> {
        config.flowcon.validate()?;
        config.specon.validate()?;
        Ok(NodeCore {
            ledger: CommandLedger::with_capacity(config.result_cache),
            config,
            now,
            containers: BTreeMap::new(),
            pending: HashMap::new(),
            mode: Mode::default(),
            flowcon: None,
            specon: None,
            disconnected_since: Some(now),
            fenced: false,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The worker policy in force.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The command ledger (newest epochs, cached results).
    pub fn ledger(&self) -> &CommandLedger {
        &self.ledger
    }

    /// The containers the core knows of, by container id.
    pub fn containers(&self) -> impl Iterator<Item = &Container> {
        self.containers.values()
    }

    /// One container.
    pub fn container(&self, id: &str) -> Option<&Container> {
        self.containers.get(id)
    }

    /// When the next [`NodeInput::Tick`] is wanted.
    pub fn next_tick(&self) -> Option<Time> {
        [
            self.flowcon.as_ref().map(|f| f.next_round),
            self.specon.as_ref().map(|s| s.next_round),
            self.fence_at(),
        ]
        .into_iter()
        .flatten()
        .min_by(f64::total_cmp)
    }

    /// The policy state heartbeats report now.
    pub fn policy_status(&self) -> PolicyStatus {
        let mut epochs: HashMap<&str, u64> = HashMap::new();
        for c in self.containers.values().filter(|c| !c.exiting) {
            let e = epochs.entry(c.job_id.as_str()).or_insert(c.epoch);
            *e = (*e).max(c.epoch);
        }
        let mut jobs = Vec::new();
        // FlowCon's lists when it runs (also under `converge`, where SpeCon's categories only
        // drive the requests): they are what the manager's Alg. 4 placement reasons about.
        if let Some(f) = &self.flowcon {
            for s in f.flowcon().snapshots() {
                if let Some(&epoch) = epochs.get(s.job_id.as_str()) {
                    jobs.push(JobPolicy {
                        job_id: s.job_id.to_string(),
                        epoch,
                        category: s.category,
                        growth_efficiency: s.growth_efficiency,
                    });
                }
            }
        } else if let Some(s) = &self.specon {
            for (id, category) in s.categories() {
                if let Some(&epoch) = epochs.get(id.as_str()) {
                    jobs.push(JobPolicy {
                        job_id: id.clone(),
                        epoch,
                        category,
                        growth_efficiency: None,
                    });
                }
            }
        }
        jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        PolicyStatus {
            jobs,
            flowcon: self
                .flowcon
                .as_ref()
                .map(|f| (f.flowcon().alpha(), f.flowcon().itval())),
        }
    }

    /// Consumes one input at time `now` (seconds; a time before the previous step's counts as
    /// that step's) and returns what to carry out, ending with one [`NodeEffect::Wake`].
    pub fn step(&mut self, now: Time, input: NodeInput) -> Vec<NodeEffect> {
        if now > self.now {
            self.now = now;
        }
        let mut out = Vec::new();
        match input {
            NodeInput::Command(cmd) => self.command(cmd, &mut out),
            NodeInput::Done {
                command_id,
                outcome,
            } => self.done(command_id, outcome, &mut out),
            NodeInput::Adopted {
                container_id,
                job_id,
                epoch,
                found,
                cpu_limit,
            } => self.adopted(container_id, job_id, epoch, found, cpu_limit, &mut out),
            NodeInput::Started { container_id } => {
                if let Some(c) = self.containers.get(&container_id)
                    && !c.exiting
                {
                    // FlowCon TCC'22 Alg. 2 lines 5-9: a new container joins NL and Alg. 1
                    // runs now, not at the end of the interval.
                    let job_id = c.job_id.clone();
                    self.flowcon_round(RoundTrigger::Started { job_id }, &mut out);
                }
            }
            NodeInput::Died {
                container_id,
                exit_code,
            } => {
                if let Some(c) = self.containers.get(&container_id)
                    && !c.exiting
                {
                    let job_id = c.job_id.clone();
                    self.begin_exit(&container_id, exit_code, &mut out);
                    // FlowCon TCC'22 Alg. 2 lines 10-17: a finished container leaves its list,
                    // releases its share, and Alg. 1 runs now.
                    self.flowcon_round(RoundTrigger::Died { job_id }, &mut out);
                }
            }
            NodeInput::Gone { container_id } => {
                self.containers.remove(&container_id);
            }
            NodeInput::Usage {
                container_id,
                cpu_seconds,
            } => {
                if let Some(c) = self.containers.get_mut(&container_id) {
                    c.cpu = Some((self.now, cpu_seconds));
                }
            }
            NodeInput::Progress {
                container_id,
                sample,
                initial_value,
                direction,
            } => {
                if let Some(c) = self.containers.get_mut(&container_id) {
                    c.progress = Some(sample);
                    c.initial_value = initial_value.or(c.initial_value).or(Some(sample.value));
                    c.line_direction = direction.or(c.line_direction);
                }
            }
            NodeInput::LimitFailed { container_id } => {
                if let Some(c) = self.containers.get_mut(&container_id) {
                    c.cpu_limit = None;
                }
            }
            NodeInput::Session { connected, mode } => {
                if connected {
                    self.disconnected_since = None;
                    self.fenced = false;
                } else if self.disconnected_since.is_none() {
                    self.disconnected_since = Some(self.now);
                }
                if let Some(mode) = mode
                    && mode != self.mode
                {
                    self.set_mode(mode, &mut out);
                }
            }
            NodeInput::Tick => self.tick(&mut out),
        }
        out.push(NodeEffect::Wake {
            at: self.next_tick(),
        });
        out
    }

    // ---- commands ----

    fn command(&mut self, cmd: Command, out: &mut Vec<NodeEffect>) {
        match self.ledger.admit(&cmd) {
            Admission::Replay(r) => out.push(NodeEffect::Answer(Answer::Replay(r))),
            Admission::InFlight => {
                out.push(NodeEffect::Answer(Answer::InFlight { command_id: cmd.id }))
            }
            Admission::Stale(r) => out.push(NodeEffect::Answer(Answer::Stale(r))),
            Admission::Execute => self.execute(cmd, out),
        }
    }

    /// The job's live container (not exiting; the newest epoch if several).
    fn live(&self, job: &str) -> Option<&Container> {
        self.containers
            .values()
            .filter(|c| c.job_id == job && !c.exiting)
            .max_by_key(|c| c.epoch)
    }

    fn no_container(&self, cmd: &Command) -> String {
        format!(
            "no running container of job {} (epoch {}) on worker {}",
            cmd.job_id, cmd.epoch, self.config.worker_id
        )
    }

    fn execute(&mut self, cmd: Command, out: &mut Vec<NodeEffect>) {
        if let Action::Unknown = cmd.action {
            let err = Err("command has no action (a newer manager?); nothing done".into());
            return self.answer(&cmd, err, out);
        }
        let Some(live) = self.live(&cmd.job_id) else {
            if let Action::Start { .. } = cmd.action {
                if let Some(ended) = self.ledger.ended(&cmd.job_id)
                    && cmd.epoch <= ended
                {
                    let err = Err(format!(
                        "epoch {} of job {} already ran on worker {} and exited; a Start is \
                         not carried out twice (a job runs again under a new epoch)",
                        cmd.epoch, cmd.job_id, self.config.worker_id
                    ));
                    return self.answer(&cmd, err, out);
                }
                out.push(NodeEffect::Docker(DockerAction::Create {
                    command: cmd.id.clone(),
                    job_id: cmd.job_id.clone(),
                    epoch: cmd.epoch,
                }));
                return self.pend(cmd);
            }
            let err = Err(self.no_container(&cmd));
            return self.answer(&cmd, err, out);
        };
        if live.epoch != cmd.epoch && !matches!(cmd.action, Action::Start { .. }) {
            // A command for another incarnation than the one running: never carried out on
            // this one. Answered ok, it would also raise the job's fence past the running
            // incarnation, and the manager's Stop for that one would then be refused as stale.
            let err = Err(self.no_container(&cmd));
            return self.answer(&cmd, err, out);
        }
        let id = live.container_id.clone();
        let action = match &cmd.action {
            Action::Start { .. } => {
                let outcome = if live.epoch == cmd.epoch {
                    // Never start an incarnation twice (a re-sent Start after a reconnect).
                    Ok(Some(Detail::Started {
                        container_id: id,
                        from_checkpoint: false,
                    }))
                } else {
                    Err(format!(
                        "job {} already runs epoch {} in container {id} on worker {}: stop or \
                         save it first",
                        cmd.job_id, live.epoch, self.config.worker_id
                    ))
                };
                return self.answer(&cmd, outcome, out);
            }
            &Action::SetLimits { cpus, cpu_shares } => DockerAction::UpdateCpus {
                command: Some(cmd.id.clone()),
                container_id: id,
                // Under cgroup v1 a child quota above the parent's is refused; 0 ("no limit")
                // is the whole worker, which under the parent is the same thing.
                cpus: clamp_cpus(cpus, self.config.capacity),
                // The kernel's smallest weight is 2.
                cpu_shares: (cpu_shares > 0).then(|| cpu_shares.max(2)),
            },
            Action::Pause => DockerAction::Pause {
                command: cmd.id.clone(),
                container_id: id,
            },
            Action::Resume => DockerAction::Resume {
                command: cmd.id.clone(),
                container_id: id,
            },
            Action::Stop {
                remove, discard, ..
            } => {
                let c = self.containers.get_mut(&id).expect("live");
                c.exit_requested = true;
                c.remove_on_exit = *remove;
                DockerAction::Stop {
                    command: cmd.id.clone(),
                    container_id: id,
                    // No grace, no SIGTERM: the trainer checkpoints on SIGTERM.
                    grace: if *discard {
                        0.0
                    } else {
                        self.config.stop_grace
                    },
                }
            }
            Action::Save { deadline } => {
                self.containers.get_mut(&id).expect("live").exit_requested = true;
                DockerAction::Save {
                    command: Some(cmd.id.clone()),
                    container_id: id,
                    deadline: deadline
                        .filter(|d| *d > 0.0)
                        .unwrap_or(DEFAULT_SAVE_DEADLINE),
                }
            }
            Action::Unknown => unreachable!("answered above"),
        };
        out.push(NodeEffect::Docker(action));
        self.pend(cmd);
    }

    fn pend(&mut self, cmd: Command) {
        self.pending.insert(
            cmd.id,
            Pending {
                job_id: cmd.job_id,
                epoch: cmd.epoch,
                action: cmd.action,
            },
        );
    }

    fn answer(
        &mut self,
        cmd: &Command,
        outcome: Result<Option<Detail>, String>,
        out: &mut Vec<NodeEffect>,
    ) {
        let r = CommandResult::of(cmd, outcome);
        self.ledger.record(r.clone());
        out.push(NodeEffect::Answer(Answer::Result(r)));
    }

    fn done(
        &mut self,
        command_id: String,
        outcome: Result<Option<Detail>, String>,
        out: &mut Vec<NodeEffect>,
    ) {
        // Not ours (a shell reporting twice): the first report was answered.
        let Some(p) = self.pending.remove(&command_id) else {
            return;
        };
        if outcome.is_err() && matches!(p.action, Action::Stop { .. } | Action::Save { .. }) {
            // It did not stop: the container runs on, as if never asked to exit. Left marked,
            // it would be passed over by self-fencing (which must stop every container when
            // the manager is gone) and a crash of it would be reported as asked for.
            for c in (self.containers.values_mut())
                .filter(|c| c.job_id == p.job_id && c.epoch == p.epoch && !c.exiting)
            {
                c.exit_requested = false;
                c.remove_on_exit = false;
            }
        }
        if let Ok(detail) = &outcome {
            match (&p.action, detail) {
                (
                    &Action::Start { direction, cpus },
                    Some(Detail::Started { container_id, .. }),
                ) => {
                    let mut c = Container::new(container_id, &p.job_id, p.epoch);
                    c.spec_direction = direction;
                    c.cpu_limit = Some(clamp_cpus(cpus, self.config.capacity));
                    self.containers.insert(container_id.clone(), c);
                }
                (Action::SetLimits { .. }, Some(Detail::Limits { cpus, .. })) => {
                    if let Some(c) = self.live_mut(&p.job_id) {
                        c.cpu_limit = Some(*cpus);
                    }
                }
                (Action::Pause | Action::Resume, _) => {
                    if let Some(c) = self.live_mut(&p.job_id) {
                        c.paused = matches!(p.action, Action::Pause);
                    }
                }
                _ => {}
            }
        }
        let r = CommandResult::new(&command_id, &p.job_id, p.epoch, outcome);
        self.ledger.record(r.clone());
        out.push(NodeEffect::Answer(Answer::Result(r)));
    }

    fn live_mut(&mut self, job: &str) -> Option<&mut Container> {
        self.containers
            .values_mut()
            .filter(|c| c.job_id == job && !c.exiting)
            .max_by_key(|c| c.epoch)
    }

    // ---- containers ----

    fn adopted(
        &mut self,
        container_id: String,
        job_id: String,
        epoch: u64,
        found: Found,
        cpu_limit: Option<f64>,
        out: &mut Vec<NodeEffect>,
    ) {
        self.ledger.observe_epoch(&job_id, epoch);
        match found {
            Found::Running | Found::Paused => {
                let mut c = Container::new(&container_id, &job_id, epoch);
                c.paused = found == Found::Paused;
                c.cpu_limit = cpu_limit;
                self.containers.insert(container_id, c);
            }
            Found::Created => {
                // A previous agent died between create and start: its Start was never
                // answered, so the manager will ask again. Clear the name for it.
                out.push(NodeEffect::Docker(DockerAction::Remove { container_id }));
            }
            Found::Exited => {
                // Exited while no agent watched it: report the exit (the registration lists it
                // as exited until then, so the manager does not take it for lost).
                let c = Container::new(&container_id, &job_id, epoch);
                self.containers.insert(container_id.clone(), c);
                self.begin_exit(&container_id, None, out);
            }
        }
    }

    /// Starts reporting a container's exit (once).
    fn begin_exit(&mut self, id: &str, exit_code: Option<i32>, out: &mut Vec<NodeEffect>) {
        let keep = self.config.keep_exited;
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        if c.exiting {
            return;
        }
        c.exiting = true;
        self.ledger.observe_exit(&c.job_id, c.epoch);
        out.push(NodeEffect::ReportExit(ExitToReport {
            container_id: c.container_id.clone(),
            job_id: c.job_id.clone(),
            epoch: c.epoch,
            exit_code,
            requested: c.exit_requested,
            remove: !keep || c.remove_on_exit,
        }));
    }

    // ---- worker policies and self-fencing ----

    fn set_mode(&mut self, mode: Mode, out: &mut Vec<NodeEffect>) {
        self.mode = mode;
        out.push(NodeEffect::ModeChanged(mode));
        let now = self.now;
        if mode.flowcon && self.flowcon.is_none() {
            // The parameters were validated in `new`.
            self.flowcon = FlowConRounds::new(self.config.flowcon, self.config.capacity, now).ok();
            self.flowcon_round(RoundTrigger::PolicyChanged, out);
        } else if !mode.flowcon
            && let Some(f) = self.flowcon.take()
        {
            // "free": containers compete freely within the worker's capacity again.
            let capacity = clamp_cpus(0.0, self.config.capacity);
            for id in f.limited {
                if let Some(c) = self.containers.get_mut(&id)
                    && !c.exiting
                {
                    c.cpu_limit = Some(capacity);
                    out.push(NodeEffect::Docker(DockerAction::UpdateCpus {
                        command: None,
                        container_id: id,
                        cpus: capacity,
                        cpu_shares: None,
                    }));
                }
            }
        }
        if mode.migration && self.specon.is_none() {
            self.specon = SpeConRounds::new(self.config.specon, now).ok();
        } else if !mode.migration {
            self.specon = None;
        }
        out.push(NodeEffect::Publish(self.policy_status()));
    }

    fn tick(&mut self, out: &mut Vec<NodeEffect>) {
        let now = self.now;
        if self.flowcon.as_ref().is_some_and(|f| f.next_round <= now) {
            self.flowcon_round(RoundTrigger::Interval, out);
        }
        if self.specon.as_ref().is_some_and(|s| s.next_round <= now) {
            self.specon_round(out);
        }
        if self.fence_at().is_some_and(|t| t <= now) {
            self.fence(out);
        }
    }

    /// The job containers on the worker (one per job, the newest epoch), as the rounds see them.
    fn running(&self) -> Vec<Running> {
        let mut by_job: BTreeMap<&str, &Container> = BTreeMap::new();
        for c in self.containers.values().filter(|c| !c.exiting) {
            match by_job.get(c.job_id.as_str()) {
                Some(old) if old.epoch >= c.epoch => {}
                _ => {
                    by_job.insert(&c.job_id, c);
                }
            }
        }
        by_job
            .into_values()
            .map(|c| Running {
                job_id: c.job_id.clone(),
                epoch: c.epoch,
                container_id: c.container_id.clone(),
                sample: c.progress.map(|p| Sample {
                    time: p.time,
                    value: p.value,
                }),
                initial_value: c.initial_value,
                direction: c.line_direction.or(c.spec_direction).unwrap_or_default(),
                cpu: c.cpu,
                cpu_limit: c.cpu_limit,
            })
            .collect()
    }

    /// One FlowCon round (TCC'22 Alg. 1-3) and the quota updates it implies.
    fn flowcon_round(&mut self, trigger: RoundTrigger, out: &mut Vec<NodeEffect>) {
        if self.flowcon.is_none() {
            return;
        }
        let running = self.running();
        let now = self.now;
        let Some(f) = self.flowcon.as_mut() else {
            return;
        };
        let plan = f.round(now, &running);
        for t in plan.targets.iter().filter(|t| t.changed) {
            f.limited.insert(t.container_id.clone());
            if let Some(c) = self.containers.get_mut(&t.container_id) {
                // Assumed in force until the shell says the update failed.
                c.cpu_limit = Some(t.cpus);
            }
            out.push(NodeEffect::Docker(DockerAction::UpdateCpus {
                command: None,
                container_id: t.container_id.clone(),
                cpus: t.cpus,
                cpu_shares: None,
            }));
        }
        out.push(NodeEffect::Round(FlowConRound {
            trigger,
            decisions: plan.decisions,
            targets: plan.targets,
            usage: plan.usage,
        }));
        out.push(NodeEffect::Publish(self.policy_status()));
    }

    /// One SpeCon Alg. 1 categorization, and a migration request for each converged job it
    /// names for the first time in its epoch.
    fn specon_round(&mut self, out: &mut Vec<NodeEffect>) {
        let running = self.running();
        let now = self.now;
        let Some(s) = self.specon.as_mut() else {
            return;
        };
        let requests = s.round(now, &running);
        out.push(NodeEffect::SpeConRound {
            requests: requests.len(),
        });
        out.push(NodeEffect::Publish(self.policy_status()));
        out.extend(requests.into_iter().map(NodeEffect::RequestMigration));
    }

    /// When this disconnection fences the containers (None: connected, fenced, or off).
    fn fence_at(&self) -> Option<Time> {
        if self.config.fence_after <= 0.0 || self.fenced {
            return None;
        }
        self.disconnected_since.map(|t| t + self.config.fence_after)
    }

    /// Self-fencing: no manager for `fence_after`. The manager will declare this worker lost
    /// and restart its jobs elsewhere from their checkpoints (after its recovery grace), so
    /// every job container here is checkpointed and stopped first: at most one incarnation of
    /// a job ever runs. Their exits are reported with the next registration.
    fn fence(&mut self, out: &mut Vec<NodeEffect>) {
        self.fenced = true;
        // Passed over: a container exiting, or one a manager's Stop or Save is stopping now.
        // Not one an earlier fencing asked to exit: that Save's failure is not reported back
        // (it has no command), and a container that still runs must be stopped this time.
        let stopping = |c: &Container| {
            (self.pending.values()).any(|p| {
                p.job_id == c.job_id
                    && p.epoch == c.epoch
                    && matches!(p.action, Action::Stop { .. } | Action::Save { .. })
            })
        };
        let ids: Vec<String> = self
            .containers
            .values()
            .filter(|c| !c.exiting && !stopping(c))
            .map(|c| c.container_id.clone())
            .collect();
        if ids.is_empty() {
            return;
        }
        out.push(NodeEffect::Fencing {
            containers: ids.len(),
        });
        let deadline = self.config.fence_deadline;
        for id in ids {
            if let Some(c) = self.containers.get_mut(&id) {
                c.exit_requested = true;
            }
            out.push(NodeEffect::Docker(DockerAction::Save {
                command: None,
                container_id: id,
                deadline,
            }));
        }
    }
}
