//! Resource accounting (SPEC §2): parameters by component, memory for training
//! (a step's buffers on the CPU or a GPU, and the peak of a whole run), and the
//! FLOPs of every matmul in one forward pass.
//!
//! FLOPs count each `(m×n)(n×p)` product as `2mnp`. Attention scores are counted
//! in full (`QKᵀ` is `T×T` per head although the causal mask discards half), the
//! usual convention; non-matmul work (softmax, norms, RoPE, SiLU) is left out. A
//! training step is about 3× the forward pass: the backward pass computes two
//! matmuls (input and weight gradients) per forward one.

pub use crate::config::ParamCounts;
use crate::config::{Ffn, ModelConfig, Norm};
use crate::device::{resolve, Device};
use crate::distributed::MPI_CHUNK;
use crate::kernels::Precision;
use crate::train::TrainConfig;
use crate::Result;

/// Where a model's buffers live, which sets the width of its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Target {
    /// Host memory, f32 throughout.
    #[default]
    Cpu,
    /// A GPU's memory: activations in the precision's width (2 bytes under bf16),
    /// parameters, gradients, moments and normalization statistics f32, and under
    /// bf16 a bf16 copy of the parameters for the matrix products.
    Cuda(Precision),
}

impl Target {
    /// Where a run on `device` in `precision` keeps its buffers: `cuda` counts a
    /// GPU's memory in any build; `auto` is what this machine has.
    pub fn of(device: Device, precision: Precision) -> Result<Self> {
        let device = match device {
            Device::Auto => resolve(Device::Auto)?,
            device => device,
        };
        Ok(match device {
            Device::Cuda(_) => Target::Cuda(precision),
            _ => Target::Cpu,
        })
    }

    /// Bytes of one activation value.
    pub fn activation_bytes(self) -> u64 {
        match self {
            Target::Cuda(Precision::Bf16) => 2,
            _ => 4,
        }
    }
}

/// A group of buffers of the training step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Activation {
    pub name: &'static str,
    /// Its shape, written with `B`, `T`, `C` (d_model), `F` (d_ff), `H`, `V`.
    pub shape: String,
    /// Elements in one copy.
    pub elements: u64,
    /// Copies: `num_layers` for a block's buffers, 1 otherwise.
    pub copies: u64,
    /// Bytes of one element: 4 (f32, token ids), 2 (bf16), 8 (f64).
    pub element_bytes: u64,
}

impl Activation {
    pub fn bytes(&self) -> u64 {
        self.element_bytes * self.elements * self.copies
    }
}

/// cuBLASLt's work space on the GPU (NVIDIA's recommendation for Hopper, the larger).
pub const CUBLASLT_WORKSPACE: u64 = 32 << 20;

/// Memory in bytes for training with AdamW, on one [`Target`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Memory {
    pub target: Target,
    /// The f32 parameters (the master weights on a GPU).
    pub parameters: u64,
    /// Their bf16 copy, the matrix products' operand (a GPU under bf16; else 0).
    pub parameter_copy: u64,
    pub gradients: u64,
    /// The two moments `m` and `v`.
    pub adamw: u64,
    /// What the forward pass keeps for the backward pass.
    pub activations: Vec<Activation>,
    /// Backward scratch, one block's worth, reused by every block.
    pub backward_scratch: Vec<Activation>,
    /// The GPU kernels' work space and cuBLASLt's (empty on the CPU).
    pub workspace: Vec<Activation>,
    /// The scratch of the CPU's MPI collectives, with several ranks.
    pub collective: u64,
}

