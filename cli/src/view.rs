//! The live view: one line per job with a progress bar, its state, worker, CPU and ETA.
//!
//! `convergectl top` and `cargo xtask demo` both draw jobs through [`Board`], so what the demo
//! shows is what a user's `top` shows. On a terminal the frame is redrawn in place, in one
//! write per refresh; anywhere else (a pipe, a log file, a test) each refresh that changed a
//! job's line prints the lines as a plain frame, so nothing is lost when the output is not a
//! terminal.

use std::io::{IsTerminal, Write};

use converge_messenger::pb;

/// The bases of an ETA shown as a guess (`eta ~9s`): finished jobs' sizes given the service
/// the job has had, or its user's declared runtime; nothing measured of its own.
const GUESSES: [&str; 2] = ["attained-service", "declared"];

/// How often a plain frame that says what the last one said is printed all the same: a log
/// shows `top` is alive, and a reader gone (`top | head`) is found at the write and ends it.
const SAME_FRAME_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Width of the plain frame's bar, in characters.
const BAR: usize = 24;

/// What one job's line shows, read from a `Job` as the manager answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The job's name, or the start of its id when it has none.
    pub name: String,
    /// `running`, `pending`, ...
    pub state: String,
    /// The worker it runs on (empty while pending).
    pub worker: String,
    /// Steps done.
    pub step: u64,
    /// Steps in all (0: the job did not say).
    pub total: u64,
    /// CPU cores used over the worker's last report (0 unless running).
    pub cpu_used: f64,
    /// The CPU limit the worker set (FlowCon's or Converge's; absent under free competition).
    pub cpu_limit: Option<f64>,
    /// `eta 1m05s`, `starts in 12s, eta 43s`, `eta ~9s` for a guess (basis [`GUESSES`]),
    /// `eta -` when nothing tells yet; once ended,
    /// `took 1m05s` from submission, or `never ran`.
    pub eta: String,
    /// Why it is in its state, shown for jobs that wait or ended other than completed.
    pub reason: String,
}

impl Row {
    /// The row of `j`; `now_ms` (Unix ms) turns a pending job's expected start into "in".
    pub fn of(j: &pb::Job, now_ms: i64) -> Row {
        let state = pb::JobState::label_of(j.state);
        let running = j.state == pb::JobState::Running as i32;
        let pending = j.state == pb::JobState::Pending as i32;
        let eta = if j.finished_unix_ms > 0 && j.started_unix_ms == 0 {
            // Ended before it ran (cancelled, rejected, failed to start): it took nothing.
            "never ran".into()
        } else if j.finished_unix_ms > 0 && j.submitted_unix_ms > 0 {
            // Ended: how long it took from submission, the figure the demo compares.
            format!(
                "took {}",
                duration((j.finished_unix_ms - j.submitted_unix_ms) as f64 / 1000.0)
            )
        } else {
            match &j.eta {
                Some(e) if pending && e.start_unix_ms > 0 => format!(
                    "starts in {}, eta {}",
                    duration((e.start_unix_ms - now_ms) as f64 / 1000.0),
                    eta(e)
                ),
                Some(e) => format!("eta {}", eta(e)),
                None => "eta -".into(),
            }
        };
        Row {
            name: j
                .spec
                .as_ref()
                .map(|s| s.name.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| j.id.chars().take(8).collect()),
            state,
            worker: j.worker_id.clone(),
            step: j.step,
            total: j.total_steps,
            cpu_used: if running { j.cpu_usage } else { 0.0 },
            cpu_limit: j.cpu_limit.filter(|_| running),
            eta,
            reason: if running || j.state == pb::JobState::Completed as i32 {
                String::new()
            } else {
                j.reason.clone()
            },
        }
    }

    /// Fraction done, in [0, 1] (a completed job is done whatever it reported).
    pub fn done(&self) -> f64 {
        if self.state == "completed" {
            1.0
        } else if self.total > 0 {
            (self.step as f64 / self.total as f64).min(1.0)
        } else {
            0.0
        }
    }

    /// Everything but the name and the bar: state, worker, steps, CPU, ETA, reason.
    pub fn detail(&self) -> String {
        let cpu = match self.cpu_limit {
            Some(l) => format!("cpu {:.2}/{:.2}", self.cpu_used, l),
            None if self.state == "running" => format!("cpu {:.2}", self.cpu_used),
            None => String::new(),
        };
        let mut s = format!(
            "{:<9} {:<9} {:>11} {:<14} {}",
            self.state,
            self.worker,
            steps(self.step, self.total),
            cpu,
            self.eta
        );
        if !self.reason.is_empty() {
            s.push_str(&format!("  ({})", self.reason));
        }
        s
    }

