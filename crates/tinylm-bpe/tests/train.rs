//! BPE training: the SPEC's worked example, tie-breaking, specials, a naive reference
//! trainer, chunked counting, thread-count independence and bad input.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::vocab_of;
use proptest::prelude::*;
use tinylm_bpe::pretokenize::{Pattern, GPT2_PATTERN};
use tinylm_bpe::train::{
    count_pretokens, train_bpe, train_bpe_files, train_bpe_with, train_from_counts,
    train_from_texts, PretokenCounts, TrainOptions,
};
use tinylm_bpe::{Merges, Vocab};

mod common;

fn counts(words: &[(&str, u64)]) -> PretokenCounts {
    words
        .iter()
        .map(|&(w, n)| (w.as_bytes().to_vec(), n))
        .collect()
}

fn strs(merges: &Merges) -> Vec<String> {
    merges
        .iter()
        .map(|(l, r)| {
            format!(
                "{} {}",
                String::from_utf8_lossy(l),
                String::from_utf8_lossy(r)
            )
        })
        .collect()
}

#[test]
fn worked_example_gives_the_specs_merges() {
    let words = counts(&[("low", 5), ("lower", 2), ("widest", 3), ("newest", 6)]);
    let specials = ["<|endoftext|>".to_string()];
    let (vocab, merges) = train_from_counts(words, 256 + 1 + 12, &specials, None);
    let expected = "s t, e st, o w, l ow, w est, n e, ne west, w i, wi d, wid est, low e, lowe r";
    assert_eq!(strs(&merges).join(", "), expected);
    assert_eq!(vocab.len(), 269);
    assert_eq!(vocab[256], b"<|endoftext|>");
    assert_eq!(vocab[257], b"st");
    assert_eq!(vocab[268], b"lower");
}

#[test]
fn ties_go_to_the_greater_byte_pair_not_the_greater_id() {
    // (c,d), (c,a), (a,b) all count 1: the greatest byte pair goes first.
    let (_, merges) = train_from_counts(counts(&[("ab", 1), ("cd", 1), ("ca", 1)]), 259, &[], None);
    assert_eq!(strs(&merges), ["c d", "c a", "a b"]);
    // After "zz" (id 256), ("zz","a") ties ("{","a"): "{" (0x7b) > "zz" as bytes, though
    // its id 123 is smaller.
    let words = counts(&[("zz", 10), ("zza", 1), ("{a", 1)]);
    let (_, merges) = train_from_counts(words, 259, &[], None);
    assert_eq!(strs(&merges), ["z z", "{ a", "zz a"]);
    // Tuples compare left first and a prefix is smaller: ("ab","a") > ("a","z"), though
    // "aba" < "az" as concatenations.
    let words = counts(&[("ab", 10), ("aba", 1), ("az", 1)]);
    let (_, merges) = train_from_counts(words, 259, &[], None);
    assert_eq!(strs(&merges), ["a b", "ab a", "a z"]);
}

#[test]
fn replacement_is_left_to_right_without_overlap() {
    let (vocab, merges) = train_from_counts(counts(&[("aaaaa", 1)]), 259, &[], None);
    // aaaaa -> (aa)(aa)a -> (aaaa)a -> (aaaaa)
    assert_eq!(strs(&merges), ["a a", "aa aa", "aaaa a"]);
    assert_eq!(vocab[258], b"aaaaa");
}

fn write_tmp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn specials_are_boundaries_and_never_merged() {
    let dir = tempfile::tempdir().unwrap();
    // Without the split, "a<|eot|>b" would merge across; with it only "a" and "b" remain.
    let path = write_tmp(
        dir.path(),
        "t.txt",
        "a<|eot|>b<|eot|>".repeat(50).as_bytes(),
    );
    let specials = ["<|eot|>".to_string(), "<|eot|>".to_string()];
    let (vocab, merges) = train_bpe(&path, 400, &specials).unwrap();
    assert!(merges.is_empty(), "{:?}", strs(&merges));
    assert_eq!(vocab.len(), 257, "the repeated special counts once");
    // With words around them, no merge ever contains part of a special.
    let text = "hello<|eot|>hello world<|eot|><|eot|> world<|eot|>".repeat(20);
    let path = write_tmp(dir.path(), "u.txt", text.as_bytes());
    let (_, merges) = train_bpe(&path, 400, &specials[..1]).unwrap();
    assert!(!merges.is_empty());
    for (l, r) in &merges {
        let token = [l.as_slice(), r.as_slice()].concat();
        assert!(
            !token.iter().any(|b| b"<|>".contains(b)),
            "{:?}",
            strs(&merges)
        );
    }
}

