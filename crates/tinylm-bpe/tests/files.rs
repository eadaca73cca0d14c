//! GPT-2 `vocab.json` / `merges.txt`: the table, lossless round trips, clear errors.

use std::path::Path;

use common::{merges_of, vocab_of};
use proptest::prelude::*;
use tinylm_bpe::files::{
    bytes_to_unicode, load_merges, load_tokenizer, load_vocab, save_merges, save_tokenizer,
    save_vocab,
};
use tinylm_bpe::Merges;

mod common;

#[test]
fn table_is_gpt2s() {
    let t = bytes_to_unicode();
    assert_eq!(t[b'!' as usize], '!');
    assert_eq!(t[b' ' as usize], 'Ġ');
    assert_eq!(t[b'\n' as usize], 'Ċ');
    assert_eq!(t[0], 'Ā');
    assert_eq!(t[0xad], 'Ń');
    assert_eq!(t[0xff], 'ÿ');
    let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
    assert_eq!(distinct.len(), 256);
    assert!(t.iter().all(|c| !c.is_whitespace() && !c.is_control()));
}

/// Merges of random existing tokens (bytes weighted to spaces, newlines, quotes).
fn merges() -> impl Strategy<Value = Merges> {
    let byte = prop_oneof![3 => prop::sample::select(b" \n\r\t a\"\\".to_vec()), 2 => any::<u8>()];
    let pick = prop_oneof![1 => byte.prop_map(|b| b as usize), 1 => any::<usize>()];
    prop::collection::vec((pick.clone(), pick), 0..40).prop_map(|picks| {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let mut merges = Merges::new();
        for (l, r) in picks {
            let (l, r) = (
                tokens[l % tokens.len()].clone(),
                tokens[r % tokens.len()].clone(),
            );
            tokens.push([l.as_slice(), r.as_slice()].concat());
            merges.push((l, r));
        }
        merges
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn round_trip_is_lossless(merges in merges()) {
        let dir = tempfile::tempdir().unwrap();
        let vocab = vocab_of(&["<|endoftext|>", "a b\n\"é\""], &merges);
        let out = dir.path().join("nested/tok");
        save_tokenizer(&out, &vocab, &merges).unwrap();
        let (v2, m2) = load_tokenizer(&out).unwrap();
        prop_assert_eq!(v2, vocab);
        prop_assert_eq!(m2, merges);
    }
}

#[test]
fn repeated_token_bytes_round_trip() {
    // (a, bc) and (ab, c) both build "abc": the vocabulary holds it twice.
    let merges = merges_of(&[("b", "c"), ("a", "bc"), ("a", "b"), ("ab", "c")]);
    let vocab = vocab_of(&[], &merges);
    let dir = tempfile::tempdir().unwrap();
    save_tokenizer(dir.path(), &vocab, &merges).unwrap();
    assert_eq!(load_tokenizer(dir.path()).unwrap(), (vocab, merges));
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn err<T: std::fmt::Debug>(r: tinylm_bpe::Result<T>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn vocab_errors_name_the_fault() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let e = err(load_vocab(&write(d, "gap.json", r#"{"a": 0, "b": 2}"#)));
    assert!(e.contains("gap.json") && e.contains("id 2"), "{e}");
    let e = err(load_vocab(&write(d, "twice.json", r#"{"a": 0, "b": 0}"#)));
    assert!(e.contains("id 0 appears twice"), "{e}");
    let e = err(load_vocab(&write(
        d,
        "syntax.json",
        "{\"a\": 0,\n \"b\" 1}",
    )));
    assert!(
        e.contains("syntax.json") && e.contains("line 2 column"),
        "{e}"
    );
    let e = err(load_vocab(&write(d, "neg.json", r#"{"a": -1}"#)));
    assert!(e.contains("neg.json") && e.contains("line 1"), "{e}");
    let e = err(load_vocab(&write(d, "char.json", r#"{"a": 0, "x y": 1}"#)));
    assert!(e.contains("' '") && e.contains("U+0020"), "{e}");
    let e = err(load_vocab(&d.join("missing.json")));
    assert!(e.contains("missing.json"), "{e}");
}

#[test]
fn merges_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (text, line) in [
        ("#version: 0.2\na b\nab\n", 3),
        ("a b\nab c d\n", 2),
        (" a\n", 1),
        ("a \n", 1),
        ("a b\na\u{3000} b\n", 2),
    ] {
        let e = err(load_merges(&write(d, "m.txt", text)));
        assert!(e.contains(&format!("m.txt:{line}:")), "{text:?}: {e}");
    }
    // Without a version line, with CRLF line ends and blank lines (skipped).
    let m = load_merges(&write(d, "ok.txt", "Ġ t\r\n\r\nĠt he\r\n\n")).unwrap();
    assert_eq!(
        m,
        vec![
            (b" ".to_vec(), b"t".to_vec()),
            (b" t".to_vec(), b"he".to_vec())
        ]
    );
}

#[test]
fn tokenizer_checks_merges_against_vocab() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = vocab_of(&[], &vec![]);
    save_vocab(&dir.path().join("vocab.json"), &vocab).unwrap();
    save_merges(
        &dir.path().join("merges.txt"),
        &vec![(b"a".to_vec(), b"b".to_vec())],
    )
    .unwrap();
    let e = err(load_tokenizer(dir.path()));
    assert!(e.contains("merges.txt") && e.contains("\"ab\""), "{e}");
}

#[test]
fn save_into_unwritable_place_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "file", "x");
    let e = err(save_tokenizer(
        &file.join("sub"),
        &vocab_of(&[], &vec![]),
        &vec![],
    ));
    assert!(e.contains("file"), "{e}");
}

#[test]
fn loads_gpt2_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cs336");
    let (vocab_path, merges_path) = (root.join("gpt2_vocab.json"), root.join("gpt2_merges.txt"));
    let vocab = load_vocab(&vocab_path).unwrap();
    let merges = load_merges(&merges_path).unwrap();
    assert_eq!(vocab.len(), 50257);
    assert_eq!(merges.len(), 50000);
    assert_eq!(vocab[50256], b"<|endoftext|>");
    assert_eq!(vocab[0], b"!");
    assert_eq!(merges[0], (b" ".to_vec(), b"t".to_vec()));
    // Saving and loading again gives the same tokenizer.
    let dir = tempfile::tempdir().unwrap();
    save_tokenizer(dir.path(), &vocab, &merges).unwrap();
    assert_eq!(load_tokenizer(dir.path()).unwrap(), (vocab, merges));
}
