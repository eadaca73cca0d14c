//! Split patterns and tokenizer formats through the CLI: `bpe train --pattern`, the
//! pattern read back from the directory, `bpe export`, `--tiktoken`, `--tokenizer-json`,
//! and their errors (one line naming the file and entry, exit code 2, nothing written).

use cli::{failed, succeeded, tinylm};
use std::path::Path;
use std::process::Command;
use tinylm_bpe::npy::MappedNpy;

mod cli;

fn ids(path: &Path) -> Vec<u32> {
    let npy = MappedNpy::open(path).unwrap();
    (0..npy.len()).map(|i| npy.int_at(i) as u32).collect()
}

const TEXT: &str = "HTTPServer said: it's 12345 o'clock, DON'T you KNOW?\r\n  (quoted) \"words\" \
                    and/or path/to/file.rs\n\n\tcamelCase ǅungla ÉCOLE école 數字١٢٣ 👋🏽<|endoftext|>";

#[test]
fn trained_pattern_travels_with_the_tokenizer_and_through_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    let s = |name: &str| p(name).to_string_lossy().into_owned();
    std::fs::write(p("in.txt"), TEXT.repeat(40)).unwrap();
    for pattern in ["gpt2", "gpt4", "o200k", r"\p{L}+|\p{N}|\s+|."] {
        let tok = s("tok");
        let _ = std::fs::remove_dir_all(&tok);
        succeeded(&tinylm(&[
            "bpe",
            "train",
            "--input",
            &s("in.txt"),
            "--vocab-size",
            "400",
            "--special-token",
            "<|endoftext|>",
            "--pattern",
            pattern,
            "--out",
            &tok,
        ]));
        assert!(p("tok/tokenizer.json").exists());
        let encode = |source: &[&str], out: &str| {
            let mut args = vec!["bpe", "encode", "--input", "in.txt", "--out", out];
            args.extend_from_slice(source);
            succeeded(
                &Command::new(env!("CARGO_BIN_EXE_tinylm"))
                    .args(&args)
                    .current_dir(dir.path())
                    .output()
                    .unwrap(),
            );
            ids(&p(out))
        };
        let want = encode(&["--tokenizer", "tok"], "dir.npy");
        // The directory's tokenizer.json gives the pattern: forcing GPT-2's changes ids
        // (for the other patterns), and the plain vocab.json + merges.txt need it given.
        let plain = encode(
            &[
                "--vocab",
                "tok/vocab.json",
                "--merges",
                "tok/merges.txt",
                "--pattern",
                pattern,
            ],
            "plain.npy",
        );
        assert_eq!(plain, want, "{pattern}");
        let export = |format, out: &str| {
            let args = [
                "bpe",
                "export",
                "--tokenizer",
                &tok,
                "--format",
                format,
                "--out",
                out,
            ];
            succeeded(&tinylm(&args));
        };
        export("tiktoken", &s("t.tiktoken"));
        let ranks = encode(
            &[
                "--tiktoken",
                "t.tiktoken",
                "--pattern",
                pattern,
                "--special-token",
                "<|endoftext|>=256",
            ],
            "ranks.npy",
        );
        assert_eq!(ranks, want, "{pattern} through tiktoken");
        export("hf", &s("t.json"));
        assert_eq!(
            encode(&["--tokenizer-json", "t.json"], "json.npy"),
            want,
            "{pattern} through tokenizer.json"
        );
        if pattern != "gpt2" {
            let err = failed(
                &tinylm(&[
                    "bpe",
                    "encode",
                    "--tokenizer",
                    &tok,
                    "--pattern",
                    "gpt2",
                    "--input",
                    &s("in.txt"),
                    "--out",
                    &s("x.npy"),
                ]),
                &[],
            );
            assert!(
                err.contains("tokenizer.json") && err.contains("--force-pattern"),
                "{err}"
            );
            assert!(!p("x.npy").exists());
            let forced = encode(
                &["--tokenizer", "tok", "--pattern", "gpt2", "--force-pattern"],
                "forced.npy",
            );
            assert_ne!(forced, want, "{pattern}");
        }
    }
}

#[test]
fn bad_patterns_and_files_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    std::fs::write(p("in.txt"), TEXT).unwrap();
    let err = failed(
        &tinylm(&[
            "bpe",
            "train",
            "--input",
            &p("in.txt"),
            "--vocab-size",
            "300",
            "--pattern",
            r"(\p{L}+",
            "--out",
            &p("tok"),
        ]),
        &[],
    );
    assert!(
        err.contains(r#""(\\p{L}+""#) && err.contains("at byte"),
        "{err}"
    );
    assert!(!dir.path().join("tok/vocab.json").exists());
    let cases: [(&str, &str, &str); 3] = [
        ("dup.tiktoken", "IQ== 0\nIg== 0\n", "rank 0"),
        ("b64.tiktoken", "IQ== 0\n*** 1\n", ":2:"),
        (
            "wordpiece.json",
            r#"{"model": {"type": "WordPiece", "vocab": {}}}"#,
            "model.type",
        ),
    ];
    for (name, contents, entry) in cases {
        std::fs::write(p(name), contents).unwrap();
        let source = if name.ends_with(".json") {
            "--tokenizer-json"
        } else {
            "--tiktoken"
        };
        let err = failed(
            &tinylm(&[
                "bpe",
                "encode",
                source,
                &p(name),
                "--pattern",
                "gpt2",
                "--input",
                &p("in.txt"),
                "--out",
                &p("o.npy"),
            ]),
            &[],
        );
        assert!(
            err.contains(name) && err.contains(entry) && !err.contains('\n'),
            "{name}: {err}"
        );
        assert!(!dir.path().join("o.npy").exists());
    }
}
