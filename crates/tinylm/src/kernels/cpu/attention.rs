//! Causal multi-head attention, one rayon task per (batch, head): the score and
//! value products on strided views of the fused `qkv` rows (through `gemm` in the
//! backend's float, `Gemm`, or through another `HeadProduct`: the bf16 kernel of
//! [`CpuMixed`](super::CpuMixed)), the causal structure by bounds (no mask is
//! materialized), softmax with the max subtracted. The right operands `Kᵀ` and `Vᵀ`
//! are transposed once per head into the thread's scratch: `gemm` reads a right
//! operand's rows in place but would transpose a strided `Kᵀ` view again for every
//! query block.
//!
//! And [`sdpa`], the general scaled dot-product attention (any mask, `n` queries
//! and `m` keys) with the same row softmax ([`softmax_row`]).

use super::linear::{gemm_view, matmul, View};
use super::memory::{prefetch_rows, transpose, with_scratch, SharedMut};
use super::simd::{dot, vectorized};
use super::softmax::softmax_row;
use crate::kernels::{AttnShape, Float, MatMul};
use rayon::prelude::*;

/// The per-head products of attention on strided views, on the calling thread,
/// for `qkv` rows of element `E` (the backend's float `F`, or a KV cache's bf16).
pub(crate) trait HeadProduct<F, E = F>: Sync {
    /// `dst (m, n) = scale · a (m, k) · b (k, n)`, or `dst +=` when `accumulate`:
    /// the scores `Q · Kᵀ`, and every product of the backward pass (where `E` is `F`).
    ///
    /// # Safety
    /// The views must address valid memory for their shapes, `dst` must be
    /// writable (row stride `dst_rs`, unit column stride) and alias neither operand.
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        &self,
        shape: (usize, usize, usize),
        dst: *mut F,
        dst_rs: usize,
        a: View<E>,
        b: View<E>,
        scale: F,
        accumulate: bool,
    );

    /// `dst (m, n) = p (m, k) · v (k, n)`: the probabilities times the values.
    ///
    /// # Safety
    /// As [`HeadProduct::product`]'s.
    unsafe fn mix(
        &self,
        shape: (usize, usize, usize),
        dst: *mut F,
        dst_rs: usize,
        p: View<F>,
        v: View<E>,
    );

    /// Whether a right operand strided along `k` (`Kᵀ`, `Vᵀ` as views of the
    /// `qkv` rows) costs no more than a contiguous one, so no transposed copy is
    /// made.
    fn reads_strided(&self) -> bool {
        false
    }

    /// Queries per block ([`QUERY_BLOCK`] unless the products favour longer ones).
    fn query_block(&self) -> usize {
        QUERY_BLOCK
    }
}

/// The products in the backend's float, through `gemm` ([`gemm_view`]).
pub(crate) struct Gemm;

impl<F: Float> HeadProduct<F> for Gemm {
    unsafe fn product(
        &self,
        shape: (usize, usize, usize),
        dst: *mut F,
        dst_rs: usize,
        a: View<F>,
        b: View<F>,
        scale: F,
        accumulate: bool,
    ) {
        gemm_view(shape, dst, dst_rs, a, b, scale, accumulate)
    }

    unsafe fn mix(
        &self,
        shape: (usize, usize, usize),
        dst: *mut F,
        dst_rs: usize,
        p: View<F>,
        v: View<F>,
    ) {
        gemm_view(shape, dst, dst_rs, p, v, F::ONE, false)
    }
}

/// Queries per block: a block's products only reach the keys its last query sees,
/// which skips most of the zero upper triangle of `P`; fewer per block skip more
/// but pack (or transpose) the keys' and values' operands once more each.
const QUERY_BLOCK: usize = 32;

/// Forward: for each (b, h), `S = Q Kᵀ / sqrt(D)` `(Tq, T)`, `P = softmax` over keys
/// `j ≤ q0 + i` (later keys get exactly 0), `out = P V`.
/// `qkv (B, T, 3C)`, `att (B, H, Tq, T)`, `out (B, Tq, C)`. Both products in `F`
/// (`Gemm`).
pub fn attention_forward<F: Float>(out: &mut [F], att: &mut [F], qkv: &[F], s: AttnShape) {
    attention_forward_on(out, att, qkv, s, &Gemm)
}

