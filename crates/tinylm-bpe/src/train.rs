//! Byte-level BPE training with the exact semantics of CS336 (SPEC §1.1).
//!
//! Two phases:
//! 1. [`count_pretokens`]: the memory-mapped file is cut into chunks at places where
//!    both the special-token split and the GPT-2 pre-tokenizer are known to start afresh
//!    (`is_cut`), so chunks are pre-tokenized and counted in parallel (rayon) and the
//!    counts equal those of the whole text. Each thread keeps one map of unique
//!    pre-tokens; pages of the file are released as soon as a chunk is counted, so
//!    memory follows the number of unique pre-tokens, not the size of the file.
//! 2. [`train_from_counts`]: the merge loop over the unique pre-tokens (words of token
//!    ids, weighted by their counts), with pair counts, a pair → words index and a
//!    max-heap with lazy deletion; each merge touches only the words holding its pair.
//!
//! Both phases are deterministic, so the result does not depend on the thread count.

use std::borrow::Cow;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::pretokenize::{Pattern, Piece, SpecialSplitter, Visitor};
use crate::{invalid, Error, Merges, Result, Vocab};

/// Counts of unique pre-tokens (UTF-8 bytes → occurrences).
pub type PretokenCounts = FxHashMap<Vec<u8>, u64>;

/// Progress reports, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub enum Progress {
    /// `done` of `total` input bytes are pre-tokenized and counted (`total` is 0 when
    /// unknown: texts from an iterator).
    Pretokenized { done: u64, total: u64 },
    /// `done` of at most `total` merges are made.
    Merged { done: usize, total: usize },
}

/// Options of [`train_bpe_with`].
#[derive(Clone, Copy)]
pub struct TrainOptions<'a> {
    /// The split pattern (default: GPT-2's, CS336's).
    pub pattern: &'a Pattern,
    /// Replace invalid UTF-8 by U+FFFD instead of failing.
    pub lossy_utf8: bool,
    /// Called from any thread as work gets done.
    pub progress: Option<&'a (dyn Fn(Progress) + Sync)>,
}

impl Default for TrainOptions<'_> {
    fn default() -> Self {
        static GPT2: Pattern = Pattern::Gpt2;
        TrainOptions {
            pattern: &GPT2,
            lossy_utf8: false,
            progress: None,
        }
    }
}

/// Target size of a chunk of input counted by one task.
const CHUNK_BYTES: usize = 1 << 20;

/// Trains a byte-level BPE tokenizer on the text file at `path` (see SPEC §1.1).
///
/// The vocabulary is the 256 bytes, then `special_tokens` (duplicates dropped, order
/// kept), then one token per merge, up to `vocab_size` tokens in all.
pub fn train_bpe(
    path: &Path,
    vocab_size: usize,
    special_tokens: &[String],
) -> Result<(Vocab, Merges)> {
    train_bpe_with(path, vocab_size, special_tokens, TrainOptions::default())
}

/// [`train_bpe`] with options; runs on the current rayon thread pool.
pub fn train_bpe_with(
    path: &Path,
    vocab_size: usize,
    special_tokens: &[String],
    options: TrainOptions,
) -> Result<(Vocab, Merges)> {
    train_bpe_files(&[path], vocab_size, special_tokens, options)
}

/// [`train_bpe_with`] on several text files, each a document of its own (no pre-token
/// spans two files); they are counted one after the other.
pub fn train_bpe_files<P: AsRef<Path>>(
    paths: &[P],
    vocab_size: usize,
    special_tokens: &[String],
    options: TrainOptions,
) -> Result<(Vocab, Merges)> {
    let specials = dedup_specials(special_tokens)?;
    check_vocab_size(vocab_size, &specials)?;
    let mut counts = PretokenCounts::default();
    for path in paths {
        let file_counts = count_file(path.as_ref(), &specials, options)?;
        if counts.is_empty() {
            counts = file_counts;
        } else {
            for (token, n) in file_counts {
                *counts.entry(token).or_default() += n;
            }
        }
    }
    Ok(train_from_counts(
        counts,
        vocab_size,
        &specials,
        options.progress,
    ))
}

