//! `Tokenizer::encode`/`decode` against tiktoken's GPT-2, and clear errors on bad input.

mod common;
mod encode_gpt2;

use common::{merges_of, vocab_of};
use encode_gpt2::{generated_text, gpt2, reference, tokenizer, EOT, EOT_ID};
use proptest::prelude::*;
use std::fmt::{Debug, Display};
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::npy;

/// Asserts that `result` is an error whose message holds each of `needles`.
fn assert_error<T: Debug>(result: Result<T, impl Display>, needles: &[&str]) {
    let err = result.unwrap_err().to_string();
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
}

fn expected(text: &str) -> Vec<u32> {
    reference().encode_with_special_tokens(text)
}

#[test]
fn equals_tiktoken_on_examples() {
    for text in [
        "",
        "a",
        " ",
        "\n",
        "é",
        "中",
        "👋",
        "\u{0}",
        "\u{10FFFF}",
        "Hello, world!",
        "Once upon a time, there was a little girl named Lily. She loved to play outside.",
        "It's 2024 and we're   testing... don't you'll I'd they've",
        "  leading and trailing spaces  ",
        "tabs\tand\r\nnewlines\n\n\n  indented",
        "Zürich naïve café — “quotes” ½ x² ١٢٣",
        "日本語のテキストと中文 한국어 Здравствуйте مرحبا",
        "emoji 👋🏽 family 👨‍👩‍👧 flags 🇫🇷!",
        "=====  -----  ......  !!!???",
        "antidisestablishmentarianism supercalifragilisticexpialidocious",
    ] {
        assert_eq!(gpt2().encode(text), expected(text), "text {text:?}");
    }
}

#[test]
fn every_single_character_equals_tiktoken() {
    let chars = (0u32..0x3000)
        .chain((0x1F300..0x1F700).step_by(7))
        .filter_map(char::from_u32);
    for c in chars {
        let text = c.to_string();
        assert_eq!(
            gpt2().encode(&text),
            expected(&text),
            "char U+{:04X}",
            c as u32
        );
    }
}

#[test]
fn specials_become_their_id() {
    let text = format!("a story.{EOT}\nNext{EOT}{EOT} one{EOT}");
    let ids = gpt2().encode(&text);
    assert_eq!(ids, expected(&text));
    assert_eq!(ids.iter().filter(|&&id| id == EOT_ID).count(), 4);
    assert_eq!(gpt2().encode("<|endoftext"), expected("<|endoftext"));
}

#[test]
fn overlapping_specials_take_the_longest_match() {
    let double = format!("{EOT}{EOT}");
    let tok = tokenizer(&[EOT, &double]);
    assert_eq!(tok.vocab_size(), 50258, "the double special is appended");
    let ordinary = |s: &str| reference().encode_ordinary(s);
    let text = format!("a{EOT}{EOT}b{EOT}{EOT}{EOT}c{EOT}");
    let mut want = ordinary("a");
    want.push(50257);
    want.extend(ordinary("b"));
    want.extend([50257, EOT_ID]);
    want.extend(ordinary("c"));
    want.push(EOT_ID);
    assert_eq!(tok.encode(&text), want);
    assert_eq!(tok.decode(&want).unwrap(), text);
}

#[test]
fn large_generated_text_equals_tiktoken() {
    let text = generated_text(7, 200_000);
    assert!(text.len() > 1_000_000);
    assert_eq!(gpt2().encode(&text), expected(&text));
}

#[test]
fn real_text_equals_tiktoken() {
    let stories = tinylm_corpus::tinystories();
    let corpus_en = include_str!("fixtures/cs336/corpus.en");
    for (name, text) in [("TinyStories", stories.as_str()), ("corpus.en", corpus_en)] {
        assert_eq!(gpt2().encode(text), expected(text), "{name}");
    }
}

fn text_strategy() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[a-zA-Z]{1,12}",
        2 => "[ \t\n\r]{1,4}",
        2 => "['.,!?;:0-9\\-]{1,3}",
        1 => Just(EOT.to_string()),
        1 => Just("<|".to_string()),
        1 => "'(s|t|ll|ve|re|d|m|LL)",
        2 => any::<String>().prop_map(|s| s.chars().take(3).collect()),
        1 => "[\u{a0}\u{3000}\u{2028}\u{85}\u{301}½é中👋]{1,3}",
    ];
    prop::collection::vec(piece, 0..80).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn varied_text_equals_tiktoken(text in text_strategy()) {
        prop_assert_eq!(gpt2().encode(&text), expected(&text));
    }

    #[test]
    fn long_pieces_equal_tiktoken(
        text in prop_oneof!["[a-zA-Z]{60,1500}", "[0-9]{60,1500}", "[=+*#!.-]{60,1500}", "[a-z ]{1,3}[\n ]{60,300}[a-z]"],
    ) {
        prop_assert_eq!(gpt2().encode(&text), expected(&text));
    }

    #[test]
    fn decode_inverts_encode(text in any::<String>()) {
        prop_assert_eq!(gpt2().decode(&gpt2().encode(&text)).unwrap(), text);
    }

    #[test]
    fn decode_equals_tiktoken(ids in prop::collection::vec(0u32..50257, 0..40)) {
        let bytes = reference().decode_bytes(&ids).unwrap();
        prop_assert_eq!(gpt2().decode_bytes(&ids).unwrap(), bytes.clone());
        prop_assert_eq!(gpt2().decode(&ids).unwrap(), String::from_utf8_lossy(&bytes));
    }
}

