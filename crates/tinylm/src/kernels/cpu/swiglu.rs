//! SiLU and SwiGLU: `SiLU(a) = a·σ(a)`, SwiGLU `= SiLU(a) ⊙ b` (one kernel; the
//! plain SiLU FFN passes no `b`). Their outputs — read only by matrix products —
//! are stored as the buffer's [`Element`] says (bf16 under mixed precision).

use super::simd::{vectorized, CHUNK};
use crate::kernels::float::{store_tiled, Element, Float, TILE};
use rayon::prelude::*;

#[inline(always)]
fn sigmoid<F: Float>(a: F) -> F {
    F::ONE / (F::ONE + (-a).exp())
}

/// `out (N, F) = SiLU(a) ⊙ b`, or `SiLU(a)` when `b` is `None`.
pub fn swiglu_forward<F: Float, O: Element<F>>(out: &mut [O], a: &[F], b: Option<&[F]>) {
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, out)| {
        let r = i * CHUNK..i * CHUNK + out.len();
        let (a, b) = (&a[r.clone()], b.map(|b| &b[r]));
        vectorized(
            #[inline(always)]
            || {
                store_tiled(
                    out,
                    #[inline(always)]
                    |r, tile| match b {
                        Some(b) => {
                            for ((t, &a), &b) in tile.iter_mut().zip(&a[r.clone()]).zip(&b[r]) {
                                *t = a * sigmoid(a) * b;
                            }
                        }
                        None => {
                            for (t, &a) in tile.iter_mut().zip(&a[r]) {
                                *t = a * sigmoid(a);
                            }
                        }
                    },
                )
            },
        )
    });
}

/// Backward of [`swiglu_forward`]: `da = dout ⊙ b ⊙ σ(a)(1 + a(1 − σ(a)))`,
/// `db = dout ⊙ SiLU(a)` (both overwritten; `b`, `db` absent for SiLU).
pub fn swiglu_backward<F: Float, O: Element<F>>(
    da: &mut [O],
    db: Option<&mut [O]>,
    dout: &[F],
    a: &[F],
    b: Option<&[F]>,
) {
    let chunk_range = |i: usize, len: usize| i * CHUNK..i * CHUNK + len;
    match (db, b) {
        (Some(db), Some(b)) => da
            .par_chunks_mut(CHUNK)
            .zip(db.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(i, (da, db))| {
                let r = chunk_range(i, da.len());
                let (dout, a, b) = (&dout[r.clone()], &a[r.clone()], &b[r]);
                vectorized(
                    #[inline(always)]
                    || {
                        let mut db_tile = [F::ZERO; TILE];
                        store_tiled(
                            da,
                            #[inline(always)]
                            |r, da_tile| {
                                let db_tile = &mut db_tile[..r.len()];
                                for ((((da, db), &d), &a), &b) in da_tile
                                    .iter_mut()
                                    .zip(db_tile.iter_mut())
                                    .zip(&dout[r.clone()])
                                    .zip(&a[r.clone()])
                                    .zip(&b[r.clone()])
                                {
                                    let s = sigmoid(a);
                                    *db = d * a * s;
                                    *da = d * b * s * (F::ONE + a * (F::ONE - s));
                                }
                                O::store_slice(&mut db[r], db_tile);
                            },
                        )
                    },
                )
            }),
        (None, None) => da.par_chunks_mut(CHUNK).enumerate().for_each(|(i, da)| {
            let r = chunk_range(i, da.len());
            let (dout, a) = (&dout[r.clone()], &a[r]);
            vectorized(
                #[inline(always)]
                || {
                    store_tiled(
                        da,
                        #[inline(always)]
                        |r, tile| {
                            for ((t, &d), &a) in tile.iter_mut().zip(&dout[r.clone()]).zip(&a[r]) {
                                let s = sigmoid(a);
                                *t = d * s * (F::ONE + a * (F::ONE - s));
                            }
                        },
                    )
                },
            )
        }),
        _ => panic!("swiglu_backward: b and db must be given together"),
    }
}