/// [`attention_forward`] with both products on `products`.
pub(crate) fn attention_forward_on<F: Float>(
    out: &mut [F],
    att: &mut [F],
    qkv: &[F],
    s: AttnShape,
    products: &(impl HeadProduct<F> + ?Sized),
) {
    let (t, tq, c) = (s.t, s.tq(), s.c());
    assert_eq!(qkv.len(), s.b * t * 3 * c, "attention qkv size");
    assert_eq!(out.len(), s.b * tq * c, "attention output size");
    assert_eq!(
        att.len(),
        s.b * s.h * tq * t,
        "attention probabilities size"
    );
    let out_ptr = SharedMut(out.as_mut_ptr());
    att.par_chunks_mut(tq * t).enumerate().for_each(|(bh, p)| {
        let (b, h) = (bh / s.h, bh % s.h);
        let seq = &qkv[b * t * 3 * c..(b + 1) * t * 3 * c];
        // SAFETY: head h of sequence b writes only columns h·D..(h+1)·D of its
        // own query rows of `out`: disjoint across tasks.
        unsafe { head_task(p, out_ptr.get(), seq, b, h, s, products) }
    });
}

/// [`attention_forward`] of a decoding pass over several sequences: sequence `i`
/// (`caches[i] = (qkv (T, 3C), shape)`, `shape.b == 1`, `qkv` its KV cache with the
/// new rows in place, of element `E`: `F`, or bf16 where the products round to
/// it) has its `Tq` output rows next in `out (Σ Tq, C)` and its probabilities next
/// in `att (Σ H·Tq·T)`. One rayon task per sequence and head — not a parallel loop
/// per sequence, whose fork and join cost more than a short sequence's heads.
pub fn attention_forward_cached<F: Float>(
    out: &mut [F],
    att: &mut [F],
    caches: &[(&[F], AttnShape)],
) {
    attention_forward_cached_on(out, att, caches, &Gemm)
}

/// [`attention_forward_cached`] with both products on `products`.
pub(crate) fn attention_forward_cached_on<F: Float, E: Copy + Default + Sync + 'static>(
    out: &mut [F],
    att: &mut [F],
    caches: &[(&[E], AttnShape)],
    products: &(impl HeadProduct<F, E> + ?Sized),
) {
    // (probabilities, sequence, head, the sequence's first output row)
    let mut tasks = Vec::new();
    let (mut rest, mut row) = (att, 0);
    for (i, &(qkv, s)) in caches.iter().enumerate() {
        assert_eq!(s.b, 1, "a cache holds one sequence");
        assert_eq!(qkv.len(), s.t * 3 * s.c(), "attention cache size");
        let (probs, after) = rest.split_at_mut(s.h * s.tq() * s.t);
        tasks.extend(
            probs
                .chunks_mut(s.tq() * s.t)
                .enumerate()
                .map(|(h, p)| (p, i, h, row)),
        );
        (rest, row) = (after, row + s.tq());
    }
    assert!(rest.is_empty(), "attention probabilities size");
    let c = caches.first().map_or(0, |(_, s)| s.c());
    assert_eq!(out.len(), row * c, "attention output size");
    let out_ptr = SharedMut(out.as_mut_ptr());
    tasks.into_par_iter().for_each(|(p, i, h, row)| {
        let (qkv, s) = caches[i];
        // SAFETY: head h of sequence i writes only columns h·D..(h+1)·D of the
        // sequence's own rows of `out`: disjoint across tasks.
        unsafe { head_task(p, out_ptr.get().add(row * c), qkv, 0, h, s, products) }
    });
}

/// Bytes apart from which the rows of `qkv` lie on pages of their own, where the
/// hardware prefetchers, which stay inside a 4 KiB page, cannot run ahead of a
/// head's walk down its keys and values: a decoding task then asks for them all
/// first. (With 3C = 2,304 in bf16, 4.5 KiB a row, 8 sequences decoding together
/// spent 11% less time in attention, 1.11 → 0.99 ms a step, on Zen 5; with rows
/// closer together the requests cost more than they bring: the quickstart's, 1.1
/// KiB apart, 40 → 47 µs.)
const PAGE: usize = 4096;

