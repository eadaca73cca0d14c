//! `tinylm generate`: continue a prompt with a trained model, streaming the text to
//! stdout as it is produced.

use super::continuation::{is_broken_pipe, write_continuation};
use super::tokenizer::for_model;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use tinylm::accounting::InferenceMemory;
use tinylm::device::AnyBackend;
use tinylm::generate::Sampler;
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
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Nucleus sampling: keep the smallest set of most probable tokens whose
    /// probabilities sum to at least this (1 keeps all).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Keep only the K most probable tokens (before top-p).
    #[arg(long)]
    top_k: Option<usize>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker threads [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    device: super::flags::DeviceArgs,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    super::set_threads(args.threads)?;
    let sampler = Sampler::new(args.temperature, args.top_p, args.top_k, args.seed)?;
    let ckpt = weights::open(&args.checkpoint, None)?;
    let (tokenizer, eos) = for_model(args.tokenizer.as_deref(), &ckpt, &args.checkpoint)?;
    // A tokenizer that came out smaller than the model's vocabulary decodes only its
    // own ids: the model's others are never drawn.
    let mut sampler = sampler.vocabulary(tokenizer.vocab_size());
    let target = args.device.target();
    eprintln!(
        "{}",
        InferenceMemory::decoding(&ckpt.config, 1, ckpt.config.context_length, target)
            .describe(target)
    );
    let backend = AnyBackend::open(args.device.device, args.device.precision)?;
    let written = on_backend!(backend, backend => {
        let mut model = ckpt.model(backend)?;
        let (prompt, out) = (&args.prompt, &mut std::io::stdout().lock());
        write_continuation(&mut model, &tokenizer, eos, prompt, args.max_tokens, &mut sampler, out)
    });
    match written {
        Ok(continuation) => {
            eprintln!("{}", continuation.timings());
            Ok(())
        }
        Err(e) if is_broken_pipe(&e) => Ok(()),
        Err(e) => Err(e),
    }
}
