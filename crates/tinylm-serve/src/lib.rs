//! `tinylm serve`: a trained model behind the OpenAI API — `POST /v1/completions`
//! (whole, or streamed as server-sent events, with log-probabilities when asked),
//! `GET /v1/models`, llama.cpp's `/tokenize` and `/detokenize` — with `/health`,
//! Prometheus's `/metrics` and a page at `/` to try it.
//!
//! Concurrent requests are decoded together, continuously batched on the model's
//! own thread ([`engine`]); the HTTP side ([`routes`], axum over hyper
//! connections on a small tokio runtime, [`http`]) reads and checks requests
//! ([`request`]) against the server's bounds ([`limits`]) and key ([`auth`]),
//! passes text on ([`stream`]), logs each request ([`access`]) and counts
//! ([`metrics`]).

mod access;
mod auth;
mod engine;
mod error;
mod http;
pub mod limits;
mod logprobs;
mod metrics;
pub mod request;
mod response;
mod routes;
mod state;
mod stream;
pub mod tokens;

pub use auth::API_KEY_ENV;
pub use engine::DEFAULT_PREFILL_ROWS;
pub use error::ApiError;

use anyhow::{Context, Result};
use auth::ApiKey;
use limits::Limits;
use request::ServedModel;
use state::Shared;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use tinylm::device::{AnyBackend, Device};
use tinylm::kernels::Precision;
use tinylm::on_backend;
use tinylm::weights::OpenedWeights;
use tinylm_bpe::encode::Tokenizer;

/// How the server runs.
pub struct Settings {
    /// The model's id in the API.
    pub name: String,
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    /// Sequences decoded together.
    pub slots: usize,
    /// Prompt rows a decoding pass takes at most ([`DEFAULT_PREFILL_ROWS`]).
    pub prefill_rows: usize,
    pub device: Device,
    pub precision: Precision,
    /// The key clients must send; none: the API is open.
    pub api_key: Option<String>,
    pub limits: Limits,
}

/// Serves the model of `weights` with `tokenizer` (whose `<|endoftext|>` is
/// `eos`) until `stop` is set (Ctrl-C, SIGTERM), then shuts down gracefully.
/// The port is open from the start: `/health` says `loading` until the model's
/// thread has loaded the weights.
pub fn run(
    weights: OpenedWeights,
    tokenizer: Tokenizer,
    eos: u32,
    settings: Settings,
    stop: &'static AtomicBool,
) -> Result<()> {
    let Settings {
        name,
        host,
        port,
        slots,
        prefill_rows,
        device,
        precision,
        api_key,
        limits,
    } = settings;
    let context_length = weights.config.context_length;
    anyhow::ensure!(
        (1..=context_length).contains(&slots),
        "--slots must be between 1 and the model's context length {context_length}, got {slots}"
    );
    let key = api_key
        .as_deref()
        .map(ApiKey::new)
        .transpose()?
        .map(Arc::new);
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let model = Arc::new(ServedModel {
        name,
        context_length,
        tokenizer,
        eos,
        created,
    });
    let shared = Arc::new(Shared::new(slots, limits.max_queue));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tinylm-http")
        .enable_io()
        .enable_time()
        .build()
        .context("starting the HTTP runtime")?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind((host.as_str(), port)))
        .with_context(|| format!("listening on {host}:{port}"))?;
    let local = listener.local_addr()?;
    if key.is_none() && auth::beyond_loopback(local.ip()) {
        eprintln!("{}", auth::open_warning(&local.to_string()));
    }
    eprintln!("loading the model; http://{local}/health answers 200 once it is ready");

    // The model's thread (run on the pool's): opens the device, loads the weights,
    // says whether that worked, then decodes until the server's end.
    let (jobs, queue) = mpsc::channel();
    let (ready, loaded) = tokio::sync::oneshot::channel::<Result<()>>();
    let engine_model = Arc::clone(&model);
    let engine_shared = Arc::clone(&shared);
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
                on_backend!(backend, backend => match weights.model(backend) {
                    Ok(mut loaded) => {
                        let _ = ready.send(Ok(()));
                        let tokenizer = &engine_model.tokenizer;
                        let shared = &engine_shared;
                        engine::run(&mut loaded, tokenizer, slots, prefill_rows, queue, shared)
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e.into()));
                        Ok(())
                    }
                })
            })
        })
        .context("starting the model's thread")?;

    let keyed = key.is_some();
    let app = Arc::new(routes::App {
        model: Arc::clone(&model),
        limits: limits.clone(),
        jobs,
        shared: Arc::clone(&shared),
        key,
        requests: AtomicU64::new(0),
    });
    runtime.block_on(async move {
        let router = routes::router(app);
        let ending = Arc::clone(&shared);
        let stopping = Arc::clone(&shared);
        let stopped = async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            stopping.stop();
            eprintln!("stopping: no new connections; open requests may finish");
        };
        let mut server = tokio::spawn(async move {
            http::serve(listener, router, &limits, stopped, move || ending.end()).await
        });
        // Stopped while loading: no need to wait for the weights.
        tokio::select! {
            loaded = loaded => loaded.context("the model's thread stopped while loading")??,
            served = &mut server => {
                served.context("the HTTP server failed")?;
                eprintln!("stopped");
                return Ok(());
            }
        }
        shared.set_ready();
        eprintln!(
            "serving {} at http://{local}/ (OpenAI API at http://{local}/v1, {slots} sequences at a time{})",
            model.name,
            match keyed {
                true => ", API key required",
                false => "",
            }
        );
        server.await.context("the HTTP server failed")?;
        eprintln!("stopped");
        Ok(())
    })
}