impl Memory {
    /// Memory for a training step on `batch_size` sequences of `seq_len` tokens
    /// on `target`.
    ///
    /// These are the buffers `model.rs` allocates once per `(B, T)` (llm.c's
    /// layout). Kept for backward, per block: each RMSNorm's output (pre-norm:
    /// `ln1`, `ln2`; post-norm: `ln1`, as `ln2`'s output is the block output) and
    /// its `1/rms` per position; Q, K, V after RoPE; the attention probabilities
    /// `(B, H, T, T)`; the attention output before `output_proj`; the residual sums
    /// (`x + attn` and the block output, plus post-norm's sum before `ln2`); the
    /// FFN's `W1 x`, `W3 x` (SwiGLU) and gated product. Once: the token ids and
    /// targets, the embedding output, `ln_final`'s output and `1/rms`, and the
    /// logits `(B, T, V)`, which the loss overwrites with their gradient. Backward
    /// scratch: the gradients of one block's activations. On a GPU, the kernels'
    /// work space: attention's heads of q, k, v and their gradients `7 × (B, T, C)`,
    /// its f32 scores `(B, H, T, T)`, RMSNorm's gain partial sums, the per-row
    /// losses, and cuBLASLt's [`CUBLASLT_WORKSPACE`]. Evaluation runs in batches of
    /// the step's (micro-)batch and reuses these buffers.
    pub fn new(c: &ModelConfig, batch_size: usize, seq_len: usize, target: Target) -> Self {
        let params = ParamCounts::new(c).total() * 4;
        let (b, t) = (batch_size as u64, seq_len as u64);
        let (d, f, h, v) = (
            c.d_model as u64,
            c.d_ff as u64,
            c.num_heads as u64,
            c.vocab_size as u64,
        );
        let layers = c.num_layers as u64;
        let n = b * t;
        let typed = |element_bytes| {
            move |name, k: u64, shape: &str, elements, copies| Activation {
                name,
                shape: if k == 1 {
                    shape.to_string()
                } else {
                    format!("{k} × {shape}")
                },
                elements: k * elements,
                copies,
                element_bytes,
            }
        };
        // Activations in the target's width; statistics and token ids 4 bytes.
        let (buf, f32_buf) = (typed(target.activation_bytes()), typed(4));
        let (pre, post) = (c.norm == Norm::Pre, c.norm == Norm::Post);
        let ffn = if c.ffn == Ffn::Swiglu { 3 } else { 2 };
        let mut activations = vec![
            f32_buf("token ids, targets (u32)", 2, "(B, T)", n, 1),
            buf("embedding output", 1, "(B, T, C)", n * d, 1),
        ];
        if c.norm != Norm::None {
            let outputs = if pre { 2 } else { 1 };
            activations.push(buf("RMSNorm outputs", outputs, "(B, T, C)", n * d, layers));
            activations.push(f32_buf("RMSNorm 1/rms", 2, "(B, T)", n, layers));
        }
        activations.extend([
            buf("q, k, v after RoPE", 3, "(B, T, C)", n * d, layers),
            buf(
                "attention probabilities",
                1,
                "(B, H, T, T)",
                b * h * t * t,
                layers,
            ),
            buf("attention output", 1, "(B, T, C)", n * d, layers),
            buf(
                "residual sums",
                if post { 3 } else { 2 },
                "(B, T, C)",
                n * d,
                layers,
            ),
            buf("FFN hidden", ffn, "(B, T, F)", n * f, layers),
        ]);
        if pre {
            activations.push(buf("ln_final output", 1, "(B, T, C)", n * d, 1));
            activations.push(f32_buf("ln_final 1/rms", 1, "(B, T)", n, 1));
        }
        activations.push(buf("logits", 1, "(B, T, V)", n * v, 1));
        let backward_scratch = vec![
            buf("d residual", 2, "(B, T, C)", n * d, 1),
            buf("d q, k, v", 3, "(B, T, C)", n * d, 1),
            buf("d attention", 1, "(B, H, T, T)", b * h * t * t, 1),
            buf("d attention output", 1, "(B, T, C)", n * d, 1),
            buf("d FFN hidden", ffn, "(B, T, F)", n * f, 1),
        ];
        let workspace = match target {
            Target::Cpu => Vec::new(),
            Target::Cuda(_) => vec![
                buf("attention heads and gradients", 7, "(B, T, C)", n * d, 1),
                f32_buf(
                    "attention scores (f32)",
                    1,
                    "(B, H, T, T)",
                    b * h * t * t,
                    1,
                ),
                f32_buf("RMSNorm gain partial sums", 128, "(C)", d, 1),
                f32_buf("per-row losses", 1, "(B, T)", n, 1),
                typed(1)("cuBLASLt work space", 1, "", CUBLASLT_WORKSPACE, 1),
            ],
        };
        Memory {
            target,
            parameters: params,
            parameter_copy: match target {
                Target::Cuda(Precision::Bf16) => params / 2,
                _ => 0,
            },
            gradients: params,
            adamw: 2 * params,
            activations,
            backward_scratch,
            workspace,
            collective: 0,
        }
    }

