//! The HTTP side: axum routes on the tokio runtime. `POST /v1/completions` reads
//! and checks the request, admits its choices, hands one job per choice to the
//! engine's thread and answers with the whole completion or, with `stream`, its
//! server-sent events ([`crate::stream`]); `GET /v1/models` lists the model;
//! `/tokenize` and `/detokenize` convert text and ids; `/health` says whether the
//! model is loaded; `/metrics` gives the counters; `/` is the page to try it.
//! With a key, every route but `/` and `/health` asks for it. Every error is
//! OpenAI's JSON error object.

use crate::access::{self, RequestTokens};
use crate::auth::{self, ApiKey};
use crate::engine::{Event, Events, FinishReason, Job, Receiving};
use crate::error::ApiError;
use crate::limits::Limits;
use crate::logprobs::{self, Entry};
use crate::request::{Completion, CompletionRequest, ServedModel};
use crate::response::{self, ChoiceText, Header};
use crate::state::Shared;
use crate::stream;
use crate::tokens::{ConversionRequest, DetokenizeRequest, TokenizeRequest};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http_body::Body as _;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, LazyLock};
use std::time::Instant;
use tinylm::generate::Sampling;

/// The page at `/`: HTML, CSS and JavaScript in one file, in the binary, its
/// sampling fields starting from [`Sampling::DEFAULT`].
static PAGE: LazyLock<String> = LazyLock::new(|| {
    let Sampling { temperature, top_p } = Sampling::DEFAULT;
    (include_str!("page.html").replace("{{temperature}}", &temperature.to_string()))
        .replace("{{top_p}}", &top_p.to_string())
});

/// A body declared longer than this many times the limit is refused unread; a
/// shorter one is read to its end (and dropped) before the 413, so that the client,
/// still sending it, sees the answer rather than a reset connection.
const DRAINED_PAST_LIMIT: usize = 8;

/// What the handlers share.
pub struct App {
    pub model: Arc<ServedModel>,
    pub limits: Limits,
    /// The engine's queue.
    pub jobs: Sender<Job>,
    pub shared: Arc<Shared>,
    pub key: Option<Arc<ApiKey>>,
    /// Requests so far, for their ids.
    pub requests: AtomicU64,
}

pub fn router(app: Arc<App>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models).fallback(not_allowed))
        .route("/v1/completions", post(completions).fallback(not_allowed))
        .route(
            "/tokenize",
            post(convert::<TokenizeRequest>).fallback(not_allowed),
        )
        .route(
            "/detokenize",
            post(convert::<DetokenizeRequest>).fallback(not_allowed),
        )
        .route("/metrics", get(metrics).fallback(not_allowed));
    let api = match &app.key {
        Some(key) => api.route_layer(from_fn_with_state(Arc::clone(key), auth::require)),
        None => api,
    };
    Router::new()
        .route(
            "/",
            get(|| async { Html(PAGE.as_str()) }).fallback(not_allowed),
        )
        .route("/health", get(health).fallback(not_allowed))
        .merge(api)
        .fallback(not_found)
        .layer(from_fn_with_state(Arc::clone(&app.shared), access::record))
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::not_found(
        StatusCode::NOT_FOUND,
        "no such route: the API is POST /v1/completions, GET /v1/models, POST /tokenize, POST /detokenize, GET /health and GET /metrics",
    )
}

async fn not_allowed() -> ApiError {
    ApiError::not_found(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

/// `{"status": "ok"}` (200) once the model is loaded; `loading` or `stopping`
/// with a 503 before and after.
async fn health(State(app): State<Arc<App>>) -> Response {
    let (status, word) = match (app.shared.is_ready(), app.shared.is_stopping()) {
        (_, true) => (StatusCode::SERVICE_UNAVAILABLE, "stopping"),
        (false, false) => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
        (true, false) => (StatusCode::OK, "ok"),
    };
    (status, Json(serde_json::json!({ "status": word }))).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = app.shared.metrics.render(app.shared.admission.in_flight());
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(response::models(&app.model))
}

/// The body, at most `limits.max_body_bytes` (413) and arriving within the idle
/// time limit (408).
async fn read_body(body: Body, limits: &Limits) -> Result<Bytes, ApiError> {
    let limit = limits.max_body_bytes;
    let drained = limit.saturating_mul(DRAINED_PAST_LIMIT);
    let declared = body.size_hint().exact().map_or(0, |n| n as usize);
    if declared > drained {
        return Err(ApiError::too_large(limit));
    }
    let read = async {
        let (mut body, mut kept, mut total) = (body, Vec::new(), 0usize);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::invalid(None, format!("reading the request body failed: {e}"))
            })?;
            if let Ok(data) = frame.into_data() {
                total = total.saturating_add(data.len());
                match total <= limit {
                    true => kept.extend_from_slice(&data),
                    false if total > drained => break,
                    false => {}
                }
            }
        }
        match total > limit {
            true => Err(ApiError::too_large(limit)),
            false => Ok(Bytes::from(kept)),
        }
    };
    let message = "the request body came too slowly (--idle-timeout)";
    (tokio::time::timeout(limits.idle_timeout, read).await)
        .unwrap_or_else(|_| Err(ApiError::timeout(message)))
}

