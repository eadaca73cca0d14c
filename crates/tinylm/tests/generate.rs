//! The generation loop on small random models: KV-cache logits equal the full
//! forward's, generation equals a reference that re-runs the full forward on the
//! last `context_length` tokens, long prompts keep their last tokens, and seeded
//! sampling is deterministic.

mod ids;

use ids::ids;
use std::ops::ControlFlow;
use tinylm::config::{Norm, Positional};
use tinylm::generate::{argmax, generate, Sampler};
use tinylm::model::Model;
use tinylm::ModelConfig;

fn config() -> ModelConfig {
    ModelConfig {
        vocab_size: 61,
        context_length: 12,
        d_model: 32,
        num_layers: 2,
        num_heads: 4,
        d_ff: 64,
        ..ModelConfig::tinystories()
    }
}

fn generate_all(model: &mut Model, prompt: &[u32], n: usize, sampler: &mut Sampler) -> Vec<u32> {
    generate(model, prompt, n, sampler, None, |_| {
        ControlFlow::Continue(())
    })
    .unwrap()
}

#[test]
fn kv_cache_logits_equal_the_full_forward() {
    let variants = [
        config(),
        ModelConfig {
            norm: Norm::Post,
            ..config()
        },
        ModelConfig {
            positional: Positional::None,
            tie_embeddings: true,
            ..config()
        },
    ];
    for c in variants {
        let (t, v) = (c.context_length, c.vocab_size);
        let mut model = Model::new(c.clone(), 3).unwrap();
        let x = ids(t, v, 1);
        let full = model.forward(&x, 1, t).unwrap().to_vec();
        let mut cache = model.new_cache().unwrap();
        for (pos, &id) in x.iter().enumerate() {
            let step = model.decode_step(&mut cache, id).unwrap();
            let want = &full[pos * v..(pos + 1) * v];
            for (i, (a, b)) in step.iter().zip(want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{c:?}: position {pos}, logit {i}: cache {a} vs full {b}"
                );
            }
        }
        assert!(
            model.decode_step(&mut cache, 0).is_err(),
            "a full cache is refused"
        );
    }
}

/// Greedy generation without a cache: the full forward over the last
/// `context_length` tokens, then the argmax of the last position.
fn reference_greedy(model: &mut Model, prompt: &[u32], n: usize, eos: Option<u32>) -> Vec<u32> {
    let (ctx, v) = (model.config().context_length, model.config().vocab_size);
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < n {
        let window = &seq[seq.len().saturating_sub(ctx)..];
        let logits = model.forward(window, 1, window.len()).unwrap();
        let token = argmax(&logits[(window.len() - 1) * v..]);
        if Some(token) == eos {
            break;
        }
        out.push(token);
        seq.push(token);
    }
    out
}

#[test]
fn greedy_generation_equals_the_full_forward_reference_across_slides() {
    let c = config();
    let mut model = Model::new(c.clone(), 11).unwrap();
    for prompt_len in [1, 5, c.context_length, 3 * c.context_length + 2] {
        let prompt = ids(prompt_len, c.vocab_size, prompt_len);
        // 3 windows' worth of new tokens: the window slides many times.
        let n = 3 * c.context_length;
        let want = reference_greedy(&mut model, &prompt, n, None);
        let got = generate_all(&mut model, &prompt, n, &mut Sampler::greedy());
        assert_eq!(got, want, "prompt of {prompt_len} tokens");
    }
}

#[test]
fn long_prompts_keep_their_last_tokens() {
    let c = config();
    let mut model = Model::new(c.clone(), 5).unwrap();
    let long = ids(4 * c.context_length + 3, c.vocab_size, 2);
    let tail = &long[long.len() - c.context_length..];
    for temperature in [0.0, 0.8] {
        let mut a = Sampler::new(temperature, 0.9, None, 42).unwrap();
        let mut b = Sampler::new(temperature, 0.9, None, 42).unwrap();
        assert_eq!(
            generate_all(&mut model, &long, 20, &mut a),
            generate_all(&mut model, tail, 20, &mut b)
        );
    }
}

#[test]
fn stops_at_eos_without_emitting_it_and_at_max_tokens() {
    let c = config();
    let mut model = Model::new(c.clone(), 7).unwrap();
    let prompt = ids(4, c.vocab_size, 9);
    let free = reference_greedy(&mut model, &prompt, 30, None);
    // The first token that differs from the start of the output, used as eos.
    let k = (1..free.len())
        .find(|&i| !free[..i].contains(&free[i]))
        .expect("some new token");
    let eos = free[k];
    let mut seen = Vec::new();
    let out = generate(
        &mut model,
        &prompt,
        30,
        &mut Sampler::greedy(),
        Some(eos),
        |t| {
            seen.push(t);
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    assert_eq!(out, free[..k]);
    assert_eq!(seen, out, "the callback sees every emitted token, in order");
    let out = generate_all(&mut model, &prompt, 5, &mut Sampler::greedy());
    assert_eq!(out, free[..5]);
    assert!(generate_all(&mut model, &prompt, 0, &mut Sampler::greedy()).is_empty());
    // The callback can stop generation.
    let out = generate(
        &mut model,
        &prompt,
        30,
        &mut Sampler::greedy(),
        None,
        |_| ControlFlow::Break(()),
    )
    .unwrap();
    assert_eq!(out, free[..1]);
}

#[test]
fn sampling_is_deterministic_under_a_seed() {
    let c = config();
    let mut model = Model::new(c.clone(), 1).unwrap();
    let prompt = ids(3, c.vocab_size, 4);
    let run = |model: &mut Model, seed| {
        let mut s = Sampler::new(1.0, 0.95, Some(40), seed).unwrap();
        generate_all(model, &prompt, 40, &mut s)
    };
    let a = run(&mut model, 1);
    assert_eq!(a.len(), 40);
    assert_eq!(a, run(&mut model, 1));
    assert_ne!(a, run(&mut model, 2));
}

#[test]
fn empty_and_out_of_vocabulary_prompts() {
    let c = config();
    let mut model = Model::new(c.clone(), 1).unwrap();
    let greedy = &mut Sampler::greedy();
    let from_eos = generate(&mut model, &[], 4, greedy, Some(0), |_| {
        ControlFlow::Continue(())
    });
    let want = reference_greedy(&mut model, &[0], 4, Some(0));
    assert_eq!(from_eos.unwrap(), want);
    let err = generate(&mut model, &[], 4, greedy, None, |_| {
        ControlFlow::Continue(())
    });
    assert!(err.unwrap_err().to_string().contains("empty prompt"));
    let err = generate_all_err(&mut model, &[1, 2, 61]);
    assert!(err.contains("61") && err.contains("position 2"), "{err}");
}

fn generate_all_err(model: &mut Model, prompt: &[u32]) -> String {
    generate(model, prompt, 4, &mut Sampler::greedy(), None, |_| {
        ControlFlow::Continue(())
    })
    .unwrap_err()
    .to_string()
}