/// Head `h` of sequence `b` of `seq`, its `qkv` rows `(T, 3C)`, into `p (Tq, T)`
/// and its columns of the `(B, Tq, C)` output `out`: through a transposed copy of
/// `Kᵀ` unless the products read the strided view as fast or the queries are
/// fewer than a block (decoding reads `K` once).
///
/// # Safety
/// As [`head_forward`].
unsafe fn head_task<F: Float, E: Copy + Default + 'static>(
    p: &mut [F],
    out: *mut F,
    seq: &[E],
    b: usize,
    h: usize,
    s: AttnShape,
    products: &(impl HeadProduct<F, E> + ?Sized),
) {
    let (t, c, d) = (s.t, s.c(), s.d);
    let k = &seq[c + h * d..];
    let v = View::new(&seq[2 * c + h * d..], 3 * c, false);
    let row = 3 * c * size_of::<E>();
    if s.tq() == 1 && row >= PAGE {
        for part in [k.as_ptr(), v.ptr] {
            prefetch_rows(part, s.q0 + 1, row, d * size_of::<E>());
        }
    }
    // SAFETY: the caller's.
    unsafe {
        if s.tq() < products.query_block() || products.reads_strided() {
            let k = View::new(k, 3 * c, true);
            return head_forward(p, out, seq, k, v, b, h, s, products);
        }
        with_scratch(d * t, |kt| {
            transpose(kt, k, t, d, 3 * c);
            let kt = View::new(kt, t, false);
            head_forward(p, out, seq, kt, v, b, h, s, products);
        });
    }
}

/// Head `h` of sequence `b` (see [`attention_forward`]): `p (Tq, T)` its
/// probabilities, `k` a view of `Kᵀ (D, T)`, `v` of `V (T, D)`, `seq` the sequence's
/// `qkv` rows.
///
/// # Safety
/// `out` is the `(B, Tq, C)` output; no other thread may touch this head's columns
/// of sequence `b`'s rows while it runs.
#[allow(clippy::too_many_arguments)]
unsafe fn head_forward<F: Float, E: Copy>(
    p: &mut [F],
    out: *mut F,
    seq: &[E],
    k: View<E>,
    v: View<E>,
    b: usize,
    h: usize,
    s: AttnShape,
    products: &(impl HeadProduct<F, E> + ?Sized),
) {
    let (t, tq, c, d) = (s.t, s.tq(), s.c(), s.d);
    let scale = F::ONE / F::from_f64(d as f64).sqrt();
    let query_block = products.query_block();
    for i0 in (0..tq).step_by(query_block) {
        let i1 = (i0 + query_block).min(tq);
        // Keys 0..keys are visible to some query of this block.
        let keys = s.q0 + i1;
        let q = View::new(&seq[(s.q0 + i0) * 3 * c + h * d..], 3 * c, false);
        let p_block = &mut p[i0 * t..i1 * t];
        // SAFETY: the views stay inside `seq` (rows < T, stride 3C); the
        // destination is this task's own block of `att`.
        unsafe {
            products.product(
                (i1 - i0, d, keys),
                p_block.as_mut_ptr(),
                t,
                q,
                k,
                scale,
                false,
            );
        }
        vectorized(
            #[inline(always)]
            || {
                for (i, row) in (i0..i1).zip(p_block.chunks_exact_mut(t)) {
                    let (visible, future) = row.split_at_mut(s.q0 + i + 1);
                    softmax_row(visible, None);
                    future.fill(F::ZERO);
                }
            },
        );
        // SAFETY: this head's columns of sequence b's query rows (the caller's
        // guarantee).
        unsafe {
            let dst = out.add((b * tq + i0) * c + h * d);
            let p_view = View::new(p_block, t, false);
            products.mix((i1 - i0, keys, d), dst, c, p_view, v);
        }
    }
}

