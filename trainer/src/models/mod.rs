//! The models: what each trains on, its defaults, and the [`Model`] trait the training loop
//! drives. Each model lives in its own file; [`ModelKind`] is the registry.

use candle_core::{DType, Device, Tensor};

use crate::config::Config;
use crate::data::{self, Classification};
use crate::error::Result;
use crate::params::Params;
use crate::rng::batch_rows;

mod cnn;
mod gru;
mod logreg;
mod mlp;
mod vae;

/// A model ready to train: the loss of any step, and a held-out loss to report.
pub trait Model {
    /// The training loss of `step` (a scalar attached to the autograd graph). The batch and any
    /// noise are pure functions of the seed and `step`.
    fn train_loss(&self, step: u64) -> Result<Tensor>;
    /// The loss on the fixed held-out rows (deterministic given the weights).
    fn eval_loss(&self) -> Result<f64>;
    /// The fraction of held-out rows classified correctly, for classifiers; `None` for the
    /// others.
    fn eval_accuracy(&self) -> Option<Result<f64>> {
        None
    }
}

/// What a run reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Held-out loss, to minimize (every model).
    Loss,
    /// Held-out accuracy, to maximize (classifiers only).
    Accuracy,
}

impl Metric {
    /// The name on progress lines and in `--metric`.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Loss => "loss",
            Metric::Accuracy => "accuracy",
        }
    }

    /// Parses a `--metric` value.
    pub fn from_name(s: &str) -> Option<Self> {
        [Metric::Loss, Metric::Accuracy]
            .into_iter()
            .find(|m| m.name() == s)
    }

    /// Whether smaller or larger is better.
    pub fn direction(self) -> converge_contract::Direction {
        match self {
            Metric::Loss => converge_contract::Direction::Minimize,
            Metric::Accuracy => converge_contract::Direction::Maximize,
        }
    }
}

/// Default hyper-parameters of a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    /// `--steps`.
    pub steps: u64,
    /// `--batch`.
    pub batch: usize,
    /// `--lr`.
    pub lr: f64,
}

/// The models this trainer knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelKind {
    /// Two-hidden-layer perceptron classifying 8x8 digits.
    MlpDigits,
    /// Small convolutional network classifying 8x8 digits.
    CnnDigits,
    /// Softmax (multinomial logistic) regression on the standardized wine measurements.
    LogregWine,
    /// Variational autoencoder of 8x8 digits (reconstruction + KL loss).
    VaeDigits,
    /// GRU forecasting next week's Mauna Loa CO2 from 32 weeks of history.
    GruCo2,
}

impl ModelKind {
    /// Every model, in `--list-models` order.
    pub const ALL: [ModelKind; 5] = [
        ModelKind::MlpDigits,
        ModelKind::CnnDigits,
        ModelKind::LogregWine,
        ModelKind::VaeDigits,
        ModelKind::GruCo2,
    ];

    /// The `--model` name.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::MlpDigits => "mlp-digits",
            ModelKind::CnnDigits => "cnn-digits",
            ModelKind::LogregWine => "logreg-wine",
            ModelKind::VaeDigits => "vae-digits",
            ModelKind::GruCo2 => "gru-co2",
        }
    }

    /// Looks a model up by its `--model` name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// One line for `--list-models`.
    pub fn describe(self) -> &'static str {
        match self {
            ModelKind::MlpDigits => {
                "MLP 64-64s-64s-10 on 8x8 digits; cross-entropy (stands in for the MNIST MLP)"
            }
            ModelKind::CnnDigits => {
                "CNN conv3x3(8s)-pool-conv3x3(16s)-pool-linear on 8x8 digits; cross-entropy \
                 (stands in for the MNIST CNN)"
            }
            ModelKind::LogregWine => {
                "softmax regression on 13 standardized wine measurements; cross-entropy \
                 (logistic regression; --size has no effect)"
            }
            ModelKind::VaeDigits => {
                "VAE 64-64s-8 latent on 8x8 digits; negative ELBO per image (stands in for the VAE)"
            }
            ModelKind::GruCo2 => {
                "GRU (hidden 32s) forecasting weekly Mauna Loa CO2; MSE in units of the target \
                 deviation (stands in for the GRU/LSTM/Bi-RNN sequence models)"
            }
        }
    }

    /// Default steps, batch and learning rate: about where the held-out loss has flattened.
    pub fn defaults(self) -> Defaults {
        let (steps, batch, lr) = match self {
            ModelKind::MlpDigits => (1500, 32, 1e-3),
            ModelKind::CnnDigits => (1500, 32, 3e-3),
            ModelKind::LogregWine => (400, 16, 1e-2),
            ModelKind::VaeDigits => (3000, 32, 1e-3),
            ModelKind::GruCo2 => (800, 32, 3e-3),
        };
        Defaults { steps, batch, lr }
    }

    /// Training rows (the largest valid `--batch`).
    pub fn train_rows(self) -> usize {
        let rows = match self {
            ModelKind::MlpDigits | ModelKind::CnnDigits | ModelKind::VaeDigits => {
                data::digits().map(|d| d.train_y.len())
            }
            ModelKind::LogregWine => data::wine().map(|d| d.train_y.len()),
            ModelKind::GruCo2 => data::co2().map(|d| d.train_y.len()),
        };
        rows.unwrap_or(0)
    }

    /// Whether the model can report [`Metric::Accuracy`].
    pub fn is_classifier(self) -> bool {
        matches!(
            self,
            ModelKind::MlpDigits | ModelKind::CnnDigits | ModelKind::LogregWine
        )
    }
}

