//! The model against an independent naive forward (plain loops, straight from the
//! SPEC), KV-cache decoding against full passes, batched decoding of several
//! sequences against one token of one sequence at a time, overfitting one batch,
//! bad input.

mod common;

use common::{ablations, max_abs_diff, perturbed_params, softmax};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tinylm::config::{Ffn, ModelConfig, Norm, Positional};
use tinylm::kernels::{BatchPart, HostBuf};
use tinylm::optim::AdamW;
use tinylm::params::ParamLayout;
use tinylm::{KvCache, Model, NewTokens};

fn config(norm: Norm, positional: Positional, ffn: Ffn, tie_embeddings: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 19,
        context_length: 9,
        d_model: 12,
        num_layers: 2,
        num_heads: 3,
        d_ff: 20,
        rope_theta: 50.0,
        norm,
        positional,
        ffn,
        tie_embeddings,
    }
}

/// [`config`] with a context longer than one attention query block: decoding's.
fn long_config(norm: Norm, positional: Positional, ffn: Ffn, tie_embeddings: bool) -> ModelConfig {
    ModelConfig {
        context_length: 40,
        ..config(norm, positional, ffn, tie_embeddings)
    }
}

fn random_ids(rng: &mut ChaCha8Rng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
}

/// `x Wᵀ` for `x (n, d_in)`, `W (d_out, d_in)`.
fn linear(x: &[f64], w: &[f64], d_in: usize) -> Vec<f64> {
    let d_out = w.len() / d_in;
    x.chunks(d_in)
        .flat_map(|row| {
            (0..d_out).map(move |o| (0..d_in).map(|j| row[j] * w[o * d_in + j]).sum::<f64>())
        })
        .collect()
}

fn rmsnorm(x: &[f64], g: &[f64]) -> Vec<f64> {
    x.chunks(g.len())
        .flat_map(|row| {
            let rms = (row.iter().map(|v| v * v).sum::<f64>() / g.len() as f64 + 1e-5).sqrt();
            row.iter().zip(g).map(move |(v, g)| v / rms * g)
        })
        .collect()
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

/// The SPEC's model, one sequence at a time, written with plain loops in f64.
fn naive_forward(c: &ModelConfig, p: &[f32], ids: &[u32]) -> Vec<f64> {
    let layout = ParamLayout::new(c);
    let get = |name: &str| -> Vec<f64> {
        let name = if name == "lm_head.weight" && c.tie_embeddings {
            "token_embeddings.weight"
        } else {
            name
        };
        p[layout.get(name).unwrap_or_else(|| panic!("{name}")).range()]
            .iter()
            .map(|&v| v as f64)
            .collect()
    };
    let (d, t, h) = (c.d_model, ids.len(), c.num_heads);
    let dk = d / h;
    let emb = get("token_embeddings.weight");
    let mut x: Vec<f64> = ids
        .iter()
        .flat_map(|&id| emb[id as usize * d..(id as usize + 1) * d].to_vec())
        .collect();
    let silu = |v: f64| v / (1.0 + (-v).exp());
    for l in 0..c.num_layers {
        let w = |n: &str| get(&format!("layers.{l}.{n}.weight"));
        let mha = |x: &[f64]| -> Vec<f64> {
            let mut q = linear(x, &w("attn.q_proj"), d);
            let mut k = linear(x, &w("attn.k_proj"), d);
            let v = linear(x, &w("attn.v_proj"), d);
            if c.positional == Positional::Rope {
                for m in [&mut q, &mut k] {
                    for i in 0..t {
                        for head in 0..h {
                            for kk in 0..dk / 2 {
                                let angle =
                                    i as f64 / c.rope_theta.powf(2.0 * kk as f64 / dk as f64);
                                let at = i * d + head * dk + 2 * kk;
                                let (a, b) = (m[at], m[at + 1]);
                                m[at] = a * angle.cos() - b * angle.sin();
                                m[at + 1] = a * angle.sin() + b * angle.cos();
                            }
                        }
                    }
                }
            }
            let mut out = vec![0.0; t * d];
            for head in 0..h {
                for i in 0..t {
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            (0..dk)
                                .map(|e| q[i * d + head * dk + e] * k[j * d + head * dk + e])
                                .sum::<f64>()
                                / (dk as f64).sqrt()
                        })
                        .collect();
                    for (j, pr) in softmax(&scores).into_iter().enumerate() {
                        for e in 0..dk {
                            out[i * d + head * dk + e] += pr * v[j * d + head * dk + e];
                        }
                    }
                }
            }
            linear(&out, &w("attn.output_proj"), d)
        };
        let ffn = |x: &[f64]| -> Vec<f64> {
            let a = linear(x, &w("ffn.w1"), d);
            let gate: Vec<f64> = match c.ffn {
                Ffn::Swiglu => {
                    let b = linear(x, &w("ffn.w3"), d);
                    a.iter().zip(&b).map(|(&a, &b)| silu(a) * b).collect()
                }
                Ffn::Silu => a.iter().map(|&a| silu(a)).collect(),
            };
            linear(&gate, &w("ffn.w2"), c.d_ff)
        };
        x = match c.norm {
            Norm::Pre => {
                let y = add(&x, &mha(&rmsnorm(&x, &w("ln1"))));
                add(&y, &ffn(&rmsnorm(&y, &w("ln2"))))
            }
            Norm::Post => {
                let y = rmsnorm(&add(&x, &mha(&x)), &w("ln1"));
                rmsnorm(&add(&y, &ffn(&y)), &w("ln2"))
            }
            Norm::None => {
                let y = add(&x, &mha(&x));
                add(&y, &ffn(&y))
            }
        };
    }
    if c.norm == Norm::Pre {
        x = rmsnorm(&x, &get("ln_final.weight"));
    }
    linear(&x, &get("lm_head.weight"), d)
}

