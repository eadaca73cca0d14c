//! The tokenizer that goes with a model, for the commands that turn its ids into
//! text: the one `--tokenizer` names or the weights record, with `<|endoftext|>`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use tinylm::weights::OpenedWeights;
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::files::{Bpe, END_OF_TEXT};

/// `--tokenizer`, or else the tokenizer the weights record; an error when neither.
pub fn tokenizer_dir(
    given: Option<&Path>,
    recorded: Option<&Path>,
    weights_path: &Path,
) -> Result<PathBuf> {
    given.or(recorded).map(Path::to_path_buf).with_context(|| {
        format!(
            "{} records no tokenizer: pass --tokenizer DIR",
            weights_path.display()
        )
    })
}

/// The tokenizer in `dir` (its special tokens and split pattern) with `<|endoftext|>`
/// among its special tokens, and that token's id.
pub fn load_with_end_of_text(dir: &Path) -> Result<(Tokenizer, u32)> {
    let bpe =
        Bpe::load(dir).with_context(|| format!("loading the tokenizer in {}", dir.display()))?;
    let mut specials = bpe.special_tokens();
    if !specials.iter().any(|s| s == END_OF_TEXT) {
        specials.push(END_OF_TEXT.to_string());
    }
    let tokenizer = Tokenizer::new(bpe.vocab, &bpe.merges, &specials)?.with_pattern(bpe.pattern);
    let eos = tokenizer.encode(END_OF_TEXT);
    debug_assert_eq!(eos.len(), 1, "a special token is one id");
    Ok((tokenizer, eos[0]))
}

/// The tokenizer of the model whose weights `weights` opened from `weights_path`
/// (`--tokenizer DIR`, or the one the weights record), with `<|endoftext|>` and
/// that token's id; an error when it has more tokens than the model.
pub fn for_model(
    given: Option<&Path>,
    weights: &OpenedWeights,
    weights_path: &Path,
) -> Result<(Tokenizer, u32)> {
    let dir = tokenizer_dir(given, weights.tokenizer.as_deref(), weights_path)?;
    let (tokenizer, eos) = load_with_end_of_text(&dir)?;
    if tokenizer.vocab_size() > weights.config.vocab_size {
        bail!(
            "{}: the tokenizer has {} tokens but the model of {} only {}",
            dir.display(),
            tokenizer.vocab_size(),
            weights_path.display(),
            weights.config.vocab_size
        );
    }
    Ok((tokenizer, eos))
}
