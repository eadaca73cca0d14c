//! Training in bf16 mixed precision on the CPU ([`CpuMixed`]) against the same model
//! in `f32` ([`Cpu`]), on the same weights and batch: logits, loss and every
//! tensor's gradient within bf16's tolerances; the rounding to nearest (a
//! truncating rounding shrinks every operand and so the logits: caught by their
//! slope against `f32`'s); the CPU's native bf16 kernel and the portable one giving
//! the same step; and training steps that follow `f32`'s.

// Each test file uses some of the shared helpers.
#[allow(dead_code)]
mod cpu;

use cpu::expected_native_bf16;
use tinylm::kernels::cpu::bf16::Bf16Kernel;
use tinylm::kernels::{Backend, BatchPart, Cpu, CpuMixed};
use tinylm::params::ParamLayout;
use tinylm::{Model, ModelConfig};

fn config() -> ModelConfig {
    ModelConfig {
        vocab_size: 96,
        context_length: 32,
        d_model: 64,
        num_layers: 2,
        num_heads: 4,
        d_ff: 160,
        ..ModelConfig::tinystories()
    }
}

const B: usize = 4;
const T: usize = 32;

/// `(ids, targets)` of a batch.
fn batch(c: &ModelConfig) -> (Vec<u32>, Vec<u32>) {
    let ids: Vec<u32> = (0..B * T).map(|i| (i * 37 % c.vocab_size) as u32).collect();
    let targets = ids
        .iter()
        .map(|&i| (i * 5 + 1) % c.vocab_size as u32)
        .collect();
    (ids, targets)
}

/// Logits, loss and gradient of one batch on `backend`.
fn pass<B: Backend<f32>>(backend: B, params: &[f32]) -> (Vec<f32>, f32, Vec<f32>) {
    let c = config();
    let (ids, targets) = batch(&c);
    let mut model = Model::with_backend(c, params, backend).unwrap();
    let logits = model.forward(&ids, B, T).unwrap().to_vec();
    let loss = model.forward_loss(&ids, &targets, B, T).unwrap();
    model.backward().unwrap();
    (logits, loss, model.download_grads().unwrap())
}

/// `‖got − want‖ / ‖want‖`.
fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (g as f64 - w as f64).powi(2);
        norm += (w as f64).powi(2);
    }
    (diff / norm).sqrt()
}

/// The least-squares slope of `got` against `want` (1 when unbiased).
fn slope(got: &[f32], want: &[f32]) -> f64 {
    let dot: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| g as f64 * w as f64)
        .sum();
    dot / want.iter().map(|&w| (w as f64).powi(2)).sum::<f64>()
}

/// bf16 keeps 8 significant bits: a value's rounding error is at most 2⁻⁹ of it,
/// and errors of independent roundings add up over a sum's terms as a random walk.
#[test]
fn bf16_logits_loss_and_every_gradient_are_f32_within_bf16_tolerances() {
    let c = config();
    let layout = ParamLayout::new(&c);
    let params = layout.init(7);
    let (logits, loss, grads) = pass(Cpu, &params);
    let (logits16, loss16, grads16) = pass(CpuMixed::new(), &params);
    let logits_error = relative_error(&logits16, &logits);
    let slope = slope(&logits16, &logits);
    println!(
        "bf16 against f32: logits {logits_error:.2e} (slope {slope:.5}), loss {loss16} \
         against {loss}"
    );
    assert!(logits_error < 1e-2, "logits {logits_error:.2e}");
    assert!(
        ((loss16 - loss) / loss).abs() < 1e-3,
        "loss {loss16} vs {loss}"
    );
    for spec in &layout.specs {
        let range = spec.offset..spec.offset + spec.len();
        let error = relative_error(&grads16[range.clone()], &grads[range]);
        println!("  {:<32} gradient {error:.2e}", spec.name);
        assert!(error < 3e-2, "{}: gradient {error:.2e}", spec.name);
    }
    // Rounding to nearest is unbiased; truncation shrinks every operand, and so the
    // logits (measured with the parameters' copy and the bf16 activations truncated:
    // a slope of 0.9946, against 1.0001 rounded to nearest).
    assert!(
        (slope - 1.0).abs() < 2e-3,
        "slope {slope}: not rounded to nearest?"
    );
}

#[test]
fn the_native_and_the_portable_bf16_kernel_give_the_same_step() {
    // The native kernel where the CPU's features call for one (`tests/dispatch.rs`):
    // on a CPU without, there is no second kernel to compare.
    assert_eq!(Bf16Kernel::native(), expected_native_bf16());
    let Some(native) = Bf16Kernel::native() else {
        return;
    };
    let params = ParamLayout::new(&config()).init(3);
    let (logits, loss, grads) = pass(CpuMixed::on(native), &params);
    let portable = pass(CpuMixed::on(Bf16Kernel::Portable), &params);
    assert!(relative_error(&portable.0, &logits) < 1e-6);
    assert!((portable.1 - loss).abs() <= 1e-6 * loss.abs());
    assert!(relative_error(&portable.2, &grads) < 1e-5);
}

/// `steps` training steps (AdamW) on `backend`: each step's loss.
fn train<B: Backend<f32>>(backend: B, steps: usize, micro_batches: usize) -> Vec<f64> {
    let c = config();
    let (ids, targets) = batch(&c);
    let mut model = Model::init_with_backend(c, 1, backend).unwrap();
    let mut opt = model.new_adamw(Default::default()).unwrap();
    let micro = B / micro_batches * T;
    (0..steps)
        .map(|_| {
            for (i, (ids, targets)) in ids.chunks(micro).zip(targets.chunks(micro)).enumerate() {
                let part = BatchPart {
                    rows: B * T,
                    accumulate: i > 0,
                };
                let b = ids.len() / T;
                model.accumulate_gradient(ids, targets, b, T, part).unwrap();
            }
            model
                .optimizer_step(&mut opt, 3e-3, Some(1.0), None)
                .unwrap();
            model.step_stats().unwrap().loss
        })
        .collect()
}