#[test]
fn forward_matches_the_naive_reference_in_every_ablation() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (b, t) = (3, 7);
    for c in ablations(config) {
        let p = perturbed_params(&c, 5);
        let ids = random_ids(&mut rng, b * t, c.vocab_size);
        let want: Vec<f64> = ids
            .chunks(t)
            .flat_map(|seq| naive_forward(&c, &p, seq))
            .collect();
        let mut model = Model::from_params(c.clone(), p.clone()).unwrap();
        let got = model.forward(&ids, b, t).unwrap();
        assert_eq!(got.len(), b * t * c.vocab_size);
        let worst = max_abs_diff(got, &want);
        assert!(worst < 1e-4, "{c:?}: max |f32 - naive| = {worst}");
        // The same orchestration in f64 agrees to rounding.
        let p64 = p.iter().map(|&v| v as f64).collect();
        let mut model64 = Model::<f64>::with_params(c.clone(), p64).unwrap();
        let got64 = model64.forward(&ids, b, t).unwrap();
        let worst64 = max_abs_diff(got64, &want);
        assert!(worst64 < 1e-10, "{c:?}: max |f64 - naive| = {worst64}");
    }
}

#[test]
fn forward_loss_is_the_mean_cross_entropy_of_the_logits() {
    let c = config(Norm::Pre, Positional::Rope, Ffn::Swiglu, false);
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (b, t) = (2, 9);
    let ids = random_ids(&mut rng, b * t, c.vocab_size);
    let targets = random_ids(&mut rng, b * t, c.vocab_size);
    let mut model = Model::new(c.clone(), 3).unwrap();
    let logits = model.forward(&ids, b, t).unwrap().to_vec();
    let want: f64 = logits
        .chunks(c.vocab_size)
        .zip(&targets)
        .map(|(row, &y)| {
            let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
            z.ln() - row[y as usize] as f64
        })
        .sum::<f64>()
        / (b * t) as f64;
    let loss = model.forward_loss(&ids, &targets, b, t).unwrap();
    assert!((loss as f64 - want).abs() < 1e-5, "{loss} vs {want}");
}

#[test]
fn kv_cache_decoding_matches_full_forward_at_every_position() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for c in ablations(long_config) {
        let t = c.context_length;
        let p = perturbed_params(&c, 7);
        let ids = random_ids(&mut rng, t, c.vocab_size);
        let mut model = Model::from_params(c.clone(), p).unwrap();
        let full = model.forward(&ids, 1, t).unwrap().to_vec();
        let mut cache = KvCache::new(&c);
        for (pos, &id) in ids.iter().enumerate() {
            assert_eq!(cache.len(), pos);
            let step = model.decode_step(&mut cache, id).unwrap();
            let want = &full[pos * c.vocab_size..(pos + 1) * c.vocab_size];
            let worst = step
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-4, "{c:?} position {pos}: {worst}");
        }
        let err = model.decode_step(&mut cache, 0).unwrap_err().to_string();
        assert!(err.contains("full"), "{err}");
        // A cleared cache starts over and reproduces position 0.
        cache.clear();
        let first = model.decode_step(&mut cache, ids[0]).unwrap();
        assert!((first[0] - full[0]).abs() < 1e-4);
    }
}