    /// One rank's memory when training over `ranks` ranks (this one's activations
    /// being for its micro-batch): under ZeRO-1 (`sharded`) the AdamW moments of its
    /// shard of the parameters, and on the CPU the scratch of the MPI collectives (a
    /// shard, or at most [`MPI_CHUNK`] values; NCCL works in place).
    pub fn on_ranks(mut self, ranks: usize, sharded: bool) -> Self {
        if ranks > 1 {
            let params = self.parameters / 4;
            let shard = params.div_ceil(ranks as u64);
            if sharded {
                self.adamw = 2 * 4 * shard;
            }
            if self.target == Target::Cpu {
                self.collective = 4 * if sharded {
                    shard
                } else {
                    params.min(MPI_CHUNK as u64)
                };
            }
        }
        self
    }

    pub fn activation_bytes(&self) -> u64 {
        self.activations.iter().map(Activation::bytes).sum()
    }

    pub fn scratch_bytes(&self) -> u64 {
        self.backward_scratch.iter().map(Activation::bytes).sum()
    }

    pub fn workspace_bytes(&self) -> u64 {
        self.workspace.iter().map(Activation::bytes).sum()
    }

    pub fn total(&self) -> u64 {
        self.parameters
            + self.parameter_copy
            + self.gradients
            + self.adamw
            + self.activation_bytes()
            + self.scratch_bytes()
            + self.workspace_bytes()
            + self.collective
    }
}

/// The peak memory of a training run, per rank: a step's buffers on their
/// [`Target`] and what the run holds in host memory beside them. Evaluation adds
/// nothing (it runs in batches of the step's micro-batch, in its buffers), nor do
/// checkpoints on the CPU (written from the buffers, read back into them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunMemory {
    pub step: Memory,
    /// The host copy of a step's token ids and targets (this rank's share), and on
    /// a GPU their pinned staging (one micro-batch).
    pub batch: u64,
    /// On a GPU, the pinned host buffer every tensor of a checkpoint passes
    /// through, the size of the largest (f32); 0 on the CPU.
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
        let on_gpu = matches!(step.target, Target::Cuda(_));
        let largest_tensor = crate::params::ParamLayout::new(c)
            .specs
            .iter()
            .map(|s| s.len() as u64)
            .max()
            .unwrap_or(0);
        RunMemory {
            step,
            batch: ids(share) + if on_gpu { ids(micro) } else { 0 },
            checkpoint_staging: if on_gpu { 4 * largest_tensor } else { 0 },
            token_files,
        }
    }

    /// Host memory beside the step's buffers (all of it but the token files).
    pub fn host_extra(&self) -> u64 {
        self.batch + self.checkpoint_staging
    }

    /// The memory the run must have on its target: on the CPU the step's buffers
    /// and the host extras; on a GPU the step's buffers (device memory).
    pub fn required(&self) -> u64 {
        match self.step.target {
            Target::Cpu => self.step.total() + self.host_extra(),
            Target::Cuda(_) => self.step.total(),
        }
    }

    /// The process's peak resident memory (on the CPU): everything above and the
    /// token files' pages.
    pub fn peak_resident(&self) -> u64 {
        self.step.total() + self.host_extra() + self.token_files
    }
}

