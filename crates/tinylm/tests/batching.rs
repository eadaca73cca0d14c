//! Continuous batching against generation one sequence at a time: sequences that
//! join while others decode, a prompt spread over two passes, a sequence removed
//! midway, end-of-text and length endings — each sequence's tokens are the ones
//! `generate` draws for it alone with the same sampler, also when its prompt's start
//! was found in an ended sequence's cache.

mod ids;

use ids::ids;
use std::collections::HashMap;
use std::ops::ControlFlow;
use tinylm::batching::{Batcher, Drawn, Finish, Request};
use tinylm::generate::{generate, Sampler};
use tinylm::kernels::HostBuf;
use tinylm::logprobs::token_logprobs;
use tinylm::{Model, ModelConfig};

fn config() -> ModelConfig {
    ModelConfig {
        vocab_size: 53,
        context_length: 40,
        d_model: 32,
        num_layers: 2,
        num_heads: 4,
        d_ff: 64,
        ..ModelConfig::tinystories()
    }
}

fn sampler(k: usize) -> Sampler {
    match k % 2 {
        0 => Sampler::greedy(),
        _ => Sampler::new(0.9, 0.95, None, k as u64).unwrap(),
    }
}

#[test]
fn batched_sequences_draw_what_each_draws_alone() {
    let c = config();
    let mut model = Model::new(c.clone(), 21).unwrap();
    // (prompt length, max tokens, step at which it is added)
    let plan = [
        (5, 20, 0),
        (1, 12, 0),
        (9, 30, 0),
        (36, 4, 2), // joins while 3 sequences decode: its prompt fits the 37 rows left
        (38, 2, 3), // waits for a slot, then its prompt takes two passes
        (3, 25, 3),
        (12, 10, 9),
    ];
    let eos = 7;
    let alone: Vec<Vec<u32>> = (plan.iter().enumerate())
        .map(|(k, &(len, max, _))| {
            let prompt = ids(len, c.vocab_size, k);
            let mut s = sampler(k);
            generate(&mut model, &prompt, max, &mut s, Some(eos), |_| {
                ControlFlow::Continue(())
            })
            .unwrap()
        })
        .collect();
    let mut batcher = Batcher::new(&model, 4).unwrap();
    let mut waiting: Vec<usize> = Vec::new();
    let mut got: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut ended: HashMap<u64, Finish> = HashMap::new();
    let mut most = 0;
    for step in 0.. {
        waiting.extend((0..plan.len()).filter(|&k| plan[k].2 == step));
        while !batcher.is_full() && !waiting.is_empty() {
            let k = waiting.remove(0);
            let (len, max, _) = plan[k];
            let request = Request {
                prompt: ids(len, c.vocab_size, k),
                max_tokens: max,
                sampler: sampler(k),
                eos: Some(eos),
                logprobs: None,
            };
            batcher.add(&model, k as u64, request).unwrap();
        }
        most = most.max(batcher.len());
        if batcher.is_empty() && step > 9 {
            break;
        }
        for Drawn {
            id, token, finish, ..
        } in batcher.step(&mut model).unwrap()
        {
            assert!(
                !ended.contains_key(&id),
                "sequence {id} drew after it ended"
            );
            got.entry(id).or_default().extend(token);
            if let Some(finish) = finish {
                ended.insert(id, finish);
            }
        }
    }
    assert_eq!(most, 4, "the slots were all used");
    for (k, want) in alone.iter().enumerate() {
        let id = k as u64;
        assert_eq!(
            got.get(&id).cloned().unwrap_or_default(),
            *want,
            "sequence {k}"
        );
        let finish = match want.len() == plan[k].1 {
            true => Finish::Length,
            false => Finish::EndOfText,
        };
        assert_eq!(ended[&id], finish, "sequence {k}");
    }
    assert!(ended.values().any(|&f| f == Finish::EndOfText));
}