/// A model with its parameters.
pub struct Built {
    /// The model.
    pub model: Box<dyn Model>,
    /// Its trainable parameters (initialized from the seed).
    pub params: Params,
}

/// Builds `cfg.model` with fresh parameters drawn from `cfg.seed`.
pub fn build(cfg: &Config) -> Result<Built> {
    let params = Params::new(cfg.seed);
    let vb = params.builder();
    let model: Box<dyn Model> = match cfg.model {
        ModelKind::MlpDigits => Box::new(mlp::Mlp::new(cfg, vb)?),
        ModelKind::CnnDigits => Box::new(cnn::Cnn::new(cfg, vb)?),
        ModelKind::LogregWine => Box::new(logreg::Logreg::new(cfg, vb)?),
        ModelKind::VaeDigits => Box::new(vae::Vae::new(cfg, vb)?),
        ModelKind::GruCo2 => Box::new(gru::Gru::new(cfg, vb)?),
    };
    Ok(Built { model, params })
}

/// A classification dataset as tensors, with seeded mini-batches.
struct ClassTensors {
    train_x: Tensor,
    train_y: Tensor,
    eval_x: Tensor,
    eval_y: Tensor,
    rows: usize,
    seed: u64,
    batch: usize,
}

impl ClassTensors {
    fn new(d: &Classification, cfg: &Config) -> Result<Self> {
        let dev = &Device::Cpu;
        let (n, m) = (d.train_y.len(), d.eval_y.len());
        Ok(ClassTensors {
            train_x: Tensor::from_slice(&d.train_x, (n, d.features), dev)?,
            train_y: Tensor::from_slice(&d.train_y, n, dev)?,
            eval_x: Tensor::from_slice(&d.eval_x, (m, d.features), dev)?,
            eval_y: Tensor::from_slice(&d.eval_y, m, dev)?,
            rows: n,
            seed: cfg.seed,
            batch: cfg.batch,
        })
    }

    /// Fraction of held-out rows whose largest logit is the label.
    fn accuracy(&self, eval_logits: &Tensor) -> Result<f64> {
        let hits = eval_logits.argmax(1)?.eq(&self.eval_y)?;
        scalar(&hits.to_dtype(DType::F32)?.mean_all()?)
    }

    /// `(x, y)` of `step`'s mini-batch.
    fn batch(&self, step: u64) -> Result<(Tensor, Tensor)> {
        let ids = batch_rows(self.seed, self.rows, self.batch, step);
        let ids = Tensor::from_vec(ids, self.batch, &Device::Cpu)?;
        Ok((
            self.train_x.index_select(&ids, 0)?,
            self.train_y.index_select(&ids, 0)?,
        ))
    }
}

/// A scalar loss tensor as f64.
fn scalar(t: &Tensor) -> Result<f64> {
    Ok(f64::from(t.to_dtype(DType::F32)?.to_scalar::<f32>()?))
}
