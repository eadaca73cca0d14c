//! 8-bit weights for generation, llama.cpp's Q8_0: blocks of [`BLOCK`] values along
//! a row, each an f16 scale `d` and 32 int8 `q` with `x ≈ d·q` ([`quantize_block`],
//! ggml's `quantize_row_q8_0_ref` bit for bit: `tinylm export gguf --dtype q8_0`
//! writes the same blocks), and the products of a few rows against them.
//!
//! A product `x (m, k) · Wᵀ` quantizes `x` per block the same way (as llama.cpp's
//! CPU products do), sums each block's 32 int8 products exactly in `i32`, scales it
//! by both blocks' `d` and sums the blocks in `f32`:
//! `Σ_b dx_b · dw_b · Σ_t qx_t · qw_t`.
//!
//! On AVX512_VNNI, `vpdpbusd` multiplies unsigned by signed bytes, so the weights'
//! values are kept as `qw + 128` and each sum starts from `-128 · Σ qx` over its
//! values (itself a `vpdpbusd` of ones, once per row of `x` and 64 values, for
//! every weight row it meets): the buffer holds nothing but the blocks.

use super::linear::for_each_column_block;
use super::memory::{with_scratch, zeroed, SharedMut, WRITE_CHUNK};
use crate::kernels::kind::Q8_0_BLOCK;
use crate::kernels::{HostWrite, MatMul};
use crate::Result;
use half::f16;
use rayon::prelude::*;
use std::ops::Range;

/// Values per block (ggml's `QK8_0`).
pub const BLOCK: usize = Q8_0_BLOCK;

/// Quantizes up to [`BLOCK`] values `x` into `q` (the rest of `q` left as it is):
/// `d = max|x| / 127` (returned rounded to f16) and `q = round(x · (1/d))` with the
/// `f32` `d` (halves away from zero; `q = 0` where `d = 0`).
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> f16 {
    // The largest |x| in eight lanes side by side: each lane's running maximum is
    // a chain of its own, and those vectorize (one running maximum does not).
    let mut lanes = [0f32; 8];
    let (eights, rest) = x.as_chunks::<8>();
    for eight in eights {
        for (m, v) in lanes.iter_mut().zip(eight) {
            *m = m.max(v.abs());
        }
    }
    let amax = (rest.iter().chain(&lanes)).fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv_d = if d == 0.0 { 0.0 } else { 1.0 / d };
    let round = |x: f32| round_half_away(x * inv_d) as i8;
    match (<&[f32; BLOCK]>::try_from(x), q.first_chunk_mut::<BLOCK>()) {
        // A whole block: a loop of known length, which vectorizes.
        (Ok(x), Some(q)) => {
            for i in 0..BLOCK {
                q[i] = round(x[i]);
            }
        }
        _ => (q.iter_mut().zip(x)).for_each(|(q, &x)| *q = round(x)),
    }
    f16::from_f32(d)
}

/// `x.round()` (halves away from zero) for `|x| ≤ 2^22` (0 for NaN), in
/// operations that vectorize on a baseline x86-64, where `f32::round` is a call
/// to libm's `roundf` and a float-to-int cast (which saturates) is scalar: adding
/// 1.5·2^23 rounds `x` to an integer (ties to even) held in the sum's low bits,
/// and a tie that went toward zero moves away from it.
#[inline(always)]
fn round_half_away(x: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    let sum = x + MAGIC;
    let below = x - (sum - MAGIC);
    let away = (below == 0.5 && x > 0.0) as i32 - (below == -0.5 && x < 0.0) as i32;
    (sum.to_bits() as i32 - MAGIC.to_bits() as i32 + away) * !x.is_nan() as i32
}

/// A flat `f32` buffer in Q8_0 blocks (the last zero-padded): the weights' copy
/// that products read when a model generates with `--precision q8_0`.
pub struct Q8Buffer {
    len: usize,
    /// Each value's `q + 128` (`vpdpbusd`'s unsigned operand).
    q: Vec<u8>,
    /// Each block's scale `d`.
    d: Vec<f16>,
}

impl Q8Buffer {
    /// `len` zeros.
    pub fn new(len: usize) -> Self {
        let blocks = len.div_ceil(BLOCK);
        Q8Buffer {
            len,
            q: zeroed(blocks * BLOCK),
            d: zeroed(blocks),
        }
    }

    pub fn bytes(&self) -> u64 {
        (self.q.len() + 2 * self.d.len()) as u64
    }