/// Memory of a model that only runs forward (generation, a forward pass,
/// evaluation), on one [`Target`]: it holds no gradient or optimizer state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InferenceMemory {
    /// The f32 parameters and, on a GPU under bf16, their bf16 copy.
    pub parameters: u64,
    /// Generation's KV cache: `num_layers × (context_length, 3C)`.
    pub kv_cache: u64,
    /// The pass's activations (a full pass's or one decoded position's) and on a
    /// GPU the kernels' work space.
    pub activations: u64,
    /// The logits copied to the host: `(B, T, V)` f32, or `(V)` per decoded token.
    pub host_logits: u64,
}

impl InferenceMemory {
    /// A forward pass over `batch_size` sequences of `seq_len` tokens.
    pub fn forward(c: &ModelConfig, batch_size: usize, seq_len: usize, target: Target) -> Self {
        let step = Memory::new(c, batch_size, seq_len, target);
        InferenceMemory {
            parameters: step.parameters + step.parameter_copy,
            kv_cache: 0,
            activations: step.activation_bytes() + step.workspace_bytes(),
            host_logits: 4 * (batch_size * seq_len * c.vocab_size) as u64,
        }
    }

    /// Generation: the KV cache for the whole context and the activations of one
    /// position attending to all of it (`model.rs`'s decoding buffers).
    pub fn generation(c: &ModelConfig, target: Target) -> Self {
        let value = target.activation_bytes();
        let (ctx, d, f, h, v) = (
            c.context_length as u64,
            c.d_model as u64,
            c.d_ff as u64,
            c.num_heads as u64,
            c.vocab_size as u64,
        );
        let layers = c.num_layers as u64;
        let ffn = if c.ffn == Ffn::Swiglu { 3 } else { 2 };
        let norms = match c.norm {
            Norm::Pre => 2,
            Norm::Post => 1,
            Norm::None => 0,
        };
        // Per block: norm outputs, attention row (H, ctx), attention output, r1,
        // FFN hidden, post-norm's r2; then every block's output, ln_final, logits.
        let per_layer = norms * d + h * ctx + 2 * d + ffn * f + u64::from(c.norm == Norm::Post) * d;
        let once = (layers + 1) * d + u64::from(c.norm == Norm::Pre) * d + v;
        let workspace = match target {
            Target::Cpu => 0,
            Target::Cuda(_) => 7 * ctx * d * value + 4 * h * ctx + CUBLASLT_WORKSPACE,
        };
        let params = Memory::new(c, 1, 1, target);
        InferenceMemory {
            parameters: params.parameters + params.parameter_copy,
            kv_cache: layers * ctx * 3 * d * value,
            activations: (layers * per_layer + once) * value + workspace,
            host_logits: 4 * v,
        }
    }

    pub fn total(&self) -> u64 {
        self.parameters + self.kv_cache + self.activations + self.host_logits
    }
}

/// What a run's memory depends on beside the model and its batch: where it runs,
/// over how many ranks, the sequence length and the token files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunShape {
    pub target: Target,
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
            target: Target::of(cfg.device, cfg.precision)?,
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
            Memory::new(c, micro, self.seq_len, self.target).on_ranks(self.ranks, self.sharded);
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

/// One matmul of the forward pass: `count` products `(m×n)(n×p)` per occurrence,
/// occurring `copies` times (once per block, or once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matmul {
    pub name: &'static str,
    pub m: u64,
    pub n: u64,
    pub p: u64,
    /// Independent products per occurrence (`B·H` for attention, 1 otherwise).
    pub count: u64,
    pub copies: u64,
}

impl Matmul {
    /// FLOPs of one occurrence: `count · 2mnp`.
    pub fn flops(&self) -> u64 {
        self.count * 2 * self.m * self.n * self.p
    }

    /// FLOPs of all occurrences in a forward pass.
    pub fn total_flops(&self) -> u64 {
        self.copies * self.flops()
    }
}

