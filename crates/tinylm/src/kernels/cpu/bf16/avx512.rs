//! The AVX512_BF16 micro-kernel (x86-64: AMD Zen 4 and later, Intel Cooper Lake,
//! Sapphire Rapids and later): `vdpbf16ps` multiplies 16 pairs of bf16 values by
//! one broadcast pair and adds both products into 16 `f32` lanes — 32
//! multiply-adds per instruction, twice an `f32` FMA's 16.
//!
//! The tile is `8 × 32`: 16 accumulators (8 rows × 2 vectors of 16 columns), two
//! vectors of `B`'s pairs loaded per pair of `k` and each row's pair of `A`
//! broadcast once, 16 `vdpbf16ps` per 10 loads. (`8 × 48` tiles ran slower: 32
//! columns divide the models' widths — 256, 512, 704, 1,344 — and 48 do not.)
//!
//! Packing runs in vectors too, 16 or 32 values at a time, `f32` rounded by
//! `vcvtne2ps2bf16` (the rounding of [`round_bf16`](super::round::round_bf16)): a
//! source contiguous along `k` packed as pair rows is only rounded; one contiguous
//! along the rows has two rows interleaved (`vpermw`); one contiguous along `k`
//! packed as panels (a weight `W (out, in)` as `B` of `x·Wᵀ`) is transposed 16 × 16
//! pairs at a time.

use super::pack::{pack_pairs, Block, Layout, Microkernel, Tile};
use super::round::{Bf16Operand, Storage};
use crate::kernels::cpu::few_dots::{for_each_few_dot, DotRows, FewDots, FEW_W, FEW_X};
use std::arch::x86_64::*;

/// The AVX512_BF16 kernel.
pub struct Avx512Bf16;

/// Rows of the tile.
const MR: usize = 8;
/// Vectors of 16 columns in the tile.
const NV: usize = 2;
const NR: usize = 16 * NV;

impl Avx512Bf16 {
    /// Whether this CPU has the instructions.
    pub fn detected() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16")
    }
}

impl Microkernel for Avx512Bf16 {
    const MR: usize = MR;
    const NR: usize = NR;

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile(x: Tile, c: *mut f32, ldc: usize, accumulate: bool) {
        let (kp, a, a_rs, a_ps, b) = (x.kp, x.a, x.a_rs, x.a_ps, x.b);
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        if accumulate {
            for (i, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(c.add(i * ldc + 16 * v));
                }
            }
        }
        let rows: [*const u32; MR] = std::array::from_fn(|i| a.add(i * a_rs));
        for p in 0..kp {
            let bp = b.add(p * NR);
            let bv: [__m512bh; NV] = std::array::from_fn(|v| {
                std::mem::transmute(_mm512_loadu_si512(bp.add(16 * v).cast()))
            });
            for (row, ptr) in acc.iter_mut().zip(rows) {
                let pair: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*ptr.add(p * a_ps) as i32));
                for (x, &bv) in row.iter_mut().zip(&bv) {
                    *x = _mm512_dpbf16_ps(*x, bv, pair);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                _mm512_storeu_ps(c.add(i * ldc + 16 * v), x);
            }
        }
    }

    #[inline(always)]
    fn prefetch(p: *const u8) {
        // SAFETY: a prefetch is a hint; it never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) }
    }

    unsafe fn pack<E: Bf16Operand>(dst: &mut [u32], layout: Layout, x: Block<E>) {
        assert!(dst.len() >= x.padded_rows * x.kp(), "packed block size");
        // Whether the padded rows are whole panels of `w`.
        let (src, whole_panels) = (x.src, |w: usize| x.padded_rows.is_multiple_of(w));
        match layout {
            Layout::Rows if src.cs == 1 => pack_rows(dst.as_mut_ptr(), x),
            Layout::Panels(w) if src.rs == 1 && w.is_multiple_of(8) && whole_panels(w) => {
                pack_interleaved(dst.as_mut_ptr(), w, x)
            }
            Layout::Panels(w) if src.cs == 1 && w.is_multiple_of(16) && whole_panels(w) => {
                pack_transposed(dst.as_mut_ptr(), w, x)
            }
            _ => pack_pairs(dst, layout, x),
        }
    }
}

