//! The node core in virtual time: commands, rounds and fencing as a shell would drive them.

use super::*;
use converge_policy::flowcon::FlowConConfig;
use converge_policy::specon::SpeConConfig;

fn config(capacity: f64) -> NodeConfig {
    let mut c = NodeConfig::new("w1", capacity);
    c.flowcon = FlowConConfig {
        alpha: 0.02,
        itval: 2.0,
        beta: 2.0,
        adaptive: false,
        ..Default::default()
    };
    c.specon = SpeConConfig {
        alpha: 0.01,
        interval: 1.0,
        ..Default::default()
    };
    c.fence_after = 30.0;
    c.fence_deadline = 10.0;
    c
}

fn cmd(id: &str, job: &str, epoch: u64, action: Action) -> Command {
    Command {
        id: id.into(),
        job_id: job.into(),
        epoch,
        action,
    }
}

fn start(id: &str, job: &str, epoch: u64) -> Command {
    cmd(
        id,
        job,
        epoch,
        Action::Start {
            direction: Some(Direction::Minimize),
            cpus: 0.0,
        },
    )
}

fn answers(effects: &[NodeEffect]) -> Vec<&Answer> {
    effects
        .iter()
        .filter_map(|e| match e {
            NodeEffect::Answer(a) => Some(a),
            _ => None,
        })
        .collect()
}

fn docker(effects: &[NodeEffect]) -> Vec<&DockerAction> {
    effects
        .iter()
        .filter_map(|e| match e {
            NodeEffect::Docker(d) => Some(d),
            _ => None,
        })
        .collect()
}

fn rounds(effects: &[NodeEffect]) -> Vec<&FlowConRound> {
    effects
        .iter()
        .filter_map(|e| match e {
            NodeEffect::Round(r) => Some(r),
            _ => None,
        })
        .collect()
}

fn wake(effects: &[NodeEffect]) -> Option<Time> {
    match effects.last() {
        Some(NodeEffect::Wake { at }) => *at,
        other => panic!("a step must end with Wake, got {other:?}"),
    }
}

/// Drives a `Start` through Create → Done(Started) → Started, as a shell does.
fn run_job(core: &mut NodeCore, now: Time, job: &str, epoch: u64) -> Vec<NodeEffect> {
    let id = format!("start-{job}-{epoch}");
    let e = core.step(now, NodeInput::Command(start(&id, job, epoch)));
    assert!(
        matches!(docker(&e)[..], [DockerAction::Create { command, .. }] if *command == id),
        "{e:?}"
    );
    let container_id = format!("c-{job}-{epoch}");
    let e = core.step(
        now,
        NodeInput::Done {
            command_id: id,
            outcome: Ok(Some(Detail::Started {
                container_id: container_id.clone(),
                from_checkpoint: false,
            })),
        },
    );
    assert!(
        matches!(answers(&e)[..], [Answer::Result(r)] if r.ok),
        "{e:?}"
    );
    core.step(now, NodeInput::Started { container_id })
}

fn connect(core: &mut NodeCore, now: Time, mode: Mode) -> Vec<NodeEffect> {
    core.step(
        now,
        NodeInput::Session {
            connected: true,
            mode: Some(mode),
        },
    )
}

fn progress(core: &mut NodeCore, now: Time, container: &str, value: f64, cpu_seconds: f64) {
    core.step(
        now,
        NodeInput::Progress {
            container_id: container.into(),
            sample: ProgressSample {
                time: now,
                step: (now * 10.0) as u64,
                value,
            },
            initial_value: Some(2.0),
            direction: None,
        },
    );
    core.step(
        now,
        NodeInput::Usage {
            container_id: container.into(),
            cpu_seconds,
        },
    );
}

#[test]
fn a_stale_epoch_command_is_refused() {
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 1.0, "j", 2);
    assert_eq!(core.ledger().epoch("j"), Some(2));
    let e = core.step(2.0, NodeInput::Command(cmd("old", "j", 1, Action::Pause)));
    match answers(&e)[..] {
        [Answer::Stale(r)] => {
            assert!(!r.ok);
            assert_eq!(r.error, "stale epoch 1 < 2");
            assert_eq!((r.command_id.as_str(), r.epoch), ("old", 1));
        }
        _ => panic!("expected a stale refusal, got {e:?}"),
    }
    assert!(docker(&e).is_empty(), "a stale command touches nothing");
    // An adopted container's epoch fences too.
    core.step(
        3.0,
        NodeInput::Adopted {
            container_id: "c-k".into(),
            job_id: "k".into(),
            epoch: 7,
            found: Found::Running,
            cpu_limit: None,
        },
    );
    let e = core.step(3.0, NodeInput::Command(start("s", "k", 6)));
    assert!(matches!(answers(&e)[..], [Answer::Stale(_)]), "{e:?}");
}

