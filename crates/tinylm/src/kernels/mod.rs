//! The kernel interface the model orchestration is written against.
//!
//! Every layer is a forward and a backward kernel, llm.c style: plain buffers in,
//! plain buffers out, shapes in the doc comments as `(B, T, C)` with `N = B·T` rows,
//! `C = d_model`, `F = d_ff`, `H` heads of `D = C / H` channels, `V = vocab_size`.
//! Backward kernels *accumulate* (`+=`) into parameter gradients, like llm.c, so a
//! tied matrix simply receives both contributions; activation gradients are written
//! or accumulated as each signature says.
//!
//! [`Backend`] is the whole interface: [`model`](crate::model) runs forward and
//! backward only through it. The CPU backend ([`cpu::Cpu`]) implements it for any
//! [`Float`] (`f32` for real work, `f64` for the finite-difference gradient checks);
//! [`Profiled`] wraps any backend to time its kernels. The methods take plain
//! slices, so a CUDA backend implements them over buffers both sides can address
//! (unified memory) without touching the orchestration.

pub mod cpu;
pub mod profile;

pub use cpu::Cpu;
pub use profile::Profiled;

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// The element type of parameters and activations: `f32`, or `f64` in gradient checks.
pub trait Float:
    Copy
    + Send
    + Sync
    + Debug
    + Default
    + PartialOrd
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + Sum
{
    const ZERO: Self;
    const ONE: Self;
    /// The most negative finite value (the start of a running max).
    const MIN: Self;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    /// `e^x`; the `f32` version is a branch-free polynomial that vectorizes.
    fn exp(self) -> Self;
    fn sqrt(self) -> Self;
    fn max(self, other: Self) -> Self;
}

impl Float for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const MIN: Self = f32::MIN;
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn exp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        if self > other {
            self
        } else {
            other
        }
    }
}

impl Float for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const MIN: Self = f64::MIN;
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        if self > other {
            self
        } else {
            other
        }
    }
}

/// `e^x` for `f32` within ~2 ulp, no branches or calls, so loops over it vectorize:
/// `e^x = 2^n · e^r` with `n = round(x / ln 2)`, `|r| ≤ ln 2 / 2` and a degree-6
/// polynomial for `e^r` (Cephes `expf`). Inputs below -87.3 give 0 (the softmax
/// and SiLU only need that end), above 88.3 they saturate near `f32::MAX`.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Round-to-nearest by adding and removing 1.5·2^23.
    const SHIFTER: f32 = 12_582_912.0;
    let underflow = x < -87.3;
    let x = x.clamp(-87.3, 88.3);
    let shifted = x * LOG2E + SHIFTER;
    let n = shifted - SHIFTER;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // n sits in the low mantissa bits of `shifted`; integer ops keep it vectorized.
    let biased = shifted
        .to_bits()
        .wrapping_sub(SHIFTER.to_bits())
        .wrapping_add(127);
    let scale = f32::from_bits(biased << 23);
    if underflow {
        0.0
    } else {
        e_r * scale
    }
}

/// The shape of one matrix product `out (m, n) = a (m, k) · b (k, n)` over
/// contiguous row-major buffers, either operand possibly stored transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatMul {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// `a` is stored `(k, m)`.
    pub a_transposed: bool,
    /// `b` is stored `(n, k)` — a PyTorch `(out, in)` weight used as `x Wᵀ`.
    pub b_transposed: bool,
    /// `out += a·b` instead of `out = a·b`.
    pub accumulate: bool,
}

impl MatMul {
    /// `y (N, out) = x (N, in) · Wᵀ`, `W (out, in)`: a linear layer's forward.
    pub fn linear(n: usize, d_in: usize, d_out: usize) -> Self {
        MatMul {
            m: n,
            k: d_in,
            n: d_out,
            a_transposed: false,
            b_transposed: true,
            accumulate: false,
        }
    }

    /// `dx (N, in) = dy (N, out) · W`: a linear layer's input gradient.
    pub fn linear_dx(n: usize, d_in: usize, d_out: usize) -> Self {
        MatMul {
            m: n,
            k: d_out,
            n: d_in,
            a_transposed: false,
            b_transposed: false,
            accumulate: false,
        }
    }

    /// `dW (out, in) += dyᵀ · x`: a linear layer's weight gradient (always accumulates).
    pub fn linear_dw(n: usize, d_in: usize, d_out: usize) -> Self {
        MatMul {
            m: d_out,
            k: n,
            n: d_in,
            a_transposed: true,
            b_transposed: false,
            accumulate: true,
        }
    }

