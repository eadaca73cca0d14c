//! `tinylm._tinylm.nn`: the CS336 layer functions on the model's kernels
//! (`tinylm::kernels`), NumPy in and float32 NumPy out. `python/tinylm/nn.py`
//! re-exports them; for `rope`, `softmax`, `scaled_dot_product_attention` and
//! `multihead_self_attention` it first does the array plumbing in NumPy
//! (broadcasting, axis moves, the mask's dtype), so those here take fixed ranks.

use crate::arrays::{output, token_ids, Floats};
use crate::errors::{detached, invalid, model_error};
use crate::model::{params_from_state_dict, read_tensors};
use numpy::{PyArrayDyn, PyReadonlyArray3, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tinylm::kernels::cpu as kernels;
use tinylm::kernels::cpu::rope::rope_tables;
use tinylm::kernels::{AttnShape, Float, MatMul};
use tinylm::params::ParamLayout;
use tinylm::{Model, ModelConfig};

/// The CS336 layer functions on the model's kernels (`tinylm.nn` re-exports them).
#[pymodule(name = "nn", submodule)]
pub mod module {
    #[pymodule_export]
    use super::{
        cross_entropy, embedding, linear, multihead_self_attention, rmsnorm, rope,
        scaled_dot_product_attention, silu, softmax, swiglu, transformer_block, transformer_lm,
    };
}

type Out<'py> = PyResult<Bound<'py, PyArrayDyn<f32>>>;

/// `y (N, out) = x (N, in) · Wᵀ`, `W (out, in)`.
fn linear_op(x: &[f32], w: &[f32], n: usize, d_in: usize, d_out: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * d_out];
    kernels::linear::matmul(&mut out, x, w, MatMul::linear(n, d_in, d_out));
    out
}

/// RoPE tables `(rows, D/2)`, one row per position of `token_positions (rows,)`
/// (each in `[0, max_seq_len)`): rows of the kernels' table up to the largest.
fn rope_rows(
    token_positions: &Bound<'_, PyAny>,
    rows: usize,
    d: usize,
    theta: f64,
    max_seq_len: usize,
) -> PyResult<(Vec<f32>, Vec<f32>)> {
    if !d.is_multiple_of(2) {
        return Err(invalid(format!("RoPE needs an even dimension, got {d}")));
    }
    if !(theta.is_finite() && theta > 0.0) {
        return Err(invalid(format!("theta must be positive, got {theta}")));
    }
    let (shape, positions) = token_ids(token_positions, "token_positions", max_seq_len)?;
    if shape != [rows] {
        return Err(invalid(format!(
            "token_positions: expected shape [{rows}], got {shape:?}"
        )));
    }
    let len = positions.iter().max().map_or(0, |&p| p as usize + 1);
    let (cos, sin) = rope_tables::<f32>(len, d, theta);
    let half = d / 2;
    let gather = |table: &[f32]| -> Vec<f32> {
        (positions.iter())
            .flat_map(|&p| &table[p as usize * half..(p as usize + 1) * half])
            .copied()
            .collect()
    };
    Ok((gather(&cos), gather(&sin)))
}

/// Rotates the query and key parts of `qkv (rows, 3·H·D)` by each row's RoPE
/// tables `(rows, D/2)`.
fn rotate(qkv: &mut [f32], (cos, sin): &(Vec<f32>, Vec<f32>), rows: usize, h: usize, d: usize) {
    if !qkv.is_empty() {
        let shape = AttnShape {
            b: 1,
            t: rows,
            h,
            d,
            q0: 0,
        };
        kernels::rope::rope(qkv, cos, sin, shape, false);
    }
}

/// `x Wᵀ` over any leading dims: `x (..., d_in)`, `weight (d_out, d_in)`.
#[pyfunction]
pub fn linear<'py>(py: Python<'py>, x: &Bound<'py, PyAny>, weight: &Bound<'py, PyAny>) -> Out<'py> {
    let (x, w) = (Floats::new(x, "x")?, Floats::new(weight, "weight")?);
    x.expect_ndim("x", 1, false)?;
    let [d_out, d_in] = w.dims("weight")?;
    if x.last() != d_in {
        return Err(invalid(format!(
            "x has {} features but weight {:?} expects {d_in}",
            x.last(),
            w.shape
        )));
    }
    let (n, xd, wd) = (x.rows(), x.data(), w.data());
    let out = detached(py, || Ok(linear_op(xd, wd, n, d_in, d_out)))?;
    let mut shape = x.shape.clone();
    *shape.last_mut().expect("ndim >= 1") = d_out;
    Ok(output(py, &shape, out))
}

