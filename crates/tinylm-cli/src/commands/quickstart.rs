//! `tinylm quickstart`: from a text file to a model that writes stories, in one
//! command and a few minutes of CPU: train a BPE tokenizer, encode, hold out the
//! last documents for validation, train a small model for a time budget, evaluate,
//! plot and print samples. Everything lands in one run directory. Without
//! `--corpus` it trains on the TinyStories sample inside tinylm (`tinylm-corpus`).
//!
//! The learning-rate schedule runs over the time budget ([`Schedule::Time`]), not
//! over a step count planned up front: however the machine's speed changes during
//! the run, training ends and the schedule reaches its end when the budget does.

use super::continuation::write_continuation;
use super::flags::{DeviceArgs, ThreadsArg};
use super::tokenizer::load_with_end_of_text;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;
use tinylm::checkpoint::{self, CheckpointFile};
use tinylm::data::TokenDataset;
use tinylm::device::{resolve, AnyBackend, Device};
use tinylm::distributed::World;
use tinylm::files::write_bytes;
use tinylm::generate::{Sampler, Sampling};
use tinylm::kernels::{Backend, BatchPart, Precision};
use tinylm::on_backend;
use tinylm::train::{evaluate, train, Schedule, TrainConfig, TrainSummary};
use tinylm::{Model, ModelConfig};
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::files::END_OF_TEXT;
use tinylm_bpe::npy::{Dtype, NpyWriter};
use tinylm_bpe::train::{count_pretokens, train_from_counts, TrainOptions};

/// Prompts of the samples printed at the end (the last one starts a new document).
const PROMPTS: [&str; 3] = ["Once upon a time", "One day, a little", ""];

#[derive(Args)]
pub struct QuickstartArgs {
    /// UTF-8 text, documents separated by `<|endoftext|>` [default: the TinyStories
    /// sample inside tinylm, 5,808 stories, 4.9 MB].
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Training time budget in minutes (tokenizer, encoding and samples come on top).
    #[arg(long, default_value_t = 3.0)]
    minutes: f64,
    /// Run directory [default: runs/<UTC timestamp>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Tokenizer vocabulary size (bytes, `<|endoftext|>` and merges).
    #[arg(long, default_value_t = 2048)]
    vocab_size: usize,
    /// Share of the documents (the last ones) held out for validation.
    #[arg(long, default_value_t = 0.05)]
    val_fraction: f64,
    /// Seed of the initial weights, the batch order and the samples.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    threads: ThreadsArg,
    /// Also write the step-0 weights to `init.safetensors` (to start another
    /// implementation from the same point, as bench/train_compare.sh does).
    #[arg(long)]
    save_init: bool,
    /// Model shape and ablations as a JSON config (`tinylm train --model-config`
    /// format); its vocab_size is replaced by the tokenizer's [default: ~2.6M
    /// parameters, context 128, d_model 192, 4 layers, 6 heads, d_ff 512].
    #[arg(long)]
    model_config: Option<PathBuf>,
    /// Sequences per training step.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    #[command(flatten)]
    device: DeviceArgs,
}

/// The default model: ~2.6M parameters (1.8M outside the embeddings at vocab
/// 2048), which learns visibly in minutes on two cores.
fn default_model_config() -> ModelConfig {
    ModelConfig {
        context_length: 128,
        d_model: 192,
        num_layers: 4,
        num_heads: 6,
        d_ff: 512,
        ..ModelConfig::tinystories()
    }
}
/// Validation batches at the periodic evaluations (the final one reads everything).
const EVAL_BATCHES: usize = 4;

pub fn run(args: QuickstartArgs) -> Result<()> {
    if !(args.minutes.is_finite() && args.minutes > 0.0) {
        bail!("--minutes must be positive, got {}", args.minutes);
    }
    if !(args.val_fraction > 0.0 && args.val_fraction < 1.0) {
        bail!(
            "--val-fraction must lie in (0, 1), got {}",
            args.val_fraction
        );
    }
    if args.vocab_size <= 257 {
        bail!(
            "--vocab-size must exceed 257 (256 bytes and {END_OF_TEXT}), got {}",
            args.vocab_size
        );
    }
    if args.batch_size == 0 {
        bail!("--batch-size must be positive");
    }
    let device = resolve(args.device.device)?;
    let model = match &args.model_config {
        Some(path) => ModelConfig::from_json_file(path)?,
        None => default_model_config(),
    };
    if let Some(corpus) = args.corpus.as_ref().filter(|path| !path.is_file()) {
        bail!("{}: no such file", corpus.display());
    }
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from("runs").join(timestamp(jiff::Timestamp::now())));
    if out.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        bail!(
            "{} already exists and is not empty: choose another --out",
            out.display()
        );
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    args.threads.apply()?;
    let settings = Settings {
        corpus: args.corpus,
        out,
        minutes: args.minutes,
        vocab_size: args.vocab_size,
        val_fraction: args.val_fraction,
        seed: args.seed,
        save_init: args.save_init,
        model,
        batch_size: args.batch_size,
        device,
        precision: args.device.precision.for_training()?,
    };
    tinylm::kernels::cpu::on_pool(|| quickstart(&settings))
}

