//! Finite-difference gradient checks in f64 of every kernel and of the whole model
//! in every ablation: the same generic code the f32 model runs.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tinylm::config::{Ffn, ModelConfig, Norm, Positional, RMS_NORM_EPS};
use tinylm::kernels::cpu::{attention, cross_entropy, embedding, linear, rmsnorm, rope, swiglu};
use tinylm::kernels::{AttnShape, MatMul};
use tinylm::Model;

fn randn(rng: &mut ChaCha8Rng, len: usize) -> Vec<f64> {
    (0..len).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect()
}

/// The step of the finite differences.
const H: f64 = 1e-4;

/// Gradients smaller than this are compared absolutely: [`MAX_RELATIVE_ERROR`] ×
/// this floor, 1e-10, bounds their error. The differences' own error is the
/// rounding of the loss (about 1e-16 of it) over the step: about 1e-12 here
/// (the worst seen below the floor is 7e-12), so a smaller gradient cannot be
/// measured to a relative 1e-6, and one much smaller than the floor is 0 for the
/// purpose of training.
const GRADIENT_FLOOR: f64 = 1e-4;

/// The largest relative error `|numeric − analytic| / |numeric|` of a gradient at
/// least [`GRADIENT_FLOOR`] in size.
const MAX_RELATIVE_ERROR: f64 = 1e-6;

/// Compares `analytic[i]` with the fourth-order central difference of `loss` in
/// `x[i]`, for all i: `|numeric − analytic| / max(|numeric|, GRADIENT_FLOOR)` below
/// [`MAX_RELATIVE_ERROR`].
fn check(name: &str, x: &mut [f64], analytic: &[f64], mut loss: impl FnMut(&[f64]) -> f64) {
    assert_eq!(x.len(), analytic.len(), "{name}");
    let (mut worst_relative, mut worst_absolute, mut floored) = (0f64, 0f64, 0);
    for i in 0..x.len() {
        let orig = x[i];
        let mut at = |d: f64| {
            x[i] = orig + d;
            loss(x)
        };
        let numeric = (8.0 * (at(H) - at(-H)) - (at(2.0 * H) - at(-2.0 * H))) / (12.0 * H);
        x[i] = orig;
        let diff = (numeric - analytic[i]).abs();
        if numeric.abs() >= GRADIENT_FLOOR {
            worst_relative = worst_relative.max(diff / numeric.abs());
        } else {
            worst_absolute = worst_absolute.max(diff);
            floored += 1;
        }
        let err = diff / numeric.abs().max(GRADIENT_FLOOR);
        assert!(
            err < MAX_RELATIVE_ERROR,
            "{name}[{i}]: analytic {} vs numeric {numeric}: error {err:.1e} relative to \
             max(|numeric|, {GRADIENT_FLOOR:.0e})",
            analytic[i]
        );
    }
    eprintln!(
        "{name}: {} values, worst relative error {worst_relative:.1e}; {floored} below \
         {GRADIENT_FLOOR:.0e}, worst absolute error {worst_absolute:.1e}",
        x.len()
    );
}

/// `Σ r ⊙ out`: a scalar loss whose gradient with respect to `out` is `r`.
fn dot(r: &[f64], out: &[f64]) -> f64 {
    r.iter().zip(out).map(|(a, b)| a * b).sum()
}

