//! Memory accounting: every buffer a training step, a forward pass or generation
//! allocates, counted by running the model's own declarations ([`crate::buffers`])
//! with a [`Planner`] — an allocator that sizes each buffer on a [`BackendKind`] without
//! allocating it — while a [`Recorder`] notes each one's [`Role`] and bytes; then
//! the GPU kernels' work space ([`crate::kernels::workspace`]), the collectives'
//! scratch, and what a run holds in host memory beside the step ([`RunMemory`]).
//! The same declarations run on a real backend give what it allocates
//! ([`step_buffers`]), which a test compares with the planner's count, buffer by
//! buffer.

use crate::buffers::{self, Activations, DecodeActivations, GradActivations, PassShape};
use crate::config::{ModelConfig, Norm};
use crate::device::backend_kind;
use crate::distributed::MPI_CHUNK;
use crate::kernels::workspace::{Scratch, CUBLASLT_WORKSPACE};
use crate::kernels::{Allocation, Allocator, BackendKind, BufKind, Buffer, Float, Role};
use crate::params::ParamLayout;
use crate::text::byte_size;
use crate::train::TrainConfig;
use crate::Result;
use std::cell::{Cell, RefCell};

/// Which part of a model's memory a buffer belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// The parameters (the f32 master weights, and a GPU's bf16 copy under bf16).
    Parameters,
    Gradients,
    /// AdamW's moments `m` and `v`.
    Moments,
    /// The RoPE tables.
    RopeTables,
    /// The step statistics' buffers.
    Statistics,
    /// What a forward pass keeps (for the backward pass, or its output).
    Activations,
    /// The backward pass's scratch, one block's worth, reused by every block.
    BackwardScratch,
    /// Generation's keys and values of every position.
    KvCache,
    /// The GPU kernels' work space and cuBLASLt's.
    Workspace,
}

/// One buffer as counted: its part, its role and the bytes it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub part: Part,
    pub role: Role,
    pub bytes: u64,
}

/// A buffer the [`Planner`] sized: its length and the bytes it would hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    len: usize,
    bytes: u64,
}

impl Buffer for Planned {
    fn len(&self) -> usize {
        self.len
    }
}

impl Allocation for Planned {
    fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// An allocator that allocates nothing: each buffer is the size it takes on
/// `backend` ([`BackendKind::storage`], the table the backends allocate by),
/// token ids u32, step statistics [`BackendKind::stats_bytes`].
#[derive(Clone, Copy, Debug)]
pub struct Planner {
    pub backend: BackendKind,
}

impl Allocator<f32> for Planner {
    type Buf = Planned;
    type Ids = Planned;
    type Stats = Planned;

    fn alloc(&self, _role: Role, len: usize, kind: BufKind) -> Result<Planned> {
        let bytes = self.backend.storage(kind).bytes(len);
        Ok(Planned { len, bytes })
    }

    fn alloc_ids(&self, _role: Role, len: usize) -> Result<Planned> {
        let bytes = 4 * len as u64;
        Ok(Planned { len, bytes })
    }

    fn alloc_stats(&self, _role: Role) -> Result<Planned> {
        let bytes = self.backend.stats_bytes();
        Ok(Planned { len: 0, bytes })
    }

    fn kind(&self) -> BackendKind {
        self.backend
    }
}

/// An allocator that gives what `inner` gives and notes each buffer's role and
/// bytes, under the part being declared ([`Recorder::part`]).
pub struct Recorder<'a, A> {
    inner: &'a A,
    part: Cell<Part>,
    entries: RefCell<Vec<Entry>>,
}

impl<'a, A> Recorder<'a, A> {
    pub fn new(inner: &'a A) -> Self {
        Recorder {
            inner,
            part: Cell::new(Part::Parameters),
            entries: RefCell::new(Vec::new()),
        }
    }

    /// What it allocates from now on belongs to `part`.
    pub fn part(&self, part: Part) -> &Self {
        self.part.set(part);
        self
    }

