//! A split pattern given as a regex, run by `fancy-regex` (the engine of tiktoken's core).

use crate::{invalid, Result};

/// The most memory a split pattern may compile to (the `regex` crate's size limit,
/// per part of the pattern it runs): o200k_base's, the largest in use, needs 192 KiB;
/// a pattern that repeats a Unicode class dozens of times (`\p{N}{1,34}`, which
/// the fuzzer made of GPT-4's `\p{N}{1,3}`) needs more than 320 KiB, and a file's
/// few bytes would make the reader allocate far more than their size.
pub const MAX_COMPILED: usize = 256 << 10;

/// A compiled custom split pattern.
#[derive(Clone, Debug)]
pub struct Custom {
    regex: fancy_regex::Regex,
    /// Text between matches becomes pre-tokens too (Hugging Face's `Split` with
    /// `behavior: Isolated`), instead of being dropped (tiktoken).
    keep_gaps: bool,
}

impl Custom {
    /// Compiles `regex`; a bad one is an error quoting it and the byte position at
    /// fault, one that compiles to more than [`MAX_COMPILED`] bytes an error saying so.
    pub fn new(regex: &str, keep_gaps: bool) -> Result<Self> {
        let compiled = fancy_regex::RegexBuilder::new(regex)
            .delegate_size_limit(MAX_COMPILED)
            .build();
        let regex = compiled.map_err(|e| match e {
            fancy_regex::Error::ParseError(at, what) => {
                invalid!("invalid split pattern {regex:?}: at byte {at}: {what}")
            }
            other => invalid!(
                "invalid split pattern {regex:?}: {other} (at most {} KiB compiled)",
                MAX_COMPILED >> 10
            ),
        })?;
        Ok(Custom { regex, keep_gaps })
    }

    pub fn regex(&self) -> &str {
        self.regex.as_str()
    }

    pub fn keep_gaps(&self) -> bool {
        self.keep_gaps
    }

    pub(super) fn matches<'a>(&'a self, text: &'a str) -> Matches<'a> {
        Matches {
            text,
            found: Some(self.regex.find_iter(text)),
            keep_gaps: self.keep_gaps,
            pos: 0,
            pending: None,
        }
    }
}

/// The pre-tokens of one text under a [`Custom`] pattern: the non-empty matches in
/// order (and the gaps between them, with `keep_gaps`). Should the regex give up (its
/// backtracking limit), the rest of the text is one pre-token.
pub(super) struct Matches<'a> {
    text: &'a str,
    /// `None` once the regex has given up.
    found: Option<fancy_regex::Matches<'a, 'a, str>>,
    keep_gaps: bool,
    /// End of the text handed out so far.
    pos: usize,
    /// A match found while a gap before it was handed out.
    pending: Option<(usize, usize)>,
}

impl Matches<'_> {
    fn next_match(&mut self) -> Option<(usize, usize)> {
        match self.found.as_mut()?.next()? {
            Ok(m) => Some((m.start(), m.end())),
            Err(_) => {
                self.found = None;
                Some((self.pos, self.text.len()))
            }
        }
    }
}

impl<'a> Iterator for Matches<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        loop {
            let Some((start, end)) = self.pending.take().or_else(|| self.next_match()) else {
                let rest = &self.text[self.pos..];
                self.pos = self.text.len();
                return (self.keep_gaps && !rest.is_empty()).then_some(rest);
            };
            if self.keep_gaps && start > self.pos {
                self.pending = Some((start, end));
                let gap = &self.text[self.pos..start];
                self.pos = start;
                return Some(gap);
            }
            if end > start {
                self.pos = end;
                return Some(&self.text[start..end]);
            }
        }
    }
}