#[test]
fn linear_forward_and_backward() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (n, d_in, d_out) = (5, 4, 3);
    let mut x = randn(&mut rng, n * d_in);
    let mut w = randn(&mut rng, d_out * d_in);
    let r = randn(&mut rng, n * d_out);
    let forward = |x: &[f64], w: &[f64]| {
        let mut y = vec![0.0; n * d_out];
        linear::matmul(&mut y, x, w, MatMul::linear(n, d_in, d_out));
        y
    };
    // Forward against the definition y[i][o] = Σ_j x[i][j] W[o][j].
    let y = forward(&x, &w);
    for i in 0..n {
        for o in 0..d_out {
            let want: f64 = (0..d_in).map(|j| x[i * d_in + j] * w[o * d_in + j]).sum();
            assert!((y[i * d_out + o] - want).abs() < 1e-12);
        }
    }
    let mut dx = vec![0.0; n * d_in];
    linear::matmul(&mut dx, &r, &w, MatMul::linear_dx(n, d_in, d_out));
    let mut dw = vec![f64::NAN; d_out * d_in]; // overwritten
    linear::matmul(&mut dw, &r, &x, MatMul::linear_dw(n, d_in, d_out));
    let w0 = w.clone();
    check("linear dx", &mut x.clone(), &dx, |x| {
        dot(&r, &forward(x, &w0))
    });
    check("linear dW", &mut w, &dw, |w| dot(&r, &forward(&x, w)));
    x.clear();
}

/// Products big enough to be split across threads and column blocks, every
/// transpose combination, against the definition.
#[test]
fn large_matmuls_split_across_threads_are_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (m, k, n) = (301, 67, 2100);
    let a = randn(&mut rng, m * k);
    let b = randn(&mut rng, k * n);
    for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
        let at = |i: usize, p: usize| if a_t { a[p * m + i] } else { a[i * k + p] };
        let bt = |p: usize, j: usize| if b_t { b[j * k + p] } else { b[p * n + j] };
        let mut out = vec![1.0; m * n];
        let shape = MatMul {
            m,
            k,
            n,
            a_transposed: a_t,
            b_transposed: b_t,
            accumulate: true,
        };
        linear::matmul(&mut out, &a, &b, shape);
        for i in (0..m).step_by(7) {
            for j in (0..n).step_by(13) {
                let want = 1.0 + (0..k).map(|p| at(i, p) * bt(p, j)).sum::<f64>();
                assert!(
                    (out[i * n + j] - want).abs() < 1e-10,
                    "{a_t} {b_t} ({i}, {j})"
                );
            }
        }
    }
}

#[test]
fn embedding_backward_scatters() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (v, c) = (5, 3);
    let ids = [3u32, 0, 3, 4, 1, 3];
    let mut table = randn(&mut rng, v * c);
    let r = randn(&mut rng, ids.len() * c);
    let forward = |table: &[f64]| {
        let mut out = vec![0.0; ids.len() * c];
        embedding::embedding_forward(&mut out, &ids, table);
        out
    };
    let mut dtable = vec![0.0; v * c];
    embedding::embedding_backward(&mut dtable, &r, &ids);
    check("embedding", &mut table, &dtable, |t| dot(&r, &forward(t)));
}

#[test]
fn rmsnorm_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (n, c) = (4, 6);
    let mut x = randn(&mut rng, n * c);
    let mut g = randn(&mut rng, c);
    let r = randn(&mut rng, n * c);
    let forward = |x: &[f64], g: &[f64]| {
        let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
        rmsnorm::rmsnorm_forward(&mut out, &mut rstd, x, g, RMS_NORM_EPS);
        (out, rstd)
    };
    let (out, rstd) = forward(&x, &g);
    for i in 0..n {
        let row = &x[i * c..(i + 1) * c];
        let rms = (row.iter().map(|v| v * v).sum::<f64>() / c as f64 + 1e-5).sqrt();
        for j in 0..c {
            assert!((out[i * c + j] - row[j] / rms * g[j]).abs() < 1e-12);
        }
    }
    // dx accumulates onto what is there when asked to.
    let mut dx = vec![1.0; n * c];
    let mut dg = vec![0.0; c];
    rmsnorm::rmsnorm_backward(&mut dx, &mut dg, &r, &x, &g, &rstd, true);
    dx.iter_mut().for_each(|v| *v -= 1.0);
    let (g0, x0) = (g.clone(), x.clone());
    check("rmsnorm dx", &mut x, &dx, |x| dot(&r, &forward(x, &g0).0));
    check("rmsnorm dg", &mut g, &dg, |g| dot(&r, &forward(&x0, g).0));
}

