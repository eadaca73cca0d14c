//! The GPT-2 pre-tokenizer and the splitting of text at special tokens.
//!
//! [`pretokens`] is a hand-written scanner that returns exactly the matches of
//! GPT-2's pattern as Python's `regex` package (and `fancy-regex`) finds them:
//!
//! ```text
//! '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! `\p{L}` is the Unicode general category L (Lu Ll Lt Lm Lo), `\p{N}` is N
//! (Nd Nl No), `\s` is the `White_Space` property. The tests prove the scanner
//! equal to `fancy-regex` on random Unicode and on real text.

use aho_corasick::{AhoCorasick, MatchKind};
use unicode_general_category::{get_general_category, GeneralCategory as G};

/// The GPT-2 pre-tokenization pattern (for documentation and for reference tests).
pub const GPT2_PATTERN: &str =
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

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
    if c.is_whitespace() {
        return Class::Space;
    }
    match get_general_category(c) {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter => Class::Letter,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => Class::Number,
        _ => Class::Other,
    }
}

/// The character starting at byte `i` of `s` (which must be a char boundary) and its class.
#[inline]
fn char_at(s: &str, i: usize) -> Option<(Class, usize)> {
    let b = *s.as_bytes().get(i)?;
    if b < 0x80 {
        return Some((ASCII_CLASS[b as usize], 1));
    }
    let c = s[i..].chars().next()?;
    Some((class_of(c), c.len_utf8()))
}

/// End (exclusive) of the run of characters of class `class` starting at byte `i`.
#[inline]
fn run_end(s: &str, mut i: usize, class: Class) -> usize {
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

/// End (exclusive) of the pattern's match that starts at byte `i < s.len()`.
#[inline]
fn match_end(s: &str, i: usize) -> usize {
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

/// Iterator over the GPT-2 pre-tokens of a text, as sub-slices of it.
pub struct PreTokens<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Iterator for PreTokens<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        if self.pos >= self.text.len() {
            return None;
        }
        let start = self.pos;
        self.pos = match_end(self.text, start);
        Some(&self.text[start..self.pos])
    }
}

/// The GPT-2 pre-tokens of `text` (no special-token handling: see [`SpecialSplitter`]).
pub fn pretokens(text: &str) -> PreTokens<'_> {
    PreTokens { text, pos: 0 }
}

/// A piece of text between special tokens, or one special token (by its index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    Special(usize),
}

/// Splits text at special tokens; where specials overlap, the longest match wins.
#[derive(Clone, Debug)]
pub struct SpecialSplitter {
    specials: Vec<String>,
    matcher: Option<AhoCorasick>,
}

impl SpecialSplitter {
    /// `specials` must be non-empty strings (duplicates are harmless).
    pub fn new(specials: &[String]) -> Self {
        let matcher = (!specials.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(specials)
                .expect("special tokens form a valid automaton")
        });
        SpecialSplitter {
            specials: specials.to_vec(),
            matcher,
        }
    }

    pub fn specials(&self) -> &[String] {
        &self.specials
    }

    /// The pieces of `text` in order, lazily; empty text pieces are left out.
    pub fn split<'a>(&'a self, text: &'a str) -> Pieces<'a> {
        Pieces {
            text,
            last: 0,
            found: self.matcher.as_ref().map(|m| m.find_iter(text)),
            pending: None,
        }
    }

    /// The byte range of the first special token in `text`, if any.
    pub fn find(&self, text: &[u8]) -> Option<(usize, usize)> {
        let m = self.matcher.as_ref()?.find(text)?;
        Some((m.start(), m.end()))
    }
}

