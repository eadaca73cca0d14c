//! Pre-tokenization: the split patterns and the splitting of text at special tokens.
//!
//! A [`Pattern`] cuts text into pre-tokens exactly as tiktoken's regex does (Python's
//! `regex` and `fancy-regex` agree on these patterns). The named ones are hand-written
//! scanners, each a function from a position to the end of the match there:
//!
//! | name | tiktoken encoding | module |
//! | --- | --- | --- |
//! | `gpt2` (the default, CS336's) | `gpt2`, `r50k_base`, `p50k_base` | [`gpt2`] |
//! | `gpt4` | `cl100k_base` | [`cl100k`] |
//! | `o200k` | `o200k_base` | [`o200k`] |
//!
//! Any other regex runs through `fancy-regex` ([`custom`]). The tests prove each
//! scanner equal to its regex on every character and on random and real text.
//!
//! Parallel and streaming work needs to know where the matches of the whole text end
//! whatever comes before or after; [`Pattern::boundary`] says it for the named patterns
//! (a custom regex may look anywhere, so its text is cut only at special tokens).

pub mod cl100k;
pub mod custom;
pub mod gpt2;
pub mod o200k;
mod specials;
pub mod unicode;

pub use custom::Custom;
pub use specials::{Piece, Pieces, SpecialSplitter};
use unicode::{class_of, kind_of, Class, Kind};

use crate::{invalid, Result};

/// GPT-2's pattern as OpenAI published it (CS336 quotes this form).
pub const GPT2_PATTERN: &str =
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// GPT-2's pattern as tiktoken writes it (possessive; the same matches).
pub const GPT2_PATTERN_TIKTOKEN: &str =
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s";
/// The pattern of Hugging Face's `ByteLevel` pre-tokenizer (the same matches as GPT-2's).
pub const GPT2_PATTERN_HF: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// tiktoken's `cl100k_base` pattern (GPT-4).
pub const GPT4_PATTERN: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";
/// tiktoken's `o200k_base` pattern (GPT-4o).
pub const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// How text is cut into pre-tokens before the merges.
#[derive(Clone, Debug, Default)]
pub enum Pattern {
    #[default]
    Gpt2,
    Gpt4,
    O200k,
    Custom(Box<Custom>),
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.regex() == other.regex() && self.keeps_gaps() == other.keeps_gaps()
    }
}

impl Pattern {
    /// The names [`Pattern::parse`] knows.
    pub const NAMES: [&'static str; 3] = ["gpt2", "gpt4", "o200k"];

    /// `gpt2`, `gpt4` (or `cl100k`), `o200k`, or any other text as a regex.
    pub fn parse(spec: &str) -> Result<Pattern> {
        match spec {
            "gpt2" | "r50k" => Ok(Pattern::Gpt2),
            "gpt4" | "cl100k" => Ok(Pattern::Gpt4),
            "o200k" => Ok(Pattern::O200k),
            regex => Pattern::from_regex(regex, false),
        }
    }

    /// The pattern of `regex`: a named one when it is one of their published forms,
    /// else a custom pattern (with `keep_gaps`, text between matches is kept, as
    /// Hugging Face's `Split` with `Isolated` does; tiktoken drops it).
    pub fn from_regex(regex: &str, keep_gaps: bool) -> Result<Pattern> {
        Ok(match regex {
            GPT2_PATTERN | GPT2_PATTERN_TIKTOKEN | GPT2_PATTERN_HF => Pattern::Gpt2,
            GPT4_PATTERN => Pattern::Gpt4,
            O200K_PATTERN => Pattern::O200k,
            "" => return Err(invalid!("the split pattern must not be empty")),
            _ => Pattern::Custom(Box::new(Custom::new(regex, keep_gaps)?)),
        })
    }

    /// `gpt2`, `gpt4`, `o200k` or `custom`.
    pub fn name(&self) -> &'static str {
        match self {
            Pattern::Gpt2 => "gpt2",
            Pattern::Gpt4 => "gpt4",
            Pattern::O200k => "o200k",
            Pattern::Custom(_) => "custom",
        }
    }

