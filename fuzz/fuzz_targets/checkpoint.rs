//! Training checkpoints (safetensors, header and data): `CheckpointFile::open` and
//! `load` (weights, moments, metadata), and `weights::open` as `forward`, `eval`,
//! `generate` and `export` read one. A refusal names the file; reading allocates
//! at most 16 bytes per input byte beyond 1 MiB (values are read as f32, twice the
//! size of F16 and BF16 ones); an accepted checkpoint written back by
//! `checkpoint::save` reads back the same, bit for bit.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use tinylm::checkpoint::{self, CheckpointFile};
use tinylm::weights;
use tinylm_fuzz::{refused, same_bits, scratch, within, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 16,
    fixed: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    let path = write("checkpoint.safetensors", data);
    let read = within("weights::open and load", data.len(), BOUND, || {
        weights::open(&path, None).and_then(|w| w.load())
    });
    if let Err(e) = &read {
        refused(e, &path);
    }
    let loaded = within("CheckpointFile::open and load", data.len(), BOUND, || {
        CheckpointFile::open(&path).and_then(|c| c.load())
    });
    let ckpt = match loaded {
        Ok(ckpt) => ckpt,
        Err(e) => return refused(&e, &path),
    };
    let weights = read.expect("the weights of a checkpoint that reads are read");
    assert!(same_bits(&weights.params, &ckpt.params) && weights.config == ckpt.config);

    let extra: BTreeMap<String, String> = (ckpt.metadata.iter())
        .filter(|(k, _)| !["format", "config", "optimizer"].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let back = scratch().join("back.safetensors");
    checkpoint::save(
        &back,
        &ckpt.config,
        &ckpt.params,
        ckpt.optimizer.as_ref(),
        &extra,
    )
    .expect("a checkpoint that was read is written");
    let again = checkpoint::load(&back).expect("a written checkpoint reads back");
    assert_eq!(again.config, ckpt.config);
    assert!(same_bits(&again.params, &ckpt.params), "the weights differ");
    match (&again.optimizer, &ckpt.optimizer) {
        (Some(a), Some(b)) => {
            assert_eq!((a.hp, a.step, &a.covers), (b.hp, b.step, &b.covers));
            assert!(
                same_bits(&a.m, &b.m) && same_bits(&a.v, &b.v),
                "the moments differ"
            );
        }
        (None, None) => {}
        _ => panic!("the optimizer state is lost or gained"),
    }
    for (key, value) in &extra {
        assert_eq!(again.metadata.get(key), Some(value), "metadata {key}");
    }
});
