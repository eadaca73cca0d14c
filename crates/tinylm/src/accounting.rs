//! Resource accounting (SPEC §2): parameters by component, memory for training,
//! and the FLOPs of every matmul in one forward pass.
//!
//! FLOPs count each `(m×n)(n×p)` product as `2mnp`. Attention scores are counted
//! in full (`QKᵀ` is `T×T` per head although the causal mask discards half), the
//! usual convention; non-matmul work (softmax, norms, RoPE, SiLU) is left out. A
//! training step is about 3× the forward pass: the backward pass computes two
//! matmuls (input and weight gradients) per forward one.

use crate::config::{Ffn, ModelConfig, Norm};
use crate::distributed::MPI_CHUNK;

/// Parameter counts by component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamCounts {
    /// `token_embeddings.weight` (which is also the output projection when tied).
    pub embedding: u64,
    /// `q_proj`, `k_proj`, `v_proj`, `output_proj` of one block.
    pub attention_per_layer: u64,
    /// `w1`, `w2` (and `w3` with SwiGLU) of one block.
    pub ffn_per_layer: u64,
    /// `ln1` and `ln2` of one block (0 without RMSNorm).
    pub norms_per_layer: u64,
    pub num_layers: u64,
    /// `ln_final.weight` (pre-norm only).
    pub ln_final: u64,
    /// `lm_head.weight` (0 when tied to the embedding).
    pub lm_head: u64,
}

impl ParamCounts {
    pub fn new(c: &ModelConfig) -> Self {
        let (v, d, f) = (c.vocab_size as u64, c.d_model as u64, c.d_ff as u64);
        let ffn_mats = if c.ffn == Ffn::Swiglu { 3 } else { 2 };
        ParamCounts {
            embedding: v * d,
            attention_per_layer: 4 * d * d,
            ffn_per_layer: ffn_mats * d * f,
            norms_per_layer: if c.norm == Norm::None { 0 } else { 2 * d },
            num_layers: c.num_layers as u64,
            ln_final: if c.norm == Norm::Pre { d } else { 0 },
            lm_head: if c.tie_embeddings { 0 } else { v * d },
        }
    }

    pub fn per_layer(&self) -> u64 {
        self.attention_per_layer + self.ffn_per_layer + self.norms_per_layer
    }

    pub fn total(&self) -> u64 {
        self.embedding + self.num_layers * self.per_layer() + self.ln_final + self.lm_head
    }

    /// Everything but the token embedding (the CS336 convention: `lm_head` counts).
    pub fn non_embedding(&self) -> u64 {
        self.total() - self.embedding
    }
}

/// A group of `f32` buffers of the training step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Activation {
    pub name: &'static str,
    /// Its shape, written with `B`, `T`, `C` (d_model), `F` (d_ff), `H`, `V`.
    pub shape: String,
    /// Elements in one copy.
    pub elements: u64,
    /// Copies: `num_layers` for a block's buffers, 1 otherwise.
    pub copies: u64,
}

impl Activation {
    pub fn bytes(&self) -> u64 {
        4 * self.elements * self.copies
    }
}

/// Memory in bytes for training with AdamW in f32.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Memory {
    pub parameters: u64,
    pub gradients: u64,
    /// The two moments `m` and `v`.
    pub adamw: u64,
    /// What the forward pass keeps for the backward pass.
    pub activations: Vec<Activation>,
    /// Backward scratch, one block's worth, reused by every block.
    pub backward_scratch: Vec<Activation>,
    /// The scratch of the CPU's MPI collectives, with several ranks.
    pub collective: u64,
}

impl Memory {
    /// Memory for a training step on `batch_size` sequences of `seq_len` tokens.
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
    /// scratch: the gradients of one block's activations.
    pub fn new(c: &ModelConfig, batch_size: usize, seq_len: usize) -> Self {
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
        let buf = |name, k: u64, shape: &str, elements, copies| Activation {
            name,
            shape: if k == 1 {
                shape.to_string()
            } else {
                format!("{k} × {shape}")
            },
            elements: k * elements,
            copies,
        };
        let (pre, post) = (c.norm == Norm::Pre, c.norm == Norm::Post);
        let ffn = if c.ffn == Ffn::Swiglu { 3 } else { 2 };
        let mut activations = vec![
            buf("token ids, targets (u32)", 2, "(B, T)", n, 1),
            buf("embedding output", 1, "(B, T, C)", n * d, 1),
        ];
        if c.norm != Norm::None {
            let outputs = if pre { 2 } else { 1 };
            activations.push(buf("RMSNorm outputs", outputs, "(B, T, C)", n * d, layers));
            activations.push(buf("RMSNorm 1/rms", 2, "(B, T)", n, layers));
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
            activations.push(buf("ln_final 1/rms", 1, "(B, T)", n, 1));
        }
        activations.push(buf("logits", 1, "(B, T, V)", n * v, 1));
        let backward_scratch = vec![
            buf("d residual", 2, "(B, T, C)", n * d, 1),
            buf("d q, k, v", 3, "(B, T, C)", n * d, 1),
            buf("d attention", 1, "(B, H, T, T)", b * h * t * t, 1),
            buf("d attention output", 1, "(B, T, C)", n * d, 1),
            buf("d FFN hidden", ffn, "(B, T, F)", n * f, 1),
        ];
        Memory {
            parameters: params,
            gradients: params,
            adamw: 2 * params,
            activations,
            backward_scratch,
            collective: 0,
        }
    }

    /// One rank's memory when training over `ranks` ranks (this one's activations
    /// being for its micro-batch): under ZeRO-1 (`sharded`) the AdamW moments of its
    /// shard of the parameters, and the scratch of the CPU's MPI collectives (a
    /// shard, or at most [`MPI_CHUNK`] values).
    pub fn on_ranks(mut self, ranks: usize, sharded: bool) -> Self {
        if ranks > 1 {
            let params = self.parameters / 4;
            let shard = params.div_ceil(ranks as u64);
            if sharded {
                self.adamw = 2 * 4 * shard;
            }
            self.collective = 4 * if sharded {
                shard
            } else {
                params.min(MPI_CHUNK as u64)
            };
        }
        self
    }

    pub fn activation_bytes(&self) -> u64 {
        self.activations.iter().map(Activation::bytes).sum()
    }

    pub fn scratch_bytes(&self) -> u64 {
        self.backward_scratch.iter().map(Activation::bytes).sum()
    }

    pub fn total(&self) -> u64 {
        self.parameters
            + self.gradients
            + self.adamw
            + self.activation_bytes()
            + self.scratch_bytes()
            + self.collective
    }
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
        let whole = Memory::new(&c, 8, 256);
        let rank = Memory::new(&c, 2, 256).on_ranks(4, true);
        assert_eq!(4 * rank.activation_bytes(), whole.activation_bytes());
        assert_eq!(4 * rank.scratch_bytes(), whole.scratch_bytes());
        let params = whole.parameters / 4;
        assert_eq!(rank.adamw, 8 * params.div_ceil(4));
        assert_eq!(rank.collective, 4 * params.div_ceil(4));
        let replicated = Memory::new(&c, 2, 256).on_ranks(4, false);
        assert_eq!(replicated.adamw, whole.adamw);
        assert_eq!(replicated.collective, 4 * params.min(MPI_CHUNK as u64));
        assert_eq!(Memory::new(&c, 2, 256).on_ranks(1, true).collective, 0);
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
        let m = Memory::new(&c, 2, 16);
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
            Memory::new(&c, 2, 16).activation_bytes()
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
