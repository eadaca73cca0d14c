//! What every fuzz target shares: a global allocator that counts the bytes live
//! and their peak, so that a target can assert that reading an input allocated no
//! more than a stated bound of its size ([`within`]); a scratch directory where
//! inputs become the files the readers open ([`write`], [`fresh_dir`]); the split of
//! one input into the several files a reader takes ([`parts`]); and the checks
//! every refusal must pass ([`refused`]).
//!
//! A panic anywhere is a finding: libFuzzer saves the input and stops.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The system allocator, counting the bytes live ([`LIVE`]) and their peak ([`PEAK`]).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call goes to `System` unchanged; only counters are updated beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        shrank(layout.size());
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, new_size);
        if !q.is_null() {
            match new_size >= layout.size() {
                true => grew(new_size - layout.size()),
                false => shrank(layout.size() - new_size),
            }
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// How much a reader may allocate at its peak for an input of `n` bytes:
/// `per_byte · n + fixed` bytes beyond what was live when it began.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub per_byte: usize,
    pub fixed: usize,
}

impl Bound {
    pub fn of(self, n: usize) -> usize {
        self.per_byte.saturating_mul(n).saturating_add(self.fixed)
    }
}

/// Runs `read` (the reading of an input of `input_len` bytes) and panics — a
/// finding — when the bytes it allocated at its peak exceed `bound`.
pub fn within<T>(what: &str, input_len: usize, bound: Bound, read: impl FnOnce() -> T) -> T {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = read();
    let used = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let limit = bound.of(input_len);
    assert!(
        used <= limit,
        "{what} allocated {used} bytes at its peak for an input of {input_len} bytes, above its bound of {limit} ({} per byte + {})",
        bound.per_byte,
        bound.fixed
    );
    out
}

/// This process's scratch directory, in `$TINYLM_FUZZ_SCRATCH` (which
/// `.ci/fuzz.sh` creates in `/dev/shm` and removes: a fuzzing process never ends
/// in a way that removes its own), else in `/dev/shm` when there is one (the
/// writers' `fsync` then costs nothing), else in the temporary directory.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let parent =
            std::env::var_os("TINYLM_FUZZ_SCRATCH").map_or("/dev/shm".into(), PathBuf::from);
        let builder = tempfile::Builder::new()
            .prefix("tinylm-fuzz-")
            .tempdir_in(parent);
        builder
            .or_else(|_| tempfile::tempdir())
            .expect("a scratch directory")
    })
    .path()
}

/// Writes `bytes` to the file `name` of the scratch directory; returns its path.
pub fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch().join(name);
    std::fs::write(&path, bytes).expect("the scratch directory is writable");
    path
}

/// The directory `name` of the scratch directory, emptied.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the scratch directory is writable");
    dir
}

/// What separates the files of one input that holds several ([`parts`]). The
/// seeds are written with it (`fuzz/seeds.py`).
pub const SEPARATOR: &[u8] = b"\n#~~~#\n";

/// `data` cut at the first `N - 1` [`SEPARATOR`]s: the files of one input, the last
/// one the rest (missing ones empty).
pub fn parts<const N: usize>(data: &[u8]) -> [&[u8]; N] {
    let mut out = [&data[..0]; N];
    let mut rest = data;
    for part in out.iter_mut().take(N - 1) {
        match rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(at) => {
                *part = &rest[..at];
                rest = &rest[at + SEPARATOR.len()..];
            }
            None => {
                *part = rest;
                rest = &rest[rest.len()..];
            }
        }
    }
    out[N - 1] = rest;
    out
}

/// Checks a refusal: its message names `file` (by its file name), so that a user
/// knows which file is at fault.
pub fn refused(err: &impl Display, file: &Path) {
    refused_naming(err, &[file]);
}

/// Checks a refusal of several files: its message names one of them.
pub fn refused_naming(err: &impl Display, files: &[&Path]) {
    let message = err.to_string();
    let names: Vec<String> = (files.iter())
        .map(|f| {
            f.file_name()
                .expect("a file name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(
        names.iter().any(|name| message.contains(name)),
        "the error names none of {names:?}: {message}"
    );
}

/// Whether two `f32` slices hold the same values bit for bit (NaNs included).
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Reads a tokenizer with `read` from `files` (the input's `input_len` bytes),
/// within `bound`, and checks it ([`encodes_and_decodes`], inside the bound too);
/// a refusal must name one of the files ([`refused_naming`]) and gives `None`.
pub fn read_tokenizer(
    what: &str,
    input_len: usize,
    bound: Bound,
    files: &[&Path],
    read: impl FnOnce() -> tinylm_bpe::Result<tinylm_bpe::files::Bpe>,
) -> Option<tinylm_bpe::files::Bpe> {
    let bpe = within(what, input_len, bound, || {
        let bpe = read();
        if let Ok(bpe) = &bpe {
            encodes_and_decodes(bpe);
        }
        bpe
    });
    bpe.map_err(|e| refused_naming(&e, files)).ok()
}

/// A tokenizer of the 256 byte tokens and no merges.
pub fn bytes_tokenizer() -> &'static tinylm_bpe::encode::Tokenizer {
    static T: OnceLock<tinylm_bpe::encode::Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let bytes = (0..=255u8).map(|b| vec![b]).collect();
        tinylm_bpe::encode::Tokenizer::new(bytes, &Vec::new(), &[]).expect("256 byte tokens")
    })
}

/// Text a tokenizer that was read must encode and decode back (with its special
/// tokens appended): ASCII, accents, CJK, emoji, digits, contractions, spaces.
pub const SAMPLE: &str =
    "Hello, world! It's 2024 and we're   testing...\n\tÉcole café 数字 👋🏽 x² don't\r\n  ";

/// A tokenizer that was read builds its encoder or refuses with an error; built,
/// the encoder gives back [`SAMPLE`] and the special tokens (where the pattern keeps
/// every byte: any named one, or a custom one that keeps the gaps between matches).
pub fn encodes_and_decodes(bpe: &tinylm_bpe::files::Bpe) {
    let tokenizer = match bpe.tokenizer() {
        Ok(t) => t,
        Err(e) => return assert!(!e.to_string().is_empty()),
    };
    if !(bpe.pattern.is_named() || bpe.pattern.keeps_gaps()) {
        return;
    }
    let mut text = SAMPLE.to_string();
    for special in bpe.special_tokens() {
        text.push_str(&special);
        text.push_str(" x");
    }
    let ids = tokenizer.encode(&text);
    let back = tokenizer.decode_bytes(&ids).expect("encoded ids decode");
    assert!(
        back == text.as_bytes(),
        "{text:?} decodes as {:?}",
        String::from_utf8_lossy(&back)
    );
}