/// Every matmul of a forward pass over `batch_size` sequences of `seq_len`
/// tokens, block matmuls first (in execution order), then `lm_head`.
pub fn forward_matmuls(c: &ModelConfig, batch_size: usize, seq_len: usize) -> Vec<Matmul> {
    let (b, t) = (batch_size as u64, seq_len as u64);
    let (d, f, h, v) = (
        c.d_model as u64,
        c.d_ff as u64,
        c.num_heads as u64,
        c.vocab_size as u64,
    );
    let dk = d / h;
    let layers = c.num_layers as u64;
    // Linear `y = x Wᵀ` over all B·T positions: (BT × in)(in × out).
    let linear = |name, d_in, d_out, copies| Matmul {
        name,
        m: b * t,
        n: d_in,
        p: d_out,
        count: 1,
        copies,
    };
    let per_head = |name, n, p| Matmul {
        name,
        m: t,
        n,
        p,
        count: b * h,
        copies: layers,
    };
    let mut out = vec![
        linear("q_proj", d, d, layers),
        linear("k_proj", d, d, layers),
        linear("v_proj", d, d, layers),
        per_head("Q Kᵀ", dk, t),
        per_head("attention · V", t, dk),
        linear("output_proj", d, d, layers),
        linear("ffn.w1", d, f, layers),
    ];
    if c.ffn == Ffn::Swiglu {
        out.push(linear("ffn.w3", d, f, layers));
    }
    out.push(linear("ffn.w2", f, d, layers));
    out.push(linear("lm_head", d, v, 1));
    out
}

/// Total FLOPs of a forward pass (see [`forward_matmuls`]).
pub fn forward_flops(c: &ModelConfig, batch_size: usize, seq_len: usize) -> u64 {
    forward_matmuls(c, batch_size, seq_len)
        .iter()
        .map(Matmul::total_flops)
        .sum()
}