    /// Every buffer noted, in order.
    pub fn entries(self) -> Vec<Entry> {
        self.entries.into_inner()
    }

    fn note<T: Allocation>(&self, role: Role, allocated: Result<T>) -> Result<T> {
        let allocated = allocated?;
        self.entries.borrow_mut().push(Entry {
            part: self.part.get(),
            role,
            bytes: allocated.bytes(),
        });
        Ok(allocated)
    }
}

impl<F: Float, A: Allocator<F>> Allocator<F> for Recorder<'_, A> {
    type Buf = A::Buf;
    type Ids = A::Ids;
    type Stats = A::Stats;

    fn alloc(&self, role: Role, len: usize, kind: BufKind) -> Result<A::Buf> {
        self.note(role, self.inner.alloc(role, len, kind))
    }

    fn alloc_ids(&self, role: Role, len: usize) -> Result<A::Ids> {
        self.note(role, self.inner.alloc_ids(role, len))
    }

    fn alloc_stats(&self, role: Role) -> Result<A::Stats> {
        self.note(role, self.inner.alloc_stats(role))
    }

    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
}

/// What a model holds for its life: its parameters, RoPE tables and statistics.
fn model_buffers<F: Float, A: Allocator<F>>(r: &Recorder<A>, c: &ModelConfig) -> Result<()> {
    buffers::parameters(r.part(Part::Parameters), &ParamLayout::new(c))?;
    buffers::rope_tables(r.part(Part::RopeTables), c)?;
    buffers::statistics(r.part(Part::Statistics))?;
    Ok(())
}

/// Every buffer of a training step of `b` sequences of `t` tokens as `allocator`
/// gives them, by the model's own declarations: the model's, the gradient, AdamW's
/// moments of every parameter, the activations and the backward scratch. With the
/// [`Planner`] this is the accounting; with a backend, what the backend allocates
/// (the buffers are freed on return).
pub fn step_buffers<F: Float, A: Allocator<F>>(
    allocator: &A,
    c: &ModelConfig,
    b: usize,
    t: usize,
) -> Result<Vec<Entry>> {
    let r = Recorder::new(allocator);
    let layout = ParamLayout::new(c);
    model_buffers(&r, c)?;
    buffers::gradients(r.part(Part::Gradients), &layout)?;
    buffers::moments(r.part(Part::Moments), layout.total)?;
    Activations::new(r.part(Part::Activations), c, PassShape::full(b, t))?;
    GradActivations::new(r.part(Part::BackwardScratch), c, b, t)?;
    Ok(r.entries())
}

/// The work space of the GPU kernels (none on the CPU) for passes of `pass`, with
/// their loss unless decoding, and for training steps (`train`) their backward pass
/// and update too: each [`Scratch`] buffer they take, at its largest, and
/// cuBLASLt's.
fn workspace(c: &ModelConfig, pass: PassShape, train: bool, backend: BackendKind) -> Vec<Entry> {
    if !backend.on_gpu() {
        return Vec::new();
    }
    let PassShape { b, t, decode, .. } = pass;
    // Each buffer with the extent of its largest call (see `Scratch::len`).
    let mut slots = Vec::new();
    if !decode {
        slots.push((Scratch::Losses, b * t));
    }
    if train {
        if c.norm != Norm::None {
            slots.push((Scratch::NormGain, c.d_model));
        }
        slots.push((Scratch::Squares, 0));
    }
    let entry = |(name, shape), bytes| Entry {
        part: Part::Workspace,
        role: Role { name, shape },
        bytes,
    };
    let mut entries: Vec<Entry> = (slots.into_iter())
        .map(|(slot, extent)| entry(slot.describe(), slot.bytes(extent)))
        .collect();
    entries.push(entry(
        ("cuBLASLt work space", ""),
        CUBLASLT_WORKSPACE as u64,
    ));
    entries
}

/// Bytes of the entries of `part`.
fn part_bytes(entries: &[Entry], part: Part) -> u64 {
    (entries.iter().filter(|e| e.part == part))
        .map(|e| e.bytes)
        .sum()
}

