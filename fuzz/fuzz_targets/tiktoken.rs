//! tiktoken rank files (`files::tiktoken::load`), with the special tokens of
//! `--special-token` (`TOKEN` or `TOKEN=ID`, one per line of the input's second
//! part). A refusal names the file; reading and building the encoder allocate at
//! most 64 bytes per input byte beyond 1 MiB; an accepted tokenizer encodes and
//! decodes back, and written back by `files::tiktoken::save` reads back the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tinylm_bpe::files::tiktoken;
use tinylm_bpe::pretokenize::Pattern;
use tinylm_fuzz::{parts, read_tokenizer, scratch, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 64,
    fixed: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    let [ranks, specials] = parts::<2>(data);
    let specials: Vec<(String, Option<u32>)> = String::from_utf8_lossy(specials)
        .lines()
        .filter(|line| !line.is_empty())
        .map(|s| match s.rsplit_once('=') {
            Some((name, id)) if !name.is_empty() && id.parse::<u32>().is_ok() => {
                (name.to_string(), id.parse().ok())
            }
            _ => (s.to_string(), None),
        })
        .collect();
    let path = write("ranks.tiktoken", ranks);
    let read = || tiktoken::load(&path, Pattern::Gpt4, &specials);
    let Some(bpe) = read_tokenizer("tiktoken::load", data.len(), BOUND, &[&path], read) else {
        return;
    };
    let back = scratch().join("back.tiktoken");
    tiktoken::save(&back, &bpe).expect("a rank file that was read is written");
    let given: Vec<(String, Option<u32>)> = (bpe.specials.iter())
        .zip(bpe.special_tokens())
        .map(|(&id, text)| (text, Some(id)))
        .collect();
    let again =
        tiktoken::load(&back, Pattern::Gpt4, &given).expect("a written rank file reads back");
    assert_eq!(again, bpe);
});
