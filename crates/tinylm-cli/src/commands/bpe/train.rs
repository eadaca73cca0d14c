//! `tinylm bpe train`: train a byte-level BPE tokenizer, write `vocab.json`, `merges.txt`
//! and `tokenizer.json` (which records the split pattern).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tinylm_bpe::files::{save_tokenizer, Bpe};
use tinylm_bpe::pretokenize::Pattern;
use tinylm_bpe::train::{train_bpe_with, Progress, TrainOptions};

use crate::commands::flags::ThreadsArg;

#[derive(Args)]
pub struct TrainArgs {
    /// UTF-8 text file to train on.
    #[arg(long)]
    input: PathBuf,
    /// Vocabulary size: 256 bytes + special tokens + merges.
    #[arg(long)]
    vocab_size: usize,
    /// A special token (repeatable), e.g. `<|endoftext|>`: split on, never merged.
    #[arg(long = "special-token")]
    special_tokens: Vec<String>,
    /// Output directory for `vocab.json`, `merges.txt` and `tokenizer.json` (created if
    /// missing).
    #[arg(long)]
    out: PathBuf,
    /// Replace invalid UTF-8 in the input by U+FFFD instead of failing.
    #[arg(long)]
    lossy: bool,
    #[command(flatten)]
    threads: ThreadsArg,
    /// Split pattern: `gpt2` (CS336's), `gpt4` (cl100k), `o200k`, or a regex.
    #[arg(long, default_value = "gpt2", value_parser = parse_pattern)]
    pattern: Pattern,
}

impl TrainArgs {
    /// The flags for training on `input` with one special token and GPT-2's pattern.
    pub fn new(input: &Path, vocab_size: usize, special: &str, out: &Path) -> Self {
        TrainArgs {
            input: input.to_path_buf(),
            vocab_size,
            special_tokens: vec![special.to_string()],
            out: out.to_path_buf(),
            lossy: false,
            threads: ThreadsArg::default(),
            pattern: Pattern::Gpt2,
        }
    }
}

/// `--pattern`'s parser: a named pattern or a regex (a bad regex names its position).
pub fn parse_pattern(spec: &str) -> Result<Pattern, String> {
    Pattern::parse(spec).map_err(|e| e.to_string())
}

pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    check_writable(&args.out)?;
    let total = std::fs::metadata(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?
        .len();

    let bars = MultiProgress::new();
    let bytes_bar = bars.add(ProgressBar::new(total).with_style(style(
        "pre-tokenizing {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
    )));
    let merges_bar: OnceLock<ProgressBar> = OnceLock::new();
    let report = |p: Progress| match p {
        Progress::Pretokenized { done, .. } => bytes_bar.set_position(done),
        Progress::Merged { done, total } => merges_bar
            .get_or_init(|| {
                bytes_bar.finish();
                bars.add(ProgressBar::new(total as u64).with_style(style(
                    "merging        {bar:40} {pos}/{len} merges eta {eta}",
                )))
            })
            .set_position(done as u64),
    };
    if !args.pattern.is_named() {
        eprintln!(
            "note: a custom split pattern may look anywhere in its text, so the input is cut for parallel pre-tokenization only at special tokens"
        );
    }
    let options = TrainOptions {
        pattern: &args.pattern,
        lossy_utf8: args.lossy,
        progress: Some(&report),
    };
    args.threads.apply()?;
    let trained = train_bpe_with(&args.input, args.vocab_size, &args.special_tokens, options);
    let (vocab, merges) = trained.map_err(|e| {
        let hint = if e.to_string().contains("invalid UTF-8") {
            " (pass --lossy to replace it with U+FFFD)"
        } else {
            ""
        };
        anyhow::anyhow!("{e}{hint}")
    })?;
    bytes_bar.finish();
    if let Some(bar) = merges_bar.get() {
        bar.finish();
    }
    let bpe = Bpe::new(vocab, merges, args.pattern.clone())?;
    match bpe.repeated_token() {
        None => bpe.save(&args.out)?,
        Some((first, second)) => {
            // Two merges built the same bytes: vocab.json and merges.txt hold that, a
            // tokenizer.json (token → id) cannot.
            save_tokenizer(&args.out, &bpe.vocab, &bpe.merges)?;
            eprintln!(
                "warning: tokens {first} and {second} are both {}, which a tokenizer.json cannot hold, so only vocab.json and merges.txt were written; give --pattern {} to every command that reads {}",
                escaped(&bpe.vocab[first as usize]),
                match bpe.pattern.is_named() {
                    true => bpe.pattern.name().to_string(),
                    false => format!("{:?}", bpe.pattern.regex()),
                },
                args.out.display()
            );
        }
    }
    let Bpe { vocab, merges, .. } = bpe;

    let longest = vocab
        .iter()
        .max_by_key(|t| t.len())
        .expect("256 byte tokens at least");
    eprintln!("wrote the tokenizer to {}", args.out.display());
    eprintln!(
        "{} merges, vocab {} | wall {:.2} s | peak memory {} | longest token ({} bytes): {}",
        merges.len(),
        vocab.len(),
        start.elapsed().as_secs_f64(),
        peak_memory(),
        longest.len(),
        escaped(longest)
    );
    Ok(())
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).expect("valid progress template")
}

/// Creates `dir` and checks that a file can be written there, before hours of training.
fn check_writable(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create output directory {}", dir.display()))?;
    let probe = dir.join(format!(".tinylm-write-check{}", std::process::id()));
    std::fs::write(&probe, b"")
        .with_context(|| format!("cannot write to output directory {}", dir.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// Peak resident memory (`VmHWM` of `/proc/self/status`), or "unknown" off Linux.
fn peak_memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map_or_else(
            || "unknown".into(),
            |kb| format!("{:.1} MiB", kb as f64 / 1024.0),
        )
}

/// A token as a quoted, escaped string (invalid UTF-8 as `\xNN`).
fn escaped(token: &[u8]) -> String {
    match std::str::from_utf8(token) {
        Ok(s) => format!("{s:?}"),
        Err(_) => format!("b\"{}\"", token.escape_ascii()),
    }
}
