//! BPE training on any bytes (the input after its first two bytes, which pick the
//! split pattern, lossy UTF-8 and a chunk size): `train_bpe_with` on the file.
//! Invalid UTF-8 is refused naming the file (unless lossy), nothing else is;
//! training allocates at most 256 bytes per input byte beyond 8 MiB; the trained
//! tokenizer encodes the text and decodes it back; differential: counting the
//! pre-tokens in chunks of about the chosen size gives the counts of the whole
//! text, and `train_from_texts` on the text gives the file's vocabulary and merges.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::pretokenize::Pattern;
use tinylm_bpe::train::{count_pretokens, train_bpe_with, train_from_texts, TrainOptions};
use tinylm_fuzz::{refused, within, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 256,
    fixed: 8 << 20,
};

fuzz_target!(|data: &[u8]| {
    let [choice, size, bytes @ ..] = data else {
        return;
    };
    let pattern = [Pattern::Gpt2, Pattern::Gpt4, Pattern::O200k][*choice as usize % 3].clone();
    let options = TrainOptions {
        pattern: &pattern,
        lossy_utf8: choice & 0x80 != 0,
        progress: None,
    };
    let specials = vec!["<|endoftext|>".to_string()];
    let vocab_size = 256 + specials.len() + 64;
    let path = write("corpus.txt", bytes);
    let utf8 = std::str::from_utf8(bytes).is_ok();
    let trained = within("train_bpe_with", bytes.len(), BOUND, || {
        train_bpe_with(&path, vocab_size, &specials, options)
    });
    let (vocab, merges) = match trained {
        Ok(trained) => trained,
        Err(e) => {
            refused(&e, &path);
            assert!(!utf8 && !options.lossy_utf8, "refused: {e}");
            return;
        }
    };
    assert!(utf8 || options.lossy_utf8, "invalid UTF-8 was accepted");
    assert!(vocab.len() <= vocab_size && vocab.len() == 256 + specials.len() + merges.len());
    let text = String::from_utf8_lossy(bytes);
    let tokenizer = Tokenizer::new(vocab.clone(), &merges, &specials)
        .expect("a trained tokenizer builds")
        .with_pattern(pattern.clone());
    let ids = tokenizer.encode(&text);
    assert!(tokenizer.decode_bytes(&ids).unwrap() == text.as_bytes());

    let chunk = 1 + *size as usize % 64;
    let chunked = count_pretokens(bytes, &specials, chunk, options).unwrap();
    let whole = count_pretokens(bytes, &specials, usize::MAX, options).unwrap();
    assert!(
        chunked == whole,
        "counting in chunks of about {chunk} bytes differs"
    );
    let from_texts = train_from_texts([&*text], vocab_size, &specials, options, 1 << 20).unwrap();
    assert!(from_texts == (vocab, merges), "train_from_texts differs");
});