    /// Quantizes again the blocks that hold values `range` of `values` (the whole
    /// buffer's `f32` values), in parallel.
    pub fn refresh(&mut self, values: &[f32], range: Range<usize>) {
        assert_eq!(values.len(), self.len, "q8 buffer size");
        let start = range.start / BLOCK * BLOCK;
        let end = (range.end.div_ceil(BLOCK) * BLOCK).min(self.len);
        let copy = |offset: usize, out: &mut [f32]| {
            out.copy_from_slice(&values[start + offset..][..out.len()]);
            Ok(())
        };
        self.write(start..end, &copy)
            .expect("copying values cannot fail");
    }

    /// Quantizes values `range` (whole blocks: it starts at a block, and ends at
    /// one or at the buffer's end) as `write(offset, out)` gives them — `out` values
    /// `range.start + offset..` at a time, from the rayon threads, each into its
    /// own scratch — so that no `f32` copy of them is ever whole.
    pub fn write(&mut self, range: Range<usize>, write: &HostWrite<'_, f32>) -> Result<()> {
        assert!(
            range.start.is_multiple_of(BLOCK)
                && (range.end.is_multiple_of(BLOCK) || range.end == self.len),
            "q8_0 values are written in whole blocks"
        );
        let blocks = range.start / BLOCK..range.end.div_ceil(BLOCK);
        let q = &mut self.q[blocks.start * BLOCK..blocks.end * BLOCK];
        let d = &mut self.d[blocks];
        const STEP: usize = WRITE_CHUNK / BLOCK;
        (q.par_chunks_mut(WRITE_CHUNK).zip(d.par_chunks_mut(STEP)))
            .enumerate()
            .try_for_each(|(i, (q, d))| {
                let offset = i * WRITE_CHUNK;
                let len = (range.len() - offset).min(WRITE_CHUNK);
                with_scratch(len, |x: &mut [f32]| {
                    write(offset, x)?;
                    store_blocks(x, &mut q[..len.next_multiple_of(BLOCK)], d);
                    Ok(())
                })
            })
    }
}

/// The int8 products this CPU runs, for reports: `vpdpbusd` where it has
/// AVX512_VNNI (with AVX512BW and F16C), else the portable loop.
pub fn kernel_name() -> &'static str {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if avx512::detected() {
        return "AVX512_VNNI (vpdpbusd)";
    }
    "portable (int8 values, i32 sums)"
}

/// `x` quantized into blocks of `q + 128` and their `d` (the buffer's form), on
/// AVX-512 where the CPU has it (the same values bit for bit, several times
/// faster: it is most of a Q8_0 model's load).
fn store_blocks(x: &[f32], q: &mut [u8], d: &mut [f16]) {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if avx512::detected() && x.len().is_multiple_of(BLOCK) {
        // SAFETY: the CPU has the instructions; `q` and `d` hold `x`'s blocks.
        return unsafe { avx512::store_blocks(x, q, d) };
    }
    store_blocks_portable(x, q, d)
}

/// [`store_blocks`] by [`quantize_block`].
fn store_blocks_portable(x: &[f32], q: &mut [u8], d: &mut [f16]) {
    for ((x, q), d) in x.chunks(BLOCK).zip(q.chunks_mut(BLOCK)).zip(d) {
        let mut block = [0i8; BLOCK];
        *d = quantize_block(x, &mut block);
        for (q, b) in q.iter_mut().zip(block) {
            *q = b as u8 ^ 0x80;
        }
    }
}

/// Rows of a product quantized at a time (rows past them run in a second pass
/// over the weight).
const ROWS: usize = 16;

