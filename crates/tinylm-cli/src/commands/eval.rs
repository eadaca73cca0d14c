//! `tinylm eval`: validation loss and perplexity of a checkpoint on a token file.

use super::flags::{DeviceArgs, ThreadsArg};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use tinylm::data::TokenDataset;
use tinylm::device::AnyBackend;
use tinylm::on_backend;
use tinylm::train::evaluate;
use tinylm::weights;

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
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(args: EvalArgs) -> Result<()> {
    anyhow::ensure!(args.batch_size > 0, "--batch-size must be positive");
    args.threads.apply()?;
    let ckpt = weights::open(&args.checkpoint, None)?;
    let data = TokenDataset::open(&args.data, ckpt.config.vocab_size)?;
    let t = ckpt.config.context_length;
    let backend = AnyBackend::open_forward_only(args.device.device, args.device.precision)?;
    let r = tinylm::kernels::cpu::on_pool(|| -> Result<_> {
        Ok(on_backend!(backend, backend => {
            let mut model = ckpt.model(backend)?;
            evaluate(&mut model, &data, args.batch_size, args.max_batches)?
        }))
    })?;
    println!(
        "val_loss {:.4}  perplexity {:.3}  ({} windows of {t} tokens from {})",
        r.loss,
        r.perplexity(),
        r.windows,
        args.data.display()
    );
    Ok(())
}