#[test]
fn a_repeated_command_id_is_answered_from_the_cache() {
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 1.0, "j", 1);
    let save = cmd("save-1", "j", 1, Action::Save { deadline: None });
    let e = core.step(2.0, NodeInput::Command(save.clone()));
    assert!(
        matches!(
            docker(&e)[..],
            [DockerAction::Save { command: Some(c), container_id, deadline }]
                if c == "save-1" && container_id == "c-j-1" && *deadline == DEFAULT_SAVE_DEADLINE
        ),
        "{e:?}"
    );
    // While the save runs, a repeat does nothing: its result follows.
    let e = core.step(2.5, NodeInput::Command(save.clone()));
    assert!(matches!(answers(&e)[..], [Answer::InFlight { command_id }] if command_id == "save-1"));
    assert!(docker(&e).is_empty());
    let saved = Detail::Saved {
        checkpoint_dir: "j".into(),
        checkpoint_bytes: 42,
        step: 120,
        killed: false,
        save_ms: 300,
    };
    let e = core.step(
        3.0,
        NodeInput::Done {
            command_id: "save-1".into(),
            outcome: Ok(Some(saved.clone())),
        },
    );
    assert!(matches!(answers(&e)[..], [Answer::Result(r)] if r.ok && !r.replayed));
    // After it: the same answer again, marked replayed, and nothing is done twice.
    let e = core.step(4.0, NodeInput::Command(save));
    match answers(&e)[..] {
        [Answer::Replay(r)] => {
            assert!(r.replayed && r.ok);
            assert_eq!(r.detail, Some(saved));
        }
        _ => panic!("expected a replay, got {e:?}"),
    }
    assert!(docker(&e).is_empty());
}

#[test]
fn starts_are_idempotent_per_epoch_and_refused_while_another_epoch_runs() {
    let mut core = NodeCore::new(config(2.0), 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 1.0, "j", 1);
    assert_eq!(core.container("c-j-1").unwrap().cpu_limit, Some(2.0));
    // A re-sent Start of the same incarnation (new id) answers with the running container.
    let e = core.step(2.0, NodeInput::Command(start("again", "j", 1)));
    assert!(docker(&e).is_empty());
    assert!(matches!(
        answers(&e)[..],
        [Answer::Result(CommandResult { ok: true, detail: Some(Detail::Started { container_id, .. }), .. })]
            if container_id == "c-j-1"
    ));
    // Epoch 2 while epoch 1 runs: refused, and that raises no fence for epoch 1's Stop.
    let e = core.step(3.0, NodeInput::Command(start("s2", "j", 2)));
    assert!(
        matches!(answers(&e)[..], [Answer::Result(r)] if !r.ok && r.error.contains("already runs epoch 1"))
    );
    let e = core.step(
        3.0,
        NodeInput::Command(cmd(
            "stop1",
            "j",
            1,
            Action::Stop {
                remove: true,
                reason: "move".into(),

                discard: false,
            },
        )),
    );
    assert!(matches!(docker(&e)[..], [DockerAction::Stop { grace, .. }] if *grace == 10.0));
    // The exit it asked for is reported as requested, and the container removed.
    let e = core.step(
        4.0,
        NodeInput::Died {
            container_id: "c-j-1".into(),
            exit_code: Some(0),
        },
    );
    assert!(e.iter().any(|e| matches!(
        e,
        NodeEffect::ReportExit(x) if x.requested && x.remove && x.epoch == 1
    )));
    // Commands for a job with no live container are refused, naming the worker.
    let e = core.step(5.0, NodeInput::Command(cmd("p", "j", 1, Action::Pause)));
    assert!(
        matches!(answers(&e)[..], [Answer::Result(r)] if !r.ok && r.error.contains("worker w1"))
    );
    core.step(
        5.0,
        NodeInput::Gone {
            container_id: "c-j-1".into(),
        },
    );
    assert_eq!(core.containers().count(), 0);
}