/// Memory in bytes for training with AdamW, on one [`BackendKind`]: every buffer of the
/// step ([`step_buffers`] by the [`Planner`]), the kernels' work space, and with
/// several ranks the collectives' scratch. Evaluation runs in batches of the step's
/// (micro-)batch and reuses these buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Memory {
    pub backend: BackendKind,
    /// Every buffer, in the order the model allocates them.
    pub buffers: Vec<Entry>,
    /// The scratch of the CPU's MPI collectives, with several ranks.
    pub collective: u64,
    /// The model's parameter count.
    parameters: usize,
}

impl Memory {
    /// Memory for a training step on `batch_size` sequences of `seq_len` tokens
    /// on `backend`.
    pub fn new(c: &ModelConfig, batch_size: usize, seq_len: usize, backend: BackendKind) -> Self {
        let (b, t) = (batch_size, seq_len);
        let mut buffers =
            step_buffers(&Planner { backend }, c, b, t).expect("planning allocates nothing");
        buffers.extend(workspace(c, PassShape::full(b, t), true, backend));
        Memory {
            backend,
            buffers,
            collective: 0,
            parameters: ParamLayout::new(c).total,
        }
    }

    /// One rank's memory when training over `ranks` ranks (this one's activations
    /// being for its micro-batch): under ZeRO-1 (`sharded`) the AdamW moments of its
    /// shard of the parameters, and on the CPU the scratch of the MPI collectives (a
    /// shard, or at most [`MPI_CHUNK`] values; NCCL works in place).
    pub fn on_ranks(mut self, ranks: usize, sharded: bool) -> Self {
        if ranks > 1 {
            let shard = self.parameters.div_ceil(ranks);
            if sharded {
                let planner = Planner {
                    backend: self.backend,
                };
                let r = Recorder::new(&planner);
                buffers::moments(r.part(Part::Moments), shard).expect("planning allocates nothing");
                let at = (self.buffers.iter())
                    .position(|e| e.part == Part::Moments)
                    .expect("a step has moments");
                self.buffers.retain(|e| e.part != Part::Moments);
                self.buffers.splice(at..at, r.entries());
            }
            if !self.backend.on_gpu() {
                let scratch = if sharded {
                    shard
                } else {
                    self.parameters.min(MPI_CHUNK)
                };
                self.collective = 4 * scratch as u64;
            }
        }
        self
    }

    /// Bytes of the buffers of `part`.
    pub fn bytes(&self, part: Part) -> u64 {
        part_bytes(&self.buffers, part)
    }

    pub fn total(&self) -> u64 {
        self.buffers.iter().map(|e| e.bytes).sum::<u64>() + self.collective
    }
}

/// The peak memory of a training run, per rank: a step's buffers on their
/// [`BackendKind`] and what the run holds in host memory beside them. Evaluation adds
/// nothing (it runs in batches of the step's micro-batch, in its buffers), nor do
/// checkpoints on the CPU (written from the buffers, read back into them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunMemory {
    pub step: Memory,
    /// The host copy of a step's token ids and targets (this rank's share), and on
    /// a GPU their pinned staging (one micro-batch).
    pub batch: u64,
    /// On a GPU, the pinned host buffer every tensor of a checkpoint passes
    /// through, the size of the largest (f32); on the CPU under bf16 the same in
    /// host memory; 0 on the CPU in f32.
    pub checkpoint_staging: u64,
    /// The memory-mapped token files: their pages count in the process's resident
    /// memory once read, but the kernel evicts them when memory runs short, so they
    /// are not counted against a memory limit ([`RunMemory::required`]).
    pub token_files: u64,
}

