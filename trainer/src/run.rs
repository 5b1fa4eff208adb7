//! The training loop: restore or start fresh, step, report, checkpoint, stop cleanly.
//!
//! [`train`] is the whole life of one incarnation of a job. It is a library function with the
//! stop signal and the output stream passed in, so tests drive the same code `main` does and
//! can interrupt at an exact step.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Tensor, Var};
use converge_contract::{CheckpointEvent, ProgressLine};

use crate::checkpoint::{self, Header};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::models::{self, Metric, Model};
use crate::optim::Adam;

/// How a call to [`train`] ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Steps completed (across restarts).
    pub step: u64,
    /// Whether all `--steps` are done (`false`: stopped early by the stop signal).
    pub finished: bool,
    /// The last held-out metric value reported.
    pub last_value: Option<f64>,
    /// Size of the last checkpoint written, if one was.
    pub saved_bytes: Option<u64>,
    /// The step a checkpoint was restored from, if one was.
    pub restored_from: Option<u64>,
}

/// Trains `cfg` on a pool of `cfg.threads` threads, printing progress lines to `out`.
///
/// `should_stop(step)` is asked before every step (`step` = steps completed so far); when it
/// says yes, the state is saved (if there is a checkpoint directory) and `train` returns with
/// `finished == false`. With a checkpoint present in `cfg.checkpoint_dir`, training resumes from
/// it; a checkpoint that is damaged or belongs to another run is an error, never ignored.
pub fn train(
    cfg: &Config,
    should_stop: &(dyn Fn(u64) -> bool + Sync),
    out: &mut (dyn Write + Send),
) -> Result<Outcome> {
    cfg.validate()?;
    // candle's CPU kernels (gemm, conv) fan out on the *current* rayon pool; running the whole
    // loop inside a pool of `threads` threads is what makes `--threads 1` use one core.
    pool(cfg.threads)?.install(|| Run::new(cfg, out)?.go(should_stop))
}

/// The pool a run trains on: `threads` threads, each treating subnormal floats as zero.
fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("trainer-{i}"))
        .start_handler(|_| flush_denormals())
        .build()
        .map_err(|e| Error::ThreadPool {
            threads,
            why: e.to_string(),
        })
}

/// Treats subnormal floats as zero on this thread (x86's FTZ and DAZ bits in MXCSR), as
/// TensorFlow's and oneDNN's CPU kernels do. As a model converges, some of its weights,
/// gradients and Adam moments reach subnormal magnitudes, and an Intel core takes on the order
/// of a hundred cycles for each operation on one: on a Xeon, a `vae-digits --size 32` job's
/// step time more than doubled over 20,000 steps, so a step time measured in a job's first
/// seconds said nothing of its last ones. The values flushed are below 1.2e-38, far under
/// anything a loss or an update can tell apart.
fn flush_denormals() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: MXCSR holds this thread's SSE rounding and exception settings; setting FTZ
    // (bit 15) and DAZ (bit 6) changes only how this thread's float results round near zero.
    #[allow(deprecated, unsafe_code)]
    unsafe {
        use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
        _mm_setcsr(_mm_getcsr() | 0x8040);
    }
}

struct Run<'a> {
    cfg: &'a Config,
    out: &'a mut (dyn Write + Send),
    model: Box<dyn Model>,
    vars: Vec<(String, Var)>,
    opt: Adam,
    step: u64,
    elapsed_before: f64,
    started: Instant,
    ckpt: Option<PathBuf>,
}

impl<'a> Run<'a> {
    fn new(cfg: &'a Config, out: &'a mut (dyn Write + Send)) -> Result<Self> {
        let built = models::build(cfg)?;
        let vars = built.params.vars();
        let opt = Adam::new(vars.clone(), cfg.lr)?;
        Ok(Run {
            cfg,
            out,
            model: built.model,
            vars,
            opt,
            step: 0,
            elapsed_before: 0.0,
            started: Instant::now(),
            ckpt: cfg.checkpoint_dir.as_deref().map(checkpoint::path_in),
        })
    }

    fn go(mut self, should_stop: &(dyn Fn(u64) -> bool + Sync)) -> Result<Outcome> {
        let restored_from = self.restore()?;
        let mut last_value = Some(self.evaluate()?);
        let mut first = self.line(last_value);
        if restored_from.is_some() {
            first.checkpoint = Some(CheckpointEvent::Restored);
        }
        self.emit(&first)?;

        let total = self.cfg.steps;
        let mut saved_bytes = None;
        while self.step < total {
            if should_stop(self.step) {
                saved_bytes = self.save()?;
                return Ok(Outcome {
                    step: self.step,
                    finished: false,
                    last_value,
                    saved_bytes,
                    restored_from,
                });
            }
            let loss = self.model.train_loss(self.step)?;
            let value = f64::from(loss.to_scalar::<f32>()?);
            if !value.is_finite() {
                return Err(Error::Diverged {
                    step: self.step,
                    value,
                });
            }
            self.opt.step(&loss.backward()?)?;
            self.step += 1;
            if self.step < total && self.step.is_multiple_of(self.cfg.report_every) {
                last_value = Some(self.evaluate()?);
                let l = self.line(last_value);
                self.emit(&l)?;
            }
            if self.step < total
                && self.cfg.checkpoint_every > 0
                && self.step.is_multiple_of(self.cfg.checkpoint_every)
            {
                saved_bytes = self.save()?;
            }
        }
        // Saved before the final line so that a restarted container finds the finished state
        // and reports `done` again instead of training anew.
        saved_bytes = self.save()?.or(saved_bytes);
        last_value = Some(self.evaluate()?);
        let mut done = self.line(last_value);
        done.done = true;
        self.emit(&done)?;
        Ok(Outcome {
            step: self.step,
            finished: true,
            last_value,
            saved_bytes,
            restored_from,
        })
    }

