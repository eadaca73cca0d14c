//! A prompt continued by a model and streamed as text, for the commands that
//! generate (`tinylm generate`, the quickstart's samples).

use anyhow::Result;
use std::io::Write;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};
use tinylm::generate::{generate, Sampler, TextStream};
use tinylm::kernels::Backend;
use tinylm::Model;
use tinylm_bpe::encode::Tokenizer;

/// A prompt and its continuation as [`write_continuation`] wrote them, and how long
/// the model took.
pub struct Continuation {
    /// The prompt and the new text.
    pub text: String,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// From the start of the prompt's pass to the first new token drawn.
    pub first_token: Option<Duration>,
    /// From the start of the prompt's pass to the end.
    pub elapsed: Duration,
}

impl Continuation {
    /// One line of the figures: the prompt's tokens and the time to the first new
    /// token, the new tokens and their rate after it.
    pub fn timings(&self) -> String {
        let first = self.first_token.unwrap_or(self.elapsed);
        let rest = self.elapsed.saturating_sub(first).as_secs_f64();
        let after_first = self.new_tokens.saturating_sub(1);
        let rate = match rest > 0.0 {
            true => format!(", then {:.1} tokens/s", after_first as f64 / rest),
            false => String::new(),
        };
        format!(
            "prompt {} tokens, first token after {:.1} ms; {} new tokens in {:.3} s{rate}",
            self.prompt_tokens,
            first.as_secs_f64() * 1e3,
            self.new_tokens,
            self.elapsed.as_secs_f64()
        )
    }
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
    let start = Instant::now();
    let mut first_token = None;
    let new = generate(model, &ids, max_tokens, sampler, Some(eos), |id| {
        first_token.get_or_insert_with(|| start.elapsed());
        let piece = stream.push(id).map_err(anyhow::Error::from);
        match piece.and_then(|piece| emit(&piece)) {
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
    let elapsed = start.elapsed();
    emit(&(stream.finish() + "\n"))?;
    Ok(Continuation {
        text,
        prompt_tokens: ids.len().max(1),
        new_tokens: new.len(),
        first_token,
        elapsed,
    })
}

/// Whether `err` is a write into a closed pipe (`tinylm generate … | head`).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}