    /// The regex, as tiktoken writes it for the named patterns.
    pub fn regex(&self) -> &str {
        match self {
            Pattern::Gpt2 => GPT2_PATTERN_TIKTOKEN,
            Pattern::Gpt4 => GPT4_PATTERN,
            Pattern::O200k => O200K_PATTERN,
            Pattern::Custom(c) => c.regex(),
        }
    }

    /// Whether text between matches is kept as pre-tokens (only a custom pattern read
    /// from a Hugging Face `Split` with `Isolated` can leave gaps).
    pub fn keeps_gaps(&self) -> bool {
        matches!(self, Pattern::Custom(c) if c.keep_gaps())
    }

    /// Whether this is a hand-written scanner, whose matches [`Pattern::boundary`]
    /// knows; a custom regex can look anywhere in its text.
    pub fn is_named(&self) -> bool {
        !matches!(self, Pattern::Custom(_))
    }

    /// The pre-tokens of `text` (no special-token handling: see [`SpecialSplitter`]).
    pub fn pretokens<'a>(&'a self, text: &'a str) -> PreTokens<'a> {
        let scan = match self {
            Pattern::Gpt2 => Scan::Gpt2,
            Pattern::Gpt4 => Scan::Gpt4,
            Pattern::O200k => Scan::O200k,
            Pattern::Custom(c) => Scan::Custom(Box::new(c.matches(text))),
        };
        PreTokens { text, pos: 0, scan }
    }

    /// Hands each pre-token of `text` in order to `visitor`, until it returns `false`.
    /// The hot loops of training and encoding use this rather than
    /// [`Pattern::pretokens`]: the pattern is chosen once per text, and a named
    /// pattern's scanner and the visitor's body are compiled into one loop.
    #[inline]
    pub fn visit<'a>(&'a self, text: &'a str, visitor: &mut impl Visitor<'a>) {
        match self {
            Pattern::Gpt2 => scan(text, gpt2::match_end, visitor),
            Pattern::Gpt4 => scan(text, cl100k::match_end, visitor),
            Pattern::O200k => scan(text, o200k::match_end, visitor),
            Pattern::Custom(c) => {
                for pretoken in c.matches(text) {
                    if !visitor.visit(pretoken) {
                        break;
                    }
                }
            }
        }
    }

    /// Whether the whole text's pre-tokens have a boundary between the chars `before`
    /// and `after`, and the pre-tokens from there are those of the text from there,
    /// whatever precedes it. Always false for a custom regex.
    ///
    /// Holds when `before` is a letter or a digit and `after` is no whitespace, is not
    /// of `before`'s class, and cannot continue `before`'s pre-token: letter and digit
    /// runs end where their class does, the contractions and o200k's letter runs
    /// continue only with letters, marks (o200k) and `'`, and no pattern looks behind.
    pub fn boundary(&self, before: char, after: char) -> bool {
        match self {
            Pattern::Gpt2 | Pattern::Gpt4 => match (class_of(before), class_of(after)) {
                (l @ (Class::Letter | Class::Number), r) => r != Class::Space && r != l,
                _ => false,
            },
            Pattern::O200k => match (kind_of(before), kind_of(after)) {
                (Kind::Number, r) => r != Kind::Number && r != Kind::Space,
                (l, r) if l.letter() => matches!(r, Kind::Number | Kind::Other) && after != '\'',
                _ => false,
            },
            Pattern::Custom(_) => false,
        }
    }
}

/// The body of a loop over pre-tokens ([`Pattern::visit`]). Mark `visit`
/// `#[inline(always)]`, so that each scanner's loop holds it.
pub trait Visitor<'a> {
    /// Takes the next pre-token; returns whether to go on.
    fn visit(&mut self, pretoken: &'a str) -> bool;
}

/// The loop of [`Pattern::visit`] over one scanner.
#[inline(always)]
fn scan<'a>(
    text: &'a str,
    match_end: impl Fn(&str, usize) -> usize,
    visitor: &mut impl Visitor<'a>,
) {
    let mut pos = 0;
    while pos < text.len() {
        let end = match_end(text, pos);
        if !visitor.visit(&text[pos..end]) {
            return;
        }
        pos = end;
    }
}

impl std::str::FromStr for Pattern {
    type Err = crate::Error;

    fn from_str(spec: &str) -> Result<Pattern> {
        Pattern::parse(spec)
    }
}

