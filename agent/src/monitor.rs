//! Watching containers: a log follower per container, one progress batcher and one usage
//! sampler per agent.
//!
//! - A **log follower** streams a container's stdout through bollard, reads each line with
//!   [`converge_contract::parse_line`] (the job's metric as the expected one), records the last
//!   step in the per-container views and hands samples and malformed-line counts to the batcher.
//! - The **progress batcher** turns samples into `ProgressBatch`es: flushed every 250 ms or at
//!   64 samples, whichever comes first, sent with `Outbox::try_send` (a newer batch supersedes a
//!   dropped one). Before an exit is reported its container's last samples are flushed, so the
//!   manager sees the `done` line before the exit.
//! - The **usage sampler** reads every container's cumulative CPU time and memory each
//!   `--usage-interval`, turns CPU time into average cores, writes both into the views and sends
//!   a `UsageBatch`.
//!
//! ## Where usage is read from, and why
//! Both sources were measured on this machine (Docker 20.10, cgroup v1, a running trainer
//! container; `cargo test -p converge-agent --test usage_cost -- --ignored --nocapture`):
//!
//! | source | cost per container sample |
//! |---|---|
//! | cgroup files (`cpuacct.usage` + `memory.usage_in_bytes`) | ~15 µs |
//! | Docker stats API, one-shot (`stream=false, one-shot=true`) | ~2-4 ms (over 100× more) |
//!
//! The stats API makes the engine walk the same cgroup files, serialize a large JSON document
//! (per-CPU counters, blkio, network) and send it over the socket; reading the two counters
//! directly skips all of it. Cgroup files are therefore the default (`--usage-source auto`);
//! the stats API is the fallback when the container's cgroup is not readable (an agent in a
//! container without the host's cgroup filesystem mounted). Memory is the raw
//! `memory.usage_in_bytes` / `memory.current` (page cache included), which is what the
//! kernel's limit counts against.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{LogsOptionsBuilder, StatsOptionsBuilder};
use converge_contract::{CheckpointEvent, ProgressLine, parse_line};
use converge_messenger::agent::Outbox;
use converge_messenger::pb;
use converge_messenger::pb::agent_message::Kind;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::cgroup::WorkerCgroup;
use crate::config::UsageSource;
use crate::docker;
use crate::view::Views;

/// Most samples per progress batch.
pub const MAX_BATCH_SAMPLES: usize = 64;
/// Longest a sample waits in the batcher.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(250);

/// Accumulates progress samples and malformed-line counts into batches.
#[derive(Debug, Default)]
pub struct ProgressBatcher {
    samples: Vec<pb::ProgressSample>,
    malformed: HashMap<(String, u64), (u64, String)>,
}

impl ProgressBatcher {
    /// Adds a sample; returns a full batch when it reaches [`MAX_BATCH_SAMPLES`].
    pub fn push(&mut self, sample: pb::ProgressSample) -> Option<pb::ProgressBatch> {
        self.samples.push(sample);
        (self.samples.len() >= MAX_BATCH_SAMPLES)
            .then(|| self.take())
            .flatten()
    }

    /// Counts a malformed line of a job's incarnation.
    pub fn malformed(&mut self, job_id: &str, epoch: u64, error: String) {
        let e = self
            .malformed
            .entry((job_id.to_string(), epoch))
            .or_insert((0, String::new()));
        e.0 += 1;
        e.1 = error;
    }

    /// Everything pending as one batch, or `None` when nothing is.
    pub fn take(&mut self) -> Option<pb::ProgressBatch> {
        if self.samples.is_empty() && self.malformed.is_empty() {
            return None;
        }
        let mut malformed: Vec<pb::MalformedLines> = self
            .malformed
            .drain()
            .map(
                |((job_id, epoch), (count, last_error))| pb::MalformedLines {
                    job_id,
                    epoch,
                    count,
                    last_error,
                },
            )
            .collect();
        malformed.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        Some(pb::ProgressBatch {
            samples: std::mem::take(&mut self.samples),
            malformed,
        })
    }
}

/// What log followers tell the batcher.
#[derive(Debug)]
pub(crate) enum ProgressEvent {
    Sample(pb::ProgressSample),
    Malformed {
        job_id: String,
        epoch: u64,
        error: String,
    },
    /// Send everything pending now; answer when queued on the outbox.
    Flush(oneshot::Sender<()>),
}

/// Handle of the progress batcher task.
#[derive(Clone, Debug)]
pub(crate) struct ProgressHandle {
    tx: mpsc::Sender<ProgressEvent>,
    metrics: crate::metrics::AgentMetrics,
}

