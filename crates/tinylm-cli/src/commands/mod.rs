//! One module per `tinylm` subcommand.

pub mod bench;
pub mod bpe;
pub mod eval;
pub mod export;
pub mod forward;
pub mod generate;
pub mod import;
pub mod info;
pub mod quickstart;
pub mod train;

/// Sizes rayon's global pool for the command: `Some(n)` threads (n ≥ 1), else one per core.
pub fn set_threads(threads: Option<usize>) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(n) = threads {
        anyhow::ensure!(n > 0, "--threads must be at least 1");
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("starting the thread pool")?;
    }
    Ok(())
}

/// `--device` and `--precision`, for the commands that run a model.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct DeviceArgs {
    /// Where the model runs: cpu, cuda, cuda:N (GPU N) or auto (CUDA when a usable
    /// GPU is present).
    #[arg(long, default_value = "cpu")]
    pub device: tinylm::device::Device,
    /// GPU arithmetic: bf16 (mixed precision) or fp32 (the CPU's results).
    #[arg(long, default_value = "bf16")]
    pub precision: tinylm::kernels::Precision,
}
