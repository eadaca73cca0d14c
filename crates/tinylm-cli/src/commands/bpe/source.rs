//! Where `bpe encode`, `bpe decode` and `bpe export` take a tokenizer from: a directory,
//! GPT-2's two files, a tiktoken rank file or a Hugging Face `tokenizer.json`; and the
//! split pattern, which travels with the tokenizer.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use tinylm_bpe::files::{hf, tiktoken, Bpe, END_OF_TEXT};
use tinylm_bpe::pretokenize::Pattern;

use super::train::parse_pattern;

#[derive(Args, Default)]
pub struct TokenizerArgs {
    /// Tokenizer directory (`tinylm bpe train`'s): `tokenizer.json`, with its split
    /// pattern, or else `vocab.json` and `merges.txt` (GPT-2's pattern).
    #[arg(long, conflicts_with_all = ["vocab", "merges", "tiktoken", "tokenizer_json"])]
    tokenizer: Option<PathBuf>,
    /// GPT-2 style `vocab.json` (with --merges).
    #[arg(long, requires = "merges", conflicts_with_all = ["tiktoken", "tokenizer_json"])]
    vocab: Option<PathBuf>,
    /// GPT-2 style `merges.txt` (with --vocab).
    #[arg(long, requires = "vocab")]
    merges: Option<PathBuf>,
    /// tiktoken rank file (`base64 rank` lines, e.g. `cl100k_base.tiktoken`); give the
    /// pattern it was made for with --pattern.
    #[arg(long, requires = "pattern", conflicts_with = "tokenizer_json")]
    tiktoken: Option<PathBuf>,
    /// Hugging Face `tokenizer.json` (byte-level BPE).
    #[arg(long)]
    tokenizer_json: Option<PathBuf>,
    /// Split pattern: `gpt2`, `gpt4` (cl100k), `o200k` or a regex. Required with
    /// --tiktoken; with a tokenizer that records its pattern, it must be that pattern
    /// unless --force-pattern.
    #[arg(long, value_parser = parse_pattern)]
    pattern: Option<Pattern>,
    /// Use --pattern even where the tokenizer was trained with another one.
    #[arg(long, requires = "pattern")]
    force_pattern: bool,
    /// A special token (repeatable), `TOKEN` or `TOKEN=ID` (tiktoken files: the id;
    /// without it, the ids after the last rank). Default: the tokenizer's own
    /// specials, or `<|endoftext|>` when the vocabulary has it.
    #[arg(long = "special-token")]
    special_tokens: Vec<String>,
}

impl TokenizerArgs {
    /// `--tokenizer DIR` alone.
    pub fn dir(dir: &Path) -> Self {
        TokenizerArgs {
            tokenizer: Some(dir.to_path_buf()),
            ..Default::default()
        }
    }

    /// The tokenizer's definition, with the pattern and special tokens asked for.
    pub fn load_definition(&self) -> anyhow::Result<Bpe> {
        // `recorded`: the file that records the tokenizer's split pattern, if any.
        let (mut bpe, recorded) = match (&self.tokenizer, &self.vocab, &self.tiktoken, &self.tokenizer_json) {
            (Some(dir), _, _, _) => {
                let json = dir.join("tokenizer.json");
                (Bpe::load(dir)?, json.exists().then_some(json))
            }
            (None, Some(vocab), _, _) => {
                let merges = self.merges.as_ref().expect("clap: --vocab requires --merges");
                let bpe = Bpe::new(
                    tinylm_bpe::files::load_vocab(vocab)?,
                    tinylm_bpe::files::load_merges(merges)?,
                    Pattern::Gpt2,
                )
                .with_context(|| format!("{} and {}", vocab.display(), merges.display()))?;
                (bpe, None)
            }
            (None, None, Some(ranks), _) => {
                let pattern = self.pattern.clone().expect("clap: --tiktoken requires --pattern");
                let specials = self.special_tokens_with_ids()?;
                (tiktoken::load(ranks, pattern, &specials)?, None)
            }
            (None, None, None, Some(json)) => (hf::load(json)?, Some(json.clone())),
            _ => bail!(
                "give the tokenizer as --tokenizer DIR, --vocab FILE --merges FILE, --tiktoken FILE --pattern P or --tokenizer-json FILE"
            ),
        };
        if let Some(pattern) = &self.pattern {
            if let Some(file) = recorded.filter(|_| *pattern != bpe.pattern && !self.force_pattern)
            {
                bail!(
                    "{}: the tokenizer was trained with the {} split pattern, not {} (pass --force-pattern to use it anyway)",
                    file.display(),
                    describe(&bpe.pattern),
                    describe(pattern)
                );
            }
            bpe.pattern = pattern.clone();
        }
        if self.tiktoken.is_none() && !self.special_tokens.is_empty() {
            bpe.specials.clear();
            for name in &self.special_tokens {
                let id = bpe
                    .vocab
                    .iter()
                    .position(|t| t == name.as_bytes())
                    .unwrap_or_else(|| {
                        bpe.vocab.push(name.as_bytes().to_vec());
                        bpe.vocab.len() - 1
                    });
                bpe.specials.push(id as u32);
            }
        } else if bpe.specials.is_empty() {
            if let Some(id) = bpe.vocab.iter().position(|t| t == END_OF_TEXT.as_bytes()) {
                bpe.specials.push(id as u32);
            }
        }
        Ok(bpe)
    }

    /// The encoder.
    pub fn load(&self) -> anyhow::Result<tinylm_bpe::encode::Tokenizer> {
        Ok(self.load_definition()?.tokenizer()?)
    }

    /// `--special-token` values as `(token, id)`; `TOKEN=ID` when the part after the
    /// last `=` is a number.
    fn special_tokens_with_ids(&self) -> anyhow::Result<Vec<(String, Option<u32>)>> {
        Ok(self
            .special_tokens
            .iter()
            .map(|s| match s.rsplit_once('=') {
                Some((name, id)) if !name.is_empty() && id.parse::<u32>().is_ok() => {
                    (name.to_string(), id.parse().ok())
                }
                _ => (s.clone(), None),
            })
            .collect())
    }
}

/// A pattern for messages: its name, or the regex of a custom one.
fn describe(pattern: &Pattern) -> String {
    match pattern {
        Pattern::Custom(c) => format!("custom ({:?})", c.regex()),
        named => named.name().to_string(),
    }
}
