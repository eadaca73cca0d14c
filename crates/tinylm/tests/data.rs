//! Token datasets: uniform batch sampling, the validation pass and bad files.

use std::path::{Path, PathBuf};
use tinylm::data::{Batch, SplitMix64, TokenDataset};
use tinylm_bpe::npy;

fn write_npy<T: npy::NpyElement>(dir: &Path, name: &str, data: &[T]) -> PathBuf {
    let path = dir.join(name);
    npy::write(&path, &[data.len()], data).unwrap();
    path
}

/// Pearson's chi-square statistic of `counts` against a uniform distribution.
fn chi_square(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

#[test]
fn batch_starts_cover_every_index_uniformly() {
    let dir = tempfile::tempdir().unwrap();
    // x[i] = i, so a row's first input is its start index.
    let (n, t, b) = (80usize, 30usize, 8usize);
    let ids: Vec<u16> = (0..n as u16).collect();
    let data = TokenDataset::open(&write_npy(dir.path(), "x.npy", &ids), n).unwrap();
    let starts = n - t; // s ∈ [0, n − T)
    let mut counts = vec![0u64; starts];
    let mut rng = SplitMix64::new(42);
    let mut batch = Batch::new(b, t);
    for _ in 0..12_500 {
        data.fill_random(&mut batch, &mut rng);
        for row in 0..b {
            let s = batch.inputs[row * t] as usize;
            counts[s] += 1;
            let expect: Vec<u32> = (s..s + t).map(|i| i as u32).collect();
            let shifted: Vec<u32> = expect.iter().map(|x| x + 1).collect();
            assert_eq!(batch.inputs[row * t..(row + 1) * t], expect[..]);
            assert_eq!(batch.targets[row * t..(row + 1) * t], shifted[..]);
        }
    }
    // 49 degrees of freedom: mean 49, sd ≈ 9.9; 100 is beyond the 0.9999 quantile.
    let stat = chi_square(&counts);
    assert!(stat < 100.0, "chi-square {stat}: not uniform");
    assert!(counts.iter().all(|&c| c > 0));
    // The threshold has teeth: a sampler with modulo bias from 8 random bits fails it,
    // and so does one that never draws the last start index.
    let mut biased = vec![0u64; starts];
    let mut short = vec![0u64; starts];
    let mut r = SplitMix64::new(42);
    for _ in 0..100_000 {
        biased[((r.next_u64() >> 56) % starts as u64) as usize] += 1;
        short[r.below(starts as u64 - 1) as usize] += 1;
    }
    assert!(chi_square(&biased) > 100.0);
    assert!(chi_square(&short) > 100.0);
}

#[test]
fn same_seed_same_batches_for_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = (0..1000).map(|i| (i * 7919) % 500).collect();
    let paths = [
        write_npy(
            dir.path(),
            "a.npy",
            &ids.iter().map(|&x| x as u16).collect::<Vec<_>>(),
        ),
        write_npy(
            dir.path(),
            "b.npy",
            &ids.iter().map(|&x| x as u32).collect::<Vec<_>>(),
        ),
        write_npy(
            dir.path(),
            "c.npy",
            &ids.iter().map(|&x| x as i32).collect::<Vec<_>>(),
        ),
        write_npy(dir.path(), "d.npy", &ids),
    ];
    let batches: Vec<Batch> = paths
        .iter()
        .map(|p| {
            let data = TokenDataset::open(p, 500).unwrap();
            data.get_batch(&mut SplitMix64::new(9), 4, 16).unwrap()
        })
        .collect();
    assert!(batches.windows(2).all(|w| w[0] == w[1]));
    let mut again = SplitMix64::new(9);
    let other = TokenDataset::open(&paths[0], 500).unwrap();
    assert_eq!(other.get_batch(&mut again, 4, 16).unwrap(), batches[0]);
    assert_ne!(other.get_batch(&mut again, 4, 16).unwrap(), batches[0]);
}

#[test]
fn validation_windows_are_sequential() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u16> = (0..10).collect();
    let data = TokenDataset::open(&write_npy(dir.path(), "v.npy", &ids), 10).unwrap();
    let t = 3;
    assert_eq!(data.num_windows(t), 3); // starts 0, 3, 6; the last target is x[9]
    let mut batch = Batch::new(2, t);
    assert_eq!(data.fill_windows(&mut batch, 0), 2);
    assert_eq!(batch.inputs, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(batch.targets, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(data.fill_windows(&mut batch, 2), 1);
    assert_eq!(
        (&batch.inputs[..3], &batch.targets[..3]),
        (&[6, 7, 8][..], &[7, 8, 9][..])
    );
    assert_eq!(data.fill_windows(&mut batch, 3), 0);
}

#[test]
fn bad_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    // An id at or above the vocabulary, deep in a large file (the parallel check).
    let mut ids = vec![5u32; 300_000];
    ids[200_001] = 1000;
    ids[250_000] = 2000;
    let p = write_npy(dir.path(), "big.npy", &ids);
    let e = TokenDataset::open(&p, 1000).err().unwrap().to_string();
    assert!(
        e.contains("big.npy") && e.contains("element 200001") && e.contains("1000"),
        "{e}"
    );
    // Negative ids in a signed file.
    let p = write_npy(dir.path(), "neg.npy", &[1i64, -3, 2]);
    let e = TokenDataset::open(&p, 10).err().unwrap().to_string();
    assert!(
        e.contains("neg.npy") && e.contains("-3") && e.contains("element 1"),
        "{e}"
    );
    // Too short for the context.
    let p = write_npy(dir.path(), "short.npy", &[1u16, 2, 3, 4]);
    let data = TokenDataset::open(&p, 10).unwrap();
    assert!(data.check_context(3).is_ok());
    let e = data.check_context(4).unwrap_err().to_string();
    assert!(
        e.contains("short.npy") && e.contains("4 tokens") && e.contains("context length 4"),
        "{e}"
    );
    assert!(data.get_batch(&mut SplitMix64::new(0), 1, 4).is_err());
    // Float arrays are not token arrays; other dtypes are rejected by the header parser.
    let p = write_npy(dir.path(), "f.npy", &[1.0f32, 2.0]);
    let e = TokenDataset::open(&p, 10).err().unwrap().to_string();
    assert!(e.contains("f.npy") && e.contains("float32"), "{e}");
    let p = dir.path().join("f8.npy");
    let mut bytes =
        b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }"
            .to_vec();
    bytes.resize(10 + 0x76 - 1, b' ');
    bytes.push(b'\n');
    bytes.extend_from_slice(&[0u8; 16]);
    std::fs::write(&p, bytes).unwrap();
    let e = TokenDataset::open(&p, 10).err().unwrap().to_string();
    assert!(e.contains("f8.npy") && e.contains("<f8"), "{e}");
    let p = dir.path().join("2d.npy");
    npy::write(&p, &[2, 2], &[1u16, 2, 3, 4]).unwrap();
    let e = TokenDataset::open(&p, 10).err().unwrap().to_string();
    assert!(
        e.contains("2d.npy") && e.contains("1-D") && e.contains("[2, 2]"),
        "{e}"
    );
    let e = TokenDataset::open(&dir.path().join("missing.npy"), 10)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing.npy"), "{e}");
}
