//! Every convergectl command against a real manager over real gRPC (a scripted agent plays
//! the worker): what it prints as a table and as JSON, and the exit codes scripts rely on.

use std::time::Duration;

use converge_integration_tests::{ScriptedAgent, TestManager, tempfile_dir};
use converge_messenger::agent::LogsControl;
use converge_messenger::pb::{self, agent_message::Kind};

/// Runs convergectl against `manager` with `args`: (exit code, stdout, stderr).
async fn ctl(manager: &str, args: &[&str]) -> (i32, String, String) {
    ctl_env(manager, args, &[]).await
}

/// [`ctl`] with the environment variables `env` set.
async fn ctl_env(manager: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_convergectl"))
        .arg("--manager")
        .arg(manager)
        .args(args)
        .env_remove("CONVERGE_TOKEN")
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output()
        .await
        .expect("convergectl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Output lines of a running convergectl.
type Lines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// Starts convergectl against `manager` with `args`, its output read line by line as it comes
/// (killed when the child is dropped).
fn spawn_ctl(manager: &str, args: &[&str]) -> (tokio::process::Child, Lines) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_convergectl"))
        .arg("--manager")
        .arg(manager)
        .args(args)
        .env_remove("CONVERGE_TOKEN")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("convergectl runs");
    let out = child.stdout.take().expect("stdout");
    (
        child,
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(out)),
    )
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_command_prints_tables_and_json_and_exits_with_a_code_scripts_can_use() {
    let manager = TestManager::start(|_| {}).await.expect("manager");
    let m = manager.endpoint();
    let _w1 = ScriptedAgent::connect(&m, "w1", 2.0, Duration::from_millis(100))
        .await
        .expect("agent");

    let (code, out, err) = ctl(
        &m,
        &[
            "submit",
            "--image",
            "converge/trainer:dev",
            "--cpus",
            "1",
            "--name",
            "cli-job",
            "--value",
            "100,60,600",
            "--estimated-runtime",
            "40",
            "--",
            "--model",
            "mlp-digits",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_string();
    assert_eq!(id.len(), 36, "a UUID: {out}");

    let (code, out, _) = ctl(&m, &["get", &id, "-o", "json"]).await;
    assert_eq!(code, 0);
    let j = json(&out);
    assert_eq!(
        (j["id"].as_str(), j["name"].as_str()),
        (Some(id.as_str()), Some("cli-job"))
    );
    assert_eq!(j["worker"], "w1");
    assert_eq!(j["state"], "starting");

    let (_, out, _) = ctl(&m, &["get", &id]).await;
    assert!(out.contains("state:    starting (starting on w1)"), "{out}");
    assert!(
        out.contains("value:    100 until 60s after submission, falling to 0 at 600s\n"),
        "{out}"
    );
    assert!(
        out.contains("runtime:  40s estimated, alone on a reference worker\n"),
        "{out}"
    );
    // A job is also named by its name, when it alone has it.
    let (code, out, err) = ctl(&m, &["get", "cli-job", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["id"], id.as_str());

    let (_, out, _) = ctl(&m, &["list", "-o", "json"]).await;
    assert_eq!(json(&out).as_array().map(Vec::len), Some(1));
    // Several states, as a list or the flag again (a walk tried the second and was refused).
    for (states, want) in [
        (&["--state", "completed"][..], 0),
        (&["--state", "completed,starting"], 1),
        (&["--state", "completed", "--state", "STARTING"], 1),
    ] {
        let args = [&["list", "-o", "json"][..], states].concat();
        let (code, out, err) = ctl(&m, &args).await;
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_eq!(json(&out).as_array().map(Vec::len), Some(want), "{args:?}");
    }
    let (_, out, _) = ctl(&m, &["list"]).await;
    assert!(out.starts_with("ID") && out.contains("cli-job"), "{out}");

    let (_, out, _) = ctl(&m, &["workers", "-o", "json"]).await;
    let w = json(&out);
    assert_eq!(w[0]["id"], "w1");
    assert_eq!(w[0]["jobs"][0], id.as_str());
    assert_eq!(w[0]["stopping"], serde_json::json!([]), "{out}");
    let (_, out, _) = ctl(&m, &["workers"]).await;
    let header: Vec<&str> = (out.lines().next().unwrap_or_default())
        .split_whitespace()
        .collect();
    let w1: Vec<&str> = (out.lines().find(|l| l.starts_with("w1")))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let column = |name: &str| (header.iter().position(|h| *h == name)).and_then(|i| w1.get(i));
    assert_eq!(
        (column("JOBS"), column("STOPPING")),
        (Some(&"1"), Some(&"0")),
        "{out}"
    );

    // why: the decisions recorded about it, in words and as JSON.
    let (code, out, _) = ctl(&m, &["why", &id]).await;
    assert_eq!(code, 0);
    assert!(out.contains("pending -> starting"), "{out}");
    assert!(out.contains("placed on w1"), "{out}");
    assert!(out.contains("scores="), "the placement's scores: {out}");
    let (_, out, _) = ctl(&m, &["why", &id, "-o", "json"]).await;
    let why = json(&out);
    assert_eq!(why["job"]["id"], id.as_str());
    assert!(
        why["decisions"].as_array().is_some_and(|d| d.len() >= 2),
        "{why}"
    );

    // watch: one JSON object per line, from the first event.
    let (watch, mut lines) = spawn_ctl(&m, &["watch", "--from-seq", "1", "-o", "json"]);
    let first = lines.next_line().await.expect("read").expect("a line");
    assert_eq!(json(&first)["seq"], 1);
    drop(watch);

    let (code, out, _) = ctl(&m, &["cancel", &id, "-o", "json"]).await;
    assert_eq!(code, 0);
    assert_eq!(json(&out)["state"], "cancelled");
    let (_, out, _) = ctl(&m, &["get", &id]).await;
    assert!(out.contains("eta:      - (ended)"), "{out}");

    // Exit codes: 3 for no such job (by id or name). A name given again: the job not ended
    // is meant (the first was cancelled above); two live ones are 4, listing them.
    let (code, _, err) = ctl(&m, &["get", "not-a-job"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("no job has the id or name `not-a-job`"),
        "{err}"
    );
    let again = [
        "submit",
        "--image",
        "converge/trainer:dev",
        "--name",
        "cli-job",
    ];
    let (code, out, err) = ctl(&m, &again).await;
    assert_eq!(code, 0, "{err}");
    let second = out.trim().to_string();
    let (_, out, _) = ctl(&m, &["get", "cli-job", "-o", "json"]).await;
    assert_eq!(json(&out)["id"], second.as_str());
    let (_, out, _) = ctl(&m, &again).await;
    let (code, _, err) = ctl(&m, &["get", "cli-job"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("2 jobs are named `cli-job`")
            && err.contains(&second)
            && err.contains(out.trim()),
        "{err}"
    );
    // list --name: the manager answers with that name's jobs only, ended ones too.
    let other = [
        "submit",
        "--image",
        "converge/trainer:dev",
        "--name",
        "other",
    ];
    let (code, _, err) = ctl(&m, &other).await;
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = ctl(&m, &["list", "--name", "cli-job", "-o", "json"]).await;
    let named = json(&out);
    let names: Vec<_> = (named.as_array().into_iter().flatten())
        .map(|j| j["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["cli-job"; 3], "{out}");
    let (code, _, err) = ctl(&m, &["get", "3f2b8a2e-8f1c-4c1e-9a43-2d1f0c9b7e11"]).await;
    assert_eq!(code, 3, "{err}");
    // Also written `--cpus -1`: a negative number is the value, which the manager refuses.
    for cpus in [&["--cpus=-1"][..], &["--cpus", "-1"]] {
        let mut args = vec!["submit", "--image", "x"];
        args.extend_from_slice(cpus);
        let (code, _, err) = ctl(&m, &args).await;
        assert_eq!(code, 4, "{err}");
        assert!(err.contains("spec.cpus"), "{err}");
    }
    // A value curve under a policy that never reads one: created, and said so.
    let valued = [
        "submit",
        "--image",
        "x",
        "--value",
        "10,60,300",
        "--estimated-runtime",
        "30",
    ];
    let (code, _, err) = ctl(&m, &valued).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("convergectl: warning: spec.value_curve is ignored"),
        "{err}"
    );
    let (code, _, err) = ctl(&m, &["submit", "--image", "x", "--memory", "1KiB"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("spec.memory_bytes"), "{err}");
    // A negative limit is named as one, not taken for a flag (clap's tip for a flag-like
    // value would pass it to the job).
    let (code, _, err) = ctl(&m, &["submit", "--image", "x", "--memory", "-5"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`-5` is negative"), "{err}");
    // 2 for a command line that does not parse, values included, naming those accepted.
    let (code, _, err) = ctl(&m, &["list", "--state", "runing"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("possible values: pending"), "{err}");
    // 1 when the manager cannot be reached, at once: watch waits only for a manager it had.
    for args in [&["list"][..], &["watch"]] {
        let (code, _, err) = ctl("http://127.0.0.1:9", args).await;
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("cannot reach the manager"), "{err}");
        assert!(!err.contains("reconnecting"), "waited for it: {err}");
    }

    // drain: the worker as `workers` shows it, now draining; 3 for a worker id that names
    // none, as for a job.
    let (code, out, err) = ctl(&m, &["drain", "w1", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)[0]["state"], "draining", "{out}");
    let (_, out, _) = ctl(&m, &["workers"]).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("w1") && l.contains("draining")),
        "{out}"
    );
    let (code, _, err) = ctl(&m, &["drain", "no-such-worker"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no worker `no-such-worker`"), "{err}");
    // undrain: ready again; the same 3 for a worker id that names none.
    let (code, out, err) = ctl(&m, &["undrain", "w1", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)[0]["state"], "ready", "{out}");
    let (_, out, _) = ctl(&m, &["workers"]).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("w1") && l.contains("ready")),
        "{out}"
    );
    let (code, _, err) = ctl(&m, &["undrain", "no-such-worker"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no worker `no-such-worker`"), "{err}");
    manager.stop().await;
}

/// A job submitted with the name of a job not ended is created, and the user warned that the
/// name now means two jobs; a name held only by ended jobs warns of nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_job_of_a_name_is_warned_of() {
    let manager = TestManager::start(|_| {}).await.expect("manager");
    let m = manager.endpoint();
    let submit = ["submit", "--image", "x", "--name", "resnet"];
    let (code, first, err) = ctl(&m, &submit).await;
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
    let first = first.trim().to_string();
    let (code, second, err) = ctl(&m, &submit).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!(
            "warning: spec.name `resnet` is also the name of job {first}, not ended"
        )),
        "{err}"
    );
    let (code, _, err) = ctl(&m, &["get", "resnet"]).await;
    assert_eq!(code, 4, "the name means two jobs: {err}");
    // Listed by name (the specs' index): both.
    let (_, out, _) = ctl(&m, &["list", "--name", "resnet", "-o", "json"]).await;
    assert_eq!(json(&out).as_array().map(Vec::len), Some(2), "{out}");
    let (code, _, err) = ctl(&m, &["cancel", &first]).await;
    assert_eq!(code, 0, "{err}");
    // Listed by several states: each job once, whichever of them it is in.
    for (states, want) in [
        ("cancelled", 1),
        ("cancelled,pending", 2),
        ("pending,cancelled,pending", 2),
    ] {
        let list = ["list", "--name", "resnet", "--state", states, "-o", "json"];
        let (code, out, err) = ctl(&m, &list).await;
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            json(&out).as_array().map(Vec::len),
            Some(want),
            "{states}: {out}"
        );
    }
    let (code, _, err) = ctl(&m, &["cancel", second.trim()]).await;
    assert_eq!(code, 0, "{err}");
    // A cancel by the name retried once nothing of the name is live: the newest, answered
    // as the first time (it was refused as ambiguous).
    let (code, out, err) = ctl(&m, &["cancel", "resnet", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["id"], second.trim(), "{out}");
    assert_eq!(json(&out)["state"], "cancelled", "{out}");
    let (code, _, err) = ctl(&m, &submit).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        !err.contains("warning"),
        "only ended jobs had the name: {err}"
    );
    manager.stop().await;
}

/// A job rejected at admission is created (its id printed) but exits 7 with the reason, so a
/// script does not wait for it; a negative estimate is the manager's to refuse, by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_rejected_at_admission_says_so_and_exits_7() {
    let manager = TestManager::start(|c| c.policy = "value".into())
        .await
        .expect("manager");
    let m = manager.endpoint();
    let _w1 = ScriptedAgent::connect(&m, "w1", 2.0, Duration::from_millis(100))
        .await
        .expect("agent");
    // 60 s of work, worth nothing from 10 s after submission.
    let worthless = [
        "submit",
        "--image",
        "x",
        "--value",
        "100,5,10",
        "--estimated-runtime",
        "60",
    ];
    let (code, out, err) = ctl(&m, &worthless).await;
    assert_eq!(code, 7, "{err}");
    let id = out.trim();
    assert_eq!(id.len(), 36, "its id: {out}");
    assert!(
        err.contains(&format!("job {id} was rejected at admission: "))
            && err.contains("worth nothing from 10.0 s"),
        "{err}"
    );
    let (code, out, _) = ctl(&m, &["get", id, "-o", "json"]).await;
    assert_eq!(code, 0);
    assert_eq!(json(&out)["state"], "rejected", "{out}");
    let mut as_json = worthless.to_vec();
    as_json.extend(["-o", "json"]);
    let (code, out, err) = ctl(&m, &as_json).await;
    assert_eq!(code, 7, "{err}");
    assert!(
        json(&out)["rejected"]
            .as_str()
            .is_some_and(|r| r.contains("worth nothing")),
        "{out}"
    );
    // A negative estimate reaches the manager, which names the field (clap took it for a
    // flag and offered to pass it to the job).
    let (code, _, err) = ctl(
        &m,
        &[
            "submit",
            "--image",
            "x",
            "--value",
            "10,10,60",
            "--estimated-runtime",
            "-5",
        ],
    )
    .await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("spec.estimated_runtime_s"), "{err}");
    manager.stop().await;
}

/// A history past the 4 MiB a gRPC client takes in one answer (80 jobs of 60 KB of
/// arguments): `list`, `top` and a job's name still work, a page at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_past_a_grpc_answer_is_listed_a_page_at_a_time() {
    let manager = TestManager::start(|_| {}).await.expect("manager");
    let m = manager.endpoint();
    let mut client = manager.control().await.expect("client");
    let args: Vec<String> = (0..20).map(|_| "x".repeat(3000)).collect();
    for k in 0..80 {
        let spec = pb::JobSpec {
            image: "converge/trainer:dev".into(),
            cpus: 1.0,
            name: format!("big{k}"),
            args: args.clone(),
            ..Default::default()
        };
        client
            .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
            .await
            .expect("submitted");
    }
    let (code, out, err) = ctl(&m, &["list", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out).as_array().map(Vec::len), Some(80));
    let (code, out, err) = ctl(&m, &["get", "big5", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["name"], "big5");
    // top's first frame: every job not ended.
    let (_top, mut lines) = spawn_ctl(&m, &["top", "-o", "json"]);
    let frame = lines.next_line().await.expect("read").expect("a frame");
    assert_eq!(json(&frame)["jobs"].as_array().map(Vec::len), Some(80));
    manager.stop().await;
}

/// Submits a job named `name` through convergectl; its id.
async fn submit_named(m: &str, name: &str) -> String {
    let (code, out, err) = ctl(m, &["submit", "--image", "x", "--name", name]).await;
    assert_eq!(code, 0, "{err}");
    out.trim().to_string()
}

/// The next line of a running convergectl, as JSON.
async fn next_json(lines: &mut Lines) -> serde_json::Value {
    json(&lines.next_line().await.expect("read").expect("a line"))
}

/// A manager restarted without its state numbers its events from 1 again, under a new log
/// name: a watcher back after the new manager made more events than it had shown reads the
/// new log from its first event. (Judged by the number alone, it went on from the
/// number after the last it showed, and missed the new log's first events.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reads_a_new_log_from_its_first_event_however_far_it_has_got() {
    let first = TestManager::start(|_| {}).await.expect("manager");
    let addr = first.addr;
    // The watcher reaches the managers through a proxy that can keep it away while the
    // second one makes its events.
    let proxy = converge_integration_tests::proxy::Proxy::start(addr)
        .await
        .expect("proxy");
    let before = submit_named(&first.endpoint(), "before").await;
    let (mut watch, mut events) = spawn_ctl(
        &proxy.endpoint(),
        &["watch", "--from-seq", "1", "-o", "json"],
    );
    let e = next_json(&mut events).await;
    assert_eq!(
        (e["seq"].as_u64(), e["job"].as_str()),
        (Some(1), Some(before.as_str()))
    );
    proxy.hold();
    first.stop().await;
    let second = TestManager::start_at(addr, |_| {})
        .await
        .expect("the manager again, without its state");
    let mut after = Vec::new();
    for name in ["a", "b", "c"] {
        after.push(submit_named(&second.endpoint(), name).await);
    }
    // Let the watcher through: its next call asks for event 2, which the new log has.
    proxy.cut();
    let e = next_json(&mut events).await;
    assert_eq!(
        (e["seq"].as_u64(), e["job"].as_str()),
        (Some(1), Some(after[0].as_str())),
        "the new log's first event: {e}"
    );
    watch.kill().await.expect("kill watch");
    second.stop().await;
}

/// A manager restart (on the same address and store) is a pause for `watch` and `top`, not
/// their end: `watch` goes on after the last event it printed, none missed or said twice,
/// and `top` shows the jobs submitted since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_top_go_on_across_a_manager_restart() {
    let dir = tempfile_dir("cli-restart").expect("dir");
    let state = dir.path().to_path_buf();
    let on_first = state.clone();
    let first = TestManager::start(move |c| c.state_dir = Some(on_first))
        .await
        .expect("manager");
    let (addr, m) = (first.addr, first.endpoint());
    let before = submit_named(&m, "before").await;
    let (_watch, mut events) = spawn_ctl(&m, &["watch", "--from-seq", "1", "-o", "json"]);
    let (_top, mut frames) = spawn_ctl(&m, &["top", "-o", "json"]);
    let first_event = next_json(&mut events).await;
    assert_eq!(
        (first_event["seq"].as_u64(), first_event["job"].as_str()),
        (Some(1), Some(before.as_str()))
    );
    assert_eq!(
        next_json(&mut frames).await["jobs"][0]["id"],
        before.as_str()
    );

    first.stop().await;
    let second = TestManager::start_at(addr, move |c| c.state_dir = Some(state))
        .await
        .expect("the manager again");
    let after = submit_named(&m, "after").await;
    // watch: the next events, numbered on from the first manager's, about the new job.
    let mut seqs = vec![1];
    loop {
        let e = next_json(&mut events).await;
        seqs.push(e["seq"].as_u64().expect("a number"));
        if e["job"] == after.as_str() {
            break;
        }
    }
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "every event once, in order: {seqs:?}"
    );
    // top: a frame with both jobs.
    loop {
        let f = next_json(&mut frames).await;
        let ids: Vec<_> = (f["jobs"].as_array().into_iter().flatten())
            .map(|j| j["id"].as_str().unwrap_or_default().to_string())
            .collect();
        if ids.contains(&after) {
            assert!(ids.contains(&before), "{ids:?}");
            break;
        }
    }
    // A job that ends stays on the board, as it ended.
    let (code, _, err) = ctl(&m, &["cancel", &before]).await;
    assert_eq!(code, 0, "{err}");
    loop {
        let f = next_json(&mut frames).await;
        let state_of_before = (f["jobs"].as_array().into_iter().flatten())
            .find(|j| j["id"] == before.as_str())
            .map(|j| j["state"].clone());
        if state_of_before == Some(serde_json::json!("cancelled")) {
            break;
        }
        assert!(state_of_before.is_some(), "{before} left the board: {f}");
    }
    second.stop().await;
}

/// A manager restarted without its state numbers its events from 1 again: `watch`, resuming
/// past the end of the new log, is told so (not left waiting for a number that means another
/// event) and goes on from the new log's first event. Asked for an event past the end at the
/// start, it is a wrong request naming `from_seq`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_past_the_end_of_the_log_is_refused_and_resumes_from_a_stateless_restart() {
    let first = TestManager::start(|_| {}).await.expect("manager");
    let (addr, m) = (first.addr, first.endpoint());
    let refused = ctl(&m, &["watch", "--from-seq", "1000"]);
    let (code, _, err) = tokio::time::timeout(Duration::from_secs(30), refused)
        .await
        .expect("watch past the end of the log is refused, not left waiting");
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("from_seq: 1000 is past the end of the event log (there is no event yet)"),
        "{err}"
    );
    let before = submit_named(&m, "before").await;
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_convergectl"))
        .args(["--manager", &m, "watch", "--from-seq", "1", "-o", "json"])
        .env_remove("CONVERGE_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("convergectl runs");
    let mut events = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
        watch.stdout.take().expect("stdout"),
    ));
    let mut notes = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
        watch.stderr.take().expect("stderr"),
    ));
    let e = next_json(&mut events).await;
    assert_eq!(
        (e["seq"].as_u64(), e["job"].as_str()),
        (Some(1), Some(before.as_str()))
    );

    first.stop().await;
    let second = TestManager::start_at(addr, |_| {})
        .await
        .expect("the manager again");
    // Told, once it is back; only then is the new job submitted, so its events are the new
    // log's first, which the watcher must show.
    let told = async {
        loop {
            let line = notes.next_line().await.expect("read").expect("a note");
            if line.contains("event log starts again") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), told)
        .await
        .expect("watch says the manager's event log starts again");
    let after = submit_named(&m, "after").await;
    let e = next_json(&mut events).await;
    assert_eq!(
        (e["seq"].as_u64(), e["job"].as_str()),
        (Some(1), Some(after.as_str())),
        "{e}"
    );
    second.stop().await;
}

