//! Token ids for the generation and batching suites (`tests/generate.rs`,
//! `tests/batching.rs`).

/// Deterministic pseudo-random ids below `vocab`, a different run for each `salt`.
pub fn ids(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104729) % vocab) as u32)
        .collect()
}
