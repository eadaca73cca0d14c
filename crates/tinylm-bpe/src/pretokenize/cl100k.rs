//! GPT-4's pattern (tiktoken's `cl100k_base`), as a hand-written scanner:
//!
//! ```text
//! '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s
//! ```
//!
//! The alternatives, in the order the regex tries them from byte `i`:
//! 1. a contraction `'s` … `'re`, any case;
//! 2. a letter run, with at most one char before it that is none of CR, LF, a letter or
//!    a digit (`?+` and `++` are possessive, and no backtracking could help: the char
//!    before is not a letter);
//! 3. one to three digits;
//! 4. an optional space, a run of chars that are neither space, letter nor digit, then
//!    any CR and LF;
//! 5. the rest starts with whitespace: the whole run when it ends the text (`\s++$`),
//!    else up to its last CR or LF (`\s*[\r\n]`), else all but its last char when that is
//!    two or more (`\s+(?!\S)`), else the one char.

use super::unicode::{char_at, contraction_end, run_end, Class};

/// End (exclusive) of the pattern's match that starts at byte `i < s.len()`.
#[inline(always)]
pub(super) fn match_end(s: &str, i: usize) -> usize {
    let bytes = s.as_bytes();
    if let Some(end) = contraction_end(s, i, b"sdmt") {
        return end;
    }
    let (class, n) = char_at(s, i).expect("i is inside s");
    match class {
        Class::Letter => return run_end(s, i + n, Class::Letter),
        Class::Number => {
            let mut end = i + n;
            for _ in 0..2 {
                match char_at(s, end) {
                    Some((Class::Number, m)) => end += m,
                    _ => break,
                }
            }
            return end;
        }
        _ => {}
    }
    let first = bytes[i];
    if first != b'\r' && first != b'\n' {
        if let Some((Class::Letter, m)) = char_at(s, i + n) {
            return run_end(s, i + n + m, Class::Letter);
        }
    }
    let other_from = if first == b' ' { i + 1 } else { i };
    if let Some((Class::Other, m)) = char_at(s, other_from) {
        let mut end = run_end(s, other_from + m, Class::Other);
        while matches!(bytes.get(end), Some(b'\r' | b'\n')) {
            end += 1;
        }
        return end;
    }
    // Whitespace from `i`: its run, the start of its last char, its last CR or LF.
    let (mut end, mut last_start, mut newline) = (i, i, None);
    while let Some((Class::Space, m)) = char_at(s, end) {
        if matches!(bytes[end], b'\r' | b'\n') {
            newline = Some(end);
        }
        last_start = end;
        end += m;
    }
    if end == s.len() {
        end
    } else if let Some(p) = newline {
        p + 1
    } else if last_start > i {
        last_start
    } else {
        end
    }
}
