//! `.npy` files, header and data: `MappedNpy` (every element read), the training
//! loop's `TokenDataset` (ids checked against a vocabulary, a batch drawn) and
//! `bpe decode`'s `Tokenizer::decode_file`. A refusal names the file; reading
//! allocates at most 4 bytes per input byte beyond 64 KiB (the file is mapped, not
//! read); an accepted array of one or two dimensions written back by `npy::write`
//! reads back the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tinylm::data::{Batch, SplitMix64, TokenDataset};
use tinylm_bpe::npy::{self, Dtype, MappedNpy};
use tinylm_fuzz::{bytes_tokenizer, refused, within, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 4,
    fixed: 64 << 10,
};

fuzz_target!(|data: &[u8]| {
    let path = write("in.npy", data);
    let read = within("MappedNpy::open", data.len(), BOUND, || {
        MappedNpy::open(&path).map(|npy| {
            let values: Vec<i64> = match npy.header.dtype {
                Dtype::F32 => (0..npy.len())
                    .map(|i| npy.f32_at(i).to_bits() as i64)
                    .collect(),
                _ => (0..npy.len()).map(|i| npy.int_at(i)).collect(),
            };
            (npy.header.clone(), npy.data().to_vec(), values)
        })
    });
    let (header, bytes, _values) = match read {
        Ok(read) => read,
        Err(e) => return refused(&e, &path),
    };
    within(
        "TokenDataset::open",
        data.len(),
        BOUND,
        || match TokenDataset::open(&path, 300) {
            Ok(tokens) => {
                let t = 4;
                if tokens.check_context(t).is_ok() {
                    let mut batch = Batch::new(2, t);
                    tokens.fill_random(&mut batch, &mut SplitMix64::new(7));
                    assert!(batch
                        .inputs
                        .iter()
                        .chain(&batch.targets)
                        .all(|&id| id < 300));
                }
            }
            Err(e) => refused(&e, &path),
        },
    );
    within("Tokenizer::decode_file", data.len(), BOUND, || {
        let mut text = Vec::new();
        if let Err(e) = bytes_tokenizer().decode_file(&path, &mut text) {
            refused(&e, &path);
        }
    });
    // What was read, written back, reads back the same.
    if header.shape.len() > 2 {
        return;
    }
    let back = write("back.npy", b"");
    let written = match header.dtype {
        Dtype::U16 => npy::write(&back, &header.shape, &cast(&bytes, u16::from_le_bytes)),
        Dtype::U32 => npy::write(&back, &header.shape, &cast(&bytes, u32::from_le_bytes)),
        Dtype::I32 => npy::write(&back, &header.shape, &cast(&bytes, i32::from_le_bytes)),
        Dtype::I64 => npy::write(&back, &header.shape, &cast(&bytes, i64::from_le_bytes)),
        Dtype::F32 => npy::write(&back, &header.shape, &cast(&bytes, f32::from_le_bytes)),
    };
    written.expect("an array that was read is written");
    let again = MappedNpy::open(&back).expect("a written array reads back");
    assert_eq!(
        (&again.header.shape, again.header.dtype, again.data()),
        (&header.shape, header.dtype, &bytes[..])
    );
});

/// Little-endian values of `N` bytes each.
fn cast<T, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| from(c.try_into().expect("N bytes")))
        .collect()
}
