//! The OpenAI completions API as tinylm serves it: the request (`POST
//! /v1/completions`) checked into [`Choice`]s for the engine, the JSON of the
//! responses and stream chunks, and errors as OpenAI writes them
//! (`{"error": {"message", "type", "param", "code"}}` with a 4xx or 5xx status).

use super::engine::{FinishReason, Job};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use tinylm::generate::Sampler;
use tinylm_bpe::encode::Tokenizer;

/// OpenAI's default `max_tokens` for completions.
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// OpenAI's limits on `n` and on the number of stop strings.
const MAX_CHOICES: usize = 128;
const MAX_STOPS: usize = 4;

/// The served model, as the API describes it.
pub struct ServedModel {
    /// Its id in the API (`model` of requests and responses).
    pub name: String,
    pub context_length: usize,
    pub tokenizer: Tokenizer,
    /// `<|endoftext|>`: an empty prompt starts from it, and a text ends at it.
    pub eos: u32,
    /// When the server started (Unix seconds): the model's `created`.
    pub created: u64,
}

/// An error as the OpenAI API returns it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl ApiError {
    /// A bad request (400), naming the parameter at fault.
    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// A path or method the API does not have.
    pub fn not_found(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// The server failed (500): decoding failed, or the model's thread stopped.
    pub fn server(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    fn with_code(self, code: &'static str) -> Self {
        ApiError {
            code: Some(code),
            ..self
        }
    }

    /// The `{"error": …}` object.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// `prompt`: a string, a list of strings, a list of token ids or a list of lists.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "prompt to be a string, a list of strings, a list of token ids or a list of lists of token ids"
)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged, expecting = "stop to be a string or a list of strings")]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The body of `POST /v1/completions`: OpenAI's parameters (those that sample
/// tokens, and the ones tinylm refuses unless left at their defaults), plus
/// `top_k` and `ignore_eos` as vLLM and llama.cpp's server take them. Other fields
/// are ignored.
#[derive(Deserialize)]
pub struct CompletionRequest {
    model: Option<String>,
    prompt: Option<Prompt>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<usize>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    stop: Option<Stop>,
    seed: Option<i64>,
    echo: Option<bool>,
    logprobs: Option<Value>,
    best_of: Option<usize>,
    suffix: Option<String>,
    logit_bias: Option<HashMap<String, f64>>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    top_k: Option<usize>,
    ignore_eos: Option<bool>,
}

/// One prompt of a request: its ids, its text (for `echo`).
pub struct PromptIds {
    pub ids: Vec<u32>,
    pub text: String,
}

/// A checked request: its prompts, each continued `n` times.
pub struct Completion {
    pub prompts: Vec<PromptIds>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: bool,
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    top_k: Option<usize>,
    seed: u64,
    ignore_eos: bool,
    stop: Vec<String>,
}

impl CompletionRequest {
    /// The request in `body`, or a 400 saying what is wrong with the JSON.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid(
                None,
                format!("the request body is not a valid completion request: {e}"),
            )
        })
    }

    /// Checks every parameter against `model`: a 404 for another model, a 400
    /// naming the parameter for anything else.
    pub fn check(self, model: &ServedModel) -> Result<Completion, ApiError> {
        if let Some(name) = self.model.filter(|name| *name != model.name) {
            let message = format!(
                "The model `{name}` does not exist: this server serves `{}`",
                model.name
            );
            let error = ApiError::not_found(StatusCode::NOT_FOUND, message);
            return Err(error.with_code("model_not_found"));
        }
        let unsupported = |param, what: &str| {
            ApiError::invalid(Some(param), format!("{param} is not supported ({what})"))
        };
        if self.logprobs.is_some_and(|l| !l.is_null()) {
            return Err(unsupported("logprobs", "leave it out or null"));
        }
        if self.suffix.is_some_and(|s| !s.is_empty()) {
            return Err(unsupported("suffix", "the model only continues text"));
        }
        if self.logit_bias.is_some_and(|b| !b.is_empty()) {
            return Err(unsupported("logit_bias", "leave it out or empty"));
        }
        for (param, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if value.is_some_and(|v| v != 0.0) {
                return Err(unsupported(param, "leave it out or 0"));
            }
        }
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            let message = format!("n must be between 1 and {MAX_CHOICES}, got {n}");
            return Err(ApiError::invalid(Some("n"), message));
        }
        if self.best_of.is_some_and(|b| b != n) {
            return Err(unsupported("best_of", "leave it out or equal to n"));
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            let message = format!("temperature must be between 0 and 2, got {temperature}");
            return Err(ApiError::invalid(Some("temperature"), message));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            let message = format!("top_p must be greater than 0 and at most 1, got {top_p}");
            return Err(ApiError::invalid(Some("top_p"), message));
        }
        if self.top_k == Some(0) {
            return Err(ApiError::invalid(Some("top_k"), "top_k must be at least 1"));
        }
        let stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(list)) => list,
        };
        if stop.len() > MAX_STOPS {
            let message = format!("stop takes at most {MAX_STOPS} strings, got {}", stop.len());
            return Err(ApiError::invalid(Some("stop"), message));
        }
        let ctx = model.context_length;
        let max_tokens = self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        if max_tokens == 0 || max_tokens >= ctx {
            let message = format!(
                "max_tokens must be between 1 and {} (the context length {ctx} less one prompt token), got {max_tokens}",
                ctx - 1
            );
            return Err(ApiError::invalid(Some("max_tokens"), message));
        }
        let prompts = prompt_ids(self.prompt, model)?;
        for (i, prompt) in prompts.iter().enumerate() {
            let (p, total) = (prompt.ids.len(), prompt.ids.len() + max_tokens);
            if total > ctx {
                let which = match prompts.len() {
                    1 => String::new(),
                    _ => format!(" (prompt {i})"),
                };
                let message = format!(
                    "This model's maximum context length is {ctx} tokens, however you requested {total} tokens ({p} in your prompt{which}; {max_tokens} for the completion). Please reduce your prompt; or completion length."
                );
                let error = ApiError::invalid(Some("prompt"), message);
                return Err(error.with_code("context_length_exceeded"));
            }
        }
        Ok(Completion {
            prompts,
            n,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
            echo: self.echo.unwrap_or(false),
            max_tokens,
            temperature,
            top_p,
            top_k: self.top_k,
            seed: match self.seed {
                Some(seed) => seed as u64,
                None => RandomState::new().hash_one(std::time::SystemTime::now()),
            },
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stop,
        })
    }
}

