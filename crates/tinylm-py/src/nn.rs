//! `tinylm.nn`: the CS336 layer functions, NumPy in and float32 NumPy out, each on
//! the model's kernels (`tinylm::kernels`). Where a function is more general than
//! the model needs (arbitrary RoPE positions, SDPA with any boolean mask and
//! `n ≠ m`, softmax over any axis), the glue here feeds the kernels in shapes they
//! take: per-row RoPE tables, one matrix product per batch element, and the one
//! masked softmax below.

use crate::arrays::{output, token_ids, Floats};
use crate::errors::{detached, invalid, model_error};
use crate::model::params_from_state_dict;
use numpy::ndarray::{ArrayViewD, IxDyn};
use numpy::PyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rayon::prelude::*;
use tinylm::config::RMS_NORM_EPS as EPS;
use tinylm::kernels::cpu as kernels;
use tinylm::kernels::cpu::rmsnorm::rmsnorm_forward as rmsnorm_kernel;
use tinylm::kernels::cpu::rope::rope_tables;
use tinylm::kernels::{AttnShape, Float, MatMul};
use tinylm::{Model, ModelConfig};

// ---------------------------------------------------------------------------
// Slice-level operations (no GIL needed).
// ---------------------------------------------------------------------------

/// `y (N, out) = x (N, in) · Wᵀ`, `W (out, in)`.
fn linear_op(x: &[f32], w: &[f32], n: usize, d_in: usize, d_out: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * d_out];
    if n * d_in * d_out > 0 {
        kernels::linear::matmul(&mut out, x, w, MatMul::linear(n, d_in, d_out));
    }
    out
}

/// RMSNorm of `x (N, C)` with gain `g (C)` and any `eps > 0`.
fn rmsnorm_op(x: &[f32], g: &[f32], n: usize, eps: f64) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    let mut rstd = vec![0.0; n];
    if !g.is_empty() {
        rmsnorm_kernel(&mut out, &mut rstd, x, g, eps);
    }
    out
}

/// `W2 (SiLU(W1 x) ⊙ W3 x)`: `x (N, C)`, `W1`, `W3 (F, C)`, `W2 (C, F)`.
fn swiglu_op(
    x: &[f32],
    w1: &[f32],
    w2: &[f32],
    w3: &[f32],
    n: usize,
    c: usize,
    f: usize,
) -> Vec<f32> {
    let a = linear_op(x, w1, n, c, f);
    let b = linear_op(x, w3, n, c, f);
    let mut h = vec![0.0; n * f];
    kernels::swiglu::swiglu_forward(&mut h, &a, Some(&b));
    linear_op(&h, w2, n, f, c)
}

/// Softmax of each row of `len` values in place, max subtracted. Entries where
/// `keep` is false (a row-major mask of the same size) get exactly 0; a row with
/// nothing kept (or only `-inf`) becomes all zeros, never NaN.
fn softmax_rows(data: &mut [f32], len: usize, keep: Option<&[bool]>) {
    if len == 0 {
        return;
    }
    let rows_per_task = (1 << 14) / len + 1;
    let kept = |row: usize, j: usize| keep.is_none_or(|k| k[row * len + j]);
    data.par_chunks_mut(len * rows_per_task)
        .enumerate()
        .for_each(|(task, rows)| {
            for (i, row) in rows.chunks_exact_mut(len).enumerate() {
                let r = task * rows_per_task + i;
                let max = (0..len)
                    .filter(|&j| kept(r, j))
                    .fold(f32::NEG_INFINITY, |m, j| m.max(row[j]));
                if max == f32::NEG_INFINITY {
                    row.fill(0.0);
                    continue;
                }
                let mut sum = 0.0;
                for (j, x) in row.iter_mut().enumerate() {
                    *x = if kept(r, j) { (*x - max).exp() } else { 0.0 };
                    sum += *x;
                }
                let inv = 1.0 / sum;
                row.iter_mut().for_each(|x| *x *= inv);
            }
        });
}