/// Scaled dot-product attention of a batch with any mask: for each `b`,
/// `out[b] = softmax(q[b] k[b]ᵀ / sqrt(dk)) v[b]`, each query's softmax over the
/// keys `keep[b]` allows (exact zeros elsewhere; a query with no key gets zeros).
/// `q (B, n, dk)`, `k (B, m, dk)`, `v (B, m, dv)`, `keep (B, n, m)` (true = attend;
/// `None` = all), `out (B, n, dv)`. One rayon task per batch element, its scores
/// `(n, m)` in the thread's scratch, both products on [`matmul`].
pub fn sdpa<F: Float>(
    out: &mut [F],
    q: &[F],
    k: &[F],
    v: &[F],
    keep: Option<&[bool]>,
    (b, n, m, dk, dv): (usize, usize, usize, usize, usize),
) {
    assert_eq!(q.len(), b * n * dk, "sdpa q size");
    assert_eq!(k.len(), b * m * dk, "sdpa k size");
    assert_eq!(v.len(), b * m * dv, "sdpa v size");
    assert_eq!(out.len(), b * n * dv, "sdpa output size");
    if let Some(keep) = keep {
        assert_eq!(keep.len(), b * n * m, "sdpa mask size");
    }
    if out.is_empty() {
        return;
    }
    let scale = F::ONE / F::from_f64(dk as f64).sqrt();
    out.par_chunks_mut(n * dv).enumerate().for_each(|(i, out)| {
        let q = &q[i * n * dk..(i + 1) * n * dk];
        let k = &k[i * m * dk..(i + 1) * m * dk];
        let v = &v[i * m * dv..(i + 1) * m * dv];
        let keep = keep.map(|keep| &keep[i * n * m..(i + 1) * n * m]);
        with_scratch(n * m, |scores| {
            // S = Q Kᵀ: K (m, dk) multiplies like a linear layer's weight.
            matmul(scores, q, k, MatMul::linear(n, dk, m));
            vectorized(
                #[inline(always)]
                || {
                    for (r, row) in scores.chunks_exact_mut(m.max(1)).enumerate() {
                        for x in row.iter_mut() {
                            *x *= scale;
                        }
                        softmax_row(row, keep.map(|keep| &keep[r * m..(r + 1) * m]));
                    }
                },
            );
            matmul(out, scores, v, MatMul::plain(n, m, dv));
        });
    });
}

/// Backward (full passes, `q0 = 0`): per (b, h), with `dO` the head's output
/// gradient, `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ⊙ (dP − rowsum(dP ⊙ P)) / sqrt(D)`,
/// `dQ = dS K`, `dK = dSᵀ Q`, written into `dqkv (B, T, 3C)`.
/// `dout (B, T, C)`, `qkv (B, T, 3C)`, `att (B, H, T, T)`, scratch `datt (B, H, T, T)`
/// of which each head reuses its first rows for every block of queries: the
/// block stays in cache instead of streaming the whole `dP` through memory. Every
/// product in `F` (`Gemm`).
pub fn attention_backward<F: Float>(
    dqkv: &mut [F],
    datt: &mut [F],
    dout: &[F],
    qkv: &[F],
    att: &[F],
    s: AttnShape,
) {
    attention_backward_on(dqkv, datt, dout, qkv, att, s, &Gemm)
}

