//! `tinylm bpe train` end to end: files written, summary, and exit code 2 on bad input.

use cli::{failed, stderr, tinylm};
use std::path::Path;
use std::process::Output;

mod cli;

/// Runs `bpe train` on `input` into `out` and returns the process output.
fn train(input: &Path, out: &Path, vocab: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "bpe",
        "train",
        "--input",
        input.to_str().unwrap(),
        "--vocab-size",
        vocab,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    tinylm(&args)
}

fn corpus(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("corpus.txt");
    let doc = "Once upon a time, a little cat sat on the mat. The cat's name was Tom!\n";
    std::fs::write(&path, format!("{doc}<|endoftext|>").repeat(200)).unwrap();
    path
}

#[test]
fn trains_and_writes_gpt2_files_with_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let input = corpus(dir.path());
    let out = dir.path().join("tok");
    let run = train(
        &input,
        &out,
        "280",
        &[
            "--special-token",
            "<|endoftext|>",
            "--special-token",
            "<|endoftext|>",
        ],
    );
    let err = stderr(&run);
    assert!(run.status.success(), "{err}");
    for needle in [
        "23 merges",
        "vocab 280",
        "wall",
        "peak memory",
        "longest token",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
    }
    let (vocab, merges) = tinylm_bpe::files::load_tokenizer(&out).unwrap();
    assert_eq!(vocab.len(), 280);
    assert_eq!(vocab[256], b"<|endoftext|>");
    assert_eq!(merges.len(), 23);
    assert_eq!(
        (vocab, merges),
        tinylm_bpe::train::train_bpe(&input, 280, &["<|endoftext|>".into()]).unwrap()
    );
}

#[test]
fn thread_count_does_not_change_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let input = corpus(dir.path());
    let read = |sub: &str, threads: &str| {
        let out = dir.path().join(sub);
        let run = train(&input, &out, "320", &["--threads", threads]);
        assert!(run.status.success(), "{}", stderr(&run));
        let vocab = std::fs::read(out.join("vocab.json")).unwrap();
        (vocab, std::fs::read(out.join("merges.txt")).unwrap())
    };
    assert_eq!(read("one", "1"), read("two", "2"));
}

#[test]
fn bad_input_exits_2_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = corpus(d);
    let out = d.join("out");
    failed(&train(&d.join("nope.txt"), &out, "300", &[]), &["nope.txt"]);
    failed(&train(d, &out, "300", &[]), &["directory"]);
    failed(
        &train(&input, &out, "256", &["--special-token", "<|endoftext|>"]),
        &["vocab size 256", "257"],
    );
    failed(
        &train(&input, &out, "300", &["--special-token", ""]),
        &["special token must not be empty"],
    );
    failed(
        &train(&input, &input.join("sub"), "300", &[]),
        &["corpus.txt"],
    );
    failed(
        &train(&input, &out, "300", &["--threads", "two"]),
        &["--threads"],
    );
    failed(&train(&input, &out, "many", &[]), &["many"]);
}

#[test]
fn invalid_utf8_names_the_offset_unless_lossy() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.txt");
    let mut bytes = b"hello world, hello there. ".repeat(10);
    bytes[123] = 0xC3; // a lead byte followed by ASCII
    std::fs::write(&input, &bytes).unwrap();
    let out = dir.path().join("out");
    failed(
        &train(&input, &out, "300", &[]),
        &["bad.txt", "byte offset 123", "--lossy"],
    );
    let run = train(&input, &out, "300", &["--lossy"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(out.join("merges.txt").exists());
}
