//! What a bf16 micro-kernel multiplies: operands packed as *pairs* — two bf16 values
//! adjacent along the summed dimension `k` in one `u32` (the lower `k` in the low
//! half), the element `vdpbf16ps` and `bfdot` multiply-add in one lane — and the
//! [`Microkernel`] interface each instruction set implements over them.
//!
//! Two layouts, for an operand block of `rows` rows (the product's `m` rows for `A`,
//! its `n` columns for `B`) and `kc` values of `k` in `kp = ⌈kc / 2⌉` pairs (an odd
//! `kc` ends in a pair whose upper half is 0):
//! - **pair rows**: pair `(r, p)` at `r · kp + p` — each row's values in order, as
//!   they are in memory when the source is contiguous along `k`: packing only rounds;
//! - **pair panels** of `R` rows: pair `(r, p)` at `(r / R) · R · kp + p · R + r % R`
//!   — the `R` rows' pairs of one `p` side by side, one vector per `p` for the
//!   micro-kernel; packing a source contiguous along the rows interleaves two rows.
//!
//! Rows past the block's end are packed as zeros up to a multiple of the tile, so a
//! micro-kernel always multiplies whole tiles.

use super::round::Bf16Operand;

/// A strided view of an operand: element `(r, c)` at `ptr + r·rs + c·cs`.
pub struct Operand<E> {
    pub ptr: *const E,
    pub rs: usize,
    pub cs: usize,
}

impl<E> Clone for Operand<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for Operand<E> {}

// SAFETY: a view only reads, and the buffer it reads outlives every use.
unsafe impl<E: Sync> Send for Operand<E> {}
unsafe impl<E: Sync> Sync for Operand<E> {}

impl<E> Operand<E> {
    /// A row-major `(rows, cols)` matrix with row stride `rs`, or its transpose.
    pub fn new(data: &[E], rs: usize, transposed: bool) -> Self {
        let (rs, cs) = if transposed { (1, rs) } else { (rs, 1) };
        Operand {
            ptr: data.as_ptr(),
            rs,
            cs,
        }
    }

    /// The view whose `(0, 0)` is this one's `(r, c)`.
    ///
    /// # Safety
    /// `(r, c)` must lie inside the viewed buffer.
    pub unsafe fn at(self, r: usize, c: usize) -> Self {
        Operand {
            ptr: self.ptr.add(r * self.rs + c * self.cs),
            ..self
        }
    }

    /// Element `(r, c)`.
    ///
    /// # Safety
    /// `(r, c)` must lie inside the viewed buffer.
    #[inline(always)]
    pub unsafe fn get(self, r: usize, c: usize) -> E
    where
        E: Copy,
    {
        *self.ptr.add(r * self.rs + c * self.cs)
    }
}

/// An operand block to pack: rows `0..rows` and values `0..kc` of `k` of `src`
/// (`src`'s `(r, c)` is row `r`, `k` index `c`), then rows of zeros up to
/// `padded_rows`.
pub struct Block<E> {
    pub src: Operand<E>,
    pub rows: usize,
    pub kc: usize,
    pub padded_rows: usize,
}

impl<E> Clone for Block<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for Block<E> {}

impl<E> Block<E> {
    /// Pairs of `k` in a packed row: `⌈kc / 2⌉`.
    pub fn kp(&self) -> usize {
        self.kc.div_ceil(2)
    }
}

/// How a block is packed: [`Layout::Rows`] or [`Layout::Panels`] of `R` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Rows,
    Panels(usize),
}

impl Layout {
    /// Strides `(row, pair)` of one tile's pairs in this layout, in `u32`s. In both
    /// layouts the tile whose first row is `r` (a multiple of the tile's rows) starts
    /// at `r · kp`.
    pub fn strides(self, kp: usize) -> (usize, usize) {
        match self {
            Layout::Rows => (kp, 1),
            Layout::Panels(r) => (1, r),
        }
    }
}

/// `(lo, hi)` as one pair.
#[inline(always)]
pub fn pair(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | u32::from(hi) << 16
}

