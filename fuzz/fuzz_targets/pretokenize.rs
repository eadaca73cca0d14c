//! Differential: the three hand-written pre-tokenizer scanners (`pretokenize/
//! {gpt2,cl100k,o200k}.rs`) against `fancy-regex` running tiktoken's own pattern
//! strings (and GPT-2's published and Hugging Face forms) on the same text (the
//! input, invalid UTF-8 replaced); and `Pattern::boundary`: where it holds, the
//! pre-tokens of the text cut there are those of the whole. Any difference is a
//! finding.

#![no_main]

use fancy_regex::Regex;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tinylm_bpe::pretokenize::{
    Pattern, GPT2_PATTERN, GPT2_PATTERN_HF, GPT2_PATTERN_TIKTOKEN, GPT4_PATTERN, O200K_PATTERN,
};

/// Each scanner with the regexes it must equal.
fn references() -> &'static [(Pattern, Vec<Regex>)] {
    static R: OnceLock<Vec<(Pattern, Vec<Regex>)>> = OnceLock::new();
    R.get_or_init(|| {
        let compile = |res: &[&str]| res.iter().map(|re| Regex::new(re).unwrap()).collect();
        vec![
            (
                Pattern::Gpt2,
                compile(&[GPT2_PATTERN_TIKTOKEN, GPT2_PATTERN, GPT2_PATTERN_HF]),
            ),
            (Pattern::Gpt4, compile(&[GPT4_PATTERN])),
            (Pattern::O200k, compile(&[O200K_PATTERN])),
        ]
    })
}

fn ours<'a>(pattern: &'a Pattern, text: &'a str) -> Vec<&'a str> {
    pattern.pretokens(text).collect()
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text: &str = &text;
    for (pattern, regexes) in references() {
        let scanned = ours(pattern, text);
        for regex in regexes {
            let matched: Result<Vec<&str>, _> = regex
                .find_iter(text)
                .map(|m| m.map(|m| m.as_str()))
                .collect();
            // The regex's backtracking limit is its failure, not the scanner's.
            if let Ok(matched) = matched {
                assert_eq!(
                    scanned,
                    matched,
                    "{} against {}",
                    pattern.name(),
                    regex.as_str()
                );
            }
        }
        // At most 16 of the places where the boundary holds, spread over the text.
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let cuts: Vec<usize> = (chars.windows(2))
            .filter(|w| pattern.boundary(w[0].1, w[1].1))
            .map(|w| w[1].0)
            .collect();
        for &at in cuts.iter().step_by((cuts.len() / 16).max(1)) {
            let mut cut = ours(pattern, &text[..at]);
            cut.extend(ours(pattern, &text[at..]));
            assert_eq!(cut, scanned, "{} cut at byte {at}", pattern.name());
        }
    }
});