impl RunMemory {
    /// A run whose steps take `share` sequences of `seq_len` tokens per rank in
    /// passes as `step` (its micro-batch) counts, reading `token_files` bytes of
    /// token files.
    pub fn new(
        c: &ModelConfig,
        step: Memory,
        share: usize,
        micro: usize,
        seq_len: usize,
        token_files: u64,
    ) -> Self {
        let ids = |rows: usize| 2 * 4 * (rows * seq_len) as u64;
        let on_gpu = step.backend.on_gpu();
        // A checkpoint's tensors pass through staging where parameters are not
        // written in place: a GPU's.
        let staged = on_gpu;
        let largest_tensor = crate::params::ParamLayout::new(c)
            .specs
            .iter()
            .map(|s| s.len() as u64)
            .max()
            .unwrap_or(0);
        RunMemory {
            step,
            batch: ids(share) + if on_gpu { ids(micro) } else { 0 },
            checkpoint_staging: if staged { 4 * largest_tensor } else { 0 },
            token_files,
        }
    }

    /// Host memory beside the step's buffers (all of it but the token files).
    pub fn host_extra(&self) -> u64 {
        self.batch + self.checkpoint_staging
    }

    /// The memory the run must have on its device: on the CPU the step's buffers
    /// and the host extras; on a GPU the step's buffers (device memory).
    pub fn required(&self) -> u64 {
        match self.step.backend.on_gpu() {
            false => self.step.total() + self.host_extra(),
            true => self.step.total(),
        }
    }

    /// The process's peak resident memory (on the CPU): everything above and the
    /// token files' pages.
    pub fn peak_resident(&self) -> u64 {
        self.step.total() + self.host_extra() + self.token_files
    }
}

/// Memory of a model that only runs forward (generation, a forward pass,
/// evaluation), on one [`BackendKind`]: it holds no gradient or optimizer state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InferenceMemory {
    /// The model's buffers, the pass's (and generation's KV cache) and the kernels'
    /// work space.
    pub buffers: Vec<Entry>,
    /// The logits copied to the host: `(B, T, V)` f32, or `(S, V)` when decoding
    /// `S` sequences.
    pub host_logits: u64,
}

impl InferenceMemory {
    /// A forward pass over `batch_size` sequences of `seq_len` tokens.
    pub fn forward(
        c: &ModelConfig,
        batch_size: usize,
        seq_len: usize,
        backend: BackendKind,
    ) -> Self {
        let (b, t) = (batch_size, seq_len);
        let planner = Planner { backend };
        let r = Recorder::new(&planner);
        model_buffers(&r, c).expect("planning allocates nothing");
        Activations::new(r.part(Part::Activations), c, PassShape::full(b, t))
            .expect("planning allocates nothing");
        let mut buffers = r.entries();
        buffers.extend(workspace(c, PassShape::full(b, t), false, backend));
        InferenceMemory {
            buffers,
            host_logits: 4 * (b * t * c.vocab_size) as u64,
        }
    }

    /// Decoding `sequences` sequences together (generation: one; a server: its
    /// slots): a KV cache of the whole context for each, and the buffers of a
    /// decoding pass of at most `rows` new positions (a whole prompt at most:
    /// `context_length`).
    pub fn decoding(c: &ModelConfig, sequences: usize, rows: usize, backend: BackendKind) -> Self {
        let planner = Planner { backend };
        let r = Recorder::new(&planner);
        model_buffers(&r, c).expect("planning allocates nothing");
        DecodeActivations::new(r.part(Part::Activations), c, rows, sequences)
            .expect("planning allocates nothing");
        for _ in 0..sequences {
            buffers::kv_cache(r.part(Part::KvCache), c).expect("planning allocates nothing");
        }
        let mut buffers = r.entries();
        let pass = PassShape::decode(rows, c.context_length);
        buffers.extend(workspace(c, pass, false, backend));
        InferenceMemory {
            buffers,
            host_logits: 4 * (sequences * c.vocab_size) as u64,
        }
    }

    /// The model's own buffers: its parameters, RoPE tables and statistics.
    pub fn parameters(&self) -> u64 {
        [Part::Parameters, Part::RopeTables, Part::Statistics]
            .map(|part| part_bytes(&self.buffers, part))
            .iter()
            .sum()
    }

    pub fn kv_cache(&self) -> u64 {
        part_bytes(&self.buffers, Part::KvCache)
    }