    /// The whole line with a text bar, as a plain frame prints it.
    pub fn line(&self) -> String {
        let filled = (self.done() * BAR as f64).round() as usize;
        format!(
            "{:<12} [{}{}] {:>3.0}% {}",
            self.name,
            "#".repeat(filled),
            ".".repeat(BAR - filled),
            self.done() * 100.0,
            self.detail()
        )
    }
}

/// A job's time left: `1m05s`, or `~9s` for a guess from other jobs' sizes or its user's word
/// (basis in [`GUESSES`]: the job has no progress of its own to go by), so that `9s` for a
/// job that runs 20 is not read as a forecast.
pub fn eta(e: &pb::Eta) -> String {
    let rough = if GUESSES.contains(&e.basis.as_str()) {
        "~"
    } else {
        ""
    };
    format!("{rough}{}", duration(e.remaining_s))
}

/// `400/1600`; `400/?` when the job does not say how many; `-` before its first report.
pub fn steps(step: u64, total: u64) -> String {
    match (step, total) {
        (0, 0) => "-".into(),
        (s, 0) => format!("{s}/?"),
        (s, t) => format!("{s}/{t}"),
    }
}

/// `1h02m`, `4m05s`, `12s` (a negative time is `0s`).
pub fn duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The view of a set of jobs: a frame redrawn in place on a terminal, plain frames elsewhere.
pub struct Board {
    title: String,
    /// `None` when stdout is not a terminal.
    term: Option<console::Term>,
    /// Lines the last terminal frame drew (the cursor is below them), and the terminal's
    /// size then.
    drawn: usize,
    size: (u16, u16),
    /// The status and job lines of the last plain frame, and when it was printed: one that
    /// would say the same is not printed again for [`SAME_FRAME_EVERY`].
    last: Option<(Vec<String>, std::time::Instant)>,
}

impl Board {
    /// A board whose header line says `title`; redrawn in place when stdout is a terminal.
    pub fn new(title: &str) -> Board {
        Board {
            title: title.to_string(),
            term: std::io::stdout().is_terminal().then(console::Term::stdout),
            drawn: 0,
            size: (0, 0),
            last: None,
        }
    }

    /// Whether the board is drawn in place on a terminal.
    pub fn on_terminal(&self) -> bool {
        self.term.is_some()
    }

    /// Shows `jobs` (in the order given) with `stamp` (the time, which a plain frame alone
    /// does not print again for) and `status` on the header line; a status of more lines
    /// continues below it (each cut to the terminal's width as the others are).
    pub fn update(&mut self, jobs: &[pb::Job], now_ms: i64, stamp: &str, status: &str) {
        let mut rows: Vec<String> = jobs.iter().map(|j| Row::of(j, now_ms).line()).collect();
        let header = format!("{} {stamp}{status}", self.title);
        let Some(term) = &self.term else {
            // The status is compared with the rows: "the manager is unreachable" is news.
            rows.insert(0, status.to_string());
            if let Some(text) = self.plain(&header, rows, std::time::Instant::now()) {
                print!("{text}");
            }
            return;
        };
        let size = term.size();
        // Resized: lines drawn at the old width may have been wrapped or moved by the
        // terminal, so the count of lines to go back over is no longer known. Drawn again
        // from the top of a cleared screen.
        let mut text = String::new();
        if size != self.size && self.drawn > 0 {
            text.push_str("\x1b[H\x1b[2J");
            self.drawn = 0;
        }
        self.size = size;
        let (height, width) = size;
        let lines: Vec<String> = (header.lines().map(String::from)).chain(rows).collect();
        let (frame, shown) = frame(self.drawn, &lines, usize::from(width), usize::from(height));
        text.push_str(&frame);
        self.drawn = shown;
        // One write: the terminal shows the new frame whole, never half of it.
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }

    /// Leaves the last drawing on screen.
    pub fn finish(&mut self) {}

    /// A plain frame, for a log of frames: one where a job's line changed (the header's clock
    /// changes every time), the first, or the same again after [`SAME_FRAME_EVERY`]. A log of
    /// `top` with nothing running printed the same frame twice a second.
    fn plain(
        &mut self,
        header: &str,
        rows: Vec<String>,
        now: std::time::Instant,
    ) -> Option<String> {
        if let Some((last, at)) = &self.last
            && *last == rows
            && now.duration_since(*at) < SAME_FRAME_EVERY
        {
            return None;
        }
        let mut text = format!("--- {header}\n");
        for r in rows.iter().skip(1) {
            text.push_str(&format!("  {r}\n"));
        }
        self.last = Some((rows, now));
        Some(text)
    }
}

