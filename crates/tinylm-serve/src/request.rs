//! The body of `POST /v1/completions` as tinylm takes it: OpenAI's parameters,
//! parsed and checked against the model and the server's [`Limits`] into a
//! [`Completion`] — its prompts as token ids and one [`Choice`] for the engine per
//! continuation — or refused with an [`ApiError`] naming the parameter at fault.

use crate::error::ApiError;
use crate::limits::Limits;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use tinylm::generate::{Sampler, Sampling};
use tinylm_bpe::encode::Tokenizer;

/// OpenAI's default `max_tokens` for completions.
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// OpenAI's limits on `n` and on the number of stop strings.
const MAX_CHOICES: usize = 128;
const MAX_STOPS: usize = 4;
/// The most alternatives `logprobs` may ask for at each position.
pub const MAX_LOGPROBS: usize = 20;

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
    /// New tokens of each choice at most; 0 only with `echo` (the prompt scored).
    pub max_tokens: usize,
    /// Alternatives at each position, when log-probabilities are asked for.
    pub logprobs: Option<usize>,
    temperature: f32,
    top_p: f32,
    top_k: Option<usize>,
    seed: u64,
    ignore_eos: bool,
    stop: Vec<String>,
}

/// What the engine decodes for one choice.
pub struct Choice {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: Sampler,
    /// Where the text ends (none with `ignore_eos`).
    pub eos: Option<u32>,
    pub stop: Vec<String>,
    /// The prompt's text, which the choice's text starts with (`echo`).
    pub echo: Option<String>,
    /// `logprobs`: alternatives at each position.
    pub logprobs: Option<usize>,
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

    /// Checks every parameter against `model` and `limits`: a 404 for another
    /// model, a 400 naming the parameter for anything else.
    pub fn check(self, model: &ServedModel, limits: &Limits) -> Result<Completion, ApiError> {
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
        let logprobs = match self.logprobs {
            None | Some(Value::Null) => None,
            Some(value) => match value.as_u64() {
                Some(k) if k as usize <= MAX_LOGPROBS => Some(k as usize),
                _ => {
                    let message = format!(
                        "logprobs must be an integer between 0 and {MAX_LOGPROBS}, got {value}"
                    );
                    return Err(ApiError::invalid(Some("logprobs"), message));
                }
            },
        };
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
        let temperature = self.temperature.unwrap_or(Sampling::UNCHANGED.temperature);
        if !(0.0..=2.0).contains(&temperature) {
            let message = format!("temperature must be between 0 and 2, got {temperature}");
            return Err(ApiError::invalid(Some("temperature"), message));
        }
        let top_p = self.top_p.unwrap_or(Sampling::UNCHANGED.top_p);
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
        let echo = self.echo.unwrap_or(false);
        let ctx = model.context_length;
        let max_tokens = self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let least = usize::from(!echo);
        if max_tokens < least || max_tokens >= ctx {
            let message = format!(
                "max_tokens must be between {least} and {} (the context length {ctx} less one prompt token{}), got {max_tokens}",
                ctx - 1,
                if echo { "" } else { "; 0 only with echo" },
            );
            return Err(ApiError::invalid(Some("max_tokens"), message));
        }
        if max_tokens > limits.max_completion_tokens {
            let message = format!(
                "max_tokens must be at most {} on this server (--max-completion-tokens), got {max_tokens}",
                limits.max_completion_tokens
            );
            return Err(ApiError::invalid(Some("max_tokens"), message));
        }
        let prompts = prompt_ids(self.prompt, model, limits.max_prompt_tokens)?;
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
            echo,
            max_tokens,
            logprobs,
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
/// and texts; token ids must be ones the tokenizer can write, and all the prompts
/// together at most `max_tokens` tokens (counted as they are encoded, so a long
/// list is refused without encoding all of it).
fn prompt_ids(
    prompt: Option<Prompt>,
    model: &ServedModel,
    max_tokens: usize,
) -> Result<Vec<PromptIds>, ApiError> {
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
    let mut prompts = Vec::new();
    let mut tokens = 0;
    let mut push = |prompt: PromptIds| {
        tokens += prompt.ids.len();
        if tokens > max_tokens {
            let message = format!(
                "the prompts have more than {max_tokens} tokens, this server's limit for a request (--max-prompt-tokens)"
            );
            return Err(ApiError::invalid(Some("prompt"), message).with_code("prompt_too_long"));
        }
        prompts.push(prompt);
        Ok(())
    };
    match prompt.unwrap_or(Prompt::Text(String::new())) {
        Prompt::Text(text) => push(from_text(text))?,
        Prompt::Texts(texts) => {
            for text in texts {
                push(from_text(text))?;
            }
        }
        Prompt::Tokens(ids) => push(from_ids(ids)?)?,
        Prompt::TokenLists(lists) => {
            for ids in lists {
                push(from_ids(ids)?)?;
            }
        }
    }
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

    /// What the engine decodes for choice `index`.
    pub fn choice(&self, index: usize, model: &ServedModel) -> Choice {
        let prompt = &self.prompts[index / self.n];
        let seed = self.seed.wrapping_add(index as u64);
        let sampler = Sampler::new(self.temperature, self.top_p, self.top_k, seed)
            .expect("parameters checked")
            .vocabulary(model.tokenizer.vocab_size());
        Choice {
            prompt: prompt.ids.clone(),
            max_tokens: self.max_tokens,
            sampler,
            eos: (!self.ignore_eos).then_some(model.eos),
            stop: self.stop.clone(),
            echo: self.echo.then(|| prompt.text.clone()),
            logprobs: self.logprobs,
        }
    }

    /// Prompt tokens in all (each prompt once, however many choices it has).
    pub fn prompt_tokens(&self) -> usize {
        self.prompts.iter().map(|p| p.ids.len()).sum()
    }
}
