//! `tinylm serve`: a trained model behind the OpenAI API, with its key, limits,
//! health and metrics — the server is the `tinylm-serve` crate; this command reads
//! its flags, opens the weights and the tokenizer, and stops it at Ctrl-C or
//! SIGTERM.

use super::flags::{DeviceArgs, ThreadsArg};
use super::tokenizer::for_model;
use anyhow::Result;
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tinylm::accounting::InferenceMemory;
use tinylm::weights;
use tinylm_serve::limits::{self, Limits};
use tinylm_serve::Settings;

#[derive(Args)]
pub struct ServeArgs {
    /// Model checkpoint (`checkpoint.safetensors` of `tinylm train` or `quickstart`),
    /// or an exported Hugging Face directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Tokenizer directory (`tokenizer.json`, or `vocab.json` and `merges.txt`)
    /// [default: the one the checkpoint records].
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Address to listen on (0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one (the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model's id in the API [default: the checkpoint's directory name].
    #[arg(long)]
    name: Option<String>,
    /// Sequences decoded together; further requests wait for a free slot.
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Prompt rows a decoding pass takes at most: prompts beyond go in the next
    /// passes, while the sequences already started go on drawing.
    #[arg(long, default_value_t = tinylm_serve::DEFAULT_PREFILL_ROWS)]
    prefill_rows: usize,
    #[command(flatten)]
    threads: ThreadsArg,
    #[command(flatten)]
    device: DeviceArgs,
    /// Every API route asks for `Authorization: Bearer KEY` (all but `/` and
    /// `/health`).
    #[arg(long, env = tinylm_serve::API_KEY_ENV, hide_env_values = true)]
    api_key: Option<String>,
    /// Largest request body, in bytes (413 beyond).
    #[arg(long, default_value_t = limits::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Most prompt tokens of a request, all its prompts together (400 beyond)
    /// [default: the context length times --slots].
    #[arg(long)]
    max_prompt_tokens: Option<usize>,
    /// Largest `max_tokens` a request may ask for (400 beyond) [default: the
    /// context length less one].
    #[arg(long)]
    max_completion_tokens: Option<usize>,
    /// Choices that may wait for a slot; a request that would make more wait gets
    /// a 429 with `Retry-After`.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_QUEUE)]
    max_queue: usize,
    /// Seconds a request may take, from its arrival to its last token (then 408,
    /// or an error event ending its stream).
    #[arg(long, default_value_t = limits::DEFAULT_REQUEST_TIMEOUT_S as f64)]
    request_timeout: f64,
    /// Seconds a connection may wait for a request, a request's body may take to
    /// arrive, and a client may leave what it is sent unread, before it is closed.
    #[arg(long, default_value_t = limits::DEFAULT_IDLE_TIMEOUT_S as f64)]
    idle_timeout: f64,
    /// Events (pieces of text) per choice held for a client that reads more slowly
    /// than they come; beyond, its request ends and frees its slots.
    #[arg(long, default_value_t = limits::DEFAULT_STREAM_BUFFER)]
    stream_buffer: usize,
    /// Seconds open requests may go on after Ctrl-C or SIGTERM before they are ended.
    #[arg(long, default_value_t = limits::DEFAULT_SHUTDOWN_TIMEOUT_S as f64)]
    shutdown_timeout: f64,
}

/// `value` seconds, or an error naming `flag` unless it is positive and finite.
fn seconds(flag: &str, value: f64) -> Result<Duration> {
    anyhow::ensure!(
        value.is_finite() && value > 0.0 && value < 1e9,
        "--{flag} must be a positive number of seconds, got {value}"
    );
    Ok(Duration::from_secs_f64(value))
}

impl ServeArgs {
    /// The bounds the flags give for a model of `context_length`.
    fn limits(&self, context_length: usize) -> Result<Limits> {
        let defaults = Limits::defaults(context_length, self.slots);
        let limits = Limits {
            max_body_bytes: self.max_body_bytes,
            max_prompt_tokens: self.max_prompt_tokens.unwrap_or(defaults.max_prompt_tokens),
            max_completion_tokens: (self.max_completion_tokens)
                .unwrap_or(defaults.max_completion_tokens),
            max_queue: self.max_queue,
            request_timeout: seconds("request-timeout", self.request_timeout)?,
            idle_timeout: seconds("idle-timeout", self.idle_timeout)?,
            stream_buffer: self.stream_buffer,
            shutdown_timeout: seconds("shutdown-timeout", self.shutdown_timeout)?,
        };
        for (flag, value) in [
            ("max-body-bytes", limits.max_body_bytes),
            ("max-prompt-tokens", limits.max_prompt_tokens),
            ("max-completion-tokens", limits.max_completion_tokens),
            ("stream-buffer", limits.stream_buffer),
        ] {
            anyhow::ensure!(value > 0, "--{flag} must be at least 1");
        }
        Ok(limits)
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    args.threads.apply()?;
    let stop = super::stop_on_ctrl_c()?;
    let ckpt = weights::open(&args.checkpoint, None)?;
    let (tokenizer, eos) = for_model(args.tokenizer.as_deref(), &ckpt, &args.checkpoint)?;
    let config = &ckpt.config;
    let limits = args.limits(config.context_length)?;
    let backend = args.device.backend_kind();
    let memory = InferenceMemory::decoding(config, args.slots, config.context_length, backend);
    eprintln!("{}", memory.describe(backend));
    let settings = Settings {
        name: (args.name.clone()).unwrap_or_else(|| default_name(&args.checkpoint)),
        host: args.host.clone(),
        port: args.port,
        slots: args.slots,
        prefill_rows: args.prefill_rows,
        device: args.device.device,
        precision: args.device.precision,
        api_key: args.api_key.clone(),
        limits,
    };
    tinylm_serve::run(ckpt, tokenizer, eos, settings, stop)
}

/// A checkpoint file's directory name (`runs/ts/checkpoint.safetensors`: `ts`), or
/// a Hugging Face directory's own.
fn default_name(checkpoint: &Path) -> String {
    let path = std::fs::canonicalize(checkpoint).unwrap_or_else(|_| checkpoint.to_path_buf());
    let dir = match path.is_dir() {
        true => Some(path.as_path()),
        false => path.parent(),
    };
    dir.and_then(Path::file_name)
        .map_or("tinylm".into(), |name| name.to_string_lossy().into_owned())
}