#[test]
fn swiglu_and_silu_backward() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let len = 40_000; // more than one parallel chunk
    let mut a: Vec<f64> = randn(&mut rng, len).iter().map(|v| v * 6.0).collect();
    let mut b = randn(&mut rng, len);
    let r = randn(&mut rng, len);
    let forward = |a: &[f64], b: Option<&[f64]>| {
        let mut out = vec![0.0; len];
        swiglu::swiglu_forward(&mut out, a, b);
        out
    };
    let out = forward(&a, Some(&b));
    for i in (0..len).step_by(997) {
        let silu = a[i] / (1.0 + (-a[i]).exp());
        assert!((out[i] - silu * b[i]).abs() < 1e-12);
    }
    let (mut da, mut db) = (vec![0.0; len], vec![0.0; len]);
    swiglu::swiglu_backward(&mut da, Some(&mut db), &r, &a, Some(&b));
    // Checking 40k values by differences is slow; a strided subset covers every chunk.
    // Each output depends on its own inputs only, so the loss sums the subset's terms
    // of `r ⊙ out`: the same gradient, without the rounding of a 40,000-term sum.
    let (a0, b0) = (a.clone(), b.clone());
    let idx: Vec<usize> = (0..len).step_by(331).collect();
    let sub = |v: &[f64]| idx.iter().map(|&i| v[i]).collect::<Vec<_>>();
    let subset_loss = |out: &[f64]| dot(&sub(&r), &sub(out));
    let mut a_sub = sub(&a);
    check("swiglu da", &mut a_sub, &sub(&da), |s| {
        idx.iter().zip(s).for_each(|(&i, &v)| a[i] = v);
        subset_loss(&forward(&a, Some(&b0)))
    });
    let mut b_sub = sub(&b);
    check("swiglu db", &mut b_sub, &sub(&db), |s| {
        idx.iter().zip(s).for_each(|(&i, &v)| b[i] = v);
        subset_loss(&forward(&a0, Some(&b)))
    });
    let mut da = vec![0.0; len];
    swiglu::swiglu_backward(&mut da, None, &r, &a0, None);
    let mut a = a0.clone();
    check("silu da", &mut sub(&a0), &sub(&da), |s| {
        idx.iter().zip(s).for_each(|(&i, &v)| a[i] = v);
        subset_loss(&forward(&a, None))
    });
}

fn attn_shape(b: usize, t: usize, h: usize, d: usize) -> AttnShape {
    AttnShape { b, t, h, d, q0: 0 }
}

#[test]
fn rope_backward_is_the_inverse_rotation() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let s = attn_shape(2, 5, 2, 4);
    let c = s.h * s.d;
    let (cos, sin) = rope::rope_tables::<f64>(8, s.d, 10_000.0);
    let mut x = randn(&mut rng, s.b * s.t * 3 * c);
    let r = randn(&mut rng, x.len());
    let forward = |x: &[f64]| {
        let mut y = x.to_vec();
        rope::rope(&mut y, &cos, &sin, s, false);
        y
    };
    // Position 3 of sequence 1, head 1, pair k = 1 of the keys, by the definition.
    let y = forward(&x);
    let base = (s.t + 3) * 3 * c + c + s.d + 2;
    let angle = 3.0 / 10_000f64.powf(2.0 / s.d as f64);
    let want = x[base] * angle.cos() - x[base + 1] * angle.sin();
    assert!((y[base] - want).abs() < 1e-12);
    // Values are not rotated.
    assert_eq!(y[2 * c..3 * c], x[2 * c..3 * c]);
    let mut dx = r.clone();
    rope::rope(&mut dx, &cos, &sin, s, true);
    check("rope", &mut x, &dx, |x| dot(&r, &forward(x)));
}