/// Attention of `q (B, n, dk)`, `k (B, m, dk)`, `v (B, m, dv)` with an optional mask
/// `(B, n, m)` (true = attend): per batch element `softmax(Q Kᵀ/sqrt(dk)) V`,
/// both products on the matmul kernel. Returns `(B, n, dv)`.
#[allow(clippy::too_many_arguments)]
fn sdpa_op(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[bool]>,
    batch: usize,
    (n, m, dk, dv): (usize, usize, usize, usize),
) -> Vec<f32> {
    let mut out = vec![0.0; batch * n * dv];
    if n * dv == 0 {
        return out;
    }
    let scale = 1.0 / (dk as f32).sqrt();
    out.par_chunks_mut(n * dv).enumerate().for_each(|(b, out)| {
        let mut scores = vec![0.0; n * m];
        if dk > 0 {
            let qk = MatMul {
                m: n,
                k: dk,
                n: m,
                a_transposed: false,
                b_transposed: true,
                accumulate: false,
            };
            let (qb, kb) = (
                &q[b * n * dk..(b + 1) * n * dk],
                &k[b * m * dk..(b + 1) * m * dk],
            );
            kernels::linear::matmul(&mut scores, qb, kb, qk);
        }
        scores.iter_mut().for_each(|s| *s *= scale);
        softmax_rows(
            &mut scores,
            m,
            mask.map(|mk| &mk[b * n * m..(b + 1) * n * m]),
        );
        if m > 0 {
            let pv = MatMul {
                m: n,
                k: m,
                n: dv,
                a_transposed: false,
                b_transposed: false,
                accumulate: false,
            };
            kernels::linear::matmul(out, &scores, &v[b * m * dv..(b + 1) * m * dv], pv);
        }
    });
    out
}

/// RoPE tables with one row per position in `positions` (each checked below
/// `max_seq_len`): `(len, D/2)` each, rows of the kernels' table, which is computed
/// only up to the largest position.
fn rope_rows(positions: &[usize], d: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let len = positions.iter().max().map_or(0, |&p| p + 1);
    let (cos, sin) = rope_tables::<f32>(len, d, theta);
    let half = d / 2;
    let gather = |table: &[f32]| -> Vec<f32> {
        positions
            .iter()
            .flat_map(|&p| table[p * half..(p + 1) * half].iter().copied())
            .collect()
    };
    (gather(&cos), gather(&sin))
}

/// Causal multi-head self-attention of `x (B, T, d_in)` with the fused `wqkv (3C, d_in)`
/// (rows of W_q, W_k, W_v) and `wo (C, C)`; RoPE rows `(B·T, D/2)` when given.
struct Mha<'a> {
    wqkv: Vec<f32>,
    wo: &'a [f32],
    c: usize,
    heads: usize,
}

impl Mha<'_> {
    fn forward(
        &self,
        x: &[f32],
        b: usize,
        t: usize,
        d_in: usize,
        rope: Option<&(Vec<f32>, Vec<f32>)>,
    ) -> Vec<f32> {
        let (c, h) = (self.c, self.heads);
        let mut qkv = linear_op(x, &self.wqkv, b * t, d_in, 3 * c);
        let d = c / h;
        if let Some((cos, sin)) = rope {
            let rows = AttnShape {
                b: 1,
                t: b * t,
                h,
                d,
                q0: 0,
            };
            kernels::rope::rope(&mut qkv, cos, sin, rows, false);
        }
        let mut out = vec![0.0; b * t * c];
        if b * t * c > 0 {
            let mut att = vec![0.0; b * h * t * t];
            kernels::attention::attention_forward(
                &mut out,
                &mut att,
                &qkv,
                AttnShape { b, t, h, d, q0: 0 },
            );
        }
        linear_op(&out, self.wo, b * t, c, c)
    }
}

// ---------------------------------------------------------------------------
// Argument handling.
// ---------------------------------------------------------------------------