/// The bytes that redraw a frame of `lines` over the `drawn` lines above the cursor, on a
/// terminal of `width` columns and `height` rows: each line cut short of the width (a wrapped
/// line would take two rows and the next redraw would start one too low; some terminals wrap
/// a line that fills the width exactly), and a frame taller than the screen cut to it with
/// the number of lines left out, for the same reason. What the last frame drew below this
/// one's is erased (erasing scrolls nothing, as new lines at the screen's foot would).
/// Returns the bytes and the lines drawn.
fn frame(drawn: usize, lines: &[String], width: usize, height: usize) -> (String, usize) {
    let room = height.saturating_sub(1).max(1);
    let mut shown: Vec<String> = lines.to_vec();
    if shown.len() > room {
        let left = shown.len() - (room - 1);
        shown.truncate(room - 1);
        shown.push(format!(
            "... and {left} more lines (a taller terminal shows them)"
        ));
    }
    let mut text = String::new();
    if drawn > 0 {
        text.push_str(&format!("\x1b[{drawn}A"));
    }
    for l in &shown {
        text.push_str("\r\x1b[2K");
        text.push_str(&console::truncate_str(
            l,
            width.saturating_sub(1).max(1),
            "",
        ));
        text.push('\n');
    }
    text.push_str("\x1b[J");
    (text, shown.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: pb::JobState) -> pb::Job {
        pb::Job {
            id: "0b4e5d2c-0000-4000-8000-000000000001".into(),
            spec: Some(pb::JobSpec {
                name: "A-VAE".into(),
                ..Default::default()
            }),
            state: state as i32,
            worker_id: "worker-1".into(),
            step: 400,
            total_steps: 1600,
            cpu_usage: 0.48,
            cpu_limit: Some(0.5),
            submitted_unix_ms: 1_000_000,
            started_unix_ms: 1_001_000,
            ..Default::default()
        }
    }

    #[test]
    fn a_running_job_shows_its_share_done_its_cpu_against_its_limit_and_its_eta() {
        let mut j = job(pb::JobState::Running);
        j.eta = Some(pb::Eta {
            remaining_s: 65.4,
            confidence: 0.8,
            ..Default::default()
        });
        let r = Row::of(&j, 1_010_000);
        assert_eq!(r.done(), 0.25);
        let line = r.line();
        assert!(
            line.starts_with("A-VAE        [######..................]  25% running"),
            "{line}"
        );
        assert!(line.contains("worker-1"), "{line}");
        assert!(line.contains("400/1600"), "{line}");
        assert!(line.contains("cpu 0.48/0.50"), "{line}");
        assert!(line.ends_with("eta 1m05s"), "{line}");
        // A guess from other jobs' sizes is marked as one; a measured rate at a low
        // confidence is not.
        j.eta.as_mut().unwrap().confidence = 0.05;
        let line = Row::of(&j, 1_010_000).line();
        assert!(line.ends_with("eta 1m05s"), "{line}");
        j.eta.as_mut().unwrap().basis = GUESSES[0].into();
        let line = Row::of(&j, 1_010_000).line();
        assert!(line.ends_with("eta ~1m05s"), "{line}");
    }

    #[test]
    fn a_pending_job_says_when_it_is_expected_to_start_and_why_it_waits() {
        let mut j = job(pb::JobState::Pending);
        j.worker_id.clear();
        j.step = 0;
        j.reason = "no worker has 1.00 free cores".into();
        j.eta = Some(pb::Eta {
            remaining_s: 90.0,
            start_unix_ms: 1_030_000,
            ..Default::default()
        });
        let line = Row::of(&j, 1_010_000).line();
        assert!(line.contains("starts in 20s, eta 1m30s"), "{line}");
        assert!(line.ends_with("(no worker has 1.00 free cores)"), "{line}");
        // Not running: no CPU figures.
        assert!(!line.contains("cpu"), "{line}");
    }

    #[test]
    fn an_ended_job_shows_how_long_it_took_and_a_completed_one_a_full_bar() {
        let mut j = job(pb::JobState::Completed);
        j.finished_unix_ms = 1_075_000;
        let r = Row::of(&j, 2_000_000);
        assert_eq!(r.done(), 1.0);
        assert!(r.line().contains("took 1m15s"), "{}", r.line());
        let mut j = job(pb::JobState::Failed);
        j.finished_unix_ms = 1_005_000;
        j.reason = "exit code 1".into();
        let line = Row::of(&j, 2_000_000).line();
        assert!(line.contains(" 25% failed"), "{line}");
        assert!(line.ends_with("took 5s  (exit code 1)"), "{line}");
        // One that ended before it ran took no time of its own.
        let mut j = job(pb::JobState::Cancelled);
        j.started_unix_ms = 0;
        j.finished_unix_ms = 1_005_000;
        j.reason = "cancelled by user".into();
        let line = Row::of(&j, 2_000_000).line();
        assert!(line.ends_with("never ran  (cancelled by user)"), "{line}");
    }

    #[test]
    fn a_job_without_reports_has_no_eta_and_an_empty_bar() {
        let mut j = job(pb::JobState::Running);
        j.step = 0;
        j.total_steps = 0;
        let line = Row::of(&j, 0).line();
        assert!(
            line.contains(&format!("[{}]   0%", ".".repeat(BAR))),
            "{line}"
        );
        assert!(line.ends_with("eta -"), "{line}");
        // No step reported yet: not "0/0".
        assert!(!line.contains("0/0") && line.contains(" - "), "{line}");
    }

    #[test]
    fn a_frame_is_redrawn_over_the_last_cut_to_the_terminal() {
        let lines = |n: usize| {
            (0..n)
                .map(|i| format!("line {i} {}", "x".repeat(30)))
                .collect::<Vec<_>>()
        };
        // The first: no move up; each line cleared, cut short of 10 columns; below erased.
        let (text, shown) = frame(0, &lines(2), 10, 24);
        assert_eq!(shown, 2);
        assert_eq!(text, "\r\x1b[2Kline 0 xx\n\r\x1b[2Kline 1 xx\n\x1b[J");
        // The next, over it.
        let (text, _) = frame(2, &lines(2), 10, 24);
        assert!(text.starts_with("\x1b[2A\r\x1b[2Kline 0"), "{text:?}");
        // Shorter: what is left of the last one is erased, without a new line (which at the
        // screen's foot would scroll the frame up).
        let (text, shown) = frame(3, &lines(1), 80, 24);
        assert_eq!(shown, 1);
        assert!(
            text.starts_with("\x1b[3A") && text.ends_with("x\n\x1b[J"),
            "{text:?}"
        );
        assert_eq!(text.matches('\n').count(), 1, "{text:?}");
        // Taller than the screen: cut to it, saying how much is not shown.
        let (text, shown) = frame(0, &lines(10), 80, 5);
        assert_eq!(shown, 4);
        assert!(
            text.contains("line 2") && !text.contains("line 3"),
            "{text:?}"
        );
        assert!(text.contains("... and 7 more lines"), "{text:?}");
    }

    #[test]
    fn a_plain_frame_is_printed_only_when_a_job_line_changed() {
        let mut board = Board {
            title: "top".into(),
            term: None,
            drawn: 0,
            size: (0, 0),
            last: None,
        };
        let t = std::time::Instant::now();
        let s = std::time::Duration::from_secs;
        // Each frame: the status, then the job lines.
        let rows = |status: &str, jobs: &[&str]| {
            let mut r = vec![status.to_string()];
            r.extend(jobs.iter().map(|j| j.to_string()));
            r
        };
        let first = board.plain("at 10:00:00: ok", rows("ok", &[]), t);
        assert_eq!(first.as_deref(), Some("--- at 10:00:00: ok\n"), "the first");
        assert!(
            board
                .plain("at 10:00:01", rows("ok", &[]), t + s(1))
                .is_none(),
            "still no job"
        );
        let a = board.plain("at 10:00:02: ok", rows("ok", &["a"]), t + s(2));
        assert_eq!(a.as_deref(), Some("--- at 10:00:02: ok\n  a\n"));
        assert!(board.plain("h", rows("ok", &["a"]), t + s(3)).is_none());
        assert!(board.plain("h", rows("ok", &["b"]), t + s(4)).is_some());
        // The status is news too (the manager gone), and the same frame long after.
        assert!(board.plain("h", rows("away", &["b"]), t + s(5)).is_some());
        assert!(board.plain("h", rows("away", &["b"]), t + s(6)).is_none());
        assert!(board.plain("h", rows("away", &["b"]), t + s(16)).is_some());
    }

    /// `list` and `top` say the same of steps and ETAs: a guess is marked in both.
    #[test]
    fn steps_and_etas_read_the_same_everywhere() {
        assert_eq!(steps(0, 0), "-");
        assert_eq!(steps(40, 0), "40/?");
        assert_eq!(steps(40, 100), "40/100");
        let mut e = pb::Eta {
            remaining_s: 0.0027,
            ..Default::default()
        };
        assert_eq!(eta(&e), "0s");
        e.basis = GUESSES[0].into();
        assert_eq!(eta(&e), "~0s");
    }
}