/// Rows of `weight (vocab, d)` at `token_ids` (any integer dtype and shape).
#[pyfunction]
pub fn embedding<'py>(
    py: Python<'py>,
    token_ids: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
) -> Out<'py> {
    let w = Floats::new(weight, "weight")?;
    let [vocab, d] = w.dims("weight")?;
    let (mut shape, ids) = crate::arrays::token_ids(token_ids, "token_ids", vocab)?;
    let wd = w.data();
    let out = detached(py, || {
        let mut out = vec![0.0; ids.len() * d];
        if d > 0 {
            kernels::embedding::embedding_forward(&mut out, &ids, wd);
        }
        Ok(out)
    })?;
    shape.push(d);
    Ok(output(py, &shape, out))
}

/// RMSNorm over the last axis: `x / sqrt(mean(x²) + eps) * weight`.
#[pyfunction]
#[pyo3(signature = (x, weight, eps = 1e-5))]
pub fn rmsnorm<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    eps: f64,
) -> Out<'py> {
    let (x, g) = (Floats::new(x, "x")?, Floats::new(weight, "weight")?);
    x.expect_ndim("x", 1, false)?;
    g.expect_shape("weight", &[x.last()])?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(invalid(format!("eps must be positive, got {eps}")));
    }
    let (n, xd, gd) = (x.rows(), x.data(), g.data());
    let out = detached(py, || {
        let (mut out, mut rstd) = (vec![0.0; xd.len()], vec![0.0; n]);
        if !gd.is_empty() {
            kernels::rmsnorm::rmsnorm_forward(&mut out, &mut rstd, xd, gd, eps);
        }
        Ok(out)
    })?;
    Ok(output(py, &x.shape, out))
}

/// `x · sigmoid(x)` elementwise.
#[pyfunction]
pub fn silu<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    let xd = x.data();
    let out = detached(py, || {
        let mut out = vec![0.0; xd.len()];
        kernels::swiglu::swiglu_forward(&mut out, xd, None);
        Ok(out)
    })?;
    Ok(output(py, &x.shape, out))
}

/// The SwiGLU feed-forward network `W2 (SiLU(W1 x) ⊙ W3 x)`: `x (..., d_model)`,
/// `w1`, `w3 (d_ff, d_model)`, `w2 (d_model, d_ff)`.
#[pyfunction]
pub fn swiglu<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    w1: &Bound<'py, PyAny>,
    w2: &Bound<'py, PyAny>,
    w3: &Bound<'py, PyAny>,
) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    let (w1, w2, w3) = (
        Floats::new(w1, "w1")?,
        Floats::new(w2, "w2")?,
        Floats::new(w3, "w3")?,
    );
    x.expect_ndim("x", 1, false)?;
    let [f, _] = w1.dims("w1")?;
    let c = x.last();
    w1.expect_shape("w1", &[f, c])?;
    w3.expect_shape("w3", &[f, c])?;
    w2.expect_shape("w2", &[c, f])?;
    let n = x.rows();
    let (xd, w1, w2, w3) = (x.data(), w1.data(), w2.data(), w3.data());
    let out = detached(py, || {
        let (a, b) = (linear_op(xd, w1, n, c, f), linear_op(xd, w3, n, c, f));
        let mut h = vec![0.0; n * f];
        kernels::swiglu::swiglu_forward(&mut h, &a, Some(&b));
        Ok(linear_op(&h, w2, n, f, c))
    })?;
    Ok(output(py, &x.shape, out))
}

/// Rotary position embedding of the rows of `x (N, d_k)` at `token_positions (N,)`
/// (each below `max_seq_len`), adjacent pairs `(2k, 2k+1)` rotated by
/// `pos / theta^(2k/d_k)`.
#[pyfunction]
pub fn rope<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    token_positions: &Bound<'py, PyAny>,
    theta: f64,
    max_seq_len: usize,
) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    let [rows, d] = x.dims("x")?;
    let tables = rope_rows(token_positions, rows, d, theta, max_seq_len)?;
    let xd = x.data();
    let out = detached(py, || {
        // Each row of x is the query part of a row of a one-head (N, 3·d) `qkv`.
        let width = 3 * d.max(1);
        let mut qkv = vec![0.0; rows * 3 * d];
        for (dst, src) in qkv.chunks_exact_mut(width).zip(xd.chunks_exact(d.max(1))) {
            dst[..d].copy_from_slice(src);
        }
        rotate(&mut qkv, &tables, rows, 1, d);
        Ok(qkv
            .chunks_exact(width)
            .flat_map(|r| &r[..d])
            .copied()
            .collect())
    })?;
    Ok(output(py, &x.shape, out))
}

