//! Character classes of the split patterns, with an ASCII fast path.
//!
//! [`Class`] is what GPT-2's and cl100k's patterns tell apart (`\p{L}`, `\p{N}`, `\s`,
//! anything else); [`Kind`] adds what o200k's pattern needs: the letter's case
//! (`\p{Lu}\p{Lt}` / `\p{Ll}` / `\p{Lm}\p{Lo}`) and marks (`\p{M}`).

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// The class of a character for the pattern: which alternative a run of it belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Class {
    Letter,
    Number,
    Space,
    Other,
}

const fn ascii_classes() -> [Class; 128] {
    let mut t = [Class::Other; 128];
    let mut b = 0;
    while b < 128 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphabetic() {
            Class::Letter
        } else if c.is_ascii_digit() {
            Class::Number
        } else if matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
            Class::Space
        } else {
            Class::Other
        };
        b += 1;
    }
    t
}

static ASCII_CLASS: [Class; 128] = ascii_classes();

/// The pattern's class of `c`.
#[inline]
pub fn class_of(c: char) -> Class {
    if c.is_ascii() {
        return ASCII_CLASS[c as usize];
    }
    kind_of(c).class()
}

/// The character starting at byte `i` of `s` (which must be a char boundary) and its class.
#[inline(always)]
pub(super) fn char_at(s: &str, i: usize) -> Option<(Class, usize)> {
    let b = *s.as_bytes().get(i)?;
    if b < 0x80 {
        return Some((ASCII_CLASS[b as usize], 1));
    }
    let c = s[i..].chars().next()?;
    Some((class_of(c), c.len_utf8()))
}

/// End (exclusive) of the run of characters of class `class` starting at byte `i`.
#[inline(always)]
pub(super) fn run_end(s: &str, mut i: usize, class: Class) -> usize {
    let bytes = s.as_bytes();
    while i < bytes.len() {
        let b = bytes[i];
        if b < 0x80 {
            if ASCII_CLASS[b as usize] != class {
                break;
            }
            i += 1;
        } else {
            match char_at(s, i) {
                Some((c, n)) if c == class => i += n,
                _ => break,
            }
        }
    }
    i
}

/// The kind of a character for o200k's pattern.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// `\p{Lu}`, `\p{Lt}`.
    Upper,
    /// `\p{Ll}`.
    Lower,
    /// `\p{Lm}`, `\p{Lo}`: letters without case.
    Caseless,
    /// `\p{M}`: not a letter, yet in both of o200k's letter classes.
    Mark,
    Number,
    Space,
    Other,
}

impl Kind {
    /// In `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`.
    #[inline]
    pub fn upper(self) -> bool {
        matches!(self, Kind::Upper | Kind::Caseless | Kind::Mark)
    }

    /// In `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`.
    #[inline]
    pub fn lower(self) -> bool {
        matches!(self, Kind::Lower | Kind::Caseless | Kind::Mark)
    }

    /// In `\p{L}`.
    #[inline]
    pub fn letter(self) -> bool {
        matches!(self, Kind::Upper | Kind::Lower | Kind::Caseless)
    }

    /// The [`Class`] of a character of this kind (a mark is none of GPT-2's and
    /// cl100k's letters, numbers or spaces).
    #[inline]
    pub fn class(self) -> Class {
        match self {
            Kind::Upper | Kind::Lower | Kind::Caseless => Class::Letter,
            Kind::Number => Class::Number,
            Kind::Space => Class::Space,
            Kind::Mark | Kind::Other => Class::Other,
        }
    }
}

const fn ascii_kinds() -> [Kind; 128] {
    let mut t = [Kind::Other; 128];
    let mut b = 0;
    while b < 128 {
        t[b] = match ASCII_CLASS[b] {
            Class::Letter if (b as u8).is_ascii_uppercase() => Kind::Upper,
            Class::Letter => Kind::Lower,
            Class::Number => Kind::Number,
            Class::Space => Kind::Space,
            Class::Other => Kind::Other,
        };
        b += 1;
    }
    t
}

static ASCII_KIND: [Kind; 128] = ascii_kinds();

/// o200k's kind of `c`.
#[inline]
pub fn kind_of(c: char) -> Kind {
    if c.is_ascii() {
        return ASCII_KIND[c as usize];
    }
    if c.is_whitespace() {
        return Kind::Space;
    }
    match get_general_category(c) {
        G::UppercaseLetter | G::TitlecaseLetter => Kind::Upper,
        G::LowercaseLetter => Kind::Lower,
        G::ModifierLetter | G::OtherLetter => Kind::Caseless,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => Kind::Mark,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => Kind::Number,
        _ => Kind::Other,
    }
}

/// The character starting at byte `i` of `s` (a char boundary), its kind and length.
#[inline(always)]
pub(super) fn kind_at(s: &str, i: usize) -> Option<(char, Kind, usize)> {
    let b = *s.as_bytes().get(i)?;
    if b < 0x80 {
        return Some((b as char, ASCII_KIND[b as usize], 1));
    }
    let c = s[i..].chars().next()?;
    Some((c, kind_of(c), c.len_utf8()))
}

/// Whether `c` equals the ASCII lowercase letter `lower` ignoring case, as the
/// `(?i)` of `regex` and `fancy-regex` compares (simple case folding: `ſ` is an `s`).
#[inline]
pub(super) fn folds_to(c: char, lower: u8) -> bool {
    c.to_ascii_lowercase() == lower as char || (lower == b's' && c == 'ſ')
}

/// End of the contraction `'s`, `'t`, `'re`, `'ve`, `'m`, `'ll` or `'d` (any case) at
/// byte `i` of `s`, if there is one; `short` lists the one-letter ones to accept.
#[inline]
pub(super) fn contraction_end(s: &str, i: usize, short: &[u8]) -> Option<usize> {
    if s.as_bytes().get(i) != Some(&b'\'') {
        return None;
    }
    let mut chars = s[i + 1..].chars();
    let first = chars.next()?;
    if short.iter().any(|&l| folds_to(first, l)) {
        return Some(i + 1 + first.len_utf8());
    }
    let second = chars.next()?;
    [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')]
        .iter()
        .any(|&(a, b)| folds_to(first, a) && folds_to(second, b))
        .then(|| i + 1 + first.len_utf8() + second.len_utf8())
}