/// The pre-token counts of the text file at `path`, memory-mapped and counted in
/// parallel; its pages are released as they are counted.
fn count_file(path: &Path, specials: &[String], options: TrainOptions) -> Result<PretokenCounts> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return Err(invalid!(
            "{}: is a directory, not a text file",
            path.display()
        ));
    }
    if meta.len() == 0 {
        return Ok(PretokenCounts::default());
    }
    // SAFETY: the map is read-only; the file must not be truncated while we train,
    // as with any memory-mapped input.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let _ = mmap.advise(memmap2::Advice::Sequential);
    let release = |start: usize, len: usize| {
        // SAFETY: the map is a read-only file mapping; dropped pages are read again
        // from the file if touched, and no key borrows from the map.
        let _ =
            unsafe { mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
    };
    count_pretokens_with(&mmap, specials, CHUNK_BYTES, options, &release)
        .map_err(|e| invalid!("{}: {e}", path.display()))
}

/// `special_tokens` without repeats (first occurrence kept); an empty one is an error.
fn dedup_specials(special_tokens: &[String]) -> Result<Vec<String>> {
    let mut specials: Vec<String> = Vec::new();
    for s in special_tokens {
        if s.is_empty() {
            return Err(invalid!("a special token must not be empty"));
        }
        if !specials.contains(s) {
            specials.push(s.clone());
        }
    }
    Ok(specials)
}

fn check_vocab_size(vocab_size: usize, specials: &[String]) -> Result<()> {
    let min = 256 + specials.len();
    if vocab_size < min {
        return Err(invalid!(
            "vocab size {vocab_size} is below 256 bytes + {} special tokens = {min}",
            specials.len()
        ));
    }
    Ok(())
}

/// Whether the whole-text scan has a boundary at `q` (`0 < q < bytes.len()`): text up to
/// `q` and text from `q` split at specials and pre-tokenize exactly as the whole does.
///
/// - No occurrence of a special straddles `q` (then the leftmost-longest special
///   matches before and after `q` are those of the whole text), and
/// - a special starts at `q`, or the valid UTF-8 chars around `q` are a
///   [`Pattern::boundary`] (never for a custom regex: its text is cut only at specials).
///   UTF-8 resynchronizes at a lead byte, so lossy decoding keeps both chars as they are.
fn is_cut(bytes: &[u8], q: usize, specials: &[&[u8]], pattern: &Pattern) -> bool {
    let straddled = specials
        .iter()
        .any(|s| (1..s.len().min(q + 1)).any(|k| bytes[q - k..].starts_with(s)));
    if straddled {
        return false;
    }
    if specials.iter().any(|s| bytes[q..].starts_with(s)) {
        return true;
    }
    // The one valid char of 1 to 4 bytes in `bytes[range]`, if any.
    let char_in = |from: usize, to: usize| {
        let s = std::str::from_utf8(bytes.get(from..to)?).ok()?;
        let mut chars = s.chars();
        let c = chars.next()?;
        chars.next().is_none().then_some(c)
    };
    let before = (1..=q.min(4)).find_map(|n| char_in(q - n, q));
    let after = (1..=4).find_map(|n| char_in(q, q + n));
    matches!((before, after), (Some(l), Some(r)) if pattern.boundary(l, r))
}

/// Chunk ranges of about `chunk_bytes` each, cut where [`is_cut`] holds; each byte
/// range looked at for a cut is handed to `release`.
fn chunks(
    bytes: &[u8],
    specials: &[&[u8]],
    pattern: &Pattern,
    chunk_bytes: usize,
    release: &dyn Fn(usize, usize),
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < bytes.len() {
        let target = start.saturating_add(chunk_bytes.max(1)).min(bytes.len());
        let mut end = target;
        while end < bytes.len() && !is_cut(bytes, end, specials, pattern) {
            end += 1;
        }
        release(target, end);
        out.push((start, end));
        start = end;
    }
    out
}