/// FLOPs of a training step (forward + backward): 3× the forward pass.
pub fn training_flops(c: &ModelConfig, batch_size: usize, seq_len: usize) -> u64 {
    3 * forward_flops(c, batch_size, seq_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Positional;
    use crate::params::ParamLayout;

    /// A rank's memory: activations for its micro-batch, a quarter of the AdamW
    /// moments over four ZeRO-1 ranks, and the collectives' scratch.
    #[test]
    fn one_rank_holds_its_micro_batch_and_shard() {
        let c = ModelConfig::tinystories();
        let whole = Memory::new(&c, 8, 256, Target::Cpu);
        let rank = Memory::new(&c, 2, 256, Target::Cpu).on_ranks(4, true);
        assert_eq!(4 * rank.activation_bytes(), whole.activation_bytes());
        assert_eq!(4 * rank.scratch_bytes(), whole.scratch_bytes());
        let params = whole.parameters / 4;
        assert_eq!(rank.adamw, 8 * params.div_ceil(4));
        assert_eq!(rank.collective, 4 * params.div_ceil(4));
        let replicated = Memory::new(&c, 2, 256, Target::Cpu).on_ranks(4, false);
        assert_eq!(replicated.adamw, whole.adamw);
        assert_eq!(replicated.collective, 4 * params.min(MPI_CHUNK as u64));
        assert_eq!(
            Memory::new(&c, 2, 256, Target::Cpu)
                .on_ranks(1, true)
                .collective,
            0
        );
    }

    /// On a GPU under bf16: activations and backward scratch in 2 bytes (their
    /// statistics and ids in 4), a bf16 copy of the parameters, and the kernels'
    /// work space; under fp32 the activations are the CPU's.
    #[test]
    fn gpu_widths_and_work_space() {
        let c = ModelConfig::tinystories();
        let (b, t) = (4, 256);
        let cpu = Memory::new(&c, b, t, Target::Cpu);
        let bf16 = Memory::new(&c, b, t, Target::Cuda(Precision::Bf16));
        let fp32 = Memory::new(&c, b, t, Target::Cuda(Precision::Fp32));
        assert_eq!(fp32.activation_bytes(), cpu.activation_bytes());
        assert_eq!(2 * bf16.scratch_bytes(), cpu.scratch_bytes());
        // Statistics: two (B, T) per layer and ln_final's; ids and targets.
        let (n, layers) = ((b * t) as u64, c.num_layers as u64);
        let four_byte = 4 * (2 * n * layers + n + 2 * n);
        assert_eq!(
            2 * (bf16.activation_bytes() - four_byte) + four_byte,
            cpu.activation_bytes()
        );
        assert_eq!(bf16.parameter_copy, bf16.parameters / 2);
        assert_eq!((fp32.parameter_copy, cpu.workspace_bytes()), (0, 0));
        let (d, h) = (c.d_model as u64, c.num_heads as u64);
        let work = 2 * 7 * n * d + 4 * (b as u64 * h * (t * t) as u64) + 4 * 128 * d + 4 * n;
        assert_eq!(bf16.workspace_bytes(), work + CUBLASLT_WORKSPACE);
        assert_eq!(
            bf16.total(),
            bf16.parameters * 9 / 2
                + bf16.activation_bytes()
                + bf16.scratch_bytes()
                + work
                + CUBLASLT_WORKSPACE
        );
        // NCCL needs no scratch; ZeRO-1 still shards the moments.
        let rank = Memory::new(&c, b, t, Target::Cuda(Precision::Bf16)).on_ranks(4, true);
        assert_eq!(
            (rank.collective, rank.adamw),
            (0, 8 * (bf16.parameters / 4).div_ceil(4))
        );
    }

    /// A run's peak: host extras on the CPU are the batch's ids; on a GPU also their
    /// pinned staging and the checkpoint's, the largest tensor (the embedding here).
    #[test]
    fn run_memory_on_cpu_and_gpu() {
        let c = ModelConfig::tinystories();
        let cpu = RunMemory::new(&c, Memory::new(&c, 2, 256, Target::Cpu), 8, 2, 256, 1000);
        assert_eq!((cpu.batch, cpu.checkpoint_staging), (8 * 8 * 256, 0));
        assert_eq!(cpu.required(), cpu.step.total() + cpu.batch);
        assert_eq!(cpu.peak_resident(), cpu.required() + 1000);
        let step = Memory::new(&c, 2, 256, Target::Cuda(Precision::Bf16));
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

    #[test]
    fn gpt2_xl_parameters_and_flops() {
        let c = ModelConfig::gpt2_xl();
        let p = ParamCounts::new(&c);
        // 50,257·1,600 = 80,411,200 for the embedding and again for lm_head;
        // a block: 4·1,600² + 3·1,600·6,400 + 2·1,600 = 40,963,200; ×48 blocks.
        assert_eq!(p.embedding, 80_411_200);
        assert_eq!(p.per_layer(), 40_963_200);
        assert_eq!(p.total(), 2 * 80_411_200 + 48 * 40_963_200 + 1_600);
        assert_eq!(p.total(), 2_127_057_600);
        assert_eq!(p.total(), ParamLayout::new(&c).total as u64);
        // Per block at T = 1,024: projections 4·2·T·d² = 20,971,520,000,
        // QKᵀ and attention·V 2·2·T²·d = 6,710,886,400, FFN 3·2·T·d·F =
        // 62,914,560,000; lm_head 2·T·d·V = 164,682,137,600.
        let per_layer = 20_971_520_000 + 6_710_886_400 + 62_914_560_000u64;
        let total = 48 * per_layer + 164_682_137_600;
        assert_eq!(total, 4_513_336_524_800);
        assert_eq!(forward_flops(&c, 1, 1024), total);
        assert_eq!(training_flops(&c, 2, 1024), 6 * total);
        let ffn: u64 = forward_matmuls(&c, 1, 1024)
            .iter()
            .filter(|m| m.name.starts_with("ffn"))
            .map(Matmul::total_flops)
            .sum();
        assert_eq!(ffn, 48 * 62_914_560_000);
    }

    #[test]
    fn tinystories_has_17m_non_embedding_parameters() {
        let p = ParamCounts::new(&ModelConfig::tinystories());
        // 4·(4·512² + 3·512·1,344 + 2·512) + 512 + 10,000·512.
        assert_eq!(p.non_embedding(), 17_576_448);
    }

    #[test]
    fn ablations_change_counts_like_the_layout() {
        let base = ModelConfig {
            vocab_size: 100,
            context_length: 16,
            d_model: 8,
            num_layers: 3,
            num_heads: 2,
            d_ff: 24,
            ..ModelConfig::tinystories()
        };
        let full = ParamCounts::new(&base).total();
        assert_eq!(full, 2 * 800 + 3 * (256 + 3 * 192 + 16) + 8);
        let with = |f: &dyn Fn(&mut ModelConfig)| {
            let mut c = base.clone();
            f(&mut c);
            let counts = ParamCounts::new(&c).total();
            assert_eq!(counts, ParamLayout::new(&c).total as u64, "{c:?}");
            (c, counts)
        };
        assert_eq!(with(&|c| c.norm = Norm::None).1, full - 3 * 16 - 8);
        assert_eq!(with(&|c| c.norm = Norm::Post).1, full - 8);
        assert_eq!(with(&|c| c.ffn = Ffn::Silu).1, full - 3 * 192);
        assert_eq!(with(&|c| c.tie_embeddings = true).1, full - 800);
        assert_eq!(with(&|c| c.positional = Positional::None).1, full);
        // FLOPs: SiLU drops w3; tying and norms leave the matmuls alone.
        let flops = forward_flops(&base, 2, 16);
        let (silu, _) = with(&|c| c.ffn = Ffn::Silu);
        assert_eq!(forward_flops(&silu, 2, 16), flops - 3 * 2 * 32 * 8 * 24);
        let (tied, _) = with(&|c| c.tie_embeddings = true);
        assert_eq!(forward_flops(&tied, 2, 16), flops);
    }

    #[test]
    fn memory_counts_each_buffer() {
        let c = ModelConfig {
            vocab_size: 100,
            context_length: 16,
            d_model: 8,
            num_layers: 3,
            num_heads: 2,
            d_ff: 24,
            ..ModelConfig::tinystories()
        };
        let m = Memory::new(&c, 2, 16, Target::Cpu);
        let params = ParamCounts::new(&c).total() * 4;
        assert_eq!(
            (m.parameters, m.gradients, m.adamw),
            (params, params, 2 * params)
        );
        // N = 32 rows, C = 8, F = 24, B·H·T·T = 2·2·16·16.
        let (n, att) = (32, 2 * 2 * 16 * 16);
        let layer = |norm_out, norm_rstd, sums, ffn| {
            norm_out * n * 8 + norm_rstd * n + 3 * n * 8 + att + n * 8 + sums * n * 8 + ffn * n * 24
        };
        let once = |lnf| 2 * n + n * 8 + lnf * (n * 8 + n) + n * 100;
        assert_eq!(m.activation_bytes(), 4 * (3 * layer(2, 2, 2, 3) + once(1)));
        let scratch = 4 * (5 * n * 8 + att + n * 8 + 3 * n * 24);
        assert_eq!(m.scratch_bytes(), scratch);
        assert_eq!(m.total(), 4 * params + m.activation_bytes() + scratch);
        let with = |f: &dyn Fn(&mut ModelConfig)| {
            let mut c = c.clone();
            f(&mut c);
            Memory::new(&c, 2, 16, Target::Cpu).activation_bytes()
        };
        assert_eq!(
            with(&|c| c.norm = Norm::None),
            4 * (3 * layer(0, 0, 2, 3) + once(0))
        );
        assert_eq!(
            with(&|c| c.norm = Norm::Post),
            4 * (3 * layer(1, 2, 3, 3) + once(0))
        );
        assert_eq!(
            with(&|c| c.ffn = Ffn::Silu),
            4 * (3 * layer(2, 2, 2, 2) + once(1))
        );
    }
}
