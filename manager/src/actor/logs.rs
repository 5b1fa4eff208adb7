//! `JobLogs`: a job's output, read through the agents of the workers it ran on.
//!
//! A reader (one `JobLogs` call) walks the job's incarnations in epoch order. For each, the
//! actor sends a `LogsRequest` to the agent of the incarnation's worker and forwards that
//! agent's `LogChunk`s to the reader until one is marked `end`; then it goes on to the next
//! incarnation. A following reader waits for the next incarnation (a migration's restore, a
//! restart) until the job ends. An incarnation whose output cannot be read (its worker is
//! gone, its container removed and forgotten) is named with why, not silently skipped.
//!
//! Nothing here decides anything about the job, so none of it goes through the core. The
//! actor never waits on a reader: one whose buffer is full is ended (it reads more slowly than
//! the job writes) and its agent told to stop. Chunks are taken only from the worker they were
//! asked of (agents may speak only of their own worker's jobs): another's are refused and
//! counted.

use std::collections::HashMap;

use converge_core::cluster::Refusal;
use converge_core::cluster::lifecycle::Incarnation;
use converge_core::cluster::types::{JobId, WorkerId};
use converge_messenger::manager::ConnectionId;
use converge_messenger::pb::{self, manager_message::Kind as ManagerKind};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tonic::Status;
use tracing::{debug, warn};

use super::Actor;
use crate::error::{Error, Result};

/// Responses that may wait for a slow reader before it is cut off.
const READER_BUFFER: usize = 256;

/// What a `JobLogs` caller receives.
pub type LogStream = mpsc::Receiver<std::result::Result<pb::JobLogsResponse, Status>>;

/// Every open reader.
#[derive(Default)]
pub struct Readers {
    next_id: u64,
    readers: HashMap<u64, Reader>,
    /// Request in flight → its reader.
    asked: HashMap<u64, u64>,
}

/// One `JobLogs` call.
struct Reader {
    job: JobId,
    follow: bool,
    tail: u32,
    /// The job's incarnations as last seen (kept for a job that leaves memory meanwhile).
    incarnations: Vec<Incarnation>,
    /// Incarnations below this epoch are done.
    next_epoch: u64,
    /// The request in flight, if any.
    asking: Option<Asking>,
    tx: mpsc::Sender<std::result::Result<pb::JobLogsResponse, Status>>,
}

/// A `LogsRequest` sent and not yet ended.
struct Asking {
    request: u64,
    epoch: u64,
    worker: WorkerId,
    conn: ConnectionId,
}

/// What the reader's job is now, as far as its output goes.
struct JobNow {
    incarnations: Vec<Incarnation>,
    /// The current epoch and whether its container has started.
    current: (u64, bool),
    ended: bool,
}

impl Actor {
    /// Opens a reader of job `id`'s output.
    pub(super) fn open_logs(&mut self, id: &str, follow: bool, tail: u32) -> Result<LogStream> {
        let now = self.job_now(id)?;
        // Nothing ran yet: only a follower has something to wait for.
        if now.incarnations.is_empty() && (!follow || now.ended) {
            let state = self.job_pb(id, false)?;
            return Err(Error::FailedPrecondition(format!(
                "job {id} never started, so it has no output (it is {}: {}); add --follow to wait for it",
                pb::JobState::try_from(state.state)
                    .unwrap_or_default()
                    .label(),
                state.reason
            )));
        }
        let (tx, rx) = mpsc::channel(READER_BUFFER);
        let rid = self.logs.next_id;
        self.logs.next_id += 1;
        self.logs.readers.insert(
            rid,
            Reader {
                job: id.into(),
                follow,
                tail,
                incarnations: now.incarnations,
                next_epoch: 0,
                asking: None,
                tx,
            },
        );
        self.advance_logs(rid);
        Ok(rx)
    }

    /// The job as its output needs it: from memory, else from the store (archived, so ended).
    fn job_now(&mut self, id: &str) -> Result<JobNow> {
        if let Some(j) = self.core.job(id) {
            return Ok(JobNow {
                incarnations: j.incarnations.clone(),
                current: (j.epoch, !j.container_id.is_empty()),
                ended: j.is_terminal(),
            });
        }
        let archived = self.archived(Some(id), None)?;
        let (j, _) = archived
            .into_iter()
            .next()
            .ok_or_else(|| Error::JobNotFound(id.to_string()))?;
        Ok(JobNow {
            incarnations: j.incarnations,
            current: (j.epoch, true),
            ended: true,
        })
    }

