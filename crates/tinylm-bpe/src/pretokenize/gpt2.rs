//! GPT-2's pattern (r50k, p50k), as a hand-written scanner:
//!
//! ```text
//! '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```

use super::unicode::{char_at, run_end, Class};

/// End (exclusive) of the pattern's match that starts at byte `i < s.len()`.
#[inline(always)]
pub(super) fn match_end(s: &str, i: usize) -> usize {
    let bytes = s.as_bytes();
    let first = bytes[i];
    // '(?:[sdmt]|ll|ve|re)
    if first == b'\'' {
        let rest = &bytes[i + 1..];
        if matches!(rest.first(), Some(b's' | b'd' | b'm' | b't')) {
            return i + 2;
        }
        if rest.starts_with(b"ll") || rest.starts_with(b"ve") || rest.starts_with(b"re") {
            return i + 3;
        }
    }
    let (class, n) = char_at(s, i).expect("i is inside s");
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space before a run.
    if first == b' ' {
        if let Some((next, _)) = char_at(s, i + 1) {
            if next != Class::Space {
                return run_end(s, i + 1, next);
            }
        }
    }
    if class != Class::Space {
        return run_end(s, i + n, class);
    }
    // `\s+(?!\S)|\s+`: a whitespace run gives back its last character when a
    // non-space follows it (that character then starts the next pre-token).
    let mut last_start = i;
    let mut j = i + n;
    while let Some((Class::Space, m)) = char_at(s, j) {
        last_start = j;
        j += m;
    }
    if j < s.len() && last_start > i {
        last_start
    } else {
        j
    }
}