enum Scan<'a> {
    Gpt2,
    Gpt4,
    O200k,
    /// Boxed: keeps the iterator of the named scanners small.
    Custom(Box<custom::Matches<'a>>),
}

/// Iterator over the pre-tokens of a text, as sub-slices of it.
pub struct PreTokens<'a> {
    text: &'a str,
    pos: usize,
    scan: Scan<'a>,
}

impl<'a> Iterator for PreTokens<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        let start = self.pos;
        if start >= self.text.len() {
            return None;
        }
        self.pos = match &mut self.scan {
            Scan::Gpt2 => gpt2::match_end(self.text, start),
            Scan::Gpt4 => cl100k::match_end(self.text, start),
            Scan::O200k => o200k::match_end(self.text, start),
            Scan::Custom(matches) => return matches.next(),
        };
        Some(&self.text[start..self.pos])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NAMED: [(Pattern, &str); 3] = [
        (Pattern::Gpt2, GPT2_PATTERN),
        (Pattern::Gpt4, GPT4_PATTERN),
        (Pattern::O200k, O200K_PATTERN),
    ];

    fn reference(regex: &fancy_regex::Regex, text: &str) -> Vec<String> {
        regex
            .find_iter(text)
            .map(|m| m.unwrap().as_str().to_string())
            .collect()
    }

    fn ours(pattern: &Pattern, text: &str) -> Vec<String> {
        pattern.pretokens(text).map(str::to_string).collect()
    }

    fn assert_same(text: &str) {
        static REGEXES: std::sync::OnceLock<Vec<fancy_regex::Regex>> = std::sync::OnceLock::new();
        let regexes = REGEXES.get_or_init(|| {
            NAMED
                .iter()
                .map(|(_, re)| fancy_regex::Regex::new(re).unwrap())
                .collect()
        });
        for ((pattern, _), regex) in NAMED.iter().zip(regexes) {
            assert_eq!(
                ours(pattern, text),
                reference(regex, text),
                "{} on {text:?}",
                pattern.name()
            );
        }
    }

    #[test]
    fn examples_match_regex() {
        for text in [
            "",
            "Hello, world! It's 2024 and we're   testing...",
            "a  b   c\n\n\nd\t \te  ",
            "don't 'll 'LL ''s x's !'s 's DON'T We'RE 'ſ I'Ll",
            "line\r\nnext\r\n\r\n  end \n ",
            "nbsp\u{a0}here\u{a0}\u{a0}x \u{a0}y",
            "e\u{301}clair cafe\u{301} \u{300}x \u{301}\u{301}",
            "emoji 👋🏽 family 👨‍👩‍👧 flags 🇫🇷!",
            "数字١٢٣ and ½ ⅷ x² 1234567 12a345",
            "HTTPServer helloWorld ǅungla ʰAB ABʰ AʰB ĀāĀā",
            "path/to/file.rs\n/\n!!/\r\n((word \"quoted\"",
            "   ",
            " ",
            "\u{2028}\u{3000}x\u{85}y",
        ] {
            assert_same(text);
        }
    }

    #[test]
    fn every_char_class_matches_regex() {
        let classes = [
            ("L", r"^\p{L}$"),
            ("N", r"^\p{N}$"),
            ("s", r"^\s$"),
            ("U", r"^[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]$"),
            ("W", r"^[\p{Ll}\p{Lm}\p{Lo}\p{M}]$"),
        ]
        .map(|(name, re)| (name, fancy_regex::Regex::new(re).unwrap()));
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let s = c.to_string();
            let is = |name: &str| {
                let re = &classes.iter().find(|(n, _)| *n == name).unwrap().1;
                re.is_match(&s).unwrap()
            };
            let class = if is("L") {
                Class::Letter
            } else if is("N") {
                Class::Number
            } else if is("s") {
                Class::Space
            } else {
                Class::Other
            };
            assert_eq!(class_of(c), class, "char U+{:04X}", c as u32);
            let kind = kind_of(c);
            assert_eq!(kind.upper(), is("U"), "U of U+{:04X}", c as u32);
            assert_eq!(kind.lower(), is("W"), "W of U+{:04X}", c as u32);
            assert_eq!(kind.letter(), is("L"), "L of U+{:04X}", c as u32);
            assert_eq!(kind == Kind::Number, is("N"), "N of U+{:04X}", c as u32);
            assert_eq!(kind == Kind::Space, is("s"), "s of U+{:04X}", c as u32);
        }
    }

    #[test]
    fn contractions_fold_case_as_the_regex_does() {
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            assert_same(&format!("x'{c} '{c}{c}y"));
        }
    }

    #[test]
    fn real_text_matches_regex() {
        let mut text = String::from(include_str!("../../tests/fixtures/mixed.txt"));
        text.push_str(include_str!("../../tests/fixtures/cs336/corpus.en"));
        let stories = tinylm_corpus::tinystories();
        text.push_str(&stories[..stories.floor_char_boundary(200_000)]);
        assert_same(&text);
    }

    fn piece_char() -> impl Strategy<Value = char> {
        prop_oneof![
            4 => prop::sample::select(vec![' ', ' ', '\n', '\r', '\t', '\'', 's', 't', 'l', 'v', 'e', 'r', 'd', 'm', 'L', 'S', '1', '.', '!', '/', '"']),
            2 => prop::char::range('a', 'z'),
            1 => prop::char::range('A', 'Z'),
            1 => prop::sample::select(vec!['\u{a0}', '\u{2028}', '\u{3000}', '\u{85}', '\u{301}', '½', '١', 'é', 'É', 'ǅ', 'ʰ', '中', '👋', '\u{200d}', '\u{feff}', 'ſ', '\u{903}']),
            1 => any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn random_unicode_matches_regex(chars in prop::collection::vec(piece_char(), 0..64)) {
            let text: String = chars.into_iter().collect();
            assert_same(&text);
        }

        /// Where `boundary` holds, the pre-tokens of the whole text are those of the two
        /// sides.
        #[test]
        fn boundaries_split_pretokens(chars in prop::collection::vec(piece_char(), 2..48)) {
            let text: String = chars.into_iter().collect();
            for (pattern, _) in &NAMED {
                let whole = ours(pattern, &text);
                let positions: Vec<(usize, char)> = text.char_indices().collect();
                for w in positions.windows(2) {
                    let ((_, before), (q, after)) = (w[0], w[1]);
                    if pattern.boundary(before, after) {
                        let mut split = ours(pattern, &text[..q]);
                        split.extend(ours(pattern, &text[q..]));
                        prop_assert_eq!(&split, &whole, "{} at {}", pattern.name(), q);
                    }
                }
            }
        }
    }

    #[test]
    fn custom_patterns_run_through_the_regex() {
        let words = Pattern::parse(r"\p{L}+").unwrap();
        assert_eq!(ours(&words, "ab, cd!"), ["ab", "cd"]);
        let isolated = Pattern::from_regex(r"\p{L}+", true).unwrap();
        assert_eq!(ours(&isolated, "ab, cd!"), ["ab", ", ", "cd", "!"]);
        let lookbehind = Pattern::parse(r"(?<=a)b|.").unwrap();
        assert_eq!(ours(&lookbehind, "abb"), ["a", "b", "b"]);
        assert_eq!(Pattern::parse(GPT4_PATTERN).unwrap(), Pattern::Gpt4);
        assert_eq!(Pattern::parse(GPT2_PATTERN).unwrap(), Pattern::Gpt2);
        let err = Pattern::parse(r"(\p{L}+").unwrap_err().to_string();
        assert!(
            err.contains(r#""(\\p{L}+""#) && err.contains("at byte"),
            "{err}"
        );
    }

    /// The largest pattern in use compiles within the limit; the fuzzer's variant of
    /// GPT-4's, whose `\p{N}{1,34}` compiles to more, is refused, saying so.
    #[test]
    fn a_pattern_compiled_past_the_limit_is_refused() {
        assert!(custom::Custom::new(O200K_PATTERN, false).is_ok());
        let big = GPT4_PATTERN.replace(r"\p{N}{1,3}+", r"\p{N}{1,34}");
        assert_ne!(big, GPT4_PATTERN);
        let err = Pattern::from_regex(&big, true).unwrap_err().to_string();
        assert!(err.contains("at most 256 KiB compiled"), "{err}");
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
