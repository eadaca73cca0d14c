//! The model's weight matrices as the passes multiply by them, listed once: the
//! blocks and the LM head take their products' shapes from here, and so do the
//! FLOP count ([`crate::accounting::flops`]) and `tinylm bench-matmul`.

use crate::config::{Ffn, ModelConfig};
use crate::kernels::MatMul;

/// A weight matrix `W (d_out, d_in)` of a linear layer `y (N, d_out) = x (N, d_in)
/// · Wᵀ`. `q_proj`, `k_proj` and `v_proj` are adjacent in the parameters, so the
/// model multiplies by them as one `(3C, C)` matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Linear {
    /// `q_proj`, `k_proj`, `v_proj` together: `(3C, C)`.
    Qkv,
    OutputProj,
    W1,
    /// SwiGLU's gate (none under plain SiLU).
    W3,
    W2,
    LmHead,
}

impl Linear {
    /// The weight matrices of `c`'s model in the order a forward pass multiplies
    /// by them: a block's, then the LM head.
    pub fn all(c: &ModelConfig) -> Vec<Linear> {
        let mut out = vec![Linear::Qkv, Linear::OutputProj, Linear::W1];
        if c.ffn == Ffn::Swiglu {
            out.push(Linear::W3);
        }
        out.extend([Linear::W2, Linear::LmHead]);
        out
    }

    /// Its name (the parameters' names, the fused one `qkv_proj`).
    pub fn name(self) -> &'static str {
        match self {
            Linear::Qkv => "attn.qkv_proj",
            Linear::OutputProj => "attn.output_proj",
            Linear::W1 => "ffn.w1",
            Linear::W3 => "ffn.w3",
            Linear::W2 => "ffn.w2",
            Linear::LmHead => "lm_head",
        }
    }

    /// `(d_in, d_out)`.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let (d, f) = (c.d_model, c.d_ff);
        match self {
            Linear::Qkv => (d, 3 * d),
            Linear::OutputProj => (d, d),
            Linear::W1 | Linear::W3 => (d, f),
            Linear::W2 => (f, d),
            Linear::LmHead => (d, c.vocab_size),
        }
    }

    /// How many the model has: one per block, or one.
    pub fn copies(self, c: &ModelConfig) -> usize {
        match self {
            Linear::LmHead => 1,
            _ => c.num_layers,
        }
    }

    /// `y (n, d_out) = x (n, d_in) · Wᵀ` over `n` rows.
    pub fn forward(self, c: &ModelConfig, n: usize) -> MatMul {
        let (d_in, d_out) = self.dims(c);
        MatMul::linear(n, d_in, d_out)
    }

    /// Its backward's `dx (n, d_in) = dy (n, d_out) · W` ([`MatMul::linear_dx`]).
    pub fn dx(self, c: &ModelConfig, n: usize) -> MatMul {
        let (d_in, d_out) = self.dims(c);
        MatMul::linear_dx(n, d_in, d_out)
    }

    /// Its backward's `dW (d_out, d_in) = dyᵀ · x` ([`MatMul::linear_dw`]; the model's
    /// backward derives it from [`Linear::dx`]'s shape).
    pub fn dw(self, c: &ModelConfig, n: usize) -> MatMul {
        let (d_in, d_out) = self.dims(c);
        MatMul::linear_dw(n, d_in, d_out)
    }
}
