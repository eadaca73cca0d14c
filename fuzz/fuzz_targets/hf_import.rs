//! `tinylm import hf` (and every command given an exported directory): a
//! `LlamaForCausalLM` directory of `config.json`, `model.safetensors` and, when the
//! third part is not empty, `tokenizer.json`, read by `export::hf::import`. A
//! refusal names the directory or one of its files; reading allocates at most 32
//! bytes per input byte beyond 1 MiB; an accepted model with a tokenizer,
//! exported again by `export::hf::export`, imports the same, bit for bit.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tinylm::export::hf;
use tinylm_fuzz::{fresh_dir, parts, refused, same_bits, within, Bound};

const BOUND: Bound = Bound {
    per_byte: 32,
    fixed: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    let [config, weights, tokenizer] = parts::<3>(data);
    let dir = fresh_dir("hf-in");
    std::fs::write(dir.join("config.json"), config).unwrap();
    std::fs::write(dir.join("model.safetensors"), weights).unwrap();
    if !tokenizer.is_empty() {
        std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
    }
    let imported = within("hf::import", data.len(), BOUND, || hf::import(&dir));
    let imported = match imported {
        Ok(imported) => imported,
        Err(e) => return refused(&e, &dir),
    };
    let Some(tokenizer) = &imported.tokenizer else {
        return;
    };
    let out = fresh_dir("hf-out").join("model");
    hf::export(&imported.config, &imported.params, tokenizer, &out)
        .expect("an imported model is exported");
    let again = hf::import(&out).expect("an exported model imports");
    assert_eq!(
        (&again.config, &again.tokenizer),
        (&imported.config, &imported.tokenizer)
    );
    assert!(
        same_bits(&again.params, &imported.params),
        "the weights differ"
    );
});
