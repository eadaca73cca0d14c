//! Byte-level BPE tokenizer with the exact semantics of Stanford CS336 assignment 1.
//!
//! - [`pretokenize`]: the split patterns (GPT-2's, GPT-4's, o200k's as hand-written
//!   scanners equal to their regexes, any other regex) and the splitting of text at
//!   special tokens.
//! - [`train`]: BPE training (`train_bpe`).
//! - [`encode`]: the [`encode::Tokenizer`]: encode, streaming encode, decode.
//! - [`files`]: a tokenizer's definition ([`files::Bpe`]) and its files: GPT-2
//!   `vocab.json` / `merges.txt`, Hugging Face `tokenizer.json`, tiktoken rank files.
//! - [`npy`]: NumPy `.npy` token files.
//! - [`atomic`]: files and directories written whole or not at all (every crate's
//!   outputs).

pub mod atomic;
pub mod encode;
pub mod error;
pub mod files;
pub mod npy;
pub mod pretokenize;
pub mod train;

pub use error::{Error, FileError, Result};

/// Token id → bytes. Ids are dense: `vocab[id]` for `id in 0..vocab.len()`.
pub type Vocab = Vec<Vec<u8>>;
/// Merges in order of creation: the merge at index `r` has rank `r`.
pub type Merges = Vec<(Vec<u8>, Vec<u8>)>;
