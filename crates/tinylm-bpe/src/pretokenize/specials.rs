//! The splitting of text at special tokens (leftmost, longest match).

use aho_corasick::{AhoCorasick, MatchKind};

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