/// Iterator of [`SpecialSplitter::split`].
pub struct Pieces<'a> {
    text: &'a str,
    last: usize,
    found: Option<aho_corasick::FindIter<'a, 'a>>,
    pending: Option<Piece<'a>>,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = Piece<'a>;

    fn next(&mut self) -> Option<Piece<'a>> {
        if let Some(p) = self.pending.take() {
            return Some(p);
        }
        if let Some(m) = self.found.as_mut().and_then(Iterator::next) {
            let special = Piece::Special(m.pattern().as_usize());
            let before = &self.text[self.last..m.start()];
            self.last = m.end();
            if before.is_empty() {
                return Some(special);
            }
            self.pending = Some(special);
            return Some(Piece::Text(before));
        }
        self.found = None;
        if self.last < self.text.len() {
            let rest = &self.text[self.last..];
            self.last = self.text.len();
            return Some(Piece::Text(rest));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(text: &str) -> Vec<String> {
        let re = fancy_regex::Regex::new(GPT2_PATTERN).unwrap();
        re.find_iter(text)
            .map(|m| m.unwrap().as_str().to_string())
            .collect()
    }

    fn ours(text: &str) -> Vec<String> {
        pretokens(text).map(str::to_string).collect()
    }

    #[test]
    fn examples_match_regex() {
        for text in [
            "",
            "Hello, world! It's 2024 and we're   testing...",
            "a  b   c\n\n\nd\t \te  ",
            "don't 'll 'LL ''s x's !'s 's",
            "line\r\nnext\r\n\r\n  end",
            "nbsp\u{a0}here\u{a0}\u{a0}x \u{a0}y",
            "e\u{301}clair cafe\u{301} \u{300}x",
            "emoji 👋🏽 family 👨‍👩‍👧 flags 🇫🇷!",
            "数字١٢٣ and ½ ⅷ x²",
            "   ",
            " ",
            "\u{2028}\u{3000}x\u{85}y",
        ] {
            assert_eq!(ours(text), reference(text), "text {text:?}");
        }
    }

    #[test]
    fn every_char_class_matches_regex() {
        let letter = fancy_regex::Regex::new(r"^\p{L}$").unwrap();
        let number = fancy_regex::Regex::new(r"^\p{N}$").unwrap();
        let space = fancy_regex::Regex::new(r"^\s$").unwrap();
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let s = c.to_string();
            let expected = if letter.is_match(&s).unwrap() {
                Class::Letter
            } else if number.is_match(&s).unwrap() {
                Class::Number
            } else if space.is_match(&s).unwrap() {
                Class::Space
            } else {
                Class::Other
            };
            assert_eq!(class_of(c), expected, "char U+{:04X}", c as u32);
        }
    }

    #[test]
    fn real_text_matches_regex() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/data/tinystories_v1_valid_head_794k.txt"
        );
        // The fixture below is always available; the shared corpus adds real text when present.
        let mut text = String::from(include_str!("../tests/fixtures/mixed.txt"));
        if let Ok(extra) = std::fs::read_to_string(path) {
            text.push_str(&extra[..extra.len().min(200_000)]);
        }
        assert_eq!(ours(&text), reference(&text));
    }

    fn piece_char() -> impl Strategy<Value = char> {
        prop_oneof![
            4 => prop::sample::select(vec![' ', ' ', '\n', '\r', '\t', '\'', 's', 't', 'l', 'v', 'e', 'r', 'd', 'm', 'L', '1', '.', '!']),
            2 => prop::char::range('a', 'z'),
            1 => prop::sample::select(vec!['\u{a0}', '\u{2028}', '\u{3000}', '\u{85}', '\u{301}', '½', '١', 'é', '中', '👋', '\u{200d}', '\u{feff}']),
            1 => any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn random_unicode_matches_regex(chars in prop::collection::vec(piece_char(), 0..64)) {
            let text: String = chars.into_iter().collect();
            prop_assert_eq!(ours(&text), reference(&text));
        }
    }

    #[test]
    fn specials_split_longest_first() {
        let s = SpecialSplitter::new(&["<|eot|>".into(), "<|eot|><|eot|>".into()]);
        let pieces: Vec<_> = s.split("a<|eot|><|eot|>b<|eot|>").collect();
        assert_eq!(
            pieces,
            vec![
                Piece::Text("a"),
                Piece::Special(1),
                Piece::Text("b"),
                Piece::Special(0)
            ]
        );
    }
}