/// One query block and several (with a partial last block).
#[test]
fn attention_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for s in [attn_shape(2, 5, 2, 3), attn_shape(1, 70, 2, 2)] {
        let c = s.h * s.d;
        let mut qkv: Vec<f64> = randn(&mut rng, s.b * s.t * 3 * c)
            .iter()
            .map(|v| v * 2.0)
            .collect();
        let r = randn(&mut rng, s.b * s.t * c);
        let forward = |qkv: &[f64]| {
            let mut out = vec![0.0; s.b * s.t * c];
            let mut att = vec![0.0; s.b * s.h * s.t * s.t];
            attention::attention_forward(&mut out, &mut att, qkv, s);
            (out, att)
        };
        let (_, att) = forward(&qkv);
        // Causal: every probability of a future key is exactly 0, each row sums to 1.
        for (row_index, row) in att.chunks(s.t).enumerate() {
            let i = row_index % s.t;
            assert!(row[i + 1..].iter().all(|&p| p == 0.0));
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        let mut dqkv = vec![7.0; qkv.len()]; // overwritten
        let mut datt = vec![3.0; att.len()];
        attention::attention_backward(&mut dqkv, &mut datt, &r, &qkv, &att, s);
        let name = format!("attention T={}", s.t);
        check(&name, &mut qkv, &dqkv, |x| dot(&r, &forward(x).0));
    }
}

#[test]
fn cross_entropy_gradient_is_fused_in_place() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (n, v) = (4, 6);
    let mut logits: Vec<f64> = randn(&mut rng, n * v).iter().map(|x| x * 3.0).collect();
    let targets = [2u32, 0, 5, 2];
    let loss = |l: &[f64]| cross_entropy::cross_entropy(&mut l.to_vec(), &targets, false, n);
    let want: f64 = (0..n)
        .map(|i| {
            let row = &logits[i * v..(i + 1) * v];
            row.iter().map(|x| x.exp()).sum::<f64>().ln() - row[targets[i] as usize]
        })
        .sum::<f64>()
        / n as f64;
    assert!((loss(&logits) - want).abs() < 1e-12);
    let mut grad = logits.clone();
    let l = cross_entropy::cross_entropy(&mut grad, &targets, true, n);
    assert!((l - want).abs() < 1e-12);
    check("cross-entropy", &mut logits, &grad, loss);
}

fn tiny(norm: Norm, positional: Positional, ffn: Ffn, tie_embeddings: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 7,
        context_length: 6,
        d_model: 8,
        num_layers: 2,
        num_heads: 2,
        d_ff: 12,
        rope_theta: 100.0,
        norm,
        positional,
        ffn,
        tie_embeddings,
    }
}

/// Every ablation: whole-model gradient of the mean cross-entropy against finite
/// differences, for every parameter (gains perturbed away from 1 so they matter).
#[test]
fn whole_model_gradient_in_every_ablation() {
    let (b, t) = (2, 5);
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let ids: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..7)).collect();
    let targets: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..7)).collect();
    for norm in [Norm::Pre, Norm::Post, Norm::None] {
        for positional in [Positional::Rope, Positional::None] {
            for ffn in [Ffn::Swiglu, Ffn::Silu] {
                for tied in [false, true] {
                    let config = tiny(norm, positional, ffn, tied);
                    let name = format!("model {norm:?}/{positional:?}/{ffn:?}/tied={tied}");
                    let layout = tinylm::params::ParamLayout::new(&config);
                    let mut params: Vec<f64> = layout.init(3).iter().map(|&p| p as f64).collect();
                    params
                        .iter_mut()
                        .for_each(|p| *p += 0.3 * (rng.random::<f64>() - 0.5));
                    let mut model = Model::<f64>::with_params(config, params.clone()).unwrap();
                    model.forward_loss(&ids, &targets, b, t).unwrap();
                    model.backward().unwrap();
                    let grads = model.grads().to_vec();
                    check(&name, &mut params, &grads, |p| {
                        model.params_mut().copy_from_slice(p);
                        model.forward_loss(&ids, &targets, b, t).unwrap()
                    });
                }
            }
        }
    }
}