/// The largest difference between two rows of logits, relative to the largest logit.
fn relative_diff(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs());
    worst.fold(0.0f32, f32::max) / scale
}

/// Several sequences decoded together — prompts of different lengths prefilled in
/// one pass, then one token each per pass, a sequence joining with its prompt
/// while the others decode, another leaving — give each sequence the logits that
/// decoding it alone, one token at a time, gives.
#[test]
fn batched_decoding_equals_one_sequence_at_a_time() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for c in ablations(long_config) {
        let v = c.vocab_size;
        let mut model = Model::from_params(c.clone(), perturbed_params(&c, 8)).unwrap();
        // Each sequence's whole text, and the logits after each of its tokens when
        // it is decoded alone, one token per step.
        let texts: Vec<Vec<u32>> = [31, 18, 25, 34]
            .iter()
            .map(|&n| random_ids(&mut rng, n, v))
            .collect();
        let alone: Vec<Vec<Vec<f32>>> = texts
            .iter()
            .map(|text| {
                let mut cache = model.new_cache().unwrap();
                let steps = text
                    .iter()
                    .map(|&id| model.decode_step(&mut cache, id).unwrap().to_vec());
                steps.collect()
            })
            .collect();
        // The passes: sequence i feeds `text[i][fed[i]..fed[i] + n]` for each (i, n).
        let passes: &[&[(usize, usize)]] = &[
            &[(0, 7), (1, 1), (2, 12)],
            &[(0, 1), (1, 1), (2, 1)],
            &[(0, 1), (3, 20), (1, 1), (2, 1)],
            &[(1, 1), (3, 1), (0, 1)],
            &[(3, 1), (1, 14)],
            &[(0, 21), (3, 12), (2, 11)],
        ];
        let mut caches: Vec<_> = (0..texts.len())
            .map(|_| model.new_cache().unwrap())
            .collect();
        let mut fed = vec![0; texts.len()];
        for (k, pass) in passes.iter().enumerate() {
            let mut by_seq: Vec<Option<&mut KvCache>> = caches.iter_mut().map(Some).collect();
            let mut sequences: Vec<NewTokens> = pass
                .iter()
                .map(|&(i, n)| NewTokens {
                    cache: by_seq[i].take().unwrap(),
                    tokens: &texts[i][fed[i]..fed[i] + n],
                })
                .collect();
            let logits = model.decode(&mut sequences).unwrap().to_vec();
            assert_eq!(logits.len(), pass.len() * v);
            for (s, &(i, n)) in pass.iter().enumerate() {
                fed[i] += n;
                assert_eq!(caches[i].len(), fed[i]);
                let got = &logits[s * v..(s + 1) * v];
                let diff = relative_diff(got, &alone[i][fed[i] - 1]);
                assert!(diff < 1e-5, "{c:?} pass {k}, sequence {i}: {diff}");
            }
        }
        assert_eq!(fed, [31, 18, 25, 34]);
        // Bad passes are refused before any cache changes.
        let [a, b, ..] = &mut caches[..] else {
            unreachable!()
        };
        let mut over = [
            NewTokens {
                cache: a,
                tokens: &[1; 10],
            },
            NewTokens {
                cache: b,
                tokens: &[],
            },
        ];
        let err = model.decode(&mut over).unwrap_err().to_string();
        assert!(
            err.contains("full: 31 positions + 10 new > context_length 40"),
            "{err}"
        );
        over[0].tokens = &[1];
        let err = model.decode(&mut over).unwrap_err().to_string();
        assert!(err.contains("sequence 1 has no new token"), "{err}");
        over[1].tokens = &[99];
        let err = model.decode(&mut over).unwrap_err().to_string();
        assert!(
            err.contains("token id 99 at position 18 is >= vocab_size 19"),
            "{err}"
        );
        assert!(model.decode(&mut []).is_err());
        assert_eq!((caches[0].len(), caches[1].len()), (31, 18));
    }
}

