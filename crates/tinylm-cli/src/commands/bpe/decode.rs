//! `tinylm bpe decode`.

use clap::Args;

#[derive(Args)]
pub struct DecodeArgs {}

pub fn run(_args: DecodeArgs) -> anyhow::Result<()> {
    anyhow::bail!("tinylm bpe decode is not implemented yet")
}