/// The naive trainer's merge loop: recount every pair of every word for each merge.
fn naive_from_words(words: &[(String, u64)], max_merges: usize) -> Merges {
    let mut words: Vec<(Vec<Vec<u8>>, u64)> = words
        .iter()
        .map(|(w, n)| (w.bytes().map(|b| vec![b]).collect(), *n))
        .collect();
    let mut merges = Merges::new();
    while merges.len() < max_merges {
        let mut pairs: BTreeMap<(Vec<u8>, Vec<u8>), u64> = BTreeMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0].clone(), p[1].clone())).or_default() += n;
            }
        }
        // Highest count; among equal counts the greatest pair (BTreeMap order is byte order).
        let Some((best, _)) = pairs
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
        else {
            break;
        };
        for (w, _) in &mut words {
            let mut out = Vec::new();
            let mut i = 0;
            while i < w.len() {
                if i + 1 < w.len() && w[i] == best.0 && w[i + 1] == best.1 {
                    out.push([best.0.as_slice(), best.1.as_slice()].concat());
                    i += 2;
                } else {
                    out.push(w[i].clone());
                    i += 1;
                }
            }
            *w = out;
        }
        merges.push(best);
    }
    merges
}

/// The naive trainer on text: split at specials (leftmost, longest), pre-tokenize with
/// `fancy-regex`, count, merge.
fn naive(text: &str, vocab_size: usize, specials: &[String]) -> (Vocab, Merges) {
    let re = fancy_regex::Regex::new(GPT2_PATTERN).unwrap();
    let mut pieces = vec![];
    let (mut start, mut i) = (0, 0);
    while i < text.len() {
        let special = specials
            .iter()
            .filter(|s| text[i..].starts_with(s.as_str()))
            .max_by_key(|s| s.len());
        match special {
            Some(s) => {
                pieces.push(&text[start..i]);
                i += s.len();
                start = i;
            }
            None => i += text[i..].chars().next().unwrap().len_utf8(),
        }
    }
    pieces.push(&text[start..]);
    let mut words: BTreeMap<String, u64> = BTreeMap::new();
    for piece in pieces {
        for m in re.find_iter(piece) {
            *words.entry(m.unwrap().as_str().to_string()).or_default() += 1;
        }
    }
    let words: Vec<(String, u64)> = words.into_iter().collect();
    let mut unique: Vec<String> = vec![];
    for s in specials {
        if !unique.contains(s) {
            unique.push(s.clone());
        }
    }
    let merges = naive_from_words(&words, vocab_size - 256 - unique.len());
    let specials: Vec<&str> = unique.iter().map(String::as_str).collect();
    (vocab_of(&specials, &merges), merges)
}