#[test]
fn overfits_one_batch() {
    let c = ModelConfig {
        vocab_size: 16,
        context_length: 8,
        d_model: 32,
        num_layers: 2,
        num_heads: 4,
        d_ff: 64,
        ..config(Norm::Pre, Positional::Rope, Ffn::Swiglu, false)
    };
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (b, t) = (4, 8);
    let ids = random_ids(&mut rng, b * t, c.vocab_size);
    let targets = random_ids(&mut rng, b * t, c.vocab_size);
    let mut model = Model::new(c, 0).unwrap();
    let n = model.params().len();
    let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
    let (lr, b1, b2) = (1e-2f32, 0.9f32, 0.999f32);
    let first = model.forward_loss(&ids, &targets, b, t).unwrap();
    let mut loss = first;
    for step in 1..=300 {
        loss = model.forward_loss(&ids, &targets, b, t).unwrap();
        model.backward().unwrap();
        let grads = model.grads().to_vec();
        let params = model.params_mut();
        let corr = (1.0 - b2.powi(step)).sqrt() / (1.0 - b1.powi(step));
        for i in 0..n {
            m[i] = b1 * m[i] + (1.0 - b1) * grads[i];
            v[i] = b2 * v[i] + (1.0 - b2) * grads[i] * grads[i];
            params[i] -= lr * corr * m[i] / (v[i].sqrt() + 1e-8);
        }
    }
    assert!(first > 2.0, "initial loss {first}");
    assert!(loss < 0.05, "loss after 300 Adam steps: {loss}");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let c = config(Norm::Pre, Positional::Rope, Ffn::Swiglu, false);
    let mut model = Model::new(c.clone(), 0).unwrap();
    let ok = vec![1u32; 2 * 4];
    let msg = |r: tinylm::Result<()>| r.unwrap_err().to_string();

    let mut bad = ok.clone();
    bad[6] = 19;
    let e = msg(model.forward(&bad, 2, 4).map(|_| ()));
    assert!(
        e.contains("19") && e.contains("(1, 2)") && e.contains("vocab_size"),
        "{e}"
    );
    let e = msg(model.forward_loss(&ok, &bad, 2, 4).map(|_| ()));
    assert!(e.contains("target") && e.contains("(1, 2)"), "{e}");
    let long = vec![0u32; 10];
    let e = msg(model.forward(&long, 1, 10).map(|_| ()));
    assert!(e.contains("context_length"), "{e}");
    let e = msg(model.forward(&ok, 3, 4).map(|_| ()));
    assert!(e.contains("(3, 4)"), "{e}");
    assert!(model.forward(&[], 0, 4).is_err());
    let e = msg(model.backward());
    assert!(e.contains("forward_loss"), "{e}");
    // A forward after forward_loss invalidates the pending backward.
    model.forward_loss(&ok, &ok, 2, 4).unwrap();
    model.forward(&ok, 2, 4).unwrap();
    assert!(model.backward().is_err());

    let e = Model::from_params(c.clone(), vec![0.0; 5])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("5"), "{e}");
    let mut odd = c.clone();
    odd.num_heads = 5;
    assert!(Model::new(odd, 0).is_err());
    let mut other = c.clone();
    other.num_layers = 1;
    let mut cache = KvCache::new(&other);
    assert!(model.decode_step(&mut cache, 0).is_err());
    let mut cache = model.new_cache().unwrap();
    let e = msg(model.decode_step(&mut cache, 99).map(|_| ()));
    assert!(e.contains("99") && e.contains("position 0"), "{e}");
}

#[test]
fn queued_training_steps_read_in_order_and_at_most_two_in_flight() {
    let c = config(Norm::Pre, Positional::Rope, Ffn::Swiglu, false);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (b, t) = (2, 9);
    let batches: Vec<(Vec<u32>, Vec<u32>)> = (0..3)
        .map(|_| {
            let ids = random_ids(&mut rng, b * t, c.vocab_size);
            (ids, random_ids(&mut rng, b * t, c.vocab_size))
        })
        .collect();
    // A step: the batch's gradient, then AdamW clipped to norm 0.5.
    let step = |model: &mut Model, opt: &mut AdamW<HostBuf<f32>>, k: usize| {
        let (ids, targets) = &batches[k];
        model.accumulate_gradient(ids, targets, b, t, BatchPart::whole(b * t))?;
        model.optimizer_step(opt, 1e-2, Some(0.5), None)
    };
    // Each step's statistics read before the next is queued, against the loss of a
    // forward pass and the norm of the gradient read back before the step.
    let mut sync = Model::new(c.clone(), 0).unwrap();
    let mut opt = sync.new_adamw(Default::default()).unwrap();
    let mut want = Vec::new();
    for (k, (ids, targets)) in batches.iter().enumerate() {
        let loss = sync.forward_loss(ids, targets, b, t).unwrap();
        sync.backward().unwrap();
        let norm = sync
            .grads()
            .iter()
            .map(|&g| g as f64 * g as f64)
            .sum::<f64>();
        step(&mut sync, &mut opt, k).unwrap();
        let stats = sync.step_stats().unwrap();
        assert_eq!(stats.loss, loss as f64);
        assert!((stats.grad_norm() - norm.sqrt()).abs() <= 1e-6 * norm.sqrt());
        want.push((stats.loss, stats.grad_norm()));
    }
    let mut queued = Model::new(c, 0).unwrap();
    let mut opt = queued.new_adamw(Default::default()).unwrap();
    let msg = |r: tinylm::Result<()>| r.unwrap_err().to_string();
    let e = msg(queued.step_stats().map(|_| ()));
    assert!(e.contains("no training step in flight"), "{e}");
    step(&mut queued, &mut opt, 0).unwrap();
    step(&mut queued, &mut opt, 1).unwrap();
    let third = step(&mut queued, &mut opt, 2);
    assert!(msg(third).contains("two training steps are in flight"));
    let mut got = Vec::new();
    let stats = queued.step_stats().unwrap();
    got.push((stats.loss, stats.grad_norm()));
    step(&mut queued, &mut opt, 2).unwrap();
    for _ in 0..2 {
        let stats = queued.step_stats().unwrap();
        got.push((stats.loss, stats.grad_norm()));
    }
    assert_eq!(got, want);
    assert!(want.iter().any(|&(_, norm)| norm > 0.5), "{want:?}");
    assert_eq!(queued.params(), sync.params());
}

