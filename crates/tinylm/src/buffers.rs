//! The model's buffers, declared once: what a [`Model`](crate::Model) holds for its
//! life — parameters, their gradient, the RoPE tables, step statistics, AdamW
//! moments — and what a pass over `(B, T)` writes — activations, backward scratch,
//! a decoding KV cache —, each allocated by [`Role`] (its name and shape) from an
//! [`Allocator`]. The model allocates from its backend; the memory accounting
//! ([`crate::accounting`]) runs the same declarations with an allocator that only
//! sizes them, so what it counts is what the model allocates.
//!
//! Shapes: `B` sequences of `T` tokens, `N = B·T` rows, `C = d_model`, `F = d_ff`,
//! `H` heads of `D` channels, `V = vocab_size`; a buffer an ablation does not use is
//! empty. An activation the backward pass reads only as a matrix-product operand is
//! declared [`BufKind::Operands`] (bf16 under mixed precision).

use crate::config::{Ffn, ModelConfig, Norm, Positional};
use crate::kernels::{Allocator, BufKind, Float, Role};
use crate::params::ParamLayout;
use crate::Result;

const fn role(name: &'static str, shape: &'static str) -> Role {
    Role { name, shape }
}

/// The roles of what a model holds for its life.
pub const PARAMETERS: Role = role("parameters", "");
pub const GRADIENTS: Role = role("gradients", "");
pub const ADAMW_M: Role = role("AdamW m", "");
pub const ADAMW_V: Role = role("AdamW v", "");
pub const ROPE_COS: Role = role("RoPE cos table", "(context, D/2)");
pub const ROPE_SIN: Role = role("RoPE sin table", "(context, D/2)");
pub const STATISTICS: Role = role("step statistics", "");
pub const KV_CACHE: Role = role("KV cache", "(context, 3C)");

/// The parameters, `total` values in [`ParamLayout`] order (a mixed-precision
/// backend keeps their low-precision copy beside them).
pub fn parameters<F: Float, A: Allocator<F>>(a: &A, layout: &ParamLayout) -> Result<A::Buf> {
    a.alloc(PARAMETERS, layout.total, BufKind::Params)
}

/// The parameters' gradient, in the same layout.
pub fn gradients<F: Float, A: Allocator<F>>(a: &A, layout: &ParamLayout) -> Result<A::Buf> {
    a.alloc(GRADIENTS, layout.total, BufKind::Full)
}

/// AdamW's moments `m` and `v` of `len` parameters (all, or a ZeRO-1 shard).
pub fn moments<F: Float, A: Allocator<F>>(a: &A, len: usize) -> Result<[A::Buf; 2]> {
    Ok([
        a.alloc(ADAMW_M, len, BufKind::Full)?,
        a.alloc(ADAMW_V, len, BufKind::Full)?,
    ])
}

/// RoPE's cosine and sine tables `(context_length, D/2)` (empty without RoPE).
pub fn rope_tables<F: Float, A: Allocator<F>>(a: &A, c: &ModelConfig) -> Result<[A::Buf; 2]> {
    let len = match c.positional {
        Positional::Rope => c.context_length * c.head_dim() / 2,
        Positional::None => 0,
    };
    Ok([
        a.alloc(ROPE_COS, len, BufKind::Full)?,
        a.alloc(ROPE_SIN, len, BufKind::Full)?,
    ])
}

/// The model's statistics buffers: two for the training steps in flight, one for
/// what is read at once.
pub fn statistics<F: Float, A: Allocator<F>>(a: &A) -> Result<[A::Stats; 3]> {
    Ok([
        a.alloc_stats(STATISTICS)?,
        a.alloc_stats(STATISTICS)?,
        a.alloc_stats(STATISTICS)?,
    ])
}