/// The lowest `count` bits set (`count ≤ 32`).
#[inline(always)]
fn low_bits(count: usize) -> u32 {
    if count >= 32 {
        u32::MAX
    } else {
        (1 << count) - 1
    }
}

/// `count ≤ 32` values from `p` as bf16 in the 16-bit lanes of a vector, the rest 0.
#[inline(always)]
unsafe fn load32<E: Bf16Operand>(p: *const E, count: usize) -> __m512i {
    let mask = low_bits(count);
    match E::STORAGE {
        Storage::F32 => {
            let p = p.cast::<f32>();
            let lo = _mm512_maskz_loadu_ps(mask as u16, p);
            let hi = _mm512_maskz_loadu_ps((mask >> 16) as u16, p.wrapping_add(16));
            std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
        }
        Storage::Bf16 => _mm512_maskz_loadu_epi16(mask, p.cast()),
    }
}

/// 32 values from `p` as bf16 in the 16-bit lanes of a vector (unmasked loads).
#[inline(always)]
unsafe fn load32_whole<E: Bf16Operand>(p: *const E) -> __m512i {
    match E::STORAGE {
        Storage::F32 => {
            let p = p.cast::<f32>();
            let (lo, hi) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
        }
        Storage::Bf16 => _mm512_loadu_si512(p.cast()),
    }
}

/// `count ≤ 16` values from `p` as bf16 in the 16-bit lanes of a vector, the rest 0.
#[inline(always)]
unsafe fn load16<E: Bf16Operand>(p: *const E, count: usize) -> __m256i {
    let mask = low_bits(count) as u16;
    match E::STORAGE {
        Storage::F32 => std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(
            _mm512_maskz_loadu_ps(mask, p.cast()),
        )),
        Storage::Bf16 => _mm256_maskz_loadu_epi16(mask, p.cast()),
    }
}

/// Rows ahead that [`pack_rows`] fetches.
const PREFETCH_ROWS: usize = 4;
/// Pairs [`pack_interleaved`] packs side by side.
const PAIR_BLOCK: usize = 8;

/// [`Layout::Rows`] from a source contiguous along `k`: each row rounded in vectors
/// of 32 values (16 pairs); an odd `kc`'s last pair has a zero upper half.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_rows<E: Bf16Operand>(dst: *mut u32, x: Block<E>) {
    let (src, rows, kc, kp) = (x.src, x.rows, x.kc, x.kp());
    for r in 0..x.padded_rows {
        let row = dst.add(r * kp);
        if r >= rows {
            std::ptr::write_bytes(row, 0, kp);
            continue;
        }
        let from = src.ptr.add(r * src.rs);
        // Rows are short runs (KC values) a stride apart, which the hardware's
        // prefetchers pick up late: fetch a later row's run while rounding this one.
        let ahead = src
            .ptr
            .wrapping_add((r + PREFETCH_ROWS).min(rows - 1) * src.rs);
        for c0 in (0..kc).step_by(32) {
            let count = (kc - c0).min(32);
            for line in (0..32 * size_of::<E>()).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(c0).cast::<i8>().wrapping_add(line));
            }
            let pairs = low_bits(count.div_ceil(2)) as u16;
            _mm512_mask_storeu_epi32(row.add(c0 / 2).cast(), pairs, load32(from.add(c0), count));
        }
    }
}

