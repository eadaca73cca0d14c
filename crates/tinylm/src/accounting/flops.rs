//! Parameters by component (counted in `config.rs`, whose validation limits them)
//! and the FLOPs of every matrix product of a forward pass (SPEC §2): the weight
//! matrices the model multiplies by ([`Linear`], the list its passes take their
//! products from) and attention's two products per head.
//!
//! FLOPs count each `(m×k)(k×n)` product as `2mkn`. Attention scores are counted
//! in full (`QKᵀ` is `T×T` per head although the causal mask discards half), the
//! usual convention; non-matmul work (softmax, norms, RoPE, SiLU) is left out. A
//! training step is about 3× the forward pass: the backward pass computes two
//! matmuls (input and weight gradients) per forward one.

use crate::config::ModelConfig;
pub use crate::config::ParamCounts;
use crate::kernels::MatMul;
use crate::model::products::Linear;

/// One matrix product of the forward pass: `count` independent products of `shape`
/// per occurrence, occurring `copies` times (once per block, or once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Product {
    pub name: &'static str,
    pub shape: MatMul,
    /// Independent products per occurrence (`B·H` for attention, 1 otherwise).
    pub count: u64,
    pub copies: u64,
}

impl Product {
    /// FLOPs of one occurrence: `count · 2mkn`.
    pub fn flops(&self) -> u64 {
        self.count * self.shape.flops()
    }

    /// FLOPs of all occurrences in a forward pass.
    pub fn total_flops(&self) -> u64 {
        self.copies * self.flops()
    }
}

/// Every matrix product of a forward pass over `batch_size` sequences of `seq_len`
/// tokens in the order the model runs them: a block's (its weight matrices over
/// all `B·T` rows, attention's per head after the fused `qkv_proj`), then
/// `lm_head`.
pub fn forward_matmuls(c: &ModelConfig, batch_size: usize, seq_len: usize) -> Vec<Product> {
    let (b, t) = (batch_size, seq_len);
    let dk = c.head_dim();
    let per_head = |name, shape| Product {
        name,
        shape,
        count: (b * c.num_heads) as u64,
        copies: c.num_layers as u64,
    };
    let q_kt = MatMul {
        b_transposed: true,
        ..MatMul::plain(t, dk, t)
    };
    let mut out = Vec::new();
    for linear in Linear::all(c) {
        out.push(Product {
            name: linear.name(),
            shape: linear.forward(c, b * t),
            count: 1,
            copies: linear.copies(c) as u64,
        });
        if linear == Linear::Qkv {
            out.push(per_head("Q Kᵀ", q_kt));
            out.push(per_head("attention · V", MatMul::plain(t, t, dk)));
        }
    }
    out
}

/// Total FLOPs of a forward pass (see [`forward_matmuls`]).
pub fn forward_flops(c: &ModelConfig, batch_size: usize, seq_len: usize) -> u64 {
    forward_matmuls(c, batch_size, seq_len)
        .iter()
        .map(Product::total_flops)
        .sum()
}

/// FLOPs of a training step (forward + backward): 3× the forward pass — 6 per
/// parameter of every matrix product per token, plus attention's `QKᵀ` and `PV` as
/// full `T×T` products (the usual model-FLOPs count; the kernels skip most of the
/// masked triangle).
pub fn training_flops(c: &ModelConfig, batch_size: usize, seq_len: usize) -> u64 {
    3 * forward_flops(c, batch_size, seq_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Ffn, Norm, Positional};
    use crate::params::ParamLayout;

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
            .map(Product::total_flops)
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
}