#[test]
fn a_removed_sequence_frees_its_slot_and_bad_requests_are_refused() {
    let c = config();
    let mut model = Model::new(c.clone(), 3).unwrap();
    let request = |len: usize, max_tokens: usize| Request {
        prompt: ids(len, c.vocab_size, len),
        max_tokens,
        sampler: Sampler::greedy(),
        eos: None,
        logprobs: None,
    };
    let mut batcher = Batcher::new(&model, 2).unwrap();
    batcher.add(&model, 1, request(4, 30)).unwrap();
    batcher.add(&model, 2, request(6, 30)).unwrap();
    let err = batcher
        .add(&model, 3, request(4, 3))
        .unwrap_err()
        .to_string();
    assert!(err.contains("all 2 slots are taken"), "{err}");
    for _ in 0..3 {
        assert_eq!(batcher.step(&mut model).unwrap().len(), 2);
    }
    assert!(batcher.remove(1));
    assert!(!batcher.remove(1));
    // The freed slot (and its cache) takes a new sequence, which draws what it
    // draws alone.
    batcher.add(&model, 3, request(9, 5)).unwrap();
    let mut drawn = Vec::new();
    while !batcher.is_empty() {
        let step = batcher.step(&mut model).unwrap();
        drawn.extend(step.iter().filter(|d| d.id == 3).filter_map(|d| d.token));
        if drawn.len() == 5 {
            assert!(batcher.remove(2));
        }
    }
    let alone = generate(
        &mut model,
        &ids(9, c.vocab_size, 9),
        5,
        &mut Sampler::greedy(),
        None,
        |_| ControlFlow::Continue(()),
    );
    assert_eq!(drawn, alone.unwrap());
    for (len, max, what) in [
        (0, 3, "a prompt token"),
        (4, 0, "at least one new token"),
        (
            30,
            11,
            "30 prompt tokens + 11 new ones exceed the context length 40",
        ),
    ] {
        let err = batcher
            .add(&model, 9, request(len, max))
            .unwrap_err()
            .to_string();
        assert!(err.contains(what), "{err}");
    }
    let mut bad = request(3, 3);
    bad.prompt[1] = 53;
    let err = batcher.add(&model, 9, bad).unwrap_err().to_string();
    assert!(err.contains("token id 53 at position 1"), "{err}");
    assert!(Batcher::new(&model, 0).is_err() && Batcher::new(&model, 41).is_err());
}

/// Runs the sequences `(id, prompt, sampler)` together to their ends (8 tokens
/// each, no end of text): how many of each prompt's tokens were found in a spare
/// cache, and what each drew.
fn run_together(
    batcher: &mut Batcher<HostBuf<f32>>,
    model: &mut Model<f32>,
    sequences: &[(u64, &[u32], usize)],
) -> Vec<(usize, Vec<u32>)> {
    let mut found = Vec::new();
    for &(id, prompt, k) in sequences {
        let request = Request {
            prompt: prompt.to_vec(),
            max_tokens: 8,
            sampler: sampler(k),
            eos: None,
            logprobs: None,
        };
        found.push(batcher.add(model, id, request).unwrap());
    }
    let mut drawn: HashMap<u64, Vec<u32>> = HashMap::new();
    while !batcher.is_empty() {
        for d in batcher.step(model).unwrap() {
            drawn.entry(d.id).or_default().extend(d.token);
        }
    }
    (sequences.iter().zip(found))
        .map(|(&(id, _, _), found)| (found, drawn.remove(&id).unwrap_or_default()))
        .collect()
}

/// What `prompt` draws alone with `sampler(k)` (8 tokens).
fn alone(model: &mut Model<f32>, prompt: &[u32], k: usize) -> Vec<u32> {
    generate(model, prompt, 8, &mut sampler(k), None, |_| {
        ControlFlow::Continue(())
    })
    .unwrap()
}

