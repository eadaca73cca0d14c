//! Hugging Face `tokenizer.json` (`files::hf::load`). A refusal names the file;
//! reading and building the encoder allocate at most 64 bytes per input byte
//! beyond 1 MiB; an accepted tokenizer encodes and decodes back, and written back
//! by `files::hf::save` reads back the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tinylm_bpe::files::hf;
use tinylm_fuzz::{read_tokenizer, scratch, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 64,
    fixed: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    let path = write("tokenizer.json", data);
    let read = || hf::load(&path);
    let Some(bpe) = read_tokenizer("hf::load", data.len(), BOUND, &[&path], read) else {
        return;
    };
    let back = scratch().join("back.json");
    hf::save(&back, &bpe).expect("a tokenizer that was read is written");
    assert_eq!(
        hf::load(&back).expect("a written tokenizer reads back"),
        bpe
    );
});