/// Text from a small alphabet, so that pairs repeat and counts tie often.
fn corpus() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        6 => prop::sample::select(vec!["a", "b", "ab", "ba", " ", " ", "\n", "e", "é", "'s", "1", ".", "<|eot|>", "<|x|>", "中", "，", "\u{301}", "١", "\u{a0}", "A", "AB", "'S", "\r\n", "/", "ʰ", "123"]).prop_map(String::from),
        1 => any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..120).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn fast_trainer_agrees_with_naive(text in corpus(), extra in 0usize..60, which in 0usize..3) {
        let specials: Vec<String> = [vec![], vec!["<|eot|>"], vec!["<|eot|>", "<|x|>", "<|eot|>"]][which]
            .iter().map(|s| s.to_string()).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = write_tmp(dir.path(), "c.txt", text.as_bytes());
        let vocab_size = 256 + 2 + extra;
        let (fast_vocab, fast_merges) = train_bpe(&path, vocab_size, &specials).unwrap();
        let (vocab, merges) = naive(&text, vocab_size, &specials);
        prop_assert_eq!(strs(&fast_merges), strs(&merges));
        prop_assert_eq!(fast_vocab, vocab);
    }

    #[test]
    fn chunked_counting_equals_whole_text_counting(
        text in corpus(),
        chunk in 1usize..40,
        which in 0usize..2,
        pattern in 0usize..4,
    ) {
        let specials: Vec<String> = [vec![], vec!["<|eot|>", "<|x|>"]][which]
            .iter().map(|s| s.to_string()).collect();
        let pattern = &patterns()[pattern];
        let whole = count_pretokens(text.as_bytes(), &specials, usize::MAX, options(pattern, false)).unwrap();
        let chunked = count_pretokens(text.as_bytes(), &specials, chunk, options(pattern, false)).unwrap();
        prop_assert_eq!(sorted(chunked), sorted(whole));
    }

    #[test]
    fn lossy_chunked_counting_equals_whole(
        text in corpus(),
        bad in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(vec![0x80u8, 0xbf, 0xc3, 0xe2, 0xf0, 0xff])), 1..6),
        chunk in 1usize..40,
        pattern in 0usize..4,
    ) {
        let pattern = &patterns()[pattern];
        let mut bytes = text.into_bytes();
        for (at, b) in bad {
            bytes.insert(at.index(bytes.len() + 1), b);
        }
        let specials = ["<|eot|>".to_string()];
        let whole = count_pretokens(&bytes, &specials, usize::MAX, options(pattern, true)).unwrap();
        let chunked = count_pretokens(&bytes, &specials, chunk, options(pattern, true)).unwrap();
        prop_assert_eq!(sorted(chunked), sorted(whole));
    }
}

/// Every named pattern and a custom regex with a look-behind.
fn patterns() -> Vec<Pattern> {
    let mut all: Vec<Pattern> = Pattern::NAMES
        .iter()
        .map(|n| Pattern::parse(n).unwrap())
        .collect();
    all.push(Pattern::parse(r"(?<=\p{L})\p{L}+|\p{N}{1,2}|\s+|.").unwrap());
    all
}

fn options(pattern: &Pattern, lossy_utf8: bool) -> TrainOptions<'_> {
    TrainOptions {
        pattern,
        lossy_utf8,
        progress: None,
    }
}

fn sorted(c: PretokenCounts) -> BTreeMap<Vec<u8>, u64> {
    c.into_iter().collect()
}

#[test]
fn chunked_counting_equals_whole_on_real_text() {
    let mut text = String::from(include_str!("fixtures/mixed.txt"));
    let stories = tinylm_corpus::tinystories();
    text.push_str(&stories[..stories.floor_char_boundary(800_000)]);
    let specials = ["<|endoftext|>".to_string()];
    for pattern in &patterns() {
        let count = |chunk| {
            sorted(
                count_pretokens(text.as_bytes(), &specials, chunk, options(pattern, false))
                    .unwrap(),
            )
        };
        let whole = count(usize::MAX);
        for chunk in [1, 7, 100, 4096] {
            assert_eq!(
                count(chunk),
                whole,
                "{} in chunks of {chunk}",
                pattern.name()
            );
        }
    }
}

/// A few MB of generated text (several chunks), with and without specials.
fn generated_text(bytes: usize) -> String {
    let words = [
        "the", " cat", " sat", " on", " mat", ".", "\n", " dog's", " 42", " naïve", "!!",
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut text = String::new();
    while text.len() < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(words[(state % 11) as usize]);
        if state.is_multiple_of(97) {
            text.push_str("<|endoftext|>");
        }
    }
    text
}

#[test]
fn output_does_not_depend_on_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tmp(dir.path(), "g.txt", generated_text(3 << 20).as_bytes());
    let specials = ["<|endoftext|>".to_string()];
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| train_bpe(&path, 400, &specials).unwrap())
    };
    let one = run(1);
    assert!(one.1.len() > 50);
    assert_eq!(run(2), one);
    assert_eq!(run(3), one);
}