/// The prompts' ids (an empty text starts a new document, from `<|endoftext|>`)
/// and texts; token ids must be ones the tokenizer can write.
fn prompt_ids(prompt: Option<Prompt>, model: &ServedModel) -> Result<Vec<PromptIds>, ApiError> {
    let tokenizer = &model.tokenizer;
    let from_text = |text: String| PromptIds {
        ids: match text.is_empty() {
            true => vec![model.eos],
            false => tokenizer.encode(&text),
        },
        text,
    };
    let from_ids = |ids: Vec<u32>| -> Result<PromptIds, ApiError> {
        if ids.is_empty() {
            return Err(ApiError::invalid(Some("prompt"), "a token prompt is empty"));
        }
        let vocab = tokenizer.vocab_size();
        if let Some(i) = ids.iter().position(|&id| id as usize >= vocab) {
            let message = format!(
                "prompt token {} at position {i} is not in the tokenizer's {vocab} tokens",
                ids[i]
            );
            return Err(ApiError::invalid(Some("prompt"), message));
        }
        let bytes = tokenizer.decode_bytes(&ids).expect("ids checked above");
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(PromptIds { ids, text })
    };
    let prompts = match prompt.unwrap_or(Prompt::Text(String::new())) {
        Prompt::Text(text) => vec![from_text(text)],
        Prompt::Texts(texts) => texts.into_iter().map(from_text).collect(),
        Prompt::Tokens(ids) => vec![from_ids(ids)?],
        Prompt::TokenLists(lists) => lists.into_iter().map(from_ids).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(
            Some("prompt"),
            "the list of prompts is empty",
        ));
    }
    Ok(prompts)
}

impl Completion {
    /// Choices in OpenAI's order: prompt `p`'s `k`-th continuation is choice
    /// `p·n + k`, drawn with seed `seed + index`.
    pub fn choices(&self) -> usize {
        self.prompts.len() * self.n
    }

    /// The engine's job for choice `index` of request `request`, its events sent to
    /// `events`.
    pub fn job(
        &self,
        request: &Arc<str>,
        index: usize,
        model: &ServedModel,
        events: super::engine::Events,
    ) -> Job {
        let prompt = &self.prompts[index / self.n];
        let seed = self.seed.wrapping_add(index as u64);
        let sampler = Sampler::new(self.temperature, self.top_p, self.top_k, seed)
            .expect("parameters checked")
            .vocabulary(model.tokenizer.vocab_size());
        Job {
            request: request.clone(),
            prompt: prompt.ids.clone(),
            max_tokens: self.max_tokens,
            sampler,
            eos: (!self.ignore_eos).then_some(model.eos),
            stop: self.stop.clone(),
            choice: index,
            events,
        }
    }

    /// Prompt tokens in all (each prompt once, however many choices it has).
    pub fn prompt_tokens(&self) -> usize {
        self.prompts.iter().map(|p| p.ids.len()).sum()
    }

    /// The text a choice starts with: its prompt when `echo`.
    pub fn echoed(&self, index: usize) -> &str {
        match self.echo {
            true => &self.prompts[index / self.n].text,
            false => "",
        }
    }
}

/// What every response and chunk of one request carries.
pub struct Header {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Header {
    /// A response or chunk with these choices (and `usage` when given).
    fn object(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut object = json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            object["usage"] = usage;
        }
        object
    }

    /// A stream chunk: `text` of choice `index`, with its finish reason at the end;
    /// `"usage": null` when the client asked for the usage chunk.
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        finish: Option<FinishReason>,
        with_usage: bool,
    ) -> Value {
        let choice = choice(index, text, finish);
        self.object(json!([choice]), with_usage.then_some(Value::Null))
    }

    /// The stream's last chunk when the client asked for usage: no choices.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        self.object(json!([]), Some(usage))
    }

    /// The whole response: each choice's text and finish reason, in order.
    pub fn response(&self, choices: &[(String, FinishReason)], usage: Value) -> Value {
        let choices = (choices.iter().enumerate())
            .map(|(index, (text, finish))| choice(index, text, Some(*finish)))
            .collect();
        self.object(Value::Array(choices), Some(usage))
    }
}

fn choice(index: usize, text: &str, finish: Option<FinishReason>) -> Value {
    json!({
        "text": text,
        "index": index,
        "logprobs": null,
        "finish_reason": finish.map(FinishReason::as_str),
    })
}

/// The `usage` object: `cached_tokens` of the prompt's were found in the KV cache
/// of an earlier request.
pub fn usage(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    })
}

/// `GET /v1/models`: the one model.
pub fn models(model: &ServedModel) -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": model.name,
            "object": "model",
            "created": model.created,
            "owned_by": "tinylm",
            "context_length": model.context_length,
        }],
    })
}