struct Settings {
    /// `--corpus`, or `None` for the embedded TinyStories sample.
    corpus: Option<PathBuf>,
    out: PathBuf,
    minutes: f64,
    vocab_size: usize,
    val_fraction: f64,
    seed: u64,
    save_init: bool,
    /// The model's shape; `vocab_size` is set from the trained tokenizer.
    model: ModelConfig,
    batch_size: usize,
    /// Where the model trains, evaluates and samples.
    device: Device,
    precision: Precision,
}

fn quickstart(s: &Settings) -> Result<()> {
    let started = Instant::now();
    let out = &s.out;
    let corpus_name = s.corpus.as_ref().map_or_else(
        || tinylm_corpus::TINYSTORIES_NAME.to_string(),
        |path| path.display().to_string(),
    );
    println!(
        "tinylm quickstart: {corpus_name} -> {} ({} threads, device {})",
        out.display(),
        rayon::current_num_threads(),
        s.device
    );

    stage(1, "reading the corpus and holding out the last documents");
    let text = match &s.corpus {
        Some(path) => read_text(path)?,
        None => tinylm_corpus::tinystories(),
    };
    let text = text.as_str();
    let split = split_documents(text, s.val_fraction)
        .with_context(|| format!("splitting {corpus_name}"))?;
    let (train_text, val_text) = text.split_at(split.boundary);
    println!(
        "  {} documents, {:.1} MB: {} for training, the last {} ({:.1} MB) for validation",
        split.documents,
        mb(text.len()),
        split.documents - split.held_out,
        split.held_out,
        mb(val_text.len())
    );

    stage(
        2,
        &format!("training a BPE tokenizer of {} tokens", s.vocab_size),
    );
    let t0 = Instant::now();
    let specials = [END_OF_TEXT.to_string()];
    let counts = count_pretokens(
        train_text.as_bytes(),
        &specials,
        1 << 20,
        TrainOptions::default(),
    )?;
    let (vocab, merges) = train_from_counts(counts, s.vocab_size, &specials, None);
    let tokenizer_dir = out.join("tokenizer");
    tinylm_bpe::files::save_tokenizer(&tokenizer_dir, &vocab, &merges)?;
    let (tokenizer, _) = load_with_end_of_text(&tokenizer_dir)?;
    println!(
        "  {} merges in {:.2} s -> {}",
        merges.len(),
        t0.elapsed().as_secs_f64(),
        tokenizer_dir.display()
    );

    stage(3, "encoding");
    let train_npy = out.join("train.npy");
    let val_npy = out.join("val.npy");
    let bar = bytes_bar(text.len());
    let train_tokens = encode_to_npy(&tokenizer, train_text, &train_npy, &bar)?;
    let val_tokens = encode_to_npy(&tokenizer, val_text, &val_npy, &bar)?;
    bar.finish_and_clear();
    println!(
        "  {train_tokens} training tokens, {val_tokens} validation tokens ({:.2} bytes/token)",
        text.len() as f64 / (train_tokens + val_tokens).max(1) as f64
    );

    let config = ModelConfig {
        vocab_size: tokenizer.vocab_size(),
        ..s.model.clone()
    };
    let t = config.context_length;
    for (path, n) in [(&train_npy, train_tokens), (&val_npy, val_tokens)] {
        if n <= t {
            bail!(
                "{}: {n} tokens is too short for the context length {t}; use a larger corpus",
                path.display()
            );
        }
    }
    let budget_s = s.minutes * 60.0;
    let backend = AnyBackend::open(s.device, s.precision)?;
    let step_s = on_backend!(backend, b => time_one_step(b, &config, s.batch_size, s.seed)?);
    // A first estimate of the steps, for the warm-up's and the evaluations' spacing;
    // the schedule itself runs over the time, and the budget alone ends the run.
    let steps = ((budget_s / step_s) as u64).max(1);
    let params = tinylm::params::ParamLayout::new(&config).total;
    stage(
        4,
        &format!(
            "training a {:.1}M-parameter model for {:.1} min ({} x {t} tokens a step, {:.2} s each at first: ~{steps} steps; the learning rate follows the clock)",
            params as f64 / 1e6,
            s.minutes,
            s.batch_size,
            step_s
        ),
    );
    if s.save_init {
        let init = Model::new(config.clone(), s.seed)?;
        let path = out.join("init.safetensors");
        checkpoint::save(&path, &config, init.params(), None, &Default::default())?;
        println!("  initial weights -> {}", path.display());
    }
    let cfg = TrainConfig {
        model: config,
        train_data: train_npy.clone(),
        val_data: Some(val_npy.clone()),
        tokenizer: Some(absolute(&tokenizer_dir)),
        out_dir: out.clone(),
        batch_size: s.batch_size,
        steps,
        lr_max: 3e-3,
        lr_min: 3e-4,
        warmup_steps: (steps / 20).max(1),
        eval_interval: (steps / 10).max(1),
        eval_batches: EVAL_BATCHES,
        checkpoint_interval: 0,
        log_interval: 1,
        time_budget_s: Some(budget_s),
        schedule: Schedule::Time,
        seed: s.seed,
        device: s.device,
        precision: s.precision,
        ..TrainConfig::default()
    };
    let summary = run_training(&cfg)?;
    println!(
        "  trained {} steps, {} tokens in {:.0} s; last batch loss {:.3}",
        summary.steps, summary.tokens, summary.wallclock_s, summary.train_loss
    );

    let ckpt = CheckpointFile::open(&summary.checkpoint)?;
    let backend = AnyBackend::open_forward_only(s.device, s.precision)?;
    let samples = on_backend!(backend, b => {
        evaluate_and_sample(b, s, &ckpt, &val_npy, &tokenizer_dir, &summary)?
    });
    let samples_path = out.join("samples.txt");
    write_bytes(&samples_path, samples.as_bytes())?;
    println!(
        "\ndone in {:.0} s. Everything is in {}. Generate more with:\n  tinylm generate --checkpoint {} --prompt \"Once upon a time\"",
        started.elapsed().as_secs_f64(),
        out.display(),
        summary.checkpoint.display()
    );
    Ok(())
}