/// `out (m, n) (+)= x (m, k) · Wᵀ` for `W (n, k)` the values of `w` from `w_start`
/// on, rows contiguous along `k` (a linear layer's weight): `x` quantized per
/// block, the sums as the module says. Columns are split among the threads as the
/// other few-rows products split them; every `ROWS` (16) rows of `x` stream the
/// weight once.
///
/// # Panics
/// If the product is not `x · Wᵀ` of a weight whose rows are whole blocks (`k`
/// and `w_start` multiples of [`BLOCK`]), or a size is not the shape's.
pub fn matmul_q8(out: &mut [f32], x: &[f32], w: &Q8Buffer, w_start: usize, s: MatMul) {
    let (m, k, n) = (s.m, s.k, s.n);
    assert!(
        s.b_transposed && !s.a_transposed,
        "q8_0 weights multiply as x · Wᵀ (generation), not in training's products"
    );
    assert!(
        k.is_multiple_of(BLOCK) && w_start.is_multiple_of(BLOCK),
        "q8_0 weights need rows of whole {BLOCK}-value blocks (k = {k})"
    );
    assert_eq!(out.len(), m * n, "matmul output size");
    assert_eq!(x.len(), m * k, "matmul lhs size");
    assert!(w_start + n * k <= w.len, "matmul rhs size");
    if k == 0 {
        if !s.accumulate {
            out.fill(0.0);
        }
        return;
    }
    let blocks = k / BLOCK;
    let w = Weight {
        q: w.q[w_start..].as_ptr(),
        d: w.d[w_start / BLOCK..].as_ptr(),
    };
    for (rows, out) in x.chunks(ROWS * k).zip(out.chunks_mut(ROWS * n)) {
        let m = rows.len() / k;
        with_scratch::<i8, _>(m * k, |xq| {
            with_scratch::<f32, _>(m * blocks, |xd| {
                quantize_rows(rows, xq, xd);
                let rows = Rows {
                    q: xq.as_ptr(),
                    d: xd.as_ptr(),
                };
                let out = SharedMut(out.as_mut_ptr());
                for_each_column_block(MatMul::linear(m, k, n), |cols| {
                    let out = &out;
                    // SAFETY: the operands hold their shapes (checked above); each
                    // block writes only its own columns.
                    unsafe { columns(out.get(), rows, w, (m, k, n), cols, s.accumulate) }
                });
            })
        });
    }
}

/// `x`'s rows quantized: `q` and `d` per block.
fn quantize_rows(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for ((x, q), d) in x.chunks(BLOCK).zip(q.chunks_mut(BLOCK)).zip(d) {
        *d = quantize_block(x, q).to_f32();
    }
}

/// A weight's blocks from its first row on.
#[derive(Clone, Copy)]
struct Weight {
    /// Each value's `q + 128`.
    q: *const u8,
    d: *const f16,
}

/// Quantized rows of `x`.
#[derive(Clone, Copy)]
struct Rows {
    q: *const i8,
    d: *const f32,
}

// SAFETY: read-only views of buffers that outlive the product.
unsafe impl Send for Weight {}
unsafe impl Sync for Weight {}
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

/// Columns `cols` of the product on the best kernel this CPU has.
///
/// # Safety
/// As [`matmul_q8`]'s checks; `out` holds `(m, n)` values no other thread writes
/// in `cols`.
unsafe fn columns(
    out: *mut f32,
    x: Rows,
    w: Weight,
    shape: (usize, usize, usize),
    cols: Range<usize>,
    accumulate: bool,
) {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if avx512::detected() {
        return avx512::columns(out, x, w, shape, cols, accumulate);
    }
    portable(out, x, w, shape, cols, accumulate)
}

/// [`columns`] in plain Rust: each block's `i32` sum, scaled, added in `f32`.
///
/// # Safety
/// As [`columns`].
unsafe fn portable(
    out: *mut f32,
    x: Rows,
    w: Weight,
    (m, k, n): (usize, usize, usize),
    cols: Range<usize>,
    accumulate: bool,
) {
    let blocks = k / BLOCK;
    for i in 0..m {
        let xq = std::slice::from_raw_parts(x.q.add(i * k), k);
        let xd = std::slice::from_raw_parts(x.d.add(i * blocks), blocks);
        for j in cols.clone() {
            let wq = std::slice::from_raw_parts(w.q.add(j * k), k);
            let wd = std::slice::from_raw_parts(w.d.add(j * blocks), blocks);
            let mut sum = 0f32;
            for b in 0..blocks {
                let range = b * BLOCK..(b + 1) * BLOCK;
                let dot: i32 = (xq[range.clone()].iter().zip(&wq[range]))
                    .map(|(&qx, &u)| qx as i32 * ((u ^ 0x80) as i8 as i32))
                    .sum();
                sum += xd[b] * wd[b].to_f32() * dot as f32;
            }
            let o = out.add(i * n + j);
            *o = if accumulate { *o + sum } else { sum };
        }
    }
}

