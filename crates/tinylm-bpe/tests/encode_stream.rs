//! Streaming and parallel encoding give exactly the ids of `encode` on the whole text.

mod encode_gpt2;

use encode_gpt2::{generated_text, gpt2, tokenizer, EOT};
use proptest::prelude::*;
use std::io::Read;
use std::sync::OnceLock;
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::npy::{Dtype, MappedNpy};
use tinylm_bpe::pretokenize::Pattern;

/// GPT-2 with specials that overlap each other and whitespace: `\n\n` cuts whitespace
/// runs, `<|endoftext|><|endoftext|>` extends `<|endoftext|>`.
fn with_specials() -> &'static Tokenizer {
    static CELL: OnceLock<Tokenizer> = OnceLock::new();
    CELL.get_or_init(|| tokenizer(&[EOT, "<|endoftext|><|endoftext|>", "\n\n", "<|pad|>"]))
}

/// The same tokenizer under each named split pattern and a custom regex (which may
/// look behind, so its text is final only at special tokens).
fn every_pattern() -> &'static [Tokenizer] {
    static CELL: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    CELL.get_or_init(|| {
        let custom = r"(?<=[a-z])[a-z]+|\p{N}{1,2}|\s+|.";
        Pattern::NAMES
            .iter()
            .copied()
            .chain([custom])
            .map(|p| {
                with_specials()
                    .clone()
                    .with_pattern(Pattern::parse(p).unwrap())
            })
            .collect()
    })
}

/// `text` cut at the given byte positions, each moved back to a char boundary.
fn chunks(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut cuts: Vec<usize> = cuts
        .iter()
        .map(|&c| text.floor_char_boundary(c % (text.len() + 1)))
        .collect();
    cuts.push(0);
    cuts.push(text.len());
    cuts.sort();
    cuts.windows(2)
        .map(|w| text[w[0]..w[1]].to_string())
        .collect()
}

/// A reader that returns the bytes in reads of the given sizes (splitting characters).
struct Trickle<'a> {
    bytes: &'a [u8],
    sizes: Vec<usize>,
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = self.sizes[self.step % self.sizes.len()].max(1);
        self.step += 1;
        let n = size.min(buf.len()).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

fn tricky_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => "[a-z]{1,6}",
        3 => "[ \t\n\r]{1,5}",
        1 => "['.,!0-9]{1,3}",
        1 => "'(s|t|ll|ve|re|l|v|r)",
        2 => Just(EOT.to_string()),
        1 => Just("<|endoftext".to_string()),
        1 => Just("<|pad|>".to_string()),
        1 => Just("<|".to_string()),
        1 => "[\u{a0}\u{3000}\u{85}é中👋]{1,2}",
        1 => "[A-Z]{1,3}[a-z]{0,2}",
        1 => "'(S|T|LL|ſ)",
        1 => "[0-9]{1,7}",
        1 => "[\r\n/ʰǅ\u{301}]{1,3}",
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn stream_equals_encode_for_any_chunking(
        text in tricky_text(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        for tok in every_pattern() {
            let whole = tok.encode(&text);
            let streamed: Vec<u32> = tok.encode_iter(chunks(&text, &cuts)).collect();
            prop_assert_eq!(&streamed, &whole, "{}", tok.pattern().name());
        }
        let plain = gpt2();
        let streamed: Vec<u32> = plain.encode_iter(chunks(&text, &cuts)).collect();
        prop_assert_eq!(streamed, plain.encode(&text));
    }

    #[test]
    fn reader_equals_encode_for_any_read_sizes(
        text in tricky_text(),
        sizes in prop::collection::vec(1usize..9, 1..6),
    ) {
        for tok in every_pattern() {
            let reader = Trickle { bytes: text.as_bytes(), sizes: sizes.clone(), step: 0 };
            let ids: Vec<u32> = tok.encode_reader(reader).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(ids, tok.encode(&text), "{}", tok.pattern().name());
        }
    }

    #[test]
    fn parallel_equals_encode(text in tricky_text(), chunk_bytes in 1usize..40) {
        for tok in every_pattern() {
            let mut ids = Vec::new();
            let mut covered = 0;
            tok.encode_parallel(&text, chunk_bytes, |chunk, n| {
                ids.extend_from_slice(chunk);
                covered += n;
                Ok(())
            }).unwrap();
            prop_assert_eq!(covered, text.len());
            prop_assert_eq!(ids, tok.encode(&text), "{}", tok.pattern().name());
        }
    }
}

