//! Generation in each precision against `f32`, on the path generation really takes:
//! a trained model's checkpoint opened as `tinylm generate` opens it (the file's
//! values mapped; bf16 and Q8_0 copies made from them by forward-only backends),
//! the prompt prefilled in one decoding pass, then one token a pass on the KV cache
//! (bf16 under both: [`tinylm::kernels::BufKind::Cache`]) through the few-rows
//! products.
//!
//! Two comparisons, each with a bound sized for what differs between its sides:
//! - **each precision against `f32`** on the same weights, teacher-forced on `f32`'s
//!   greedy continuation: every step's logits within the precision's rounding of
//!   `f32`'s, and the greedy token equal at a stated share of the steps;
//! - **decoding against the full forward in the same precision**: the same roundings
//!   of the same values, summed in another order; bounds far below the first's, so
//!   that a cache written or read wrong cannot hide under a precision's error.

use tinylm::generate::argmax;
use tinylm::kernels::{Backend, BatchPart, Cpu, CpuMixed};
use tinylm::model::{Model, NewTokens};
use tinylm::ModelConfig;

/// A byte-level model (token = byte) big enough for the few-rows products to run
/// whole blocks of weight rows (`d_model` and `d_ff` multiples of 32, as Q8_0 needs).
fn config() -> ModelConfig {
    ModelConfig {
        vocab_size: 256,
        context_length: 160,
        d_model: 64,
        num_layers: 2,
        num_heads: 4,
        d_ff: 192,
        ..ModelConfig::tinystories()
    }
}

/// The prompt's length and the steps decoded after it (`PROMPT + STEPS ≤ 160`).
const PROMPT: usize = 32;
const STEPS: usize = 120;

/// The environment variable naming a checkpoint of [`trained`]'s model to decode,
/// written there first when it is missing. Under qemu's emulated CPUs every float
/// operation is a softfloat call: the 300 training steps take hours (about 100 s a
/// step under `-cpu Haswell`), the decoding seconds. So CI trains on the real CPU
/// and decodes the same file on the emulated ones (`.ci/run`); unset, the test
/// trains its own.
const SHARED_CHECKPOINT: &str = "TINYLM_DECODE_CHECKPOINT";

/// Parameters trained in `f32` on TinyStories bytes, long enough that the model's
/// next-byte distributions are peaked (a random model's near-uniform logits would
/// make the greedy token a coin toss between near ties in any precision).
fn trained(c: &ModelConfig, text: &[u8]) -> Vec<f32> {
    let (b, t) = (16, 64);
    let mut model = Model::init_with_backend(c.clone(), 3, Cpu).unwrap();
    let mut opt = model.new_adamw(Default::default()).unwrap();
    let (mut state, mut loss) = (0x2545_f491_4f6c_dd1du64, f64::NAN);
    for _ in 0..300 {
        let mut ids = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        for _ in 0..b {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % (text.len() - t - 1) as u64) as usize;
            ids.extend(text[at..at + t].iter().map(|&x| x as u32));
            targets.extend(text[at + 1..at + t + 1].iter().map(|&x| x as u32));
        }
        let whole = BatchPart::whole(b * t);
        model
            .accumulate_gradient(&ids, &targets, b, t, whole)
            .unwrap();
        model
            .optimizer_step(&mut opt, 3e-3, Some(1.0), None)
            .unwrap();
        loss = model.step_stats().unwrap().loss;
    }
    assert!(loss < 2.2, "the model did not learn: loss {loss}");
    model.download_params().unwrap()
}

/// The logits `(STEPS, V)` of decoding `tokens` on `model`: the first [`PROMPT`]
/// in one pass, then one token a pass; the logits after the prompt and after each
/// token but the last.
fn decoded<B: Backend<f32>>(model: &mut Model<f32, B>, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache().unwrap();
    let mut logits = (model.decode(&mut [NewTokens {
        cache: &mut cache,
        tokens: &tokens[..PROMPT],
    }]))
    .unwrap()
    .to_vec();
    for &token in &tokens[PROMPT..PROMPT + STEPS - 1] {
        logits.extend_from_slice(model.decode_step(&mut cache, token).unwrap());
    }
    logits
}

