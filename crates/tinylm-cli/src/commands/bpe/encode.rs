//! `tinylm bpe encode`: encode a UTF-8 text file to a `.npy` of token ids.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tinylm_bpe::encode::{Tokenizer, Utf8Chunks};
use tinylm_bpe::npy::{Dtype, NpyWriter};

use super::source::TokenizerArgs;
use crate::commands::flags::ThreadsArg;

#[derive(Args)]
pub struct EncodeArgs {
    #[command(flatten)]
    tokenizer: TokenizerArgs,
    /// UTF-8 text file to encode.
    #[arg(long)]
    input: PathBuf,
    /// Output `.npy` (uint16 when the vocabulary has at most 65,536 tokens, else uint32).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    threads: ThreadsArg,
    /// Read the input as a stream in bounded memory, on one thread, instead of mapping it.
    #[arg(long, conflicts_with = "threads")]
    stream: bool,
}

impl EncodeArgs {
    /// The flags for encoding `input` with the tokenizer directory `tokenizer` on all
    /// cores.
    pub fn new(tokenizer: &Path, input: &Path, out: &Path) -> Self {
        EncodeArgs {
            tokenizer: TokenizerArgs::dir(tokenizer),
            input: input.to_path_buf(),
            out: out.to_path_buf(),
            threads: ThreadsArg::default(),
            stream: false,
        }
    }
}

pub fn run(args: EncodeArgs) -> anyhow::Result<()> {
    let tokenizer = args.tokenizer.load()?;
    let total = std::fs::metadata(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?
        .len();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "encoding {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid progress template"),
    );
    let start = Instant::now();
    let (bytes, tokens) = if args.stream {
        encode_stream(&tokenizer, &args, &bar)?
    } else {
        let summary =
            tokenizer.encode_file(&args.input, &args.out, args.threads.count(), |done| {
                bar.set_position(done as u64)
            })?;
        (summary.bytes, summary.tokens)
    };
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "{}: {bytes} bytes -> {tokens} tokens ({:.3} bytes/token) in {seconds:.2} s ({:.1} MB/s), {} written",
        args.input.display(),
        bytes as f64 / tokens.max(1) as f64,
        bytes as f64 / 1e6 / seconds.max(1e-9),
        args.out.display()
    );
    Ok(())
}

/// Counts the bytes read into the progress bar.
struct Counted<'a> {
    file: File,
    bar: &'a ProgressBar,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

/// The streaming path: ids written as they come, memory independent of the input size.
fn encode_stream(
    tokenizer: &Tokenizer,
    args: &EncodeArgs,
    bar: &ProgressBar,
) -> anyhow::Result<(usize, usize)> {
    let file =
        File::open(&args.input).with_context(|| format!("cannot read {}", args.input.display()))?;
    let mut writer = NpyWriter::create(&args.out, Dtype::for_vocab(tokenizer.vocab_size()))?;
    let mut stream = tokenizer.stream();
    let mut ids = Vec::new();
    for chunk in Utf8Chunks::new(Counted { file, bar }) {
        let chunk = chunk.with_context(|| args.input.display().to_string())?;
        stream.push(&chunk, &mut ids);
        writer.write_ids(&ids)?;
        ids.clear();
    }
    stream.finish(&mut ids);
    writer.write_ids(&ids)?;
    let tokens = writer.count();
    writer.finish()?;
    Ok((bar.position() as usize, tokens))
}
