//! The JSON the completions API answers with: a whole response, a stream's chunks,
//! the usage, and `GET /v1/models`.

use crate::engine::FinishReason;
use crate::request::ServedModel;
use serde_json::{json, Value};

/// What every response and chunk of one request carries.
pub struct Header {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// One choice's text (all of it, or a stream's piece), its log-probabilities
/// object when asked for, and how it ended.
pub struct ChoiceText<'a> {
    pub index: usize,
    pub text: &'a str,
    pub logprobs: Option<Value>,
    pub finish: Option<FinishReason>,
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

    /// A stream chunk of one choice; `"usage": null` when the client asked for the
    /// usage chunk.
    pub fn chunk(&self, choice: ChoiceText, with_usage: bool) -> Value {
        self.object(json!([choice.json()]), with_usage.then_some(Value::Null))
    }

    /// The stream's last chunk when the client asked for usage: no choices.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        self.object(json!([]), Some(usage))
    }

    /// The whole response: each choice, in order.
    pub fn response(&self, choices: Vec<ChoiceText>, usage: Value) -> Value {
        let choices = choices.into_iter().map(ChoiceText::json).collect();
        self.object(Value::Array(choices), Some(usage))
    }
}

impl ChoiceText<'_> {
    fn json(self) -> Value {
        json!({
            "text": self.text,
            "index": self.index,
            "logprobs": self.logprobs,
            "finish_reason": self.finish.map(FinishReason::as_str),
        })
    }
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