    /// The pass's buffers and the kernels' work space.
    pub fn activations(&self) -> u64 {
        part_bytes(&self.buffers, Part::Activations) + part_bytes(&self.buffers, Part::Workspace)
    }

    pub fn total(&self) -> u64 {
        self.buffers.iter().map(|e| e.bytes).sum::<u64>() + self.host_logits
    }

    /// One line saying what the model holds on `backend` (`tinylm generate`,
    /// `tinylm forward`).
    pub fn describe(&self, backend: BackendKind) -> String {
        let place = match backend {
            BackendKind::Cpu => "host memory".to_string(),
            BackendKind::CpuBf16 => "host memory (bf16)".to_string(),
            BackendKind::CpuQ8 => "host memory (q8_0 weights)".to_string(),
            BackendKind::Cuda(p) => format!("GPU memory ({p})"),
        };
        let mut parts = vec![format!("parameters {}", byte_size(self.parameters()))];
        if self.kv_cache() > 0 {
            parts.push(format!("KV cache {}", byte_size(self.kv_cache())));
        }
        parts.push(format!("activations {}", byte_size(self.activations())));
        format!(
            "memory: {} of {place} ({}), and {} of logits on the host",
            byte_size(self.total() - self.host_logits),
            parts.join(", "),
            byte_size(self.host_logits)
        )
    }
}

/// What a run's memory depends on beside the model and its batch: where it runs,
/// over how many ranks, the sequence length and the token files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunShape {
    pub backend: BackendKind,
    pub ranks: usize,
    /// ZeRO-1: the AdamW moments sharded over the ranks.
    pub sharded: bool,
    pub seq_len: usize,
    /// Bytes of the training and validation token files.
    pub token_files: u64,
}

impl RunShape {
    /// The shape of `cfg`'s run over `ranks` ranks: its device and
    /// precision, `zero`, context length, and the sizes of its token files (a file
    /// that cannot be read counts 0: opening it is the run's to report).
    pub fn of(cfg: &TrainConfig, ranks: usize) -> Result<Self> {
        let size = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |m| m.len());
        Ok(RunShape {
            backend: backend_kind(cfg.device, cfg.precision)?,
            ranks,
            sharded: cfg.zero == 1,
            seq_len: cfg.model.context_length,
            token_files: size(&cfg.train_data) + cfg.val_data.as_deref().map_or(0, size),
        })
    }

    /// The run's memory per rank with `share` sequences per rank and step, in
    /// micro-batches of `micro`.
    pub fn memory(&self, c: &ModelConfig, share: usize, micro: usize) -> RunMemory {
        let step =
            Memory::new(c, micro, self.seq_len, self.backend).on_ranks(self.ranks, self.sharded);
        RunMemory::new(c, step, share, micro, self.seq_len, self.token_files)
    }
}

/// The largest `b ≥ 1` with `memory(b) ≤ limit`, `memory` growing with `b`; 0 when
/// not even 1 fits.
pub fn largest_fitting(limit: u64, memory: impl Fn(usize) -> u64) -> usize {
    if memory(1) > limit {
        return 0;
    }
    let (mut fits, mut too_big) = (1usize, 2usize);
    while memory(too_big) <= limit {
        (fits, too_big) = (too_big, too_big * 2);
    }
    while too_big - fits > 1 {
        let mid = fits + (too_big - fits) / 2;
        match memory(mid) <= limit {
            true => fits = mid,
            false => too_big = mid,
        }
    }
    fits
}

