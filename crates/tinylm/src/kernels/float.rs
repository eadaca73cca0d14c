//! The element type of the kernels ([`Float`]: `f32` for real work, `f64` for the
//! finite-difference gradient checks), how a buffer stores it ([`Element`]: as it
//! is, or as bf16) and the vectorizable `exp` the softmax and SiLU kernels use.

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
    + bytemuck::Pod
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
    /// The larger of the two (`other` when they compare equal or either is NaN).
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        if self > other {
            self
        } else {
            other
        }
    }
}

/// The two impls, apart only in the exponential: `f32`'s vectorizes.
macro_rules! impl_float {
    ($t:ty, $exp:path) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const MIN: Self = <$t>::MIN;
            #[inline(always)]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
        }
    };
}
impl_float!(f32, exp_f32);
impl_float!(f64, f64::exp);

/// How a kernel's output (or input) buffer stores values the kernel computes in
/// `F`: as `F` itself, or — under bf16 mixed precision, for `f32` — as bf16,
/// rounded to nearest, ties to even (`half::bf16`, implemented in
/// `cpu/bf16/element.rs` on the one rounding of `cpu/bf16/round.rs`).
pub trait Element<F: Float>: Copy + Send + Sync + 'static {
    fn load(self) -> F;
    fn store(x: F) -> Self;
    /// `dst[i] = store(src[i])` over equal-length slices: kernels compute a tile of
    /// values in `F` and store it whole, which a type can do in vectors where its
    /// `store` alone would keep the computing loop from vectorizing.
    #[inline(always)]
    fn store_slice(dst: &mut [Self], src: &[F]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::store(s);
        }
    }
}

impl<F: Float> Element<F> for F {
    #[inline(always)]
    fn load(self) -> F {
        self
    }
    #[inline(always)]
    fn store(x: F) -> F {
        x
    }
    #[inline(always)]
    fn store_slice(dst: &mut [F], src: &[F]) {
        dst.copy_from_slice(src);
    }
}

/// Values per tile of [`store_tiled`]: 1 KiB of `f32`, in L1.
pub const TILE: usize = 256;

/// `out[i] = O::store(value)` for the values that `fill(range, tile)` computes into
/// `tile[..range.len()]` for each range of at most [`TILE`] indices of `out`: the
/// computing loop writes plain `F`s (and vectorizes), the tile is stored whole
/// ([`Element::store_slice`]).
#[inline(always)]
pub fn store_tiled<F: Float, O: Element<F>>(
    out: &mut [O],
    mut fill: impl FnMut(std::ops::Range<usize>, &mut [F]),
) {
    let mut tile = [F::ZERO; TILE];
    for (t, out) in out.chunks_mut(TILE).enumerate() {
        let tile = &mut tile[..out.len()];
        fill(t * TILE..t * TILE + out.len(), tile);
        O::store_slice(out, tile);
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
