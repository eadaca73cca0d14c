//! One access-log line per request, on stderr, when its response ends — a stream's
//! last event sent, or its client gone — and the request counted in
//! `tinylm_requests_total` then:
//!
//! ```text
//! access: POST /v1/completions 200 prompt_tokens=4 completion_tokens=30 ms=123.4
//! ```
//!
//! The route is the one the request matched (`unmatched` for a path the API does
//! not have); the handlers add the request's tokens to its [`RequestTokens`].

use crate::state::Shared;
use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// A request's tokens, for its log line: its prompts' and those drawn for it.
#[derive(Default)]
pub struct RequestTokens {
    pub prompt: AtomicUsize,
    pub completion: AtomicUsize,
}

/// What the line says, written when the response's body is dropped.
struct Line {
    shared: Arc<Shared>,
    method: Method,
    route: String,
    status: StatusCode,
    tokens: Arc<RequestTokens>,
    start: Instant,
}

impl Drop for Line {
    fn drop(&mut self) {
        let ms = self.start.elapsed().as_secs_f64() * 1e3;
        let (prompt, completion) = (
            self.tokens.prompt.load(Ordering::Relaxed),
            self.tokens.completion.load(Ordering::Relaxed),
        );
        eprintln!(
            "access: {} {} {} prompt_tokens={prompt} completion_tokens={completion} ms={ms:.1}",
            self.method,
            self.route,
            self.status.as_u16()
        );
        let metrics = &self.shared.metrics;
        metrics.count_request(&self.route, self.status.as_u16());
    }
}

/// A response body that writes the request's line when it is dropped.
struct Logged {
    inner: Body,
    _line: Line,
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The middleware around every route: gives the handler the request's
/// [`RequestTokens`] and logs and counts the request when its response ends.
pub async fn record(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let method = request.method().clone();
    let route = (request.extensions().get::<MatchedPath>())
        .map_or("unmatched".to_owned(), |path| path.as_str().to_owned());
    let tokens = Arc::new(RequestTokens::default());
    request.extensions_mut().insert(Arc::clone(&tokens));
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    let line = Line {
        shared,
        method,
        route,
        status: parts.status,
        tokens,
        start,
    };
    let body = Body::new(Logged {
        inner: body,
        _line: line,
    });
    Response::from_parts(parts, body)
}
