//! Matrix products through the `gemm` crate: the linear layers' forward
//! (`y = x Wᵀ`) and backward (`dx = dy W`, `dW += dyᵀ x`) and attention's per-head
//! products, all as strided views so transposes cost nothing.

use super::few_dots::{for_each_few_dot, rows_of_parts, DotRows, FewDots, FEW_W};
use super::memory::{prefetch_rows, SharedMut};
use crate::kernels::{Float, MatMul};
use gemm::Parallelism;
use rayon::prelude::*;
use std::any::TypeId;
use std::ops::Range;

/// Linear layers' products `x Wᵀ` of at most this many rows (a decoding pass's few
/// sequences) run as dot products that stream each weight row once
/// ([`few_rows_linear`]; the bf16 and Q8_0 products' in `few_dots`): for two rows
/// or more `gemm` packs the weight first and takes several times as long.
pub(crate) const FEW_ROWS: usize = 16;

/// Linear layers' products `x Wᵀ` of more than [`FEW_ROWS`] rows and at most this
/// many (a prompt) in `f32` run as dot products too ([`FewRows`]): `gemm` would
/// pack the whole weight for them.
const PROMPT_ROWS: usize = 128;

/// Products smaller than this many multiply-adds run on the calling thread: the
/// fork-join costs more than it saves.
const PARALLEL_MIN_MACS: usize = 1 << 20;

/// Parallel products are split into blocks of at most this many output columns,
/// so the vocabulary-wide LM head becomes several tasks per thread: they balance
/// when one thread is slowed, and each block's packed right operand stays small.
const PARALLEL_MAX_COLS: usize = 1024;

/// Parallel products give each thread a block of at least this many output rows;
/// products of fewer rows (a decoding pass's few sequences) are split by columns
/// only, so the right operand (the weights) streams through memory once.
const PARALLEL_MIN_ROWS: usize = 64;

/// The instruction set `gemm`'s kernels run with on this CPU, as `gemm` picks it at
/// run time: AVX-512F when the `avx512` feature is built in and the CPU has it, else
/// AVX2+FMA, else scalar code (x86-64); NEON on aarch64.
pub fn matmul_isa() -> &'static str {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if cfg!(feature = "avx512") && std::arch::is_x86_feature_detected!("avx512f") {
            "AVX-512F (512-bit FMA)"
        } else if std::arch::is_x86_feature_detected!("fma") {
            "AVX2+FMA (256-bit FMA)"
        } else {
            "scalar (no FMA)"
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            "NEON (128-bit FMA)"
        } else {
            "scalar (no NEON)"
        }
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}

/// A strided matrix view: element `(i, j)` at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy)]
pub(crate) struct View<F> {
    pub ptr: *const F,
    pub rs: isize,
    pub cs: isize,
}

// SAFETY: a view only reads, and the buffer it reads outlives every use.
unsafe impl<F: Sync> Send for View<F> {}
unsafe impl<F: Sync> Sync for View<F> {}

impl<F> View<F> {
    /// A row-major `(rows, cols)` matrix with row stride `rs`, or its transpose.
    pub fn new(data: &[F], rs: usize, transposed: bool) -> Self {
        let (rs, cs) = if transposed {
            (1, rs as isize)
        } else {
            (rs as isize, 1)
        };
        View {
            ptr: data.as_ptr(),
            rs,
            cs,
        }
    }
}

/// `dst (m, n) = scale · a (m, k) · b (k, n)`, or `dst += …` when `accumulate`, on
/// the calling thread.
///
/// # Safety
/// The views must address valid memory for their shapes, `dst` must be writable
/// (row stride `dst_rs`, unit column stride) and alias neither operand.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_view<F: Float>(
    (m, k, n): (usize, usize, usize),
    dst: *mut F,
    dst_rs: usize,
    a: View<F>,
    b: View<F>,
    scale: F,
    accumulate: bool,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        accumulate,
        a.ptr,
        a.cs,
        a.rs,
        b.ptr,
        b.cs,
        b.rs,
        F::ONE,
        scale,
        false,
        false,
        false,
        Parallelism::None,
    );
}