#[test]
fn a_start_of_an_epoch_that_exited_here_is_never_carried_out_again() {
    // Two remembered results (and fences): two more commands forget the Start's result.
    let mut c = config(1.0);
    c.result_cache = 2;
    let mut core = NodeCore::new(c, 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 1.0, "j", 1);
    core.step(
        2.0,
        NodeInput::Died {
            container_id: "c-j-1".into(),
            exit_code: Some(0),
        },
    );
    core.step(
        2.0,
        NodeInput::Gone {
            container_id: "c-j-1".into(),
        },
    );
    run_job(&mut core, 3.0, "k", 1);
    let limits = Action::SetLimits {
        cpus: 0.5,
        cpu_shares: 0,
    };
    core.step(3.0, NodeInput::Command(cmd("limits-k", "k", 1, limits)));
    let limited = Detail::Limits {
        cpus: 0.5,
        cpu_shares: 0,
    };
    core.step(
        3.0,
        NodeInput::Done {
            command_id: "limits-k".into(),
            outcome: Ok(Some(limited)),
        },
    );
    assert_eq!(core.ledger().cached(), 2);
    // The first Start again, as a stream re-sends an unanswered command: its result is gone
    // from the cache, and the finished incarnation must not run a second time.
    let e = core.step(4.0, NodeInput::Command(start("start-j-1", "j", 1)));
    assert!(docker(&e).is_empty(), "{e:?}");
    assert!(
        matches!(
            answers(&e)[..],
            [Answer::Result(r)] if !r.ok && r.error.contains("epoch 1 of job j already ran on worker w1")
        ),
        "{e:?}"
    );
    // A new incarnation is started as ever.
    let e = core.step(5.0, NodeInput::Command(start("start-j-2", "j", 2)));
    assert!(
        matches!(docker(&e)[..], [DockerAction::Create { epoch: 2, .. }]),
        "{e:?}"
    );
}

#[test]
fn a_discarded_incarnation_is_killed_with_no_grace() {
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 1.0, "j", 1);
    let discard = Action::Stop {
        remove: true,
        reason: "superseded".into(),
        discard: true,
    };
    let e = core.step(2.0, NodeInput::Command(cmd("kill", "j", 1, discard)));
    assert!(
        matches!(docker(&e)[..], [DockerAction::Stop { grace, .. }] if *grace == 0.0),
        "{e:?}"
    );
}

#[test]
fn a_flowcon_round_gives_work_conserving_quotas() {
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    let e = connect(
        &mut core,
        0.0,
        Mode {
            flowcon: true,
            migration: false,
        },
    );
    // Turning FlowCon on runs a round at once; the next is itval later.
    assert_eq!(rounds(&e)[0].trigger, RoundTrigger::PolicyChanged);
    assert_eq!(wake(&e), Some(2.0));
    run_job(&mut core, 0.0, "a", 1);
    // "a" learns less than α = 2%/s per worker: rounds at 2, 4, 6 s make it completing.
    for (t, loss) in [(2.0, 1.0), (4.0, 0.99), (6.0, 0.985)] {
        progress(&mut core, t, "c-a-1", loss, t - 2.0);
        let e = core.step(t, NodeInput::Tick);
        assert_eq!(rounds(&e).len(), 1, "{e:?}");
    }
    // A newcomer: its start runs a round at once (Alg. 2), holding "a" to its lower bound
    // 1/(β·n) = 0.25 and giving "b" the worker, which together cover it.
    progress(&mut core, 7.0, "c-a-1", 0.985, 5.0);
    let e = run_job(&mut core, 7.0, "b", 1);
    let round = rounds(&e)[0];
    assert_eq!(round.trigger, RoundTrigger::Started { job_id: "b".into() });
    let cpus: BTreeMap<&str, f64> = round
        .targets
        .iter()
        .map(|t| (t.job_id.as_str(), t.cpus))
        .collect();
    assert_eq!(cpus["a"], 0.25);
    assert_eq!(cpus["b"], 1.0);
    let total: f64 = cpus.values().sum();
    assert!(total >= 1.0, "work-conserving: the quotas cover the worker");
    // Only what changed is updated: "a" was at the whole worker, "b" started with it.
    let updates: Vec<(&str, f64)> = docker(&e)
        .iter()
        .filter_map(|d| match d {
            DockerAction::UpdateCpus {
                command: None,
                container_id,
                cpus,
                ..
            } => Some((container_id.as_str(), *cpus)),
            _ => None,
        })
        .collect();
    assert_eq!(updates, vec![("c-a-1", 0.25)]);
    // The heartbeat's state follows, and the next round is itval after the event.
    assert!(e.iter().any(|e| matches!(
        e,
        NodeEffect::Publish(p) if p.jobs.len() == 2 && p.flowcon == Some((0.02, 2.0))
    )));
    assert_eq!(wake(&e), Some(9.0));
    // Turning FlowCon off releases what it limited.
    let e = connect(&mut core, 8.0, Mode::default());
    assert!(docker(&e).iter().any(|d| matches!(
        d,
        DockerAction::UpdateCpus { command: None, container_id, cpus, .. }
            if container_id == "c-a-1" && *cpus == 1.0
    )));
}