/// Softmax over the last axis, max subtracted.
#[pyfunction]
pub fn softmax<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    let (len, mut rows) = (x.last(), x.data().to_vec());
    let rows = detached(py, || {
        kernels::softmax::softmax_rows(&mut rows, len, None);
        Ok(rows)
    })?;
    Ok(output(py, &x.shape, rows))
}

/// `softmax(Q Kᵀ / sqrt(d_k)) V` per batch element: `q (B, n, d_k)`, `k (B, m, d_k)`,
/// `v (B, m, d_v)` and an optional boolean `mask (B, n, m)`, True = may
/// attend; a query with every key masked gets zeros.
#[pyfunction]
#[pyo3(signature = (q, k, v, mask = None))]
pub fn scaled_dot_product_attention<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    mask: Option<PyReadonlyArray3<'py, bool>>,
) -> Out<'py> {
    let (q, k, v) = (
        Floats::new(q, "q")?,
        Floats::new(k, "k")?,
        Floats::new(v, "v")?,
    );
    let ([b, n, dk], [_, m, dv]) = (q.dims("q")?, v.dims("v")?);
    k.expect_shape("k", &[b, m, dk])?;
    v.expect_shape("v", &[b, m, dv])?;
    let mask: Option<Vec<bool>> = match mask {
        Some(mask) if mask.shape() != [b, n, m] => {
            return Err(invalid(format!(
                "mask: expected shape [{b}, {n}, {m}], got {:?}",
                mask.shape()
            )))
        }
        Some(mask) => Some(mask.as_array().iter().copied().collect()),
        None => None,
    };
    let (qd, kd, vd) = (q.data(), k.data(), v.data());
    let out = detached(py, || {
        let mut out = vec![0.0; b * n * dv];
        kernels::attention::sdpa(&mut out, qd, kd, vd, mask.as_deref(), (b, n, m, dk, dv));
        Ok(out)
    })?;
    Ok(output(py, &[b, n, dv], out))
}

/// Causal multi-head self-attention of `x (B, T, d_in)`; projections `(C, d_in)`
/// (`o_proj (C, C)`), heads split from the output rows in order. `rope =
/// (theta, max_seq_len, token_positions (B·T,))` rotates queries and keys.
#[pyfunction]
#[pyo3(signature = (x, q_proj, k_proj, v_proj, o_proj, num_heads, rope = None))]
#[allow(clippy::too_many_arguments)]
pub fn multihead_self_attention<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    q_proj: &Bound<'py, PyAny>,
    k_proj: &Bound<'py, PyAny>,
    v_proj: &Bound<'py, PyAny>,
    o_proj: &Bound<'py, PyAny>,
    num_heads: usize,
    rope: Option<(f64, usize, Bound<'py, PyAny>)>,
) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    let [b, t, d_in] = x.dims("x")?;
    let [q, k, v, o] = [
        (q_proj, "q_proj_weight"),
        (k_proj, "k_proj_weight"),
        (v_proj, "v_proj_weight"),
        (o_proj, "o_proj_weight"),
    ]
    .map(|(w, name)| Floats::new(w, name));
    let (q, k, v, o) = (q?, k?, v?, o?);
    let [c, _] = q.dims("q_proj_weight")?;
    for (w, name) in [
        (&q, "q_proj_weight"),
        (&k, "k_proj_weight"),
        (&v, "v_proj_weight"),
    ] {
        w.expect_shape(name, &[c, d_in])?;
    }
    o.expect_shape("o_proj_weight", &[c, c])?;
    if num_heads == 0 || !c.is_multiple_of(num_heads) {
        return Err(invalid(format!(
            "d_model {c} is not divisible by num_heads {num_heads}"
        )));
    }
    let (h, d) = (num_heads, c / num_heads);
    let tables = match rope {
        Some((theta, max_seq_len, pos)) => Some(rope_rows(&pos, b * t, d, theta, max_seq_len)?),
        None => None,
    };
    let wqkv = [q.data(), k.data(), v.data()].concat();
    let (xd, wo) = (x.data(), o.data());
    let out = detached(py, || {
        let mut qkv = linear_op(xd, &wqkv, b * t, d_in, 3 * c);
        if let Some(tables) = &tables {
            rotate(&mut qkv, tables, b * t, h, d);
        }
        let mut out = vec![0.0; b * t * c];
        if !out.is_empty() {
            let mut att = vec![0.0; b * h * t * t];
            let shape = AttnShape { b, t, h, d, q0: 0 };
            kernels::attention::attention_forward(&mut out, &mut att, &qkv, shape);
        }
        Ok(linear_op(&out, wo, b * t, c, c))
    })?;
    Ok(output(py, &[b, t, c], out))
}