/// Packs block `x` into `dst` in `layout`: the portable packing, one value at a
/// time, that every kernel has and the faster ones replace where they can.
///
/// # Safety
/// `x.src` must address `rows × kc` values; `dst` must hold `padded_rows · kp`.
pub unsafe fn pack_pairs<E: Bf16Operand>(dst: &mut [u32], layout: Layout, x: Block<E>) {
    let (src, rows, kc, kp) = (x.src, x.rows, x.kc, x.kp());
    assert!(dst.len() >= x.padded_rows * kp, "packed block size");
    let index = |r: usize, p: usize| match layout {
        Layout::Rows => r * kp + p,
        Layout::Panels(w) => r / w * w * kp + p * w + r % w,
    };
    let value = |r: usize, c: usize| {
        if r < rows && c < kc {
            src.get(r, c).bf16_bits()
        } else {
            0
        }
    };
    if src.cs == 1 {
        for r in 0..x.padded_rows {
            for p in 0..kp {
                dst[index(r, p)] = pair(value(r, 2 * p), value(r, 2 * p + 1));
            }
        }
    } else {
        for p in 0..kp {
            for r in 0..x.padded_rows {
                dst[index(r, p)] = pair(value(r, 2 * p), value(r, 2 * p + 1));
            }
        }
    }
}

/// One tile's packed operands: `kp` pairs of `k`; pair `(i, p)` of `A` at
/// `a + i·a_rs + p·a_ps`, pair `(p, j)` of `B` at `b + p·NR + j` (one panel).
#[derive(Clone, Copy)]
pub struct Tile {
    pub kp: usize,
    pub a: *const u32,
    pub a_rs: usize,
    pub a_ps: usize,
    pub b: *const u32,
}

/// A bf16 micro-kernel: the `MR × NR` tile of `c (+)= a · b` over packed pairs,
/// accumulated in `f32`, and how it wants its operands packed.
pub trait Microkernel {
    /// Rows of the tile (of `A`, packed in panels of `MR` where `A` is not
    /// contiguous along `k`).
    const MR: usize;
    /// Columns of the tile (of `B`, always packed in panels of `NR`).
    const NR: usize;

    /// `c (MR, NR)` (row stride `ldc`) `= Σ_p a(i, p) · b(p, j)` over the tile's
    /// packed pairs, or `c +=` when `accumulate`.
    ///
    /// # Safety
    /// The pointers must address the whole tile; the CPU must have the kernel's
    /// instructions.
    unsafe fn tile(x: Tile, c: *mut f32, ldc: usize, accumulate: bool);

    /// Asks for the cache line at `p` ahead of use, where the instruction set has a
    /// way to (a hint: never faults, may do nothing).
    #[inline(always)]
    fn prefetch(_p: *const u8) {}

    /// Packs a block as [`pack_pairs`] does; a kernel may do it faster.
    ///
    /// # Safety
    /// As [`pack_pairs`]; the CPU must have the kernel's instructions.
    unsafe fn pack<E: Bf16Operand>(dst: &mut [u32], layout: Layout, x: Block<E>) {
        pack_pairs(dst, layout, x)
    }
}

#[cfg(test)]
mod tests {
    use super::{pack_pairs, Block, Layout, Operand};

    #[test]
    fn packs_pairs_along_k_in_both_layouts_from_both_storages() {
        // x (3, 5): value r·10 + c, exact in bf16.
        let (rows, kc) = (3, 5);
        let x: Vec<f32> = (0..rows * kc)
            .map(|i| (i / kc * 10 + i % kc) as f32)
            .collect();
        let xt: Vec<f32> = (0..rows * kc)
            .map(|i| (i % rows * 10 + i / rows) as f32)
            .collect();
        let pair_of = |r: usize, p: usize| {
            let v = |c: usize| {
                if r < rows && c < kc {
                    (r * 10 + c) as f32
                } else {
                    0.0
                }
            };
            (v(2 * p), v(2 * p + 1))
        };
        let unpair = |u: u32| (f32::from_bits(u << 16), f32::from_bits(u & 0xffff_0000));
        for layout in [Layout::Rows, Layout::Panels(2)] {
            for (src, what) in [
                (Operand::new(&x, kc, false), "row-major"),
                (Operand::new(&xt, rows, true), "transposed"),
            ] {
                let mut dst = vec![u32::MAX; 4 * 3];
                let x = Block {
                    src,
                    rows,
                    kc,
                    padded_rows: 4,
                };
                unsafe { pack_pairs(&mut dst, layout, x) };
                for r in 0..4 {
                    for p in 0..3 {
                        let i = match layout {
                            Layout::Rows => r * 3 + p,
                            Layout::Panels(w) => r / w * w * 3 + p * w + r % w,
                        };
                        assert_eq!(
                            unpair(dst[i]),
                            pair_of(r, p),
                            "{layout:?} {what} ({r}, {p})"
                        );
                    }
                }
            }
        }
    }
}
