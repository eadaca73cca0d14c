//! The [`Tokenizer`]: byte-level BPE encode and decode with GPT-2 semantics.
//!
//! Encoding splits the text at special tokens (leftmost, longest match), splits each
//! piece into GPT-2 pre-tokens, and inside each pre-token applies the merges by rank,
//! lowest first, until none applies (tiktoken's byte-pair merge, on token ids, with a
//! heap). Most pre-tokens are one token, found whole in a hash map; the others are
//! cached. Three ways to run it, all with the same ids:
//!
//! - [`Tokenizer::encode`]: a whole `&str`.
//! - [`StreamEncoder`], [`Tokenizer::encode_iter`], [`Tokenizer::encode_reader`]: text
//!   arriving in chunks, in memory bounded by the chunk size, the longest pre-token and
//!   the longest special token, never by the input's size.
//! - [`Tokenizer::encode_parallel`], [`Tokenizer::encode_file`]: a whole text on a rayon
//!   pool, cut only at boundaries where the ids cannot change, written to `.npy`.

use crate::npy::{Dtype, MappedNpy, NpyWriter};
use crate::pretokenize::{Pattern, SpecialSplitter, Visitor};
use crate::{invalid, Error, Merges, Result, Vocab};
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use std::io::{Read, Write};
use std::ops::Deref;
use std::path::Path;
use std::sync::Mutex;

/// Pre-tokens cached per encoder before the cache is emptied ([`Tokenizer::encode`],
/// parallel workers). Streams use [`STREAM_CACHE_ENTRIES`] to keep their memory small.
const CACHE_ENTRIES: usize = 1 << 16;
const STREAM_CACHE_ENTRIES: usize = 1 << 12;
/// Longer pre-tokens (rare, unlikely to repeat) are not cached.
const CACHE_MAX_BYTES: usize = 64;
/// Bytes read from a [`Read`] per step of [`Tokenizer::encode_reader`].
const READ_BYTES: usize = 1 << 16;
/// Text per work item of [`Tokenizer::encode_file`].
const FILE_CHUNK_BYTES: usize = 1 << 17;
/// Ids per step of [`Tokenizer::decode_file`].
const DECODE_IDS: usize = 1 << 16;

/// A byte-level BPE tokenizer: vocabulary, merges and special tokens.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    /// Token id → bytes, special tokens included.
    vocab: Vocab,
    /// Id of each single byte.
    byte_ids: [u32; 256],
    /// `(left id, right id)` packed in a `u64` → `(rank, merged id)`.
    pairs: FxHashMap<u64, (u32, u32)>,
    /// Tokens whose bytes the merges turn into exactly that one token: a pre-token found
    /// here needs no merging (most words are one token).
    whole: BytesMap<u32>,
    specials: SpecialSplitter,
    special_ids: FxHashMap<Vec<u8>, u32>,
    pattern: Pattern,
}

/// Buffers of [`Tokenizer::merge`]: a linked list of the parts of a piece and a
/// min-heap of candidate merges `rank << 32 | index of the left part`.
#[derive(Default)]
struct MergeWork {
    /// Per part: its token id and the index of the next part (`END`: none; a merged-away
    /// part also gets `END`).
    nodes: Vec<(u32, u32)>,
    prev: Vec<u32>,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<u64>>,
}

const END: u32 = u32::MAX;

/// Per-encoder scratch space: the cache of multi-token pre-tokens and the merge buffers.
struct Scratch {
    /// Pre-token bytes → range of its ids in `cached`.
    cache: BytesMap<(u32, u32)>,
    cached: Vec<u32>,
    capacity: usize,
    merge: MergeWork,
}

impl Scratch {
    fn new(capacity: usize) -> Self {
        Scratch {
            cache: BytesMap::default(),
            cached: Vec::new(),
            capacity,
            merge: MergeWork::default(),
        }
    }
}

/// A hash map keyed by byte strings. Keys of at most 15 bytes (most pre-tokens) are
/// packed with their length into a `u128`, so a lookup hashes and compares one integer
/// instead of calling `memcmp`.
#[derive(Clone, Debug)]
struct BytesMap<V> {
    short: FxHashMap<u128, V>,
    long: FxHashMap<Box<[u8]>, V>,
}

