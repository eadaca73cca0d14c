//! Accounted bytes are allocated bytes. The memory accounting (`tinylm info`, the
//! batch `--fit-memory` picks) and the model run the same buffer declarations
//! (`tinylm::buffers`): here the accounting's count of every buffer of a training
//! step is compared with what the CPU backends (f32, bf16) — and, with the feature `cuda`, the
//! GPU backend in both precisions — allocates for it, buffer by buffer, in every
//! ablation. And a real training step (the optimizer, forward, backward, the update,
//! an evaluation pass) holds exactly the accounted bytes and nothing more: the
//! process's heap allocations of 2 KiB and more on the CPU; on the GPU, every work
//! space buffer of the kernels and the device's whole memory: exactly, as the
//! emulated GPU counts it (`.ci/cuda_emu.sh` runs this file under tools/cuda-emu,
//! whose driver allocates exactly the bytes asked for), and on a real GPU (whose
//! driver rounds allocations up to its pages) within a page per buffer.

mod common;

use common::ablations;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use tinylm::accounting::{step_buffers, Entry, Memory, Part, Planner};
use tinylm::config::{Ffn, ModelConfig, Norm, Positional};
use tinylm::kernels::BackendKind;
use tinylm::kernels::{Backend, BatchPart, Cpu, CpuMixed};
use tinylm::optim::AdamW;
use tinylm::Model;

/// The heap, counting the bytes of its live allocations of [`LARGE`] bytes and
/// more: every buffer of the test's steps is, and the small allocations around
/// them (the vectors of buffers, rayon's jobs) are not counted.
struct Counting;

/// The smallest allocation counted (the vectors of a pass's buffers — 12 per
/// layer, 56 bytes each under bf16 — stay below it).
const LARGE: usize = 2048;

static LIVE: AtomicI64 = AtomicI64::new(0);

fn count(size: usize, sign: i64) {
    if size >= LARGE {
        LIVE.fetch_add(sign * size as i64, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size(), 1);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size(), 1);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(layout.size(), -1);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(layout.size(), -1);
            count(new_size, 1);
        }
        p
    }
}

#[global_allocator]
static HEAP: Counting = Counting;

/// The tests one at a time: the heap's count is the whole process's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn config(norm: Norm, positional: Positional, ffn: Ffn, tie_embeddings: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 96,
        context_length: 64,
        d_model: 32,
        num_layers: 2,
        num_heads: 4,
        d_ff: 48,
        norm,
        positional,
        ffn,
        tie_embeddings,
        ..ModelConfig::tinystories()
    }
}

/// A batch of `b` sequences of `t` token ids.
fn batch(c: &ModelConfig, b: usize, t: usize) -> Vec<u32> {
    (0..b * t).map(|i| (i * 37 % c.vocab_size) as u32).collect()
}

/// A training step as `tinylm train` runs it, its statistics read, then an
/// evaluation pass of the same shape; returns the optimizer (its moments).
fn step_and_evaluate<B: Backend<f32>>(
    model: &mut Model<f32, B>,
    b: usize,
    t: usize,
) -> AdamW<B::Buf> {
    let ids = batch(model.config(), b, t);
    let mut opt = model.new_adamw(Default::default()).unwrap();
    let whole = BatchPart::whole(b * t);
    model.accumulate_gradient(&ids, &ids, b, t, whole).unwrap();
    model
        .optimizer_step(&mut opt, 1e-3, Some(1.0), None)
        .unwrap();
    model.step_stats().unwrap();
    model.forward_loss(&ids, &ids, b, t).unwrap();
    model.backend().sync().unwrap();
    opt
}

/// `allocated` and `planned` hold the same buffers, each of the same bytes.
fn assert_same(allocated: &[Entry], planned: &[Entry], what: &str) {
    for (i, (a, p)) in allocated.iter().zip(planned).enumerate() {
        assert_eq!(a, p, "{what}: buffer {i}");
    }
    assert_eq!(allocated.len(), planned.len(), "{what}: buffers");
}

/// The bytes of `entries` of the parts a step allocates after the model's own.
fn step_parts(entries: &[Entry]) -> i64 {
    let parts = [
        Part::Gradients,
        Part::Moments,
        Part::Activations,
        Part::BackwardScratch,
    ];
    (entries.iter().filter(|e| parts.contains(&e.part)))
        .map(|e| e.bytes as i64)
        .sum()
}

/// Every buffer `backend` (a CPU backend, whose buffers `target` sizes) allocates
/// for a step is the one accounted, in every ablation.
fn cpu_buffers_are_accounted<B: Backend<f32>>(backend: &B, target: BackendKind) {
    for c in ablations(config) {
        for (b, t) in [(1, 1), (2, 7), (3, 64)] {
            let planned = step_buffers(&Planner { backend: target }, &c, b, t).unwrap();
            let allocated = step_buffers::<f32, _>(backend, &c, b, t).unwrap();
            assert_same(
                &allocated,
                &planned,
                &format!("{target:?}, {c:?}, batch {b} x {t}"),
            );
            let memory = Memory::new(&c, b, t, target);
            assert_eq!(memory.buffers, planned, "the CPU has no work space");
        }
    }
}