    /// The same product, accumulating into `out`.
    pub fn accumulating(self) -> Self {
        MatMul {
            accumulate: true,
            ..self
        }
    }

    /// `2·m·k·n`.
    pub fn flops(&self) -> u64 {
        2 * (self.m * self.k * self.n) as u64
    }
}

/// Shape of a batch of sequences for attention: `B` sequences of `T` positions,
/// `H` heads of `D` channels (`C = H·D`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub d: usize,
    /// Only positions `q0..t` are queries (all positions are keys): 0 for a full
    /// pass, `t - 1` to decode one token against a KV cache.
    pub q0: usize,
}

impl AttnShape {
    /// Queries per sequence.
    pub fn tq(&self) -> usize {
        self.t - self.q0
    }
    /// `C = H·D`.
    pub fn c(&self) -> usize {
        self.h * self.d
    }
}

/// The kernels one backend provides. Shapes: `N` rows of `C` channels etc. (see the
/// module doc); every buffer is row-major and exactly the size its shape says.
pub trait Backend<F: Float>: Sync {
    /// `out = a·b` or `out += a·b` (see [`MatMul`]).
    fn matmul(&self, out: &mut [F], a: &[F], b: &[F], shape: MatMul);

    /// `dst = src`.
    fn copy(&self, dst: &mut [F], src: &[F]);

    /// `out (N, C) = table[ids]`, `table (V, C)`.
    fn embedding_forward(&self, out: &mut [F], ids: &[u32], table: &[F]);
    /// `dtable (V, C) += scatter(dout (N, C))` at rows `ids (N)`.
    fn embedding_backward(&self, dtable: &mut [F], dout: &[F], ids: &[u32]);

    /// `out (N, C) = x / sqrt(mean(x²) + 1e-5) ⊙ g`; keeps `rstd (N)` for backward.
    fn rmsnorm_forward(&self, out: &mut [F], rstd: &mut [F], x: &[F], g: &[F]);
    /// `dx (N, C) (+)= ∂/∂x`, `dg (C) += ∂/∂g` for the gradient `dout (N, C)`;
    /// `dx` is accumulated into when `accumulate`, else overwritten.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self,
        dx: &mut [F],
        dg: &mut [F],
        dout: &[F],
        x: &[F],
        g: &[F],
        rstd: &[F],
        accumulate: bool,
    );

    /// SwiGLU `out = SiLU(a) ⊙ b`, or plain `out = SiLU(a)` when `b` is `None`;
    /// all `(N, F)`.
    fn swiglu_forward(&self, out: &mut [F], a: &[F], b: Option<&[F]>);
    /// `da`, `db` (overwritten) from `dout`; `db`/`b` are `None` together for SiLU.
    fn swiglu_backward(
        &self,
        da: &mut [F],
        db: Option<&mut [F]>,
        dout: &[F],
        a: &[F],
        b: Option<&[F]>,
    );

    /// Rotates the query and key parts of the new rows `qkv (B, Tq, 3C)` in place by
    /// RoPE (adjacent pairs; row `i` is at position `q0 + i`), or by the inverse
    /// rotation — the backward pass — when `inverse`. `cos`, `sin`: `(context_length, D/2)`.
    fn rope(&self, qkv: &mut [F], cos: &[F], sin: &[F], shape: AttnShape, inverse: bool);

    /// Causal softmax attention: `out (B, Tq, C)` from `qkv (B, T, 3C)` = rows
    /// `[q | k | v]`, query row `i` (position `q0 + i`) attending keys `0..=q0+i`;
    /// keeps the probabilities `att (B, H, Tq, T)`.
    fn attention_forward(&self, out: &mut [F], att: &mut [F], qkv: &[F], shape: AttnShape);
    /// `dqkv (B, T, 3C)` (overwritten) from `dout (B, T, C)`; `datt (B, H, T, T)` is
    /// scratch. Full passes only (`q0 = 0`).
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        dqkv: &mut [F],
        datt: &mut [F],
        dout: &[F],
        qkv: &[F],
        att: &[F],
        shape: AttnShape,
    );

    /// Mean cross-entropy of `logits (N, V)` against `targets (N)`; with `grad`, the
    /// logits are overwritten in the same pass by `∂loss/∂logits = (softmax − onehot)/N`.
    fn cross_entropy(&self, logits: &mut [F], targets: &[u32], grad: bool) -> F;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate_over_the_range_softmax_uses() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let want = (x as f64).exp();
            let rel = ((exp_f32(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-1000.0), 0.0);
        assert_eq!(exp_f32(f32::MIN), 0.0);
        assert!(exp_f32(1000.0).is_finite() && exp_f32(1000.0) > 1e38);
    }
}
