//! Causal multi-head attention, one rayon task per (batch, head): the score and
//! value products through `gemm` on strided views of the fused `qkv` rows, the
//! causal structure by bounds (no mask is materialized), softmax with the max
//! subtracted. The right operands `Kᵀ` and `Vᵀ` are transposed once per head into
//! the thread's scratch: `gemm` reads a right operand's rows in place but would
//! transpose a strided `Kᵀ` view again for every query block.

use super::linear::{gemm_view, View};
use super::memory::{transpose, with_scratch, SharedMut};
use super::simd::{dot, max, sum_by, vectorized};
use crate::kernels::{AttnShape, Float};
use rayon::prelude::*;

/// Queries per block: a block's products only reach the keys its last query sees,
/// which skips most of the zero upper triangle of `P`.
const QUERY_BLOCK: usize = 32;

/// Forward: for each (b, h), `S = Q Kᵀ / sqrt(D)` `(Tq, T)`, `P = softmax` over keys
/// `j ≤ q0 + i` (later keys get exactly 0), `out = P V`.
/// `qkv (B, T, 3C)`, `att (B, H, Tq, T)`, `out (B, Tq, C)`.
pub fn attention_forward<F: Float>(out: &mut [F], att: &mut [F], qkv: &[F], s: AttnShape) {
    let (t, tq, c, d) = (s.t, s.tq(), s.c(), s.d);
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
        let k = &seq[c + h * d..];
        let v = View::new(&seq[2 * c + h * d..], 3 * c, false);
        // SAFETY: head h of sequence b writes only columns h·D..(h+1)·D of its
        // own query rows of `out`: disjoint across tasks.
        unsafe {
            // Decoding (fewer queries than a block) reads K once: the strided view
            // costs less than a transposed copy.
            if tq < QUERY_BLOCK {
                let k = View::new(k, 3 * c, true);
                return head_forward(p, out_ptr.get(), seq, k, v, b, h, s);
            }
            with_scratch(d * t, |kt| {
                transpose(kt, k, t, d, 3 * c);
                head_forward(p, out_ptr.get(), seq, View::new(kt, t, false), v, b, h, s);
            });
        }
    });
}

/// Head `h` of sequence `b` (see [`attention_forward`]): `p (Tq, T)` its
/// probabilities, `k` a view of `Kᵀ (D, T)`, `v` of `V (T, D)`, `seq` the sequence's
/// `qkv` rows.
///
/// # Safety
/// `out` is the `(B, Tq, C)` output; no other thread may touch this head's columns
/// of sequence `b`'s rows while it runs.
#[allow(clippy::too_many_arguments)]
unsafe fn head_forward<F: Float>(
    p: &mut [F],
    out: *mut F,
    seq: &[F],
    k: View<F>,
    v: View<F>,
    b: usize,
    h: usize,
    s: AttnShape,
) {
    let (t, tq, c, d) = (s.t, s.tq(), s.c(), s.d);
    let scale = F::ONE / F::from_f64(d as f64).sqrt();
    for i0 in (0..tq).step_by(QUERY_BLOCK) {
        let i1 = (i0 + QUERY_BLOCK).min(tq);
        // Keys 0..keys are visible to some query of this block.
        let keys = s.q0 + i1;
        let q = View::new(&seq[(s.q0 + i0) * 3 * c + h * d..], 3 * c, false);
        let p_block = &mut p[i0 * t..i1 * t];
        // SAFETY: the views stay inside `seq` (rows < T, stride 3C); the
        // destination is this task's own block of `att`.
        unsafe {
            gemm_view(
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
                    let max = max(visible);
                    for x in visible.iter_mut() {
                        *x = (*x - max).exp();
                    }
                    let inv = F::ONE / sum_by(visible, |x| x);
                    for x in visible.iter_mut() {
                        *x *= inv;
                    }
                    future.fill(F::ZERO);
                }
            },
        );
        // SAFETY: this head's columns of sequence b's query rows (the caller's
        // guarantee).
        unsafe {
            let dst = out.add((b * tq + i0) * c + h * d);
            let p_view = View::new(p_block, t, false);
            gemm_view((i1 - i0, keys, d), dst, c, p_view, v, F::ONE, false);
        }
    }
}

/// Backward (full passes, `q0 = 0`): per (b, h), with `dO` the head's output
/// gradient, `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ⊙ (dP − rowsum(dP ⊙ P)) / sqrt(D)`,
/// `dQ = dS K`, `dK = dSᵀ Q`, written into `dqkv (B, T, 3C)`.
/// `dout (B, T, C)`, `qkv (B, T, 3C)`, `att (B, H, T, T)`, scratch `datt (B, H, T, T)`
/// of which each head reuses its first `QUERY_BLOCK` rows for every query block: the
/// block stays in cache instead of streaming the whole `dP` through memory.
pub fn attention_backward<F: Float>(
    dqkv: &mut [F],
    datt: &mut [F],
    dout: &[F],
    qkv: &[F],
    att: &[F],
    s: AttnShape,
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
            with_scratch(d * t, |vt| {
                transpose(vt, &seq[2 * c + h * d..], t, d, 3 * c);
                let vt = View::new(vt, t, false);
                // Query blocks from the last: it sees every key, so it writes dK and dV
                // for all rows and the earlier (shorter) blocks add to them.
                for i0 in (0..t.div_ceil(QUERY_BLOCK))
                    .rev()
                    .map(|blk| blk * QUERY_BLOCK)
                {
                    let i1 = (i0 + QUERY_BLOCK).min(t);
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
                        gemm_view((keys, rows, d), dv, 3 * c, p_block_t, dout, F::ONE, !first);
                        // dP[block, ..keys] = dO[block] · V[..keys]ᵀ
                        let dst = dp_block.as_mut_ptr();
                        gemm_view((rows, d, keys), dst, t, dout, vt, F::ONE, false);
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
                        gemm_view(
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
                        gemm_view(
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
