//! The walk of the hand-written few-rows products (bf16 and Q8_0 weights on
//! AVX-512; `f32` prompts in any vectors): a decoding step's (or a prompt's) linear
//! layers as dot products of the
//! rows of `x` with the weight's rows, blocks of both at a time, each kernel giving
//! only its dot products ([`FewDots`]).

use std::ops::Range;

/// Rows of `x` whose dot products the hand-written few-rows kernels (bf16, Q8_0)
/// take together ([`FewDots`]): each weight vector is loaded once for all of them
/// (`x` stays in L1); with [`FEW_W`], 16 sums in registers.
pub(crate) const FEW_X: usize = 4;
/// Rows of the weight dotted together, one from each quarter of a block of rows
/// ([`for_each_few_dot`]): four streams from memory, each of which the hardware
/// prefetchers follow on pages of its own. Neighbouring rows (1.5 KiB each in
/// bf16) are one stream in effect: with them the 134M model decoded in bf16 at
/// 244–266 tok/s against 283–300 with rows a quarter apart, on Zen 5 while two
/// threads read 80–85 GB/s (4–7% slower while they read 50).
pub(crate) const FEW_W: usize = 4;

/// The dot products of a few-rows kernel: rows of `x` with rows of a weight `(n, k)`
/// stored along `k`.
pub(crate) trait FewDots {
    /// The products of rows `is` of `x` (`R ≤ FEW_X`) with rows `js` of the weight,
    /// fetching weight rows `next` into the cache meanwhile where they are given
    /// (a hint: a kernel may fetch ahead on its own).
    ///
    /// # Safety
    /// The rows must lie inside the operands; the CPU must have the kernel's
    /// instructions (the caller is compiled with them, so that this inlines).
    unsafe fn dots<const R: usize>(
        &self,
        is: [usize; R],
        js: [usize; FEW_W],
        next: Option<[usize; FEW_W]>,
    ) -> [[f32; FEW_W]; R];
}

/// Columns `cols` of a few-rows product `(m, n)`: `write(i, j, sum)` once for each
/// output, from [`FewDots::dots`] over blocks of [`FEW_W`] weight rows, row `j` of
/// each quarter of `cols` (a quarter that has no row `j` repeats the one before's,
/// written once), by [`FEW_X`] rows of `x`.
/// A block of weight rows is read from memory by the first block of rows of `x`
/// (from L1 by the others), which fetches the next block of weight rows meanwhile
/// when `x` has more than one row: a ~95M-parameter model decoding 4 sequences
/// took 6.5 ms a step without that, 4.7 ms with it, on Zen 5; one row alone
/// decodes faster without (the hardware prefetcher follows its four streams).
///
/// # Safety
/// As `dots`'; inlined into the kernel's function compiled with its instructions.
#[inline(always)]
pub(crate) unsafe fn for_each_few_dot(
    dots: &impl FewDots,
    m: usize,
    cols: Range<usize>,
    mut write: impl FnMut(usize, usize, f32),
) {
    /// `R` rows of sums, padded to [`FEW_X`].
    #[inline(always)]
    fn pad<const R: usize>(sums: [[f32; FEW_W]; R]) -> [[f32; FEW_W]; FEW_X] {
        std::array::from_fn(|r| if r < R { sums[r] } else { [0.0; FEW_W] })
    }
    // Row `j0` of each quarter of `cols`.
    let stride = cols.len().div_ceil(FEW_W);
    let rows_at = |j0: usize| -> [usize; FEW_W] {
        let mut js = [j0; FEW_W];
        for t in 1..FEW_W {
            js[t] = if j0 + t * stride < cols.end {
                j0 + t * stride
            } else {
                js[t - 1]
            };
        }
        js
    };
    let firsts = cols.start..cols.start + stride;
    for j0 in firsts.clone() {
        let js = rows_at(j0);
        let next_js = firsts.contains(&(j0 + 1)).then(|| rows_at(j0 + 1));
        let mut i0 = 0;
        while i0 < m {
            let next = next_js.filter(|_| i0 == 0 && m > 1);
            let sums = match m - i0 {
                1 => pad(dots.dots::<1>([i0], js, next)),
                2 => pad(dots.dots::<2>([i0, i0 + 1], js, next)),
                3 => pad(dots.dots::<3>([i0, i0 + 1, i0 + 2], js, next)),
                _ => dots.dots::<FEW_X>([i0, i0 + 1, i0 + 2, i0 + 3], js, next),
            };
            for (r, row) in sums.iter().enumerate().take(m - i0) {
                for (t, &sum) in row.iter().enumerate() {
                    if t == 0 || js[t] != js[t - 1] {
                        write(i0 + r, js[t], sum);
                    }
                }
            }
            i0 += FEW_X;
        }
    }
}
