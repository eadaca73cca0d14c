//! Softmax over rows, max subtracted: [`softmax_row`], the one row softmax of the
//! attention kernels, and [`softmax_rows`] over a whole `(N, len)` buffer.

use super::simd::{max, sum_by, vectorized, CHUNK};
use crate::kernels::Float;
use rayon::prelude::*;

/// Softmax of `row` in place, its max subtracted first. With `keep` (one flag per
/// entry, true = kept), the entries it drops become exactly 0. A row with no finite
/// value kept (all dropped or `-inf`) becomes all zeros, never NaN. Vectorizes when
/// called inside `simd::vectorized`.
#[inline(always)]
pub fn softmax_row<F: Float>(row: &mut [F], keep: Option<&[bool]>) {
    if let Some(keep) = keep {
        let neg_inf = F::from_f64(f64::NEG_INFINITY);
        for (x, &k) in row.iter_mut().zip(keep) {
            if !k {
                *x = neg_inf;
            }
        }
    }
    let max = max(row);
    for x in row.iter_mut() {
        *x = (*x - max).exp();
    }
    // The max's own entry contributes 1 unless nothing finite is left (sum 0).
    let sum = sum_by(row, |x| x);
    let inv = if sum > F::ZERO { F::ONE / sum } else { F::ZERO };
    for x in row.iter_mut() {
        *x *= inv;
    }
}

/// Softmax of each row of `x (N, len)` in place (see [`softmax_row`]), with an
/// optional `keep (N, len)` mask (true = kept).
pub fn softmax_rows<F: Float>(x: &mut [F], len: usize, keep: Option<&[bool]>) {
    if let Some(keep) = keep {
        assert_eq!(keep.len(), x.len(), "softmax mask size");
    }
    if x.is_empty() {
        return;
    }
    assert!(len > 0 && x.len().is_multiple_of(len), "softmax rows size");
    let rows_per_task = CHUNK.div_ceil(len);
    x.par_chunks_mut(rows_per_task * len)
        .enumerate()
        .for_each(|(task, rows)| {
            let keep = keep.map(|k| &k[task * rows_per_task * len..][..rows.len()]);
            vectorized(
                #[inline(always)]
                || {
                    for (i, row) in rows.chunks_exact_mut(len).enumerate() {
                        softmax_row(row, keep.map(|k| &k[i * len..(i + 1) * len]));
                    }
                },
            )
        });
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// `len` pseudo-random values in `[-scale, scale)`, fixed by `seed`.
    pub fn values(len: usize, scale: f32, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..len)
            .map(|_| scale * (2.0 * rng.random::<f32>() - 1.0))
            .collect()
    }

    /// The softmax in f64 of the kept entries of `row` (zeros where dropped; all
    /// zeros when nothing is kept).
    pub fn reference(row: &[f32], keep: &[bool]) -> Vec<f32> {
        let max = (row.iter().zip(keep))
            .filter(|(_, &k)| k)
            .fold(f64::NEG_INFINITY, |m, (&x, _)| m.max(x as f64));
        let e: Vec<f64> = (row.iter().zip(keep))
            .map(|(&x, &k)| if k { (x as f64 - max).exp() } else { 0.0 })
            .collect();
        let sum: f64 = e.iter().sum();
        e.iter()
            .map(|&e| if sum > 0.0 { (e / sum) as f32 } else { 0.0 })
            .collect()
    }

    pub fn assert_close(got: &[f32], want: &[f32]) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-6 + 1e-5 * w.abs(), "{i}: {g} vs {w}");
        }
    }

    #[test]
    fn rows_match_the_f64_softmax_with_and_without_a_mask() {
        let (n, len) = (300, 77); // more than one task's rows, a ragged last task
        let x = values(n * len, 50.0, 1);
        let keep: Vec<bool> = (0..n * len).map(|i| (i * 7 + i / len) % 3 != 0).collect();
        let all = vec![true; n * len];
        for mask in [None, Some(&keep[..])] {
            let mut got = x.clone();
            softmax_rows(&mut got, len, mask);
            let mask = mask.unwrap_or(&all);
            for (r, row) in got.chunks_exact(len).enumerate() {
                let span = r * len..(r + 1) * len;
                assert_close(row, &reference(&x[span.clone()], &mask[span]));
            }
        }
    }

    #[test]
    fn large_values_stay_finite_and_dropped_entries_are_exactly_zero() {
        let mut row = vec![1e4, 3e4, -2e4, f32::INFINITY];
        let keep = [true, true, true, false];
        softmax_rows(&mut row, 4, Some(&keep));
        assert_eq!(row, [0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn rows_with_nothing_finite_kept_are_zeros() {
        let mut x = vec![1.0, 2.0, f32::NEG_INFINITY, f32::NEG_INFINITY, 5.0, 6.0];
        softmax_rows(&mut x, 2, Some(&[true, true, true, true, false, false]));
        assert_close(&x[..2], &reference(&[1.0, 2.0], &[true; 2]));
        assert_eq!(&x[2..], [0.0; 4]);
        let mut empty: Vec<f32> = vec![];
        softmax_rows(&mut empty, 0, None);
    }
}
