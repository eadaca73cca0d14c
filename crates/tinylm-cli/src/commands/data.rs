//! `tinylm data get NAME`: the assignment's datasets by name, from the Hugging Face
//! Hub with the Hub's own client (`hf-hub`): its cache (`HF_HOME`, default
//! `~/.cache/huggingface`), its endpoint (`HF_ENDPOINT`), downloads resumed from the
//! cache's `.part` file. Compressed files are decompressed into `--out`, plain ones
//! linked there; `--tokenize` then trains a tokenizer (or takes `--tokenizer`) and
//! encodes both splits to `.npy` files for `tinylm train`.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use flate2::read::MultiGzDecoder;
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use indicatif::{ProgressBar, ProgressStyle};
use tinylm_bpe::files::END_OF_TEXT;

use super::bpe;

#[derive(Args)]
pub struct DataArgs {
    #[command(subcommand)]
    command: DataCommand,
}

#[derive(Subcommand)]
enum DataCommand {
    /// Download a dataset (once: later runs read the Hugging Face cache), decompress
    /// it into --out, and with --tokenize encode it to `.npy` for `tinylm train`.
    Get(GetArgs),
}

#[derive(Args)]
pub struct GetArgs {
    /// The dataset: `tinystories` (roneneldan/TinyStories, TinyStoriesV2-GPT4, 2.2 GB
    /// of text) or `owt` (stanford-cs336/owt-sample, 11.9 GB).
    dataset: DatasetName,
    /// Directory for the text files (and the tokenizer and `.npy` files) [default:
    /// data/<dataset>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also encode both splits to `train.npy` and `valid.npy` in --out, with a
    /// tokenizer trained on the training split (--vocab-size) or --tokenizer.
    #[arg(long)]
    tokenize: bool,
    /// Vocabulary size of the tokenizer trained into `<out>/tokenizer` (256 bytes,
    /// `<|endoftext|>` and merges; GPT-2's split pattern).
    #[arg(long, requires = "tokenize", conflicts_with = "tokenizer")]
    vocab_size: Option<usize>,
    /// Encode with this tokenizer directory instead of training one.
    #[arg(long, requires = "tokenize")]
    tokenizer: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum DatasetName {
    Tinystories,
    Owt,
}

/// A dataset repository on the Hub and its two files, as the CS336 handout names them.
struct Dataset {
    name: &'static str,
    repo: &'static str,
    train: &'static str,
    valid: &'static str,
}

impl DatasetName {
    fn dataset(self) -> Dataset {
        match self {
            DatasetName::Tinystories => Dataset {
                name: "tinystories",
                repo: "roneneldan/TinyStories",
                train: "TinyStoriesV2-GPT4-train.txt",
                valid: "TinyStoriesV2-GPT4-valid.txt",
            },
            DatasetName::Owt => Dataset {
                name: "owt",
                repo: "stanford-cs336/owt-sample",
                train: "owt_train.txt.gz",
                valid: "owt_valid.txt.gz",
            },
        }
    }
}

/// The revision downloaded: the Hub's `main`.
const REVISION: &str = "main";
/// Times a broken download is resumed (from the bytes already received) before it
/// is an error; the `.part` file stays in the cache for the next run to resume.
const RETRIES: usize = 3;

pub fn run(args: DataArgs) -> Result<()> {
    match args.command {
        DataCommand::Get(args) => get(args),
    }
}

/// Where `--tokenize` takes its tokenizer from.
enum TokenizerSource {
    /// Trained on the training split, of this vocabulary size.
    Train(usize),
    /// This tokenizer directory.
    Dir(PathBuf),
}

fn get(args: GetArgs) -> Result<()> {
    let tokenizer = match (args.tokenize, args.tokenizer, args.vocab_size) {
        (false, ..) => None,
        (true, Some(dir), _) => Some(TokenizerSource::Dir(dir)),
        (true, None, Some(vocab_size)) => Some(TokenizerSource::Train(vocab_size)),
        (true, None, None) => {
            bail!("--tokenize needs --vocab-size N (to train a tokenizer) or --tokenizer DIR")
        }
    };
    let dataset = args.dataset.dataset();
    let out = args
        .out
        .unwrap_or_else(|| Path::new("data").join(dataset.name));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let repo = Repo::with_revision(dataset.repo.into(), RepoType::Dataset, REVISION.into());
    let api = ApiBuilder::from_env()
        .with_progress(false)
        .with_retries(RETRIES)
        .build()
        .context("starting the Hugging Face Hub client")?
        .repo(repo.clone());
    let cache = Cache::from_env().repo(repo);
    let mut texts = Vec::new();
    for file in [dataset.train, dataset.valid] {
        let cached = match cache.get(file) {
            Some(path) => {
                eprintln!("{file}: in the cache");
                path
            }
            None => download(&api, file)?,
        };
        texts.push(place(&cached, &out)?);
    }
    if let Some(tokenizer) = tokenizer {
        let tokenizer = match tokenizer {
            TokenizerSource::Dir(dir) => dir,
            TokenizerSource::Train(vocab_size) => {
                let dir = out.join("tokenizer");
                bpe::train_tokenizer(&texts[0], vocab_size, END_OF_TEXT, &dir)?;
                dir
            }
        };
        for (text, npy) in texts.iter().zip(["train.npy", "valid.npy"]) {
            bpe::encode_file(&tokenizer, text, &out.join(npy))?;
        }
        eprintln!(
            "train with: tinylm train --train-data {0}/train.npy --val-data {0}/valid.npy --tokenizer {1}",
            out.display(),
            tokenizer.display()
        );
    }
    Ok(())
}

/// Downloads `file` into the cache with a progress bar; returns its path there.
fn download(api: &ApiRepo, file: &str) -> Result<PathBuf> {
    let url = api.url(file);
    eprintln!("{file}: downloading {url}");
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("  {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid progress template"),
    );
    // The client's error says what failed (a status names its URL); its chain repeats it.
    api.download_with_progress(file, DownloadBar(bar))
        .map_err(|e| {
            let resume = match e {
                ApiError::RequestError(_) => "",
                _ => " (run the command again to resume from the bytes received)",
            };
            anyhow::anyhow!("downloading {file} from {url}: {e}{resume}")
        })
}