#[test]
fn invalid_utf8_names_its_offset_or_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = generated_text(2 << 20).into_bytes();
    let at = bytes.len() - 1000;
    bytes[at] = 0xff;
    let path = write_tmp(dir.path(), "bad.txt", &bytes);
    let e = train_bpe(&path, 300, &[]).unwrap_err().to_string();
    assert!(
        e.contains("bad.txt") && e.contains(&format!("byte offset {at}")),
        "{e}"
    );
    let options = TrainOptions {
        lossy_utf8: true,
        ..TrainOptions::default()
    };
    let (vocab, _) = train_bpe_with(&path, 300, &[], options).unwrap();
    assert_eq!(vocab.len(), 300);
    // The replacement char is counted like any other: a file of it alone merges its bytes.
    let path = write_tmp(dir.path(), "ff.txt", b"\xff\xff");
    let (_, merges) = train_bpe_with(&path, 300, &[], options).unwrap();
    assert_eq!(merges[0], (vec![0xef], vec![0xbf]));
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tmp(dir.path(), "ok.txt", b"hello hello");
    let err = |p: &Path, n, s: &[&str]| {
        let s: Vec<String> = s.iter().map(|s| s.to_string()).collect();
        train_bpe(p, n, &s).unwrap_err().to_string()
    };
    assert!(err(&dir.path().join("missing.txt"), 300, &[]).contains("missing.txt"));
    assert!(err(dir.path(), 300, &[]).contains("directory"));
    let e = err(&path, 257, &["<a>", "<b>", "<a>"]);
    assert!(e.contains("257") && e.contains("258"), "{e}");
    assert!(err(&path, 300, &["<a>", ""]).contains("empty"));
    // An empty file and a vocabulary of exactly the bytes and specials are fine.
    let empty = write_tmp(dir.path(), "empty.txt", b"");
    assert_eq!(train_bpe(&empty, 300, &[]).unwrap().0.len(), 256);
    assert_eq!(train_bpe(&path, 256, &[]).unwrap().1.len(), 0);
}

#[test]
fn cs336_corpus_agrees_with_naive() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cs336/corpus.en");
    let text = std::fs::read_to_string(&path).unwrap();
    let specials = ["<|endoftext|>".to_string()];
    let (vocab, merges) = train_bpe(&path, 500, &specials).unwrap();
    assert_eq!(merges.len(), 500 - 257);
    assert_eq!(merges[0], (b" ".to_vec(), b"t".to_vec()));
    assert_eq!((vocab, merges), naive(&text, 500, &specials));
}

/// Texts from an iterator, each a document, train as the file of the same documents
/// separated by a special token (specials are hard boundaries), under every pattern.
#[test]
fn training_from_texts_equals_training_on_the_joined_file() {
    let docs: Vec<String> = (0..300)
        .map(|i| {
            format!(
                "Doc {i}: It's HTTPServer's {} day, we'RE at 12345 / 6.\r\n",
                i * 7919
            )
        })
        .chain([include_str!("fixtures/mixed.txt").to_string()])
        .collect();
    let specials = ["<|endoftext|>".to_string()];
    let dir = tempfile::tempdir().unwrap();
    let path = write_tmp(
        dir.path(),
        "docs.txt",
        docs.join("<|endoftext|>").as_bytes(),
    );
    for pattern in &patterns() {
        let from_file = train_bpe_with(&path, 600, &specials, options(pattern, false)).unwrap();
        for batch_bytes in [1, 1000, usize::MAX] {
            let from_texts =
                train_from_texts(&docs, 600, &specials, options(pattern, false), batch_bytes)
                    .unwrap();
            assert_eq!(
                from_texts,
                from_file,
                "{} in batches of {batch_bytes}",
                pattern.name()
            );
        }
        let halves = [&docs[..150], &docs[150..]].map(|d| d.join("<|endoftext|>"));
        let paths = [
            write_tmp(dir.path(), "a.txt", halves[0].as_bytes()),
            write_tmp(dir.path(), "b.txt", halves[1].as_bytes()),
        ];
        let from_files = train_bpe_files(&paths, 600, &specials, options(pattern, false)).unwrap();
        assert_eq!(from_files, from_file, "{} from two files", pattern.name());
    }
}
