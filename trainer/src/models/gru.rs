//! GRU forecaster on the weekly CO2 series: reads 32 weeks, predicts the next one.

use candle_core::{Device, Module, Tensor};
use candle_nn::rnn::{GRU, GRUConfig, RNN, gru};
use candle_nn::{Linear, VarBuilder, linear};

use super::{Model, scalar};
use crate::config::Config;
use crate::data;
use crate::error::Result;
use crate::rng::batch_rows;

/// One GRU layer of `32 * size` units over the window; a linear read-out of its last state.
pub struct Gru {
    train_x: Tensor,
    train_y: Tensor,
    eval_x: Tensor,
    eval_y: Tensor,
    rows: usize,
    seed: u64,
    batch: usize,
    gru: GRU,
    out: Linear,
}

impl Gru {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let d = data::co2()?;
        let dev = &Device::Cpu;
        let (n, m, w) = (d.train_y.len(), d.eval_y.len(), d.window);
        let h = 32 * cfg.size;
        Ok(Gru {
            train_x: Tensor::from_slice(&d.train_x, (n, w), dev)?,
            train_y: Tensor::from_slice(&d.train_y, n, dev)?,
            eval_x: Tensor::from_slice(&d.eval_x, (m, w), dev)?,
            eval_y: Tensor::from_slice(&d.eval_y, m, dev)?,
            rows: n,
            seed: cfg.seed,
            batch: cfg.batch,
            gru: gru(1, h, GRUConfig::default(), vb.pp("gru"))?,
            out: linear(h, 1, vb.pp("out"))?,
        })
    }

    /// Predictions for windows `x` of shape (batch, window).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let states = self.gru.seq(&x.unsqueeze(2)?)?;
        let last = &states.last().expect("window is not empty").h;
        Ok(self.out.forward(last)?.squeeze(1)?)
    }
}

impl Model for Gru {
    fn train_loss(&self, step: u64) -> Result<Tensor> {
        let ids = batch_rows(self.seed, self.rows, self.batch, step);
        let ids = Tensor::from_vec(ids, self.batch, &Device::Cpu)?;
        let x = self.train_x.index_select(&ids, 0)?;
        let y = self.train_y.index_select(&ids, 0)?;
        Ok(candle_nn::loss::mse(&self.forward(&x)?, &y)?)
    }

    fn eval_loss(&self) -> Result<f64> {
        scalar(&candle_nn::loss::mse(
            &self.forward(&self.eval_x)?,
            &self.eval_y,
        )?)
    }
}
