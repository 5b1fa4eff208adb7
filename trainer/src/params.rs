//! The parameter store: candle-nn layers ask it for their weights by name, and it creates them
//! from the layer's own initializer but with draws from `(seed, parameter name)`.
//!
//! Why not candle's `VarMap`: it initializes from an unseeded thread RNG, so two runs with the
//! same `--seed` would start from different weights. Keying each parameter's stream by its
//! name makes initial weights independent of construction order too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::init::NormalOrUniform;
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use crate::rng::{Purpose, name_index, normals, stream, uniforms};

/// All trainable parameters of a model, by name (sorted, so iteration order is stable).
#[derive(Clone, Default)]
pub struct Params {
    vars: Arc<Mutex<BTreeMap<String, Var>>>,
    seed: u64,
}

impl Params {
    /// An empty store whose parameters will be drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Params {
            vars: Arc::default(),
            seed,
        }
    }

    /// A candle-nn `VarBuilder` (f32, CPU) that creates parameters in this store.
    pub fn builder(&self) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self.clone()), DType::F32, Device::Cpu)
    }

    /// Every parameter, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Number of scalar parameters.
    pub fn count(&self) -> usize {
        self.lock().values().map(|v| v.elem_count()).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Var>> {
        self.vars.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn create(&self, shape: &Shape, name: &str, init: Init) -> candle_core::Result<Var> {
        let n = shape.elem_count();
        let mut rng = stream(self.seed, Purpose::Init, name_index(name));
        let values = match init {
            Init::Const(c) => vec![c as f32; n],
            Init::Uniform { lo, up } => uniforms(&mut rng, n, lo, up),
            Init::Randn { mean, stdev } => normals(&mut rng, n)
                .into_iter()
                .map(|z| (mean + stdev * f64::from(z)) as f32)
                .collect(),
            Init::Kaiming {
                dist,
                fan,
                non_linearity,
            } => {
                // The same formula as candle-nn's `Init::var`, with our stream.
                let std = non_linearity.gain() / (fan.for_shape(shape) as f64).sqrt();
                match dist {
                    NormalOrUniform::Uniform => {
                        let bound = 3f64.sqrt() * std;
                        uniforms(&mut rng, n, -bound, bound)
                    }
                    NormalOrUniform::Normal => normals(&mut rng, n)
                        .into_iter()
                        .map(|z| (std * f64::from(z)) as f32)
                        .collect(),
                }
            }
        };
        Var::from_tensor(&Tensor::from_vec(values, shape.clone(), &Device::Cpu)?)
    }
}

impl SimpleBackend for Params {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if let Some(v) = self.lock().get(name) {
            if v.shape() != &s {
                candle_core::bail!(
                    "parameter {name} exists with shape {:?}, requested {s:?}",
                    v.shape()
                );
            }
            return Ok(v.as_tensor().clone());
        }
        let var = self.create(&s, name, h)?;
        if var.dtype() != dtype {
            candle_core::bail!("parameter {name}: only f32 is supported, requested {dtype:?}");
        }
        let t = var.as_tensor().clone();
        self.lock().insert(name.to_string(), var);
        Ok(t)
    }

    fn get_unchecked(
        &self,
        name: &str,
        _dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        match self.lock().get(name) {
            Some(v) => Ok(v.as_tensor().clone()),
            None => candle_core::bail!("parameter {name} does not exist"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.lock().contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_weights_different_seed_different_weights() {
        let weights = |seed| {
            let p = Params::new(seed);
            let l = candle_nn::linear(4, 3, p.builder().pp("fc")).unwrap();
            l.weight().flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        assert_eq!(weights(1), weights(1));
        assert_ne!(weights(1), weights(2));
    }
}
