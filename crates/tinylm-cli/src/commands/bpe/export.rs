//! `tinylm bpe export`: a tokenizer in another format: tiktoken's rank file (and the
//! Python lines that build the `tiktoken.Encoding`) or Hugging Face's `tokenizer.json`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use tinylm_bpe::files::{hf, tiktoken};

use super::source::TokenizerArgs;

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// tiktoken's mergeable ranks: `base64(token) rank` per line.
    Tiktoken,
    /// Hugging Face `tokenizer.json` (byte-level BPE, the split pattern, the specials).
    Hf,
}

#[derive(Args)]
pub struct ExportArgs {
    #[command(flatten)]
    tokenizer: TokenizerArgs,
    /// The format to write.
    #[arg(long, value_enum)]
    format: Format,
    /// The file to write (e.g. `NAME.tiktoken` or `tokenizer.json`).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let bpe = args.tokenizer.load_definition()?;
    match args.format {
        Format::Tiktoken => {
            tiktoken::save(&args.out, &bpe)?;
            eprintln!(
                "wrote {} ({} ranks, {} pattern); in Python:\n",
                args.out.display(),
                bpe.vocab.len() - bpe.specials.len(),
                bpe.pattern.name()
            );
            println!("{}", tiktoken::python_snippet(&args.out, &bpe));
        }
        Format::Hf => {
            hf::save(&args.out, &bpe)?;
            eprintln!(
                "wrote {}: load it with tokenizers.Tokenizer.from_file or transformers.PreTrainedTokenizerFast(tokenizer_file=...)",
                args.out.display()
            );
        }
    }
    Ok(())
}