/// One pre-norm Transformer block on `x (..., seq, d_model)` by the model's own code
/// (`tinylm::model::transformer_block`), RoPE at `0..seq`. `weights`: the layer's
/// tensors by CS336 name without the `layers.{i}.` prefix.
#[pyfunction]
pub fn transformer_block<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weights: &Bound<'py, PyDict>,
    num_heads: usize,
    d_ff: usize,
    theta: f64,
    max_seq_len: usize,
) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    x.expect_ndim("x", 2, false)?;
    let (t, c) = (x.shape[x.ndim() - 2], x.last());
    if t > max_seq_len {
        return Err(invalid(format!(
            "sequence length {t} exceeds max_seq_len {max_seq_len}"
        )));
    }
    let config = ModelConfig {
        vocab_size: 1,
        context_length: max_seq_len,
        d_model: c,
        num_layers: 1,
        num_heads,
        d_ff,
        rope_theta: theta,
        ..ModelConfig::tinystories()
    };
    let layout = ParamLayout::new(&config);
    let block = (layout.specs.iter())
        .filter_map(|s| Some((s.name.strip_prefix("layers.0.")?, &s.shape[..])));
    let (block, problems) = read_tensors(weights, block)?;
    if !problems.is_empty() {
        return Err(invalid(format!(
            "weights do not match the block: {}",
            problems.join("; ")
        )));
    }
    let (xd, b) = (x.data(), x.rows() / t.max(1));
    if xd.is_empty() {
        return Ok(output(py, &x.shape, Vec::new()));
    }
    let out = detached(py, || {
        tinylm::model::transformer_block(&config, &block, xd, b, t).map_err(model_error)
    })?;
    Ok(output(py, &x.shape, out))
}

/// The Transformer LM's logits `(..., seq, vocab_size)` for `token_ids (..., seq)`;
/// `weights` is the full CS336 state dict (`token_embeddings.weight`,
/// `layers.{i}.…`, `ln_final.weight`, `lm_head.weight`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn transformer_lm<'py>(
    py: Python<'py>,
    token_ids: &Bound<'py, PyAny>,
    weights: &Bound<'py, PyDict>,
    vocab_size: usize,
    context_length: usize,
    d_model: usize,
    num_layers: usize,
    num_heads: usize,
    d_ff: usize,
    rope_theta: f64,
) -> Out<'py> {
    let config = ModelConfig {
        vocab_size,
        context_length,
        d_model,
        num_layers,
        num_heads,
        d_ff,
        rope_theta,
        ..ModelConfig::tinystories()
    };
    config.validate().map_err(model_error)?;
    let params = params_from_state_dict(&config, weights)?;
    let (mut shape, ids) = crate::arrays::token_ids(token_ids, "token_ids", vocab_size)?;
    if shape.is_empty() {
        return Err(invalid("token_ids: expected at least 1 dimension (…, seq)"));
    }
    let t = *shape.last().expect("ndim >= 1");
    let b = ids.len() / t.max(1);
    let logits = detached(py, || {
        let mut model = Model::from_params(config, params).map_err(model_error)?;
        Ok(model.forward(&ids, b, t).map_err(model_error)?.to_vec())
    })?;
    shape.push(vocab_size);
    Ok(output(py, &shape, logits))
}

/// Mean over every leading position of `logsumexp(logits) − logits[target]`:
/// `logits (..., vocab)`, integer `targets (...)`.
#[pyfunction]
pub fn cross_entropy(
    py: Python<'_>,
    logits: &Bound<'_, PyAny>,
    targets: &Bound<'_, PyAny>,
) -> PyResult<f64> {
    let logits = Floats::new(logits, "logits")?;
    logits.expect_ndim("logits", 1, false)?;
    let v = logits.last();
    let (shape, targets) = token_ids(targets, "targets", v)?;
    if shape != logits.shape[..logits.ndim() - 1] {
        return Err(invalid(format!(
            "targets of shape {shape:?} do not match logits of shape {:?}",
            logits.shape
        )));
    }
    if targets.is_empty() {
        return Err(invalid("cross_entropy of no positions is undefined"));
    }
    let mut scratch = logits.data().to_vec();
    detached(py, || {
        Ok(
            kernels::cross_entropy::cross_entropy(&mut scratch, &targets, false, targets.len())
                .to_f64(),
        )
    })
}