/// [`attention_backward`] with every product on `products`.
pub(crate) fn attention_backward_on<F: Float>(
    dqkv: &mut [F],
    datt: &mut [F],
    dout: &[F],
    qkv: &[F],
    att: &[F],
    s: AttnShape,
    products: &(impl HeadProduct<F> + ?Sized),
) {
    assert_eq!(s.q0, 0, "attention backward needs a full pass");
    let (t, c, d) = (s.t, s.c(), s.d);
    assert_eq!(qkv.len(), s.b * t * 3 * c, "attention qkv size");
    assert_eq!(dqkv.len(), qkv.len(), "attention dqkv size");
    assert_eq!(dout.len(), s.b * t * c, "attention dout size");
    assert_eq!(att.len(), s.b * s.h * t * t, "attention probabilities size");
    assert_eq!(datt.len(), att.len(), "attention scratch size");
    let scale = F::ONE / F::from_f64(d as f64).sqrt();
    let dqkv_ptr = SharedMut(dqkv.as_mut_ptr());
    datt.par_chunks_mut(t * t)
        .zip(att.par_chunks(t * t))
        .enumerate()
        .for_each(|(bh, (dp, p))| {
            let (b, h) = (bh / s.h, bh % s.h);
            let seq = &qkv[b * t * 3 * c..(b + 1) * t * 3 * c];
            let view =
                |part: usize, transposed| View::new(&seq[part * c + h * d..], 3 * c, transposed);
            let dseq = dqkv_ptr.get().wrapping_add(b * t * 3 * c + h * d);
            let v = &seq[2 * c + h * d..];
            let strided = products.reads_strided();
            with_scratch(if strided { 0 } else { d * t }, |vt| {
                let vt = if strided {
                    View::new(v, 3 * c, true)
                } else {
                    transpose(vt, v, t, d, 3 * c);
                    View::new(vt, t, false)
                };
                // Query blocks from the last: it sees every key, so it writes dK and dV
                // for all rows and the earlier (shorter) blocks add to them.
                let query_block = products.query_block();
                for i0 in (0..t.div_ceil(query_block))
                    .rev()
                    .map(|blk| blk * query_block)
                {
                    let i1 = (i0 + query_block).min(t);
                    let (rows, keys, first) = (i1 - i0, i1, i1 == t);
                    let dout = View::new(&dout[(b * t + i0) * c + h * d..], c, false);
                    let p_block_t = View::new(&p[i0 * t..], t, true);
                    let q_block = View::new(&seq[i0 * 3 * c + h * d..], 3 * c, false);
                    let dp_block = &mut dp[..(i1 - i0) * t];
                    // SAFETY: reads stay inside this sequence's rows; writes go to this
                    // task's own `dp` rows and to head h's columns of sequence b's rows
                    // of `dqkv` (q, k and v parts): disjoint across tasks.
                    unsafe {
                        // dV[..keys] (+)= P[block, ..keys]ᵀ · dO[block]
                        let dv = dseq.add(2 * c);
                        products.product(
                            (keys, rows, d),
                            dv,
                            3 * c,
                            p_block_t,
                            dout,
                            F::ONE,
                            !first,
                        );
                        // dP[block, ..keys] = dO[block] · V[..keys]ᵀ
                        let dst = dp_block.as_mut_ptr();
                        products.product((rows, d, keys), dst, t, dout, vt, F::ONE, false);
                    }
                    vectorized(
                        #[inline(always)]
                        || {
                            for (i, (dp, p)) in (i0..i1).zip(
                                dp_block
                                    .chunks_exact_mut(t)
                                    .zip(p[i0 * t..i1 * t].chunks_exact(t)),
                            ) {
                                let (visible, future) = dp.split_at_mut(i + 1);
                                let dot = dot(visible, p);
                                for (g, &p) in visible.iter_mut().zip(p) {
                                    *g = p * (*g - dot) * scale;
                                }
                                future.fill(F::ZERO);
                            }
                        },
                    );
                    let ds_block = View::new(dp_block, t, false);
                    let ds_block_t = View::new(dp_block, t, true);
                    unsafe {
                        // dQ[block] = dS[block, ..keys] · K[..keys]
                        let dq = dseq.add(i0 * 3 * c);
                        products.product(
                            (rows, keys, d),
                            dq,
                            3 * c,
                            ds_block,
                            view(1, false),
                            F::ONE,
                            false,
                        );
                        // dK[..keys] (+)= dS[block, ..keys]ᵀ · Q[block]
                        let dk = dseq.add(c);
                        products.product(
                            (keys, rows, d),
                            dk,
                            3 * c,
                            ds_block_t,
                            q_block,
                            F::ONE,
                            !first,
                        );
                    }
                }
            });
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::softmax::tests::{assert_close, reference, values};

    /// [`sdpa`] in f64, one query at a time.
    fn reference_sdpa(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        keep: Option<&[bool]>,
        (b, n, m, dk, dv): (usize, usize, usize, usize, usize),
    ) -> Vec<f32> {
        let mut out = vec![0.0; b * n * dv];
        for (row, out) in out.chunks_exact_mut(dv).enumerate() {
            let i = row / n;
            let q = &q[row * dk..(row + 1) * dk];
            let scores: Vec<f32> = (0..m)
                .map(|j| {
                    let k = &k[(i * m + j) * dk..(i * m + j + 1) * dk];
                    let dot: f64 = q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                    (dot / (dk as f64).sqrt()) as f32
                })
                .collect();
            let all = vec![true; m];
            let p = reference(
                &scores,
                keep.map_or(&all[..], |k| &k[row * m..(row + 1) * m]),
            );
            for (c, o) in out.iter_mut().enumerate() {
                *o = (0..m)
                    .map(|j| p[j] as f64 * v[(i * m + j) * dv + c] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn sdpa_matches_the_reference_with_and_without_a_mask() {
        let shape @ (b, n, m, dk, dv) = (3, 5, 7, 8, 6);
        let (q, k, v) = (
            values(b * n * dk, 2.0, 1),
            values(b * m * dk, 2.0, 2),
            values(b * m * dv, 1.0, 3),
        );
        let mut keep: Vec<bool> = values(b * n * m, 1.0, 4)
            .iter()
            .map(|&x| x > -0.3)
            .collect();
        keep[m..2 * m].fill(false); // query 1 of batch 0 sees no key
        for mask in [None, Some(&keep[..])] {
            let mut out = vec![f32::NAN; b * n * dv];
            sdpa(&mut out, &q, &k, &v, mask, shape);
            assert_close(&out, &reference_sdpa(&q, &k, &v, mask, shape));
        }
        let mut out = vec![f32::NAN; b * n * dv];
        sdpa(&mut out, &q, &k, &v, Some(&keep), shape);
        assert_eq!(out[dv..2 * dv], vec![0.0; dv]);
    }

    #[test]
    fn sdpa_without_keys_gives_zeros() {
        let (b, n, dk, dv) = (2, 3, 4, 5);
        let mut out = vec![f32::NAN; b * n * dv];
        let q = values(b * n * dk, 1.0, 5);
        sdpa(&mut out, &q, &[], &[], None, (b, n, 0, dk, dv));
        assert_eq!(out, vec![0.0; b * n * dv]);
    }

    /// The causal kernel equals [`sdpa`] with a causal mask on every head, for a full
    /// pass (several query blocks) and for the last rows against a cache (`q0 > 0`).
    #[test]
    fn causal_attention_is_sdpa_with_a_causal_mask() {
        let (b, t, h, d) = (2, 2 * QUERY_BLOCK + 5, 3, 8);
        let c = h * d;
        let qkv = values(b * t * 3 * c, 2.0, 6);
        for q0 in [0, t - 3] {
            let s = AttnShape { b, t, h, d, q0 };
            let tq = s.tq();
            let mut out = vec![0.0; b * tq * c];
            let mut att = vec![0.0; b * h * tq * t];
            attention_forward(&mut out, &mut att, &qkv, s);
            // Head (b, h)'s rows of the q, k and v parts of `qkv`.
            let part = |part: usize, rows: std::ops::Range<usize>| -> Vec<f32> {
                let mut x = Vec::new();
                for bh in 0..b * h {
                    for r in rows.clone() {
                        let at = (bh / h * t + r) * 3 * c + part * c + bh % h * d;
                        x.extend_from_slice(&qkv[at..at + d]);
                    }
                }
                x
            };
            let (q, k, v) = (part(0, q0..t), part(1, 0..t), part(2, 0..t));
            let causal: Vec<bool> = (0..b * h * tq * t)
                .map(|i| i % t <= q0 + i / t % tq)
                .collect();
            let mut want = vec![0.0; b * h * tq * d];
            sdpa(&mut want, &q, &k, &v, Some(&causal), (b * h, tq, t, d, d));
            for (row, got) in out.chunks_exact(d).enumerate() {
                let (bi, i, hi) = (row / (tq * h), row / h % tq, row % h);
                let at = ((bi * h + hi) * tq + i) * d;
                assert_close(got, &want[at..at + d]);
            }
        }
    }

    /// The shapes of a decoding pass over sequences of `(cached positions, new
    /// rows)` with `h` heads of `d` channels, and a random cache `(T, 3C)` for each.
    fn decoding_pass(
        h: usize,
        d: usize,
        parts: &[(usize, usize)],
        seed: u64,
    ) -> (Vec<AttnShape>, Vec<Vec<f32>>) {
        let shapes: Vec<AttnShape> = (parts.iter())
            .map(|&(q0, tq)| AttnShape {
                b: 1,
                t: q0 + tq,
                h,
                d,
                q0,
            })
            .collect();
        let caches = (shapes.iter().zip(seed..))
            .map(|(s, seed)| values(s.t * 3 * s.c(), 2.0, seed))
            .collect();
        (shapes, caches)
    }

    #[test]
    fn cached_attention_of_several_sequences_is_each_ones_own() {
        let (h, d) = (3, 8);
        let c = h * d;
        // (cached positions, new rows): decoding steps and a prompt beside them.
        let parts = [(6, 1), (0, 1), (40, 1), (2, 9), (QUERY_BLOCK + 3, 1)];
        let (shapes, caches) = decoding_pass(h, d, &parts, 10);
        let rows: usize = shapes.iter().map(|s| s.tq()).sum();
        let probs: usize = shapes.iter().map(|s| s.h * s.tq() * s.t).sum();
        let products: [&dyn HeadProduct<f32>; 2] = [&Gemm, &crate::kernels::cpu::CpuMixed::new()];
        for products in products {
            let (mut out, mut att) = (vec![0.0; rows * c], vec![0.0; probs]);
            let cached: Vec<_> = caches
                .iter()
                .map(|q| &q[..])
                .zip(shapes.iter().copied())
                .collect();
            attention_forward_cached_on(&mut out, &mut att, &cached, products);
            let (mut out_rest, mut att_rest) = (&out[..], &att[..]);
            for (qkv, s) in cached {
                let (mut want, mut want_att) =
                    (vec![0.0; s.tq() * c], vec![0.0; s.h * s.tq() * s.t]);
                attention_forward_on(&mut want, &mut want_att, qkv, s, products);
                let (got, rest) = out_rest.split_at(want.len());
                let (got_att, after) = att_rest.split_at(want_att.len());
                assert_eq!(got, &want[..], "output of a sequence at {}", s.q0);
                assert_eq!(
                    got_att,
                    &want_att[..],
                    "probabilities of a sequence at {}",
                    s.q0
                );
                (out_rest, att_rest) = (rest, after);
            }
        }
    }

    /// A KV cache stored in bf16 gives the bf16 kernels' attention the values it
    /// would round an `f32` cache to: the same outputs and probabilities, bit for
    /// bit (decoding rows and a prompt, on every bf16 kernel this CPU runs).
    #[test]
    fn a_bf16_cache_attends_as_its_f32_values_rounded() {
        use crate::kernels::cpu::bf16::{round_bf16, Bf16Kernel, Bf16Operand};
        use crate::kernels::cpu::CpuMixed;
        let (shapes, caches) = decoding_pass(2, 16, &[(9, 1), (0, 1), (70, 1), (3, 5)], 30);
        let rounded: Vec<Vec<half::bf16>> = (caches.iter())
            .map(|v| {
                (v.iter())
                    .map(|&x| half::bf16::from_bits(round_bf16(x)))
                    .collect()
            })
            .collect();
        // (outputs, probabilities) of the caches' attention on `products`.
        fn run<E: Bf16Operand + Default>(
            caches: &[Vec<E>],
            shapes: &[AttnShape],
            products: &CpuMixed,
        ) -> (Vec<f32>, Vec<f32>) {
            let rows: usize = shapes.iter().map(|s| s.tq()).sum();
            let probs: usize = shapes.iter().map(|s| s.h * s.tq() * s.t).sum();
            let (mut out, mut att) = (vec![0.0; rows * shapes[0].c()], vec![0.0; probs]);
            let caches: Vec<_> = (caches.iter().map(|q| &q[..]))
                .zip(shapes.iter().copied())
                .collect();
            attention_forward_cached_on(&mut out, &mut att, &caches, products);
            (out, att)
        }
        let mut kernels = vec![Bf16Kernel::Portable];
        kernels.extend(Bf16Kernel::native());
        for kernel in kernels {
            let products = CpuMixed::on(kernel);
            let want = run(&caches, &shapes, &products);
            let got = run(&rounded, &shapes, &products);
            assert_eq!(got.0, want.0, "{} outputs", kernel.name());
            assert_eq!(got.1, want.1, "{} probabilities", kernel.name());
        }
    }
}
