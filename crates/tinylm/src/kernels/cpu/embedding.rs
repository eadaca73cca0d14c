//! Token embedding: a row lookup and its scatter-add backward.

use crate::kernels::float::Element;
use crate::kernels::Float;
use rayon::prelude::*;

/// `out (N, C) = table[ids]`, `table (V, C)` stored as `E` (`F`, or the bf16 of a
/// model mapped from a bf16 file); ids are checked by the caller.
pub fn embedding_forward<F: Float, E: Element<F>>(out: &mut [F], ids: &[u32], table: &[E]) {
    let c = out.len() / ids.len();
    out.par_chunks_mut(c)
        .zip(ids.par_iter())
        .for_each(|(row, &id)| {
            let id = id as usize;
            for (x, &e) in row.iter_mut().zip(&table[id * c..(id + 1) * c]) {
                *x = e.load();
            }
        });
}

/// `dtable (V, C) += scatter(dout (N, C))` at rows `ids (N)` (serial: rows may repeat).
pub fn embedding_backward<F: Float>(dtable: &mut [F], dout: &[F], ids: &[u32]) {
    let c = dout.len() / ids.len();
    for (row, &id) in dout.chunks_exact(c).zip(ids) {
        let id = id as usize;
        for (d, &g) in dtable[id * c..(id + 1) * c].iter_mut().zip(row) {
            *d += g;
        }
    }
}