impl ProgressHandle {
    /// Flushes pending samples to the outbox (returns at once if the batcher is gone).
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(ProgressEvent::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// Starts the progress batcher.
pub(crate) fn spawn_batcher(
    outbox: Outbox,
    metrics: crate::metrics::AgentMetrics,
    shutdown: CancellationToken,
) -> ProgressHandle {
    let (tx, mut rx) = mpsc::channel::<ProgressEvent>(1024);
    tokio::spawn(
        async move {
            let mut b = ProgressBatcher::default();
            let mut tick = tokio::time::interval(FLUSH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let send = |batch: pb::ProgressBatch| {
                if !outbox.try_send(Kind::Progress(batch)) {
                    debug!("progress batch dropped: outbox full");
                }
            };
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => {
                        if let Some(batch) = b.take() { send(batch) }
                    }
                    ev = rx.recv() => match ev {
                        None => break,
                        Some(ProgressEvent::Sample(s)) => {
                            if let Some(batch) = b.push(s) { send(batch) }
                        }
                        Some(ProgressEvent::Malformed { job_id, epoch, error }) => {
                            b.malformed(&job_id, epoch, error);
                        }
                        Some(ProgressEvent::Flush(done)) => {
                            if let Some(batch) = b.take() { send(batch) }
                            let _ = done.send(());
                        }
                    },
                }
            }
            if let Some(batch) = b.take() {
                send(batch);
            }
        }
        .in_current_span(),
    );
    ProgressHandle { tx, metrics }
}

/// What a log follower needs to know about its container.
#[derive(Clone, Debug)]
pub(crate) struct FollowSpec {
    pub container_id: String,
    pub job_id: String,
    pub epoch: u64,
    pub metric: Option<String>,
    /// For an adopted container: lines logged at or before this instant (Unix ns) were seen by
    /// a previous agent; they update the last step but are not sent again.
    pub history_until_ns: Option<i128>,
    /// For an adopted container: how many old lines to read (`None` = the whole log).
    pub tail: Option<u32>,
}

/// Starts following a container's stdout. The returned receiver turns `true` when the log
/// stream has ended (the container exited and every line was read) or the agent shuts down.
pub(crate) fn spawn_follower(
    docker: Docker,
    spec: FollowSpec,
    views: Views,
    progress: ProgressHandle,
    shutdown: CancellationToken,
) -> watch::Receiver<bool> {
    let (done_tx, done_rx) = watch::channel(false);
    let span = tracing::info_span!("follow", job = %spec.job_id, epoch = spec.epoch);
    tokio::spawn(
        async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = follow(&docker, &spec, &views, &progress) => {}
            }
            let _ = done_tx.send(true);
        }
        .instrument(span),
    );
    done_rx
}