#[test]
fn decode_replaces_malformed_utf8() {
    // GPT-2 tokens 0..256 are single bytes; 0xE4 0xB8 starts a 3-byte character.
    let id = |b: u8| gpt2().encode(&String::from(b as char)).first().copied();
    let e4 = (0..256u32)
        .find(|&i| gpt2().decode_bytes(&[i]).unwrap() == [0xE4])
        .unwrap();
    let a = id(b'a').unwrap();
    assert_eq!(gpt2().decode(&[a, e4, a]).unwrap(), "a\u{FFFD}a");
}

#[test]
fn decode_names_an_id_out_of_range() {
    assert_error(gpt2().decode(&[10, 50257]), &["50257", "out of range"]);
}

fn byte_vocab() -> Vec<Vec<u8>> {
    (0..=255u8).map(|b| vec![b]).collect()
}

#[test]
fn small_trained_tokenizer_applies_merges_in_rank_order() {
    // The CS336 example merges: `s t`, `e st`, `o w`, `l ow`, `w est`, `n e`, `ne west`.
    let merges = merges_of(&[
        ("s", "t"),
        ("e", "st"),
        ("o", "w"),
        ("l", "ow"),
        ("w", "est"),
        ("n", "e"),
        ("ne", "west"),
    ]);
    let tok = Tokenizer::new(vocab_of(&[], &merges), &merges, &["<|eot|>".to_string()]).unwrap();
    assert_eq!(tok.vocab_size(), 256 + 7 + 1);
    let ids = tok.encode("newest lowest<|eot|>");
    let pieces: Vec<String> = ids.iter().map(|&i| tok.decode(&[i]).unwrap()).collect();
    assert_eq!(pieces, ["newest", " ", "low", "est", "<|eot|>"]);
}

#[test]
fn bad_vocabularies_and_merges_are_clear_errors() {
    let merges = vec![(b"a".to_vec(), b"b".to_vec())];
    assert_error(
        Tokenizer::new(byte_vocab(), &merges, &[]),
        &["merge 1", "\"ab\""],
    );
    let merges = vec![(b"q".to_vec(), b"zz".to_vec())];
    assert_error(
        Tokenizer::new(byte_vocab(), &merges, &[]),
        &["\"zz\"", "not in the vocabulary"],
    );
    assert_error(
        Tokenizer::new(byte_vocab()[1..].to_vec(), &vec![], &[]),
        &["0x00"],
    );
    assert_error(
        Tokenizer::new(byte_vocab(), &vec![], &[String::new()]),
        &["empty"],
    );
}

#[test]
fn from_files_reads_gpt2_files_and_reports_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (vocab, merges) = encode_gpt2::vocab_and_merges();
    tinylm_bpe::files::save_tokenizer(dir.path(), vocab, merges).unwrap();
    let (v, m) = (dir.path().join("vocab.json"), dir.path().join("merges.txt"));
    let tok = tinylm_bpe::files::gpt2::tokenizer(&v, &m, &[EOT.to_string()]).unwrap();
    let text = generated_text(3, 2_000);
    assert_eq!(tok.encode(&text), expected(&text));

    std::fs::write(&m, "#version: 0.2\nĠ t\nbad\n").unwrap();
    assert_error(
        tinylm_bpe::files::gpt2::tokenizer(&v, &m, &[]),
        &["merges.txt:3"],
    );
    std::fs::write(&m, "#version: 0.2\nĠ t\nq zzzzzzz\n").unwrap();
    assert_error(
        tinylm_bpe::files::gpt2::tokenizer(&v, &m, &[]),
        &["merge 2", "zzzzzzz"],
    );
    std::fs::write(&v, "{\"a\": 0,\n \"b\": }").unwrap();
    assert_error(
        tinylm_bpe::files::gpt2::tokenizer(&v, &m, &[]),
        &["vocab.json", "line 2"],
    );
    assert_error(
        tinylm_bpe::files::gpt2::tokenizer(&dir.path().join("none.json"), &m, &[]),
        &["none.json"],
    );
}

#[test]
fn decode_file_checks_dtype_and_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.npy");
    let text = generated_text(11, 50_000);
    let ids = gpt2().encode(&text);
    let narrow: Vec<u16> = ids.iter().map(|&i| i as u16).collect();
    npy::write(&path, &[narrow.len()], &narrow).unwrap();
    let mut out = Vec::new();
    assert_eq!(gpt2().decode_file(&path, &mut out).unwrap(), ids.len());
    assert_eq!(String::from_utf8(out).unwrap(), text);

    npy::write(&path, &[3], &[1i64, -4, 2]).unwrap();
    assert_error(
        gpt2().decode_file(&path, &mut Vec::new()),
        &["-4", "index 1"],
    );
    npy::write(&path, &[2], &[1.0f32, 2.0]).unwrap();
    assert_error(gpt2().decode_file(&path, &mut Vec::new()), &["<f4"]);

    // A vocabulary of more than 65,536 tokens does not fit uint16.
    let mut vocab = byte_vocab();
    vocab.extend((0..70_000u32).map(|i| format!("tok{i}").into_bytes()));
    let big = Tokenizer::new(vocab, &vec![], &[]).unwrap();
    npy::write(&path, &[2], &[1u16, 2]).unwrap();
    assert_error(big.decode_file(&path, &mut Vec::new()), &["<u2", "70256"]);
}
