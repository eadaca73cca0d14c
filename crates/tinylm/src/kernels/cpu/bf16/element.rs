//! bf16 buffers of `f32` values (the [`Element`] that bf16 mixed precision stores
//! activations and weight copies in): stored by [`round_bf16`] — a whole slice in
//! vectors on AVX512_BF16 — and loaded exactly.

use super::round::{bf16_to_f32, round_bf16};
use crate::kernels::float::Element;
use half::bf16;

/// A bf16 buffer of `f32` values: stored by [`round_bf16`], loaded exactly.
impl Element<f32> for bf16 {
    #[inline(always)]
    fn load(self) -> f32 {
        bf16_to_f32(self.to_bits())
    }
    #[inline(always)]
    fn store(x: f32) -> bf16 {
        bf16::from_bits(round_bf16(x))
    }
    #[inline(always)]
    fn store_slice(dst: &mut [bf16], src: &[f32]) {
        round_slice(dst, src);
    }
}

/// `dst[i]` = `src[i]` rounded by [`round_bf16`], in vectors on AVX512_BF16
/// (`vcvtne2ps2bf16`, tested equal to it).
pub fn round_slice(dst: &mut [bf16], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "round_slice lengths");
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if super::avx512::Avx512Bf16::detected() {
        // SAFETY: the CPU has the instructions; the slices have equal lengths.
        return unsafe { super::avx512::round_slice(dst, src) };
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(round_bf16(s));
    }
}
