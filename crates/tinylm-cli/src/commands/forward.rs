//! `tinylm forward`: logits, loss and parameter gradients for given weights and
//! token ids, in files NumPy and PyTorch read — to check tinylm against another
//! implementation of the same model.

use super::flags::{DeviceArgs, ThreadsArg};
use anyhow::{bail, Result};
use clap::Args;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tinylm::accounting::{InferenceMemory, Memory, Part};
use tinylm::device::AnyBackend;
use tinylm::on_backend;
use tinylm::params::ParamLayout;
use tinylm::safetensors_io::save_safetensors;
use tinylm::text::byte_size;
use tinylm::weights;
use tinylm::ModelConfig;
use tinylm_bpe::npy::{self, Dtype, MappedNpy};

#[derive(Args, Debug)]
// fp32 by default, PyTorch's default: the logits and gradients of a float32 model
// are what this command is compared with (`auto` would be bf16 on a CPU or GPU that
// multiplies bf16 natively, a few 1e-3 away); bf16 and q8_0 on request.
#[command(mut_arg("precision", |arg| {
    arg.default_value("fp32").help(
        "Arithmetic: fp32 (PyTorch's default, to compare with a float32 model), \
         bf16 (mixed precision: bf16 products summed in f32), auto (bf16 where the CPU \
         or GPU multiplies bf16 natively, else fp32) or q8_0 (8-bit weights, without \
         gradients)",
    )
}))]
pub struct ForwardArgs {
    /// Model configuration JSON (CS336 keys, or a run's `config.json`); needed only
    /// for a weights-only file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Weights: safetensors with one tensor per parameter name, a `tinylm train`
    /// checkpoint (optimizer state ignored) or an exported Hugging Face directory.
    #[arg(long)]
    weights: PathBuf,
    /// Token ids `.npy` (int64, int32, uint16 or uint32) of shape (B, T), or (T,).
    #[arg(long)]
    input: PathBuf,
    /// Next-token targets `.npy`, the input's shape: print the mean cross-entropy.
    #[arg(long)]
    targets: Option<PathBuf>,
    /// Where to write the logits: float32 `.npy` of the input's shape + (V,).
    #[arg(long)]
    logits_out: PathBuf,
    /// Where to write the loss's gradient of every parameter, by name (safetensors).
    #[arg(long, requires = "targets")]
    grads_out: Option<PathBuf>,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(args: ForwardArgs) -> Result<()> {
    args.threads.apply()?;
    let given = args
        .config
        .as_deref()
        .map(ModelConfig::from_json_file)
        .transpose()?;
    let weights = weights::open(&args.weights, given.as_ref())?;
    let config = weights.config.clone();
    let (ids, shape) = read_ids(&args.input, &config)?;
    let (b, t) = match shape[..] {
        [t] => (1, t),
        [b, t] => (b, t),
        _ => unreachable!("read_ids checks the rank"),
    };
    let targets = match &args.targets {
        Some(path) => {
            let (targets, target_shape) = read_ids(path, &config)?;
            if target_shape != shape {
                bail!(
                    "{}: targets have shape {target_shape:?}, the input {} has {shape:?}",
                    path.display(),
                    args.input.display()
                );
            }
            Some(targets)
        }
        None => None,
    };

    let backend = args.device.backend_kind();
    let mut said = InferenceMemory::forward(&config, b, t, backend).describe(backend);
    if args.grads_out.is_some() && targets.is_some() {
        let step = Memory::new(&config, b, t, backend);
        said += &format!(
            "; the backward pass adds {} (gradients and its scratch)",
            byte_size(step.bytes(Part::Gradients) + step.bytes(Part::BackwardScratch))
        );
    }
    eprintln!("{said}");
    let mut logits_shape = shape.clone();
    logits_shape.push(config.vocab_size);
    let layout = ParamLayout::new(&config);
    let precision = match args.grads_out {
        // Gradients are training's: q8_0 (generation's) is refused, saying so.
        Some(_) => args.device.precision.for_training()?,
        None => args.device.precision,
    };
    let backend = AnyBackend::open(args.device.device, precision)?;
    let (logits, loss, grads) = on_backend!(backend, backend => {
        let mut model = weights.model(backend)?;
        let logits = model.forward(&ids, b, t)?.to_vec();
        match &targets {
            None => (logits, None, None),
            Some(targets) => {
                let loss = model.forward_loss(&ids, targets, b, t)?;
                let grads = match args.grads_out.is_some() {
                    true => Some(model.backward().and_then(|()| model.download_grads())?),
                    false => None,
                };
                (logits, Some(loss), grads)
            }
        }
    });
    npy::write(&args.logits_out, &logits_shape, &logits)?;
    if let Some(loss) = loss {
        println!("loss {loss}");
        println!("perplexity {}", loss.exp());
    }
    if let (Some(path), Some(grads), Some(loss)) = (&args.grads_out, grads, loss) {
        let meta = BTreeMap::from([
            ("format".to_string(), "pt".to_string()),
            ("loss".to_string(), loss.to_string()),
        ]);
        save_safetensors(path, &layout.tensors(&grads), &meta)?;
    }
    Ok(())
}

/// Token ids of a `(B, T)` or `(T,)` integer `.npy`, checked against the model:
/// every id in `[0, vocab_size)` (an error names its position), `T` at most the
/// context length.
fn read_ids(path: &Path, c: &ModelConfig) -> Result<(Vec<u32>, Vec<usize>)> {
    let array = MappedNpy::open(path)?;
    let shape = array.header.shape.clone();
    if array.header.dtype == Dtype::F32 {
        bail!(
            "{}: token ids must be integers (int64, int32, uint16 or uint32), not float32",
            path.display()
        );
    }
    let t = match shape[..] {
        [t] | [_, t] if t > 0 && !array.is_empty() => t,
        _ => bail!(
            "{}: token ids must have shape (B, T) or (T,) with B, T ≥ 1, not {shape:?}",
            path.display()
        ),
    };
    if t > c.context_length {
        bail!(
            "{}: sequences of {t} tokens exceed the context length {}",
            path.display(),
            c.context_length
        );
    }
    let ids = (0..array.len())
        .map(|i| {
            let id = array.int_at(i);
            if id < 0 || id >= c.vocab_size as i64 {
                bail!(
                    "{}: token id {id} at position ({}, {}) is outside the vocabulary [0, {})",
                    path.display(),
                    i / t,
                    i % t,
                    c.vocab_size
                );
            }
            Ok(id as u32)
        })
        .collect::<Result<Vec<u32>>>()?;
    Ok((ids, shape))
}
