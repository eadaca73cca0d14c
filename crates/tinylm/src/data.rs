//! Token datasets (SPEC §3 data loading): a memory-mapped `.npy` array of token
//! ids, random training batches and the sequential pass of validation.
//!
//! **Batch order, reproducible outside Rust.** Batches come from [`SplitMix64`]
//! (state `u64`, seeded with the training seed). Each batch draws its `B` start
//! indices one after another with [`SplitMix64::below`]`(n − T)`: rejection sampling,
//! unbiased — draw `x`; while `x ≥ 2^64 − (2^64 mod k)` draw again; return `x mod k`.
//! Row `b` gets inputs `x[s : s+T]` and targets `x[s+1 : s+T+1]`. In Python:
//!
//! ```python
//! M = (1 << 64) - 1
//! def next_u64(state):              # returns (new_state, output)
//!     state = (state + 0x9E3779B97F4A7C15) & M
//!     z = state
//!     z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
//!     z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
//!     return state, z ^ (z >> 31)
//! def below(state, k):
//!     limit = (1 << 64) - ((1 << 64) % k)
//!     while True:
//!         state, x = next_u64(state)
//!         if x < limit:
//!             return state, x % k
//! ```
//!
//! **Validation pass.** Windows of `T + 1` tokens start at `0, T, 2T, …` (inputs
//! `x[kT : kT+T]`, targets shifted by one), `(n − 1) / T` of them; batches take `B`
//! consecutive windows (the last batch may hold fewer).

use crate::{Error, Result};
use rayon::prelude::*;
use std::path::Path;
use tinylm_bpe::npy::{Dtype, MappedNpy};

/// The SplitMix64 generator (Steele, Lea & Flood 2014): tiny, fast, and simple to
/// reproduce in any language (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    pub state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `[0, k)`, `k > 0`, by rejection (no modulo bias).
    pub fn below(&mut self, k: u64) -> u64 {
        assert!(k > 0, "below(0)");
        // 2^64 mod k, computed without overflow; values at or above 2^64 − that are rejected.
        let rem = (u64::MAX % k + 1) % k;
        loop {
            let x = self.next_u64();
            if rem == 0 || x < rem.wrapping_neg() {
                return x % k;
            }
        }
    }
}

/// A batch of `B` rows of `T` input ids and their next-token targets, `(B, T)` each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub b: usize,
    pub t: usize,
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
}

impl Batch {
    pub fn new(b: usize, t: usize) -> Self {
        Batch {
            b,
            t,
            inputs: vec![0; b * t],
            targets: vec![0; b * t],
        }
    }
}

/// A memory-mapped 1-D token array whose ids are all below `vocab_size`.
pub struct TokenDataset {
    npy: MappedNpy,
    vocab_size: usize,
}

impl TokenDataset {
    /// Maps `path` (1-D `uint16`, `uint32`, `int32` or `int64`) and checks every id is in
    /// `[0, vocab_size)` (one parallel pass); errors name the file and element offset.
    pub fn open(path: &Path, vocab_size: usize) -> Result<Self> {
        let npy = MappedNpy::open(path)?;
        let size = npy.header.dtype.size();
        if npy.header.dtype == Dtype::F32 {
            return Err(Error::Invalid(format!(
                "{}: dtype float32 is not a token array (expected uint16, uint32, int32 or int64)",
                path.display()
            )));
        }
        if npy.header.shape.len() != 1 {
            return Err(Error::Invalid(format!(
                "{}: expected a 1-D token array, got shape {:?}",
                path.display(),
                npy.header.shape
            )));
        }
        let bad = npy
            .data()
            .par_chunks(size << 16)
            .enumerate()
            .find_map_first(|(c, bytes)| {
                bytes.chunks_exact(size).enumerate().find_map(|(i, b)| {
                    let id = decode(npy.header.dtype, b);
                    (id < 0 || id >= vocab_size as i64).then_some(((c << 16) + i, id))
                })
            });
        if let Some((offset, id)) = bad {
            return Err(Error::Invalid(format!(
                "{}: token id {id} at element {offset} is outside the vocabulary [0, {vocab_size})",
                path.display()
            )));
        }
        Ok(TokenDataset { npy, vocab_size })
    }

    /// Number of tokens `n`.
    pub fn len(&self) -> usize {
        self.npy.len()
    }