/// The full forward's logits at the positions [`decoded`] returns.
fn full<B: Backend<f32>>(model: &mut Model<f32, B>, tokens: &[u32]) -> Vec<f32> {
    let (n, v) = (PROMPT + STEPS - 1, model.config().vocab_size);
    let logits = model.forward(&tokens[..n], 1, n).unwrap();
    logits[(PROMPT - 1) * v..].to_vec()
}

/// Each step's `‖got − want‖ / ‖want‖`, in order.
fn step_errors(got: &[f32], want: &[f32], v: usize) -> Vec<f64> {
    (got.chunks(v).zip(want.chunks(v)))
        .map(|(got, want)| {
            let (mut diff, mut norm) = (0f64, 0f64);
            for (&g, &w) in got.iter().zip(want) {
                diff += (g as f64 - w as f64).powi(2);
                norm += (w as f64).powi(2);
            }
            (diff / norm).sqrt()
        })
        .collect()
}

/// The median and the largest of `errors`, with the step of the largest.
fn median_and_worst(errors: &[f64]) -> (f64, f64, usize) {
    let mut sorted = errors.to_vec();
    sorted.sort_by(f64::total_cmp);
    let (worst, step) = (errors.iter().enumerate())
        .map(|(s, &e)| (e, s))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    (sorted[sorted.len() / 2], worst, step)
}

/// The share of steps whose greedy token is the same in `got` and `want`.
fn greedy_agreement(got: &[f32], want: &[f32], v: usize) -> f64 {
    let same = (got.chunks(v).zip(want.chunks(v)))
        .filter(|(got, want)| argmax(got) == argmax(want))
        .count();
    same as f64 / (got.len() / v) as f64
}

/// What a precision's decoding must meet: every step's error against `f32`, the
/// least share of greedy tokens equal to `f32`'s, and against its own full forward
/// the median step's error and every step's.
struct Bounds {
    against_f32: f64,
    agreement: f64,
    own_median: f64,
    own_worst: f64,
}