/// `out (m, n) (+)= a · b` over contiguous buffers (see [`MatMul`]). Large products
/// are split into blocks of output (one row block per rayon thread, column blocks
/// of at most `PARALLEL_MAX_COLS`), each a single-threaded `gemm`: one fork-join per
/// product, every task streaming through a large block.
pub fn matmul<F: Float>(out: &mut [F], a: &[F], b: &[F], s: MatMul) {
    assert_eq!(out.len(), s.m * s.n, "matmul output size");
    assert_eq!(a.len(), s.m * s.k, "matmul lhs size");
    assert_eq!(b.len(), s.k * s.n, "matmul rhs size");
    if s.m * s.n == 0 {
        return;
    }
    if s.m <= PROMPT_ROWS && s.b_transposed && !s.a_transposed && few_rows_linear(out, a, b, s) {
        return;
    }
    let a_rs = if s.a_transposed { s.m } else { s.k };
    let b_rs = if s.b_transposed { s.k } else { s.n };
    let a = View::new(a, a_rs, s.a_transposed);
    let b = View::new(b, b_rs, s.b_transposed);
    let out = SharedMut(out.as_mut_ptr());
    for_each_output_block(s, (1, 1), |rows, cols| {
        // The whole views (Sync), not their raw-pointer fields.
        let (a, b) = (a, b);
        // SAFETY: the block is inside every operand (sizes checked above) and each
        // task writes only its own block of `out`.
        unsafe {
            let a = View {
                ptr: a.ptr.offset(rows.start as isize * a.rs),
                ..a
            };
            let b = View {
                ptr: b.ptr.offset(cols.start as isize * b.cs),
                ..b
            };
            gemm_view(
                (rows.len(), s.k, cols.len()),
                out.get().add(rows.start * s.n + cols.start),
                s.n,
                a,
                b,
                F::ONE,
                s.accumulate,
            );
        }
    });
}

/// `out (m, n) (+)= a (m, k) · bᵀ` for `b (n, k)` (a linear layer's `x Wᵀ`) and few
/// rows `m`, in `f32`: each row of `b` is read from memory once and dotted with
/// every row of `a`, which stay in cache ([`FewRows`]); blocks of `b`'s rows are
/// split among the threads. Whether it ran (`F` is `f32`).
fn few_rows_linear<F: Float>(out: &mut [F], a: &[F], b: &[F], s: MatMul) -> bool {
    if TypeId::of::<F>() != TypeId::of::<f32>() {
        return false;
    }
    // SAFETY: `F` is `f32` (checked above): the same type, so the same layout.
    let f32s = |x: &[F]| unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<f32>(), x.len()) };
    let (a, b) = (f32s(a), f32s(b));
    let out = SharedMut(out.as_mut_ptr().cast::<f32>());
    for_each_column_block(s, |cols| {
        pulp::Arch::new().dispatch(FewRows {
            out: &out,
            a,
            b,
            s,
            cols,
        })
    });
    true
}

/// Few-rows products whose weight has at least this many values (256 KiB in `f32`)
/// split it among the threads: such a product is bound by reading the weight from
/// memory, which every core adds bandwidth to, whatever its few rows' work.
const PARALLEL_MIN_WEIGHT: usize = 1 << 16;

/// Runs `block(cols)` on every block of columns of a few-rows product's output
/// `(m, n)`, in one fork-join when its weight `(n, k)` is large: several blocks per
/// thread, so that they balance when one thread is slowed, each streaming its rows
/// of the weight.
pub(crate) fn for_each_column_block(s: MatMul, block: impl Fn(Range<usize>) + Sync) {
    let parts = match s.k * s.n >= PARALLEL_MIN_WEIGHT {
        true => (4 * rayon::current_num_threads()).min(s.n),
        false => 1,
    };
    let cols = s.n.div_ceil(parts);
    (0..parts)
        .into_par_iter()
        .for_each(|part| block(part * cols..((part + 1) * cols).min(s.n)));
}

/// Columns `cols` of [`few_rows_linear`]'s product, with the widest vectors the CPU
/// has, each vector loaded once for the products it takes part in. A decoding
/// pass's few rows: two rows of `b` at a time, one from each half of `cols`
/// ([`rows_of_parts`]), against four rows of `a`, in eight independent sums — two
/// streams from memory. On Zen 5 the 134M model decoded 3% faster this way than
/// with neighbouring rows (one stream in effect) while two threads read 50 GB/s,
/// 10% faster while they read 76–81 GB/s, and 10% faster on one thread; with four
/// rows a quarter apart (as the walk below takes them), 5–15% slower. A prompt's
/// (more than [`FEW_ROWS`]): on the hand-written kernels' walk
/// ([`for_each_few_dot`]), four rows of `b` against four of `a`, 16 sums, half the
/// reads of `a` from cache a multiply-add; its 62-token prompt took 47–54 ms
/// instead of `gemm`'s 64–69 (70–87 instead of 95–117 as the process's first pass).
struct FewRows<'a> {
    out: &'a SharedMut<f32>,
    a: &'a [f32],
    b: &'a [f32],
    s: MatMul,
    cols: Range<usize>,
}

