//! The user API (`ControlService`): each handler turns a wire request into an actor
//! [`Request`] and the answer back into a wire response, and does nothing else.

use std::pin::Pin;

use converge_messenger::pb::{self, control_service_server::ControlService};
use futures::{Stream, StreamExt, stream};
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::{Request, Response, Status};

use crate::actor::Request as ActorRequest;
use crate::error::Error;

/// Checks a request's `job_id`: job ids are UUIDs, so anything else is a mistake to name, not
/// a job to look for.
fn job_id(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Error::invalid("job_id", "required").into());
    }
    if uuid::Uuid::try_parse(id).is_err() {
        let shown: String = id.chars().take(64).collect();
        return Err(Error::invalid(
            "job_id",
            format!("`{shown}` is not a job id (job ids are UUIDs, as SubmitJob returns them)"),
        )
        .into());
    }
    Ok(())
}

/// Requests per caller, keyed by token name (or address when there are no tokens).
type PerCaller = governor::DefaultKeyedRateLimiter<String>;

/// A cloneable handle on the manager actor.
#[derive(Clone)]
pub struct ManagerHandle {
    tx: mpsc::Sender<ActorRequest>,
    rate: Option<Arc<PerCaller>>,
    watchers: Arc<Semaphore>,
    max_watchers: usize,
    /// Held by a Backup from its question to the actor until its copy is written or dropped
    /// (the actor keeps it with the copy: [`ActorRequest::Backup`]'s `turn`). One asked while
    /// another's copy is still being written would find the file held, lacking the newest
    /// commits, and the store would make it by `VACUUM INTO`, on the actor, holding it for
    /// the whole copy; waiting for the first copy lets it copy the file as the first did.
    /// Backups waiting their turn hold their stream slots (`--max-watchers`) meanwhile.
    backups: Arc<tokio::sync::Mutex<()>>,
}

impl ManagerHandle {
    /// A handle sending on `tx`, admitting `rate` requests a second per caller (bursts of
    /// twice that) and `max_watchers` WatchEvents streams at once.
    pub fn new(
        tx: mpsc::Sender<ActorRequest>,
        rate: Option<std::num::NonZeroU32>,
        max_watchers: usize,
    ) -> Self {
        let rate = rate.map(|r| {
            let burst = r.saturating_mul(std::num::NonZeroU32::new(2).expect("2 > 0"));
            Arc::new(governor::RateLimiter::keyed(
                governor::Quota::per_second(r).allow_burst(burst),
            ))
        });
        Self {
            tx,
            rate,
            watchers: Arc::new(Semaphore::new(max_watchers)),
            max_watchers,
            backups: Arc::default(),
        }
    }

    /// Refuses a caller over its request rate.
    fn admit<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        let caller = match request.extensions().get::<crate::auth::CallerName>() {
            Some(c) => c.0.clone(),
            None => request
                .remote_addr()
                .map_or_else(|| "unknown".into(), |a| a.ip().to_string()),
        };
        // Forget callers idle for a while now and then, so the map stays bounded.
        if rate.len() > 1024 {
            rate.retain_recent();
        }
        rate.check_key(&caller).map_err(|_| {
            Status::resource_exhausted(format!(
                "{caller} is over its request rate (--rate-limit); slow down and retry"
            ))
        })
    }

    /// A slot for one long-lived stream (WatchEvents, JobLogs), held until the stream ends.
    fn stream_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        self.watchers.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{} event, log and backup streams are open, the most this manager serves (--max-watchers); close one and retry",
                self.max_watchers
            ))
        })
    }

    /// Sends a request built around a fresh reply channel and waits for the answer.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> ActorRequest,
    ) -> Result<T, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| Error::Unavailable)?;
        rx.await.map_err(|_| Error::Unavailable)
    }

    /// DrainWorker (`draining`) and UndrainWorker: the worker as it is after the request.
    async fn set_draining(
        &self,
        worker_id: String,
        draining: bool,
    ) -> Result<Response<pb::Worker>, Status> {
        if worker_id.is_empty() {
            return Err(Error::invalid("worker_id", "required").into());
        }
        let w = self
            .ask(|reply| ActorRequest::Drain {
                worker_id,
                draining,
                reply,
            })
            .await??;
        Ok(Response::new(w))
    }
}

