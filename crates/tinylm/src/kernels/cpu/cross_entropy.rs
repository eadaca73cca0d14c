//! Cross-entropy over the LM head's logits, fused with its gradient.

use super::simd::{max, sum_by, vectorized};
use crate::kernels::Float;
use rayon::prelude::*;

/// The sum over the `N` rows of `logsumexp(logits) − logits[target]`, divided by
/// `rows` — the positions of the whole batch these `N` are part of (`N` for the mean)
/// — for `logits (N, V)`, `targets (N)` (checked by the caller). With `grad`, each
/// row is overwritten by `(softmax − onehot(target)) / rows` while it is still in
/// cache: one pass for the max, one for the exponentials (kept in place), one for
/// the scaling.
pub fn cross_entropy<F: Float>(logits: &mut [F], targets: &[u32], grad: bool, rows: usize) -> F {
    let n = targets.len();
    let v = logits.len() / n;
    let inv_rows = 1.0 / rows as f64;
    let total: f64 = logits
        .par_chunks_mut(v)
        .zip(targets.par_iter())
        .map(|(row, &target)| {
            vectorized(
                #[inline(always)]
                || {
                    let target = target as usize;
                    let max = max(row);
                    let target_logit = row[target];
                    let sum = if grad {
                        for x in row.iter_mut() {
                            *x = (*x - max).exp();
                        }
                        let sum = sum_by(row, |x| x);
                        let k = F::from_f64(inv_rows) / sum;
                        for x in row.iter_mut() {
                            *x *= k;
                        }
                        row[target] -= F::from_f64(inv_rows);
                        sum
                    } else {
                        sum_by(row, |x| (x - max).exp())
                    };
                    (max - target_logit).to_f64() + sum.to_f64().ln()
                },
            )
        })
        .sum();
    F::from_f64(total * inv_rows)
}
