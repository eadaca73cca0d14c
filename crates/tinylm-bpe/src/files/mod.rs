//! Tokenizer files: the formats a tokenizer is saved in and read from.
//!
//! - [`gpt2`]: GPT-2's `vocab.json` and `merges.txt` (`tinylm bpe train` writes these).
//! - [`hf`]: Hugging Face `tokenizer.json`, which also records the split pattern.
//! - [`tiktoken`]: tiktoken's rank files (`<base64 token> <rank>` lines).
//!
//! [`Bpe`] is a tokenizer's whole definition (vocabulary, merges, special tokens and
//! split pattern); [`Bpe::load`] and [`Bpe::save`] read and write a directory.
//! Every file is written whole or not at all ([`crate::atomic`]), and every error
//! names the file and the entry at fault.

mod byte_table;
pub mod gpt2;
pub mod hf;
mod io;
pub mod tiktoken;

pub use byte_table::bytes_to_unicode;
pub use gpt2::{load_merges, load_vocab, save_merges, save_vocab};

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::encode::Tokenizer;
use crate::pretokenize::Pattern;
use crate::{invalid, Error, Merges, Result, Vocab};
use byte_table::spell;

/// The special token that ends a document.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// The most ids a tokenizer file may leave unused below its largest one. Each
/// becomes an empty placeholder token (cl100k_base leaves one, o200k_base 19), so
/// this keeps a special token's id far above the others from costing memory that
/// the file's size does not justify: reading a rank file with the most unused
/// ids and encoding with it peaks near 0.8 MB, within the 1 MiB beyond 64 bytes
/// per input byte that the fuzz targets allow a tokenizer file.
pub const MAX_UNUSED_IDS: u64 = 1 << 14;

/// Checks that ids `0..end`, of which `used` are tokens, leave at most
/// [`MAX_UNUSED_IDS`] unused; `largest` names the largest id for the error.
pub(crate) fn check_unused_ids(
    end: u64,
    used: usize,
    largest: impl FnOnce() -> String,
) -> Result<()> {
    let unused = end.saturating_sub(used as u64);
    if unused > MAX_UNUSED_IDS {
        return Err(invalid!(
            "{} leaves {unused} ids unused below it, more than {MAX_UNUSED_IDS}",
            largest()
        ));
    }
    Ok(())
}

/// Writes `dir/vocab.json` and `dir/merges.txt`, creating `dir` if needed.
pub fn save_tokenizer(dir: &Path, vocab: &Vocab, merges: &Merges) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    save_vocab(&dir.join("vocab.json"), vocab)?;
    save_merges(&dir.join("merges.txt"), merges)
}

/// Reads `dir/vocab.json` and `dir/merges.txt`, and checks that every merge's parts and
/// result are in the vocabulary.
pub fn load_tokenizer(dir: &Path) -> Result<(Vocab, Merges)> {
    let (vocab_path, merges_path): (PathBuf, PathBuf) =
        (dir.join("vocab.json"), dir.join("merges.txt"));
    let vocab = load_vocab(&vocab_path)?;
    let merges = load_merges(&merges_path)?;
    let known: HashSet<&[u8]> = vocab.iter().map(Vec::as_slice).collect();
    for (rank, (left, right)) in merges.iter().enumerate() {
        let merged = [left.as_slice(), right.as_slice()].concat();
        for part in [left.as_slice(), right.as_slice(), merged.as_slice()] {
            if !known.contains(part) {
                return Err(invalid!(
                    "{}: merge {} (rank {rank}) uses the token {:?}, which is not in {}",
                    merges_path.display(),
                    rank + 1,
                    spell(bytes_to_unicode(), part),
                    vocab_path.display()
                ));
            }
        }
    }
    Ok((vocab, merges))
}

/// A tokenizer's definition as its files hold it.
///
/// `vocab[id]` is token `id`'s bytes; `merges` are in rank order; `specials` are the
/// ids of the special tokens (UTF-8 text matched before pre-tokenization), ascending;
/// `pattern` is the split pattern. A vocabulary read from a rank file may hold empty
/// placeholder tokens at ids no token uses (see [`tiktoken::load`]): they never
/// encode, and decode to nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Bpe {
    pub vocab: Vocab,
    pub merges: Merges,
    pub specials: Vec<u32>,
    pub pattern: Pattern,
}

