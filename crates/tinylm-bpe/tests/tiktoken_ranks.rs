//! The published rank files `cl100k_base` and `o200k_base` (shipped inside the
//! `tiktoken-rs` crate) read with `files::tiktoken::load` encode exactly as tiktoken.

#[allow(dead_code)]
mod encode_gpt2;
mod published;

use std::path::PathBuf;
use std::time::Instant;

use encode_gpt2::generated_text;
use tiktoken_rs::CoreBPE;
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::files::{tiktoken, Bpe};
use tinylm_bpe::pretokenize::Pattern;

fn specials(list: &[(&str, u32)]) -> Vec<(String, Option<u32>)> {
    list.iter()
        .map(|&(t, id)| (t.to_string(), Some(id)))
        .collect()
}

/// The texts both encoders see: the fixture, every char below U+3000 (in runs),
/// generated text, the TinyStories sample's first megabyte and CS336's `corpus.en`.
fn texts() -> Vec<(String, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut texts = vec![(
        "mixed.txt".to_string(),
        std::fs::read_to_string(root.join("crates/tinylm-bpe/tests/fixtures/mixed.txt")).unwrap(),
    )];
    let chars: Vec<char> = (0..0x3000u32).filter_map(char::from_u32).collect();
    for (i, run) in chars.chunks(64).enumerate() {
        texts.push((format!("chars {i}"), run.iter().collect()));
        // The same chars each after a space and a letter, and between newlines.
        let spaced: String = run.iter().flat_map(|&c| [' ', c, 'a', c, '\n']).collect();
        texts.push((format!("spaced chars {i}"), spaced));
    }
    for seed in 0..20 {
        texts.push((format!("generated {seed}"), generated_text(seed, 400)));
    }
    let stories = tinylm_corpus::tinystories();
    texts.push((
        "TinyStories".to_string(),
        stories[..stories.floor_char_boundary(1 << 20)].to_string(),
    ));
    texts.push((
        "corpus.en".to_string(),
        include_str!("fixtures/cs336/corpus.en").to_string(),
    ));
    texts
}

/// Encodes every text with both; returns the first difference, as the smallest
/// differing line.
fn compare(ours: &Tokenizer, theirs: &CoreBPE) {
    let texts = texts();
    let bytes: usize = texts.iter().map(|(_, t)| t.len()).sum();
    eprintln!("{} texts, {bytes} bytes", texts.len());
    for (name, text) in texts {
        let expected = theirs.encode_with_special_tokens(&text);
        if ours.encode(&text) == expected {
            continue;
        }
        let line = text
            .split_inclusive('\n')
            .filter(|l| ours.encode(l) != theirs.encode_with_special_tokens(l))
            .min_by_key(|l| l.len())
            .unwrap_or(&text);
        panic!(
            "{name}: ids differ; smallest differing line {line:?}: ours {:?}, tiktoken {:?}",
            ours.encode(line),
            theirs.encode_with_special_tokens(line)
        );
    }
}

fn load(file: &str, pattern: Pattern, list: &[(&str, u32)]) -> Bpe {
    let dir = published::assets();
    let start = Instant::now();
    let bpe = tiktoken::load(&dir.join(file), pattern, &specials(list)).unwrap();
    eprintln!("{file}: loaded in {:?}", start.elapsed());
    bpe
}

#[test]
fn cl100k_base_encodes_as_tiktoken() {
    let list = [
        ("<|endoftext|>", 100257),
        ("<|fim_prefix|>", 100258),
        ("<|fim_middle|>", 100259),
        ("<|fim_suffix|>", 100260),
        ("<|endofprompt|>", 100276),
    ];
    let bpe = load("cl100k_base.tiktoken", Pattern::Gpt4, &list);
    assert_eq!(bpe.vocab.len(), 100277);
    assert_eq!(bpe.merges.len(), 100256 - 256);
    assert!(bpe.vocab[100256].is_empty());
    assert_eq!(bpe.specials, [100257, 100258, 100259, 100260, 100276]);
    let start = Instant::now();
    let ours = bpe.tokenizer().unwrap();
    eprintln!("cl100k_base: tokenizer built in {:?}", start.elapsed());
    compare(&ours, &tiktoken_rs::cl100k_base().unwrap());
}

#[test]
fn o200k_base_encodes_as_tiktoken() {
    let list = [("<|endoftext|>", 199999), ("<|endofprompt|>", 200018)];
    let bpe = load("o200k_base.tiktoken", Pattern::O200k, &list);
    assert_eq!(bpe.vocab.len(), 200019);
    let ours = bpe.tokenizer().unwrap();
    compare(&ours, &tiktoken_rs::o200k_base().unwrap());
}

/// Merges-list BPE (the listed pairs only, lowest rank first, leftmost on a tie).
fn merges_bpe(piece: &[u8], pairs: &rustc_hash::FxHashMap<(&[u8], &[u8]), usize>) -> Vec<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = piece.iter().map(|&b| vec![b]).collect();
    loop {
        let best = (0..parts.len().saturating_sub(1))
            .filter_map(|i| {
                pairs
                    .get(&(&parts[i][..], &parts[i + 1][..]))
                    .map(|&r| (r, i))
            })
            .min();
        let Some((_, i)) = best else { return parts };
        let right = parts.remove(i + 1);
        parts[i].extend(right);
    }
}

/// tiktoken takes a pre-token that is a token whole; merges-list BPE must build every
/// token from its bytes for the two to agree there.
#[test]
fn every_token_merges_to_itself() {
    for (file, pattern) in [
        ("cl100k_base.tiktoken", Pattern::Gpt4),
        ("o200k_base.tiktoken", Pattern::O200k),
    ] {
        let bpe = load(file, pattern, &[]);
        let pairs: rustc_hash::FxHashMap<(&[u8], &[u8]), usize> = bpe
            .merges
            .iter()
            .enumerate()
            .map(|(r, (a, b))| ((a.as_slice(), b.as_slice()), r))
            .collect();
        for (id, token) in bpe.vocab.iter().enumerate() {
            let parts = merges_bpe(token, &pairs);
            assert!(
                parts.len() == 1 && parts[0] == *token,
                "{file}: token {id} {:?} merges to {} parts",
                String::from_utf8_lossy(token),
                parts.len()
            );
        }
    }
}