/// [`Layout::Panels`] of `w` rows (a multiple of 8) from a source contiguous along
/// the rows: for each pair, 16 rows of `k` values `2p` and `2p + 1` interleaved.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_interleaved<E: Bf16Operand>(dst: *mut u32, w: usize, x: Block<E>) {
    let (src, rows, kc, kp, padded_rows) = (x.src, x.rows, x.kc, x.kp(), x.padded_rows);
    // Lane 2i takes value i of the lower row, lane 2i + 1 value i of the upper one.
    let interleave = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    // Rows r0.. and r0 + 8.. : in one panel, or the ends of two when w is 8.
    let at = |r: usize| r / w * w * kp + r % w;
    // Blocks of PAIR_BLOCK pairs: their 2·PAIR_BLOCK rows of k are read side by side
    // along the rows (streams the prefetchers follow, the next block's fetched
    // explicitly), each row group's pairs written together.
    for p0 in (0..kp).step_by(PAIR_BLOCK) {
        let p1 = (p0 + PAIR_BLOCK).min(kp);
        let next = (2 * p1..(2 * p1 + 2 * PAIR_BLOCK).min(kc)).map(|kk| src.ptr.add(kk * src.cs));
        for r0 in (0..padded_rows).step_by(16) {
            if r0 < rows {
                for run in next.clone() {
                    _mm_prefetch::<_MM_HINT_T0>(run.add(r0).cast());
                }
            }
            for p in p0..p1 {
                let count = rows.saturating_sub(r0).min(16);
                let (first, second) = (at(r0), at(r0 + 8));
                // (Past the last row, `count` is 0 and nothing is read.)
                let lo = load16(src.ptr.wrapping_add(r0 + 2 * p * src.cs), count);
                let hi = if 2 * p + 1 < kc {
                    load16(src.ptr.wrapping_add(r0 + (2 * p + 1) * src.cs), count)
                } else {
                    _mm256_setzero_si256()
                };
                let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                let pairs = _mm512_permutexvar_epi16(interleave, both);
                if r0 + 8 < padded_rows {
                    if second == first + 8 {
                        _mm512_storeu_si512(dst.add(first + p * w).cast(), pairs);
                    } else {
                        _mm256_storeu_si256(
                            dst.add(first + p * w).cast(),
                            _mm512_castsi512_si256(pairs),
                        );
                        _mm256_storeu_si256(
                            dst.add(second + p * w).cast(),
                            _mm512_extracti64x4_epi64::<1>(pairs),
                        );
                    }
                } else {
                    _mm256_storeu_si256(
                        dst.add(first + p * w).cast(),
                        _mm512_castsi512_si256(pairs),
                    );
                }
            }
        }
    }
}

/// [`Layout::Panels`] of `w` rows (a multiple of 16) from a source contiguous along
/// `k`: 16 rows × 16 pairs rounded, transposed to 16 pairs × 16 rows, stored.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_transposed<E: Bf16Operand>(dst: *mut u32, w: usize, x: Block<E>) {
    let (src, rows, kc, kp) = (x.src, x.rows, x.kc, x.kp());
    for r0 in (0..x.padded_rows).step_by(16) {
        let panel = dst.add(r0 / w * w * kp + r0 % w);
        for p0 in (0..kp).step_by(16) {
            let count = (kc - 2 * p0).min(32);
            let block: [__m512i; 16] = std::array::from_fn(|i| {
                if r0 + i < rows {
                    load32(src.ptr.add((r0 + i) * src.rs + 2 * p0), count)
                } else {
                    _mm512_setzero_si512()
                }
            });
            let columns = transpose16(block);
            for (q, column) in columns.iter().enumerate().take(kp - p0) {
                _mm512_storeu_si512(panel.add((p0 + q) * w).cast(), *column);
            }
        }
    }
}