/// The NumPy broadcast of several shapes, or `None` when they do not broadcast.
fn broadcast_shapes(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let ndim = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1; ndim];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[ndim - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// The values of a row-major `(shape, data)` broadcast to `to`, row-major.
fn broadcast_to<T: Copy>(
    data: &[T],
    shape: &[usize],
    to: &[usize],
    name: &str,
) -> PyResult<Vec<T>> {
    let view = ArrayViewD::from_shape(IxDyn(shape), data).expect("data matches its shape");
    let view = view.broadcast(IxDyn(to)).ok_or_else(|| {
        invalid(format!(
            "{name}: shape {shape:?} does not broadcast to {to:?}"
        ))
    })?;
    Ok(view.iter().copied().collect())
}

/// Checks `x`'s shape is `expected`.
fn expect_shape(x: &Floats, name: &str, expected: &[usize]) -> PyResult<()> {
    if x.shape != expected {
        return Err(invalid(format!(
            "{name}: expected shape {expected:?}, got {:?}",
            x.shape
        )));
    }
    Ok(())
}

/// Token positions `(..., T)` broadcast to `to`, each in `[0, max_seq_len)`; `None`
/// gives `0..T` along the last axis.
fn positions(
    p: Option<&Bound<'_, PyAny>>,
    to: &[usize],
    max_seq_len: usize,
) -> PyResult<Vec<usize>> {
    let t = to.last().copied().unwrap_or(1);
    let (shape, ids) = match p {
        Some(p) => token_ids(p, "token_positions", max_seq_len)?,
        None => (vec![t], (0..t as u32).collect()),
    };
    let ids = broadcast_to(&ids, &shape, to, "token_positions")?;
    if p.is_none() && t > max_seq_len {
        return Err(invalid(format!(
            "sequence length {t} exceeds max_seq_len {max_seq_len}"
        )));
    }
    Ok(ids.into_iter().map(|i| i as usize).collect())
}

fn check_rope(d: usize, theta: f64) -> PyResult<()> {
    if !d.is_multiple_of(2) {
        return Err(invalid(format!("RoPE needs an even dimension, got {d}")));
    }
    if !(theta.is_finite() && theta > 0.0) {
        return Err(invalid(format!("theta must be positive, got {theta}")));
    }
    Ok(())
}

/// A weight of the `weights` dict, checked against `shape`.
fn weight<'py>(weights: &Bound<'py, PyDict>, key: &str, shape: &[usize]) -> PyResult<Floats<'py>> {
    let w = weights
        .get_item(key)?
        .ok_or_else(|| invalid(format!("weights: missing '{key}'")))?;
    let w = Floats::new(&w, key)?;
    expect_shape(&w, key, shape)?;
    Ok(w)
}

/// The attention projections, checked: `q_proj`, `k_proj`, `v_proj (C, d_in)`,
/// `o_proj (C, C)`, fused into one `(3C, d_in)` matrix.
fn mha_weights<'a>(
    q: &'a Floats,
    k: &'a Floats,
    v: &'a Floats,
    o: &'a Floats,
    d_in: usize,
    heads: usize,
) -> PyResult<Mha<'a>> {
    q.expect_ndim("q_proj_weight", 2, true)?;
    let c = q.shape[0];
    for (w, name) in [
        (q, "q_proj_weight"),
        (k, "k_proj_weight"),
        (v, "v_proj_weight"),
    ] {
        expect_shape(w, name, &[c, d_in])?;
    }
    expect_shape(o, "o_proj_weight", &[c, c])?;
    if heads == 0 || !c.is_multiple_of(heads) {
        return Err(invalid(format!(
            "d_model {c} is not divisible by num_heads {heads}"
        )));
    }
    let wqkv = [q.data(), k.data(), v.data()].concat();
    Ok(Mha {
        wqkv,
        wo: o.data(),
        c,
        heads,
    })
}

type Out<'py> = PyResult<Bound<'py, PyArrayDyn<f32>>>;

// ---------------------------------------------------------------------------
// The Python functions.
// ---------------------------------------------------------------------------

/// `x Wᵀ` over any leading dims: `x (..., d_in)`, `weight (d_out, d_in)`.
#[pyfunction]
pub fn linear<'py>(py: Python<'py>, x: &Bound<'py, PyAny>, weight: &Bound<'py, PyAny>) -> Out<'py> {
    let (x, w) = (Floats::new(x, "x")?, Floats::new(weight, "weight")?);
    x.expect_ndim("x", 1, false)?;
    w.expect_ndim("weight", 2, true)?;
    let (d_out, d_in) = (w.shape[0], w.shape[1]);
    if x.last() != d_in {
        return Err(invalid(format!(
            "x has {} features but weight {:?} expects {d_in}",
            x.last(),
            w.shape
        )));
    }
    let n = x.rows();
    let (xd, wd) = (x.data(), w.data());
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
    w.expect_ndim("weight", 2, true)?;
    let (vocab, d) = (w.shape[0], w.shape[1]);
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
    expect_shape(&g, "weight", &[x.last()])?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(invalid(format!("eps must be positive, got {eps}")));
    }
    let (n, xd, gd) = (x.rows(), x.data(), g.data());
    let out = detached(py, || Ok(rmsnorm_op(xd, gd, n, eps)))?;
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
    w1.expect_ndim("w1", 2, true)?;
    let (f, c) = (w1.shape[0], x.last());
    expect_shape(&w1, "w1", &[f, c])?;
    expect_shape(&w3, "w3", &[f, c])?;
    expect_shape(&w2, "w2", &[c, f])?;
    let n = x.rows();
    let (xd, a, b, d) = (x.data(), w1.data(), w2.data(), w3.data());
    let out = detached(py, || Ok(swiglu_op(xd, a, b, d, n, c, f)))?;
    Ok(output(py, &x.shape, out))
}

