//! Multi-layer perceptron on the digits: the simplest "MNIST-like" classifier.

use candle_core::{Module, Tensor};
use candle_nn::{Linear, VarBuilder, linear};

use super::{ClassTensors, Model, scalar};
use crate::config::Config;
use crate::data;
use crate::error::Result;

/// 64 inputs, two ReLU layers of `64 * size`, 10 logits.
pub struct Mlp {
    data: ClassTensors,
    layers: [Linear; 3],
}

impl Mlp {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let d = data::digits()?;
        let h = 64 * cfg.size;
        Ok(Mlp {
            data: ClassTensors::new(d, cfg)?,
            layers: [
                linear(d.features, h, vb.pp("fc1"))?,
                linear(h, h, vb.pp("fc2"))?,
                linear(h, d.classes, vb.pp("fc3"))?,
            ],
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [a, b, c] = &self.layers;
        let x = a.forward(x)?.relu()?;
        let x = b.forward(&x)?.relu()?;
        Ok(c.forward(&x)?)
    }
}

impl Model for Mlp {
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
