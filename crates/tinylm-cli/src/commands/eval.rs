//! `tinylm eval`: validation loss and perplexity of a checkpoint on a token file.

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use tinylm::data::TokenDataset;
use tinylm::device::{run_on, BackendTask};
use tinylm::kernels::Backend;
use tinylm::train::{evaluate, EvalResult};
use tinylm::weights::{self, OpenedWeights};

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// A checkpoint written by `tinylm train` (or any safetensors file with the
    /// SPEC weight names and a `config` metadata entry), or an exported Hugging
    /// Face directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Tokens to evaluate on: a 1-D `.npy`.
    #[arg(long)]
    data: PathBuf,
    /// Windows of context_length tokens per forward pass.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Evaluate at most this many batches, 0 for the whole file.
    #[arg(long, default_value_t = 0)]
    max_batches: usize,
    /// Worker threads, 0 for one per core.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[command(flatten)]
    device: super::flags::DeviceArgs,
}

pub fn run(args: EvalArgs) -> Result<()> {
    anyhow::ensure!(args.batch_size > 0, "--batch-size must be positive");
    rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build_global()
        .context("starting the thread pool")?;
    let ckpt = weights::open(&args.checkpoint, None)?;
    let data = TokenDataset::open(&args.data, ckpt.config.vocab_size)?;
    let t = ckpt.config.context_length;
    let task = Evaluation {
        weights: ckpt,
        data: &data,
        batch_size: args.batch_size,
        max_batches: args.max_batches,
    };
    let r = run_on(args.device.device, args.device.precision, task)?;
    println!(
        "val_loss {:.4}  perplexity {:.3}  ({} windows of {t} tokens from {})",
        r.loss,
        r.perplexity(),
        r.windows,
        args.data.display()
    );
    Ok(())
}

/// The evaluation, on whichever backend `--device` names.
struct Evaluation<'a> {
    weights: OpenedWeights,
    data: &'a TokenDataset,
    batch_size: usize,
    max_batches: usize,
}

impl BackendTask for Evaluation<'_> {
    type Output = EvalResult;
    fn run<B: Backend<f32>>(self, backend: B) -> tinylm::Result<EvalResult> {
        let mut model = self.weights.model(backend)?;
        evaluate(&mut model, self.data, self.batch_size, self.max_batches)
    }
}
