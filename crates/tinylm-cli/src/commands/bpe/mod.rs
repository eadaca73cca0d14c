//! `tinylm bpe ...`: train a tokenizer, encode text to `.npy`, decode ids, convert
//! between tokenizer formats.

mod decode;
mod encode;
mod export;
mod source;
mod train;

use std::path::Path;

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct BpeArgs {
    #[command(subcommand)]
    command: BpeCommand,
}

#[derive(Subcommand)]
enum BpeCommand {
    /// Train a byte-level BPE tokenizer on a text file.
    Train(train::TrainArgs),
    /// Encode a text file to a `.npy` of token ids.
    Encode(encode::EncodeArgs),
    /// Decode a `.npy` of token ids to text on stdout.
    Decode(decode::DecodeArgs),
    /// Write a tokenizer as a tiktoken rank file or a Hugging Face `tokenizer.json`.
    Export(export::ExportArgs),
}

pub fn run(args: BpeArgs) -> anyhow::Result<()> {
    match args.command {
        BpeCommand::Train(a) => train::run(a),
        BpeCommand::Encode(a) => encode::run(a),
        BpeCommand::Decode(a) => decode::run(a),
        BpeCommand::Export(a) => export::run(a),
    }
}

/// `tinylm bpe train --input INPUT --vocab-size N --special-token SPECIAL --out OUT`
/// (GPT-2's split pattern), with its progress bars and report.
pub fn train_tokenizer(
    input: &Path,
    vocab_size: usize,
    special: &str,
    out: &Path,
) -> anyhow::Result<()> {
    train::run(train::TrainArgs::new(input, vocab_size, special, out))
}

/// `tinylm bpe encode --tokenizer TOKENIZER --input INPUT --out OUT` on all cores, with
/// its progress bar and report.
pub fn encode_file(tokenizer: &Path, input: &Path, out: &Path) -> anyhow::Result<()> {
    encode::run(encode::EncodeArgs::new(tokenizer, input, out))
}