/// The transpose of a 16 × 16 matrix of 32-bit lanes (row `i` in vector `i`).
#[inline(always)]
unsafe fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
    // Rows 2i and 2i + 1 interleaved, per 128-bit lane L: columns 4L, 4L + 1 (even
    // vectors) and 4L + 2, 4L + 3 (odd ones).
    let t: [__m512i; 16] = std::array::from_fn(|v| match v % 2 {
        0 => _mm512_unpacklo_epi32(r[v], r[v + 1]),
        _ => _mm512_unpackhi_epi32(r[v - 1], r[v]),
    });
    // u[4i + q], lane L: rows 4i..4i + 4 of column 4L + q.
    let u: [__m512i; 16] = std::array::from_fn(|v| {
        let (i, q) = (v / 4, v % 4);
        let (x, y) = (t[4 * i + q / 2], t[4 * i + 2 + q / 2]);
        match q % 2 {
            0 => _mm512_unpacklo_epi64(x, y),
            _ => _mm512_unpackhi_epi64(x, y),
        }
    });
    // Column 4L + q gathers lane L of u[q], u[4 + q], u[8 + q], u[12 + q].
    let mut out = [_mm512_setzero_si512(); 16];
    for q in 0..4 {
        let v0 = _mm512_shuffle_i32x4::<0x44>(u[q], u[4 + q]);
        let v1 = _mm512_shuffle_i32x4::<0xee>(u[q], u[4 + q]);
        let v2 = _mm512_shuffle_i32x4::<0x44>(u[8 + q], u[12 + q]);
        let v3 = _mm512_shuffle_i32x4::<0xee>(u[8 + q], u[12 + q]);
        out[q] = _mm512_shuffle_i32x4::<0x88>(v0, v2);
        out[4 + q] = _mm512_shuffle_i32x4::<0xdd>(v0, v2);
        out[8 + q] = _mm512_shuffle_i32x4::<0x88>(v1, v3);
        out[12 + q] = _mm512_shuffle_i32x4::<0xdd>(v1, v3);
    }
    out
}

/// Rows `0..rows` of `src` (`k` values each, row stride `src_rs`) rounded to bf16
/// into `dst`, rows `dst_rs` apart (`dst_rs ≥ k`, a multiple of 32), each padded with
/// zeros to `dst_rs`: the left operand of [`few_rows`], read in whole vectors.
///
/// # Safety
/// `src` must address the rows; `dst` must hold `rows · dst_rs` values; the CPU
/// must have AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn round_rows<E: Bf16Operand>(
    dst: &mut [u16],
    src: *const E,
    rows: usize,
    k: usize,
    src_rs: usize,
    dst_rs: usize,
) {
    assert!(dst_rs >= k && dst_rs.is_multiple_of(32) && dst.len() >= rows * dst_rs);
    for i in 0..rows {
        let (from, to) = (src.add(i * src_rs), dst.as_mut_ptr().add(i * dst_rs));
        for c in (0..dst_rs).step_by(32) {
            let v = load32(from.wrapping_add(c), k.saturating_sub(c));
            _mm512_storeu_si512(to.add(c).cast(), v);
        }
    }
}

/// `dst[i]` = `src[i]` rounded to bf16, 32 at a time (the last vector masked).
///
/// # Safety
/// The CPU must have AVX512_BF16; the slices must have equal lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn round_slice(dst: &mut [half::bf16], src: &[f32]) {
    let n = dst.len().min(src.len());
    for c in (0..n).step_by(32) {
        let count = n - c;
        let v = load32(src.as_ptr().add(c), count);
        _mm512_mask_storeu_epi16(dst.as_mut_ptr().add(c).cast(), low_bits(count), v);
    }
}