async fn follow(docker: &Docker, spec: &FollowSpec, views: &Views, progress: &ProgressHandle) {
    let mut spec = spec.clone();
    // Unix ns of the newest line read, to resume after a broken stream without resending.
    let mut last_ts: Option<i128> = None;
    loop {
        let mut opts = LogsOptionsBuilder::new()
            .follow(true)
            .stdout(true)
            .stderr(false)
            .timestamps(true);
        if let Some(t) = spec.tail {
            opts = opts.tail(&t.to_string());
        }
        if let Some(ts) = last_ts {
            opts = opts.since((ts / 1_000_000_000).clamp(0, i32::MAX as i128) as i32);
        }
        let mut stream = docker.logs(&spec.container_id, Some(opts.build()));
        let mut buf: Vec<u8> = Vec::new();
        let mut failed = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                    buf.extend_from_slice(&message);
                    while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=pos).collect();
                        let ts =
                            handle_line(&String::from_utf8_lossy(&line), &spec, views, progress)
                                .await;
                        last_ts = ts.or(last_ts);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if !buf.is_empty() {
            let ts = handle_line(&String::from_utf8_lossy(&buf), &spec, views, progress).await;
            last_ts = ts.or(last_ts);
        }
        // The stream ends when the container stops; if it is still running, the stream broke
        // (e.g. the engine restarted): follow again from the last line read.
        let running = docker
            .inspect_container(&spec.container_id, None)
            .await
            .ok()
            .and_then(|i| i.state)
            .and_then(|s| s.running)
            .unwrap_or(false);
        if !running {
            debug!("log stream ended");
            return;
        }
        warn!(error = ?failed.map(|e| e.to_string()), "log stream broke while the container runs; following again");
        spec.tail = None;
        spec.history_until_ns = last_ts.or(spec.history_until_ns);
        // Short: the usual cause is the engine updating the state a moment after the stream.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Reads one log line; returns its Docker timestamp (Unix ns) when it has one.
async fn handle_line(
    raw: &str,
    spec: &FollowSpec,
    views: &Views,
    progress: &ProgressHandle,
) -> Option<i128> {
    let raw = raw.trim_end_matches(['\n', '\r']);
    // Timestamps are on (to tell history from new lines); Docker puts one and a space first.
    let (ts, line) = match raw.split_once(' ') {
        Some((ts, line)) => match docker::parse_timestamp_ns(ts) {
            Some(t) => (Some(t), line),
            None => (None, raw),
        },
        None => (None, raw),
    };
    let history = match (spec.history_until_ns, ts) {
        (Some(cut), Some(t)) => t <= cut,
        _ => false,
    };
    match parse_line(line, spec.metric.as_deref()) {
        Ok(None) => {}
        Ok(Some(p)) => {
            if let Some(mut v) = views.get_mut(&spec.container_id) {
                v.last_step = Some(p.step);
                if p.value.is_some() {
                    v.last_value = p.value;
                    v.last_value_at = Some(Instant::now());
                    v.first_value = v.first_value.or(p.value);
                }
                if p.direction.is_some() {
                    v.direction = p.direction;
                }
                v.done |= p.done;
                if p.checkpoint == Some(CheckpointEvent::Saved) {
                    v.checkpoint_bytes = p.checkpoint_bytes.or(v.checkpoint_bytes);
                }
            }
            if !history {
                progress.metrics.progress_line(true);
                let sample = to_sample(&spec.job_id, spec.epoch, spec.metric.as_deref(), p);
                let _ = progress.tx.send(ProgressEvent::Sample(sample)).await;
            }
        }
        Err(e) => {
            if !history {
                progress.metrics.progress_line(false);
                debug!(error = %e, "malformed progress line");
                let _ = progress
                    .tx
                    .send(ProgressEvent::Malformed {
                        job_id: spec.job_id.clone(),
                        epoch: spec.epoch,
                        error: e.to_string(),
                    })
                    .await;
            }
        }
    }
    ts
}

/// A parsed progress line as a wire sample.
pub fn to_sample(
    job_id: &str,
    epoch: u64,
    expected_metric: Option<&str>,
    p: ProgressLine,
) -> pb::ProgressSample {
    pb::ProgressSample {
        job_id: job_id.to_string(),
        epoch,
        unix_ms: converge_messenger::unix_ms(SystemTime::now()),
        step: p.step,
        total_steps: p.total_steps,
        metric: p
            .metric
            .or_else(|| expected_metric.map(str::to_string))
            .unwrap_or_default(),
        value: p.value,
        elapsed_s: p.elapsed_s,
        done: p.done,
        checkpoint: match p.checkpoint {
            None => pb::CheckpointEvent::None,
            Some(CheckpointEvent::Saved) => pb::CheckpointEvent::Saved,
            Some(CheckpointEvent::Restored) => pb::CheckpointEvent::Restored,
        } as i32,
        checkpoint_bytes: p.checkpoint_bytes,
    }
}

/// Reads a container's (cumulative CPU ns, memory bytes) through the Docker stats API.
pub async fn stats_usage(docker: &Docker, container_id: &str) -> Result<(u64, u64), String> {
    let opts = StatsOptionsBuilder::new()
        .stream(false)
        .one_shot(true)
        .build();
    let mut s = docker.stats(container_id, Some(opts));
    match s.next().await {
        Some(Ok(r)) => {
            let cpu = r
                .cpu_stats
                .and_then(|c| c.cpu_usage)
                .and_then(|u| u.total_usage)
                .ok_or("stats have no cpu_usage.total_usage")?;
            let mem = r.memory_stats.and_then(|m| m.usage).unwrap_or(0);
            Ok((cpu, mem))
        }
        Some(Err(e)) => Err(docker::describe(&e)),
        None => Err("stats stream ended without a sample".into()),
    }
}

/// Starts the usage sampler.
pub(crate) fn spawn_usage_sampler(
    docker: Docker,
    cgroup: Arc<WorkerCgroup>,
    source: UsageSource,
    interval: Duration,
    views: Views,
    outbox: Outbox,
    shutdown: CancellationToken,
) {
    tokio::spawn(
        async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut prev: HashMap<String, (u64, Instant)> = HashMap::new();
            let mut fell_back: HashMap<String, ()> = HashMap::new();
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let targets: Vec<(String, String, u64)> = views
                    .iter()
                    .filter(|v| {
                        matches!(
                            v.state,
                            pb::ContainerState::Running | pb::ContainerState::Paused
                        )
                    })
                    .map(|v| (v.container_id.clone(), v.job_id.clone(), v.epoch))
                    .collect();
                prev.retain(|id, _| targets.iter().any(|t| &t.0 == id));
                // Stats API calls take about a second each (see the module doc): issue them
                // concurrently so one round costs one second, not one per container.
                let reads = futures::future::join_all(targets.iter().map(|(id, _, _)| {
                    let docker = &docker;
                    let cgroup = &cgroup;
                    async move {
                        // (cpu ns, memory bytes, read through the stats API as a fallback)
                        match source {
                            UsageSource::Stats => stats_usage(docker, id).await.map(|(c, m)| (c, m, false)),
                            UsageSource::Cgroup => cgroup
                                .container_usage_paths(id)
                                .read()
                                .map(|(c, m)| (c, m, false))
                                .map_err(|e| format!("cgroup: {e}")),
                            UsageSource::Auto => match cgroup.container_usage_paths(id).read() {
                                Ok((c, m)) => Ok((c, m, false)),
                                Err(e) => stats_usage(docker, id)
                                    .await
                                    .map(|(c, m)| (c, m, true))
                                    .map_err(|s| format!("cgroup: {e}; stats: {s}")),
                            },
                        }
                    }
                }))
                .await;
                let mut samples = Vec::with_capacity(targets.len());
                for ((id, job_id, epoch), read) in targets.into_iter().zip(reads) {
                    let (cpu_ns, mem) = match read {
                        Ok((cpu, mem, fallback)) => {
                            if fallback && fell_back.insert(id.clone(), ()).is_none() {
                                info!(container = %id, "cgroup usage not readable; using the Docker stats API");
                            }
                            (cpu, mem)
                        }
                        // The container may have exited between the listing and the read.
                        Err(e) => {
                            debug!(container = %id, error = %e, "usage read failed");
                            continue;
                        }
                    };
                    let now = Instant::now();
                    let cores = match prev.insert(id.clone(), (cpu_ns, now)) {
                        Some((p_ns, p_t)) if cpu_ns >= p_ns && now > p_t => {
                            (cpu_ns - p_ns) as f64 / now.duration_since(p_t).as_nanos() as f64
                        }
                        _ => 0.0,
                    };
                    if let Some(mut v) = views.get_mut(&id) {
                        v.cpu_cores = cores;
                        v.cpu_total_ns = cpu_ns;
                        v.memory_bytes = mem;
                    }
                    samples.push(pb::UsageSample {
                        job_id,
                        epoch,
                        unix_ms: converge_messenger::unix_ms(SystemTime::now()),
                        cpu_total_ns: cpu_ns,
                        cpu_cores: cores,
                        memory_bytes: mem,
                    });
                }
                if !samples.is_empty() && !outbox.try_send(Kind::Usage(pb::UsageBatch { samples })) {
                    debug!("usage batch dropped: outbox full");
                }
            }
        }
        .in_current_span(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(step: u64) -> pb::ProgressSample {
        pb::ProgressSample {
            job_id: "j".into(),
            epoch: 1,
            step,
            ..Default::default()
        }
    }

    #[test]
    fn a_full_batch_is_released_at_64_samples() {
        let mut b = ProgressBatcher::default();
        for i in 0..63 {
            assert!(b.push(sample(i)).is_none());
        }
        let batch = b.push(sample(63)).expect("full");
        assert_eq!(batch.samples.len(), 64);
        assert_eq!(batch.samples[0].step, 0);
        assert!(b.take().is_none(), "nothing left after a full batch");
    }

    #[test]
    fn malformed_lines_are_counted_per_incarnation() {
        let mut b = ProgressBatcher::default();
        b.malformed("j", 1, "bad one".into());
        b.malformed("j", 1, "bad two".into());
        b.malformed("k", 2, "other".into());
        b.push(sample(5));
        let batch = b.take().unwrap();
        assert_eq!(batch.samples.len(), 1);
        assert_eq!(batch.malformed.len(), 2);
        assert_eq!(batch.malformed[0].job_id, "j");
        assert_eq!(batch.malformed[0].count, 2);
        assert_eq!(batch.malformed[0].last_error, "bad two");
        assert!(b.take().is_none());
    }

    #[test]
    fn samples_carry_the_expected_metric_when_the_line_has_none() {
        let p = parse_line(r#"CONVERGE_PROGRESS {"step":3,"done":true}"#, Some("loss"))
            .unwrap()
            .unwrap();
        let s = to_sample("j", 2, Some("loss"), p);
        assert_eq!(s.metric, "loss");
        assert!(s.done);
        assert_eq!(s.step, 3);
        assert_eq!(s.epoch, 2);
    }
}
