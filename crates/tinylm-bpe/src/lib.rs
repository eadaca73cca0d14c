//! Byte-level BPE tokenizer with the exact semantics of Stanford CS336 assignment 1.
//!
//! - [`pretokenize`]: the GPT-2 pre-tokenizer (a hand-written scanner equal to the regex)
//!   and the splitting of text at special tokens.
//! - [`train`]: BPE training (`train_bpe`).
//! - [`encode`]: the [`encode::Tokenizer`]: encode, streaming encode, decode.
//! - [`files`]: GPT-2 `vocab.json` / `merges.txt` and the byte-to-unicode table.
//! - [`npy`]: NumPy `.npy` token files.

pub mod encode;
pub mod error;
pub mod files;
pub mod npy;
pub mod pretokenize;
pub mod train;

pub use error::{Error, Result};

/// Token id → bytes. Ids are dense: `vocab[id]` for `id in 0..vocab.len()`.
pub type Vocab = Vec<Vec<u8>>;
/// Merges in order of creation: the merge at index `r` has rank `r`.
pub type Merges = Vec<(Vec<u8>, Vec<u8>)>;
