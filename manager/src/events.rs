//! The cluster's event log: every transition, numbered, kept for replay and broadcast live.
//!
//! Only the actor appends, so a watcher that asks the actor for "history since N plus a live
//! receiver" gets both in one step and sees every event exactly once, in order.

use std::collections::VecDeque;

use converge_messenger::pb::Event;
use tokio::sync::broadcast;

/// Events kept in memory for replay (the newest); a durable manager replays older ones from its
/// store, up to [`REPLAY`] in all. Without a store older ones are gone (a watcher asking for
/// them starts later). 100,000 in memory were ~1.4 KB per job until the cap was reached.
pub const HISTORY: usize = 10_000;
/// Events one watch may replay, from memory and the store together.
pub const REPLAY: usize = 100_000;
/// Events a live watcher may fall behind by before it is cut off (and told to resume).
const LIVE_BUFFER: usize = 8192;

/// Numbered, replayable, broadcast events.
pub struct EventLog {
    /// The log's name ([`EventLog::name`]).
    name: String,
    /// Events kept in memory.
    capacity: usize,
    next_seq: u64,
    history: VecDeque<Event>,
    live: broadcast::Sender<Event>,
}

impl Default for EventLog {
    fn default() -> Self {
        Self::with_capacity(HISTORY)
    }
}

impl EventLog {
    /// An empty log keeping the newest `capacity` events in memory.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            name: uuid::Uuid::new_v4().to_string(),
            capacity: capacity.max(1),
            next_seq: 1,
            history: VecDeque::new(),
            live: broadcast::channel(LIVE_BUFFER).0,
        }
    }

    /// A log that goes on from a store: `history` (oldest first), the next number and the
    /// store's `name` for it.
    pub fn recovered(history: Vec<Event>, next_seq: u64, capacity: usize, name: String) -> Self {
        let skip = history.len().saturating_sub(capacity);
        Self {
            name,
            capacity: capacity.max(1),
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
        while self.history.len() >= self.capacity {
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

    /// The number of the oldest event in memory (the next one's when none is).
    pub fn oldest_seq(&self) -> u64 {
        self.history.front().map_or(self.next_seq, |e| e.seq)
    }

    /// The sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The log's name: a store's (`Recovered::event_log`), kept across restarts, or a new
    /// one for a manager without a store. A watcher that finds another name after a
    /// reconnect knows the numbers began again ([`converge_messenger::EVENT_LOG_HEADER`]).
    pub fn name(&self) -> &str {
        &self.name
    }
}