/// A decoding KV cache's rows, per layer `(context_length, 3C)` ([`BufKind::Cache`]).
pub fn kv_cache<F: Float, A: Allocator<F>>(a: &A, c: &ModelConfig) -> Result<Vec<A::Buf>> {
    let len = c.context_length * 3 * c.d_model;
    (0..c.num_layers)
        .map(|_| a.alloc(KV_CACHE, len, BufKind::Cache))
        .collect()
}

/// The shape of a forward pass: `b` sequences of `t` new positions attending
/// `keys` positions — `keys = t` for a full pass; for a decoding pass (`decode`),
/// `t` new rows of one or more sequences appended to their KV caches, each attending
/// at most `keys = context_length` positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PassShape {
    pub b: usize,
    pub t: usize,
    pub keys: usize,
    pub decode: bool,
}

impl PassShape {
    /// A full pass over `b` sequences of `t` tokens.
    pub fn full(b: usize, t: usize) -> Self {
        PassShape {
            b,
            t,
            keys: t,
            decode: false,
        }
    }

    /// A decoding pass of `rows` new positions, in all, against KV caches of
    /// `context_length` positions.
    pub fn decode(rows: usize, context_length: usize) -> Self {
        PassShape {
            b: 1,
            t: rows,
            keys: context_length,
            decode: true,
        }
    }
}

/// One block's activations, `N` rows.
pub(crate) struct LayerActs<Buf> {
    /// `(N, C)`, `(N)`: pre-norm `ln1(x)`; post-norm `ln1(r1)` (= the FFN input).
    pub ln1: Buf,
    pub rstd1: Buf,
    /// `(N, 3C)` queries (after RoPE), keys (after RoPE), values; when decoding,
    /// copied from here into each sequence's KV cache.
    pub qkv: Buf,
    /// What attention keeps for its backward ([`AttentionKeeps`](crate::kernels::AttentionKeeps)):
    /// the probabilities `(B, H, Tq, T)` or each row's log-sum-exp `(B, H, Tq)`;
    /// when decoding, each sequence's one after another.
    pub att: Buf,
    /// `(N, C)` attention output before `output_proj`.
    pub atty: Buf,
    /// `(N, C)` first residual sum `x + attn`.
    pub r1: Buf,
    /// `(N, C)`, `(N)`: pre-norm `ln2(r1)`; post-norm keeps only `rstd2` of `ln2(r2)`.
    pub ln2: Buf,
    pub rstd2: Buf,
    /// `(N, F)` `W1 x`, `W3 x` (SwiGLU only), and the gated product.
    pub h1: Buf,
    pub h3: Buf,
    pub gate: Buf,
    /// `(N, C)` second residual sum before post-norm's `ln2` (post-norm only).
    pub r2: Buf,
}

/// Everything a forward pass writes, for one `(B, T)`.
pub(crate) struct Activations<Buf, Ids> {
    pub b: usize,
    pub t: usize,
    /// `(B, T)` input and target token ids.
    pub ids: Ids,
    pub targets: Ids,
    /// `num_layers + 1` of `(N, C)`: the embedding output and every block's output.
    pub resid: Vec<Buf>,
    pub layers: Vec<LayerActs<Buf>>,
    /// `(N, C)`, `(N)`: `ln_final` (pre-norm only).
    pub lnf: Buf,
    pub lnf_rstd: Buf,
    /// `(N, V)` logits, or their gradient after the loss.
    pub logits: Buf,
}

/// Everything a decoding pass ([`Model::decode`](crate::Model::decode)) writes: `N`
/// new rows of `S` sequences, one block's buffers reused by every block (nothing is
/// kept for a backward pass).
pub(crate) struct DecodeActivations<Buf, Ids> {
    pub rows: usize,
    pub sequences: usize,
    /// `(N)` the new token ids, each sequence's after the previous one's.
    pub ids: Ids,
    /// `(N, C)` twice: a block's input and its output, swapped after each block.
    pub resid: [Buf; 2],
    pub layer: LayerActs<Buf>,
    /// `(S, C)` each sequence's last row after the last block.
    pub last: Buf,
    /// `(S, C)`, `(S)`: `ln_final` of those rows (pre-norm only).
    pub lnf: Buf,
    pub lnf_rstd: Buf,
    /// `(S, V)` each sequence's next-token logits.
    pub logits: Buf,
}