/// `c (m, n) (+)= x (m, k) · wᵀ` (`c`'s rows `ldc` apart), columns `cols` only, for
/// a weight `w (n, k)` whose rows, `w_rs` apart, are contiguous along `k` — in bf16
/// (a weight's copy) or `f32` (rounded as it is loaded) — and the few rows of `x`
/// already rounded by [`round_rows`] (rows `x_rs` apart, zero-padded): a decoding
/// step's linear layer, or its attention's scores against the cached keys.
/// Each row of `w` streams from memory once, `vdpbf16ps` on 32 values of `k` at a
/// time, in blocks of rows of `w` against rows of `x` (`few_dots::for_each_few_dot`).
///
/// # Safety
/// The operands must address their shapes, `cols` be inside `0..n`, `c` hold `(m,
/// n)` values that no other thread writes in `cols`; the CPU must have AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn few_rows<E: Bf16Operand>(
    (c, ldc): (*mut f32, usize),
    (x, x_rs): (*const u16, usize),
    (w, w_rs): (*const E, usize),
    (m, k): (usize, usize),
    cols: std::ops::Range<usize>,
    accumulate: bool,
) {
    let dots = Dots {
        x: (x, x_rs),
        w: (w, w_rs),
        k,
    };
    for_each_few_dot(&dots, m, cols, |i, j, sum| {
        let o = c.add(i * ldc + j);
        *o = if accumulate { *o + sum } else { sum };
    })
}

/// `c (m, n) (+)= x (m, k) · b (k, n)` (`c`'s rows `ldc` apart) for at most
/// `FEW_X` rows of `x` already rounded by [`round_rows`] (rows `x_rs` apart,
/// zero-padded) and a right operand whose rows, `b_rs` apart, are contiguous along
/// `n`: attention's `P · V` in a decoding step. Each pair of rows of `b` is rounded
/// and interleaved in registers — the pairs `vdpbf16ps` multiplies, as
/// `pack_interleaved` lays them out in memory for the blocked product — and
/// multiplied against the broadcast pair of each row of `x`: `b` is read once and
/// never packed (64 columns a pass, 16 sums in registers).
///
/// # Safety
/// The operands must address their shapes, `c` hold `(m, n)` values that no other
/// thread writes, `m ≤ FEW_X`; the CPU must have AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn few_rows_by_rows<E: Bf16Operand>(
    c: (*mut f32, usize),
    x: (*const u16, usize),
    b: (*const E, usize),
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) {
    let shape = (k, n);
    match m {
        1 => by_rows::<1, E>(c, x, b, shape, accumulate),
        2 => by_rows::<2, E>(c, x, b, shape, accumulate),
        3 => by_rows::<3, E>(c, x, b, shape, accumulate),
        _ => by_rows::<FEW_X, E>(c, x, b, shape, accumulate),
    }
}

/// Lanes of two 16-value halves in the order `vdpbf16ps` pairs them: `lo[0],
/// hi[0], lo[1], hi[1], …` (`_mm512_permutex2var_epi16` indices, 32+ the second
/// operand's).
static INTERLEAVE_PAIRS: [u16; 32] = {
    let mut idx = [0; 32];
    let mut i = 0;
    while i < 16 {
        idx[2 * i] = i as u16;
        idx[2 * i + 1] = 32 + i as u16;
        i += 1;
    }
    idx
};

