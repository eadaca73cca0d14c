//! Matrix products through the `gemm` crate: the linear layers' forward
//! (`y = x Wᵀ`) and backward (`dx = dy W`, `dW += dyᵀ x`) and attention's per-head
//! products, all as strided views so transposes cost nothing.

use super::memory::SharedMut;
use crate::kernels::{Float, MatMul};
use gemm::Parallelism;
use rayon::prelude::*;
use std::ops::Range;

/// Products smaller than this many multiply-adds run on the calling thread: the
/// fork-join costs more than it saves.
const PARALLEL_MIN_MACS: usize = 1 << 20;

/// Parallel products are split into blocks of at most this many output columns,
/// so the vocabulary-wide LM head becomes several tasks per thread: they balance
/// when one thread is slowed, and each block's packed right operand stays small.
const PARALLEL_MAX_COLS: usize = 1024;

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
    let a_rs = if s.a_transposed { s.m } else { s.k };
    let b_rs = if s.b_transposed { s.k } else { s.n };
    let a = View::new(a, a_rs, s.a_transposed);
    let b = View::new(b, b_rs, s.b_transposed);
    let out = SharedMut(out.as_mut_ptr());
    for_each_output_block(s, (1, 1), |rows, cols| {
        let (a, b) = (a, b); // whole views (Sync), not their raw-pointer fields
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

/// Runs `block(rows, cols)` on every block of a product's output `(m, n)` as the
/// products split it, in one fork-join: one row block per rayon thread and column
/// blocks of at most `PARALLEL_MAX_COLS` when the product is large, else the whole
/// output on the calling thread; blocks are whole `(mr, nr)` tiles but the last in
/// each direction.
pub(crate) fn for_each_output_block(
    s: MatMul,
    (mr, nr): (usize, usize),
    block: impl Fn(Range<usize>, Range<usize>) + Sync,
) {
    let parallel = s.m * s.k * s.n >= PARALLEL_MIN_MACS;
    let row_parts = if parallel {
        rayon::current_num_threads().min(s.m.div_ceil(mr))
    } else {
        1
    };
    let col_parts = if parallel {
        s.n.div_ceil(PARALLEL_MAX_COLS)
    } else {
        1
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