    pub fn is_empty(&self) -> bool {
        self.npy.is_empty()
    }

    pub fn path(&self) -> &Path {
        &self.npy.path
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Checks that windows of `t + 1` tokens fit: `n ≥ t + 1`.
    pub fn check_context(&self, t: usize) -> Result<()> {
        if self.len() < t + 1 {
            return Err(Error::Invalid(format!(
                "{}: {} tokens is too short for context length {t} (need at least {})",
                self.path().display(),
                self.len(),
                t + 1
            )));
        }
        Ok(())
    }

    /// Copies ids `x[start .. start + out.len()]` into `out`.
    fn copy_ids(&self, start: usize, out: &mut [u32]) {
        let dtype = self.npy.header.dtype;
        let size = dtype.size();
        let bytes = &self.npy.data()[start * size..(start + out.len()) * size];
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(size)) {
            // Ids were checked to lie in [0, vocab_size) at open.
            *o = decode(dtype, b) as u32;
        }
    }

    /// Fills row `row` of `batch` with the window starting at token `s`.
    fn fill_row(&self, batch: &mut Batch, row: usize, s: usize) {
        let t = batch.t;
        self.copy_ids(s, &mut batch.inputs[row * t..(row + 1) * t]);
        self.copy_ids(s + 1, &mut batch.targets[row * t..(row + 1) * t]);
    }

    /// Fills `batch` with `B` windows at start indices uniform in `[0, n − T)`
    /// drawn from `rng` (see the module docs). Needs [`check_context`](Self::check_context)`(T)`.
    pub fn fill_random(&self, batch: &mut Batch, rng: &mut SplitMix64) {
        self.fill_random_rows(batch, rng, batch.b, 0);
    }

    /// Draws the windows of a random batch of `batch_size` rows, as [`Self::fill_random`]
    /// does, and fills `batch` with its rows `first..first + B`: a rank's share of the
    /// batch every rank draws alike.
    pub fn fill_random_rows(
        &self,
        batch: &mut Batch,
        rng: &mut SplitMix64,
        batch_size: usize,
        first: usize,
    ) {
        let starts = (self.len() - batch.t) as u64;
        for row in 0..batch_size {
            let s = rng.below(starts) as usize;
            if (first..first + batch.b).contains(&row) {
                self.fill_row(batch, row - first, s);
            }
        }
    }

    /// A freshly allocated random batch `(B, T)`.
    pub fn get_batch(&self, rng: &mut SplitMix64, b: usize, t: usize) -> Result<Batch> {
        self.check_context(t)?;
        let mut batch = Batch::new(b, t);
        self.fill_random(&mut batch, rng);
        Ok(batch)
    }

    /// Number of validation windows of context `t`: `(n − 1) / t`.
    pub fn num_windows(&self, t: usize) -> usize {
        self.len().saturating_sub(1) / t
    }

    /// Fills `batch` with consecutive validation windows `first, first + 1, …`;
    /// returns how many rows were filled (fewer than `B` at the end, 0 past it).
    pub fn fill_windows(&self, batch: &mut Batch, first: usize) -> usize {
        let rows = self.num_windows(batch.t).saturating_sub(first).min(batch.b);
        for row in 0..rows {
            self.fill_row(batch, row, (first + row) * batch.t);
        }
        rows
    }
}

/// One little-endian integer element of `dtype`.
#[inline]
fn decode(dtype: Dtype, b: &[u8]) -> i64 {
    match dtype {
        Dtype::U16 => u16::from_le_bytes([b[0], b[1]]) as i64,
        Dtype::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
        Dtype::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
        Dtype::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")),
        Dtype::F32 => unreachable!("float32 token arrays are rejected at open"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // First outputs for seed 1234567 from the reference C implementation.
        let mut r = SplitMix64::new(1234567);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            vec![
                6457827717110365317,
                3203168211198807973,
                9817491932198370423
            ]
        );
    }

    #[test]
    fn below_rejects_the_biased_tail() {
        // k = 2^63 + 1: 2^64 mod k = 2^63 − 1, so about half the draws are rejected,
        // yet every result is below k.
        let mut r = SplitMix64::new(7);
        let k = (1u64 << 63) + 1;
        assert!((0..1000).all(|_| r.below(k) < k));
        assert_eq!(SplitMix64::new(3).below(1), 0);
    }
}
