//! Softmax regression on the wine measurements: a convex problem, so its curve is the
//! smoothest of the set.

use candle_core::{Module, Tensor};
use candle_nn::{Linear, VarBuilder, linear};

use super::{ClassTensors, Model, scalar};
use crate::config::Config;
use crate::data;
use crate::error::Result;

/// One linear layer from 13 standardized features to 3 class logits.
pub struct Logreg {
    data: ClassTensors,
    linear: Linear,
}

impl Logreg {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let d = data::wine()?;
        Ok(Logreg {
            data: ClassTensors::new(d, cfg)?,
            linear: linear(d.features, d.classes, vb.pp("linear"))?,
        })
    }
}

impl Model for Logreg {
    fn train_loss(&self, step: u64) -> Result<Tensor> {
        let (x, y) = self.data.batch(step)?;
        Ok(candle_nn::loss::cross_entropy(
            &self.linear.forward(&x)?,
            &y,
        )?)
    }

    fn eval_loss(&self) -> Result<f64> {
        let logits = self.linear.forward(&self.data.eval_x)?;
        scalar(&candle_nn::loss::cross_entropy(&logits, &self.data.eval_y)?)
    }

    fn eval_accuracy(&self) -> Option<Result<f64>> {
        Some(
            self.linear
                .forward(&self.data.eval_x)
                .map_err(Into::into)
                .and_then(|logits| self.data.accuracy(&logits)),
        )
    }
}
