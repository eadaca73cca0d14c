//! `tinylm generate`: continue a prompt with a trained model, streaming the text to
//! stdout as it is produced.

use super::continuation::{is_broken_pipe, write_continuation, Continuation};
use super::flags::{DeviceArgs, ThreadsArg};
use super::tokenizer::for_model;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tinylm::accounting::InferenceMemory;
use tinylm::device::AnyBackend;
use tinylm::generate::{Sampler, Sampling};
use tinylm::on_backend;
use tinylm::weights;

#[derive(Args)]
pub struct GenerateArgs {
    /// Model checkpoint (`checkpoint.safetensors` of `tinylm train` or `quickstart`),
    /// or an exported Hugging Face directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Tokenizer directory (`tokenizer.json`, or `vocab.json` and `merges.txt`)
    /// [default: the one the checkpoint records].
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Text to continue; empty: start a new document.
    #[arg(long, default_value = "")]
    prompt: String,
    /// Most tokens to generate (fewer when the model ends the text).
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Softmax temperature; 0 is greedy (always the most probable token).
    #[arg(long, default_value_t = Sampling::DEFAULT.temperature)]
    temperature: f32,
    /// Nucleus sampling: keep the smallest set of most probable tokens whose
    /// probabilities sum to at least this (1 keeps all).
    #[arg(long, default_value_t = Sampling::DEFAULT.top_p)]
    top_p: f32,
    /// Keep only the K most probable tokens (before top-p).
    #[arg(long)]
    top_k: Option<usize>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    threads: ThreadsArg,
    /// At the end, print to stderr where the time went: the load (thread pool,
    /// tokenizer, weights), the prompt and the generation, with their tokens/s.
    #[arg(long)]
    verbose: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

/// When loading started and ended, and how long its parts took.
struct Load {
    start: Instant,
    /// The thread pool started, the checkpoint's header read.
    threads: Instant,
    header: Instant,
    /// The tokenizer and the weights, read side by side.
    tokenizer: Duration,
    weights: Duration,
    end: Instant,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let start = Instant::now();
    args.threads.apply()?;
    let threads = Instant::now();
    tinylm::kernels::cpu::on_pool(move || generate(args, start, threads))
}

/// `f()` and how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    (f(), start.elapsed())
}

/// [`run`] after the thread pool's start (`start`, then `threads`).
fn generate(args: GenerateArgs, start: Instant, threads: Instant) -> Result<()> {
    let sampler = Sampler::new(args.temperature, args.top_p, args.top_k, args.seed)?;
    let ckpt = weights::open(&args.checkpoint, None)?;
    let header = Instant::now();
    let backend = args.device.backend_kind();
    eprintln!(
        "{}",
        InferenceMemory::decoding(&ckpt.config, 1, ckpt.config.context_length, backend)
            .describe(backend)
    );
    let backend = AnyBackend::open_forward_only(args.device.device, args.device.precision)?;
    let written = on_backend!(backend, backend => {
        // Neither needs the other: the tokenizer is parsed on a thread of its own
        // while the weights are read on every thread of the pool (as one side of a
        // `rayon::join`, the weights had one thread until the tokenizer was done).
        let ((tokenizer, tokenizer_s), (model, weights_s)) = std::thread::scope(|s| {
            let tokenizer = s.spawn(|| {
                timed(|| for_model(args.tokenizer.as_deref(), &ckpt, &args.checkpoint))
            });
            let weights = timed(|| ckpt.model(backend));
            (tokenizer.join().expect("the tokenizer's thread"), weights)
        });
        let ((tokenizer, eos), mut model) = (tokenizer?, model?);
        let load = Load {
            start,
            threads,
            header,
            tokenizer: tokenizer_s,
            weights: weights_s,
            end: Instant::now(),
        };
        // A tokenizer that came out smaller than the model's vocabulary decodes only
        // its own ids: the model's others are never drawn.
        let mut sampler = sampler.clone().vocabulary(tokenizer.vocab_size());
        let (prompt, out) = (&args.prompt, &mut std::io::stdout().lock());
        write_continuation(&mut model, &tokenizer, eos, prompt, args.max_tokens, &mut sampler, out)
            .map(|continuation| (load, continuation))
    });
    match written {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        Err(e) => Err(e),
        Ok((load, continuation)) => {
            if args.verbose {
                eprint!("{}", timings(&load, &continuation));
            }
            Ok(())
        }
    }
}

/// Where the time went, as llama.cpp reports it: the load, the prompt (its tokens
/// read up to the first new token), the time to that token from the start, and the
/// generation (the tokens after the first, each one decoding step).
fn timings(load: &Load, run: &Continuation) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    let since = |a: Instant, b: Instant| b.saturating_duration_since(a);
    let mut lines = format!(
        "load:        {:9.2} ms (thread pool {:.2} ms, header {:.2} ms, then side by side: tokenizer {:.2} ms, weights {:.2} ms)\n",
        ms(since(load.start, load.end)),
        ms(since(load.start, load.threads)),
        ms(since(load.threads, load.header)),
        ms(load.tokenizer),
        ms(load.weights),
    );
    let Some(first) = run.first_token else {
        return lines + "no new token: the model ended the text at once\n";
    };
    let prompt = since(run.started, first);
    lines += &format!(
        "prompt:      {:9.2} ms / {} tokens ({:.2} tokens/s)\n",
        ms(prompt),
        run.prompt_tokens,
        rate(run.prompt_tokens, prompt)
    );
    lines += &format!(
        "first token: {:9.2} ms after the start\n",
        ms(since(load.start, first))
    );
    let after_first = run.new_tokens - 1;
    let generation = since(first, run.last_token.unwrap_or(first));
    lines
        + &format!(
            "generation:  {:9.2} ms / {after_first} tokens after the first ({:.2} tokens/s)\n",
            ms(generation),
            rate(after_first, generation)
        )
}
