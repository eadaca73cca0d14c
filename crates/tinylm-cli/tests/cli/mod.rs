//! What the CLI suites share: running the `tinylm` binary and reading what it
//! said, and the byte-level corpus and tiny model the training suites use.
#![allow(dead_code)] // each suite uses its own part

use std::path::Path;
use std::process::{Command, Output};
use tinylm_bpe::npy;

/// `tinylm ARGS`, run to its end.
pub fn tinylm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .args(args)
        .output()
        .expect("run tinylm")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// All the process said: its stdout, then its stderr.
pub fn text(out: &Output) -> String {
    stdout(out) + &stderr(out)
}

/// Asserts that `out` exited 0; its stdout.
pub fn succeeded(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(out));
    stdout(out)
}

/// `tinylm eval --checkpoint CHECKPOINT --data DATA` and the flags `extra`, run to
/// its end.
pub fn eval(checkpoint: &Path, data: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "eval",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    tinylm(&args)
}

/// The number printed after `label` in `text`, as in `perplexity 12.3`.
pub fn number_after(text: &str, label: &str) -> f64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {text}"))
        + label.len();
    text[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Asserts that `out` is a usage or input error — exit code 2, no panic — whose
/// message holds each of `needles`; its stderr, trimmed.
pub fn failed(out: &Output, needles: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
    }
    assert!(!err.contains("panicked"), "{err}");
    err.trim().to_string()
}

/// A training configuration (TOML) on [`byte_corpus`]'s files in `dir`, with
/// `settings` (TOML lines) and the [`TINY_MODEL`].
pub fn byte_run(dir: &Path, settings: &str) -> String {
    byte_corpus(dir);
    let data = format!(
        "train_data = \"{0}/train.npy\"\nval_data = \"{0}/val.npy\"\n",
        dir.display()
    );
    data + settings + TINY_MODEL
}

/// Byte-level token files `train.npy` and `val.npy` (9:1) in `dir`, of a little
/// text repeated.
pub fn byte_corpus(dir: &Path) {
    let corpus = "once upon a time a small cat found a red ball in the garden.\n".repeat(80);
    let ids: Vec<u16> = corpus.bytes().map(u16::from).collect();
    let (train, val) = ids.split_at(ids.len() * 9 / 10);
    npy::write(&dir.join("train.npy"), &[train.len()], train).unwrap();
    npy::write(&dir.join("val.npy"), &[val.len()], val).unwrap();
}

/// The `[model]` table of a byte-level model small enough to train in seconds.
pub const TINY_MODEL: &str = "[model]
vocab_size = 256
context_length = 16
d_model = 32
num_layers = 1
num_heads = 2
d_ff = 64
";
