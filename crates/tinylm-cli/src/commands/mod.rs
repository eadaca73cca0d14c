//! One module per `tinylm` subcommand, and what several share: their flags
//! ([`flags`]), the tokenizer that goes with a model ([`tokenizer`]), a prompt's
//! continuation streamed as text ([`continuation`]), running as one of many ranks
//! ([`ranks`]).

pub mod bench;
pub mod bpe;
pub mod continuation;
pub mod data;
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
pub mod serve;
pub mod sweep;
pub mod tokenizer;
pub mod train;

/// Set by Ctrl-C (or SIGTERM): the training going on checkpoints after its current
/// step and ends.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs the Ctrl-C handler and returns the flag it sets; a second Ctrl-C exits at once.
pub fn stop_on_ctrl_c() -> anyhow::Result<&'static std::sync::atomic::AtomicBool> {
    use anyhow::Context;
    use std::sync::atomic::Ordering;
    ctrlc::set_handler(|| {
        if STOP.swap(true, Ordering::Relaxed) {
            std::process::exit(130); // a second signal: leave at once
        }
    })
    .context("installing the Ctrl-C handler")?;
    Ok(&STOP)
}
