//! A user's split pattern (`--pattern REGEX`, a `tokenizer.json`'s `Split`) and
//! the text it cuts (the input's two parts): `Pattern::parse` and the pre-tokens.
//! A refused regex is an error; compiling and running one allocate at most 512
//! bytes per input byte beyond 32 MiB (the regex crates' own bounded caches); the
//! pre-tokens are non-empty pieces of the text in order, and with the gaps kept
//! they are the whole text; the encoder with the pattern decodes to those pieces;
//! a pattern written to a `tokenizer.json` reads back the same. A regex that
//! backtracks without end gives up (fancy-regex's backtracking limit) and the rest
//! of the text is one pre-token.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tinylm_bpe::files::{hf, Bpe};
use tinylm_bpe::pretokenize::Pattern;
use tinylm_fuzz::{bytes_tokenizer, parts, scratch, within, Bound};

const BOUND: Bound = Bound {
    per_byte: 512,
    fixed: 32 << 20,
};

/// Where each pre-token of `text` starts and ends, checked to be in order,
/// non-empty and inside the text.
fn spans(pattern: &Pattern, text: &str) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for piece in pattern.pretokens(text) {
        let start = piece.as_ptr() as usize - text.as_ptr() as usize;
        let end = start + piece.len();
        assert!(
            !piece.is_empty() && end <= text.len(),
            "{piece:?} in {text:?}"
        );
        assert!(
            out.last().is_none_or(|&(_, e)| e <= start),
            "{piece:?} overlaps"
        );
        out.push((start, end));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let [regex, text] = parts::<2>(data);
    let (Ok(regex), text) = (std::str::from_utf8(regex), String::from_utf8_lossy(text)) else {
        return;
    };
    let pattern = within("Pattern::parse", data.len(), BOUND, || {
        Pattern::parse(regex)
    });
    let pattern = match pattern {
        Ok(p) => p,
        Err(e) => return assert!(!e.to_string().is_empty()),
    };
    let pieces = within("pre-tokens", data.len(), BOUND, || spans(&pattern, &text));
    let ids = bytes_tokenizer()
        .clone()
        .with_pattern(pattern.clone())
        .encode(&text);
    let kept: Vec<u8> = pieces
        .iter()
        .flat_map(|&(s, e)| text[s..e].bytes())
        .collect();
    assert_eq!(bytes_tokenizer().decode_bytes(&ids).unwrap(), kept);
    if let Ok(gaps) = Pattern::from_regex(regex, true) {
        let all = within("pre-tokens with gaps", data.len(), BOUND, || {
            spans(&gaps, &text)
        });
        assert!(
            all.windows(2).all(|w| w[0].1 == w[1].0),
            "gaps are pre-tokens"
        );
        assert_eq!(all.first().map_or(0, |s| s.0), 0);
        assert_eq!(
            all.last().map_or(0, |s| s.1),
            if all.is_empty() { 0 } else { text.len() }
        );
        assert!(!all.is_empty() || text.is_empty());
    }
    // Written to a tokenizer.json (unless the tokenizers library would read the
    // regex differently: an error), the pattern reads back the same.
    let bpe = Bpe {
        vocab: (0..=255u8).map(|b| vec![b]).collect(),
        merges: Vec::new(),
        specials: Vec::new(),
        pattern,
    };
    let path = scratch().join("pattern.json");
    if hf::save(&path, &bpe).is_ok() {
        assert_eq!(
            hf::load(&path)
                .expect("a written tokenizer reads back")
                .pattern,
            bpe.pattern
        );
    }
});