/// With at most 9 prompt rows a pass, three 9-token prompts that arrive together
/// go in one a pass: the first draws its first token after pass 1 (and goes on
/// drawing while the others' prompts go in), the second after pass 2, the third
/// after pass 3 — each drawing what it draws alone. A longer prompt is spread over
/// passes of 9 rows; 0 rows is refused.
#[test]
fn a_bound_on_prompt_rows_starts_the_first_prompts_first() {
    let c = config();
    let mut model = Model::new(c.clone(), 17).unwrap();
    let mut batcher = (Batcher::new(&model, 4).unwrap())
        .with_prefill_rows(9)
        .unwrap();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|k| ids(if k < 3 { 9 } else { 20 }, c.vocab_size, k))
        .collect();
    for (k, prompt) in prompts.iter().enumerate() {
        let request = Request {
            prompt: prompt.clone(),
            max_tokens: 8,
            sampler: sampler(k),
            eos: None,
            logprobs: None,
        };
        batcher.add(&model, k as u64, request).unwrap();
    }
    let mut drawn: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut first_pass: HashMap<u64, usize> = HashMap::new();
    for pass in 1.. {
        if batcher.is_empty() {
            break;
        }
        for d in batcher.step(&mut model).unwrap() {
            first_pass.entry(d.id).or_insert(pass);
            drawn.entry(d.id).or_default().extend(d.token);
        }
    }
    // The 20-token prompt: 9 + 9 + 2 rows in passes 4, 5 and 6.
    let want_first: HashMap<u64, usize> = HashMap::from([(0, 1), (1, 2), (2, 3), (3, 6)]);
    assert_eq!(first_pass, want_first);
    for (k, prompt) in prompts.iter().enumerate() {
        assert_eq!(
            drawn[&(k as u64)],
            alone(&mut model, prompt, k),
            "sequence {k}"
        );
    }
    let err = Batcher::new(&model, 4)
        .unwrap()
        .with_prefill_rows(0)
        .err()
        .unwrap();
    assert!(err.to_string().contains("at least one prompt row"), "{err}");
}

#[test]
fn a_prompt_found_in_an_ended_sequence_s_cache_is_not_prefilled_again() {
    let c = config();
    let mut model = Model::new(c.clone(), 21).unwrap();
    let a = ids(9, c.vocab_size, 1);
    let mut b = ids(6, c.vocab_size, 2);
    b[0] = (a[0] + 1) % c.vocab_size as u32; // shares no start with `a`
    let mut batcher = Batcher::new(&model, 2).unwrap();
    let first = run_together(&mut batcher, &mut model, &[(0, &a, 0), (1, &b, 1)]);
    let want = [(0, alone(&mut model, &a, 0)), (0, alone(&mut model, &b, 1))];
    assert_eq!(first, want);
    // `a`'s cache holds `a` and the first 7 drawn tokens (the 8th never went in).
    let mut a_more = a.clone();
    a_more.extend(&first[0].1[..3]);
    a_more.push(4);
    // `b` again, all but its last token found (its logits draw the first new one);
    // `a` and 3 of its tokens found, in the other spare cache.
    let second = run_together(&mut batcher, &mut model, &[(2, &b, 3), (3, &a_more, 4)]);
    let want = [
        (b.len() - 1, alone(&mut model, &b, 3)),
        (a.len() + 3, alone(&mut model, &a_more, 4)),
    ];
    assert_eq!(second, want);
}

#[test]
fn drawn_tokens_carry_the_log_probabilities_of_the_full_forward_pass() {
    let c = config();
    let mut model = Model::new(c.clone(), 5).unwrap();
    let prompt = ids(6, c.vocab_size, 4);
    let mut batcher = Batcher::new(&model, 2).unwrap();
    // Beside another sequence, restricted to the first 50 ids as a smaller
    // tokenizer restricts a model's draws.
    let request = |logprobs| Request {
        prompt: prompt.clone(),
        max_tokens: 5,
        sampler: Sampler::new(0.9, 1.0, None, 3).unwrap().vocabulary(50),
        eos: None,
        logprobs,
    };
    batcher.add(&model, 0, request(Some(4))).unwrap();
    batcher.add(&model, 1, request(None)).unwrap();
    let mut drawn = Vec::new();
    while !batcher.is_empty() {
        for d in batcher.step(&mut model).unwrap() {
            assert_eq!(d.logprobs.is_some(), d.id == 0);
            if d.id == 0 {
                drawn.push(d.logprobs.unwrap());
            }
        }
    }
    assert_eq!(drawn.len(), 5);
    let mut text = prompt.clone();
    for got in drawn {
        let t = text.len();
        let logits = model.forward(&text, 1, t).unwrap();
        let last = &logits[(t - 1) * c.vocab_size..][..50];
        let want = token_logprobs(last, got.token, 4);
        assert!(
            (got.logprob - want.logprob).abs() < 1e-4,
            "{got:?} {want:?}"
        );
        assert_eq!(got.top.len(), 4);
        for (g, w) in got.top.iter().zip(&want.top) {
            assert_eq!(g.0, w.0);
            assert!((g.1 - w.1).abs() < 1e-4, "{got:?} {want:?}");
        }
        assert!(got.top.iter().all(|&(id, _)| id < 50));
        text.push(got.token);
    }
}
