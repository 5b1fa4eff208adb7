//! The live view: one line per job with a progress bar, its state, worker, CPU and ETA.
//!
//! `convergectl top` and `cargo xtask demo` both draw jobs through [`Board`], so what the demo
//! shows is what a user's `top` shows. On a terminal the lines are indicatif bars redrawn in
//! place; anywhere else (a pipe, a log file, a test) each refresh prints the same lines as a
//! plain frame, so nothing is lost when the output is not a terminal.

use std::collections::HashMap;
use std::io::IsTerminal;

use converge_messenger::pb;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The basis of an ETA shown as a guess (`eta ~9s`): finished jobs' sizes given the service
/// the job has had, with nothing of its own.
const GUESS: &str = "attained-service";

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
    /// `eta 1m05s`, `starts in 12s, eta 43s`, `eta ~9s` for a guess (basis [`GUESS`]),
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
            // A guess from other jobs' sizes (the job has no progress of its own to go by) is
            // marked, so that "eta 9s" for a job that runs 20 is not read as a forecast.
            let rough = |e: &pb::Eta| if e.basis == GUESS { "~" } else { "" };
            match &j.eta {
                Some(e) if pending && e.start_unix_ms > 0 => format!(
                    "starts in {}, eta {}{}",
                    duration((e.start_unix_ms - now_ms) as f64 / 1000.0),
                    rough(e),
                    duration(e.remaining_s)
                ),
                Some(e) => format!("eta {}{}", rough(e), duration(e.remaining_s)),
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
            format!("{}/{}", self.step, self.total),
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

/// `1h02m`, `4m05s`, `12s` (a negative time is `0s`).
pub fn duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The view of a set of jobs: bars in place on a terminal, plain frames elsewhere.
pub struct Board {
    title: String,
    /// `None` when stdout is not a terminal.
    bars: Option<Bars>,
}

/// A terminal's drawing: the header line and one bar per job id.
struct Bars {
    multi: MultiProgress,
    header: ProgressBar,
    style: ProgressStyle,
    jobs: HashMap<String, ProgressBar>,
}

impl Board {
    /// A board whose header line says `title`; bars when stdout is a terminal.
    pub fn new(title: &str) -> Board {
        let bars = std::io::stdout().is_terminal().then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
            let header = multi.add(ProgressBar::new_spinner());
            header.set_style(ProgressStyle::with_template("{msg}").expect("a valid template"));
            header.set_message(title.to_string());
            Bars {
                multi,
                header,
                style: ProgressStyle::with_template(
                    "{prefix:<12} [{bar:24.cyan/blue}] {percent:>3}% {msg}",
                )
                .expect("a valid template")
                .progress_chars("#>."),
                jobs: HashMap::new(),
            }
        });
        Board {
            title: title.to_string(),
            bars,
        }
    }

    /// Shows `jobs` (in the order given; jobs seen before keep their line) with `status` on
    /// the header line.
    pub fn update(&mut self, jobs: &[pb::Job], now_ms: i64, status: &str) {
        let Some(bars) = &mut self.bars else {
            println!("--- {} {status}", self.title);
            for j in jobs {
                println!("  {}", Row::of(j, now_ms).line());
            }
            return;
        };
        bars.header.set_message(format!("{} {status}", self.title));
        for j in jobs {
            let r = Row::of(j, now_ms);
            let bar = bars.jobs.entry(j.id.clone()).or_insert_with(|| {
                let b = bars.multi.add(ProgressBar::new(1000));
                b.set_style(bars.style.clone());
                b.set_prefix(r.name.clone());
                b
            });
            bar.set_position((r.done() * 1000.0).round() as u64);
            bar.set_message(r.detail());
        }
    }

    /// Leaves the last drawing on screen.
    pub fn finish(&mut self) {
        if let Some(bars) = &self.bars {
            bars.header.finish();
            bars.jobs.values().for_each(ProgressBar::finish);
        }
    }
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
        j.eta.as_mut().unwrap().basis = GUESS.into();
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
    }
}
