//! Randomness as a pure function of `(seed, purpose, index)`.
//!
//! Why: a checkpoint must carry the full RNG state for an exact resume. Rather than serialize
//! generator states, every random draw comes from a fresh ChaCha stream keyed by the seed, what
//! the draw is for, and the step (or epoch, or parameter name) it belongs to. Resuming at step
//! `s` then draws exactly what an uninterrupted run draws at step `s`, by construction, and the
//! checkpoint only needs the seed and the step.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What a random stream is used for; part of its key so streams never overlap.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub enum Purpose {
    /// Initial value of one parameter (index: hash of its name).
    Init = 1,
    /// Order of the training rows in one epoch (index: the epoch).
    DataOrder = 2,
    /// Sampling noise of one training step (index: the step).
    StepNoise = 3,
    /// Fixed noise used when evaluating (index: 0).
    EvalNoise = 4,
    /// The fixed train/held-out split of a dataset (independent of `--seed`).
    Split = 5,
}

/// The generator for `(seed, purpose, index)`.
pub fn stream(seed: u64, purpose: Purpose, index: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&(purpose as u64).to_le_bytes());
    key[16..24].copy_from_slice(&index.to_le_bytes());
    ChaCha8Rng::from_seed(key)
}

/// FNV-1a of a name: a stable (build- and platform-independent) stream index for it.
pub fn name_index(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `n` standard normal draws (Box-Muller; computed in f64 for accuracy, stored as f32).
pub fn normals(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        // 1 - u keeps the logarithm's argument in (0, 1].
        let u1: f64 = 1.0 - rng.random::<f64>();
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        out.push((r * t.cos()) as f32);
        out.push((r * t.sin()) as f32);
    }
    out.truncate(n);
    out
}

/// `n` draws uniform in `[lo, hi)`.
pub fn uniforms(rng: &mut ChaCha8Rng, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..n)
        .map(|_| (lo + (hi - lo) * rng.random::<f64>()) as f32)
        .collect()
}

/// The training rows of `step`: each epoch visits every row once in an order drawn from
/// `(seed, epoch)`; the last `rows % batch` rows of an epoch's order are left out.
pub fn batch_rows(seed: u64, rows: usize, batch: usize, step: u64) -> Vec<u32> {
    let per_epoch = (rows / batch).max(1) as u64;
    let (epoch, pos) = (step / per_epoch, (step % per_epoch) as usize);
    let mut order: Vec<u32> = (0..rows as u32).collect();
    order.shuffle(&mut stream(seed, Purpose::DataOrder, epoch));
    order[pos * batch..(pos + 1) * batch].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_each_row_once_per_epoch() {
        let mut seen: Vec<u32> = (0..10).flat_map(|s| batch_rows(7, 100, 10, s)).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        // The next epoch is a different order, and the same step always gives the same rows.
        assert_ne!(batch_rows(7, 100, 10, 0), batch_rows(7, 100, 10, 10));
        assert_eq!(batch_rows(7, 100, 10, 13), batch_rows(7, 100, 10, 13));
    }

    #[test]
    fn normals_look_standard() {
        let v = normals(&mut stream(1, Purpose::StepNoise, 0), 20_000);
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
    }
}