impl<V> Default for BytesMap<V> {
    fn default() -> Self {
        BytesMap {
            short: FxHashMap::default(),
            long: FxHashMap::default(),
        }
    }
}

impl<V> BytesMap<V> {
    #[inline]
    fn packed(key: &[u8]) -> Option<u128> {
        if key.len() > 15 {
            return None;
        }
        let mut buf = [0u8; 16];
        buf[..key.len()].copy_from_slice(key);
        buf[15] = key.len() as u8;
        Some(u128::from_le_bytes(buf))
    }

    #[inline]
    fn get(&self, key: &[u8]) -> Option<&V> {
        match Self::packed(key) {
            Some(k) => self.short.get(&k),
            None => self.long.get(key),
        }
    }

    fn insert(&mut self, key: &[u8], value: V) {
        match Self::packed(key) {
            Some(k) => self.short.insert(k, value),
            None => self.long.insert(key.into(), value),
        };
    }

    fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }

    fn clear(&mut self) {
        self.short.clear();
        self.long.clear();
    }
}

#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

/// A byte string for error messages: text where it is UTF-8, escapes elsewhere.
fn show(bytes: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(bytes))
}

impl Tokenizer {
    /// Builds a tokenizer. Special tokens absent from `vocab` are appended to it; the
    /// vocabulary must hold all 256 single bytes, and every merge's two tokens and their
    /// concatenation. Where several ids have the same bytes, the lowest id is used.
    pub fn new(mut vocab: Vocab, merges: &Merges, special_tokens: &[String]) -> Result<Self> {
        let mut ids: FxHashMap<Vec<u8>, u32> = FxHashMap::default();
        for (id, token) in vocab.iter().enumerate() {
            ids.entry(token.clone()).or_insert(id as u32);
        }
        let mut special_ids = FxHashMap::default();
        for special in special_tokens {
            if special.is_empty() {
                return Err(invalid!("special tokens must not be empty"));
            }
            let bytes = special.as_bytes().to_vec();
            let id = *ids.entry(bytes.clone()).or_insert_with(|| {
                vocab.push(bytes.clone());
                (vocab.len() - 1) as u32
            });
            special_ids.insert(bytes, id);
        }
        if vocab.len() > u32::MAX as usize {
            return Err(invalid!(
                "vocabulary of {} tokens is too large",
                vocab.len()
            ));
        }
        let mut byte_ids = [0u32; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = *ids.get(&[b as u8][..]).ok_or_else(|| {
                invalid!("the vocabulary has no token for the single byte 0x{b:02x}")
            })?;
        }
        let mut pairs = FxHashMap::default();
        for (rank, (left, right)) in merges.iter().enumerate() {
            let merged = [left.as_slice(), right.as_slice()].concat();
            let id_of = |token: &[u8]| {
                ids.get(token).copied().ok_or_else(|| {
                    invalid!(
                        "merge {} (rank {rank}: {} {}) uses the token {}, which is not in the vocabulary",
                        rank + 1,
                        show(left),
                        show(right),
                        show(token)
                    )
                })
            };
            let key = pair_key(id_of(left)?, id_of(right)?);
            let value = (rank as u32, id_of(&merged)?);
            pairs.entry(key).or_insert(value);
        }
        let mut tokenizer = Tokenizer {
            vocab,
            byte_ids,
            pairs,
            whole: BytesMap::default(),
            specials: SpecialSplitter::new(special_tokens),
            special_ids,
            pattern: Pattern::Gpt2,
        };
        let mut work = MergeWork::default();
        let mut merged = Vec::new();
        for (token, &id) in &ids {
            merged.clear();
            tokenizer.merge(token, &mut work, &mut merged);
            if merged == [id] {
                tokenizer.whole.insert(token, id);
            }
        }
        Ok(tokenizer)
    }

    /// The tokenizer with another split pattern (the default is GPT-2's).
    pub fn with_pattern(mut self, pattern: Pattern) -> Self {
        self.pattern = pattern;
        self
    }

    pub fn pattern(&self) -> &Pattern {
        &self.pattern
    }

    /// The special tokens, in the order given.
    pub fn special_tokens(&self) -> &[String] {
        self.specials.specials()
    }