/// forget: a lost worker without jobs leaves the list (the JSON is the worker as it was); a
/// ready one is a wrong request (exit 4) saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_removes_a_lost_worker_and_refuses_a_live_one() {
    let beat = Duration::from_millis(100);
    let manager = TestManager::start(|c| c.heartbeat_interval = beat)
        .await
        .expect("manager");
    let m = manager.endpoint();
    let _w1 = ScriptedAgent::connect(&m, "w1", 2.0, beat)
        .await
        .expect("w1");
    let w2 = ScriptedAgent::connect(&m, "w2", 2.0, beat)
        .await
        .expect("w2");
    let (_watch, mut events) = spawn_ctl(&m, &["watch", "--from-seq", "1", "-o", "json"]);
    drop(w2);
    // Its loss, as a watcher sees it.
    loop {
        let line = events.next_line().await.expect("read").expect("an event");
        let e = json(&line);
        if e["kind"] == "worker_state" && e["worker"] == "w2" && e["worker_state"] == "lost" {
            break;
        }
    }
    let (code, _, err) = ctl(&m, &["forget", "w1"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("worker w1 is ready: only a lost worker is forgotten"),
        "{err}"
    );
    let (code, out, err) = ctl(&m, &["forget", "w2", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (
            json(&out)[0]["id"].as_str(),
            json(&out)[0]["state"].as_str()
        ),
        (Some("w2"), Some("lost")),
        "{out}"
    );
    let (_, out, _) = ctl(&m, &["workers", "-o", "json"]).await;
    let ids: Vec<_> = (json(&out).as_array().into_iter().flatten())
        .map(|w| w["id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids, ["w1"], "{out}");
    let (code, _, err) = ctl(&m, &["forget", "w2"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no worker `w2`"), "{err}");
    manager.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_token_may_list_but_not_submit() {
    let dir = tempfile_dir("cli-tokens").expect("dir");
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        "viewer-token-0123456789 viewer ana\noperator-token-012345678 operator bo\n",
    )
    .expect("write");
    let manager = TestManager::start(|c| c.tokens = Some(file.clone()))
        .await
        .expect("manager");
    let m = manager.endpoint();
    let (code, _, err) = ctl(&m, &["list"]).await;
    assert_eq!(code, 5, "no token: {err}");
    let (code, _, err) = ctl(&m, &["--token", "viewer-token-0123456789", "list"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = ctl(
        &m,
        &[
            "--token",
            "viewer-token-0123456789",
            "submit",
            "--image",
            "x",
        ],
    )
    .await;
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("needs the operator role"), "{err}");
    // An operator's cancel names the operator in the job's reason, as Slurm's accounting does.
    let operator = ["--token", "operator-token-012345678"];
    let (code, out, err) = ctl(&m, &[&operator[..], &["submit", "--image", "x"]].concat()).await;
    assert_eq!(code, 0, "{err}");
    let cancel = [&operator[..], &["cancel", out.trim(), "-o", "json"]].concat();
    let (code, out, err) = ctl(&m, &cancel).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["reason"], "cancelled by bo", "{out}");
    manager.stop().await;
}

/// The next command the scripted agent gets, within 10 s.
async fn next_command(agent: &mut ScriptedAgent) -> pb::Command {
    tokio::time::timeout(Duration::from_secs(10), agent.commands.recv())
        .await
        .expect("a command within 10 s")
        .expect("the session is open")
}

/// Submits a one-core job named `name` through convergectl and has the scripted agent start
/// it in container `ctr-NAME`; its id.
async fn submit_and_start(m: &str, agent: &mut ScriptedAgent, name: &str) -> String {
    let (code, out, err) = ctl(
        m,
        &["submit", "--image", "x", "--cpus", "1", "--name", name],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_string();
    agent
        .answer_start(&id, &format!("ctr-{name}"))
        .await
        .expect("the Start of the submitted job");
    id
}

/// What the scripted agent says of `job`: a progress sample at `step` of 100, read a tenth
/// of a second a step later than now: lines of steps far apart are read more than a second
/// apart, and each is one of the manager's points (it keeps one a second).
fn sample(job: &str, step: u64) -> pb::ProgressSample {
    pb::ProgressSample {
        job_id: job.to_string(),
        epoch: 1,
        unix_ms: converge_messenger::unix_ms(std::time::SystemTime::now()) + 100 * step as i64,
        step,
        total_steps: Some(100),
        metric: "loss".into(),
        value: Some(1.0 / (1 + step) as f64),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_draws_each_jobs_bar_state_worker_and_eta_and_exits_when_they_end() {
    let manager = TestManager::start(|_| {}).await.expect("manager");
    let m = manager.endpoint();
    let mut agent = ScriptedAgent::connect(&m, "w1", 2.0, Duration::from_millis(100))
        .await
        .expect("agent");
    let id = submit_and_start(&m, &mut agent, "top-job").await;

    // Not a terminal: plain frames, one line per job, read as they come.
    let (mut top, mut lines) = spawn_ctl(&m, &["top", "--job", &id, "--until-done"]);
    let mut until = async |what: &str, pred: &dyn Fn(&str) -> bool| -> String {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .expect("read")
                    .expect("top still runs");
                if pred(&line) {
                    return line;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no line with {what} within 10 s"))
    };
    let line = until("the running job", &|l| {
        l.contains("top-job") && l.contains("running")
    })
    .await;
    assert!(line.contains("w1"), "{line}");

    // Two reports, each after a heartbeat saying the job used one core: the manager's rate is
    // steps per core-second of the service it counted between them, so the second one comes
    // only once top has drawn the first (some time has passed, without sleeping).
    let report = |step: u64| {
        let (outbox, id) = (agent.outbox.clone(), id.clone());
        async move {
            outbox
                .send(Kind::Heartbeat(pb::Heartbeat {
                    jobs: vec![pb::JobStatus {
                        job_id: id.clone(),
                        epoch: 1,
                        cpu_usage: 1.0,
                        cpu_limit: Some(0.75),
                        state: pb::ContainerState::Running as i32,
                        ..Default::default()
                    }],
                    ..Default::default()
                }))
                .await;
            outbox
                .send(Kind::Progress(pb::ProgressBatch {
                    samples: vec![sample(&id, step)],
                    malformed: vec![],
                }))
                .await;
        }
    };
    report(10).await;
    until("step 10", &|l| l.contains("10/100")).await;
    report(50).await;
    let line = until("step 50", &|l| l.contains("50/100")).await;
    assert!(
        line.contains("[############............]  50% running"),
        "{line}"
    );
    assert!(
        !line.contains("eta -"),
        "an ETA once the rate is known: {line}"
    );
    assert!(line.contains("eta "), "{line}");
    assert!(
        line.contains("cpu 1.00/0.75"),
        "its use against its limit: {line}"
    );

    agent
        .outbox
        .send(Kind::Exited(pb::ContainerExited {
            job_id: id.clone(),
            epoch: 1,
            container_id: "ctr-top-job".into(),
            exit_code: 0,
            done: true,
            last_step: Some(100),
            ..Default::default()
        }))
        .await;
    let line = until("the completed job", &|l| l.contains("completed")).await;
    assert!(line.contains("100%") && line.contains("took "), "{line}");
    let status = tokio::time::timeout(Duration::from_secs(10), top.wait())
        .await
        .expect("top exits once its jobs ended")
        .expect("wait");
    assert_eq!(status.code(), Some(0));

    // A job that is not known: NotFound's exit code.
    let (code, _, err) = ctl(
        &m,
        &["top", "--job", "3f2b8a2e-8f1c-4c1e-9a43-2d1f0c9b7e11"],
    )
    .await;
    assert_eq!(code, 3, "{err}");
    manager.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_tells_the_cpu_weight_converge_gave_a_job_and_why() {
    let manager = TestManager::start(|c| c.policy = "converge".into())
        .await
        .expect("manager");
    let m = manager.endpoint();
    let mut agent = ScriptedAgent::connect(&m, "w1", 2.0, Duration::from_millis(100))
        .await
        .expect("agent");
    let id = submit_and_start(&m, &mut agent, "why-job").await;
    // Running, it gets its weight on the worker's next heartbeat: that command is the sign
    // the decision was made (and recorded before it was sent).
    let limits = next_command(&mut agent).await;
    let Some(pb::command::Action::SetLimits(set)) = limits.action else {
        panic!("a SetLimits after the start: {limits:?}");
    };

    let (code, out, err) = ctl(&m, &["why", &id]).await;
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("cpu weight"))
        .unwrap_or_else(|| panic!("no weight in: {out}"));
    assert!(
        line.contains(&format!("cpu weight {}", set.cpu_shares)),
        "{line}"
    );
    // Nothing tells its remaining work yet (no progress): a fair share, said so.
    assert!(
        line.contains("converge: nothing tells its predicted work left yet"),
        "{line}"
    );
    assert!(line.contains("cores=2.00"), "{line}");
    let (_, out, _) = ctl(&m, &["why", &id, "-o", "json"]).await;
    let why = json(&out);
    let kinds: Vec<&str> = why["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"limits"), "{kinds:?}");
    manager.stop().await;
}

/// The next request for job output the scripted agent gets, within 10 s.
async fn next_logs_request(agent: &mut ScriptedAgent) -> pb::LogsRequest {
    let control = tokio::time::timeout(Duration::from_secs(10), agent.logs.recv())
        .await
        .expect("a logs request within 10 s")
        .expect("the session is open");
    match control {
        LogsControl::Read(r) => r,
        other => panic!("a Read, not {other:?}"),
    }
}

fn log_line(text: &str, stderr: bool) -> pb::LogLine {
    pb::LogLine {
        data: text.as_bytes().to_vec(),
        stderr,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_prints_the_output_the_jobs_worker_sends_and_refuses_another_workers() {
    let metrics = converge_integration_tests::free_local_addr();
    let manager = TestManager::start(|c| c.metrics_listen = Some(metrics))
        .await
        .expect("manager");
    let m = manager.endpoint();
    let mut w1 = ScriptedAgent::connect(&m, "w1", 2.0, Duration::from_millis(100))
        .await
        .expect("agent");
    let id = submit_and_start(&m, &mut w1, "logs-job").await;
    // Another worker (smaller: a job of 2 cores can wait for w1), connected once the job is
    // placed on w1.
    let intruder = ScriptedAgent::connect(&m, "w2", 1.0, Duration::from_millis(100))
        .await
        .expect("agent");

    let reader = tokio::spawn({
        let (m, id) = (m.clone(), id.clone());
        async move { ctl(&m, &["logs", &id]).await }
    });
    let asked = next_logs_request(&mut w1).await;
    assert_eq!(
        (asked.job_id.as_str(), asked.epoch, asked.follow, asked.tail),
        (id.as_str(), 1, false, 0)
    );
    // w2 answers w1's request first: refused, counted, and not shown.
    intruder
        .outbox
        .send(Kind::Logs(pb::LogChunk {
            request_id: asked.request_id,
            lines: vec![log_line("forged by w2\n", false)],
            end: true,
            error: String::new(),
        }))
        .await;
    converge_integration_tests::eventually(
        Duration::from_secs(10),
        "the forged chunk to be counted",
        || async {
            let text = converge_integration_tests::scrape_metrics(metrics, false).await?;
            let refused = converge_integration_tests::metric_value(
                &text,
                "converge_manager_refused_total",
                r#"kind="foreign_job""#,
            );
            Ok((refused == Some(1.0)).then_some(()))
        },
    )
    .await
    .expect("the forged chunk was counted");
    // Then w1 sends the job's output: stdout and stderr, in two chunks.
    for (lines, end) in [
        (
            vec![
                log_line("step 1\n", false),
                log_line("warning: slow\n", true),
            ],
            false,
        ),
        (vec![log_line("step 2\n", false)], true),
    ] {
        w1.outbox
            .send(Kind::Logs(pb::LogChunk {
                request_id: asked.request_id,
                lines,
                end,
                error: String::new(),
            }))
            .await;
    }
    let (code, out, err) = reader.await.expect("reader");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "step 1\nstep 2\n", "stdout is the job's stdout");
    assert!(
        err.contains("warning: slow"),
        "stderr is the job's stderr: {err}"
    );
    assert!(!out.contains("forged") && !err.contains("forged"));

    // As JSON, the last lines of each incarnation; a part that cannot be read is said, and
    // the exit code tells a script so.
    let reader = tokio::spawn({
        let (m, id) = (m.clone(), id.clone());
        async move { ctl(&m, &["logs", &id, "--tail", "5", "-o", "json"]).await }
    });
    let asked = next_logs_request(&mut w1).await;
    assert_eq!(asked.tail, 5);
    w1.outbox
        .send(Kind::Logs(pb::LogChunk {
            request_id: asked.request_id,
            lines: vec![log_line("step 2\n", false)],
            end: true,
            error: "container ctr-logs-job is gone".into(),
        }))
        .await;
    let (code, out, _) = reader.await.expect("reader");
    assert_eq!(code, 1, "{out}");
    let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    assert_eq!(lines[0]["line"], "step 2");
    assert_eq!(lines[0]["stream"], "stdout");
    assert_eq!(
        (lines[0]["epoch"].as_u64(), lines[0]["worker"].as_str()),
        (Some(1), Some("w1"))
    );
    assert_eq!(lines[1]["unavailable"], "container ctr-logs-job is gone");

    // A job that never started has no output to show; ids that are no job are named.
    let (code, out, err) = ctl(&m, &["submit", "--image", "x", "--cpus", "2"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = ctl(&m, &["logs", out.trim()]).await;
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("never started") && err.contains("--follow"),
        "{err}"
    );
    let (code, _, err) = ctl(&m, &["logs", "not-a-uuid"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("no job has the id or name `not-a-uuid`"),
        "{err}"
    );
    let (code, _, err) = ctl(&m, &["logs", "6f1c1a52-3d2e-4b8a-9c1e-2f6d5e4c3b2a"]).await;
    assert_eq!(code, 3, "{err}");
    manager.stop().await;
}

/// Answers the manager's Read for `job`'s incarnation `epoch` on `agent` with `lines`, in one
/// chunk that ends it.
async fn answer_logs(agent: &mut ScriptedAgent, job: &str, epoch: u64, lines: &[&str]) {
    let asked = next_logs_request(agent).await;
    assert_eq!((asked.job_id.as_str(), asked.epoch), (job, epoch));
    agent
        .outbox
        .send(Kind::Logs(pb::LogChunk {
            request_id: asked.request_id,
            lines: lines.iter().map(|l| log_line(l, false)).collect(),
            end: true,
            error: String::new(),
        }))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_of_a_moved_job_show_each_incarnations_part_from_the_worker_that_ran_it() {
    let manager = TestManager::start(|_| {}).await.expect("manager");
    let m = manager.endpoint();
    let mut w1 = ScriptedAgent::connect(&m, "w1", 2.0, Duration::from_millis(100))
        .await
        .expect("agent");
    let id = submit_and_start(&m, &mut w1, "moved-job").await;
    let mut w2 = ScriptedAgent::connect(&m, "w2", 2.0, Duration::from_millis(100))
        .await
        .expect("agent");

    // Drained, w1 saves the job and w2 restores it: epoch 1 ran on w1, epoch 2 runs on w2.
    let mut control = manager.control().await.expect("control");
    control
        .drain_worker(pb::DrainWorkerRequest {
            worker_id: "w1".into(),
        })
        .await
        .expect("drain");
    let save = next_command(&mut w1).await;
    assert!(
        matches!(save.action, Some(pb::command::Action::Save(_))),
        "{save:?}"
    );
    w1.outbox
        .send(Kind::Result(pb::CommandResult {
            command_id: save.command_id,
            job_id: id.clone(),
            epoch: 1,
            ok: true,
            detail: Some(pb::command_result::Detail::Saved(pb::Saved {
                step: 40,
                checkpoint_bytes: 1000,
                save_ms: 5,
                killed: false,
                ..Default::default()
            })),
            ..Default::default()
        }))
        .await;
    let restore = next_command(&mut w2).await;
    assert!(
        matches!(restore.action, Some(pb::command::Action::Start(_))) && restore.epoch == 2,
        "{restore:?}"
    );
    w2.outbox
        .send(Kind::Result(pb::CommandResult {
            command_id: restore.command_id,
            job_id: id.clone(),
            epoch: 2,
            ok: true,
            detail: Some(pb::command_result::Detail::Started(pb::Started {
                container_id: "ctr-moved-job-2".into(),
                from_checkpoint: true,
            })),
            ..Default::default()
        }))
        .await;

    // As a table: each part on stdout in order, each headed on stderr by its epoch and
    // worker (the first too: the job ran more than once); each asked of the worker that ran it.
    let reader = tokio::spawn({
        let (m, id) = (m.clone(), id.clone());
        async move { ctl(&m, &["logs", &id]).await }
    });
    answer_logs(&mut w1, &id, 1, &["step 1\n", "saved at 40\n"]).await;
    answer_logs(&mut w2, &id, 2, &["restored at 40\n", "step 41\n"]).await;
    let (code, out, err) = reader.await.expect("reader");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "step 1\nsaved at 40\nrestored at 40\nstep 41\n");
    assert!(err.contains("── epoch 1 on w1 ──"), "{err}");
    assert!(err.contains("── epoch 2 on w2 ──"), "{err}");

    // As JSON: every line says which incarnation and worker it came from.
    let reader = tokio::spawn({
        let (m, id) = (m.clone(), id.clone());
        async move { ctl(&m, &["logs", &id, "-o", "json"]).await }
    });
    answer_logs(&mut w1, &id, 1, &["saved at 40\n"]).await;
    answer_logs(&mut w2, &id, 2, &["step 41\n"]).await;
    let (code, out, err) = reader.await.expect("reader");
    assert_eq!(code, 0, "{err}");
    let parts: Vec<(u64, String, String)> = out
        .lines()
        .map(json)
        .map(|l| {
            (
                l["epoch"].as_u64().unwrap(),
                l["worker"].as_str().unwrap().to_string(),
                l["line"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        parts,
        [
            (1, "w1".to_string(), "saved at 40".to_string()),
            (2, "w2".to_string(), "step 41".to_string())
        ]
    );
    manager.stop().await;
}

/// `backup` copies a running manager's store (which it holds exclusively: no other process can
/// read the file) into a file that a second manager starts from knowing every job. It never
/// overwrites a file, leaves nothing behind in the state directory, and says there is nothing
/// to copy when the manager keeps no state. The README used to advise `sqlite3 .backup`, which
/// a running manager refuses ("database is locked").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_copies_a_running_managers_state_and_a_new_manager_starts_from_it() {
    let dir = tempfile_dir("cli-backup").expect("dir");
    let (live, restored) = (dir.path().join("live"), dir.path().join("restored"));
    let state = live.clone();
    let manager = TestManager::start(move |c| c.state_dir = Some(state))
        .await
        .expect("manager");
    let m = manager.endpoint();
    let mut ids = Vec::new();
    for name in ["kept-pending", "kept-cancelled"] {
        let (code, out, err) = ctl(&m, &["submit", "--image", "x", "--name", name]).await;
        assert_eq!(code, 0, "{err}");
        ids.push(out.trim().to_string());
    }
    let (code, _, err) = ctl(&m, &["cancel", &ids[1]]).await;
    assert_eq!(code, 0, "{err}");

    std::fs::create_dir(&restored).expect("mkdir");
    let copy = restored.join("converge.db");
    let copy_arg = copy.to_str().expect("a UTF-8 path");
    let (code, out, err) = ctl(&m, &["backup", copy_arg, "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let bytes = json(&out)["bytes"].as_u64().expect("bytes");
    assert_eq!(std::fs::metadata(&copy).expect("the copy").len(), bytes);
    // It holds every job's environment: its owner's alone, as the state directory is.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("exists").permissions().mode();
    assert_eq!(mode(&copy) & 0o777, 0o600);
    assert_eq!(
        mode(&live) & 0o777,
        0o700,
        "the state directory the store made"
    );
    let (code, _, err) = ctl(&m, &["backup", copy_arg]).await;
    assert_ne!(code, 0, "a second backup overwrote the first");
    assert!(err.contains("exists"), "{err}");
    let mut left: Vec<String> = std::fs::read_dir(&live)
        .expect("the state directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("converge.db-")) // SQLite's own -wal
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["converge.db"],
        "the copy was left in the state directory"
    );

    // A second manager, while the first still runs, starts from the copy.
    let from_copy = TestManager::start(move |c| c.state_dir = Some(restored))
        .await
        .expect("a manager on the copy");
    let (code, out, err) = ctl(&from_copy.endpoint(), &["list", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let jobs = json(&out);
    let got: Vec<(&str, &str)> = jobs
        .as_array()
        .expect("a list")
        .iter()
        .map(|j| (j["id"].as_str().unwrap(), j["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [(ids[0].as_str(), "pending"), (ids[1].as_str(), "cancelled")]
    );
    from_copy.stop().await;
    manager.stop().await;

    let stateless = TestManager::start(|c| c.state_dir = None)
        .await
        .expect("manager");
    let out = dir.path().join("nothing.db");
    let (code, _, err) = ctl(&stateless.endpoint(), &["backup", out.to_str().unwrap()]).await;
    assert_ne!(code, 0);
    assert!(err.contains("nothing to back up"), "{err}");
    assert!(!out.exists() && !dir.path().join("nothing.db.part").exists());
    stateless.stop().await;
}

/// Connection settings that cannot work are answered with what to change: TLS on one side
/// only, a CA file that is not PEM, a CA that did not sign the manager's certificate (the
/// errors of the layers below name none of these); a host the certificate does not name is
/// said well enough by rustls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_settings_that_cannot_work_name_the_fix() {
    use converge_messenger::tls::{self, TlsFiles};
    let certs = tempfile_dir("cli-tls").expect("dir");
    tls::generate(certs.path(), &["localhost".into()], &["w1".into()]).expect("certs");
    let secure = TestManager::start(|c| c.tls = Some(TlsFiles::manager(certs.path())))
        .await
        .expect("manager");
    let plain = TestManager::start(|_| {}).await.expect("manager");
    let ca = certs.path().join(tls::files::CA).display().to_string();
    let port = secure.addr.port();

    let (code, _, err) = ctl(&format!("http://{}", secure.addr), &["list"]).await;
    assert_eq!(code, 1, "{err}");
    // The fix first: the HTTP/2 error after it names nothing a user set.
    assert!(
        (err.lines().next().unwrap_or_default())
            .contains(&format!("use --manager https://{}", secure.addr)),
        "{err}"
    );
    // What failed after it, said as what the connection showed, not as a second error.
    assert!(
        (err.lines().nth(1).unwrap_or_default())
            .starts_with("convergectl: (the connection failed with: "),
        "{err}"
    );
    let (code, _, err) = ctl(&format!("https://{}", plain.addr), &["--ca", &ca, "list"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "does not speak TLS: use --manager http://{}",
            plain.addr
        )),
        "{err}"
    );
    let not_pem = certs.path().join("not-pem");
    std::fs::write(&not_pem, "not a certificate\n").expect("write");
    let https = format!("https://localhost:{port}");
    let (code, _, err) = ctl(&https, &["--ca", &not_pem.display().to_string(), "list"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--ca"), "{err}");
    assert!(
        err.contains(&format!("{}: holds no PEM certificate", not_pem.display())),
        "{err}"
    );
    let (w1, _) = tls::files::worker("w1");
    let not_ca = certs.path().join(w1).display().to_string();
    let (code, _, err) = ctl(&https, &["--ca", &not_ca, "list"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not signed by the --ca file"), "{err}");
    let (code, _, err) = ctl(&format!("https://127.0.0.1:{port}"), &["--ca", &ca, "list"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("not valid for name") && err.contains("localhost"),
        "{err}"
    );
    // And with every setting right, the same files work.
    let (code, _, err) = ctl(&https, &["--ca", &ca, "list"]).await;
    assert_eq!(code, 0, "{err}");
    // A variable set to nothing is unset, as a shell means `CONVERGE_CA= convergectl list`:
    // clap took it for `--ca` given no value, and refused.
    let empty = [("CONVERGE_CA", "")];
    let (code, _, err) = ctl_env(&format!("http://{}", plain.addr), &["list"], &empty).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = ctl_env(&https, &["list"], &empty).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("needs --ca (or CONVERGE_CA)"), "{err}");
    secure.stop().await;
    plain.stop().await;
}

/// `top --until-done` with nothing to wait for ends at once, and a reader that goes away
/// (`convergectl top | head -1`) ends `top` with the shell's code for a closed pipe, not a
/// panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_ends_when_nothing_is_left_to_watch_or_no_one_reads() {
    let manager = TestManager::start(|_| {}).await.expect("manager");
    let m = manager.endpoint();
    // Bounded only so that the old behaviour (waiting forever) fails rather than hangs.
    let (code, _, err) =
        tokio::time::timeout(Duration::from_secs(60), ctl(&m, &["top", "--until-done"]))
            .await
            .expect("top --until-done with no job ends");
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("no job to wait for"), "{err}");

    let (code, _, err) = ctl(
        &m,
        &["submit", "--image", "converge/trainer:dev", "--cpus", "0.5"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let (mut child, mut lines) = spawn_ctl(&m, &["top"]);
    lines
        .next_line()
        .await
        .expect("read")
        .expect("a first line");
    drop(lines);
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("top ends once no one reads")
        .expect("top's status");
    assert_eq!(status.code(), Some(141), "{status:?}");

    // No worker: the job never ran. Cancelled, its logs say so rather than look for output.
    let (_, out, _) = ctl(&m, &["list", "-o", "json"]).await;
    let id = json(&out)[0]["id"].as_str().expect("id").to_string();
    let (code, _, err) = ctl(&m, &["cancel", &id]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = ctl(&m, &["logs", &id]).await;
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert!(err.contains("never ran (cancelled by user)"), "{err}");
    manager.stop().await;
}