#[test]
fn every_round_applies_the_policy_crates_quotas() {
    // Three jobs learning at different rates on one core: whatever the lists, each round's
    // quotas are exactly `converge_policy::limits::cpu_quotas` of its limits (what the
    // simulator caps jobs with), and they always cover the worker.
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    connect(
        &mut core,
        0.0,
        Mode {
            flowcon: true,
            migration: false,
        },
    );
    let jobs: [(&str, f64); 3] = [("a", 0.3), ("b", 0.01), ("c", 0.001)];
    for (job, _) in jobs {
        run_job(&mut core, 0.0, job, 1);
    }
    let mut seen = 0;
    for i in 1..=20 {
        let t = i as f64;
        for (job, rate) in jobs {
            let loss = 2.0 * (1.0 - rate).powi(i);
            progress(&mut core, t, &format!("c-{job}-1"), loss, t / 3.0);
        }
        let e = core.step(t, NodeInput::Tick);
        for round in rounds(&e) {
            seen += 1;
            let floor = 1.0 / (2.0 * round.decisions.limits.len() as f64);
            let quotas = converge_policy::limits::cpu_quotas(&round.decisions.limits, floor, 1.0);
            let cpus: Vec<f64> = round.targets.iter().map(|t| t.cpus).collect();
            assert_eq!(cpus, quotas);
            let total: f64 = cpus.iter().sum();
            assert!(total >= 1.0 - 1e-9, "{round:?}");
        }
    }
    assert!(
        seen >= 5,
        "rounds every itval (2 s, doubled while all complete)"
    );
}

#[test]
fn self_fencing_after_the_cut_off() {
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 1.0, "a", 1);
    run_job(&mut core, 1.0, "b", 3);
    // A Stop already under way is not fenced a second time.
    core.step(
        2.0,
        NodeInput::Command(cmd(
            "stop-b",
            "b",
            3,
            Action::Stop {
                remove: false,
                reason: "user".into(),

                discard: false,
            },
        )),
    );
    let e = core.step(
        10.0,
        NodeInput::Session {
            connected: false,
            mode: None,
        },
    );
    assert_eq!(
        wake(&e),
        Some(40.0),
        "fence_after (30 s) after the stream went down"
    );
    // Early ticks do nothing.
    let e = core.step(39.9, NodeInput::Tick);
    assert!(docker(&e).is_empty());
    let e = core.step(40.0, NodeInput::Tick);
    assert!(
        matches!(e[0], NodeEffect::Fencing { containers: 1 }),
        "{e:?}"
    );
    assert_eq!(docker(&e), vec![&fencing_save("c-a-1")]);
    assert_eq!(wake(&e), None, "fenced once per disconnection");
    assert!(docker(&core.step(80.0, NodeInput::Tick)).is_empty());
    // The exit is reported as requested (not a failure of the job).
    let e = core.step(
        41.0,
        NodeInput::Died {
            container_id: "c-a-1".into(),
            exit_code: Some(0),
        },
    );
    assert!(
        e.iter()
            .any(|e| matches!(e, NodeEffect::ReportExit(x) if x.requested))
    );
    // Reconnecting re-arms it; a short cut does not fence.
    connect(&mut core, 50.0, Mode::default());
    run_job(&mut core, 50.0, "c", 1);
    core.step(
        60.0,
        NodeInput::Session {
            connected: false,
            mode: None,
        },
    );
    connect(&mut core, 80.0, Mode::default());
    assert!(docker(&core.step(95.0, NodeInput::Tick)).is_empty());
}

