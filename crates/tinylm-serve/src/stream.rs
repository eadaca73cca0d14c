//! A streamed completion: server-sent events in OpenAI's chunk format — a chunk
//! per piece of text of a choice (with its tokens' log-probabilities when asked
//! for), one with each choice's finish reason, the usage chunk when asked for, and
//! `data: [DONE]`. A failure is an `{"error": …}` event before `[DONE]`.

use crate::access::RequestTokens;
use crate::engine::{Event, Receiving};
use crate::logprobs;
use crate::request::{Completion, ServedModel};
use crate::response::{self, ChoiceText, Header};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
    receiving: Receiving,
    header: Header,
    completion: Completion,
    model: Arc<ServedModel>,
    tokens: Arc<RequestTokens>,
    /// Tokens drawn so far and the most prompt tokens a choice found cached, for
    /// the usage chunk.
    drawn: usize,
    cached: usize,
}

/// The response: the stream of a request's events.
pub fn events(
    header: Header,
    completion: Completion,
    receiving: Receiving,
    model: Arc<ServedModel>,
    tokens: Arc<RequestTokens>,
) -> Response {
    let state = Streaming {
        phase: Phase::Events {
            left: completion.choices(),
        },
        receiving,
        header,
        completion,
        model,
        tokens,
        drawn: 0,
        cached: 0,
    };
    let events = stream::unfold(state, |mut s| async move {
        let event = s.next().await?;
        Some((Ok::<_, Infallible>(event), s))
    });
    Sse::new(events).into_response()
}

impl Streaming {
    /// The next event, or `None` after `[DONE]`.
    async fn next(&mut self) -> Option<SseEvent> {
        let with_usage = self.completion.include_usage;
        let (event, next) = match self.phase {
            Phase::Events { left } => match self.receiving.rx.recv().await {
                Some((index, Event::Text { text, logprobs })) => {
                    let tokenizer = &self.model.tokenizer;
                    let logprobs =
                        (self.completion.logprobs).map(|_| logprobs::object(&logprobs, tokenizer));
                    let choice = ChoiceText {
                        index,
                        text: &text,
                        logprobs,
                        finish: None,
                    };
                    let chunk = self.header.chunk(choice, with_usage);
                    (data(&chunk), Phase::Events { left })
                }
                Some((
                    index,
                    Event::Done {
                        finish,
                        tokens,
                        cached,
                    },
                )) => {
                    self.drawn += tokens;
                    self.tokens.completion.fetch_add(tokens, Ordering::Relaxed);
                    self.cached = self.cached.max(cached);
                    let choice = ChoiceText {
                        index,
                        text: "",
                        logprobs: None,
                        finish: Some(finish),
                    };
                    let chunk = self.header.chunk(choice, with_usage);
                    let next = match left {
                        1 => Phase::Usage,
                        _ => Phase::Events { left: left - 1 },
                    };
                    (data(&chunk), next)
                }
                Some((_, Event::Failed(failure))) => (data(&failure.error().body()), Phase::Done),
                None => (data(&self.receiving.cut_short().body()), Phase::Done),
            },
            Phase::Usage if with_usage => {
                let prompt_tokens = self.completion.prompt_tokens();
                let usage = response::usage(prompt_tokens, self.drawn, self.cached);
                (data(&self.header.usage_chunk(usage)), Phase::Done)
            }
            Phase::Usage | Phase::Done => (SseEvent::default().data("[DONE]"), Phase::End),
            Phase::End => return None,
        };
        self.phase = next;
        Some(event)
    }
}

/// A `data:` event of one JSON object.
fn data(value: &serde_json::Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}