impl pulp::WithSimd for FewRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let (m, k, n) = (self.s.m, self.s.k, self.s.n);
        let (a, b) = (self.a, self.b);
        let dot_tail = |x: &[f32], w: &[f32]| x.iter().zip(w).map(|(x, w)| x * w).sum::<f32>();
        let write = |i: usize, j: usize, sum: f32| {
            // SAFETY: `i < m` and `j < n`, so the index is inside `out` (`m * n` long,
            // checked by the caller), and only this task writes column `j`.
            unsafe {
                let o = self.out.get().add(i * n + j);
                *o = if self.s.accumulate { *o + sum } else { sum };
            }
        };
        if m > FEW_ROWS {
            let dots = F32Dots { simd, a, b, k };
            // SAFETY: the rows `for_each_few_dot` asks for are inside `a` (`m` rows)
            // and `b` (`cols` inside `0..n`), of `k` values each; this runs inside
            // pulp's dispatch for `S`.
            return unsafe { for_each_few_dot(&dots, m, self.cols, write) };
        }
        let groups = m / 4;
        // The middle row of an odd block pairs with itself (and is written once).
        for [j, j1] in rows_of_parts::<2>(self.cols) {
            let (w0, w_tail0) = S::as_simd_f32s(&b[j * k..(j + 1) * k]);
            let (w1, w_tail1) = S::as_simd_f32s(&b[j1 * k..(j1 + 1) * k]);
            let tail_at = k - w_tail0.len();
            for g in 0..groups {
                let x: [&[f32]; 4] = std::array::from_fn(|r| &a[(4 * g + r) * k..][..k]);
                let xv = x.map(|x| S::as_simd_f32s(x).0);
                let mut acc0 = [simd.splat_f32s(0.0); 4];
                let mut acc1 = [simd.splat_f32s(0.0); 4];
                for c in 0..w0.len() {
                    let (u, v) = (w0[c], w1[c]);
                    acc0[0] = simd.mul_add_f32s(xv[0][c], u, acc0[0]);
                    acc1[0] = simd.mul_add_f32s(xv[0][c], v, acc1[0]);
                    acc0[1] = simd.mul_add_f32s(xv[1][c], u, acc0[1]);
                    acc1[1] = simd.mul_add_f32s(xv[1][c], v, acc1[1]);
                    acc0[2] = simd.mul_add_f32s(xv[2][c], u, acc0[2]);
                    acc1[2] = simd.mul_add_f32s(xv[2][c], v, acc1[2]);
                    acc0[3] = simd.mul_add_f32s(xv[3][c], u, acc0[3]);
                    acc1[3] = simd.mul_add_f32s(xv[3][c], v, acc1[3]);
                }
                for r in 0..4 {
                    let x_tail = &x[r][tail_at..];
                    let sum0 = simd.reduce_sum_f32s(acc0[r]) + dot_tail(x_tail, w_tail0);
                    write(4 * g + r, j, sum0);
                    if j1 != j {
                        let sum1 = simd.reduce_sum_f32s(acc1[r]) + dot_tail(x_tail, w_tail1);
                        write(4 * g + r, j1, sum1);
                    }
                }
            }
            for i in 4 * groups..m {
                let (xv, x_tail) = S::as_simd_f32s(&a[i * k..(i + 1) * k]);
                let (mut acc0, mut acc1) = (simd.splat_f32s(0.0), simd.splat_f32s(0.0));
                for c in 0..w0.len() {
                    acc0 = simd.mul_add_f32s(xv[c], w0[c], acc0);
                    acc1 = simd.mul_add_f32s(xv[c], w1[c], acc1);
                }
                write(i, j, simd.reduce_sum_f32s(acc0) + dot_tail(x_tail, w_tail0));
                if j1 != j {
                    let sum1 = simd.reduce_sum_f32s(acc1) + dot_tail(x_tail, w_tail1);
                    write(i, j1, sum1);
                }
            }
        }
    }
}

/// The dot products of rows of `a (m, k)` with rows of `b (n, k)`, in `f32` vectors
/// of `S`: sums in lanes, each reduced at the end, the values past the last whole
/// vector added after.
struct F32Dots<'a, S> {
    simd: S,
    a: &'a [f32],
    b: &'a [f32],
    k: usize,
}

