//! `tinylm serve`: a trained model behind the OpenAI API — `POST /v1/completions`
//! (whole, or streamed as server-sent events) and `GET /v1/models` — with a page at
//! `/` to try it. Concurrent requests are decoded together, continuously batched
//! on the model's own thread ([`engine`]); the HTTP side ([`routes`], axum on a
//! small tokio runtime) only checks requests ([`api`]) and passes text on.

mod api;
mod engine;
mod routes;

use super::flags::DeviceArgs;
use super::tokenizer::for_model;
use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc};
use tinylm::accounting::InferenceMemory;
use tinylm::device::AnyBackend;
use tinylm::on_backend;
use tinylm::weights;

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
    /// Worker threads of the model [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(args: ServeArgs) -> Result<()> {
    super::set_threads(args.threads)?;
    let ckpt = weights::open(&args.checkpoint, None)?;
    let (tokenizer, eos) = for_model(args.tokenizer.as_deref(), &ckpt, &args.checkpoint)?;
    let config = ckpt.config.clone();
    anyhow::ensure!(
        (1..=config.context_length).contains(&args.slots),
        "--slots must be between 1 and the model's context length {}, got {}",
        config.context_length,
        args.slots
    );
    let target = args.device.target();
    let memory = InferenceMemory::decoding(&config, args.slots, config.context_length, target);
    eprintln!("{}", memory.describe(target));
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let model = api::ServedModel {
        name: args.name.unwrap_or_else(|| default_name(&args.checkpoint)),
        context_length: config.context_length,
        tokenizer: tokenizer.clone(),
        eos,
        created,
    };

    // The model's thread (run on the pool's): opens the device, loads the weights,
    // says whether that worked, then decodes until the server's end.
    let (jobs, queue) = mpsc::channel();
    let (ready, loaded) = mpsc::channel::<Result<()>>();
    let (device, precision, slots) = (args.device.device, args.device.precision, args.slots);
    std::thread::Builder::new()
        .name("tinylm-model".into())
        .spawn(move || -> Result<()> {
            tinylm::kernels::cpu::on_pool(move || {
                let backend = match AnyBackend::open_forward_only(device, precision) {
                    Ok(backend) => backend,
                    Err(e) => {
                        let _ = ready.send(Err(e.into()));
                        return Ok(());
                    }
                };
                on_backend!(backend, backend => match ckpt.model(backend) {
                    Ok(mut model) => {
                        let _ = ready.send(Ok(()));
                        engine::run(&mut model, &tokenizer, slots, queue)
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e.into()));
                        Ok(())
                    }
                })
            })
        })
        .context("starting the model's thread")?;
    loaded
        .recv()
        .context("the model's thread stopped while loading")??;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tinylm-http")
        .enable_io()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(async {
        let address = (args.host.as_str(), args.port);
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
        let local = listener.local_addr()?;
        eprintln!(
            "serving {} at http://{local}/ (OpenAI API at http://{local}/v1, {slots} sequences at a time)",
            model.name
        );
        let app = Arc::new(routes::App {
            model,
            jobs,
            requests: AtomicU64::new(0),
        });
        axum::serve(listener, routes::router(app))
            .await
            .context("serving HTTP")
    })
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