/// Backward scratch for one `(B, T)`, reused by every block.
pub(crate) struct GradActivations<Buf> {
    /// `(N, C)` gradient flowing down the residual stream, and a second `(N, C)`.
    pub dresid: Buf,
    pub dtmp: Buf,
    /// `(N, 3C)`; attention's scratch (`AttentionKeeps::backward_len`); `(N, C)`.
    pub dqkv: Buf,
    pub datt: Buf,
    pub datty: Buf,
    /// `(N, F)` each (`dh3` empty for SiLU).
    pub dh1: Buf,
    pub dh3: Buf,
    pub dgate: Buf,
}

impl<Buf> LayerActs<Buf> {
    /// One block's buffers for a pass of `shape`.
    pub fn new<F: Float, A: Allocator<F, Buf = Buf>>(
        a: &A,
        c: &ModelConfig,
        shape: PassShape,
    ) -> Result<Self> {
        let PassShape { b, t, keys, .. } = shape;
        let n = b * t;
        let (d, f) = (c.d_model, c.d_ff);
        let (pre, post, norms) = (
            c.norm == Norm::Pre,
            c.norm == Norm::Post,
            c.norm != Norm::None,
        );
        let act_as = |kind, name, shape, used: bool, len: usize| {
            a.alloc(role(name, shape), if used { len } else { 0 }, kind)
        };
        let act = |name, shape, used, len| act_as(BufKind::Activations, name, shape, used, len);
        let operand = |name, shape, used, len| act_as(BufKind::Operands, name, shape, used, len);
        // Pre-norm's ln1 output is read only by the W_qkv products; post-norm's is the
        // residual stream (the FFN's input and the next residual sum).
        let ln1_kind = match pre {
            true => BufKind::Operands,
            false => BufKind::Activations,
        };
        let keeps = a.attention_keeps();
        let stat = |name, used: bool| {
            a.alloc(
                role(name, "(B, T)"),
                if used { n } else { 0 },
                BufKind::Full,
            )
        };
        Ok(LayerActs {
            ln1: act_as(ln1_kind, "ln1 output", "(B, T, C)", norms, n * d)?,
            rstd1: stat("ln1 1/rms", norms)?,
            qkv: act("q, k, v after RoPE", "(B, T, 3C)", true, n * 3 * d)?,
            att: a.alloc(
                keeps.roles()[0],
                keeps.forward_len(b * c.num_heads, t, keys),
                keeps.kind(),
            )?,
            atty: act("attention output", "(B, T, C)", true, n * d)?,
            r1: act("attention residual sum", "(B, T, C)", true, n * d)?,
            ln2: operand("ln2 output", "(B, T, C)", pre, n * d)?,
            rstd2: stat("ln2 1/rms", norms)?,
            h1: act("FFN W1 x", "(B, T, F)", true, n * f)?,
            h3: act("FFN W3 x", "(B, T, F)", c.ffn == Ffn::Swiglu, n * f)?,
            gate: operand("FFN gated product", "(B, T, F)", true, n * f)?,
            r2: act("FFN residual sum", "(B, T, C)", post, n * d)?,
        })
    }
}