/// Counts the pre-tokens of `bytes` (UTF-8 text; specials split it and are not counted),
/// counting chunks of about `chunk_bytes` in parallel. Invalid UTF-8 is an error naming
/// its byte offset, unless `options.lossy_utf8`.
pub fn count_pretokens(
    bytes: &[u8],
    special_tokens: &[String],
    chunk_bytes: usize,
    options: TrainOptions,
) -> Result<PretokenCounts> {
    count_pretokens_with(bytes, special_tokens, chunk_bytes, options, &|_, _| {})
}

/// [`count_pretokens`] reporting progress and handing each counted byte range to `release`.
fn count_pretokens_with(
    bytes: &[u8],
    special_tokens: &[String],
    chunk_bytes: usize,
    options: TrainOptions,
    release: &(dyn Fn(usize, usize) + Sync),
) -> Result<PretokenCounts> {
    let splitter = SpecialSplitter::new(special_tokens);
    let special_bytes: Vec<&[u8]> = special_tokens.iter().map(|s| s.as_bytes()).collect();
    // The kernel maps file pages around each page fault ("fault-around"), so a range
    // of the file is released with a margin on both sides.
    let release_around = |from: usize, to: usize| {
        let (from, to) = (
            from.saturating_sub(1 << 18),
            (to + (1 << 18)).min(bytes.len()),
        );
        release(from, to - from);
    };
    let ranges = chunks(
        bytes,
        &special_bytes,
        options.pattern,
        chunk_bytes,
        &release_around,
    );
    let done = AtomicU64::new(0);
    // The smallest byte offset of invalid UTF-8 found so far; later chunks are skipped.
    let first_invalid = AtomicUsize::new(usize::MAX);
    // One counter per busy thread: a task takes an idle counter (or starts one) and
    // gives it back, so there are at most as many counters as threads.
    let idle: Mutex<Vec<Counter>> = Mutex::new(Vec::new());
    ranges.par_iter().for_each(|&(start, end)| {
        if start > first_invalid.load(Ordering::Relaxed) {
            return;
        }
        let chunk = &bytes[start..end];
        let text = match std::str::from_utf8(chunk) {
            Ok(text) => Cow::Borrowed(text),
            Err(_) if options.lossy_utf8 => String::from_utf8_lossy(chunk),
            Err(e) => {
                first_invalid.fetch_min(start + e.valid_up_to(), Ordering::Relaxed);
                return;
            }
        };
        let mut counter = idle.lock().expect("no panics").pop().unwrap_or_default();
        counter.add_text(&text, &splitter, options.pattern);
        idle.lock().expect("no panics").push(counter);
        release_around(start, end);
        let done = done.fetch_add((end - start) as u64, Ordering::Relaxed) + (end - start) as u64;
        if let Some(report) = options.progress {
            report(Progress::Pretokenized {
                done,
                total: bytes.len() as u64,
            });
        }
    });
    let counters = idle.into_inner().expect("no panics");
    let counts = counters
        .into_iter()
        .reduce(Counter::merge)
        .unwrap_or_default();
    match first_invalid.into_inner() {
        usize::MAX => Ok(counts.into_counts()),
        at => Err(invalid!("invalid UTF-8 at byte offset {at}")),
    }
}

/// Counts the pre-tokens of texts that arrive in batches (Python's `train_from_iterator`):
/// each text is a document of its own (no pre-token spans two), and memory holds the
/// counts, not the texts. Long texts are cut where [`Pattern::boundary`] holds (or at
/// special tokens) and counted in parallel like a file.
pub struct PretokenCounter<'p> {
    pattern: &'p Pattern,
    specials: Vec<String>,
    splitter: SpecialSplitter,
    /// One counter per busy thread, kept between batches.
    idle: Mutex<Vec<Counter>>,
}

