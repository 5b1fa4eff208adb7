//! Convolutional classifier on the digits: two conv/pool stages, then a linear read-out.

use candle_core::{Module, Tensor};
use candle_nn::{Conv2d, Conv2dConfig, Linear, VarBuilder, conv2d, linear};

use super::{ClassTensors, Model, scalar};
use crate::config::Config;
use crate::data;
use crate::error::Result;

/// 1x8x8 → conv3x3(8s) → pool → 4x4 → conv3x3(16s) → pool → 2x2 → 10 logits.
pub struct Cnn {
    data: ClassTensors,
    conv1: Conv2d,
    conv2: Conv2d,
    out: Linear,
}

impl Cnn {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let d = data::digits()?;
        let (c1, c2) = (8 * cfg.size, 16 * cfg.size);
        let same = Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        Ok(Cnn {
            data: ClassTensors::new(d, cfg)?,
            conv1: conv2d(1, c1, 3, same, vb.pp("conv1"))?,
            conv2: conv2d(c1, c2, 3, same, vb.pp("conv2"))?,
            out: linear(c2 * 2 * 2, d.classes, vb.pp("out"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let n = x.dim(0)?;
        let x = x.reshape((n, 1, 8, 8))?;
        let x = self.conv1.forward(&x)?.relu()?.max_pool2d(2)?;
        let x = self.conv2.forward(&x)?.relu()?.max_pool2d(2)?;
        Ok(self.out.forward(&x.flatten_from(1)?)?)
    }
}

impl Model for Cnn {
    fn train_loss(&self, step: u64) -> Result<Tensor> {
        let (x, y) = self.data.batch(step)?;
        Ok(candle_nn::loss::cross_entropy(&self.forward(&x)?, &y)?)
    }

    fn eval_loss(&self) -> Result<f64> {
        let logits = self.forward(&self.data.eval_x)?;
        scalar(&candle_nn::loss::cross_entropy(&logits, &self.data.eval_y)?)
    }

    fn eval_accuracy(&self) -> Option<Result<f64>> {
        Some(
            self.forward(&self.data.eval_x)
                .and_then(|logits| self.data.accuracy(&logits)),
        )
    }
}