fn stage(n: usize, what: &str) {
    println!("[{n}/6] {what}");
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

/// Where the training/validation split falls.
#[derive(Debug, PartialEq)]
struct Split {
    /// Byte offset where validation text starts.
    boundary: usize,
    documents: usize,
    held_out: usize,
}

/// Splits at the start of the last `⌈fraction · documents⌉` documents (`<|endoftext|>`
/// separates documents; at least one is held out and one kept).
fn split_documents(text: &str, fraction: f64) -> Result<Split> {
    let starts: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices(END_OF_TEXT).map(|(i, m)| i + m.len()))
        .filter(|&i| !text[i..].trim().is_empty())
        .collect();
    let documents = starts.len();
    if documents < 2 {
        bail!(
            "found {documents} document(s); the text needs at least two, separated by {END_OF_TEXT}, to hold the last ones out for validation"
        );
    }
    let held_out = ((documents as f64 * fraction).ceil() as usize).clamp(1, documents - 1);
    Ok(Split {
        boundary: starts[documents - held_out],
        documents,
        held_out,
    })
}

/// Encodes `text` into the `.npy` at `path`; returns the number of tokens.
fn encode_to_npy(
    tokenizer: &Tokenizer,
    text: &str,
    path: &Path,
    bar: &ProgressBar,
) -> Result<usize> {
    let mut writer = NpyWriter::create(path, Dtype::for_vocab(tokenizer.vocab_size()))?;
    tokenizer.encode_parallel(text, 1 << 20, |ids, bytes| {
        bar.inc(bytes as u64);
        writer.write_ids(ids)
    })?;
    let n = writer.count();
    writer.finish()?;
    Ok(n)
}

fn bytes_bar(total: usize) -> ProgressBar {
    ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("  {bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("valid template"),
    )
}

/// Seconds of one training step (forward, backward, clipped update) of `config`
/// on `backend`, measured on made-up tokens after a warm-up step.
fn time_one_step<B: Backend<f32>>(
    backend: B,
    config: &ModelConfig,
    batch_size: usize,
    seed: u64,
) -> tinylm::Result<f64> {
    let mut model = Model::init_with_backend(config.clone(), seed, backend)?;
    let (b, t) = (batch_size, config.context_length);
    let ids: Vec<u32> = (0..b * t)
        .map(|i| ((i * 7919) % config.vocab_size) as u32)
        .collect();
    let mut opt = model.new_adamw(Default::default())?;
    let mut step = |model: &mut Model<f32, B>| -> tinylm::Result<()> {
        model.accumulate_gradient(&ids, &ids, b, t, BatchPart::whole(b * t))?;
        model.optimizer_step(&mut opt, 1e-3, Some(1.0), None)?;
        model.step_stats().map(drop)
    };
    step(&mut model)?;
    let t0 = Instant::now();
    step(&mut model)?;
    step(&mut model)?;
    model.backend().sync()?;
    Ok(t0.elapsed().as_secs_f64() / 2.0)
}