/// The largest divisor `m` of `share` with `memory(m) ≤ limit` (the micro-batch
/// that keeps a rank's share of the batch within `limit`); `None` when not even
/// 1 fits.
pub fn largest_micro_batch(
    share: usize,
    limit: u64,
    memory: impl Fn(usize) -> u64,
) -> Option<usize> {
    (1..=share)
        .rev()
        .filter(|m| share.is_multiple_of(*m))
        .find(|&m| memory(m) <= limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::workspace::{NORM_BLOCKS, ROW_BLOCKS};
    use crate::kernels::{Precision, STATS_BYTES};

    /// A rank's memory: activations for its micro-batch, a quarter of the AdamW
    /// moments over four ZeRO-1 ranks, and the collectives' scratch.
    #[test]
    fn one_rank_holds_its_micro_batch_and_shard() {
        let c = ModelConfig::tinystories();
        let whole = Memory::new(&c, 8, 256, BackendKind::Cpu);
        let rank = Memory::new(&c, 2, 256, BackendKind::Cpu).on_ranks(4, true);
        for part in [Part::Activations, Part::BackwardScratch] {
            assert_eq!(4 * rank.bytes(part), whole.bytes(part), "{part:?}");
        }
        let params = ParamLayout::new(&c).total as u64;
        assert_eq!(rank.bytes(Part::Moments), 8 * params.div_ceil(4));
        assert_eq!(rank.collective, 4 * params.div_ceil(4));
        let replicated = Memory::new(&c, 2, 256, BackendKind::Cpu).on_ranks(4, false);
        assert_eq!(replicated.bytes(Part::Moments), whole.bytes(Part::Moments));
        assert_eq!(replicated.collective, 4 * params.min(MPI_CHUNK as u64));
        let one = Memory::new(&c, 2, 256, BackendKind::Cpu).on_ranks(1, true);
        assert_eq!(one, Memory::new(&c, 2, 256, BackendKind::Cpu));
    }

    /// On a GPU under bf16: activations and backward scratch in 2 bytes (their
    /// statistics and ids in 4), a bf16 copy of the parameters, and the kernels'
    /// work space; under fp32 the activations are the CPU's. On a GPU attention
    /// keeps each row's log-sum-exp `(B, H, T)` in f32 where the CPU keeps the
    /// probabilities `(B, H, T, T)`, and so does its backward scratch.
    #[test]
    fn gpu_widths_and_work_space() {
        let c = ModelConfig::tinystories();
        let (b, t) = (4, 256);
        let cpu = Memory::new(&c, b, t, BackendKind::Cpu);
        let bf16 = Memory::new(&c, b, t, BackendKind::Cuda(Precision::Bf16));
        let fp32 = Memory::new(&c, b, t, BackendKind::Cuda(Precision::Fp32));
        let (n, layers) = ((b * t) as u64, c.num_layers as u64);
        let (rows, square) = (c.num_heads as u64 * n, c.num_heads as u64 * n * t as u64);
        let acts = Part::Activations;
        let (lse, probabilities) = (4 * layers * rows, 4 * layers * square);
        assert_eq!(fp32.bytes(acts) - lse, cpu.bytes(acts) - probabilities);
        let scratch = Part::BackwardScratch;
        assert_eq!(
            2 * (bf16.bytes(scratch) - 4 * rows),
            cpu.bytes(scratch) - 4 * square
        );
        // Statistics: two (B, T) per layer and ln_final's; ids and targets.
        let four_byte = 4 * (2 * n * layers + n + 2 * n);
        assert_eq!(
            2 * (bf16.bytes(acts) - four_byte - lse) + four_byte,
            cpu.bytes(acts) - probabilities
        );
        let params = cpu.bytes(Part::Parameters);
        assert_eq!(bf16.bytes(Part::Parameters), params * 3 / 2);
        assert_eq!(fp32.bytes(Part::Parameters), params);
        assert_eq!(cpu.bytes(Part::Workspace), 0);
        assert_eq!(cpu.bytes(Part::Statistics), 0);
        assert_eq!(bf16.bytes(Part::Statistics), 3 * STATS_BYTES as u64);
        // RMSNorm's gain partial sums, the per-row losses; attention takes none.
        let d = c.d_model as u64;
        let work = 4 * ROW_BLOCKS as u64 * d + 4 * n;
        let squares = 8 * NORM_BLOCKS as u64;
        assert_eq!(
            bf16.bytes(Part::Workspace),
            work + squares + CUBLASLT_WORKSPACE as u64
        );
        // NCCL needs no scratch; ZeRO-1 still shards the moments.
        let rank = Memory::new(&c, b, t, BackendKind::Cuda(Precision::Bf16)).on_ranks(4, true);
        assert_eq!(rank.collective, 0);
        let moments = 8 * (params / 4).div_ceil(4);
        assert_eq!(rank.bytes(Part::Moments), moments);
    }

    /// Decoding holds the parameters, a KV cache of the whole context per
    /// sequence, one block's buffers for the pass's rows, and no gradient, moments
    /// or backward scratch.
    #[test]
    fn decoding_holds_the_caches_and_one_pass() {
        let c = ModelConfig::tinystories();
        let g = InferenceMemory::decoding(&c, 1, 1, BackendKind::Cpu);
        let (ctx, d) = (c.context_length as u64, c.d_model as u64);
        assert_eq!(g.kv_cache(), 4 * c.num_layers as u64 * ctx * 3 * d);
        let four = InferenceMemory::decoding(&c, 4, 1, BackendKind::Cpu);
        assert_eq!(four.kv_cache(), 4 * g.kv_cache());
        assert_eq!(four.host_logits, 4 * g.host_logits);
        // A block's buffers are reused by every block (4 here), and only the last
        // row's logits are computed: a whole-context prompt takes under a third of
        // a full forward pass's activations.
        let prompt = InferenceMemory::decoding(&c, 1, c.context_length, BackendKind::Cpu);
        let full = InferenceMemory::forward(&c, 1, c.context_length, BackendKind::Cpu);
        assert!(3 * prompt.activations() < full.activations());
        let step = Memory::new(&c, 1, 1, BackendKind::Cpu);
        assert_eq!(
            g.parameters(),
            step.bytes(Part::Parameters) + step.bytes(Part::RopeTables)
        );
        let parts = |m: &InferenceMemory| m.buffers.iter().map(|e| e.part).collect::<Vec<_>>();
        assert!(!parts(&g).contains(&Part::Gradients));
        let f = InferenceMemory::forward(&c, 2, 8, BackendKind::Cpu);
        assert_eq!(f.host_logits, 4 * 2 * 8 * c.vocab_size as u64);
        assert_eq!(f.kv_cache(), 0);
        assert!(f.describe(BackendKind::Cpu).starts_with("memory: "));
    }

    /// A run's peak: host extras on the CPU are the batch's ids; on a GPU also their
    /// pinned staging and the checkpoint's, the largest tensor (the embedding here).
    #[test]
    fn run_memory_on_cpu_and_gpu() {
        let c = ModelConfig::tinystories();
        let cpu = RunMemory::new(
            &c,
            Memory::new(&c, 2, 256, BackendKind::Cpu),
            8,
            2,
            256,
            1000,
        );
        assert_eq!((cpu.batch, cpu.checkpoint_staging), (8 * 8 * 256, 0));
        assert_eq!(cpu.required(), cpu.step.total() + cpu.batch);
        assert_eq!(cpu.peak_resident(), cpu.required() + 1000);
        let step = Memory::new(&c, 2, 256, BackendKind::Cuda(Precision::Bf16));
        let gpu = RunMemory::new(&c, step, 8, 2, 256, 0);
        assert_eq!(gpu.batch, 8 * 8 * 256 + 8 * 2 * 256);
        assert_eq!(gpu.checkpoint_staging, 4 * 10_000 * 512);
        assert_eq!(gpu.required(), gpu.step.total());
    }

    #[test]
    fn fitting_batches_and_micro_batches() {
        let memory = |b: usize| 100 + 10 * b as u64;
        assert_eq!(largest_fitting(1000, memory), 90);
        assert_eq!(largest_fitting(50, memory), 0);
        assert_eq!(largest_micro_batch(64, 500, memory), Some(32));
        assert_eq!(largest_micro_batch(48, 500, memory), Some(24));
        assert_eq!(largest_micro_batch(7, 150, memory), Some(1));
        assert_eq!(largest_micro_batch(8, 50, memory), None);
    }
}
