//! The whole model on the GPU against the CPU engine: logits, loss and every
//! gradient for every ablation, and decoding over KV caches.

use super::*;

fn model_config(norm: Norm, positional: Positional, ffn: Ffn, tie_embeddings: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 67,
        context_length: 40,
        d_model: 24,
        num_layers: 2,
        num_heads: 3,
        d_ff: 40,
        rope_theta: 50.0,
        norm,
        positional,
        ffn,
        tie_embeddings,
    }
}

#[test]
fn whole_model_logits_loss_and_every_gradient_match_the_cpu_for_every_ablation() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (b, t) = (3, 33);
    // Every ablation is compared before the verdict, so that a failure also shows
    // the largest error of each precision over all of them.
    let mut failures = Vec::new();
    for precision in PRECISIONS {
        let tol = model_tolerance(precision);
        let mut worst = (0.0, String::new());
        for c in ablations(model_config) {
            let p = perturbed_params(&c, 11);
            let ids = random_ids(&mut rng, b * t, c.vocab_size);
            let targets = random_ids(&mut rng, b * t, c.vocab_size);
            let mut cpu = Model::from_params(c.clone(), p.clone()).unwrap();
            let mut gpu_model = Model::with_backend(c.clone(), &p, gpu(precision)).unwrap();
            let what = format!("{precision:?} {c:?}");
            let mut compare = |got: &[f32], want: &[f32], quantity: &str| {
                let (error, at) = relative_error(got, want);
                if error > worst.0 || error.is_nan() {
                    worst = (error, format!("{what} {quantity}"));
                }
                if error > tol || error.is_nan() {
                    failures.push(format!(
                        "{what} {quantity}: relative error {error:.3e} > {tol:.1e} at {at} \
                         (got {}, want {})",
                        got[at], want[at]
                    ));
                }
            };
            let want = cpu.forward(&ids, b, t).unwrap().to_vec();
            let got = gpu_model.forward(&ids, b, t).unwrap().to_vec();
            compare(&got, &want, "logits");
            let want_loss = cpu.forward_loss(&ids, &targets, b, t).unwrap();
            let got_loss = gpu_model.forward_loss(&ids, &targets, b, t).unwrap();
            compare(&[got_loss], &[want_loss], "loss");
            cpu.backward().unwrap();
            gpu_model.backward().unwrap();
            let got = gpu_model.download_grads().unwrap();
            let layout = ParamLayout::new(&c);
            for ((name, _, want), (_, _, got)) in layout
                .tensors(cpu.grads())
                .into_iter()
                .zip(layout.tensors(&got))
            {
                compare(got, want, &format!("gradient of {name}"));
            }
        }
        println!(
            "{precision:?}: the largest relative error over the 24 ablations is {:.2e} \
             (bound {tol:.1e}), {}",
            worst.0, worst.1
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// KV-cache decoding on the GPU, one position at a time, in each precision: its
/// logits against the same GPU's full forward within [`same_gpu_tolerance`]; and
/// bf16's against fp32's on the same weights and tokens within [`model_tolerance`]
/// (the bound of bf16's full forward against f32's, which decoding repeats position
/// by position; the emulated GPU measures 4.2e-2 at most), picking fp32's greedy
/// token at [`GREEDY_SHARE`] of the positions or more.
#[test]
fn kv_cache_decoding_on_the_gpu_matches_its_full_forward_and_bf16_follows_fp32() {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let (mut greedy_equal, mut positions, mut worst) = (0, 0, 0f64);
    for c in ablations(model_config) {
        let (t, v) = (c.context_length, c.vocab_size);
        let p = perturbed_params(&c, 7);
        let ids = random_ids(&mut rng, t, v);
        let [fp32, bf16] = PRECISIONS.map(|precision| {
            let mut model = Model::with_backend(c.clone(), &p, gpu(precision)).unwrap();
            let full = model.forward(&ids, 1, t).unwrap().to_vec();
            let mut cache = model.new_cache().unwrap();
            let mut steps = Vec::with_capacity(t * v);
            for (pos, &id) in ids.iter().enumerate() {
                let step = model.decode_step(&mut cache, id).unwrap();
                let want = &full[pos * v..(pos + 1) * v];
                let what = format!("{precision:?} {c:?} decode position {pos}");
                assert_close(step, want, same_gpu_tolerance(precision), &what);
                steps.extend_from_slice(step);
            }
            assert!(
                model.decode_step(&mut cache, 0).is_err(),
                "a full cache is an error"
            );
            steps
        });
        for (pos, (want, got)) in fp32.chunks(v).zip(bf16.chunks(v)).enumerate() {
            let what = format!("{c:?} bf16 decoding against fp32's at position {pos}");
            assert_close(got, want, model_tolerance(Precision::Bf16), &what);
            worst = worst.max(relative_error(got, want).0);
            greedy_equal += usize::from(argmax(got) == argmax(want));
            positions += 1;
        }
    }
    let share = greedy_equal as f64 / positions as f64;
    println!(
        "bf16 decoding against fp32's: largest relative error {worst:.2e} (bound {:.1e}), \
         fp32's greedy token at {greedy_equal} of {positions} positions ({share:.3}, at \
         least {GREEDY_SHARE})",
        model_tolerance(Precision::Bf16)
    );
    assert!(
        share >= GREEDY_SHARE,
        "bf16 decoding picks fp32's greedy token at {share:.3} of the positions, under \
         {GREEDY_SHARE}"
    );
}

/// Several sequences decoded together on the GPU — two prompts of different lengths
/// in one pass, then a pass where one decodes a token while a third joins with its
/// prompt — give the logits of decoding each alone on the GPU, one token at a time,
/// within [`same_gpu_tolerance`].
#[test]
fn batched_decoding_on_the_gpu_matches_one_sequence_at_a_time() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for precision in PRECISIONS {
        for c in ablations(model_config) {
            let (p, v) = (perturbed_params(&c, 9), c.vocab_size);
            let mut model = Model::with_backend(c.clone(), &p, gpu(precision)).unwrap();
            let texts: Vec<Vec<u32>> = [10, 14, 21]
                .iter()
                .map(|&n| random_ids(&mut rng, n, v))
                .collect();
            let alone: Vec<Vec<Vec<f32>>> = (texts.iter())
                .map(|text| {
                    let mut cache = model.new_cache().unwrap();
                    (text.iter())
                        .map(|&id| model.decode_step(&mut cache, id).unwrap().to_vec())
                        .collect()
                })
                .collect();
            let passes: [&[(usize, std::ops::Range<usize>)]; 2] =
                [&[(0, 0..9), (1, 0..14)], &[(0, 9..10), (2, 0..21)]];
            let mut caches: Vec<_> = (0..3).map(|_| model.new_cache().unwrap()).collect();
            for (k, pass) in passes.iter().enumerate() {
                let mut by_sequence: Vec<_> = caches.iter_mut().map(Some).collect();
                let mut sequences: Vec<_> = (pass.iter())
                    .map(|(i, range)| NewTokens {
                        cache: by_sequence[*i].take().unwrap(),
                        tokens: &texts[*i][range.clone()],
                    })
                    .collect();
                let got = model.decode(&mut sequences).unwrap().to_vec();
                for (s, (i, range)) in pass.iter().enumerate() {
                    let what = format!("{precision:?} {c:?} pass {k}, sequence {i}");
                    let want = &alone[*i][range.end - 1];
                    let got = &got[s * v..(s + 1) * v];
                    assert_close(got, want, same_gpu_tolerance(precision), &what);
                }
            }
        }
    }
}