/// Rotary position embedding of `x (..., seq, d_k)` at `token_positions (..., seq)`
/// (broadcast against `x`'s leading dims), adjacent pairs `(2k, 2k+1)` rotated by
/// `pos / theta^(2k/d_k)`; positions must be below `max_seq_len`.
#[pyfunction]
pub fn rope<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    token_positions: &Bound<'py, PyAny>,
    theta: f64,
    max_seq_len: usize,
) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    x.expect_ndim("x", 2, false)?;
    let d = x.last();
    check_rope(d, theta)?;
    let pos = positions(Some(token_positions), &x.shape[..x.ndim() - 1], max_seq_len)?;
    let xd = x.data();
    let out = detached(py, || {
        // Each row of x goes in the query part of a (rows, 3·d) buffer: one head.
        let rows = pos.len();
        let mut qkv = vec![0.0; rows * 3 * d];
        for (dst, src) in qkv.chunks_exact_mut(3 * d).zip(xd.chunks_exact(d)) {
            dst[..d].copy_from_slice(src);
        }
        let (cos, sin) = rope_rows(&pos, d, theta);
        let shape = AttnShape {
            b: 1,
            t: rows,
            h: 1,
            d,
            q0: 0,
        };
        if rows * d > 0 {
            kernels::rope::rope(&mut qkv, &cos, &sin, shape, false);
        }
        Ok(qkv
            .chunks_exact(3 * d.max(1))
            .flat_map(|r| r[..d].iter().copied())
            .collect())
    })?;
    Ok(output(py, &x.shape, out))
}

/// Softmax along axis `dim` (negative counts from the end), max subtracted.
#[pyfunction]
pub fn softmax<'py>(py: Python<'py>, x: &Bound<'py, PyAny>, dim: isize) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    let ndim = x.ndim() as isize;
    let axis = if dim < 0 { dim + ndim } else { dim };
    if !(0..ndim).contains(&axis) {
        return Err(invalid(format!(
            "dim {dim} is out of range for an array of shape {:?}",
            x.shape
        )));
    }
    let axis = axis as usize;
    let view = ArrayViewD::from_shape(IxDyn(&x.shape), x.data()).expect("shape");
    // Move the axis last, take row softmaxes, move it back.
    let mut perm: Vec<usize> = (0..x.ndim()).filter(|&a| a != axis).collect();
    perm.push(axis);
    let moved = view.permuted_axes(IxDyn(&perm));
    let moved_shape = moved.shape().to_vec();
    let mut rows: Vec<f32> = moved.iter().copied().collect();
    let len = x.shape[axis];
    let rows = detached(py, || {
        softmax_rows(&mut rows, len, None);
        Ok(rows)
    })?;
    let mut inverse = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    let back = ArrayViewD::from_shape(IxDyn(&moved_shape), &rows[..])
        .expect("shape")
        .permuted_axes(IxDyn(&inverse));
    Ok(output(py, &x.shape, back.iter().copied().collect()))
}