    /// Number of tokens, special tokens included (ids are `0..vocab_size()`).
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// The ids of `text`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 4);
        self.encode_into(text, true, &mut Scratch::new(CACHE_ENTRIES), &mut out);
        out
    }

    /// The ids of each of `texts`, on the current rayon pool; each worker's cache stays
    /// warm across the texts it encodes.
    pub fn encode_batch<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Vec<Vec<u32>> {
        texts
            .par_iter()
            .map_init(
                || Scratch::new(CACHE_ENTRIES),
                |scratch, text| {
                    let text = text.as_ref();
                    let mut out = Vec::with_capacity(text.len() / 4);
                    self.encode_into(text, true, scratch, &mut out);
                    out
                },
            )
            .collect()
    }

    /// The bytes of `ids`, concatenated; an id out of range is an error naming it.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let token = self.vocab.get(id as usize).ok_or_else(|| {
                invalid!(
                    "token id {id} (position {i}) is out of range: the vocabulary has {} tokens",
                    self.vocab.len()
                )
            })?;
            out.extend_from_slice(token);
        }
        Ok(out)
    }

    /// The text of `ids`; malformed UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let bytes = self.decode_bytes(ids)?;
        Ok(match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// Appends to `out` the ids of the part of `text` that no following text can change,
    /// and returns its length in bytes; with `last`, that is all of `text`.
    ///
    /// Without `last`, two things are held back. From the first position (after the
    /// special matches already final) where the rest of `text` is a proper prefix of a
    /// special token: that match may complete later. And the last two pre-tokens of the
    /// final text piece: a pre-token's extent depends on at most the character after
    /// its end (a run's end, the `(?!\S)` after a whitespace run) or two characters after
    /// its start (`'` `l` `l`), so every earlier pre-token is already what the whole text
    /// gives. Those are taken from the scan of the whole piece: a re-scan of the prefix
    /// alone could join a whitespace run that the full text splits.
    fn encode_into(
        &self,
        text: &str,
        last: bool,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) -> usize {
        let bytes = text.as_bytes();
        let mut pos = 0;
        loop {
            let hold = if last {
                text.len()
            } else {
                self.special_prefix_start(bytes, pos)
            };
            let special = self
                .specials
                .find(&bytes[pos..])
                .map(|(s, e)| (pos + s, pos + e))
                .filter(|&(s, _)| s < hold);
            let piece = &text[pos..special.map_or(hold, |(s, _)| s)];
            let Some((s, e)) = special else {
                let done = if last {
                    piece.len()
                } else {
                    self.stable_prefix(piece)
                };
                self.encode_piece(piece, done, scratch, out);
                return pos + done;
            };
            self.encode_piece(piece, piece.len(), scratch, out);
            out.push(self.special_ids[&bytes[s..e]]);
            pos = e;
        }
    }

    /// Start of the second-to-last pre-token of `piece` (0 when it has fewer than two): the
    /// pre-tokens before it are final, whatever text is appended. A custom regex may look
    /// anywhere, so none of its piece is final before the next special token.
    fn stable_prefix(&self, piece: &str) -> usize {
        if !self.pattern.is_named() {
            return 0;
        }
        let (mut before_last, mut last) = (0, 0);
        let mut pos = 0;
        for pretoken in self.pattern.pretokens(piece) {
            (before_last, last) = (last, pos);
            pos += pretoken.len();
        }
        before_last
    }

    /// The first position at or after `from` from which the rest of `text` is a proper
    /// prefix of a special token, or `text.len()`.
    fn special_prefix_start(&self, text: &[u8], from: usize) -> usize {
        let longest = self
            .specials
            .specials()
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0);
        (text.len().saturating_sub(longest).max(from)..text.len())
            .find(|&q| {
                let rest = &text[q..];
                self.specials
                    .specials()
                    .iter()
                    .any(|s| s.len() > rest.len() && s.as_bytes().starts_with(rest))
            })
            .unwrap_or(text.len())
    }

    /// Appends the ids of the pre-tokens of `piece` (text without special tokens) that
    /// start before byte `end`.
    #[inline]
    fn encode_piece(&self, piece: &str, end: usize, scratch: &mut Scratch, out: &mut Vec<u32>) {
        let mut encoder = PieceEncoder {
            tokenizer: self,
            scratch,
            out,
            start: 0,
            end,
        };
        self.pattern.visit(piece, &mut encoder);
    }

    /// Appends the ids of one pre-token: a whole token, a cached result, or merged now.
    #[inline(always)]
    fn encode_pretoken(&self, pretoken: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        if let Some(&id) = self.whole.get(pretoken) {
            out.push(id);
            return;
        }
        if let Some(&(start, end)) = scratch.cache.get(pretoken) {
            out.extend_from_slice(&scratch.cached[start as usize..end as usize]);
            return;
        }
        let before = out.len();
        self.merge(pretoken, &mut scratch.merge, out);
        if pretoken.len() > CACHE_MAX_BYTES {
            return;
        }
        if scratch.cache.len() >= scratch.capacity {
            scratch.cache.clear();
            scratch.cached.clear();
        }
        let start = scratch.cached.len() as u32;
        scratch.cached.extend_from_slice(&out[before..]);
        let end = scratch.cached.len() as u32;
        scratch.cache.insert(pretoken, (start, end));
    }

    /// Byte-pair merge of `piece` (n bytes): starts from the n byte tokens and
    /// repeatedly joins the adjacent pair of lowest rank, the leftmost among equals, which
    /// is applying the merges in order; appends the resulting ids to `out`. The candidate
    /// merges wait in a min-heap keyed by `(rank, position)`, so a piece of n bytes takes
    /// O(n log n) (a scan per merge, as in tiktoken, is O(n²) on a 100 kB run of digits).
    fn merge(&self, piece: &[u8], work: &mut MergeWork, out: &mut Vec<u32>) {
        let MergeWork { nodes, prev, heap } = work;
        if piece.is_empty() {
            return;
        }
        let n = piece.len() as u32;
        nodes.clear();
        prev.clear();
        heap.clear();
        nodes.extend((0..n).map(|i| {
            let next = if i + 1 < n { i + 1 } else { END };
            (self.byte_ids[piece[i as usize] as usize], next)
        }));
        prev.extend((0..n).map(|i| i.wrapping_sub(1)));
        // The rank of merging part `i` with its next part, if they merge.
        let rank_at = |nodes: &[(u32, u32)], i: u32| -> Option<(u32, u32)> {
            let (left, next) = nodes[i as usize];
            (next != END)
                .then(|| {
                    self.pairs
                        .get(&pair_key(left, nodes[next as usize].0))
                        .copied()
                })
                .flatten()
        };
        for i in 0..n {
            if let Some((rank, _)) = rank_at(nodes, i) {
                heap.push(std::cmp::Reverse((rank as u64) << 32 | i as u64));
            }
        }
        while let Some(std::cmp::Reverse(key)) = heap.pop() {
            let (rank, i) = ((key >> 32) as u32, key as u32);
            // Stale entries (the part merged away, or its pair changed) are skipped.
            let Some((current, merged)) = rank_at(nodes, i) else {
                continue;
            };
            if current != rank {
                continue;
            }
            let j = nodes[i as usize].1;
            let after = nodes[j as usize].1;
            nodes[i as usize] = (merged, after);
            nodes[j as usize].1 = END;
            if after != END {
                prev[after as usize] = i;
            }
            for left in [prev[i as usize], i] {
                if left != END {
                    if let Some((rank, _)) = rank_at(nodes, left) {
                        heap.push(std::cmp::Reverse((rank as u64) << 32 | left as u64));
                    }
                }
            }
        }
        let mut i = 0;
        while i != END {
            out.push(nodes[i as usize].0);
            i = nodes[i as usize].1;
        }
    }

    /// Writes the text of the token ids in the `.npy` file `input` (an integer array) to
    /// `out`, malformed UTF-8 as U+FFFD, in bounded memory. Returns the number of ids.
    pub fn decode_file(&self, input: &Path, out: &mut impl Write) -> Result<usize> {
        let npy = MappedNpy::open(input)?;
        let dtype = npy.header.dtype;
        if dtype == Dtype::F32 || dtype.size() < Dtype::for_vocab(self.vocab_size()).size() {
            return Err(invalid!(
                "{}: dtype {} cannot hold the ids of a vocabulary of {} tokens",
                input.display(),
                dtype.descr(),
                self.vocab_size()
            ));
        }
        let mut bytes = Vec::new();
        let mut start = 0;
        while start < npy.len() {
            let end = (start + DECODE_IDS).min(npy.len());
            for i in start..end {
                let id = npy.int_at(i);
                let token = usize::try_from(id).ok().and_then(|id| self.vocab.get(id));
                let token = token.ok_or_else(|| {
                    invalid!(
                        "{}: token id {id} at index {i} is out of range: the vocabulary has {} tokens",
                        input.display(),
                        self.vocab_size()
                    )
                })?;
                bytes.extend_from_slice(token);
            }
            let keep = if end == npy.len() {
                bytes.len()
            } else {
                complete_prefix(&bytes)
            };
            out.write_all(String::from_utf8_lossy(&bytes[..keep]).as_bytes())
                .map_err(|e| Error::io("<output>", e))?;
            bytes.drain(..keep);
            start = end;
        }
        Ok(npy.len())
    }

    /// A streaming encoder: text in chunks, ids out as soon as they are final.
    pub fn stream(&self) -> StreamEncoder<&Tokenizer> {
        StreamEncoder::new(self)
    }

    /// The ids of the concatenation of `chunks`, lazily (the CS336 `encode_iterable`).
    pub fn encode_iter<'t, I>(&'t self, chunks: I) -> impl Iterator<Item = u32> + 't
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
        I::IntoIter: 't,
        I::Item: 't,
    {
        EncodeIter::new(self, chunks.into_iter().map(Ok::<_, Error>)).flatten()
    }

    /// The ids of the UTF-8 text read from `reader`, lazily, in bounded memory.
    /// A read failure or invalid UTF-8 (named by byte offset) ends it with an error.
    pub fn encode_reader<R: Read>(&self, reader: R) -> EncodeIter<'_, Utf8Chunks<R>> {
        EncodeIter::new(self, Utf8Chunks::new(reader))
    }

    /// Encodes `text` on the current rayon pool in chunks of about `chunk_bytes`, cut
    /// only where the ids cannot change (see [`Tokenizer::chunk_bounds`]). `sink` gets
    /// the ids of consecutive runs of chunks in text order, with the bytes they cover;
    /// the concatenation is `encode(text)`; `sink` runs while the next chunks are encoded.
    /// Memory: the ids of two groups of 64 chunks per thread.
    pub fn encode_parallel(
        &self,
        text: &str,
        chunk_bytes: usize,
        mut sink: impl FnMut(&[u32], usize) -> Result<()> + Send,
    ) -> Result<()> {
        let bounds = self.chunk_bounds(text, chunk_bytes);
        let ranges: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
        let threads = rayon::current_num_threads();
        // One scratch (and cache) per worker thread, kept warm across batches.
        let scratches: Vec<Mutex<Scratch>> = (0..threads)
            .map(|_| Mutex::new(Scratch::new(CACHE_ENTRIES)))
            .collect();
        let encode_group = |group: &[(usize, usize)]| -> Vec<Vec<u32>> {
            group
                .par_iter()
                .map(|&(a, b)| {
                    let worker = rayon::current_thread_index().unwrap_or(0) % threads;
                    let mut scratch = scratches[worker].lock().unwrap_or_else(|e| e.into_inner());
                    let mut out = Vec::with_capacity((b - a) / 3);
                    self.encode_into(&text[a..b], true, &mut scratch, &mut out);
                    out
                })
                .collect()
        };
        let mut flush = |ids: &[Vec<u32>], group: &[(usize, usize)]| -> Result<()> {
            for (chunk, &(a, b)) in ids.iter().zip(group) {
                sink(chunk, b - a)?;
            }
            Ok(())
        };
        // The ids of one group of chunks go to `sink` while the next group is encoded.
        let (mut done, mut done_group) = (Vec::new(), &ranges[..0]);
        for group in ranges.chunks(64 * threads) {
            let (flushed, ids) = rayon::join(|| flush(&done, done_group), || encode_group(group));
            flushed?;
            (done, done_group) = (ids, group);
        }
        flush(&done, done_group)
    }

    /// Positions `0 = b0 < b1 < ... < bk = text.len()` at which `text` can be cut without
    /// changing its ids, about `chunk_bytes` apart: the start of a special-token match,
    /// or, inside text between specials, a space followed by an ASCII letter (under each
    /// named pattern such a space always starts a pre-token ` word`, whatever precedes
    /// it; a custom regex's text is cut only at special tokens).
    pub fn chunk_bounds(&self, text: &str, chunk_bytes: usize) -> Vec<usize> {
        let bytes = text.as_bytes();
        let chunk_bytes = chunk_bytes.max(1);
        let mut bounds = vec![0];
        let mut pos = 0;
        loop {
            let special = self
                .specials
                .find(&bytes[pos..])
                .map(|(s, e)| (pos + s, pos + e));
            let piece_end = special.map_or(bytes.len(), |(s, _)| s);
            while self.pattern.is_named() {
                let from = (bounds[bounds.len() - 1] + chunk_bytes).max(pos + 1);
                if from >= piece_end {
                    break;
                }
                match bytes[from..piece_end]
                    .windows(2)
                    .position(|w| w[0] == b' ' && w[1].is_ascii_alphabetic())
                {
                    Some(at) => bounds.push(from + at),
                    None => break,
                }
            }
            let Some((s, e)) = special else { break };
            if s > 0 && s >= bounds[bounds.len() - 1] + chunk_bytes {
                bounds.push(s);
            }
            pos = e;
        }
        if bytes.len() > bounds[bounds.len() - 1] {
            bounds.push(bytes.len());
        }
        bounds
    }

    /// Encodes the UTF-8 file `input` into the `.npy` file `output` (`uint16` when the
    /// vocabulary fits, else `uint32`) on `threads` threads (0: all cores), through a
    /// temporary file and a rename. `progress` gets the input bytes done so far.
    pub fn encode_file(
        &self,
        input: &Path,
        output: &Path,
        threads: usize,
        mut progress: impl FnMut(usize) + Send,
    ) -> Result<EncodeSummary> {
        let file = std::fs::File::open(input).map_err(|e| Error::io(input, e))?;
        let len = file.metadata().map_err(|e| Error::io(input, e))?.len();
        // SAFETY: read-only map; the file changing underneath gives wrong ids, not UB,
        // because the text is validated as UTF-8 below before any use.
        let map = if len == 0 {
            None
        } else {
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(input, e))?)
        };
        let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
        let text = std::str::from_utf8(bytes).map_err(|e| {
            invalid!(
                "{}: invalid UTF-8 at byte {}",
                input.display(),
                e.valid_up_to()
            )
        })?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| invalid!("cannot start {threads} threads: {e}"))?;
        let mut writer = NpyWriter::create(output, Dtype::for_vocab(self.vocab_size()))?;
        let mut done = 0;
        pool.install(|| {
            self.encode_parallel(text, FILE_CHUNK_BYTES, |ids, n| {
                writer.write_ids(ids)?;
                done += n;
                progress(done);
                Ok(())
            })
        })?;
        let tokens = writer.count();
        writer.finish()?;
        Ok(EncodeSummary {
            bytes: text.len(),
            tokens,
        })
    }
}

