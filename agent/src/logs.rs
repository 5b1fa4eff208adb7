//! Job output for `convergectl logs`. The manager asks for one incarnation's output with a
//! `LogsRequest`; a reader task sends it from Docker as `LogChunk`s on the agent's stream,
//! following the container until it exits when asked to, and ends with a chunk marked `end`
//! (carrying why, when the output could not be read).
//!
//! The agent removes a job's container once its exit is reported, and Docker's log goes with
//! it. So that the output of a finished or migrated incarnation can still be read, [`Kept`]
//! holds the last [`KEPT_LINES`] lines (at most [`KEPT_BYTES`]) of each container the agent
//! removes, for the newest [`KEPT_CONTAINERS`] of them. They live in memory: an agent restart
//! forgets them (the manager's reader is then told the output is gone).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::LogsOptionsBuilder;
use converge_messenger::agent::{LogsControl, Outbox};
use converge_messenger::pb::{self, agent_message::Kind};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug};

use crate::docker;

/// Lines kept of each removed container: what `convergectl logs` can show of it later.
pub const KEPT_LINES: usize = 1000;
/// Bytes kept of each removed container, at most (its newest lines win).
pub const KEPT_BYTES: usize = 256 * 1024;
/// Removed containers whose last lines are kept (the oldest go first): with the byte bound,
/// at most 16 MiB.
pub const KEPT_CONTAINERS: usize = 64;

/// Lines per chunk at most: a chunk is one message on the stream heartbeats share.
const CHUNK_LINES: usize = 256;
/// Bytes per chunk at most (well under gRPC's 4 MiB message limit).
const CHUNK_BYTES: usize = 64 * 1024;

/// What was kept of one removed container: its name and its last lines.
type KeptOutput = (String, Arc<[pb::LogLine]>);

/// The last lines of the containers this agent removed, by container name, oldest first.
#[derive(Clone, Debug, Default)]
pub struct Kept(Arc<Mutex<VecDeque<KeptOutput>>>);

impl Kept {
    /// Keeps `lines`, the [`last_output`] of container `name`, read just before removing it.
    pub fn keep(&self, name: &str, mut lines: Vec<pb::LogLine>) {
        // The newest lines that fit in the byte bound.
        let mut bytes = 0;
        let first = lines
            .iter()
            .rposition(|l| {
                bytes += l.data.len();
                bytes > KEPT_BYTES
            })
            .map_or(0, |i| i + 1);
        lines.drain(..first);
        let mut kept = self.0.lock().expect("kept logs lock");
        kept.retain(|(n, _)| n != name);
        kept.push_back((name.to_string(), lines.into()));
        while kept.len() > KEPT_CONTAINERS {
            kept.pop_front();
        }
    }

    fn get(&self, name: &str) -> Option<Arc<[pb::LogLine]>> {
        let kept = self.0.lock().expect("kept logs lock");
        kept.iter()
            .find(|(n, _)| n == name)
            .map(|(_, lines)| lines.clone())
    }
}

/// The last [`KEPT_LINES`] writes of container `id` (name or id), stdout and stderr in order;
/// what Docker could not give is left out.
pub async fn last_output(docker: &Docker, id: &str) -> Vec<pb::LogLine> {
    let opts = LogsOptionsBuilder::new()
        .stdout(true)
        .stderr(true)
        .follow(false)
        .tail(&KEPT_LINES.to_string())
        .build();
    docker
        .logs(id, Some(opts))
        .filter_map(|r| async move { r.ok().map(line) })
        .collect()
        .await
}

fn line(output: LogOutput) -> pb::LogLine {
    match output {
        LogOutput::StdErr { message } => pb::LogLine {
            data: message.to_vec(),
            stderr: true,
        },
        other => pb::LogLine {
            data: other.into_bytes().to_vec(),
            stderr: false,
        },
    }
}

/// Serves the manager's requests from `requests` until `shutdown`: one reader task per request,
/// aborted when the manager cancels it or the stream it came on ends.
pub fn spawn(
    docker: Docker,
    worker: String,
    kept: Kept,
    outbox: Outbox,
    mut requests: mpsc::Receiver<LogsControl>,
    shutdown: CancellationToken,
) {
    tokio::spawn(
        async move {
            let mut readers: HashMap<u64, AbortHandle> = HashMap::new();
            loop {
                let control = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    c = requests.recv() => match c {
                        Some(c) => c,
                        None => break,
                    },
                };
                readers.retain(|_, h| !h.is_finished());
                match control {
                    LogsControl::Read(request) => {
                        let id = request.request_id;
                        let name = docker::container_name(&worker, &request.job_id, request.epoch);
                        let reader = Reader {
                            docker: docker.clone(),
                            kept: kept.clone(),
                            outbox: outbox.clone(),
                            worker: worker.clone(),
                        };
                        let task = tokio::spawn(reader.serve(name, request).in_current_span());
                        if let Some(old) = readers.insert(id, task.abort_handle()) {
                            old.abort();
                        }
                    }
                    LogsControl::Cancel(id) => {
                        if let Some(h) = readers.remove(&id) {
                            h.abort();
                        }
                    }
                    LogsControl::StreamEnded => {
                        for (_, h) in readers.drain() {
                            h.abort();
                        }
                    }
                }
            }
            for h in readers.values() {
                h.abort();
            }
        }
        .in_current_span(),
    );
}

