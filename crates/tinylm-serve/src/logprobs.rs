//! `logprobs` in the form of OpenAI's completions: for each token of a choice's
//! text, its string, its log-probability under the model (the log-softmax of the
//! logits that predicted it, before temperature, top-k or top-p), the most probable
//! tokens at its position with theirs (and the chosen one's, so up to `logprobs + 1`
//! entries), and where its text starts in the choice's text (in characters). With
//! `echo`, the prompt's tokens come first, scored by a forward pass over the prompt
//! — the logits `tinylm forward` writes — the first of them with `null`s.

use serde_json::{json, Map, Value};
use tinylm::generate::TextStream;
use tinylm::logprobs::{token_logprobs, TokenLogprobs};
use tinylm_bpe::encode::Tokenizer;

/// One token of a choice's text with its log-probabilities.
#[derive(Clone, Debug)]
pub struct Entry {
    pub token: u32,
    /// `None` for a prompt's first token: nothing predicts it.
    pub scored: Option<TokenLogprobs>,
    /// Characters of the choice's text before this token's.
    pub offset: usize,
}

/// A token as `logprobs` names it: its text, or — when its bytes are not whole
/// UTF-8 characters — `bytes:` and their escapes (`bytes:\xe2\x80`), as OpenAI
/// writes them, so two tokens never share a name.
pub fn token_string(tokenizer: &Tokenizer, id: u32) -> String {
    let bytes = tokenizer.decode_bytes(&[id]).unwrap_or_default();
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let escaped: String = (e.as_bytes().iter())
                .map(|b| format!("\\x{b:02x}"))
                .collect();
            format!("bytes:{escaped}")
        }
    }
}

/// The `logprobs` object of `entries` (a whole choice, or a stream chunk's tokens).
pub fn object(entries: &[Entry], tokenizer: &Tokenizer) -> Value {
    let name = |id| token_string(tokenizer, id);
    let tokens: Vec<String> = entries.iter().map(|e| name(e.token)).collect();
    let token_logprobs: Vec<Option<f32>> = (entries.iter())
        .map(|e| e.scored.as_ref().map(|s| s.logprob))
        .collect();
    let top_logprobs: Vec<Option<Map<String, Value>>> = (entries.iter())
        .map(|e| {
            let scored = e.scored.as_ref()?;
            let mut top: Map<String, Value> = (scored.top.iter())
                .map(|&(id, lp)| (name(id), json!(lp)))
                .collect();
            top.entry(name(scored.token))
                .or_insert_with(|| json!(scored.logprob));
            Some(top)
        })
        .collect();
    let text_offset: Vec<usize> = entries.iter().map(|e| e.offset).collect();
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    })
}

/// The entries of a prompt's tokens from the logits `(T, V)` of a forward pass
/// over it: token `i` scored by row `i − 1` over the tokenizer's ids, with `top`
/// alternatives.
pub fn prompt_entries(
    prompt: &[u32],
    logits: &[f32],
    tokenizer: &Tokenizer,
    top: usize,
) -> Vec<Entry> {
    let vocab = logits.len() / prompt.len();
    let mut text = TextStream::new(tokenizer);
    let mut offset = 0;
    (prompt.iter().enumerate())
        .map(|(i, &token)| {
            let scored = (i > 0).then(|| {
                let row = &logits[(i - 1) * vocab..i * vocab];
                token_logprobs(&row[..tokenizer.vocab_size()], token, top)
            });
            let entry = Entry {
                token,
                scored,
                offset,
            };
            offset += text.push(token).unwrap_or_default().chars().count();
            entry
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{object, token_string, Entry};
    use serde_json::json;
    use tinylm::logprobs::TokenLogprobs;
    use tinylm_bpe::encode::Tokenizer;

    #[test]
    fn tokens_are_named_by_text_or_bytes_and_the_chosen_one_joins_the_top() {
        let mut vocab: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        vocab.push(vec![0xe2, 0x80]);
        let tokenizer = Tokenizer::new(vocab, &Vec::new(), &[]).unwrap();
        assert_eq!(token_string(&tokenizer, 97), "a");
        assert_eq!(token_string(&tokenizer, 256), "bytes:\\xe2\\x80");
        let entries = [
            Entry {
                token: 97,
                scored: None,
                offset: 0,
            },
            Entry {
                token: 256,
                scored: Some(TokenLogprobs {
                    token: 256,
                    logprob: -2.5,
                    top: vec![(98, -0.5)],
                }),
                offset: 1,
            },
        ];
        assert_eq!(
            object(&entries, &tokenizer),
            json!({
                "tokens": ["a", "bytes:\\xe2\\x80"],
                "token_logprobs": [null, -2.5],
                "top_logprobs": [null, {"b": -0.5, "bytes:\\xe2\\x80": -2.5}],
                "text_offset": [0, 1],
            })
        );
    }
}
