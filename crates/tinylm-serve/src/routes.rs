//! The HTTP side: axum routes on the tokio runtime. `POST /v1/completions` checks
//! the request, hands one job per choice to the engine's thread and answers with
//! the whole completion or, with `stream`, server-sent events in OpenAI's chunk
//! format ending with `data: [DONE]`; `GET /v1/models` lists the model; `/` is
//! the page to try it. Every error is OpenAI's JSON error object.

use super::api::{self, ApiError, Completion, CompletionRequest, Header, ServedModel};
use super::engine::{Event, FinishReason, Job};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// The page at `/`: HTML, CSS and JavaScript in one file, in the binary.
const PAGE: &str = include_str!("page.html");

/// What the handlers share.
pub struct App {
    pub model: ServedModel,
    /// The engine's queue.
    pub jobs: Sender<Job>,
    /// Requests so far, for their ids.
    pub requests: AtomicU64,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }).fallback(not_allowed))
        .route("/v1/models", get(models).fallback(not_allowed))
        .route("/v1/completions", post(completions).fallback(not_allowed))
        .fallback(not_found)
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::not_found(
        StatusCode::NOT_FOUND,
        "no such route: the API is POST /v1/completions and GET /v1/models",
    )
}

async fn not_allowed() -> ApiError {
    ApiError::not_found(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(api::models(&app.model))
}

async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let completion = match CompletionRequest::parse(&body).and_then(|r| r.check(&app.model)) {
        Ok(completion) => completion,
        Err(e) => return e.into_response(),
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let number = app.requests.fetch_add(1, Ordering::Relaxed);
    let header = Header {
        id: format!("cmpl-{created:x}{number:08x}"),
        created,
        model: app.model.name.clone(),
    };
    let (events, rx) = unbounded_channel();
    let request: Arc<str> = header.id.as_str().into();
    for index in 0..completion.choices() {
        let job = completion.job(&request, index, &app.model, events.clone());
        if app.jobs.send(job).is_err() {
            return ApiError::server("the model's thread has stopped").into_response();
        }
    }
    // Only the engine's jobs hold senders now: the channel closes when they end.
    drop(events);
    match completion.stream {
        true => Sse::new(chunks(header, completion, rx)).into_response(),
        false => whole(header, completion, rx).await,
    }
}

/// The whole completion, once every choice has ended.
async fn whole(
    header: Header,
    completion: Completion,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Response {
    let mut choices: Vec<(String, Option<FinishReason>)> = (0..completion.choices())
        .map(|i| (completion.echoed(i).to_string(), None))
        .collect();
    let (mut tokens, mut cached) = (0, 0);
    while choices.iter().any(|(_, finish)| finish.is_none()) {
        match rx.recv().await {
            Some((i, Event::Text(text))) => choices[i].0 += &text,
            Some((
                i,
                Event::Done {
                    finish,
                    tokens: n,
                    cached: c,
                },
            )) => {
                choices[i].1 = Some(finish);
                tokens += n;
                cached = cached.max(c);
            }
            Some((_, Event::Failed(message))) => return ApiError::server(message).into_response(),
            None => return ApiError::server("the model's thread has stopped").into_response(),
        }
    }
    let choices: Vec<(String, FinishReason)> = (choices.into_iter())
        .map(|(text, finish)| (text, finish.expect("every choice ended")))
        .collect();
    let usage = api::usage(completion.prompt_tokens(), tokens, cached);
    Json(header.response(&choices, usage)).into_response()
}

/// Where a stream is.
enum Phase {
    /// Passing on the engine's events; `left` choices have not ended.
    Events {
        left: usize,
    },
    /// Every choice ended: the usage chunk, if asked for, then `[DONE]`.
    Usage,
    Done,
    End,
}

/// A stream's state between two events.
struct Streaming {
    phase: Phase,
    rx: UnboundedReceiver<(usize, Event)>,
    header: Header,
    completion: Completion,
    /// Tokens drawn so far and the most prompt tokens a choice found cached, for
    /// the usage chunk.
    tokens: usize,
    cached: usize,
}

/// The stream's server-sent events: each choice's echoed prompt, then a chunk per
/// piece of text and one with each choice's finish reason, the usage chunk when
/// asked for, and `[DONE]`. A failure is an `{"error": …}` event before `[DONE]`.
fn chunks(
    header: Header,
    completion: Completion,
    rx: UnboundedReceiver<(usize, Event)>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let with_usage = completion.include_usage;
    let echoed: Vec<SseEvent> = (0..completion.choices())
        .filter(|&i| !completion.echoed(i).is_empty())
        .map(|i| data(&header.chunk(i, completion.echoed(i), None, with_usage)))
        .collect();
    let state = Streaming {
        phase: Phase::Events {
            left: completion.choices(),
        },
        rx,
        header,
        completion,
        tokens: 0,
        cached: 0,
    };
    let events = stream::unfold(state, move |mut s| async move {
        let (event, next) = match s.phase {
            Phase::Events { left } => match s.rx.recv().await {
                Some((i, Event::Text(text))) => {
                    let chunk = s.header.chunk(i, &text, None, with_usage);
                    (data(&chunk), Phase::Events { left })
                }
                Some((
                    i,
                    Event::Done {
                        finish,
                        tokens,
                        cached,
                    },
                )) => {
                    s.tokens += tokens;
                    s.cached = s.cached.max(cached);
                    let chunk = s.header.chunk(i, "", Some(finish), with_usage);
                    let next = match left {
                        1 => Phase::Usage,
                        _ => Phase::Events { left: left - 1 },
                    };
                    (data(&chunk), next)
                }
                Some((_, Event::Failed(message))) => {
                    (data(&ApiError::server(message).body()), Phase::Done)
                }
                None => {
                    let error = ApiError::server("the model's thread has stopped");
                    (data(&error.body()), Phase::Done)
                }
            },
            Phase::Usage if with_usage => {
                let usage = api::usage(s.completion.prompt_tokens(), s.tokens, s.cached);
                (data(&s.header.usage_chunk(usage)), Phase::Done)
            }
            Phase::Usage | Phase::Done => (SseEvent::default().data("[DONE]"), Phase::End),
            Phase::End => return None,
        };
        s.phase = next;
        Some((Ok(event), s))
    });
    stream::iter(echoed.into_iter().map(Ok)).chain(events)
}

/// A `data:` event of one JSON object.
fn data(value: &serde_json::Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}
