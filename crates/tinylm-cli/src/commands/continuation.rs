//! A prompt continued by a model and streamed as text, for the commands that
//! generate (`tinylm generate`, the quickstart's samples).

use anyhow::Result;
use std::io::Write;
use std::ops::ControlFlow;
use std::time::Instant;
use tinylm::generate::{generate, Sampler, TextStream};
use tinylm::kernels::Backend;
use tinylm::Model;
use tinylm_bpe::encode::Tokenizer;

/// A prompt's continuation as [`write_continuation`] wrote it: the text, and when
/// its tokens came.
pub struct Continuation {
    /// The prompt and its continuation.
    pub text: String,
    /// Tokens the model read before drawing the first new one: the prompt's
    /// window, or `<|endoftext|>` alone for an empty prompt.
    pub prompt_tokens: usize,
    /// Tokens drawn (an ending `<|endoftext|>` not counted).
    pub new_tokens: usize,
    /// When the prompt's tokens went in.
    pub started: Instant,
    /// When the first new token was drawn (none if the first was `<|endoftext|>`).
    pub first_token: Option<Instant>,
    /// When the last new token was drawn (none if the first was `<|endoftext|>`).
    pub last_token: Option<Instant>,
}

/// Writes `prompt` and then its continuation to `out` token by token (flushed as
/// each character completes), up to `max_tokens` or `<|endoftext|>`; an empty
/// prompt starts a new document.
pub fn write_continuation<B: Backend<f32>>(
    model: &mut Model<f32, B>,
    tokenizer: &Tokenizer,
    eos: u32,
    prompt: &str,
    max_tokens: usize,
    sampler: &mut Sampler,
    out: &mut dyn Write,
) -> Result<Continuation> {
    let mut text = String::new();
    let mut emit = |piece: &str| -> Result<()> {
        text.push_str(piece);
        out.write_all(piece.as_bytes())?;
        Ok(out.flush()?)
    };
    emit(prompt)?;
    let mut stream = TextStream::new(tokenizer);
    let mut failure = None;
    let ids = tokenizer.encode(prompt);
    // The prompt's window, or `<|endoftext|>` alone for an empty prompt.
    let prompt_tokens = ids.len().clamp(1, model.config().context_length);
    let (started, mut first_token, mut last_token) = (Instant::now(), None, None);
    let new = generate(model, &ids, max_tokens, sampler, Some(eos), |id| {
        let now = Instant::now();
        first_token.get_or_insert(now);
        last_token = Some(now);
        match stream
            .push(id)
            .map_err(anyhow::Error::from)
            .and_then(|piece| emit(&piece))
        {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                failure = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    emit(&(stream.finish() + "\n"))?;
    Ok(Continuation {
        text,
        prompt_tokens,
        new_tokens: new.len(),
        started,
        first_token,
        last_token,
    })
}

/// Whether `err` is a write into a closed pipe (`tinylm generate … | head`).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}