/// [`few_rows_by_rows`] for `R` rows of `x`.
#[inline(always)]
unsafe fn by_rows<const R: usize, E: Bf16Operand>(
    (c, ldc): (*mut f32, usize),
    (x, x_rs): (*const u16, usize),
    (b, b_rs): (*const E, usize),
    (k, n): (usize, usize),
    accumulate: bool,
) {
    const CHUNKS: usize = 4;
    let interleave = _mm512_loadu_si512(INTERLEAVE_PAIRS.as_ptr().cast());
    for col0 in (0..n).step_by(16 * CHUNKS) {
        let counts: [usize; CHUNKS] =
            std::array::from_fn(|t| n.saturating_sub(col0 + 16 * t).min(16));
        let mut acc = [[_mm512_setzero_ps(); CHUNKS]; R];
        for j in (0..k).step_by(2) {
            let mut bv = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); CHUNKS];
            for t in 0..CHUNKS {
                if counts[t] == 0 {
                    break;
                }
                let at = col0 + 16 * t;
                let lo = _mm512_castsi256_si512(load16(b.add(j * b_rs + at), counts[t]));
                let hi = match j + 1 < k {
                    true => _mm512_castsi256_si512(load16(b.add((j + 1) * b_rs + at), counts[t])),
                    false => _mm512_setzero_si512(),
                };
                bv[t] = std::mem::transmute::<__m512i, __m512bh>(_mm512_permutex2var_epi16(
                    lo, interleave, hi,
                ));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                // x's pair (j, j + 1): its rows are zero-padded past k.
                let pair = x.add(r * x_rs + j).cast::<i32>().read_unaligned();
                let xv = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                for (acc, &bv) in acc.iter_mut().zip(&bv) {
                    *acc = _mm512_dpbf16_ps(*acc, xv, bv);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for t in 0..CHUNKS {
                if counts[t] == 0 {
                    break;
                }
                let (o, mask) = (c.add(r * ldc + col0 + 16 * t), low_bits(counts[t]) as u16);
                let sum = match accumulate {
                    true => _mm512_add_ps(acc[t], _mm512_maskz_loadu_ps(mask, o)),
                    false => acc[t],
                };
                _mm512_mask_storeu_ps(o, mask, sum);
            }
        }
    }
}

/// The operands of [`few_rows`]' dot products: rows of `x` and of `w`, each with
/// its row stride.
struct Dots<E> {
    x: (*const u16, usize),
    w: (*const E, usize),
    k: usize,
}

/// [`Dots`]' sums over values `c..c + count` of `k` (`count` 32 but at the end).
#[inline(always)]
unsafe fn dot_step<const R: usize, E: Bf16Operand>(
    acc: &mut [[__m512; FEW_W]; R],
    x: [*const u16; R],
    w: [*const E; FEW_W],
    next: Option<[*const E; FEW_W]>,
    c: usize,
    count: usize,
) {
    if let Some(next) = next {
        for row in next {
            for line in (0..32 * size_of::<E>()).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(c).cast::<i8>().wrapping_add(line));
            }
        }
    }
    let mut wv = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); FEW_W];
    for t in 0..FEW_W {
        let v = match count {
            32 => load32_whole(w[t].add(c)),
            _ => load32(w[t].add(c), count),
        };
        wv[t] = std::mem::transmute::<__m512i, __m512bh>(v);
    }
    for r in 0..R {
        let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(x[r].add(c).cast()));
        for t in 0..FEW_W {
            acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv, wv[t]);
        }
    }
}

/// The dot products of rows of `x` (zero-padded to a multiple of 32) with rows of
/// `w` (`k` values each).
impl<E: Bf16Operand> FewDots for Dots<E> {
    #[inline(always)]
    unsafe fn dots<const R: usize>(&self, rows: DotRows<R>) -> [[f32; FEW_W]; R] {
        let row = |j: usize| self.w.0.add(j * self.w.1);
        let x = rows.is.map(|i| self.x.0.add(i * self.x.1));
        let (w, k) = (rows.js.map(row), self.k);
        let next = rows.next.map(|js| js.map(row));
        // Loops, not closures: an intrinsic inlines only into code compiled with its
        // target features, which a closure here is not.
        let mut acc = [[_mm512_setzero_ps(); FEW_W]; R];
        let whole = k / 32 * 32;
        for c in (0..whole).step_by(32) {
            dot_step(&mut acc, x, w, next, c, 32);
        }
        if whole < k {
            dot_step(&mut acc, x, w, next, whole, k - whole);
        }
        let mut sums = [[0.0; FEW_W]; R];
        if R == 4 && FEW_W == 4 {
            let all = sum_lanes_4x4(std::array::from_fn(|i| acc[i / 4][i % 4]));
            for (r, sums) in sums.iter_mut().enumerate() {
                sums.copy_from_slice(&all[4 * r..4 * r + 4]);
            }
            return sums;
        }
        for r in 0..R {
            for t in 0..FEW_W {
                sums[r][t] = _mm512_reduce_add_ps(acc[r][t]);
            }
        }
        sums
    }
}

