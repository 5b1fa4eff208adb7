//! Adam, written out so its state can be saved and restored.
//!
//! Why not `candle_nn::AdamW`: its moment estimates are private, so a checkpoint could not carry
//! them and a resumed run would restart the moments from zero (a visible jump in the loss).
//! This is only the update rule; gradients come from candle's autograd.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use crate::error::Result;

/// Adam's hyper-parameters besides the learning rate (the usual defaults).
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;

/// Adam over a fixed list of named parameters.
pub struct Adam {
    lr: f64,
    params: Vec<(String, Var)>,
    /// First and second moment estimates, one pair per parameter, in `params` order.
    moments: Vec<(Tensor, Tensor)>,
    /// Updates applied so far (Adam's `t`, for bias correction).
    t: u64,
}

impl Adam {
    /// Fresh state (zero moments) for `params`.
    pub fn new(params: Vec<(String, Var)>, lr: f64) -> Result<Self> {
        let moments = params
            .iter()
            .map(|(_, v)| Ok((v.zeros_like()?, v.zeros_like()?)))
            .collect::<Result<_>>()?;
        Ok(Adam {
            lr,
            params,
            moments,
            t: 0,
        })
    }

    /// Updates applied so far.
    pub fn t(&self) -> u64 {
        self.t
    }

    /// One update from `grads`. A parameter with no gradient (unused by this loss) keeps its
    /// value and moments.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.t += 1;
        // Past 2^31 updates the bias corrections are exactly 1 anyway.
        let t = i32::try_from(self.t).unwrap_or(i32::MAX);
        let c1 = 1.0 - BETA1.powi(t);
        let c2 = 1.0 - BETA2.powi(t);
        for ((_, var), (m, v)) in self.params.iter().zip(self.moments.iter_mut()) {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            *m = ((m.affine(BETA1, 0.0)? + g.affine(1.0 - BETA1, 0.0)?)?).detach();
            *v = ((v.affine(BETA2, 0.0)? + g.sqr()?.affine(1.0 - BETA2, 0.0)?)?).detach();
            let m_hat = m.affine(1.0 / c1, 0.0)?;
            let v_hat = v.affine(1.0 / c2, 0.0)?;
            let delta = (m_hat / v_hat.sqrt()?.affine(1.0, EPS)?)?.affine(self.lr, 0.0)?;
            var.set(&var.as_tensor().sub(&delta)?.detach())?;
        }
        Ok(())
    }

    /// The state to checkpoint: `adam.m/<name>` and `adam.v/<name>` tensors (`t` is saved
    /// by the caller).
    pub fn state(&self) -> HashMap<String, Tensor> {
        let mut out = HashMap::new();
        for ((name, _), (m, v)) in self.params.iter().zip(&self.moments) {
            out.insert(format!("adam.m/{name}"), m.clone());
            out.insert(format!("adam.v/{name}"), v.clone());
        }
        out
    }

    /// Restores moments from [`Adam::state`] output and `t`. Returns the name of the first
    /// missing or mis-shaped tensor, if any.
    pub fn restore(
        &mut self,
        tensors: &HashMap<String, Tensor>,
        t: u64,
    ) -> std::result::Result<(), String> {
        for ((name, var), (m, v)) in self.params.iter().zip(self.moments.iter_mut()) {
            for (prefix, slot) in [("adam.m", m), ("adam.v", v)] {
                let key = format!("{prefix}/{name}");
                let src = tensors
                    .get(&key)
                    .ok_or_else(|| format!("missing tensor {key}"))?;
                if src.shape() != var.shape() {
                    return Err(format!(
                        "tensor {key} has shape {:?}, expected {:?}",
                        src.shape(),
                        var.shape()
                    ));
                }
                *slot = src.clone();
            }
        }
        self.t = t;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn adam_minimizes_a_quadratic() {
        let x = Var::new(&[3.0f32, -2.0], &Device::Cpu).unwrap();
        let mut opt = Adam::new(vec![("x".into(), x.clone())], 0.1).unwrap();
        for _ in 0..300 {
            let loss = x.as_tensor().sqr().unwrap().sum_all().unwrap();
            opt.step(&loss.backward().unwrap()).unwrap();
        }
        let v = x.as_tensor().to_vec1::<f32>().unwrap();
        assert!(v.iter().all(|x| x.abs() < 0.05), "{v:?}");
        assert_eq!(opt.t(), 300);
    }
}