/// [`Tokenizer::encode_piece`]'s loop body: encodes the pre-tokens that start before `end`.
struct PieceEncoder<'t, 's> {
    tokenizer: &'t Tokenizer,
    scratch: &'s mut Scratch,
    out: &'s mut Vec<u32>,
    /// Start of the next pre-token in the piece.
    start: usize,
    end: usize,
}

impl<'a> Visitor<'a> for PieceEncoder<'_, '_> {
    #[inline(always)]
    fn visit(&mut self, pretoken: &'a str) -> bool {
        if self.start >= self.end {
            return false;
        }
        self.tokenizer
            .encode_pretoken(pretoken.as_bytes(), self.scratch, self.out);
        self.start += pretoken.len();
        true
    }
}

/// Length of `bytes` without a trailing incomplete UTF-8 character (at most 3 bytes),
/// which the next bytes may complete.
fn complete_prefix(bytes: &[u8]) -> usize {
    for k in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - k];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let need = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if need > k {
            bytes.len() - k
        } else {
            bytes.len()
        };
    }
    bytes.len()
}

/// What [`Tokenizer::encode_file`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeSummary {
    pub bytes: usize,
    pub tokens: usize,
}

/// Encodes text pushed in chunks; ids come out as soon as no later text can change them.
/// Holds only the text not yet final (see [`Tokenizer::stream`]). `T` is how it holds
/// the tokenizer: `&Tokenizer`, or an owning handle such as `Arc<Tokenizer>`.
pub struct StreamEncoder<T: Deref<Target = Tokenizer>> {
    tokenizer: T,
    pending: String,
    scratch: Scratch,
}

