//! `tinylm bpe ...`: train, encode, decode.

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct BpeArgs {
    #[command(subcommand)]
    command: BpeCommand,
}

#[derive(Subcommand)]
enum BpeCommand {}

pub fn run(args: BpeArgs) -> anyhow::Result<()> {
    match args.command {}
}