#[test]
fn every_buffer_the_cpu_allocates_is_accounted_in_every_ablation() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    cpu_buffers_are_accounted(&Cpu, BackendKind::Cpu);
    // bf16 mixed precision: the product-only activations in bf16, the parameters
    // with their bf16 copy.
    cpu_buffers_are_accounted(&CpuMixed::new(), BackendKind::CpuBf16);
    // Generation's 8-bit weights: the parameters with their Q8_0 copy, every
    // activation f32.
    cpu_buffers_are_accounted(&CpuMixed::q8(), BackendKind::CpuQ8);
}

/// A training step on `backend` (a CPU backend, whose buffers `target` sizes) holds
/// exactly the accounted bytes, in every ablation.
fn cpu_step_holds_the_accounted_bytes<B: Backend<f32> + Copy + Send>(
    backend: B,
    target: BackendKind,
) {
    // Every buffer of a step of 8 x 64 tokens holds at least 2 KiB (the norms'
    // 1/rms and the token ids: 512 f32 or u32; bf16 activations of d_model 32).
    let (b, t) = (8, 64);
    // One worker thread: a first step grows all that it keeps (its scratch, the
    // product library's packing memory) to this shape.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for c in ablations(config) {
        let new_model = || Model::init_with_backend(c.clone(), 0, backend).unwrap();
        pool.install(|| step_and_evaluate(&mut new_model(), b, t));
        // The least of three steps: rayon's work queues free some memory of their own
        // late (crossbeam's epoch-deferred frees, a node of about 2 KiB that one step
        // may still hold and the next has freed), while a buffer a step keeps is
        // there every time.
        let held = (0..3)
            .map(|_| {
                let mut model = new_model();
                let before = LIVE.load(Ordering::Relaxed);
                let opt = pool.install(|| step_and_evaluate(&mut model, b, t));
                let held = LIVE.load(Ordering::Relaxed) - before;
                drop(opt);
                held
            })
            .min()
            .expect("three steps");
        let planned = step_buffers(&Planner { backend: target }, &c, b, t).unwrap();
        assert_eq!(held, step_parts(&planned), "{target:?}, {c:?}");
    }
}

#[test]
fn a_training_step_on_the_cpu_holds_the_accounted_bytes_in_every_ablation() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    cpu_step_holds_the_accounted_bytes(Cpu, BackendKind::Cpu);
    cpu_step_holds_the_accounted_bytes(CpuMixed::new(), BackendKind::CpuBf16);
}

/// A real GPU's driver hands out memory in pages of this many bytes at most: each
/// allocation may hold up to one page more than it asked for.
#[cfg(feature = "cuda")]
const DRIVER_PAGE: u64 = 2 << 20;

#[cfg(feature = "cuda")]
#[test]
fn every_buffer_and_the_whole_memory_of_a_gpu_step_are_accounted_in_every_ablation() {
    use tinylm::kernels::cuda::Cuda;
    use tinylm::kernels::Precision;
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device_used = || {
        let (free, total) = Cuda::device_memory(0).unwrap();
        total - free
    };
    let (b, t) = (3, 16);
    for precision in [Precision::Fp32, Precision::Bf16] {
        let target = BackendKind::Cuda(precision);
        // The device's context and kernels, loaded before the first measurement, so
        // that what a step adds is its buffers alone.
        let context = Cuda::new(0, precision).unwrap();
        let emulated = context.describe().starts_with("cuda-emu");
        for c in ablations(config) {
            let what = format!("{c:?} in {precision}");
            let before = device_used();
            let cuda = Cuda::new(0, precision).unwrap();
            let planned = step_buffers(&Planner { backend: target }, &c, b, t).unwrap();
            let allocated = step_buffers(&cuda, &c, b, t).unwrap();
            assert_same(&allocated, &planned, &what);
            let mut model = Model::init_with_backend(c.clone(), 0, cuda).unwrap();
            let _opt = step_and_evaluate(&mut model, b, t);
            let memory = Memory::new(&c, b, t, target);
            // Each work space buffer the kernels took, then cuBLASLt's.
            let (scratch, cublaslt) = model.backend().workspace_bytes();
            let mut took: Vec<(&str, u64)> = (scratch.iter())
                .map(|&(slot, bytes)| (slot.describe().0, bytes))
                .collect();
            took.push(("cuBLASLt work space", cublaslt));
            let mut counted: Vec<(&str, u64)> = (memory.buffers.iter())
                .filter(|e| e.part == Part::Workspace)
                .map(|e| (e.role.name, e.bytes))
                .collect();
            took.sort();
            counted.sort();
            assert_eq!(took, counted, "{what}");
            let (held, accounted) = (device_used() - before, memory.total());
            if emulated {
                // The emulator's driver allocates exactly the bytes asked for.
                assert_eq!(held, accounted, "{what}: the device's memory");
            } else {
                // A GPU's driver rounds each allocation up, by less than a page.
                let pages = (memory.buffers.len() + 1) as u64 * DRIVER_PAGE;
                eprintln!("{what}: the step holds {held} bytes, {accounted} accounted");
                assert!(
                    (accounted..=accounted + pages).contains(&held),
                    "{what}: the step holds {held} bytes of the device's memory, the \
                     accounting says {accounted} (each of its {} buffers rounded up by \
                     less than {DRIVER_PAGE} bytes)",
                    memory.buffers.len()
                );
            }
        }
    }
}