impl Bpe {
    /// A tokenizer from its vocabulary, merges and pattern. The special tokens are the
    /// tokens that are neither one byte nor made by a merge (`<|endoftext|>` and any
    /// other `--special-token` of `tinylm bpe train`); they must be UTF-8 text.
    pub fn new(vocab: Vocab, merges: Merges, pattern: Pattern) -> Result<Bpe> {
        let made: HashSet<Vec<u8>> = merges
            .iter()
            .map(|(l, r)| [&l[..], &r[..]].concat())
            .collect();
        let mut specials = Vec::new();
        for (id, token) in vocab.iter().enumerate() {
            if token.len() > 1 && !made.contains(token) {
                if std::str::from_utf8(token).is_err() {
                    return Err(invalid!(
                        "token {id} is no merge's result, so it is a special token, but it is not UTF-8 text: {token:?}"
                    ));
                }
                specials.push(id as u32);
            }
        }
        Ok(Bpe {
            vocab,
            merges,
            specials,
            pattern,
        })
    }

    /// Reads a tokenizer directory. With a `tokenizer.json` (what [`Bpe::save`] and
    /// the Hugging Face export write), everything comes from it, the pattern included;
    /// else from `vocab.json` and `merges.txt` (`tinylm bpe train`'s), with GPT-2's
    /// pattern and the special tokens [`Bpe::new`] finds.
    pub fn load(dir: &Path) -> Result<Bpe> {
        let json = dir.join("tokenizer.json");
        if json.is_file() {
            return hf::load(&json);
        }
        let (vocab, merges) = load_tokenizer(dir)?;
        Bpe::new(vocab, merges, Pattern::Gpt2).map_err(|e| match e {
            Error::Invalid(msg) => invalid!("{}: {msg}", dir.join("vocab.json").display()),
            other => other,
        })
    }

    /// Writes `dir/vocab.json`, `dir/merges.txt` and `dir/tokenizer.json` (each whole
    /// or not at all), creating `dir` if needed. `tokenizer.json` maps
    /// each token to one id, so a vocabulary where two ids have the same bytes is
    /// refused (naming both) before anything is written.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let json = dir.join("tokenizer.json");
        if let Some((first, second)) = self.repeated_token() {
            return Err(invalid!(
                "{}: tokens {first} and {second} are both {:?}: a tokenizer.json maps each token to one id",
                json.display(),
                String::from_utf8_lossy(&self.vocab[first as usize])
            ));
        }
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        save_vocab(&dir.join("vocab.json"), &self.vocab)?;
        save_merges(&dir.join("merges.txt"), &self.merges)?;
        hf::save(&json, self)
    }

    /// The first two ids with the same (non-empty) bytes, if any.
    pub fn repeated_token(&self) -> Option<(u32, u32)> {
        let mut seen = rustc_hash::FxHashMap::default();
        for (id, token) in self.vocab.iter().enumerate() {
            if token.is_empty() {
                continue;
            }
            if let Some(&first) = seen.get(token.as_slice()) {
                return Some((first, id as u32));
            }
            seen.insert(token.as_slice(), id as u32);
        }
        None
    }

    /// The special tokens' text, in id order.
    pub fn special_tokens(&self) -> Vec<String> {
        self.specials
            .iter()
            .map(|&id| String::from_utf8_lossy(&self.vocab[id as usize]).into_owned())
            .collect()
    }

    /// The encoder: the vocabulary, merges, special tokens and pattern.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Ok(
            Tokenizer::new(self.vocab.clone(), &self.merges, &self.special_tokens())?
                .with_pattern(self.pattern.clone()),
        )
    }

    /// The id of `<|endoftext|>`, or else of the first special token (Llama's `bos`
    /// and `eos`).
    pub fn end_of_text(&self) -> Option<u32> {
        let id = self
            .specials
            .iter()
            .find(|&&id| self.vocab[id as usize] == END_OF_TEXT.as_bytes());
        id.or(self.specials.first()).copied()
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.specials.contains(&id)
    }

    /// Token `id` as `tokenizer.json` and GGUF write it: a special token as its text,
    /// any other through GPT-2's byte-to-unicode table (space → `Ġ`).
    pub fn spelled(&self, id: u32) -> String {
        let token = &self.vocab[id as usize];
        match self.is_special(id) {
            true => String::from_utf8_lossy(token).into_owned(),
            false => spell(bytes_to_unicode(), token),
        }
    }

    /// The merges as `"left right"`, both spelled through GPT-2's table.
    pub fn spelled_merges(&self) -> Vec<String> {
        let table = bytes_to_unicode();
        self.merges
            .iter()
            .map(|(l, r)| format!("{} {}", spell(table, l), spell(table, r)))
            .collect()
    }
}
