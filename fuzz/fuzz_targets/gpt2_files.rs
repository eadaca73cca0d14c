//! GPT-2 `vocab.json` and `merges.txt` (the input's two parts): `files::Bpe::load`
//! of their directory and `files::gpt2::tokenizer`. A refusal names one of the two
//! files; reading and building the encoder allocate at most 64 bytes per input byte
//! beyond 1 MiB; an accepted tokenizer encodes and decodes back, and written back by
//! `save_vocab` and `save_merges` reads back the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tinylm_bpe::files::{gpt2, load_tokenizer, save_merges, save_vocab, Bpe};
use tinylm_fuzz::{fresh_dir, parts, read_tokenizer, refused_naming, within, Bound};

const BOUND: Bound = Bound {
    per_byte: 64,
    fixed: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    let [vocab, merges] = parts::<2>(data);
    let dir = fresh_dir("gpt2");
    let (vocab_path, merges_path) = (dir.join("vocab.json"), dir.join("merges.txt"));
    std::fs::write(&vocab_path, vocab).unwrap();
    std::fs::write(&merges_path, merges).unwrap();
    let files = [vocab_path.as_path(), merges_path.as_path()];
    let read = || Bpe::load(&dir);
    let bpe = read_tokenizer("Bpe::load and its encoder", data.len(), BOUND, &files, read);
    let specials = ["<|endoftext|>".to_string()];
    let built = within("gpt2::tokenizer", data.len(), BOUND, || {
        gpt2::tokenizer(&vocab_path, &merges_path, &specials).map(|_| ())
    });
    if let Err(e) = built {
        refused_naming(&e, &files);
    }
    let Some(bpe) = bpe else { return };
    let back = fresh_dir("gpt2-back");
    save_vocab(&back.join("vocab.json"), &bpe.vocab)
        .expect("a vocabulary that was read is written");
    save_merges(&back.join("merges.txt"), &bpe.merges).expect("merges that were read are written");
    let again = load_tokenizer(&back).expect("written files read back");
    assert_eq!(again, (bpe.vocab, bpe.merges));
});
