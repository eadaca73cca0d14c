//! The encoder on any bytes (the input after its first two bytes, which pick the
//! split pattern and a chunk size), with a tokenizer trained on the repository's
//! mixed-script fixture and three special tokens, two of which overlap. Asserted:
//! the ids equal a plain reference BPE's (leftmost-longest special matches, the
//! pattern's pre-tokens, merges applied lowest rank first, leftmost among equals);
//! they decode back to the text; the streaming encoder (chunks of the chosen
//! size), `encode_parallel` (chunks of about that many bytes) and `encode_file`
//! give the same ids; `encode_file` refuses invalid UTF-8 naming the file and the
//! byte. Encoding allocates at most 64 bytes per input byte beyond 8 MiB.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::sync::OnceLock;
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::npy::MappedNpy;
use tinylm_bpe::pretokenize::Pattern;
use tinylm_bpe::train::{train_from_texts, TrainOptions};
use tinylm_bpe::{Merges, Vocab};
use tinylm_fuzz::{refused, scratch, within, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 64,
    fixed: 8 << 20,
};

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|eot|>", "<|eot|><|eot|>"];

/// A tokenizer and the reference's tables.
struct Trained {
    tokenizer: Tokenizer,
    /// Bytes → the lowest id with them.
    ids: HashMap<Vec<u8>, u32>,
    /// `(left, right)` → the merge's rank.
    ranks: HashMap<(Vec<u8>, Vec<u8>), usize>,
}

fn trained(pattern: Pattern) -> Trained {
    let text = include_str!("../../crates/tinylm-bpe/tests/fixtures/mixed.txt");
    let specials: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    let options = TrainOptions {
        pattern: &pattern,
        ..TrainOptions::default()
    };
    let (vocab, merges): (Vocab, Merges) =
        train_from_texts([text], 700, &specials, options, 1 << 20).unwrap();
    let mut ids = HashMap::new();
    for (id, token) in vocab.iter().enumerate() {
        ids.entry(token.clone()).or_insert(id as u32);
    }
    let mut ranks = HashMap::new();
    for (rank, merge) in merges.iter().enumerate() {
        ranks.entry(merge.clone()).or_insert(rank);
    }
    let tokenizer = Tokenizer::new(vocab, &merges, &specials)
        .unwrap()
        .with_pattern(pattern);
    Trained {
        tokenizer,
        ids,
        ranks,
    }
}

fn tokenizers() -> &'static [Trained; 3] {
    static T: OnceLock<[Trained; 3]> = OnceLock::new();
    T.get_or_init(|| [Pattern::Gpt2, Pattern::Gpt4, Pattern::O200k].map(trained))
}

/// The reference: specials found leftmost, longest first; the text between them
/// cut by the pattern; each pre-token merged by the lowest-ranked pair, leftmost
/// among equals, until no pair is a merge.
fn reference(t: &Trained, text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let found = (0..=rest.len())
            .filter(|&i| rest.is_char_boundary(i))
            .find_map(|i| {
                let longest = (SPECIALS.iter())
                    .filter(|s| rest[i..].starts_with(**s))
                    .max_by_key(|s| s.len())?;
                Some((i, longest))
            });
        let (piece, special) = match found {
            Some((i, s)) => (&rest[..i], Some(*s)),
            None => (rest, None),
        };
        for pretoken in t.tokenizer.pattern().pretokens(piece) {
            let mut parts: Vec<Vec<u8>> = pretoken.bytes().map(|b| vec![b]).collect();
            loop {
                let best = (0..parts.len().saturating_sub(1))
                    .filter_map(|i| {
                        let pair = (parts[i].clone(), parts[i + 1].clone());
                        t.ranks.get(&pair).map(|&r| (r, i))
                    })
                    .min();
                let Some((_, i)) = best else { break };
                let right = parts.remove(i + 1);
                parts[i].extend(right);
            }
            out.extend(parts.iter().map(|p| t.ids[p]));
        }
        match special {
            Some(s) => {
                out.push(t.ids[s.as_bytes()]);
                rest = &rest[piece.len() + s.len()..];
            }
            None => break,
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let [choice, size, bytes @ ..] = data else {
        return;
    };
    let t = &tokenizers()[*choice as usize % 3];
    let chunk = 1 + *size as usize % 64;
    let text = String::from_utf8_lossy(bytes);
    let ids = within("Tokenizer::encode", bytes.len(), BOUND, || {
        t.tokenizer.encode(&text)
    });
    assert_eq!(ids, reference(t, &text), "the reference BPE differs");
    let back = t.tokenizer.decode_bytes(&ids).expect("encoded ids decode");
    assert!(
        back == text.as_bytes(),
        "decoded {:?}",
        String::from_utf8_lossy(&back)
    );

    // Streaming, in chunks of `chunk` bytes (moved to char boundaries).
    let mut streamed = Vec::new();
    let mut stream = t.tokenizer.stream();
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + chunk).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        stream.push(&text[at..end], &mut streamed);
        at = end;
    }
    stream.finish(&mut streamed);
    assert_eq!(
        streamed, ids,
        "the streaming encoder differs (chunks of {chunk} bytes)"
    );

    // In parallel chunks of about `chunk` bytes.
    let bounds = t.tokenizer.chunk_bounds(&text, chunk);
    assert!(bounds.windows(2).all(|w| w[0] < w[1]) && bounds[0] == 0);
    assert_eq!(*bounds.last().unwrap(), text.len());
    let mut parallel = Vec::new();
    let mut covered = 0;
    t.tokenizer
        .encode_parallel(&text, chunk, |part, n| {
            parallel.extend_from_slice(part);
            covered += n;
            Ok(())
        })
        .unwrap();
    assert_eq!(
        parallel, ids,
        "encode_parallel differs (chunks of about {chunk} bytes)"
    );
    assert_eq!(covered, text.len());

    // The file encoder, on the bytes as they are.
    let input = write("text.txt", bytes);
    let output = scratch().join("ids.npy");
    let encoded = within("Tokenizer::encode_file", bytes.len(), BOUND, || {
        t.tokenizer.encode_file(&input, &output, 1, |_| {})
    });
    match (encoded, std::str::from_utf8(bytes)) {
        (Ok(summary), Ok(_)) => {
            assert_eq!((summary.bytes, summary.tokens), (bytes.len(), ids.len()));
            let npy = MappedNpy::open(&output).unwrap();
            let file: Vec<u32> = (0..npy.len()).map(|i| npy.int_at(i) as u32).collect();
            assert_eq!(file, ids, "encode_file differs");
        }
        (Err(e), Err(utf8)) => {
            refused(&e, &input);
            let at = format!("byte {}", utf8.valid_up_to());
            assert!(e.to_string().contains(&at), "{e} does not say {at}");
        }
        (Ok(_), Err(_)) => panic!("encode_file accepted invalid UTF-8"),
        (Err(e), Ok(_)) => panic!("encode_file refused UTF-8 text: {e}"),
    }
});
