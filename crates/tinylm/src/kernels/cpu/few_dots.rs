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

/// The rows of one [`FewDots::dots`] call: rows `is` of `x` (`R ≤ FEW_X`), rows `js`
/// of the weight, and the weight rows `next` to fetch into the cache meanwhile
/// where they are given (a hint: a kernel may fetch ahead on its own).
#[derive(Clone, Copy)]
pub(crate) struct DotRows<const R: usize> {
    pub is: [usize; R],
    pub js: [usize; FEW_W],
    pub next: Option<[usize; FEW_W]>,
}

impl<const R: usize> DotRows<R> {
    #[inline(always)]
    pub fn new(is: [usize; R], js: [usize; FEW_W], next: Option<[usize; FEW_W]>) -> Self {
        DotRows { is, js, next }
    }
}

/// The dot products of a few-rows kernel: rows of `x` with rows of a weight `(n, k)`
/// stored along `k`.
pub(crate) trait FewDots {
    /// The products `(R, FEW_W)` of `rows.is` of `x` with `rows.js` of the weight.
    ///
    /// # Safety
    /// The rows must lie inside the operands; the CPU must have the kernel's
    /// instructions (the caller is compiled with them, so that this inlines).
    unsafe fn dots<const R: usize>(&self, rows: DotRows<R>) -> [[f32; FEW_W]; R];
}

/// The rows of `cols` a few-rows kernel takes together, `P` at a time: row `j` of
/// each of `P` parts of `cols` (of `cols.len().div_ceil(P)` rows each) for each `j`
/// of the first part, so that they are `P` streams from memory where neighbouring
/// rows would be one ([`FEW_W`]). A part that has no row `j` repeats the one
/// before's, whose products the kernel writes once.
#[inline(always)]
pub(crate) fn rows_of_parts<const P: usize>(
    cols: Range<usize>,
) -> impl Iterator<Item = [usize; P]> + Clone {
    let stride = cols.len().div_ceil(P);
    (cols.start..cols.start + stride).map(move |j| {
        let mut js = [j; P];
        for t in 1..P {
            js[t] = if j + t * stride < cols.end {
                j + t * stride
            } else {
                js[t - 1]
            };
        }
        js
    })
}

/// Columns `cols` of a few-rows product `(m, n)`: `write(i, j, sum)` once for each
/// output, from [`FewDots::dots`] over blocks of [`FEW_W`] weight rows, one from
/// each quarter of `cols` ([`rows_of_parts`]), by [`FEW_X`] rows of `x`.
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
    let mut blocks = rows_of_parts::<FEW_W>(cols).peekable();
    while let Some(js) = blocks.next() {
        let next_js = blocks.peek().copied();
        let mut i0 = 0;
        while i0 < m {
            let next = next_js.filter(|_| i0 == 0 && m > 1);
            let sums = match m - i0 {
                1 => pad(dots.dots(DotRows::new([i0], js, next))),
                2 => pad(dots.dots(DotRows::new([i0, i0 + 1], js, next))),
                3 => pad(dots.dots(DotRows::new([i0, i0 + 1, i0 + 2], js, next))),
                _ => dots.dots(DotRows::new([i0, i0 + 1, i0 + 2, i0 + 3], js, next)),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row of `cols` comes once, repeats aside, in any block length.
    fn each_row_once<const P: usize>() {
        for start in [0, 5] {
            for len in 0..40 {
                let cols = start..start + len;
                let mut seen = vec![0; len];
                for js in rows_of_parts::<P>(cols.clone()) {
                    for t in 0..P {
                        if t == 0 || js[t] != js[t - 1] {
                            seen[js[t] - start] += 1;
                        }
                    }
                }
                assert_eq!(seen, vec![1; len], "{P} parts of {cols:?}");
            }
        }
    }

    #[test]
    fn the_parts_of_a_block_cover_each_row_once() {
        each_row_once::<2>();
        each_row_once::<FEW_W>();
    }
}