impl<S: pulp::Simd> FewDots for F32Dots<'_, S> {
    #[inline(always)]
    unsafe fn dots<const R: usize>(&self, rows: DotRows<R>) -> [[f32; FEW_W]; R] {
        let DotRows { is, js, next } = rows;
        let (simd, k) = (self.simd, self.k);
        let x = is.map(|i| S::as_simd_f32s(&self.a[i * k..(i + 1) * k]));
        let w = js.map(|j| S::as_simd_f32s(&self.b[j * k..(j + 1) * k]));
        let lanes = size_of::<S::f32s>() / size_of::<f32>();
        let mut acc = [[simd.splat_f32s(0.0); FEW_W]; R];
        for c in 0..w[0].0.len() {
            if let Some(next) = next {
                for j in next {
                    prefetch_rows(self.b.as_ptr().wrapping_add(j * k + c * lanes), 1, 0, 1);
                }
            }
            let wc = w.map(|w| w.0[c]);
            for r in 0..R {
                let xc = x[r].0[c];
                for t in 0..FEW_W {
                    acc[r][t] = simd.mul_add_f32s(xc, wc[t], acc[r][t]);
                }
            }
        }
        // Loops, not closures: the reduction's intrinsics inline only into code
        // compiled with the vectors' target features, which a closure is not (the
        // sums then live in memory, each step stored and loaded again).
        let mut sums = [[0.0; FEW_W]; R];
        for r in 0..R {
            for t in 0..FEW_W {
                let tail = x[r].1.iter().zip(w[t].1).map(|(x, w)| x * w).sum::<f32>();
                sums[r][t] = simd.reduce_sum_f32s(acc[r][t]) + tail;
            }
        }
        sums
    }
}

/// Runs `block(rows, cols)` on every block of a product's output `(m, n)` as the
/// products split it, in one fork-join: when the product is large, one row block
/// per rayon thread (of at least `PARALLEL_MIN_ROWS` rows: fewer rows make one
/// block) and column blocks of at most `PARALLEL_MAX_COLS` (at least one per thread
/// when the rows make one block), else the whole output on the calling thread;
/// blocks are whole `(mr, nr)` tiles but the last in each direction.
pub(crate) fn for_each_output_block(
    s: MatMul,
    (mr, nr): (usize, usize),
    block: impl Fn(Range<usize>, Range<usize>) + Sync,
) {
    let parallel = s.m * s.k * s.n >= PARALLEL_MIN_MACS;
    let threads = rayon::current_num_threads();
    let row_parts = if parallel {
        threads.min(s.m.div_ceil(mr.max(PARALLEL_MIN_ROWS)))
    } else {
        1
    };
    let col_parts = match (parallel, row_parts) {
        (false, _) => 1,
        (true, 1) => {
            s.n.div_ceil(PARALLEL_MAX_COLS)
                .max(threads.min(s.n.div_ceil(nr)))
        }
        (true, _) => s.n.div_ceil(PARALLEL_MAX_COLS),
    };
    let rows = s.m.div_ceil(row_parts).next_multiple_of(mr);
    let cols = s.n.div_ceil(col_parts).next_multiple_of(nr);
    (0..row_parts * col_parts).into_par_iter().for_each(|task| {
        let (r0, c0) = (task / col_parts * rows, task % col_parts * cols);
        let (r1, c1) = ((r0 + rows).min(s.m), (c0 + cols).min(s.n));
        if r0 < r1 && c0 < c1 {
            block(r0..r1, c0..c1);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products of every row count around the few-rows path, each operand stored
    /// either way, written or accumulated, equal the plain sum (exactly: the
    /// operands are small integers), in `f32` and `f64`.
    #[test]
    fn products_of_few_rows_equal_the_plain_sum() {
        products_equal_the_plain_sum::<f32>();
        products_equal_the_plain_sum::<f64>();
    }

    fn products_equal_the_plain_sum<F: Float>() {
        // k: whole vectors and a tail; n: odd, and large enough that products of 16
        // rows are split among threads (in blocks of an odd number of columns).
        let (k, n) = (37, 2001);
        for m in [1, 2, 3, 4, 5, 7, 8, 16, 17, 40, 127, 128, 129] {
            for (a_transposed, b_transposed, accumulate) in [
                (false, true, false),
                (false, true, true),
                (false, false, true),
                (true, false, false),
                (true, true, true),
            ] {
                let s = MatMul {
                    m,
                    k,
                    n,
                    a_transposed,
                    b_transposed,
                    accumulate,
                };
                let int = |x: usize| F::from_f64(x as f64);
                let a: Vec<F> = (0..m * k).map(|i| int((i * 7) % 13) - int(6)).collect();
                let b: Vec<F> = (0..k * n).map(|i| int((i * 5) % 11) - int(5)).collect();
                let at = |i: usize, p: usize| {
                    if a_transposed {
                        a[p * m + i]
                    } else {
                        a[i * k + p]
                    }
                };
                let bt = |p: usize, j: usize| {
                    if b_transposed {
                        b[j * k + p]
                    } else {
                        b[p * n + j]
                    }
                };
                let start: Vec<F> = (0..m * n).map(|i| int(i % 3)).collect();
                let mut out = start.clone();
                matmul(&mut out, &a, &b, s);
                for i in 0..m {
                    for j in 0..n {
                        let sum: F = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                        let want = sum
                            + if accumulate {
                                start[i * n + j]
                            } else {
                                F::ZERO
                            };
                        assert_eq!(out[i * n + j], want, "{s:?} at ({i}, {j})");
                    }
                }
            }
        }
    }
}