#[test]
fn a_worker_that_never_reaches_a_manager_fences_what_it_adopted() {
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    core.step(
        0.0,
        NodeInput::Adopted {
            container_id: "c-a".into(),
            job_id: "a".into(),
            epoch: 4,
            found: Found::Running,
            cpu_limit: Some(0.5),
        },
    );
    let e = core.step(
        0.0,
        NodeInput::Adopted {
            container_id: "c-x".into(),
            job_id: "x".into(),
            epoch: 1,
            found: Found::Created,
            cpu_limit: None,
        },
    );
    assert!(
        matches!(docker(&e)[..], [DockerAction::Remove { container_id }] if container_id == "c-x")
    );
    assert_eq!(wake(&e), Some(30.0));
    let e = core.step(30.0, NodeInput::Tick);
    assert!(matches!(
        docker(&e)[..],
        [DockerAction::Save { command: None, .. }]
    ));
}

#[test]
fn a_converged_job_produces_a_migration_request_once() {
    let mut core = NodeCore::new(config(2.0), 0.0).unwrap();
    let e = connect(
        &mut core,
        0.0,
        Mode {
            flowcon: false,
            migration: true,
        },
    );
    assert!(e.contains(&NodeEffect::ModeChanged(Mode {
        flowcon: false,
        migration: true
    })));
    run_job(&mut core, 0.0, "a", 1);
    run_job(&mut core, 0.0, "b", 1);
    // "a" barely moves (gains shrinking below 1%), "b" learns fast; categorizations every 1 s.
    let a = [2.0, 1.99, 1.985, 1.983, 1.982, 1.9815, 1.9812];
    let b = [2.0, 1.5, 1.0, 0.6, 0.3, 0.2, 0.1];
    let mut requests = Vec::new();
    for s in 0..a.len() {
        let t = s as f64;
        progress(&mut core, t, "c-a-1", a[s], t);
        progress(&mut core, t, "c-b-1", b[s], t);
        let e = core.step(t, NodeInput::Tick);
        assert_eq!(wake(&e), Some(t + 1.0));
        requests.extend(e.into_iter().filter_map(|e| match e {
            NodeEffect::RequestMigration(r) => Some(r),
            _ => None,
        }));
    }
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!((requests[0].job_id.as_str(), requests[0].epoch), ("a", 1));
    assert!(requests[0].reason.contains("SpeCon Alg. 1"));
    // The heartbeat reports SpeCon's categories when FlowCon does not run.
    let status = core.policy_status();
    let a = status.jobs.iter().find(|j| j.job_id == "a").unwrap();
    assert_eq!(a.category, converge_policy::cluster::Category::CONVERGED);
    assert_eq!(status.flowcon, None);
}

#[test]
fn set_limits_are_clamped_to_the_worker_and_recorded() {
    let mut core = NodeCore::new(config(2.0), 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 0.0, "a", 1);
    let e = core.step(
        1.0,
        NodeInput::Command(cmd(
            "l",
            "a",
            1,
            Action::SetLimits {
                cpus: 5.0,
                cpu_shares: 1,
            },
        )),
    );
    assert!(matches!(
        docker(&e)[..],
        [DockerAction::UpdateCpus { command: Some(_), cpus, cpu_shares: Some(2), .. }] if *cpus == 2.0
    ));
    core.step(
        1.0,
        NodeInput::Done {
            command_id: "l".into(),
            outcome: Ok(Some(Detail::Limits {
                cpus: 2.0,
                cpu_shares: 2,
            })),
        },
    );
    assert_eq!(core.container("c-a-1").unwrap().cpu_limit, Some(2.0));
    // A command with no action is refused, not guessed at.
    let e = core.step(2.0, NodeInput::Command(cmd("u", "a", 1, Action::Unknown)));
    assert!(matches!(answers(&e)[..], [Answer::Result(r)] if !r.ok));
}

#[test]
fn an_exited_container_found_at_startup_is_reported() {
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    let e = core.step(
        0.0,
        NodeInput::Adopted {
            container_id: "c".into(),
            job_id: "j".into(),
            epoch: 2,
            found: Found::Exited,
            cpu_limit: None,
        },
    );
    assert!(e.iter().any(|e| matches!(
        e,
        NodeEffect::ReportExit(x) if x.container_id == "c" && !x.requested && x.remove
    )));
    // A die event for it afterwards reports nothing twice.
    let e = core.step(
        1.0,
        NodeInput::Died {
            container_id: "c".into(),
            exit_code: None,
        },
    );
    assert_eq!(e.len(), 1);
}

fn stop(id: &str, job: &str, epoch: u64) -> Command {
    cmd(
        id,
        job,
        epoch,
        Action::Stop {
            remove: false,
            reason: "user".into(),

            discard: false,
        },
    )
}

