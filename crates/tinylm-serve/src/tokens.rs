//! `POST /tokenize` and `POST /detokenize`, as llama.cpp's server has them: text
//! to the model's token ids (with each token's piece when asked), and ids back to
//! text.

use crate::error::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};
use tinylm_bpe::encode::Tokenizer;

/// `{"content": "…", "with_pieces": false}`; llama.cpp's `add_special` may be
/// given and changes nothing (tinylm's models have no beginning-of-text token).
#[derive(Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default)]
    pub with_pieces: bool,
}

/// `{"tokens": [ids]}`.
#[derive(Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

/// A request of either route: its JSON body, and its answer.
pub trait ConversionRequest: for<'a> Deserialize<'a> {
    /// What the request is called in errors.
    const NAME: &'static str;

    /// The answer's JSON and the number of tokens it converted, or a 400.
    fn answer(&self, tokenizer: &Tokenizer) -> Result<(Value, usize), ApiError>;

    /// The request in `body`, or a 400 saying what is wrong with it.
    fn parse(body: &[u8]) -> Result<Self, ApiError> {
        serde_json::from_slice(body).map_err(|e| {
            let message = format!(
                "the request body is not a valid {} request: {e}",
                Self::NAME
            );
            ApiError::invalid(None, message)
        })
    }
}

impl ConversionRequest for TokenizeRequest {
    const NAME: &'static str = "tokenize";

    /// `{"tokens": [ids]}`, or with pieces `{"tokens": [{"id", "piece"}]}` — a
    /// piece is its text, or the list of its bytes when they are not whole UTF-8
    /// characters — and the number of tokens.
    fn answer(&self, tokenizer: &Tokenizer) -> Result<(Value, usize), ApiError> {
        let ids = tokenizer.encode(&self.content);
        let n = ids.len();
        if !self.with_pieces {
            return Ok((json!({ "tokens": ids }), n));
        }
        let tokens: Vec<Value> = (ids.into_iter())
            .map(|id| {
                let bytes = tokenizer.decode_bytes(&[id]).unwrap_or_default();
                let piece = match String::from_utf8(bytes) {
                    Ok(text) => json!(text),
                    Err(e) => json!(e.into_bytes()),
                };
                json!({"id": id, "piece": piece})
            })
            .collect();
        Ok((json!({ "tokens": tokens }), n))
    }
}

impl ConversionRequest for DetokenizeRequest {
    const NAME: &'static str = "detokenize";

    /// `{"content": text}` (malformed UTF-8 as U+FFFD), or a 400 naming the first
    /// id outside the tokenizer; and the number of tokens.
    fn answer(&self, tokenizer: &Tokenizer) -> Result<(Value, usize), ApiError> {
        let vocab = tokenizer.vocab_size();
        if let Some(i) = self.tokens.iter().position(|&id| id as usize >= vocab) {
            let message = format!(
                "token {} at position {i} is not in the tokenizer's {vocab} tokens",
                self.tokens[i]
            );
            return Err(ApiError::invalid(Some("tokens"), message));
        }
        let bytes = tokenizer
            .decode_bytes(&self.tokens)
            .expect("ids checked above");
        let content = String::from_utf8_lossy(&bytes);
        Ok((json!({ "content": content }), self.tokens.len()))
    }
}