    /// Asks for the reader's next incarnation, waits for one, or ends the reader.
    fn advance_logs(&mut self, rid: u64) {
        loop {
            let Some(reader) = self.logs.readers.get(&rid) else {
                return;
            };
            if reader.asking.is_some() {
                return;
            }
            let job = reader.job.clone();
            let seen = reader.incarnations.clone();
            let now = match self.job_now(&job) {
                Ok(now) => now,
                // Gone from memory and store alike: what was seen is all there is.
                Err(_) => JobNow {
                    incarnations: seen,
                    current: (u64::MAX, true),
                    ended: true,
                },
            };
            let reader = self.logs.readers.get_mut(&rid).expect("reader exists");
            reader.incarnations = now.incarnations;
            let next = reader
                .incarnations
                .iter()
                .find(|i| i.epoch >= reader.next_epoch)
                .cloned();
            let Some(inc) = next else {
                if reader.follow && !now.ended {
                    return; // the next tick looks again
                }
                self.logs.readers.remove(&rid); // dropping the sender ends the stream
                return;
            };
            let (current, started) = now.current;
            if inc.epoch == current && !started && !now.ended {
                if reader.follow {
                    return; // its container is not there yet
                }
                reader.next_epoch = inc.epoch + 1;
                continue;
            }
            let conn = self.core.worker(&inc.worker).and_then(|w| w.conn);
            let link = conn.and_then(|c| self.links.get(&c).map(|l| (c, l)));
            let request = self.logs.next_id;
            // The part is asked of its worker, or named as unavailable and passed over.
            let asked = match link {
                None => Err(format!("worker {} is not connected", inc.worker)),
                Some((conn, link)) => link
                    .send(ManagerKind::Logs(pb::LogsRequest {
                        request_id: request,
                        job_id: job.to_string(),
                        epoch: inc.epoch,
                        follow: reader.follow,
                        tail: reader.tail,
                    }))
                    .map(|()| conn)
                    .map_err(|_| format!("worker {}'s stream is full or closing", inc.worker)),
            };
            let conn = match asked {
                Ok(conn) => conn,
                Err(why) => {
                    reader.next_epoch = inc.epoch + 1;
                    if !Self::deliver(reader, part(&inc, Vec::new(), why)) {
                        self.logs.readers.remove(&rid);
                        return;
                    }
                    continue;
                }
            };
            self.logs.next_id += 1;
            self.metrics.command_sent("logs");
            reader.asking = Some(Asking {
                request,
                epoch: inc.epoch,
                worker: inc.worker,
                conn,
            });
            self.logs.asked.insert(request, rid);
            return;
        }
    }

    /// Hands a response to the reader without waiting; false when the reader is gone or too
    /// slow (it is then told why, if it can still hear it).
    fn deliver(reader: &Reader, response: pb::JobLogsResponse) -> bool {
        match reader.tx.try_send(Ok(response)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                // The buffer is full, so this cannot be queued either; the stream simply ends
                // when the reader is dropped, after the reader drains what it has.
                warn!(job = %reader.job, "log reader fell behind the job's output; ending it");
                false
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }

    /// A chunk from the agent on stream `conn`.
    pub(super) fn on_log_chunk(&mut self, conn: ConnectionId, chunk: pb::LogChunk) {
        let Some(&rid) = self.logs.asked.get(&chunk.request_id) else {
            // A request already ended or cancelled (its reader left): nothing to do.
            debug!(request = chunk.request_id, "log chunk for no open request");
            return;
        };
        let reader = self
            .logs
            .readers
            .get_mut(&rid)
            .expect("asked readers exist");
        let asking = reader.asking.as_ref().expect("asked readers are asking");
        if asking.conn != conn {
            // Only the worker asked may answer.
            self.metrics.refused(Refusal::ForeignJob.as_str());
            warn!(
                request = chunk.request_id,
                asked = %asking.worker,
                conn,
                "refused a log chunk from a worker that was not asked for it"
            );
            return;
        }
        let inc = Incarnation {
            epoch: asking.epoch,
            worker: asking.worker.clone(),
        };
        let mut alive = true;
        if !chunk.lines.is_empty() {
            alive = Self::deliver(reader, part(&inc, chunk.lines, String::new()));
        }
        if alive && chunk.end && !chunk.error.is_empty() {
            alive = Self::deliver(reader, part(&inc, Vec::new(), chunk.error));
        }
        if !alive {
            self.close_logs(rid);
            return;
        }
        if chunk.end {
            self.logs.asked.remove(&chunk.request_id);
            reader.asking = None;
            reader.next_epoch = inc.epoch + 1;
            self.advance_logs(rid);
        }
    }

    /// Ends a reader, telling its agent to stop sending.
    fn close_logs(&mut self, rid: u64) {
        let Some(reader) = self.logs.readers.remove(&rid) else {
            return;
        };
        if let Some(a) = reader.asking {
            self.logs.asked.remove(&a.request);
            if let Some(link) = self.links.get(&a.conn) {
                let _ = link.send(ManagerKind::LogsCancel(pb::LogsCancel {
                    request_id: a.request,
                }));
            }
        }
    }

    /// Stream `conn` ended: its agent will not finish what it was asked.
    pub(super) fn logs_disconnected(&mut self, conn: ConnectionId) {
        let cut: Vec<u64> = self
            .logs
            .readers
            .iter()
            .filter(|(_, r)| r.asking.as_ref().is_some_and(|a| a.conn == conn))
            .map(|(rid, _)| *rid)
            .collect();
        for rid in cut {
            let reader = self.logs.readers.get_mut(&rid).expect("listed");
            let a = reader.asking.take().expect("asking");
            self.logs.asked.remove(&a.request);
            reader.next_epoch = a.epoch + 1;
            let inc = Incarnation {
                epoch: a.epoch,
                worker: a.worker,
            };
            let why = format!(
                "worker {}'s agent disconnected while sending it",
                inc.worker
            );
            if Self::deliver(reader, part(&inc, Vec::new(), why)) {
                self.advance_logs(rid);
            } else {
                self.logs.readers.remove(&rid);
            }
        }
    }

    /// On every tick: readers that left are closed, waiting ones look again.
    pub(super) fn tick_logs(&mut self) {
        let rids: Vec<u64> = self.logs.readers.keys().copied().collect();
        for rid in rids {
            let Some(reader) = self.logs.readers.get(&rid) else {
                continue;
            };
            if reader.tx.is_closed() {
                self.close_logs(rid);
            } else if reader.asking.is_none() {
                self.advance_logs(rid);
            }
        }
    }
}

/// A response of incarnation `inc`: output, or why (the rest of) it cannot be read.
fn part(inc: &Incarnation, lines: Vec<pb::LogLine>, unavailable: String) -> pb::JobLogsResponse {
    pb::JobLogsResponse {
        epoch: inc.epoch,
        worker_id: inc.worker.to_string(),
        lines,
        unavailable,
    }
}