/// Stages 5 and 6 on the run's device: the validation loss over every validation
/// token, then the samples (printed as they come); returns the samples' text.
fn evaluate_and_sample<B: Backend<f32>>(
    backend: B,
    s: &Settings,
    ckpt: &CheckpointFile,
    val_npy: &Path,
    tokenizer_dir: &Path,
    summary: &TrainSummary,
) -> tinylm::Result<String> {
    let out = &s.out;
    let t = ckpt.config().context_length;
    stage(5, "evaluating on all validation tokens");
    let mut model = ckpt.model(backend)?;
    let val = TokenDataset::open(val_npy, ckpt.config().vocab_size)?;
    let eval = evaluate(&mut model, &val, s.batch_size, 0)?;
    println!(
        "  validation loss {:.4}, perplexity {:.2} ({} windows of {t} tokens)",
        eval.loss,
        eval.perplexity(),
        eval.windows
    );
    println!(
        "  log {}, plot {}, checkpoint {}",
        out.join("log.jsonl").display(),
        out.join("loss.svg").display(),
        summary.checkpoint.display()
    );

    let Sampling { temperature, top_p } = Sampling::DEFAULT;
    stage(
        6,
        &format!("samples (temperature {temperature}, top-p {top_p})"),
    );
    let failed = |e: anyhow::Error| tinylm::Error::Invalid(format!("{e:#}"));
    let (tokenizer, eos) = load_with_end_of_text(tokenizer_dir).map_err(failed)?;
    let mut samples = String::new();
    let stdout = std::io::stdout();
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let mut sampler = Sampler::new(temperature, top_p, None, s.seed + i as u64)?;
        println!("--- sample {} ---", i + 1);
        let text = write_continuation(
            &mut model,
            &tokenizer,
            eos,
            prompt,
            200,
            &mut sampler,
            &mut stdout.lock(),
        )
        .map_err(failed)?
        .text;
        samples += &format!("--- sample {} ---\n{text}", i + 1);
    }
    Ok(samples)
}

/// Trains with a progress bar.
fn run_training(cfg: &TrainConfig) -> Result<tinylm::train::TrainSummary> {
    let bar = ProgressBar::new(cfg.total_steps()).with_style(
        ProgressStyle::with_template(
            "  {bar:30} step {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
        )
        .expect("valid template"),
    );
    let stop = AtomicBool::new(false);
    let mut last_val = None;
    let summary = train(cfg, &World::single(), &stop, &mut |p| {
        let r = p.record;
        last_val = r.val_loss.or(last_val);
        let val = last_val.map_or(String::new(), |v| format!(" val {v:.3}"));
        bar.set_length(p.total_steps);
        bar.set_position(r.step);
        bar.set_message(format!(
            "loss {:.3}{val} lr {:.1e} {:.0} tok/s",
            r.train_loss, r.lr, r.tokens_per_s
        ));
    })?;
    bar.finish();
    Ok(summary)
}

/// The UTF-8 text of the file `path` (an error names the first invalid byte).
fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: invalid UTF-8 at byte {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A moment as `YYYYMMDD-HHMMSS` in UTC.
fn timestamp(at: jiff::Timestamp) -> String {
    at.strftime("%Y%m%d-%H%M%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_out_the_last_documents() {
        let text = "a\n<|endoftext|>\nb\n<|endoftext|>\nc\n<|endoftext|>\nd\n<|endoftext|>\n";
        let s = split_documents(text, 0.5).unwrap();
        assert_eq!((s.documents, s.held_out), (4, 2));
        assert_eq!(
            &text[s.boundary..],
            "\nc\n<|endoftext|>\nd\n<|endoftext|>\n"
        );
        // At least one document each side.
        assert_eq!(split_documents(text, 0.01).unwrap().held_out, 1);
        assert_eq!(split_documents(text, 0.99).unwrap().held_out, 3);
        // A last document without a trailing separator counts too.
        assert_eq!(
            split_documents("a<|endoftext|>b", 0.5).unwrap().boundary,
            14
        );
        assert!(split_documents("one document only\n", 0.05).is_err());
    }

    #[test]
    fn timestamps_are_utc_dates() {
        let at = |s| timestamp(jiff::Timestamp::from_second(s).unwrap());
        assert_eq!(at(0), "19700101-000000");
        assert_eq!(at(951_782_400), "20000229-000000");
        assert_eq!(at(1_700_000_000), "20231114-221320");
    }
}