/// `softmax(Q Kᵀ / sqrt(d_k)) V` with `q (..., n, d_k)`, `k (..., m, d_k)`,
/// `v (..., m, d_v)` (leading dims broadcast) and an optional boolean `mask`
/// broadcastable to `(..., n, m)`, True = may attend. A query with every key masked
/// gets zeros.
#[pyfunction]
#[pyo3(signature = (q, k, v, mask = None))]
pub fn scaled_dot_product_attention<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    mask: Option<&Bound<'py, PyAny>>,
) -> Out<'py> {
    let (q, k, v) = (
        Floats::new(q, "q")?,
        Floats::new(k, "k")?,
        Floats::new(v, "v")?,
    );
    for (x, name) in [(&q, "q"), (&k, "k"), (&v, "v")] {
        x.expect_ndim(name, 2, false)?;
    }
    let split = |x: &Floats| {
        let nd = x.ndim();
        (x.shape[..nd - 2].to_vec(), x.shape[nd - 2], x.shape[nd - 1])
    };
    let ((lq, n, dk), (lk, m, dk2), (lv, m2, dv)) = (split(&q), split(&k), split(&v));
    if dk2 != dk || m2 != m {
        return Err(invalid(format!(
            "shapes do not match: q {:?} (…, n, d_k), k {:?} (…, m, d_k), v {:?} (…, m, d_v)",
            q.shape, k.shape, v.shape
        )));
    }
    let mask = match mask {
        None => None,
        Some(mk) => {
            let np = PyModule::import(py, "numpy")?;
            let arr = np.getattr("asarray")?.call1((mk,))?;
            if arr.getattr("dtype")?.getattr("kind")?.extract::<String>()? != "b" {
                return Err(invalid(format!(
                    "mask: expected a boolean array (True = attend), got dtype {}",
                    arr.getattr("dtype")?
                )));
            }
            let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
            let values: Vec<bool> = arr
                .call_method0("ravel")?
                .call_method0("tolist")?
                .extract()?;
            Some((shape, values))
        }
    };
    let mut leads: Vec<&[usize]> = vec![&lq, &lk, &lv];
    if let Some((shape, _)) = &mask {
        leads.push(&shape[..shape.len().saturating_sub(2)]);
    }
    let batch_shape = broadcast_shapes(&leads).ok_or_else(|| {
        invalid(format!(
            "the batch dims of q {:?}, k {:?}, v {:?}{} do not broadcast",
            q.shape,
            k.shape,
            v.shape,
            mask.as_ref()
                .map_or(String::new(), |(s, _)| format!(", mask {s:?}"))
        ))
    })?;
    let full = |a: usize, b: usize| [batch_shape.as_slice(), &[a, b]].concat();
    let qd = broadcast_to(q.data(), &q.shape, &full(n, dk), "q")?;
    let kd = broadcast_to(k.data(), &k.shape, &full(m, dk), "k")?;
    let vd = broadcast_to(v.data(), &v.shape, &full(m, dv), "v")?;
    let md = match &mask {
        Some((shape, values)) => Some(broadcast_to(values, shape, &full(n, m), "mask")?),
        None => None,
    };
    let batch: usize = batch_shape.iter().product();
    let out = detached(py, || {
        Ok(sdpa_op(&qd, &kd, &vd, md.as_deref(), batch, (n, m, dk, dv)))
    })?;
    Ok(output(py, &full(n, dv), out))
}

/// Causal multi-head self-attention of `x (..., seq, d_in)`; projections `(d_model,
/// d_in)` (`o_proj (d_model, d_model)`), heads split from the output rows in order.
/// RoPE on queries and keys iff `theta` is given, at `token_positions` (default
/// `0..seq`), with tables for `max_seq_len` positions (default: `seq`).
#[pyfunction]
#[pyo3(signature = (x, q_proj, k_proj, v_proj, o_proj, num_heads, theta = None, max_seq_len = None, token_positions = None))]
#[allow(clippy::too_many_arguments)]
pub fn multihead_self_attention<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    q_proj: &Bound<'py, PyAny>,
    k_proj: &Bound<'py, PyAny>,
    v_proj: &Bound<'py, PyAny>,
    o_proj: &Bound<'py, PyAny>,
    num_heads: usize,
    theta: Option<f64>,
    max_seq_len: Option<usize>,
    token_positions: Option<&Bound<'py, PyAny>>,
) -> Out<'py> {
    let x = Floats::new(x, "x")?;
    x.expect_ndim("x", 2, false)?;
    let (t, d_in) = (x.shape[x.ndim() - 2], x.last());
    let b = x.rows() / t.max(1);
    let ws = [
        Floats::new(q_proj, "q_proj_weight")?,
        Floats::new(k_proj, "k_proj_weight")?,
        Floats::new(v_proj, "v_proj_weight")?,
        Floats::new(o_proj, "o_proj_weight")?,
    ];
    let mha = mha_weights(&ws[0], &ws[1], &ws[2], &ws[3], d_in, num_heads)?;
    let rope = match theta {
        Some(theta) => {
            let d = mha.c / num_heads;
            check_rope(d, theta)?;
            let max_seq_len = max_seq_len.unwrap_or(t);
            let pos = positions(token_positions, &x.shape[..x.ndim() - 1], max_seq_len)?;
            Some(rope_rows(&pos, d, theta))
        }
        None => None,
    };
    let xd = x.data();
    let out = detached(py, || Ok(mha.forward(xd, b, t, d_in, rope.as_ref())))?;
    let mut shape = x.shape.clone();
    *shape.last_mut().expect("ndim >= 2") = mha.c;
    Ok(output(py, &shape, out))
}

