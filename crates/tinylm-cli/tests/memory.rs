//! A run takes the memory `tinylm info` promises: a 58M-parameter model through
//! training steps in micro-batches, an evaluation, a checkpoint and a resume, each
//! process's peak resident memory (`wait4`'s `ru_maxrss`) within the memory
//! model's peak of the run (`RunMemory::peak_resident`) + 5% plus a fixed
//! allowance for the program and its libraries; and the resume, which reads the
//! checkpoint tensor by tensor into the training's buffers, within the first run's
//! peak plus a small allowance.

use std::process::Command;
use tinylm::accounting::{RunShape, Target};
use tinylm::ModelConfig;
use tinylm_bpe::npy;

/// What a process holds beyond the run's buffers: the binary and its libraries,
/// thread stacks, the allocator's slack.
const ALLOWANCE_MIB: u64 = 128;

/// What a resumed run may hold beyond the first run's peak: reading the checkpoint
/// costs no copy of the model or its moments, only the allocator's slack (peaks
/// vary by about 20 MiB from run to run; reading the whole checkpoint first added
/// 120 MiB).
const RESUME_ALLOWANCE_MIB: u64 = 48;

/// Runs `tinylm args` and returns its peak resident memory in bytes.
// The child is reaped by `wait4`, which `Child::wait` cannot replace: it alone
// returns the child's resource usage.
#[allow(clippy::zombie_processes)]
fn peak_rss(args: &[&str]) -> u64 {
    let child = Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .args(args)
        .spawn()
        .unwrap();
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: waits for this child only, writing into the two locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{args:?} failed"
    );
    usage.ru_maxrss as u64 * 1024 // KiB on Linux
}

#[test]
fn training_evaluation_checkpoint_and_resume_stay_within_the_memory_model() {
    let config = ModelConfig {
        vocab_size: 32_000,
        context_length: 256,
        d_model: 512,
        num_layers: 8,
        num_heads: 8,
        d_ff: 1376,
        ..ModelConfig::tinystories()
    };
    let (batch, micro) = (4, 2);
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u16> = (0..200_000u32)
        .map(|i| (i * 7919 % 32_000) as u16)
        .collect();
    npy::write(&dir.path().join("t.npy"), &[ids.len()], &ids).unwrap();
    npy::write(&dir.path().join("v.npy"), &[20_000], &ids[..20_000]).unwrap();
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (train, val, out) = (path("t.npy"), path("v.npy"), path("run"));
    let shape = RunShape {
        target: Target::Cpu,
        ranks: 1,
        sharded: false,
        seq_len: config.context_length,
        token_files: [&train, &val]
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum(),
    };
    let limit =
        shape.memory(&config, batch, micro).peak_resident() * 105 / 100 + (ALLOWANCE_MIB << 20);
    let first = peak_rss(&[
        "train",
        "--vocab-size",
        "32000",
        "--context-length",
        "256",
        "--d-model",
        "512",
        "--num-layers",
        "8",
        "--num-heads",
        "8",
        "--d-ff",
        "1376",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "2",
        "--steps",
        "2",
        "--eval-batches",
        "2",
        "--train-data",
        &train,
        "--val-data",
        &val,
        "--out-dir",
        &out,
        "--tensorboard",
        "false",
        "--threads",
        "2",
    ]);
    let checkpoint = path("run/checkpoint.safetensors");
    let resumed = peak_rss(&["train", "--resume", &checkpoint, "--steps", "3"]);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for (what, peak) in [("the first run", first), ("the resumed run", resumed)] {
        eprintln!(
            "{what}: peak {:.3} GiB, limit {:.3} GiB",
            gib(peak),
            gib(limit)
        );
        assert!(
            peak <= limit,
            "{what} peaked at {:.3} GiB, over the memory model's limit {:.3} GiB",
            gib(peak),
            gib(limit)
        );
    }
    assert!(
        resumed <= first + (RESUME_ALLOWANCE_MIB << 20),
        "the resumed run peaked at {:.3} GiB, over the first run's {:.3} GiB + {RESUME_ALLOWANCE_MIB} MiB",
        gib(resumed),
        gib(first)
    );
}
