//! o200k's pattern (tiktoken's `o200k_base`, GPT-4o), as a hand-written scanner:
//!
//! ```text
//! [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! Call `U` the first class (upper, caseless, mark) and `W` the second (lower,
//! caseless, mark). The letter alternatives backtrack, and the scanner follows the
//! order in which the regex tries them: alternative 1 with the optional char before,
//! then without it, then alternative 2 the same way. Alternative 1 from `j`: `U*` takes
//! the run of `U` chars `[j, k)`; if the char at `k` is in `W` (then it is lower case),
//! `W+` takes the run of `W` from `k`; otherwise `U*` gives back chars until a `W` char
//! starts `W+`: the last `W` char of the run (caseless or mark) is then the whole of
//! `W+`. Alternative 2 from `j`: a non-empty `U` run, then the `W` run after it.

use super::unicode::{contraction_end, kind_at, Kind};

/// End of the run of chars whose kind passes `keep`, from byte `i`.
#[inline]
fn run_end(s: &str, mut i: usize, keep: impl Fn(Kind) -> bool) -> usize {
    while let Some((_, kind, n)) = kind_at(s, i) {
        if !keep(kind) {
            break;
        }
        i += n;
    }
    i
}

/// The match end with the contraction, if one follows `end`.
#[inline]
fn with_contraction(s: &str, end: usize) -> usize {
    contraction_end(s, end, b"stmd").unwrap_or(end)
}

/// Alternative 1 from `j` without its optional first char: `U*W+` and a contraction.
fn upper_then_lower(s: &str, j: usize) -> Option<usize> {
    let mut last_lower = None;
    let mut k = j;
    while let Some((_, kind, n)) = kind_at(s, k) {
        if !kind.upper() {
            break;
        }
        if kind.lower() {
            last_lower = Some(k + n);
        }
        k += n;
    }
    let end = match kind_at(s, k) {
        Some((_, kind, _)) if kind.lower() => run_end(s, k, Kind::lower),
        _ => last_lower?,
    };
    Some(with_contraction(s, end))
}

/// Alternative 2 from `j` without its optional first char: `U+W*` and a contraction.
fn upper_run_then_lower(s: &str, j: usize) -> Option<usize> {
    let k = run_end(s, j, Kind::upper);
    (k > j).then(|| with_contraction(s, run_end(s, k, Kind::lower)))
}

/// End (exclusive) of the pattern's match that starts at byte `i < s.len()`.
#[inline(always)]
pub(super) fn match_end(s: &str, i: usize) -> usize {
    let bytes = s.as_bytes();
    let (c, kind, n) = kind_at(s, i).expect("i is inside s");
    // Fast path: a lower-case ASCII letter starts `W+` of alternative 1 at once.
    if kind == Kind::Lower {
        return with_contraction(s, run_end(s, i + n, Kind::lower));
    }
    let prefixed = !matches!(c, '\r' | '\n') && !kind.letter() && kind != Kind::Number;
    for letters in [upper_then_lower, upper_run_then_lower] {
        if prefixed {
            if let Some(end) = letters(s, i + n) {
                return end;
            }
        }
        if let Some(end) = letters(s, i) {
            return end;
        }
    }
    if kind == Kind::Number {
        let mut end = i + n;
        for _ in 0..2 {
            match kind_at(s, end) {
                Some((_, Kind::Number, m)) => end += m,
                _ => break,
            }
        }
        return end;
    }
    let symbol = |k: Kind| matches!(k, Kind::Mark | Kind::Other);
    let symbols_from = if c == ' ' { i + 1 } else { i };
    if let Some((_, k, m)) = kind_at(s, symbols_from) {
        if symbol(k) {
            let mut end = run_end(s, symbols_from + m, symbol);
            while matches!(bytes.get(end), Some(b'\r' | b'\n' | b'/')) {
                end += 1;
            }
            return end;
        }
    }
    // Whitespace from `i`: its run, the start of its last char, its last CR or LF.
    let (mut end, mut last_start, mut newline) = (i, i, None);
    while let Some((_, Kind::Space, m)) = kind_at(s, end) {
        if matches!(bytes[end], b'\r' | b'\n') {
            newline = Some(end);
        }
        last_start = end;
        end += m;
    }
    if let Some(p) = newline {
        p + 1
    } else if end == s.len() || last_start == i {
        end
    } else {
        last_start
    }
}