#[test]
fn bf16_and_q8_0_decoding_follow_f32_and_their_own_full_forward() {
    let c = config();
    let text = tinylm_corpus::tinystories().into_bytes();
    // Train on the first 90% of the stories; prompt from a story after it.
    let split = text.len() * 9 / 10;
    let dir = tempfile::tempdir().unwrap();
    let path = match std::env::var_os(SHARED_CHECKPOINT) {
        Some(path) => std::path::PathBuf::from(path),
        None => dir.path().join("checkpoint.safetensors"),
    };
    if !path.exists() {
        let params = trained(&c, &text[..split]);
        tinylm::checkpoint::save(&path, &c, &params, None, &Default::default()).unwrap();
    }
    let weights = tinylm::weights::open(&path, Some(&c)).unwrap();
    let v = c.vocab_size;

    // f32's greedy continuation of the prompt: the tokens every precision is fed.
    let start = split
        + text[split..]
            .windows(5)
            .position(|w| w == b"Once ")
            .unwrap();
    let mut tokens: Vec<u32> = (text[start..start + PROMPT].iter())
        .map(|&x| x as u32)
        .collect();
    let mut f32_model = weights.model(Cpu).unwrap();
    let mut cache = f32_model.new_cache().unwrap();
    let mut next = argmax(
        f32_model
            .decode(&mut [NewTokens {
                cache: &mut cache,
                tokens: &tokens,
            }])
            .unwrap(),
    );
    while tokens.len() < PROMPT + STEPS {
        tokens.push(next);
        next = argmax(f32_model.decode_step(&mut cache, next).unwrap());
    }
    let want = decoded(&mut f32_model, &tokens);
    let text: String = tokens.iter().map(|&t| t as u8 as char).collect();
    println!("f32's greedy continuation: {text:?}");

    // f32 decoding against its own full forward: one rounding per operation, the
    // sums in another order (gemm's blocks against dot products); 1e-5 is a few
    // hundred f32 units of rounding after 2 layers, where logits are O(10)
    // (measured 5e-7).
    let (_, worst, step) = median_and_worst(&step_errors(&want, &full(&mut f32_model, &tokens), v));
    println!("f32: decoding against the full forward {worst:.1e} at worst (step {step})");
    assert!(
        worst < 1e-5,
        "f32 decoding {worst:.1e} from its full forward at step {step}"
    );

    let precisions = [
        (
            "bf16",
            CpuMixed::new().forward_only(),
            // Against f32: every product operand rounded to bf16 (2⁻⁹ relative), the
            // KV cache too: a full pass's logits are within 1e-2 of f32's
            // (tests/bf16.rs); measured 1.4e-3 at the median step, 7e-3 at worst.
            // Against its own full pass: the same bf16 values, summed in f32 in
            // another order (a prompt's rows in gemm's blocks, a decoded row as dot
            // products). Where no sum's last f32 bit moves an activation across a
            // bf16 rounding boundary, that is all (measured 6e-8 at the median
            // step). Where one does, that value changes by a bf16 step (2⁻⁸), and
            // if it is a key or value in the cache it stays changed for every later
            // position; through a sharp softmax the change can reach a precision's
            // error (measured 1.6e-3 at worst, in a tenth of the steps). So: half
            // the steps within 1e-6 — a cache written or read wrong moves every
            // step by a bf16 rounding or more — and every step within bf16's bound.
            Bounds {
                against_f32: 1e-2,
                agreement: 0.95,
                own_median: 1e-6,
                own_worst: 1e-2,
            },
        ),
        (
            "q8_0",
            CpuMixed::q8(),
            // Against f32: 8 bits per weight and per activation, one scale per 32
            // values: a few times bf16's error (a full pass within 3e-2 of f32's,
            // tests/bf16.rs); measured 4.4e-3 at the median step, 2.3e-2 at worst.
            // Against its own full pass: every linear product is one row's exact
            // int8 sums per block, scaled and added in the same order whatever the
            // rows beside it, so the activations are the same and no rounding
            // flips; what may differ is the order of attention's f32 sums: f32's
            // bound at every step (measured: equal bit for bit).
            Bounds {
                against_f32: 3e-2,
                agreement: 0.9,
                own_median: 1e-5,
                own_worst: 1e-5,
            },
        ),
    ];
    for (name, backend, bounds) in precisions {
        let mut model = weights.model(backend).unwrap();
        let got = decoded(&mut model, &tokens);
        let (median, worst, step) = median_and_worst(&step_errors(&got, &want, v));
        let agreement = greedy_agreement(&got, &want, v);
        let own = step_errors(&got, &full(&mut model, &tokens), v);
        let (own_median, own_worst, own_step) = median_and_worst(&own);
        println!(
            "{name}: against f32 {median:.1e} at the median step, {worst:.1e} at worst (step \
             {step}), the greedy token equal at {:.1}% of {STEPS} steps; against its own full \
             forward {own_median:.1e} at the median step, {own_worst:.1e} at worst (step \
             {own_step})",
            100.0 * agreement
        );
        assert!(
            worst < bounds.against_f32,
            "{name}: step {step}'s logits {worst:.1e} from f32's (bound {:.0e})",
            bounds.against_f32
        );
        assert!(
            agreement >= bounds.agreement,
            "{name}: greedy tokens equal to f32's at {:.1}% of the steps (at least {:.0}%)",
            100.0 * agreement,
            100.0 * bounds.agreement
        );
        assert!(
            own_median < bounds.own_median && own_worst < bounds.own_worst,
            "{name}: decoding from its own full forward {own_median:.1e} at the median step \
             (bound {:.0e}), {own_worst:.1e} at step {own_step} (bound {:.0e})",
            bounds.own_median,
            bounds.own_worst
        );
    }
}