impl<'p> PretokenCounter<'p> {
    pub fn new(special_tokens: &[String], pattern: &'p Pattern) -> Result<Self> {
        let specials = dedup_specials(special_tokens)?;
        Ok(PretokenCounter {
            pattern,
            splitter: SpecialSplitter::new(&specials),
            specials,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Counts the pre-tokens of each of `texts`, on the current rayon pool.
    pub fn add<S: AsRef<str> + Sync>(&self, texts: &[S]) {
        let special_bytes: Vec<&[u8]> = self.specials.iter().map(|s| s.as_bytes()).collect();
        let pieces: Vec<&str> = texts
            .iter()
            .flat_map(|t| {
                let t = t.as_ref();
                chunks(
                    t.as_bytes(),
                    &special_bytes,
                    self.pattern,
                    CHUNK_BYTES,
                    &|_, _| {},
                )
                .into_iter()
                .map(move |(a, b)| &t[a..b])
            })
            .collect();
        pieces.par_iter().for_each(|piece| {
            let mut counter = self
                .idle
                .lock()
                .expect("no panics")
                .pop()
                .unwrap_or_default();
            counter.add_text(piece, &self.splitter, self.pattern);
            self.idle.lock().expect("no panics").push(counter);
        });
    }

    /// The counts so far, and the special tokens (without repeats) to train with.
    pub fn finish(self) -> (PretokenCounts, Vec<String>) {
        let counters = self.idle.into_inner().expect("no panics");
        let counts = counters
            .into_iter()
            .reduce(Counter::merge)
            .unwrap_or_default();
        (counts.into_counts(), self.specials)
    }
}

/// Trains on the texts of `texts` (each a document of its own), reading batches of
/// about `batch_bytes` at a time: memory follows the unique pre-tokens, not the text.
pub fn train_from_texts<I, S>(
    texts: I,
    vocab_size: usize,
    special_tokens: &[String],
    options: TrainOptions,
    batch_bytes: usize,
) -> Result<(Vocab, Merges)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str> + Sync,
{
    let counter = PretokenCounter::new(special_tokens, options.pattern)?;
    check_vocab_size(vocab_size, &counter.specials)?;
    let (mut batch, mut bytes, mut done) = (Vec::new(), 0, 0u64);
    for text in texts {
        bytes += text.as_ref().len();
        batch.push(text);
        if bytes >= batch_bytes {
            counter.add(&batch);
            done += bytes as u64;
            if let Some(report) = options.progress {
                report(Progress::Pretokenized { done, total: 0 });
            }
            (bytes, batch) = (0, Vec::new());
        }
    }
    counter.add(&batch);
    let (counts, specials) = counter.finish();
    Ok(train_from_counts(
        counts,
        vocab_size,
        &specials,
        options.progress,
    ))
}

/// Pre-token counts while counting: tokens of up to 15 bytes are packed into a `u128`
/// (bytes, then the length in the top byte), which hashes and compares in a few
/// instructions; longer ones are keyed by their bytes.
#[derive(Default)]
struct Counter {
    short: FxHashMap<u128, u64>,
    long: PretokenCounts,
}

impl Counter {
    /// Counts the pre-tokens of `text`, split at special tokens (not counted).
    fn add_text(&mut self, text: &str, splitter: &SpecialSplitter, pattern: &Pattern) {
        for piece in splitter.split(text) {
            if let Piece::Text(t) = piece {
                pattern.visit(t, self);
            }
        }
    }

    #[inline]
    fn add(&mut self, token: &[u8]) {
        if token.len() < 16 {
            let mut packed = [0u8; 16];
            packed[..token.len()].copy_from_slice(token);
            packed[15] = token.len() as u8;
            *self.short.entry(u128::from_le_bytes(packed)).or_default() += 1;
        } else if let Some(count) = self.long.get_mut(token) {
            *count += 1;
        } else {
            self.long.insert(token.to_vec(), 1);
        }
    }

    /// The sum of two counters, adding the smaller into the larger.
    fn merge(self, other: Counter) -> Counter {
        let (mut big, small) = if self.short.len() >= other.short.len() {
            (self, other)
        } else {
            (other, self)
        };
        for (packed, n) in small.short {
            *big.short.entry(packed).or_default() += n;
        }
        for (token, n) in small.long {
            *big.long.entry(token).or_default() += n;
        }
        big
    }

    fn into_counts(self) -> PretokenCounts {
        let mut counts = self.long;
        counts.reserve(self.short.len());
        for (packed, n) in self.short {
            let bytes = packed.to_le_bytes();
            counts.insert(bytes[..bytes[15] as usize].to_vec(), n);
        }
        counts
    }
}

impl<'a> Visitor<'a> for Counter {
    #[inline(always)]
    fn visit(&mut self, pretoken: &'a str) -> bool {
        self.add(pretoken.as_bytes());
        true
    }
}

/// A pair of token ids `(left, right)` packed as `left << 32 | right`.
type Pair = u64;

fn pair(left: u32, right: u32) -> Pair {
    (left as u64) << 32 | right as u64
}

fn unpair(p: Pair) -> (u32, u32) {
    ((p >> 32) as u32, p as u32)
}

/// A unique pre-token during merging: its tokens are `symbols[start..start + len]`.
#[derive(Clone, Copy)]
struct Word {
    start: usize,
    len: usize,
    weight: i64,
}

/// The count of a pair and the words that may hold it (a word may be listed twice or
/// have lost the pair since; the merge then finds nothing to replace in it).
#[derive(Default)]
struct PairInfo {
    count: i64,
    words: Vec<u32>,
}

/// A max-heap of `(count, pair)` ordered by count, then by the pair's byte strings
/// `(vocab[left], vocab[right])`, greater first. Entries may be stale (lazy deletion):
/// the merge loop checks each popped entry against the current count.
struct Heap {
    entries: Vec<(i64, Pair)>,
}

impl Heap {
    fn above(vocab: &Vocab, a: (i64, Pair), b: (i64, Pair)) -> bool {
        if a.0 != b.0 {
            return a.0 > b.0;
        }
        let ((al, ar), (bl, br)) = (unpair(a.1), unpair(b.1));
        (&vocab[al as usize], &vocab[ar as usize]) > (&vocab[bl as usize], &vocab[br as usize])
    }

    fn push(&mut self, vocab: &Vocab, entry: (i64, Pair)) {
        let e = &mut self.entries;
        e.push(entry);
        let mut i = e.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if !Self::above(vocab, e[i], e[parent]) {
                break;
            }
            e.swap(i, parent);
            i = parent;
        }
    }

    fn pop(&mut self, vocab: &Vocab) -> Option<(i64, Pair)> {
        let e = &mut self.entries;
        if e.is_empty() {
            return None;
        }
        let top = e.swap_remove(0);
        let n = e.len();
        let mut i = 0;
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut best = i;
            if l < n && Self::above(vocab, e[l], e[best]) {
                best = l;
            }
            if r < n && Self::above(vocab, e[r], e[best]) {
                best = r;
            }
            if best == i {
                break;
            }
            e.swap(i, best);
            i = best;
        }
        Some(top)
    }
}

/// The merge loop on pre-token counts: `specials` must be de-duplicated and
/// `vocab_size >= 256 + specials.len()`.
///
/// Ties between pairs of equal count go to the greater `(left, right)` byte-string pair;
/// each word replaces a merged pair left to right without overlaps.
pub fn train_from_counts(
    counts: PretokenCounts,
    vocab_size: usize,
    specials: &[String],
    progress: Option<&(dyn Fn(Progress) + Sync)>,
) -> (Vocab, Merges) {
    let mut vocab: Vocab = (0..=255u8).map(|b| vec![b]).collect();
    vocab.extend(specials.iter().map(|s| s.as_bytes().to_vec()));
    let total_merges = vocab_size.saturating_sub(vocab.len());
    let mut merges = Merges::new();

    // Words of two or more bytes as token ids, back to back in `symbols`; single bytes
    // never hold a pair.
    let mut symbols: Vec<u32> = Vec::new();
    let mut words: Vec<Word> = Vec::new();
    for (token, n) in counts.into_iter().filter(|(token, _)| token.len() >= 2) {
        words.push(Word {
            start: symbols.len(),
            len: token.len(),
            weight: n as i64,
        });
        symbols.extend(token.iter().map(|&b| b as u32));
    }

    let mut pairs: FxHashMap<Pair, PairInfo> = FxHashMap::default();
    for (w, word) in words.iter().enumerate() {
        for ids in symbols[word.start..word.start + word.len].windows(2) {
            let info = pairs.entry(pair(ids[0], ids[1])).or_default();
            info.count += word.weight;
            if info.words.last() != Some(&(w as u32)) {
                info.words.push(w as u32);
            }
        }
    }
    let mut heap = Heap {
        entries: Vec::with_capacity(pairs.len()),
    };
    for (&p, info) in &pairs {
        heap.push(&vocab, (info.count, p));
    }

    // Words spell a token by its bytes, as in CS336's reference (words are tuples of
    // bytes): should two merges ever build the same bytes, words use the first's id.
    let mut merged_ids: FxHashMap<Vec<u8>, u32> = FxHashMap::default();
    // Pairs holding the new token, whose counts only grew during this merge.
    let mut grown: Vec<Pair> = Vec::new();
    while merges.len() < total_merges {
        let Some((count, top)) = heap.pop(&vocab) else {
            break;
        };
        let current = pairs.get(&top).map_or(0, |info| info.count);
        if current != count {
            // Counts only fall after a pair's entry was pushed: push it again as it is now.
            if current > 0 {
                heap.push(&vocab, (current, top));
            }
            continue;
        }
        let (a, b) = unpair(top);
        let (left, right) = (vocab[a as usize].clone(), vocab[b as usize].clone());
        let merged = [left.as_slice(), right.as_slice()].concat();
        let z = *merged_ids
            .entry(merged.clone())
            .or_insert(vocab.len() as u32);
        vocab.push(merged);
        merges.push((left, right));

        let holders = pairs.remove(&top).expect("popped pair is counted").words;
        for w in holders {
            let Word { start, len, weight } = words[w as usize];
            let mut change = |p: Pair, delta: i64| {
                if p == top {
                    return;
                }
                if delta > 0 {
                    let info = pairs.entry(p).or_default();
                    info.count += delta;
                    if info.words.last() != Some(&w) {
                        info.words.push(w);
                    }
                    grown.push(p);
                } else if let Some(info) = pairs.get_mut(&p) {
                    info.count += delta;
                    debug_assert!(info.count >= 0);
                    if info.count == 0 {
                        pairs.remove(&p);
                    }
                }
            };
            // In place, left to right: `out` trails `i`; the left neighbour is the
            // already rewritten token, so pairs of two replacements come out right.
            let word = &mut symbols[start..start + len];
            let n = len;
            let (mut out, mut i) = (0, 0);
            while i < n {
                if i + 1 < n && word[i] == a && word[i + 1] == b {
                    if out > 0 {
                        let l = word[out - 1];
                        change(pair(l, a), -weight);
                        change(pair(l, z), weight);
                    }
                    if i + 2 < n {
                        let r = word[i + 2];
                        change(pair(b, r), -weight);
                        change(pair(z, r), weight);
                    }
                    word[out] = z;
                    i += 2;
                } else {
                    word[out] = word[i];
                    i += 1;
                }
                out += 1;
            }
            words[w as usize].len = out;
        }
        grown.sort_unstable();
        grown.dedup();
        for p in grown.drain(..) {
            if let Some(info) = pairs.get(&p) {
                heap.push(&vocab, (info.count, p));
            }
        }
        if let Some(report) = progress {
            report(Progress::Merged {
                done: merges.len(),
                total: total_merges,
            });
        }
    }
    (vocab, merges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::END_OF_TEXT;

    #[test]
    fn real_text_has_cuts_everywhere() {
        let text = "Hello, world. Ça va? 中文，很好。 42x\n".repeat(100);
        let gpt2 = Pattern::Gpt2;
        let ranges = chunks(
            text.as_bytes(),
            &[END_OF_TEXT.as_bytes()],
            &gpt2,
            16,
            &|_, _| {},
        );
        assert!(ranges.len() > text.len() / 40, "{} chunks", ranges.len());
        assert!(ranges.windows(2).all(|r| r[0].1 == r[1].0));
        assert_eq!((ranges[0].0, ranges.last().unwrap().1), (0, text.len()));
        // Inside a special token is never a cut; its start is.
        let text = "abc<|endoftext|>def";
        let cuts: Vec<usize> = (1..text.len())
            .filter(|&q| is_cut(text.as_bytes(), q, &[END_OF_TEXT.as_bytes()], &gpt2))
            .collect();
        assert_eq!(cuts, [3]);
    }
}
