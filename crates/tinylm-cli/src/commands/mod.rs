//! One module per `tinylm` subcommand, and the flags several share ([`flags`]).

pub mod bench;
pub mod bpe;
pub mod eval;
pub mod export;
pub mod flags;
pub mod forward;
pub mod generate;
pub mod import;
pub mod info;
pub mod plot;
pub mod quickstart;
pub mod ranks;
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
