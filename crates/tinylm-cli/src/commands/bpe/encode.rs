//! `tinylm bpe encode`.

use clap::Args;

#[derive(Args)]
pub struct EncodeArgs {}

pub fn run(_args: EncodeArgs) -> anyhow::Result<()> {
    anyhow::bail!("tinylm bpe encode is not implemented yet")
}