    /// Loads the checkpoint if there is one; returns its step.
    fn restore(&mut self) -> Result<Option<u64>> {
        let Some(path) = self.ckpt.clone() else {
            return Ok(None);
        };
        if !path.exists() {
            return Ok(None);
        }
        let ck = checkpoint::load(&path)?;
        ck.header.check_compatible(self.cfg, &path)?;
        let corrupt = |why: String| Error::CorruptCheckpoint {
            path: path.clone(),
            why,
        };
        for (name, var) in &self.vars {
            let key = format!("param/{name}");
            let t = ck
                .tensors
                .get(&key)
                .ok_or_else(|| corrupt(format!("missing tensor {key}")))?;
            if t.shape() != var.shape() {
                return Err(corrupt(format!(
                    "tensor {key} has shape {:?}, the model has {:?}",
                    t.shape(),
                    var.shape()
                )));
            }
            var.set(t)?;
        }
        self.opt
            .restore(&ck.tensors, ck.header.adam_t)
            .map_err(corrupt)?;
        self.step = ck.header.step;
        self.elapsed_before = ck.header.elapsed_s;
        Ok(Some(ck.header.step))
    }

    /// Writes the checkpoint (when there is a directory) and reports it.
    fn save(&mut self) -> Result<Option<u64>> {
        let Some(path) = self.ckpt.clone() else {
            return Ok(None);
        };
        let elapsed = self.elapsed();
        let header = Header::for_config(self.cfg, self.step, elapsed, self.opt.t());
        let mut tensors: HashMap<String, Tensor> = self.opt.state();
        for (name, var) in &self.vars {
            tensors.insert(format!("param/{name}"), var.as_tensor().clone());
        }
        let bytes = checkpoint::save(&path, &header, &tensors)?;
        let mut l = self.line(None);
        // The time the checkpoint records, so the next incarnation's first line never reports
        // less time than this one's last.
        l.elapsed_s = Some(elapsed);
        l.checkpoint = Some(CheckpointEvent::Saved);
        l.checkpoint_bytes = Some(bytes);
        self.emit(&l)?;
        Ok(Some(bytes))
    }

    /// The reported metric, on the held-out rows.
    fn evaluate(&self) -> Result<f64> {
        match self.cfg.metric {
            Metric::Loss => self.model.eval_loss(),
            Metric::Accuracy => self.model.eval_accuracy().unwrap_or_else(|| {
                Err(Error::InvalidConfig {
                    flag: "--metric",
                    why: format!("{} does not report accuracy", self.cfg.model.name()),
                })
            }),
        }
    }

    fn elapsed(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }

    fn line(&self, value: Option<f64>) -> ProgressLine {
        ProgressLine {
            step: self.step,
            total_steps: Some(self.cfg.steps),
            metric: Some(self.cfg.metric.name().to_string()),
            value,
            direction: Some(self.cfg.metric.direction()),
            elapsed_s: Some(self.elapsed()),
            ..ProgressLine::default()
        }
    }

    fn emit(&mut self, l: &ProgressLine) -> Result<()> {
        // One `write` per line: a reader that interleaves stdout and stderr by chunk (as
        // container log collectors do) then never sees a progress line split.
        let mut text = l.to_line();
        text.push('\n');
        self.out.write_all(text.as_bytes()).map_err(Error::Output)?;
        self.out.flush().map_err(Error::Output)
    }
}

#[cfg(test)]
mod tests {
    use std::hint::black_box;

    /// Half the smallest normal f32 is subnormal; a thread that flushes subnormals gets zero.
    fn half_of_smallest_normal() -> f32 {
        black_box(f32::MIN_POSITIVE) * black_box(0.5)
    }

    #[test]
    fn training_threads_flush_subnormals_to_zero() {
        // The test's own thread keeps IEEE subnormals (no flag set here)...
        assert!(half_of_smallest_normal().is_subnormal());
        // ...and every thread of the training pool flushes them.
        let pool = super::pool(2).unwrap();
        let seen: Vec<f32> = pool.broadcast(|_| half_of_smallest_normal());
        assert_eq!(seen, vec![0.0, 0.0]);
    }
}
