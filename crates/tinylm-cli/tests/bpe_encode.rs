//! `tinylm bpe encode` / `tinylm bpe decode` end to end, and their errors (exit code 2).

use cli::{stderr, tinylm};
use std::path::Path;
use tinylm_bpe::npy::{self, Dtype, MappedNpy};

mod cli;

/// A small tokenizer directory: 256 bytes, `<|endoftext|>`, and a few merges.
fn write_tokenizer(dir: &Path) {
    let pairs = [
        ("t", "h"),
        ("th", "e"),
        (" ", "th"),
        (" th", "e"),
        ("a", "n"),
        (" ", "an"),
        ("o", "r"),
    ];
    let merges: Vec<_> = pairs
        .iter()
        .map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec()))
        .collect();
    let mut vocab: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    vocab.push(b"<|endoftext|>".to_vec());
    vocab.extend(
        merges
            .iter()
            .map(|(l, r)| [l.as_slice(), r.as_slice()].concat()),
    );
    tinylm_bpe::files::save_tokenizer(dir, &vocab, &merges).unwrap();
}

const TEXT: &str = "the cat and the dog<|endoftext|>\nthe    orca ran, ünïcödé 👋!\n<|endoftext|>";

fn ids(path: &Path) -> (Dtype, Vec<u32>) {
    let npy = MappedNpy::open(path).unwrap();
    (
        npy.header.dtype,
        (0..npy.len()).map(|i| npy.int_at(i) as u32).collect(),
    )
}

#[test]
fn encode_then_decode_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let tok_dir = dir.path().join("tok");
    write_tokenizer(&tok_dir);
    let input = dir.path().join("in.txt");
    std::fs::write(&input, TEXT.repeat(50)).unwrap();
    let (tok_dir_s, input_s) = (tok_dir.to_str().unwrap(), input.to_str().unwrap());
    // `bpe encode` of the input into `out`, the tokenizer given by `flags`, with the
    // flags `extra`; asserted to succeed.
    let encode = |flags: &[&str], out: &Path, extra: &[&str]| {
        let files = ["--input", input_s, "--out", out.to_str().unwrap()];
        let run = tinylm(&[&["bpe", "encode"], flags, &files, extra].concat());
        assert!(run.status.success(), "{}", stderr(&run));
        run
    };
    let out = dir.path().join("out.npy");
    let run = encode(&["--tokenizer", tok_dir_s], &out, &[]);
    assert!(
        stderr(&run).contains("bytes/token") && stderr(&run).contains("MB/s"),
        "{}",
        stderr(&run)
    );

    // `<|endoftext|>` is a special token by default when the vocabulary has it.
    let (vocab, merges) = (tok_dir.join("vocab.json"), tok_dir.join("merges.txt"));
    let tok =
        tinylm_bpe::files::gpt2::tokenizer(&vocab, &merges, &["<|endoftext|>".into()]).unwrap();
    let (dtype, got) = ids(&out);
    assert_eq!(dtype, Dtype::U16);
    assert_eq!(got, tok.encode(&TEXT.repeat(50)));
    assert!(got.contains(&256));

    let streamed = dir.path().join("streamed.npy");
    let tokenizer_files = [
        "--vocab",
        vocab.to_str().unwrap(),
        "--merges",
        merges.to_str().unwrap(),
    ];
    encode(&tokenizer_files, &streamed, &["--stream"]);
    assert_eq!(
        std::fs::read(&streamed).unwrap(),
        std::fs::read(&out).unwrap()
    );

    let run = tinylm(&[
        "bpe",
        "decode",
        "--tokenizer",
        tok_dir_s,
        "--input",
        out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(String::from_utf8(run.stdout).unwrap(), TEXT.repeat(50));
}

#[test]
fn bad_inputs_exit_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let tok_dir = dir.path().join("tok");
    write_tokenizer(&tok_dir);
    let t = tok_dir.to_str().unwrap();
    let out = dir.path().join("out.npy");
    let o = out.to_str().unwrap();
    let fails = |args: &[&str], needle: &str| {
        let run = tinylm(args);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", stderr(&run));
        assert!(
            stderr(&run).contains(needle),
            "{args:?}: expected {needle:?} in {}",
            stderr(&run)
        );
    };
    let encode = ["bpe", "encode", "--tokenizer", t, "--out", o];
    fails(
        &[&encode[..], &["--input", "/no/such.txt"]].concat(),
        "/no/such.txt",
    );
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, b"fine text \xff\xfe").unwrap();
    let bad = bad.to_str().unwrap();
    fails(&[&encode[..], &["--input", bad]].concat(), "byte 10");
    let streamed = ["--input", bad, "--stream"];
    fails(&[&encode[..], &streamed].concat(), "byte 10");
    fails(
        &["bpe", "encode", "--input", bad, "--out", o],
        "--tokenizer",
    );

    let ids = dir.path().join("ids.npy");
    let decode = [
        "bpe",
        "decode",
        "--tokenizer",
        t,
        "--input",
        ids.to_str().unwrap(),
    ];
    npy::write(&ids, &[3], &[1u16, 9999, 2]).unwrap();
    fails(&decode, "token id 9999");
    npy::write(&ids, &[2], &[0.5f32, 1.0]).unwrap();
    fails(&decode, "<f4");
    std::fs::write(&ids, b"not npy").unwrap();
    fails(&decode, "ids.npy");

    std::fs::write(tok_dir.join("merges.txt"), "#version: 0.2\nt h\nt h e\n").unwrap();
    fails(&decode, "merges.txt:3");
    std::fs::write(tok_dir.join("merges.txt"), "#version: 0.2\nt h\nq zz\n").unwrap();
    fails(&decode, "merge 2");
}
