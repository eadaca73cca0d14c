//! Log-probabilities of the next token, as the OpenAI API's `logprobs` reports them:
//! the model's own distribution — the log-softmax of a row of logits, before any
//! temperature, top-k or top-p — at the token chosen, and the most probable tokens
//! with theirs.

/// One token's log-probability and the `top` most probable tokens' at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// `(id, log-probability)`, most probable first, the lower id first among equals.
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits (V,)` at `token` (`< V`), and its `top` largest
/// entries. The normalizer is summed in `f64` over `exp(l − max)`, so every
/// log-probability is `l − max − ln Σ exp(l − max)` to within an `f32` rounding.
pub fn token_logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_z = f64::from(max) + sum.ln();
    let logprob = |l: f32| (f64::from(l) - log_z) as f32;
    // The `top` largest in one pass: a short list kept in order, ids ascending in
    // the scan, so among equals the first (lower) id stays ahead.
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (id, &l) in (0u32..).zip(logits) {
            if best.len() == top && l <= best[top - 1].1 {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (id, l));
            best.truncate(top);
        }
    }
    TokenLogprobs {
        token,
        logprob: logprob(logits[token as usize]),
        top: best.into_iter().map(|(id, l)| (id, logprob(l))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::token_logprobs;

    #[test]
    fn log_probabilities_sum_to_one_and_the_top_come_in_order() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5, 2.0];
        let got = token_logprobs(&logits, 4, 3);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let want = |l: f32| (f64::from(l) - z.ln()) as f32;
        assert!((got.logprob - want(0.5)).abs() < 1e-6);
        // Ties (ids 1 and 3) keep the lower id first.
        let ids: Vec<u32> = got.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 3, 5]);
        for &(id, lp) in &got.top {
            assert!((lp - want(logits[id as usize])).abs() < 1e-6);
        }
        let total: f64 = (0..logits.len() as u32)
            .map(|t| f64::from(token_logprobs(&logits, t, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(token_logprobs(&logits, 0, 0).top.is_empty());
        assert_eq!(token_logprobs(&logits, 0, 10).top.len(), logits.len());
    }
}
