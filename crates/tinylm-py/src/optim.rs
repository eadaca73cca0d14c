//! `tinylm.optim`: the schedule, global-norm clipping and one AdamW step, in place on
//! the caller's float32 arrays (`tinylm::optim`).

use crate::arrays::{Floats, InPlace};
use crate::errors::{detached, invalid};
use pyo3::prelude::*;
use tinylm::kernels::cpu::adamw::adamw_step as adamw_kernel;
use tinylm::kernels::AdamWParams;
use tinylm::optim::clip_grad_norm_arrays;

fn iteration(value: i64, name: &str) -> PyResult<u64> {
    u64::try_from(value).map_err(|_| invalid(format!("{name} must be ≥ 0, got {value}")))
}

/// The learning rate at iteration `it`: linear warm-up to `max_learning_rate` over
/// `warmup_iters`, cosine decay to `min_learning_rate` at `cosine_cycle_iters`, then
/// `min_learning_rate`.
#[pyfunction]
pub fn lr_cosine_schedule(
    it: i64,
    max_learning_rate: f64,
    min_learning_rate: f64,
    warmup_iters: i64,
    cosine_cycle_iters: i64,
) -> PyResult<f64> {
    Ok(tinylm::optim::lr_cosine_schedule(
        iteration(it, "it")?,
        max_learning_rate,
        min_learning_rate,
        iteration(warmup_iters, "warmup_iters")?,
        iteration(cosine_cycle_iters, "cosine_cycle_iters")?,
    ))
}

/// Scales every gradient in place by `max_l2_norm / (norm + eps)` when their global
/// L2 norm exceeds `max_l2_norm`; returns the norm before clipping. `None` entries
/// (parameters without a gradient) are skipped.
#[pyfunction]
#[pyo3(signature = (grads, max_l2_norm, eps = 1e-6))]
pub fn clip_grad_norm_(
    py: Python<'_>,
    grads: Vec<Bound<'_, PyAny>>,
    max_l2_norm: f64,
    eps: f64,
) -> PyResult<f64> {
    let mut arrays = Vec::with_capacity(grads.len());
    for (i, g) in grads.iter().enumerate() {
        if !g.is_none() {
            arrays.push(InPlace::new(g, &format!("grads[{i}]"))?);
        }
    }
    let mut slices: Vec<&mut [f32]> = arrays.iter_mut().map(|a| a.data()).collect();
    if max_l2_norm.is_nan() || max_l2_norm < 0.0 {
        return Err(invalid(format!(
            "max_l2_norm must be non-negative, got {max_l2_norm}"
        )));
    }
    detached(py, || {
        Ok(clip_grad_norm_arrays(&mut slices, max_l2_norm, eps))
    })
}

/// One AdamW step (`step` counts from 1) in place on `param`, `exp_avg` and
/// `exp_avg_sq` (float32, C-contiguous, same size as `grad`):
/// `m ← β1 m + (1−β1) g`; `v ← β2 v + (1−β2) g²`;
/// `θ ← θ − lr·sqrt(1−β2^t)/(1−β1^t) · m/(sqrt(v)+eps)`; `θ ← θ − lr·λ·θ`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn adamw_step(
    py: Python<'_>,
    param: &Bound<'_, PyAny>,
    grad: &Bound<'_, PyAny>,
    exp_avg: &Bound<'_, PyAny>,
    exp_avg_sq: &Bound<'_, PyAny>,
    step: i64,
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
) -> PyResult<()> {
    if step < 1 {
        return Err(invalid(format!("step counts from 1, got {step}")));
    }
    let grad = Floats::new(grad, "grad")?;
    let mut p = InPlace::new(param, "param")?;
    let mut m = InPlace::new(exp_avg, "exp_avg")?;
    let mut v = InPlace::new(exp_avg_sq, "exp_avg_sq")?;
    for (shape, name) in [
        (&p.shape, "param"),
        (&m.shape, "exp_avg"),
        (&v.shape, "exp_avg_sq"),
    ] {
        if *shape != grad.shape {
            return Err(invalid(format!(
                "{name} has shape {shape:?} but grad has shape {:?}",
                grad.shape
            )));
        }
    }
    let hp = AdamWParams {
        beta1,
        beta2,
        eps,
        weight_decay,
    };
    let (p, m, v, g) = (p.data(), m.data(), v.data(), grad.data());
    detached(py, || {
        adamw_kernel(p, g, m, v, step as u64, lr, &hp, 1.0);
        Ok(())
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let optim = PyModule::new(m.py(), "optim")?;
    optim.add_function(wrap_pyfunction!(lr_cosine_schedule, &optim)?)?;
    optim.add_function(wrap_pyfunction!(clip_grad_norm_, &optim)?)?;
    optim.add_function(wrap_pyfunction!(adamw_step, &optim)?)?;
    m.add_submodule(&optim)
}
