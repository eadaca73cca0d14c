//! Causal multi-head attention, one rayon task per (batch, head): the score and
//! value products through `gemm` on strided views of the fused `qkv` rows, the
//! causal structure by bounds (no mask is materialized), softmax with the max
//! subtracted.

use super::super::{AttnShape, Float};
use super::linear::{gemm_view, View};
use super::{dot, max, sum_by, SharedMut};
use rayon::prelude::*;

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
    let scale = F::ONE / F::from_f64(d as f64).sqrt();
    let out_ptr = SharedMut(out.as_mut_ptr());
    att.par_chunks_mut(tq * t).enumerate().for_each(|(bh, p)| {
        let (b, h) = (bh / s.h, bh % s.h);
        let seq = &qkv[b * t * 3 * c..(b + 1) * t * 3 * c];
        let q = &seq[s.q0 * 3 * c + h * d..];
        let k = &seq[c + h * d..];
        let v = &seq[2 * c + h * d..];
        // SAFETY: the views stay inside `seq` for (Tq or T) rows of stride 3C;
        // `p` is this task's own (Tq, T) block.
        unsafe {
            gemm_view(
                (tq, d, t),
                p.as_mut_ptr(),
                t,
                View::new(q, 3 * c, false),
                View::new(k, 3 * c, true),
                scale,
                false,
            );
        }
        for (i, row) in p.chunks_exact_mut(t).enumerate() {
            let (visible, future) = row.split_at_mut(s.q0 + i + 1);
            let max = max(visible);
            for x in visible.iter_mut() {
                *x = (*x - max).exp();
            }
            let sum = sum_by(visible, |x| x);
            let inv = F::ONE / sum;
            for x in visible.iter_mut() {
                *x *= inv;
            }
            future.fill(F::ZERO);
        }
        // SAFETY: head h of sequence b writes only columns h·D..(h+1)·D of its
        // own Tq rows of `out`: disjoint across tasks.
        unsafe {
            let dst = out_ptr.get().add(b * tq * c + h * d);
            gemm_view(
                (tq, t, d),
                dst,
                c,
                View::new(p, t, false),
                View::new(v, 3 * c, false),
                F::ONE,
                false,
            );
        }
    });
}

/// Backward (full passes, `q0 = 0`): per (b, h), with `dO` the head's output
/// gradient, `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ⊙ (dP − rowsum(dP ⊙ P)) / sqrt(D)`,
/// `dQ = dS K`, `dK = dSᵀ Q`, written into `dqkv (B, T, 3C)`.
/// `dout (B, T, C)`, `qkv (B, T, 3C)`, `att (B, H, T, T)`, scratch `datt (B, H, T, T)`.
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
            let (q, k, v) = (&seq[h * d..], &seq[c + h * d..], &seq[2 * c + h * d..]);
            let dout = View::new(&dout[b * t * c + h * d..], c, false);
            // SAFETY: reads stay inside this sequence's rows; writes go to this
            // task's own `dp` block and to head h's columns of sequence b's rows
            // of `dqkv` (q, k and v parts): disjoint across tasks.
            unsafe {
                let dseq = dqkv_ptr.get().add(b * t * 3 * c);
                // dV (T, D) = Pᵀ (T, T) · dO (T, D)
                gemm_view(
                    (t, t, d),
                    dseq.add(2 * c + h * d),
                    3 * c,
                    View::new(p, t, true),
                    dout,
                    F::ONE,
                    false,
                );
                // dP (T, T) = dO (T, D) · Vᵀ
                gemm_view(
                    (t, d, t),
                    dp.as_mut_ptr(),
                    t,
                    dout,
                    View::new(v, 3 * c, true),
                    F::ONE,
                    false,
                );
            }
            for (i, (dp, p)) in dp.chunks_exact_mut(t).zip(p.chunks_exact(t)).enumerate() {
                let (visible, future) = dp.split_at_mut(i + 1);
                let dot = dot(visible, p);
                for (g, &p) in visible.iter_mut().zip(p) {
                    *g = p * (*g - dot) * scale;
                }
                future.fill(F::ZERO);
            }
            unsafe {
                let dseq = dqkv_ptr.get().add(b * t * 3 * c);
                // dQ (T, D) = dS (T, T) · K (T, D)
                gemm_view(
                    (t, t, d),
                    dseq.add(h * d),
                    3 * c,
                    View::new(dp, t, false),
                    View::new(k, 3 * c, false),
                    F::ONE,
                    false,
                );
                // dK (T, D) = dSᵀ (T, T) · Q (T, D)
                gemm_view(
                    (t, t, d),
                    dseq.add(c + h * d),
                    3 * c,
                    View::new(dp, t, true),
                    View::new(q, 3 * c, false),
                    F::ONE,
                    false,
                );
            }
        });
}