#[test]
fn every_cut_of_tricky_strings() {
    for tok in every_pattern() {
        for text in [
            "a   b\n\n\n  c",
            "it'll we've they're 'l 'v",
            "<|endoftext|><|endoftext|><|endoftext|>x<|endoftext|",
            "x<|endoftext|>\n\n \n\n\n<|pad|><|pa",
            "  \u{a0} \u{3000}\t\r\n 中文 👋🏽!!",
            "HTTPServer can'T 1234567 a\r\n \n/x ʰAB x\u{301}",
        ] {
            let whole = tok.encode(text);
            for i in 0..=text.len() {
                for j in i..=text.len() {
                    let got: Vec<u32> = tok.encode_iter(chunks(text, &[i, j])).collect();
                    assert_eq!(
                        got,
                        whole,
                        "{}: text {text:?} cut at {i} and {j}",
                        tok.pattern().name()
                    );
                }
            }
            let one_char_each: Vec<String> = text.chars().map(String::from).collect();
            assert_eq!(tok.encode_iter(one_char_each).collect::<Vec<_>>(), whole);
        }
    }
}

#[test]
fn stream_holds_back_little_text() {
    let tok = gpt2();
    let mut stream = tok.stream();
    let mut ids = Vec::new();
    let text = generated_text(5, 100_000);
    for chunk in chunks(&text, &(1..400).map(|i| i * 1_777).collect::<Vec<_>>()) {
        stream.push(&chunk, &mut ids);
        assert!(
            stream.pending_len() < 2_000,
            "{} bytes pending",
            stream.pending_len()
        );
    }
    stream.finish(&mut ids);
    assert_eq!(ids, tok.encode(&text));
}

#[test]
fn reader_reports_invalid_utf8_with_its_offset() {
    let bytes = b"hello world \xff rest".to_vec();
    let reader = Trickle {
        bytes: &bytes,
        sizes: vec![5],
        step: 0,
    };
    let err = gpt2()
        .encode_reader(reader)
        .find_map(Result::err)
        .unwrap()
        .to_string();
    assert!(err.contains("byte 12"), "{err}");
    let truncated = "ab€".as_bytes();
    let reader = Trickle {
        bytes: &truncated[..truncated.len() - 1],
        sizes: vec![64],
        step: 0,
    };
    assert!(gpt2().encode_reader(reader).any(|r| r.is_err()));
}

#[test]
fn file_encoding_equals_encode_on_two_threads() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("text.txt");
    let output = dir.path().join("ids.npy");
    let text = generated_text(9, 600_000);
    std::fs::write(&input, &text).unwrap();
    let mut last = 0;
    let summary = gpt2()
        .encode_file(&input, &output, 2, |done| last = done)
        .unwrap();
    assert_eq!(last, text.len());
    let want = gpt2().encode(&text);
    assert_eq!((summary.bytes, summary.tokens), (text.len(), want.len()));
    let npy = MappedNpy::open(&output).unwrap();
    assert_eq!(npy.header.dtype, Dtype::U16);
    let got: Vec<u32> = (0..npy.len()).map(|i| npy.int_at(i) as u32).collect();
    assert_eq!(got, want);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 2, "text.txt and ids.npy only: {names:?}");

    std::fs::write(&input, b"ok \xc3\x28").unwrap();
    let err = gpt2()
        .encode_file(&input, &output, 2, |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("text.txt") && err.contains("byte 3"), "{err}");
    std::fs::write(&input, b"").unwrap();
    assert_eq!(
        gpt2()
            .encode_file(&input, &output, 1, |_| {})
            .unwrap()
            .tokens,
        0
    );
}

#[test]
fn batch_equals_encode_of_each_text() {
    let texts: Vec<String> = (0..200u64)
        .map(|i| generated_text(i, 30 + i as usize * 7))
        .collect();
    for tok in every_pattern() {
        let want: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t)).collect();
        assert_eq!(tok.encode_batch(&texts), want, "{}", tok.pattern().name());
    }
}