#[cfg(all(target_arch = "x86_64", feature = "avx512"))]
mod avx512 {
    use super::{Rows, Weight, BLOCK};
    use crate::kernels::cpu::few_dots::{for_each_few_dot, DotRows, FewDots, FEW_W};
    use half::f16;
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Whether this CPU has the instructions.
    pub fn detected() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("f16c")
    }

    /// [`super::columns`] with `vpdpbusd` on 64 values (two blocks) at a time.
    ///
    /// # Safety
    /// As [`super::columns`]; the CPU must have AVX512_VNNI and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    pub unsafe fn columns(
        out: *mut f32,
        x: Rows,
        w: Weight,
        (m, k, n): (usize, usize, usize),
        cols: Range<usize>,
        accumulate: bool,
    ) {
        for_each_few_dot(&Dots { x, w, k }, m, cols, |i, j, sum| {
            let o = out.add(i * n + j);
            *o = if accumulate { *o + sum } else { sum };
        })
    }

    /// The operands of [`columns`]' dot products.
    struct Dots {
        x: Rows,
        w: Weight,
        k: usize,
    }

    /// [`super::store_blocks`] of whole blocks, 16 at a time: their `d` rounded
    /// to f16 together (`vcvtps2ph`, to nearest even as `f16::from_f32`), each
    /// block's values scaled by `1/d` of the unrounded `d` and rounded half away
    /// from zero as [`super::quantize_block`] does (truncation and the exact
    /// fraction; NaN to 0).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `q` and `d` hold `x`'s blocks.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn store_blocks(x: &[f32], q: &mut [u8], d: &mut [f16]) {
        assert!(x.len().is_multiple_of(BLOCK) && q.len() >= x.len() && d.len() >= x.len() / BLOCK);
        for ((x, q), d) in
            (x.chunks(16 * BLOCK).zip(q.chunks_mut(16 * BLOCK))).zip(d.chunks_mut(16))
        {
            let blocks = x.len() / BLOCK;
            let mut amax = [0f32; 16];
            for (b, amax) in amax.iter_mut().enumerate().take(blocks) {
                let (lo, hi) = (
                    _mm512_loadu_ps(x.as_ptr().add(b * BLOCK)),
                    _mm512_loadu_ps(x.as_ptr().add(b * BLOCK + 16)),
                );
                // vmaxps gives its second operand where the first is NaN: NaN is
                // skipped, as f32::max does.
                let lo = _mm512_max_ps(_mm512_abs_ps(lo), _mm512_setzero_ps());
                let m = _mm512_max_ps(_mm512_abs_ps(hi), lo);
                *amax = _mm512_reduce_max_ps(m);
            }
            let scale = _mm512_div_ps(_mm512_loadu_ps(amax.as_ptr()), _mm512_set1_ps(127.0));
            let halves =
                _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(scale);
            let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(scale, _mm512_setzero_ps());
            let inv = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0), scale);
            let mut inv_d = [0f32; 16];
            _mm512_storeu_ps(inv_d.as_mut_ptr(), inv);
            let mut rounded = [f16::ZERO; 16];
            _mm256_storeu_si256(rounded.as_mut_ptr().cast(), halves);
            d[..blocks].copy_from_slice(&rounded[..blocks]);
            for (b, &inv) in inv_d.iter().enumerate().take(blocks) {
                let inv = _mm512_set1_ps(inv);
                for half in 0..2 {
                    let at = b * BLOCK + 16 * half;
                    let y = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(at)), inv);
                    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
                    let frac = _mm512_sub_ps(y, t);
                    let one = _mm512_set1_ps(1.0);
                    let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
                    let down = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(frac, _mm512_set1_ps(-0.5));
                    let r = _mm512_mask_sub_ps(_mm512_mask_add_ps(t, up, t, one), down, t, one);
                    let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(y, y);
                    let qi = _mm512_maskz_cvttps_epi32(ordered, r);
                    let bytes = _mm_xor_si128(_mm512_cvtsepi32_epi8(qi), _mm_set1_epi8(-128));
                    _mm_storeu_si128(q.as_mut_ptr().add(at).cast(), bytes);
                }
            }
        }
    }

    /// The 16 lanes' scales of two blocks: `d[0]` in the low 8, `d[1]` (or 0 past
    /// the row's last block) in the high 8.
    #[inline(always)]
    unsafe fn pair_scales(d: *const f32, both: bool) -> __m512 {
        let lo = _mm512_set1_ps(*d);
        let hi = if both { *d.add(1) } else { 0.0 };
        _mm512_mask_broadcastss_ps(lo, 0xFF00, _mm_set_ss(hi))
    }

    /// [`pair_scales`] of f16 scales (a weight's), both converted at once.
    #[inline(always)]
    unsafe fn pair_scales_f16(d: *const f16, both: bool) -> __m512 {
        let bits = if both {
            d.cast::<u32>().read_unaligned() as i32
        } else {
            (*d).to_bits() as i32
        };
        let pair = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
        let lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm512_permutexvar_ps(lanes, pair)
    }

    impl FewDots for Dots {
        #[inline(always)]
        // (`rows.next` is not used: rows are fetched ahead always, below, a q8 row
        // being too short for the hardware prefetcher even on the first pass.)
        unsafe fn dots<const R: usize>(&self, rows: DotRows<R>) -> [[f32; FEW_W]; R] {
            let (is, js) = (rows.is, rows.js);
            let Dots { x, w, k } = *self;
            let blocks = k / BLOCK;
            let mut acc = [[_mm512_setzero_ps(); FEW_W]; R];
            let ones = _mm512_set1_epi8(1);
            for c in (0..k).step_by(2 * BLOCK) {
                let both = c + 2 * BLOCK <= k;
                let mask: __mmask64 = if both { !0 } else { (1 << BLOCK) - 1 };
                let b = c / BLOCK;
                let mut wv = [_mm512_setzero_si512(); FEW_W];
                let mut wd = [_mm512_setzero_ps(); FEW_W];
                for t in 0..FEW_W {
                    // The line 8 rows further along this row's stream (the rows of
                    // the walk's next steps are the next ones): a row is only k
                    // bytes, too short a stream for the hardware prefetcher to get
                    // ahead of.
                    let next = w.q.wrapping_add((js[t] + 2 * FEW_W) * k + c);
                    _mm_prefetch::<_MM_HINT_T0>(next.cast());
                    wv[t] = _mm512_maskz_loadu_epi8(mask, w.q.add(js[t] * k + c).cast());
                    wd[t] = pair_scales_f16(w.d.add(js[t] * blocks + b), both);
                }
                for r in 0..R {
                    let xv = _mm512_maskz_loadu_epi8(mask, x.q.add(is[r] * k + c).cast());
                    let xd = pair_scales(x.d.add(is[r] * blocks + b), both);
                    // Each lane's -128 · Σ qx over its 4 values: where its sums start.
                    let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xv);
                    let start =
                        _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sums));
                    for t in 0..FEW_W {
                        let dot = _mm512_dpbusd_epi32(start, wv[t], xv);
                        let scale = _mm512_mul_ps(xd, wd[t]);
                        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r][t]);
                    }
                }
            }
            // A loop, not `map`: a closure does not inherit the target features,
            // and the reduction it would call is not inlined (a third of a prompt).
            let mut sums = [[0.0; FEW_W]; R];
            for r in 0..R {
                for t in 0..FEW_W {
                    sums[r][t] = _mm512_reduce_add_ps(acc[r][t]);
                }
            }
            sums
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pseudo-random values of a few magnitudes, some blocks all zero.
    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| {
                let h = (i ^ seed).wrapping_mul(2_654_435_761) >> 8;
                let x = (h % 2001) as f32 / 1000.0 - 1.0;
                match i / BLOCK as u32 % 5 {
                    0 => 0.0,
                    1 => x * 1e-3,
                    _ => x,
                }
            })
            .collect()
    }

    /// The product by its definition, in `f64`: both operands quantized per
    /// block, `Σ_b dx_b · dw_b · Σ qx·qw`.
    fn reference(x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f64> {
        let quantized = |v: &[f32]| -> Vec<(f64, [i8; BLOCK])> {
            v.chunks(BLOCK)
                .map(|b| {
                    let mut q = [0i8; BLOCK];
                    (quantize_block(b, &mut q).to_f64(), q)
                })
                .collect()
        };
        let (xq, wq) = (quantized(x), quantized(w));
        let blocks = k / BLOCK;
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..blocks)
                    .map(|b| {
                        let ((dx, qx), (dw, qw)) = (xq[i * blocks + b], wq[j * blocks + b]);
                        let dot: i32 = qx.iter().zip(&qw).map(|(&a, &b)| a as i32 * b as i32).sum();
                        dx * dw * dot as f64
                    })
                    .sum();
            }
        }
        out
    }

    /// Every row count around the groups of 4 and [`ROWS`], `k` of odd and even
    /// block counts, the weight at an offset inside its buffer, written and
    /// accumulated, on the native kernel and the portable one: the definition, to
    /// `f32` rounding.
    #[test]
    fn products_equal_their_quantized_definition() {
        for (m, k, n) in [
            (1, 32, 1),
            (3, 96, 7),
            (5, 64, 9),
            (17, 160, 13),
            (16, 768, 70),
        ] {
            let offset = 3 * BLOCK;
            let x = values(m * k, 1);
            let w_all = values(offset + n * k + 5, 2);
            let w_values = &w_all[offset..offset + n * k];
            let mut w = Q8Buffer::new(w_all.len());
            w.refresh(&w_all, 0..w_all.len());
            let want = reference(&x, w_values, (m, k, n));
            for accumulate in [false, true] {
                let start = if accumulate { 0.5 } else { 0.0 };
                let check = |got: &[f32], what: &str| {
                    for (idx, (&g, &r)) in got.iter().zip(&want).enumerate() {
                        let r = r + start;
                        assert!(
                            (g as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()),
                            "{what} {m}x{k}x{n} at {idx}: {g} vs {r}"
                        );
                    }
                };
                let s = match accumulate {
                    true => MatMul::linear(m, k, n).accumulating(),
                    false => MatMul::linear(m, k, n),
                };
                let mut got = vec![0.5; m * n];
                matmul_q8(&mut got, &x, &w, offset, s);
                check(&got, "best kernel");
                // The portable kernel on the same quantized rows.
                let mut xq = vec![0i8; m * k];
                let mut xd = vec![0f32; m * k / BLOCK];
                quantize_rows(&x, &mut xq, &mut xd);
                let weight = Weight {
                    q: w.q[offset..].as_ptr(),
                    d: w.d[offset / BLOCK..].as_ptr(),
                };
                let rows = Rows {
                    q: xq.as_ptr(),
                    d: xd.as_ptr(),
                };
                let mut got = vec![0.5; m * n];
                // SAFETY: the shapes are the buffers'.
                unsafe { portable(got.as_mut_ptr(), rows, weight, (m, k, n), 0..n, accumulate) };
                check(&got, "portable");
            }
        }
    }

    /// The buffer's blocks, on the CPU's kernel and by [`quantize_block`], bit for
    /// bit: pseudo-random values, blocks of exact halves (`d = 1`), zeros, tiny
    /// values (a subnormal f16 `d`), NaN, and a last group of fewer than 16 blocks.
    #[test]
    fn stored_blocks_are_quantize_block_s() {
        let mut x = values(37 * BLOCK, 5);
        // Block 1: d = 127 / 127, and ±(i + 0.5) to round.
        x[BLOCK] = 127.0;
        for (i, v) in x[BLOCK + 1..2 * BLOCK].iter_mut().enumerate() {
            *v = (i as f32 + 0.5) * if i % 2 == 0 { 1.0 } else { -1.0 };
        }
        x[2 * BLOCK..3 * BLOCK].iter_mut().for_each(|v| *v *= 1e-9);
        x[3 * BLOCK + 7] = f32::NAN;
        let blocks = x.len() / BLOCK;
        let (mut q, mut d) = (vec![0u8; x.len()], vec![f16::ZERO; blocks]);
        store_blocks(&x, &mut q, &mut d);
        let (mut want_q, mut want_d) = (vec![0u8; x.len()], vec![f16::ZERO; blocks]);
        store_blocks_portable(&x, &mut want_q, &mut want_d);
        assert_eq!(q, want_q);
        let bits = |d: &[f16]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&d), bits(&want_d));
    }

    /// The rounding is `f32::round`'s, at and around every half of the range.
    #[test]
    fn rounding_is_half_away_from_zero() {
        assert_eq!(round_half_away(f32::NAN), 0);
        for i in -300..=300 {
            for x in [
                i as f32 * 0.5,
                f32::from_bits((i as f32 * 0.5).to_bits() + 1),
                f32::from_bits((i as f32 * 0.5).to_bits().saturating_sub(1)),
            ] {
                assert_eq!(round_half_away(x), x.round() as i32, "{x}");
            }
        }
    }

    /// Refreshing a range requantizes the blocks it touches and only those.
    #[test]
    fn a_refresh_requantizes_the_blocks_of_its_range() {
        let mut v = values(5 * BLOCK, 3);
        let mut q = Q8Buffer::new(v.len());
        q.refresh(&v, 0..v.len());
        let before = q.d.clone();
        v.iter_mut().for_each(|x| *x *= 2.0);
        q.refresh(&v, BLOCK + 3..2 * BLOCK + 1);
        for (b, (&now, &before)) in q.d.iter().zip(&before).enumerate() {
            let twice = (b == 1 || b == 2) && before != f16::ZERO;
            assert_eq!(now != before, twice, "block {b}");
        }
    }
}