/// Bytes of the store's copy per `BackupChunk`: well under the 4 MiB a gRPC client takes by
/// default.
const BACKUP_CHUNK: usize = 256 * 1024;

#[tonic::async_trait]
impl ControlService for ManagerHandle {
    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        self.admit(&request)?;
        let spec = request.into_inner().spec.map(Box::new);
        let (job, warnings) = self
            .ask(|reply| ActorRequest::Submit { spec, reply })
            .await??;
        Ok(Response::new(pb::SubmitJobResponse {
            job_id: job.id.clone(),
            job: Some(job),
            warnings,
        }))
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        self.admit(&request)?;
        let r = request.into_inner();
        job_id(&r.job_id)?;
        let job = self
            .ask(|reply| ActorRequest::GetJob {
                id: r.job_id,
                include_progress: r.include_progress,
                reply,
            })
            .await??;
        Ok(Response::new(job))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        self.admit(&request)?;
        let request = request.into_inner();
        if pb::JobState::try_from(request.state).is_err() {
            let state = request.state;
            return Err(Error::invalid("state", format!("unknown job state {state}")).into());
        }
        let page = self
            .ask(|reply| ActorRequest::ListJobs { request, reply })
            .await??;
        Ok(Response::new(page))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        self.admit(&request)?;
        // The token's name, for the job's reason; none when the API is open.
        let by = (request.extensions().get::<crate::auth::CallerName>())
            .map_or_else(String::new, |c| c.0.clone());
        let id = request.into_inner().job_id;
        job_id(&id)?;
        let job = self
            .ask(|reply| ActorRequest::Cancel { id, by, reply })
            .await??;
        Ok(Response::new(job))
    }

    async fn forget_worker(
        &self,
        request: Request<pb::ForgetWorkerRequest>,
    ) -> Result<Response<pb::Worker>, Status> {
        self.admit(&request)?;
        let worker_id = request.into_inner().worker_id;
        if worker_id.is_empty() {
            return Err(Error::invalid("worker_id", "required").into());
        }
        let w = self
            .ask(|reply| ActorRequest::Forget { worker_id, reply })
            .await??;
        Ok(Response::new(w))
    }

    async fn list_workers(
        &self,
        request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        self.admit(&request)?;
        let workers = self
            .ask(|reply| ActorRequest::ListWorkers { reply })
            .await?;
        Ok(Response::new(pb::ListWorkersResponse { workers }))
    }

    async fn drain_worker(
        &self,
        request: Request<pb::DrainWorkerRequest>,
    ) -> Result<Response<pb::Worker>, Status> {
        self.admit(&request)?;
        self.set_draining(request.into_inner().worker_id, true)
            .await
    }

    async fn undrain_worker(
        &self,
        request: Request<pb::UndrainWorkerRequest>,
    ) -> Result<Response<pb::Worker>, Status> {
        self.admit(&request)?;
        self.set_draining(request.into_inner().worker_id, false)
            .await
    }

    type WatchEventsStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

    async fn watch_events(
        &self,
        request: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        self.admit(&request)?;
        let permit = self.stream_slot()?;
        let r = request.into_inner();
        let job_id = r.job_id.clone();
        let crate::actor::Watched { history, live, log } = self
            .ask(|reply| ActorRequest::Watch {
                job_id: r.job_id,
                from_seq: r.from_seq,
                reply,
            })
            .await??;
        let live = BroadcastStream::new(live)
            .filter_map(move |item| {
                let keep = match &item {
                    Ok(e) => job_id.is_empty() || e.job_id == job_id,
                    Err(_) => true,
                };
                async move { keep.then_some(item) }
            })
            .map(|item| match item {
                Ok(e) => Ok(e),
                // A watcher too slow to keep up is cut off with a way to resume, rather than
                // silently missing events.
                Err(BroadcastStreamRecvError::Lagged(n)) => Err(Status::resource_exhausted(
                    format!("watcher fell {n} events behind; watch again with from_seq set to the last seq you saw + 1"),
                )),
            })
            .scan(false, |failed, item| {
                // End the stream after the first error.
                let out = if *failed { None } else { Some(item) };
                if matches!(out, Some(Err(_))) {
                    *failed = true;
                }
                futures::future::ready(out)
            });
        // The stream holds its slot until the watcher goes.
        let live = live.map(move |item| {
            let _slot = &permit;
            item
        });
        let all = stream::iter(history.into_iter().map(Ok)).chain(live);
        let mut response = Response::new(Box::pin(all) as Self::WatchEventsStream);
        // A UUID is always a valid header value.
        if let Ok(value) = log.parse() {
            response
                .metadata_mut()
                .insert(converge_messenger::EVENT_LOG_HEADER, value);
        }
        Ok(response)
    }

    type JobLogsStream = Pin<Box<dyn Stream<Item = Result<pb::JobLogsResponse, Status>> + Send>>;

    type BackupStream = Pin<Box<dyn Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

    async fn backup(
        &self,
        request: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        self.admit(&request)?;
        let permit = self.stream_slot()?;
        let turn = Arc::clone(&self.backups).lock_owned().await;
        let pending = (self.ask(|reply| ActorRequest::Backup { turn, reply }).await)??;
        // Blocking: it reads the whole store.
        let copy = tokio::task::spawn_blocking(move || pending.write())
            .await
            .map_err(|e| Status::internal(format!("writing the backup copy: {e}")))?
            .map_err(Error::Store)?;
        let file = tokio::fs::File::open(copy.path()).await.map_err(|e| {
            Status::internal(format!(
                "the backup copy {} cannot be read: {e}",
                copy.path().display()
            ))
        })?;
        // Removed at once, whatever the client does next: the open file is read to its end.
        drop(copy);
        let chunks = stream::unfold(Some(file), move |file| async move {
            use tokio::io::AsyncReadExt;
            let mut file = file?;
            let mut data = vec![0; BACKUP_CHUNK];
            match file.read(&mut data).await {
                Ok(0) => None,
                Ok(n) => {
                    data.truncate(n);
                    Some((Ok(pb::BackupChunk { data }), Some(file)))
                }
                // The error ends the stream: a copy cut short must not look whole.
                Err(e) => Some((
                    Err(Status::internal(format!("reading the backup copy: {e}"))),
                    None,
                )),
            }
        })
        .map(move |chunk| {
            let _slot = &permit;
            chunk
        });
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn job_logs(
        &self,
        request: Request<pb::JobLogsRequest>,
    ) -> Result<Response<Self::JobLogsStream>, Status> {
        self.admit(&request)?;
        let permit = self.stream_slot()?;
        let r = request.into_inner();
        job_id(&r.job_id)?;
        let output = self
            .ask(|reply| ActorRequest::Logs {
                id: r.job_id,
                follow: r.follow,
                tail: r.tail,
                reply,
            })
            .await??;
        let output = tokio_stream::wrappers::ReceiverStream::new(output).map(move |item| {
            let _slot = &permit;
            item
        });
        Ok(Response::new(Box::pin(output)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::in_turn;
    use converge_store::{PendingBackup, Sqlite, Store};

    /// A handle on a fake actor, `rx`, and a store for it to back up.
    fn handle() -> (
        ManagerHandle,
        mpsc::Receiver<ActorRequest>,
        Sqlite,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().expect("dir");
        let store = Sqlite::open(dir.path()).expect("store");
        let (tx, rx) = mpsc::channel(8);
        (ManagerHandle::new(tx, None, 8), rx, store, dir)
    }

    async fn backup(
        h: ManagerHandle,
    ) -> Result<Response<<ManagerHandle as ControlService>::BackupStream>, Status> {
        ControlService::backup(&h, Request::new(pb::BackupRequest {})).await
    }

    /// The next Backup the handle asks the actor, with its turn.
    async fn asked(
        rx: &mut mpsc::Receiver<ActorRequest>,
    ) -> (
        tokio::sync::OwnedMutexGuard<()>,
        oneshot::Sender<crate::Result<PendingBackup>>,
    ) {
        match rx.recv().await.expect("a request") {
            ActorRequest::Backup { turn, reply } => (turn, reply),
            _ => panic!("not a Backup"),
        }
    }

    /// Answers as the actor does: `store`'s backup, in the caller's turn, wrapped by `wrap`.
    async fn answer(
        rx: &mut mpsc::Receiver<ActorRequest>,
        store: &mut Sqlite,
        wrap: impl FnOnce(PendingBackup) -> PendingBackup,
    ) {
        let (turn, reply) = asked(rx).await;
        let pending = in_turn(store.backup().expect("a backup begins"), turn);
        let _ = reply.send(Ok(wrap(pending)));
    }

    /// The bytes of a Backup's stream.
    async fn copied(
        response: Result<Response<<ManagerHandle as ControlService>::BackupStream>, Status>,
    ) -> Vec<u8> {
        let mut chunks = response.expect("a backup").into_inner();
        let mut bytes = Vec::new();
        while let Some(chunk) = chunks.next().await {
            bytes.extend(chunk.expect("a chunk").data);
        }
        bytes
    }

    /// Polls the Backup `second` once, and says whether it asked the actor.
    async fn asks_at_once(
        second: std::pin::Pin<&mut impl std::future::Future>,
        rx: &mut mpsc::Receiver<ActorRequest>,
    ) -> bool {
        assert!(futures::poll!(second).is_pending());
        rx.try_recv().is_ok()
    }

    /// A Backup asked for while another's copy is still being written waits for it before it
    /// asks the actor. Asked at once, it found the file held for the first copy, and the store
    /// made it by `VACUUM INTO` on the actor, which then answered nothing for the whole copy.
    /// Both copies are the file's (its header says WAL mode; `VACUUM INTO` writes a rollback
    /// journal's header).
    #[tokio::test]
    async fn a_backup_waits_for_the_copy_of_the_one_before() {
        let (handle, mut rx, mut store, _dir) = handle();
        let first = tokio::spawn(backup(handle.clone()));
        let (started, is_writing) = oneshot::channel();
        let (release, wait_for_release) = std::sync::mpsc::channel::<()>();
        answer(&mut rx, &mut store, |pending| {
            PendingBackup::new(move || {
                let _ = started.send(());
                let _ = wait_for_release.recv();
                pending.write()
            })
        })
        .await;
        is_writing.await.expect("the first copy is being written");

        let second = backup(handle.clone());
        tokio::pin!(second);
        assert!(
            !asks_at_once(second.as_mut(), &mut rx).await,
            "the second Backup asked the actor while the first copy was being written"
        );
        release.send(()).expect("the first copy waits");
        let first = copied(first.await.expect("the first Backup")).await;
        let (second, ()) = tokio::join!(
            async { copied(second.await).await },
            answer(&mut rx, &mut store, |p| p)
        );
        for copy in [first, second] {
            assert_eq!(copy[18..20], [2, 2], "not a copy of the file (WAL mode)");
        }
    }

    /// A caller that goes away while the actor works on its Backup does not give up its turn:
    /// the copy begun, which holds the file, is the actor's until it is dropped, and the turn
    /// with it. A turn held by the caller alone let the next Backup in while the file was held.
    #[tokio::test]
    async fn a_backup_whose_caller_went_away_keeps_its_turn_until_its_copy_is_dropped() {
        let (handle, mut rx, mut store, _dir) = handle();
        let first = tokio::spawn(backup(handle.clone()));
        let (turn, reply) = asked(&mut rx).await;
        first.abort();
        assert!(first.await.is_err_and(|e| e.is_cancelled()));

        let second = backup(handle.clone());
        tokio::pin!(second);
        assert!(
            !asks_at_once(second.as_mut(), &mut rx).await,
            "the second Backup asked the actor while the first's copy could still begin"
        );
        // As the actor answers a caller gone: the copy begun is dropped unwritten.
        let unsent = reply.send(Ok(in_turn(store.backup().expect("a backup"), turn)));
        drop(unsent);
        let (second, ()) = tokio::join!(
            async { copied(second.await).await },
            answer(&mut rx, &mut store, |p| p)
        );
        assert_eq!(second[18..20], [2, 2], "not a copy of the file (WAL mode)");
    }
}
