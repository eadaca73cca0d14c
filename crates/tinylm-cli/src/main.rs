//! `tinylm`: the command-line tool.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tinylm",
    version,
    about = "Train a byte-level BPE tokenizer and a Transformer LM from scratch"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Byte-level BPE tokenizer: train, encode, decode.
    Bpe(commands::bpe::BpeArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bpe(args) => commands::bpe::run(args),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(2);
    }
}
