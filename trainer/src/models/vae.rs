//! Variational autoencoder of the digits. Its loss is the negative evidence lower bound per
//! image: Bernoulli reconstruction cross-entropy over the 64 pixels plus the KL divergence of
//! the approximate posterior from a standard normal prior.

use candle_core::{Device, Module, Tensor};
use candle_nn::{Linear, VarBuilder, linear};

use super::{ClassTensors, Model, scalar};
use crate::config::Config;
use crate::data;
use crate::error::Result;
use crate::rng::{Purpose, normals, stream};

/// Latent dimensions.
const LATENT: usize = 8;

/// Encoder 64 → 64s → (mean, log-variance) of 8 latents; decoder 8 → 64s → 64 pixel logits.
pub struct Vae {
    data: ClassTensors,
    enc: Linear,
    mu: Linear,
    logvar: Linear,
    dec: Linear,
    out: Linear,
    seed: u64,
    /// Fixed reparameterization noise for the held-out loss, so it moves only with the weights.
    eval_noise: Tensor,
}

impl Vae {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let d = data::digits()?;
        let h = 64 * cfg.size;
        let m = d.eval_y.len();
        // Seed 0, not --seed: held-out losses of runs with different seeds stay comparable.
        let eval_noise = normals(&mut stream(0, Purpose::EvalNoise, 0), m * LATENT);
        Ok(Vae {
            data: ClassTensors::new(d, cfg)?,
            enc: linear(d.features, h, vb.pp("enc"))?,
            mu: linear(h, LATENT, vb.pp("mu"))?,
            logvar: linear(h, LATENT, vb.pp("logvar"))?,
            dec: linear(LATENT, h, vb.pp("dec"))?,
            out: linear(h, d.features, vb.pp("out"))?,
            seed: cfg.seed,
            eval_noise: Tensor::from_vec(eval_noise, (m, LATENT), &Device::Cpu)?,
        })
    }

    /// Mean negative ELBO of the images `x` with reparameterization noise `eps`.
    fn loss(&self, x: &Tensor, eps: &Tensor) -> Result<Tensor> {
        let h = self.enc.forward(x)?.relu()?;
        let mu = self.mu.forward(&h)?;
        let logvar = self.logvar.forward(&h)?;
        let z = (&mu + (logvar.affine(0.5, 0.0)?.exp()? * eps)?)?;
        let logits = self.out.forward(&self.dec.forward(&z)?.relu()?)?;
        // Cross-entropy with logits, in the overflow-free form
        // max(l, 0) - l*x + log(1 + exp(-|l|)).
        let softplus_tail = (logits.abs()?.neg()?.exp()? + 1.0)?.log()?;
        let recon = ((logits.relu()? - (&logits * x)?)? + softplus_tail)?.sum(1)?;
        let kl = ((logvar.exp()? + mu.sqr()?)? - logvar)?
            .affine(1.0, -1.0)?
            .sum(1)?
            .affine(0.5, 0.0)?;
        Ok((recon + kl)?.mean_all()?)
    }
}

impl Model for Vae {
    fn train_loss(&self, step: u64) -> Result<Tensor> {
        let (x, _) = self.data.batch(step)?;
        let n = x.dim(0)?;
        let eps = normals(&mut stream(self.seed, Purpose::StepNoise, step), n * LATENT);
        let eps = Tensor::from_vec(eps, (n, LATENT), &Device::Cpu)?;
        self.loss(&x, &eps)
    }

    fn eval_loss(&self) -> Result<f64> {
        scalar(&self.loss(&self.data.eval_x, &self.eval_noise)?)
    }
}