impl<T: Deref<Target = Tokenizer>> StreamEncoder<T> {
    pub fn new(tokenizer: T) -> Self {
        StreamEncoder {
            tokenizer,
            pending: String::new(),
            scratch: Scratch::new(STREAM_CACHE_ENTRIES),
        }
    }

    /// Adds `chunk` and appends the ids that became final to `out`.
    pub fn push(&mut self, chunk: &str, out: &mut Vec<u32>) {
        self.pending.push_str(chunk);
        let done = self
            .tokenizer
            .encode_into(&self.pending, false, &mut self.scratch, out);
        self.pending.drain(..done);
    }

    /// Bytes of text held back, not yet final.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Ends the text: appends the ids of what is left.
    pub fn finish(&mut self, out: &mut Vec<u32>) {
        self.tokenizer
            .encode_into(&self.pending, true, &mut self.scratch, out);
        self.pending.clear();
    }
}

/// Lazy ids of text chunks from `I` (an iterator of `Result` of text).
pub struct EncodeIter<'t, I> {
    stream: StreamEncoder<&'t Tokenizer>,
    chunks: Option<I>,
    ready: Vec<u32>,
    next: usize,
}

impl<'t, I> EncodeIter<'t, I> {
    fn new(tokenizer: &'t Tokenizer, chunks: I) -> Self {
        EncodeIter {
            stream: tokenizer.stream(),
            chunks: Some(chunks),
            ready: Vec::new(),
            next: 0,
        }
    }
}

