//! A prompt continued by a model and streamed as text, for the commands that
//! generate (`tinylm generate`, the quickstart's samples).

use anyhow::Result;
use std::io::Write;
use std::ops::ControlFlow;
use tinylm::generate::{generate, Sampler, TextStream};
use tinylm::kernels::Backend;
use tinylm::Model;
use tinylm_bpe::encode::Tokenizer;

/// Writes `prompt` and then its continuation to `out` token by token (flushed as
/// each character completes), up to `max_tokens` or `<|endoftext|>`; an empty
/// prompt starts a new document. Returns the whole text.
pub fn write_continuation<B: Backend<f32>>(
    model: &mut Model<f32, B>,
    tokenizer: &Tokenizer,
    eos: u32,
    prompt: &str,
    max_tokens: usize,
    sampler: &mut Sampler,
    out: &mut dyn Write,
) -> Result<String> {
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
    generate(
        model,
        &ids,
        max_tokens,
        sampler,
        Some(eos),
        |id| match stream
            .push(id)
            .map_err(anyhow::Error::from)
            .and_then(|piece| emit(&piece))
        {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                failure = Some(e);
                ControlFlow::Break(())
            }
        },
    )?;
    if let Some(e) = failure {
        return Err(e);
    }
    emit(&(stream.finish() + "\n"))?;
    Ok(text)
}

/// Whether `err` is a write into a closed pipe (`tinylm generate … | head`).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}
