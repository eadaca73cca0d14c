//! AdamW, SGD, the cosine schedule and clipping against SPEC §3.

mod common;

use common::max_abs_diff;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tinylm::buffers::STATISTICS;
use tinylm::kernels::cpu::adamw::adamw_step;
use tinylm::kernels::{clip_scale, AdamWParams, CLIP_EPS};
use tinylm::optim::*;

/// One AdamW update of a host buffer with learning rate `lr`, the gradients
/// multiplied by `grad_scale` first (the clipping factor of [`clip_scale`]).
fn update(opt: &mut AdamW, params: &mut [f32], grads: &[f32], lr: f64, grad_scale: f32) {
    opt.step += 1;
    let hp = opt.hp;
    adamw_step(
        params, grads, &mut opt.m, &mut opt.v, opt.step, lr, &hp, grad_scale,
    );
}

/// Global-norm clipping of one flat gradient buffer (SPEC ε = 1e-6); the norm
/// before clipping.
fn clip_grad_norm(grads: &mut [f32], max: f64) -> f64 {
    clip_grad_norm_arrays(&mut [grads], max, CLIP_EPS)
}

fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

#[test]
fn adamw_matches_hand_computed_steps() {
    // θ = 1, lr 0.1, β = (0.9, 0.999), ε = 1e-8, λ = 0.01, gradients 0.5, −0.25, 1.
    // Step 1: m = 0.05, v = 0.00025, α₁ = 0.1·sqrt(0.001)/0.1 = 0.0316228,
    //   θ = 1 − α₁·0.05/(0.0158114 + 1e-8) = 0.90000006, then θ·(1 − 0.001) = 0.89910006.
    // Steps 2 and 3 the same way (in f64): 0.87159391, 0.80497698.
    let hp = AdamWParams {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let mut opt = AdamW::new(1, hp);
    let mut theta = [1.0f32];
    for (g, want) in [
        (0.5f32, 0.89910006f64),
        (-0.25, 0.87159391),
        (1.0, 0.80497698),
    ] {
        update(&mut opt, &mut theta, &[g], 0.1, 1.0);
        // f32 moments and coefficients: a few ulps of θ.
        assert!(
            (theta[0] as f64 - want).abs() < 5e-6,
            "{} vs {want}",
            theta[0]
        );
    }
    assert_eq!(opt.step, 3);
}

/// SPEC §3 AdamW in f64, written independently of the library.
fn reference_adamw(theta: &mut [f64], grads: &[Vec<f32>], lr: &[f64], hp: &AdamWParams) {
    let mut m = vec![0.0; theta.len()];
    let mut v = vec![0.0; theta.len()];
    for (t, (g, &alpha)) in grads.iter().zip(lr).enumerate() {
        let t = (t + 1) as i32;
        let alpha_t = alpha * (1.0 - hp.beta2.powi(t)).sqrt() / (1.0 - hp.beta1.powi(t));
        for i in 0..theta.len() {
            let g = g[i] as f64;
            m[i] = hp.beta1 * m[i] + (1.0 - hp.beta1) * g;
            v[i] = hp.beta2 * v[i] + (1.0 - hp.beta2) * g * g;
            theta[i] -= alpha_t * m[i] / (v[i].sqrt() + hp.eps);
            theta[i] -= alpha * hp.weight_decay * theta[i];
        }
    }
}

#[test]
fn adamw_matches_the_spec_formula_on_random_data() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let n = 100_000; // several rayon chunks
    let hp = AdamWParams {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let init = random(&mut rng, n);
    let grads: Vec<Vec<f32>> = (0..10).map(|_| random(&mut rng, n)).collect();
    let lrs: Vec<f64> = (0..10)
        .map(|t| lr_cosine_schedule(t, 1e-2, 1e-3, 3, 10))
        .collect();
    let mut theta = init.clone();
    let mut opt = AdamW::new(n, hp);
    for (g, &lr) in grads.iter().zip(&lrs) {
        update(&mut opt, &mut theta, g, lr, 1.0);
    }
    let mut want: Vec<f64> = init.iter().map(|&x| x as f64).collect();
    reference_adamw(&mut want, &grads, &lrs, &hp);
    let worst = max_abs_diff(&theta, &want);
    assert!(worst < 1e-5, "max deviation {worst}");
}

#[test]
fn per_tensor_steps_equal_the_fused_buffer_step() {
    // The Python API updates one array at a time; the training loop the whole buffer.
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let hp = AdamWParams::default();
    let (n, split) = (70_000, 12_345);
    let mut whole = random(&mut rng, n);
    let mut parts = whole.clone();
    let mut opt = AdamW::new(n, hp);
    let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
    for step in 1..=3 {
        let g = random(&mut rng, n);
        update(&mut opt, &mut whole, &g, 1e-3, 0.5);
        let (p0, p1) = parts.split_at_mut(split);
        let (m0, m1) = m.split_at_mut(split);
        let (v0, v1) = v.split_at_mut(split);
        adamw_step(p0, &g[..split], m0, v0, step, 1e-3, &hp, 0.5);
        adamw_step(p1, &g[split..], m1, v1, step, 1e-3, &hp, 0.5);
    }
    assert_eq!(whole, parts);
    assert_eq!((opt.m, opt.v), (m, v));
}

#[test]
fn sgd_example_decays_as_one_over_sqrt_t() {
    let mut theta = [1.0f32, -2.0];
    for t in 0..3u64 {
        sgd_step(&mut theta, &[1.0, 2.0], t, 0.5);
    }
    // Steps of 0.5·(1, 1/√2, 1/√3) times the gradient.
    let s = 0.5 * (1.0 + 1.0 / 2f32.sqrt() + 1.0 / 3f32.sqrt());
    assert!((theta[0] - (1.0 - s)).abs() < 1e-6);
    assert!((theta[1] - (-2.0 - 2.0 * s)).abs() < 1e-6);
}

#[test]
fn cosine_schedule_spec_check_values() {
    let expected = [
        0.0,
        0.14285714285714285,
        0.2857142857142857,
        0.42857142857142855,
        0.5714285714285714,
        0.7142857142857143,
        0.8571428571428571,
        1.0,
        0.9887175604818206,
        0.9554359905560885,
        0.9018241671106134,
        0.8305704108364301,
        0.7452476826029011,
        0.6501344202803414,
        0.55,
        0.44986557971965857,
        0.3547523173970989,
        0.26942958916356996,
        0.19817583288938662,
        0.14456400944391146,
        0.11128243951817937,
        0.1,
        0.1,
        0.1,
        0.1,
    ];
    for (t, want) in expected.into_iter().enumerate() {
        let got = lr_cosine_schedule(t as u64, 1.0, 0.1, 7, 21);
        assert!((got - want).abs() < 1e-12, "t = {t}: {got} vs {want}");
    }
}

#[test]
fn clipping_scales_to_the_limit_across_arrays() {
    let mut a = vec![3.0f32, 0.0];
    let mut b = vec![4.0f32];
    let norm = clip_grad_norm_arrays(&mut [&mut a, &mut b], 1.0, CLIP_EPS);
    assert!((norm - 5.0).abs() < 1e-12);
    let s = (1.0 / (5.0 + 1e-6)) as f32;
    assert_eq!((a, b), (vec![3.0 * s, 0.0], vec![4.0 * s]));
    // Below the limit (or with clipping off) nothing changes.
    let mut g = vec![0.3f32, 0.4];
    assert!((clip_grad_norm(&mut g, 1.0) - 0.5).abs() < 1e-7);
    assert!((clip_grad_norm(&mut g, 0.0) - 0.5).abs() < 1e-7);
    assert_eq!(g, vec![0.3, 0.4]);
    // After clipping, the global norm is just under the limit.
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut big = random(&mut rng, 100_000);
    let before = clip_grad_norm(&mut big, 2.0);
    assert!(before > 2.0);
    let after = global_norm(&[&big]);
    assert!((after - 2.0).abs() < 1e-5, "{after}");
}

#[test]
fn backend_clipping_equals_clip_scale_bit_for_bit() {
    use tinylm::kernels::{AdamWStep, Allocator, Backend, Buffer, Cpu, HostBuf};
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let n = 100_003;
    let grads = HostBuf::from(random(&mut rng, n));
    let norm = global_norm(&[&grads]);
    let hp = AdamWParams {
        weight_decay: 0.1,
        ..AdamWParams::default()
    };
    // Clipped (the limit under the norm, also a hair under), not clipped (above), off.
    for max_norm in [
        Some(norm / 3.0),
        Some(norm * (1.0 - 1e-12)),
        Some(norm * 2.0),
        Some(0.0),
        None,
    ] {
        let want_scale = max_norm.map_or(1.0, |max| clip_scale(norm, max, CLIP_EPS));
        let (mut want, mut m, mut v) = (random(&mut rng, n), vec![0f32; n], vec![0f32; n]);
        let mut params = HostBuf::from(want.clone());
        let (mut got_m, mut got_v) = (HostBuf::from(m.clone()), HostBuf::from(v.clone()));
        let mut stats = Allocator::<f32>::alloc_stats(&Cpu, STATISTICS).unwrap();
        Backend::<f32>::sum_squares(&Cpu, grads.all(), &mut stats);
        assert_eq!(stats.grad_norm(), norm);
        for t in 1..=3 {
            let step = AdamWStep {
                lr: 1e-3,
                t,
                hp,
                max_norm,
            };
            assert_eq!(
                step.grad_scale(stats.sum_squares).to_bits(),
                want_scale.to_bits()
            );
            Cpu.adamw(
                params.all_mut(),
                grads.all(),
                got_m.all_mut(),
                got_v.all_mut(),
                &step,
                &stats,
            );
            adamw_step(&mut want, &grads, &mut m, &mut v, t, 1e-3, &hp, want_scale);
        }
        assert_eq!(params[..], want, "{max_norm:?}: parameters");
        assert_eq!(
            (&got_m[..], &got_v[..]),
            (&m[..], &v[..]),
            "{max_norm:?}: moments"
        );
    }
}