impl<I, S> Iterator for EncodeIter<'_, I>
where
    I: Iterator<Item = Result<S>>,
    S: AsRef<str>,
{
    type Item = Result<u32>;

    fn next(&mut self) -> Option<Result<u32>> {
        while self.next == self.ready.len() {
            let chunks = self.chunks.as_mut()?;
            self.ready.clear();
            self.next = 0;
            match chunks.next() {
                Some(Ok(chunk)) => self.stream.push(chunk.as_ref(), &mut self.ready),
                Some(Err(e)) => {
                    self.chunks = None;
                    return Some(Err(e));
                }
                None => {
                    self.chunks = None;
                    self.stream.finish(&mut self.ready);
                }
            }
        }
        self.next += 1;
        Some(Ok(self.ready[self.next - 1]))
    }
}

/// UTF-8 text from a [`Read`] in chunks of about 64 KiB, never splitting a character.
pub struct Utf8Chunks<R> {
    reader: R,
    buf: Vec<u8>,
    /// Bytes of an incomplete character at the end of the last read.
    carry: usize,
    offset: u64,
    done: bool,
}

impl<R: Read> Utf8Chunks<R> {
    pub fn new(reader: R) -> Self {
        Utf8Chunks {
            reader,
            buf: vec![0; READ_BYTES],
            carry: 0,
            offset: 0,
            done: false,
        }
    }
}

impl<R: Read> Iterator for Utf8Chunks<R> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        if self.done {
            return None;
        }
        let fail = |this: &mut Self, e: Error| {
            this.done = true;
            Some(Err(e))
        };
        let n = loop {
            match self.reader.read(&mut self.buf[self.carry..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return fail(self, Error::io("<input>", e)),
            }
        };
        let filled = self.carry + n;
        let valid = match std::str::from_utf8(&self.buf[..filled]) {
            Ok(_) => filled,
            Err(e) if e.error_len().is_none() && n > 0 => e.valid_up_to(),
            Err(e) => {
                let at = self.offset + e.valid_up_to() as u64;
                return fail(self, invalid!("invalid UTF-8 at byte {at} of the input"));
            }
        };
        if n == 0 {
            self.done = true;
            if filled == 0 {
                return None;
            }
        }
        let chunk = std::str::from_utf8(&self.buf[..valid])
            .expect("validated above")
            .to_string();
        self.buf.copy_within(valid..filled, 0);
        self.carry = filled - valid;
        self.offset += valid as u64;
        Some(Ok(chunk))
    }
}