/// The Save self-fencing sends for `container` (no command: the manager is gone).
fn fencing_save(container: &str) -> DockerAction {
    DockerAction::Save {
        command: None,
        container_id: container.into(),
        deadline: 10.0,
    }
}

fn disconnect(core: &mut NodeCore, now: Time) -> Vec<NodeEffect> {
    core.step(
        now,
        NodeInput::Session {
            connected: false,
            mode: None,
        },
    )
}

/// A Stop that Docker refused, or a Save that could not signal its container, leaves the
/// container running: when the manager is then gone, self-fencing must checkpoint and stop it
/// like any other (it was passed over as "asked to exit", and the manager restarts the job
/// elsewhere: two incarnations).
#[test]
fn a_container_whose_stop_or_save_failed_is_still_fenced() {
    let failed = [
        (stop("stop-a", "a", 1), "cannot stop the container: 500"),
        (
            cmd("save-a", "a", 1, Action::Save { deadline: None }),
            "cannot signal the container: 500",
        ),
    ];
    for (command, error) in failed {
        let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
        connect(&mut core, 0.0, Mode::default());
        run_job(&mut core, 1.0, "a", 1);
        let id = command.id.clone();
        core.step(2.0, NodeInput::Command(command));
        // Docker refused: the container still runs, and the manager is told so.
        let e = core.step(
            3.0,
            NodeInput::Done {
                command_id: id.clone(),
                outcome: Err(error.into()),
            },
        );
        assert!(
            matches!(answers(&e)[..], [Answer::Result(r)] if !r.ok),
            "{id}: {e:?}"
        );
        // Cut off: the manager restarts "a" elsewhere after its grace, so "a" must be fenced.
        disconnect(&mut core, 10.0);
        let e = core.step(40.0, NodeInput::Tick);
        assert_eq!(
            docker(&e),
            vec![&fencing_save("c-a-1")],
            "{id}: the still-running container is not fenced: {e:?}"
        );
    }
}

/// A fencing Save that never ended (its failure is not reported back: it has no command) does
/// not exempt the container from the next cut-off's fencing.
#[test]
fn a_container_whose_fencing_save_never_finished_is_fenced_again() {
    // The shell reports nothing about a fencing Save (command None): when it fails
    // (executor.rs `save`, "fencing could not stop the container"), the container runs on,
    // and the core must not believe its exit is still under way forever.
    let mut core = NodeCore::new(config(1.0), 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 1.0, "a", 1);
    disconnect(&mut core, 10.0);
    let e = core.step(40.0, NodeInput::Tick);
    assert_eq!(docker(&e).len(), 1, "first fencing: {e:?}");
    // The save failed (no Died ever comes); the manager comes back, then goes away again.
    connect(&mut core, 50.0, Mode::default());
    disconnect(&mut core, 60.0);
    let e = core.step(90.0, NodeInput::Tick);
    assert!(
        docker(&e).contains(&&fencing_save("c-a-1")),
        "second cut-off: the container that still runs is not fenced: {e:?}"
    );
}

/// A command about incarnation 2 is not carried out on incarnation 1's container: answered
/// ok, it would also raise the job's fence to 2, and the manager's Stop of the superseded
/// incarnation 1 would be refused as stale.
#[test]
fn a_command_for_another_epoch_does_not_act_on_the_running_incarnation() {
    let mut core = NodeCore::new(config(2.0), 0.0).unwrap();
    connect(&mut core, 0.0, Mode::default());
    run_job(&mut core, 1.0, "j", 1);
    // A SetLimits about incarnation 2, which does not run here (epoch 1 does).
    let e = core.step(
        2.0,
        NodeInput::Command(cmd(
            "l2",
            "j",
            2,
            Action::SetLimits {
                cpus: 0.5,
                cpu_shares: 0,
            },
        )),
    );
    let acted = !docker(&e).is_empty();
    if acted {
        core.step(
            2.0,
            NodeInput::Done {
                command_id: "l2".into(),
                outcome: Ok(Some(Detail::Limits {
                    cpus: 0.5,
                    cpu_shares: 0,
                })),
            },
        );
    }
    // The manager's Stop of the superseded incarnation 1 must still be carried out.
    let e2 = core.step(3.0, NodeInput::Command(stop("stop1", "j", 1)));
    assert!(
        !acted && matches!(docker(&e2)[..], [DockerAction::Stop { .. }]),
        "epoch 2's SetLimits acted on epoch 1's container ({e:?}), then epoch 1's Stop: {e2:?}"
    );
}
