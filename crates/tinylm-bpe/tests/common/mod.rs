//! Helpers shared by the tokenizer suites: merges and vocabularies as training
//! builds them.
#![allow(dead_code)] // each suite uses its own part

use tinylm_bpe::{Merges, Vocab};

/// The merges of `pairs`, each pair's tokens given as text.
pub fn merges_of(pairs: &[(&str, &str)]) -> Merges {
    pairs
        .iter()
        .map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec()))
        .collect()
}

/// A vocabulary as training builds it: bytes, specials, then concatenations of merges.
pub fn vocab_of(specials: &[&str], merges: &Merges) -> Vocab {
    let mut vocab: Vocab = (0..=255u8).map(|b| vec![b]).collect();
    vocab.extend(specials.iter().map(|s| s.as_bytes().to_vec()));
    vocab.extend(
        merges
            .iter()
            .map(|(l, r)| [l.as_slice(), r.as_slice()].concat()),
    );
    vocab
}