/// A step accumulated over micro-batches, each weighted as its part of the batch,
/// is the whole batch's step: the same loss, gradient norm and gradient (within
/// float reordering), in every ablation.
#[test]
fn micro_batches_accumulate_the_whole_batch_step() {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let (b, t) = (4, 7);
    for c in ablations(config) {
        let p = perturbed_params(&c, 5);
        let ids = random_ids(&mut rng, b * t, c.vocab_size);
        let targets = random_ids(&mut rng, b * t, c.vocab_size);
        // The step in micro-batches of `micro` sequences, AdamW clipped to norm 0.5:
        // the model after it and the step's statistics.
        let step = |micro: usize| {
            let mut model = Model::from_params(c.clone(), p.clone()).unwrap();
            let mut opt = model.new_adamw(Default::default()).unwrap();
            let rows = micro * t;
            for (i, (ids, targets)) in ids.chunks(rows).zip(targets.chunks(rows)).enumerate() {
                let part = BatchPart {
                    rows: b * t,
                    accumulate: i > 0,
                };
                model
                    .accumulate_gradient(ids, targets, micro, t, part)
                    .unwrap();
            }
            model
                .optimizer_step(&mut opt, 1e-2, Some(0.5), None)
                .unwrap();
            let stats = model.step_stats().unwrap();
            (model, stats)
        };
        let (whole, want) = step(b);
        let (parts, got) = step(1);
        assert!((got.loss - want.loss).abs() <= 1e-6 * want.loss, "{c:?}");
        let norm = want.grad_norm();
        assert!((got.grad_norm() - norm).abs() <= 1e-5 * norm, "{c:?}");
        let largest = whole.grads().iter().fold(0.0f32, |m, g| m.max(g.abs()));
        let worst = (whole.grads().iter().zip(parts.grads()))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-5 * largest,
            "{c:?}: gradients differ by {worst}"
        );
    }
}

/// `backward` overwrites the gradient: after another batch's backward, every tensor
/// (products overwrite, norm gains and embeddings restart from zero) equals a fresh
/// model's gradient bit for bit, in every ablation, tied and untied.
#[test]
fn backward_overwrites_the_previous_gradient() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (b, t) = (2, 7);
    for c in ablations(config) {
        let p = perturbed_params(&c, 4);
        let batch = |rng: &mut ChaCha8Rng| {
            let ids = random_ids(rng, b * t, c.vocab_size);
            (ids, random_ids(rng, b * t, c.vocab_size))
        };
        let ((ids_a, targets_a), (ids_b, targets_b)) = (batch(&mut rng), batch(&mut rng));
        let mut used = Model::from_params(c.clone(), p.clone()).unwrap();
        used.forward_loss(&ids_a, &targets_a, b, t).unwrap();
        used.backward().unwrap();
        used.forward_loss(&ids_b, &targets_b, b, t).unwrap();
        used.backward().unwrap();
        let mut fresh = Model::from_params(c.clone(), p).unwrap();
        fresh.forward_loss(&ids_b, &targets_b, b, t).unwrap();
        fresh.backward().unwrap();
        assert!(used.grads().iter().any(|&g| g != 0.0));
        assert_eq!(used.grads(), fresh.grads(), "{c:?}");
    }
}
