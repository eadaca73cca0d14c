//! `tinylm bpe decode`: print the text of a `.npy` of token ids.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::source::TokenizerArgs;

#[derive(Args)]
pub struct DecodeArgs {
    #[command(flatten)]
    tokenizer: TokenizerArgs,
    /// `.npy` of token ids (uint16, uint32, int32 or int64), e.g. from `tinylm bpe encode`.
    #[arg(long)]
    input: PathBuf,
}

pub fn run(args: DecodeArgs) -> anyhow::Result<()> {
    let tokenizer = args.tokenizer.load()?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    match tokenizer.decode_file(&args.input, &mut out) {
        Err(tinylm_bpe::Error::Io(e)) if e.err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => {
            result?;
            match out.flush() {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => Ok(other?),
            }
        }
    }
}
