//! The cluster's event log: every transition, numbered, kept for replay and broadcast live.
//!
//! Only the actor appends, so a watcher that asks the actor for "history since N plus a live
//! receiver" gets both in one step and sees every event exactly once, in order.

use std::collections::VecDeque;

use converge_messenger::pb::Event;
use tokio::sync::broadcast;

/// Events kept for replay; older ones are dropped (a watcher asking for them starts later).
pub const HISTORY: usize = 100_000;
/// Events a live watcher may fall behind by before it is cut off (and told to resume).
const LIVE_BUFFER: usize = 8192;

/// Numbered, replayable, broadcast events.
pub struct EventLog {
    next_seq: u64,
    history: VecDeque<Event>,
    live: broadcast::Sender<Event>,
}

impl Default for EventLog {
    fn default() -> Self {
        Self {
            next_seq: 1,
            history: VecDeque::new(),
            live: broadcast::channel(LIVE_BUFFER).0,
        }
    }
}

impl EventLog {
    /// A log that goes on from a store: `history` (oldest first) and the next number.
    pub fn recovered(history: Vec<Event>, next_seq: u64) -> Self {
        let skip = history.len().saturating_sub(HISTORY);
        Self {
            next_seq: next_seq.max(1),
            history: history.into_iter().skip(skip).collect(),
            live: broadcast::channel(LIVE_BUFFER).0,
        }
    }

    /// Gives `event` the next sequence number (and a time), without recording it yet: a
    /// durable manager stores it before anyone sees it ([`EventLog::publish`]).
    pub fn number(&mut self, mut event: Event) -> Event {
        event.seq = self.next_seq;
        self.next_seq += 1;
        if event.unix_ms == 0 {
            event.unix_ms = converge_messenger::unix_ms(std::time::SystemTime::now());
        }
        event
    }

    /// Records and broadcasts a numbered event.
    pub fn publish(&mut self, event: Event) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(event.clone());
        // No receivers is fine: nobody is watching.
        let _ = self.live.send(event);
    }

    /// Recorded events with `seq >= from_seq` matching `job_id` (all when empty), and a
    /// receiver for every later event.
    pub fn watch(&self, job_id: &str, from_seq: u64) -> (Vec<Event>, broadcast::Receiver<Event>) {
        let history = if from_seq == 0 {
            Vec::new()
        } else {
            self.history
                .iter()
                .filter(|e| e.seq >= from_seq && (job_id.is_empty() || e.job_id == job_id))
                .cloned()
                .collect()
        };
        (history, self.live.subscribe())
    }

    /// The sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
}
