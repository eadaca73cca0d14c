//! `tinylm bpe train`.

use clap::Args;

#[derive(Args)]
pub struct TrainArgs {}

pub fn run(_args: TrainArgs) -> anyhow::Result<()> {
    anyhow::bail!("tinylm bpe train is not implemented yet")
}