#[test]
fn bf16_training_follows_f32_and_micro_batches_change_nothing_but_rounding() {
    let f32s = train(Cpu, 30, 1);
    let bf16s = train(CpuMixed::new(), 30, 1);
    let micro = train(CpuMixed::new(), 30, 2);
    for (step, ((a, b), m)) in f32s.iter().zip(&bf16s).zip(&micro).enumerate() {
        assert!((b - a).abs() < 2e-2 * a, "step {step}: bf16 {b}, f32 {a}");
        assert!(
            (m - b).abs() < 1e-3 * b,
            "step {step}: 2 micro-batches {m}, one {b}"
        );
    }
    assert!(bf16s[29] < 0.5 * bf16s[0], "bf16 does not learn: {bf16s:?}");
}

/// Generation's 8-bit weights ([`CpuMixed::q8`]): the logits of a full pass and of
/// decoding token by token on a KV cache within Q8_0's tolerance of `f32`'s (8
/// bits per value, one scale per 32: a few times bf16's error), unbiased; a model
/// whose layers do not split into whole blocks is refused, naming the dimension.
#[test]
fn q8_0_logits_are_f32_within_8_bit_tolerance() {
    let c = config();
    let params = ParamLayout::new(&c).init(7);
    let (ids, _) = batch(&c);
    let mut f32_model = Model::with_backend(c.clone(), &params, Cpu).unwrap();
    let want = f32_model.forward(&ids, B, T).unwrap().to_vec();
    let mut q8_model = Model::with_backend(c.clone(), &params, CpuMixed::q8()).unwrap();
    let got = q8_model.forward(&ids, B, T).unwrap().to_vec();
    let (error, slope) = (relative_error(&got, &want), slope(&got, &want));
    println!("q8_0 against f32: logits {error:.2e} (slope {slope:.5})");
    assert!(
        error < 3e-2 && (slope - 1.0).abs() < 1e-2,
        "{error:.2e}, slope {slope}"
    );
    // Decoding the first sequence token by token: each position's logits.
    let mut cache = q8_model.new_cache().unwrap();
    let v = c.vocab_size;
    let decoded: Vec<f32> = (0..T)
        .flat_map(|i| q8_model.decode_step(&mut cache, ids[i]).unwrap().to_vec())
        .collect();
    let error = relative_error(&decoded, &want[..T * v]);
    assert!(error < 3e-2, "decoded logits {error:.2e}");

    let odd = ModelConfig {
        d_model: 48,
        num_heads: 4,
        ..c
    };
    let params = ParamLayout::new(&odd).init(7);
    let err = Model::with_backend(odd, &params, CpuMixed::q8())
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("d_model to be a multiple of 32 (it is 48)"),
        "{err}"
    );
}

/// A forward-only backend ([`CpuMixed::forward_only`], and Q8_0's, always) reads a
/// checkpoint's weights straight into their copy, never into `f32` values — or
/// maps a file's values where tinylm wrote them and makes the copy from them — and
/// makes no copy of what no product reads: every logit of a full pass and of
/// decoding is the same as with the values written (the model built from host
/// memory, whose copy is made from them all), with the embedding tied to the
/// output layer or not, and the parameters are not read back. The feed-forward
/// weights (256 · 640 values) are read in several parts.
#[test]
fn forward_only_models_read_the_same_weights_into_their_copy_alone() {
    for tie_embeddings in [false, true] {
        let c = ModelConfig {
            d_model: 256,
            d_ff: 640,
            num_layers: 1,
            tie_embeddings,
            ..config()
        };
        let layout = ParamLayout::new(&c);
        let params = layout.init(11);
        let dir = tempfile::tempdir().unwrap();
        let (mapped, read) = (dir.path().join("ckpt"), dir.path().join("reversed"));
        tinylm::checkpoint::save(&mapped, &c, &params, None, &Default::default()).unwrap();
        let mut tensors = layout.tensors(&params);
        tensors.reverse();
        tinylm::safetensors_io::save_safetensors(&read, &tensors, &Default::default()).unwrap();
        let (ids, _) = batch(&c);
        for path in [&mapped, &read] {
            let opened = tinylm::weights::open(path, Some(&c)).unwrap();
            for (name, backend) in [
                ("bf16", CpuMixed::new().forward_only()),
                ("q8_0", CpuMixed::q8()),
            ] {
                let name = format!("{name}, {}, tied {tie_embeddings}", path.display());
                let mut from_host = Model::with_backend(c.clone(), &params, backend).unwrap();
                let mut from_file = opened.model(backend).unwrap();
                let want = from_host.forward(&ids, B, T).unwrap().to_vec();
                assert!(
                    from_file.forward(&ids, B, T).unwrap() == &want[..],
                    "{name}"
                );
                let (mut a, mut b) = (
                    from_host.new_cache().unwrap(),
                    from_file.new_cache().unwrap(),
                );
                for &id in &ids[..T] {
                    let want = from_host.decode_step(&mut a, id).unwrap().to_vec();
                    let got = from_file.decode_step(&mut b, id).unwrap();
                    assert!(got == &want[..], "{name}");
                }
                let err = from_file.download_params().unwrap_err().to_string();
                assert!(err.contains("forward-only"), "{name}: {err}");
            }
        }
    }
}
