//! The gradient's sum of squares `Σ g²` in `f64`, for the global norm of clipping.
//! The CUDA twin is `kernels/cuda/global_norm.cu`.

use super::simd::{sum_by, vectorized};
use crate::kernels::Float;
use rayon::prelude::*;

/// Elements per partial sum. Fixed, so the partial sums — and their total, added
/// in order — are the same whatever the number of threads.
const SUM_CHUNK: usize = 1 << 15;

/// `Σ x²` of one array in `f64`, the same sum whatever the number of threads.
pub fn sum_squares<F: Float>(x: &[F]) -> f64 {
    chunked_sum_squares(x.chunks(SUM_CHUNK).collect())
}

/// `Σ x²` of several arrays taken together, in `f64` (each array in the same
/// chunks as [`sum_squares`], so one array gives the same bits).
pub fn sum_squares_of<F: Float>(arrays: &[&[F]]) -> f64 {
    chunked_sum_squares(arrays.iter().flat_map(|a| a.chunks(SUM_CHUNK)).collect())
}

/// Sums of squares of `chunks` in parallel (each in interleaved `f64` partial sums,
/// so it vectorizes), added in order.
fn chunked_sum_squares<F: Float>(chunks: Vec<&[F]>) -> f64 {
    let partial: Vec<f64> = chunks
        .par_iter()
        .map(|c| {
            vectorized(
                #[inline(always)]
                || sum_by(c, |x| x.to_f64() * x.to_f64()),
            )
        })
        .collect();
    partial.iter().sum()
}