/// One pre-norm Transformer block on `x (..., seq, d_model)`:
/// `y = x + MHA(RMSNorm₁(x))`, `z = y + SwiGLU(RMSNorm₂(y))`, RoPE at `0..seq`.
/// `weights`: `attn.{q,k,v,output}_proj.weight`, `ln1.weight`, `ln2.weight`,
/// `ffn.w{1,2,3}.weight`.
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
    let b = x.rows() / t.max(1);
    let w = |key: &str, shape: &[usize]| weight(weights, key, shape);
    let (q, k, v, o) = (
        w("attn.q_proj.weight", &[c, c])?,
        w("attn.k_proj.weight", &[c, c])?,
        w("attn.v_proj.weight", &[c, c])?,
        w("attn.output_proj.weight", &[c, c])?,
    );
    let (ln1, ln2) = (w("ln1.weight", &[c])?, w("ln2.weight", &[c])?);
    let (w1, w2, w3) = (
        w("ffn.w1.weight", &[d_ff, c])?,
        w("ffn.w2.weight", &[c, d_ff])?,
        w("ffn.w3.weight", &[d_ff, c])?,
    );
    let mha = mha_weights(&q, &k, &v, &o, c, num_heads)?;
    check_rope(c / num_heads, theta)?;
    let pos = positions(None, &x.shape[..x.ndim() - 1], max_seq_len)?;
    let rope = rope_rows(&pos, c / num_heads, theta);
    let (xd, g1, g2) = (x.data(), ln1.data(), ln2.data());
    let (a, bb, dd) = (w1.data(), w2.data(), w3.data());
    let out = detached(py, || {
        let n = b * t;
        let mut y = mha.forward(&rmsnorm_op(xd, g1, n, EPS), b, t, c, Some(&rope));
        y.iter_mut().zip(xd).for_each(|(y, x)| *y += x);
        let mut z = swiglu_op(&rmsnorm_op(&y, g2, n, EPS), a, bb, dd, n, c, d_ff);
        z.iter_mut().zip(&y).for_each(|(z, y)| *z += y);
        Ok(z)
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
        Ok(kernels::cross_entropy::cross_entropy(&mut scratch, &targets, false).to_f64())
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let nn = PyModule::new(m.py(), "nn")?;
    nn.add_function(wrap_pyfunction!(linear, &nn)?)?;
    nn.add_function(wrap_pyfunction!(embedding, &nn)?)?;
    nn.add_function(wrap_pyfunction!(rmsnorm, &nn)?)?;
    nn.add_function(wrap_pyfunction!(silu, &nn)?)?;
    nn.add_function(wrap_pyfunction!(swiglu, &nn)?)?;
    nn.add_function(wrap_pyfunction!(rope, &nn)?)?;
    nn.add_function(wrap_pyfunction!(softmax, &nn)?)?;
    nn.add_function(wrap_pyfunction!(scaled_dot_product_attention, &nn)?)?;
    nn.add_function(wrap_pyfunction!(multihead_self_attention, &nn)?)?;
    nn.add_function(wrap_pyfunction!(transformer_block, &nn)?)?;
    nn.add_function(wrap_pyfunction!(transformer_lm, &nn)?)?;
    nn.add_function(wrap_pyfunction!(cross_entropy, &nn)?)?;
    m.add_submodule(&nn)
}