/// What one request's reader needs.
struct Reader {
    docker: Docker,
    kept: Kept,
    outbox: Outbox,
    worker: String,
}

impl Reader {
    async fn serve(self, name: String, request: pb::LogsRequest) {
        let id = request.request_id;
        let error = self
            .send_output(&name, &request)
            .await
            .err()
            .unwrap_or_default();
        debug!(request = id, container = %name, %error, "job output sent");
        self.outbox
            .send(Kind::Logs(pb::LogChunk {
                request_id: id,
                end: true,
                error,
                ..Default::default()
            }))
            .await;
    }

    /// Sends the container's output (or what was kept of it) in chunks; `Err` says why it
    /// could not, or not all of it.
    async fn send_output(&self, name: &str, request: &pb::LogsRequest) -> Result<(), String> {
        let tail = match request.tail {
            0 => "all".to_string(),
            n => n.to_string(),
        };
        let opts = LogsOptionsBuilder::new()
            .stdout(true)
            .stderr(true)
            .follow(request.follow)
            .tail(&tail)
            .build();
        let mut output = self.docker.logs(name, Some(opts)).ready_chunks(CHUNK_LINES);
        let mut first = true;
        while let Some(batch) = output.next().await {
            let mut lines = Vec::with_capacity(batch.len());
            let mut failed = None;
            for item in batch {
                match item {
                    Ok(o) => lines.push(line(o)),
                    Err(e) if first && docker::is_not_found(&e) => {
                        return self.send_kept(name, request).await;
                    }
                    Err(e) => {
                        failed = Some(docker::describe(&e));
                        break;
                    }
                }
                first = false;
            }
            self.send_lines(request.request_id, lines).await;
            if let Some(why) = failed {
                return Err(format!("reading the output of {name} failed: {why}"));
            }
        }
        Ok(())
    }

    /// The last lines kept of a removed container.
    async fn send_kept(&self, name: &str, request: &pb::LogsRequest) -> Result<(), String> {
        let Some(lines) = self.kept.get(name) else {
            return Err(format!(
                "container {name} is gone from worker {} and the agent kept none of its output \
                 (it keeps the last {KEPT_LINES} lines of the last {KEPT_CONTAINERS} containers \
                 it removed, until it restarts)",
                self.worker
            ));
        };
        let skip = match request.tail as usize {
            0 => 0,
            n => lines.len().saturating_sub(n),
        };
        self.send_lines(request.request_id, lines[skip..].to_vec())
            .await;
        Ok(())
    }

    /// Sends `lines` in chunks of at most [`CHUNK_BYTES`] (a longer single line goes alone).
    async fn send_lines(&self, request_id: u64, lines: Vec<pb::LogLine>) {
        let mut chunk = Vec::new();
        let mut bytes = 0;
        for l in lines {
            if bytes + l.data.len() > CHUNK_BYTES && !chunk.is_empty() {
                self.send_chunk(request_id, std::mem::take(&mut chunk))
                    .await;
                bytes = 0;
            }
            bytes += l.data.len();
            chunk.push(l);
        }
        if !chunk.is_empty() {
            self.send_chunk(request_id, chunk).await;
        }
    }

    async fn send_chunk(&self, request_id: u64, lines: Vec<pb::LogLine>) {
        self.outbox
            .send(Kind::Logs(pb::LogChunk {
                request_id,
                lines,
                ..Default::default()
            }))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> pb::LogLine {
        pb::LogLine {
            data: s.as_bytes().to_vec(),
            stderr: false,
        }
    }

    #[test]
    fn kept_output_is_found_by_name_and_the_oldest_container_goes_first() {
        let kept = Kept::default();
        for i in 0..=KEPT_CONTAINERS {
            kept.keep(&format!("c{i}"), vec![l(&format!("line of c{i}\n"))]);
        }
        assert!(
            kept.get("c0").is_none(),
            "the oldest beyond the bound is forgotten"
        );
        assert_eq!(kept.get("c1").unwrap()[0].data, b"line of c1\n");
        // Keeping a container again replaces what was kept of it, not a second copy.
        kept.keep("c1", vec![l("again\n")]);
        assert_eq!(kept.get("c1").unwrap().len(), 1);
        assert_eq!(kept.0.lock().unwrap().len(), KEPT_CONTAINERS);
        // A chatty container keeps its newest lines, within the byte bound.
        let big = "x".repeat(1023) + "\n";
        let lines: Vec<_> = (0..300).map(|i| l(&format!("{i:04}{big}"))).collect();
        kept.keep("chatty", lines);
        let got = kept.get("chatty").unwrap();
        let bytes: usize = got.iter().map(|l| l.data.len()).sum();
        assert!(bytes <= KEPT_BYTES && bytes + 1028 > KEPT_BYTES, "{bytes}");
        assert!(got.last().unwrap().data.starts_with(b"0299"));
    }
}