/// The sums of the lanes of 16 vectors, in their order, by a tree of shuffles and
/// additions that keeps every lane busy (45 instructions where 16 separate
/// reductions take 128): pairs of vectors interleaved by 32-bit and then 64-bit
/// halves and added leave each 128-bit lane holding four vectors' partial sums,
/// which two rounds of 128-bit shuffles add up.
#[inline(always)]
unsafe fn sum_lanes_4x4(v: [__m512; 16]) -> [f32; 16] {
    let pairs: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    let quads: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (
            _mm512_castps_pd(pairs[2 * i]),
            _mm512_castps_pd(pairs[2 * i + 1]),
        );
        let (lo, hi) = (_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
        _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi))
    });
    // quads[i]: vectors 4i..4i+4's partial sums, once in each 128-bit lane.
    let halves = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    let (h01, h23) = (halves(quads[0], quads[1]), halves(quads[2], quads[3]));
    let all = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(h01, h23),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(h01, h23),
    );
    std::mem::transmute::<__m512, [f32; 16]>(all)
}

#[cfg(test)]
mod tests {
    use super::{load32, round_slice, Avx512Bf16};
    use crate::kernels::cpu::bf16::round::round_bf16;
    use std::arch::x86_64::*;

    /// Each vector's lanes summed, in the vectors' order (lanes of distinct sizes,
    /// so a sum of the wrong lanes or a lane counted twice shows).
    #[test]
    fn lane_sums_of_16_vectors_are_in_their_order() {
        unsafe {
            let v: [__m512; 16] = std::array::from_fn(|i| {
                let lanes: [f32; 16] = std::array::from_fn(|l| (i * 100 + l) as f32);
                std::mem::transmute(lanes)
            });
            let got = super::sum_lanes_4x4(v);
            let want: Vec<f32> = (0..16)
                .map(|i| (0..16).map(|l| (i * 100 + l) as f32).sum())
                .collect();
            assert_eq!(got.to_vec(), want);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn rounded_natively(x: &[f32; 32]) -> [u16; 32] {
        std::mem::transmute::<__m512i, [u16; 32]>(load32(x.as_ptr(), 32))
    }

    /// `vcvtne2ps2bf16` rounds every `f32` — normal, subnormal, infinite, NaN — as
    /// [`round_bf16`] does, so the portable and native kernels multiply the same values.
    #[test]
    fn the_native_rounding_is_round_bf16() {
        if !Avx512Bf16::detected() {
            return; // (the integration tests say that the native kernel did not run)
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut bits = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        };
        let special = [
            0.0,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NAN,
        ];
        for round in 0..20_000 {
            let x: [f32; 32] = std::array::from_fn(|i| match (round, i) {
                (0, i) if i < special.len() => special[i],
                // Subnormals, ties (low half 0x8000) and random patterns of every class.
                (_, i) if i % 4 == 0 => f32::from_bits(bits() & 0x807f_ffff),
                (_, i) if i % 4 == 1 => f32::from_bits(bits() & 0xffff_0000 | 0x8000),
                _ => f32::from_bits(bits()),
            });
            let native = unsafe { rounded_natively(&x) };
            for (x, native) in x.iter().zip(native) {
                assert_eq!(native, round_bf16(*x), "{:#010x}", x.to_bits());
            }
            // A slice of any length, as the kernels store their tiles: every value
            // rounded, none written past the end.
            let len = round % 33;
            let mut out = [half::bf16::from_bits(0x1234); 33];
            unsafe { round_slice(&mut out[..len], &x[..len]) };
            for (i, out) in out.iter().enumerate() {
                let want = if i < len { round_bf16(x[i]) } else { 0x1234 };
                assert_eq!(out.to_bits(), want, "{len} values, at {i}");
            }
        }
    }
}