impl<Buf, Ids> Activations<Buf, Ids> {
    /// Buffers for a pass of `shape`.
    pub fn new<F: Float, A: Allocator<F, Buf = Buf, Ids = Ids>>(
        a: &A,
        c: &ModelConfig,
        shape: PassShape,
    ) -> Result<Self> {
        let PassShape { b, t, .. } = shape;
        let (n, d) = (b * t, c.d_model);
        let pre = c.norm == Norm::Pre;
        let ids = |name| a.alloc_ids(role(name, "(B, T)"), n);
        let stream = |name| a.alloc(role(name, "(B, T, C)"), n * d, BufKind::Activations);
        let pre_only = |len| if pre { len } else { 0 };
        let (ids, targets) = (ids("token ids")?, ids("targets")?);
        let mut resid = vec![stream("embedding output")?];
        let mut layers = Vec::with_capacity(c.num_layers);
        for _ in 0..c.num_layers {
            layers.push(LayerActs::new(a, c, shape)?);
            resid.push(stream("block output")?);
        }
        Ok(Activations {
            b,
            t,
            ids,
            targets,
            resid,
            layers,
            lnf: a.alloc(
                role("ln_final output", "(B, T, C)"),
                pre_only(n * d),
                BufKind::Operands,
            )?,
            lnf_rstd: a.alloc(role("ln_final 1/rms", "(B, T)"), pre_only(n), BufKind::Full)?,
            logits: a.alloc(
                role("logits", "(B, T, V)"),
                n * c.vocab_size,
                BufKind::Activations,
            )?,
        })
    }
}

impl<Buf, Ids> DecodeActivations<Buf, Ids> {
    /// Buffers for a decoding pass of `rows` new positions of `sequences` sequences.
    pub fn new<F: Float, A: Allocator<F, Buf = Buf, Ids = Ids>>(
        a: &A,
        c: &ModelConfig,
        rows: usize,
        sequences: usize,
    ) -> Result<Self> {
        let (n, s, d) = (rows, sequences, c.d_model);
        let pre_only = |len| if c.norm == Norm::Pre { len } else { 0 };
        let act = |name, shape, len| a.alloc(role(name, shape), len, BufKind::Activations);
        Ok(DecodeActivations {
            rows,
            sequences,
            ids: a.alloc_ids(role("token ids", "(N)"), n)?,
            resid: [
                act("block input", "(N, C)", n * d)?,
                act("block output", "(N, C)", n * d)?,
            ],
            layer: LayerActs::new(a, c, PassShape::decode(n, c.context_length))?,
            last: act("last rows", "(S, C)", s * d)?,
            lnf: act("ln_final output", "(S, C)", pre_only(s * d))?,
            lnf_rstd: a.alloc(role("ln_final 1/rms", "(S)"), pre_only(s), BufKind::Full)?,
            logits: act("logits", "(S, V)", s * c.vocab_size)?,
        })
    }
}

impl<Buf> GradActivations<Buf> {
    /// Backward scratch for `b` sequences of `t` tokens.
    pub fn new<F: Float, A: Allocator<F, Buf = Buf>>(
        a: &A,
        c: &ModelConfig,
        b: usize,
        t: usize,
    ) -> Result<Self> {
        let n = b * t;
        let (d, f) = (c.d_model, c.d_ff);
        let act = |name, shape, len| a.alloc(role(name, shape), len, BufKind::Activations);
        let operand = |name, shape, len| a.alloc(role(name, shape), len, BufKind::Operands);
        let swiglu = c.ffn == Ffn::Swiglu;
        let keeps = a.attention_keeps();
        Ok(GradActivations {
            dresid: act("d residual stream", "(B, T, C)", n * d)?,
            dtmp: act("d sublayer input", "(B, T, C)", n * d)?,
            dqkv: act("d q, k, v", "(B, T, 3C)", n * 3 * d)?,
            datt: a.alloc(
                keeps.roles()[1],
                keeps.backward_len(b * c.num_heads, t),
                keeps.kind(),
            )?,
            datty: act("d attention output", "(B, T, C)", n * d)?,
            dh1: operand("d FFN W1 x", "(B, T, F)", n * f)?,
            dh3: operand("d FFN W3 x", "(B, T, F)", if swiglu { n * f } else { 0 })?,
            dgate: act("d FFN gated product", "(B, T, F)", n * f)?,
        })
    }
}