/// `POST /tokenize` and `POST /detokenize`: request `R` answered, the tokens it
/// converted counted as the request's prompt tokens.
async fn convert<R: ConversionRequest>(
    State(app): State<Arc<App>>,
    Extension(tokens): Extension<Arc<RequestTokens>>,
    request: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    let body = read_body(request.into_body(), &app.limits).await?;
    let (answer, n) = R::parse(&body)?.answer(&app.model.tokenizer)?;
    tokens.prompt.store(n, Ordering::Relaxed);
    Ok(Json(answer))
}

async fn completions(
    State(app): State<Arc<App>>,
    Extension(tokens): Extension<Arc<RequestTokens>>,
    request: Request,
) -> Response {
    let arrived = Instant::now();
    match start_completion(&app, &tokens, request, arrived).await {
        Ok((header, completion, receiving)) => match completion.stream {
            true => {
                let model = Arc::clone(&app.model);
                stream::events(header, completion, receiving, model, tokens)
            }
            false => whole(header, completion, receiving, &app.model, &tokens).await,
        },
        Err(e) => e.into_response(),
    }
}

/// Reads, checks and admits a completion request and hands its jobs to the
/// engine: the response's header, the request, and where its events come.
async fn start_completion(
    app: &App,
    tokens: &RequestTokens,
    request: Request,
    arrived: Instant,
) -> Result<(Header, Completion, Receiving), ApiError> {
    if app.shared.is_stopping() {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    if !app.shared.is_ready() {
        return Err(ApiError::unavailable(
            "the model is loading: try again shortly",
        ));
    }
    let body = read_body(request.into_body(), &app.limits).await?;
    let completion = CompletionRequest::parse(&body)?.check(&app.model, &app.limits)?;
    let tickets = app.shared.admission.admit(completion.choices())?;
    let prompt_tokens = completion.prompt_tokens();
    tokens.prompt.store(prompt_tokens, Ordering::Relaxed);
    let metrics = &app.shared.metrics;
    metrics
        .prompt_tokens
        .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let number = app.requests.fetch_add(1, Ordering::Relaxed);
    let header = Header {
        id: format!("cmpl-{created:x}{number:08x}"),
        created,
        model: app.model.name.clone(),
    };
    let capacity = app
        .limits
        .stream_buffer
        .saturating_mul(completion.choices());
    let (events, receiving) = Events::channel(capacity.max(1));
    let request: Arc<str> = header.id.as_str().into();
    let deadline = arrived + app.limits.request_timeout;
    for (index, ticket) in tickets.into_iter().enumerate() {
        let job = Job {
            request: Arc::clone(&request),
            index,
            choice: completion.choice(index, &app.model),
            events: events.clone(),
            arrived,
            deadline,
            ticket,
        };
        if app.jobs.send(job).is_err() {
            return Err(ApiError::server("the model's thread has stopped"));
        }
    }
    // Only the engine's jobs hold senders now: the channel closes when they end.
    drop(events);
    Ok((header, completion, receiving))
}

/// One choice's text, log-probabilities and end, as they arrive.
#[derive(Default)]
struct Gathered {
    text: String,
    logprobs: Vec<Entry>,
    finish: Option<FinishReason>,
}

/// The whole completion, once every choice has ended.
async fn whole(
    header: Header,
    completion: Completion,
    mut receiving: Receiving,
    model: &ServedModel,
    tokens: &RequestTokens,
) -> Response {
    let mut choices: Vec<Gathered> = (0..completion.choices())
        .map(|_| Gathered::default())
        .collect();
    let (mut drawn, mut cached) = (0, 0);
    while choices.iter().any(|c| c.finish.is_none()) {
        match receiving.rx.recv().await {
            Some((i, Event::Text { text, logprobs })) => {
                choices[i].text += &text;
                choices[i].logprobs.extend(logprobs);
            }
            Some((
                i,
                Event::Done {
                    finish,
                    tokens: n,
                    cached: c,
                },
            )) => {
                choices[i].finish = Some(finish);
                drawn += n;
                tokens.completion.fetch_add(n, Ordering::Relaxed);
                cached = cached.max(c);
            }
            Some((_, Event::Failed(failure))) => return failure.error().into_response(),
            None => return receiving.cut_short().into_response(),
        }
    }
    let tokenizer = &model.tokenizer;
    let choices = (choices.iter().enumerate())
        .map(|(index, c)| ChoiceText {
            index,
            text: &c.text,
            logprobs: (completion.logprobs).map(|_| logprobs::object(&c.logprobs, tokenizer)),
            finish: c.finish,
        })
        .collect();
    let usage = response::usage(completion.prompt_tokens(), drawn, cached);
    Json(header.response(choices, usage)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_starts_from_the_default_sampling() {
        let Sampling { temperature, top_p } = Sampling::DEFAULT;
        for (id, value) in [("temperature", temperature), ("top_p", top_p)] {
            let field = format!(r#"id="{id}" type="number""#);
            let at = PAGE.find(&field).expect(id);
            let input = &PAGE[at..at + PAGE[at..].find('>').unwrap()];
            assert!(input.contains(&format!(r#"value="{value}""#)), "{input}");
        }
        assert!(!PAGE.contains("{{"), "a placeholder left in the page");
    }
}