/// The Hub client's progress reports on an indicatif bar.
struct DownloadBar(ProgressBar);

impl hf_hub::api::Progress for DownloadBar {
    /// At the start of each attempt, which resumes at the bytes already received.
    fn init(&mut self, size: usize, _file: &str) {
        self.0.set_length(size as u64);
        self.0.set_position(0);
    }
    fn update(&mut self, bytes: usize) {
        self.0.inc(bytes as u64);
    }
    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}

/// Puts the cached file into `out` as plain text and returns its path there: a
/// `.gz` is decompressed (once: a later run keeps the whole file an earlier one
/// wrote), any other file linked to the cache.
fn place(cached: &Path, out: &Path) -> Result<PathBuf> {
    let name = cached.file_name().expect("a cached file has a name");
    let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".gz")) else {
        let dest = out.join(name);
        link(cached, &dest)?;
        return Ok(dest);
    };
    let dest = out.join(stem);
    if dest.is_file() {
        eprintln!("{stem}: decompressed already, {}", dest.display());
        return Ok(dest);
    }
    let source = File::open(cached).with_context(|| format!("opening {}", cached.display()))?;
    let bar = ProgressBar::new(source.metadata()?.len()).with_style(
        ProgressStyle::with_template(
            "  decompressing {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid progress template"),
    );
    let mut text = MultiGzDecoder::new(bar.wrap_read(source));
    tinylm::files::write_file(&dest, |file| std::io::copy(&mut text, file).map(drop))
        .with_context(|| format!("decompressing {}", cached.display()))?;
    bar.finish_and_clear();
    eprintln!("{stem}: decompressed to {}", dest.display());
    Ok(dest)
}

/// `dest` becomes a link to `target` (a copy where links are not available), made
/// beside it and renamed into place.
fn link(target: &Path, dest: &Path) -> Result<()> {
    let target = std::path::absolute(target)?;
    let mut tmp = dest.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    #[cfg(unix)]
    let made = std::os::unix::fs::symlink(&target, &tmp);
    #[cfg(not(unix))]
    let made = std::fs::copy(&target, &tmp).map(drop);
    made.and_then(|()| std::fs::rename(&tmp, dest))
        .with_context(|| format!("linking {} to {}", dest.display(), target.display()))?;
    eprintln!("{} -> {}", dest.display(), target.display());
    Ok(())
}
