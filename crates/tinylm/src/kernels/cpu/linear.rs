//! Matrix products through the `gemm` crate: the linear layers' forward
//! (`y = x Wᵀ`) and backward (`dx = dy W`, `dW += dyᵀ x`) and attention's per-head
//! products, all as strided views so transposes cost nothing.

use super::super::{Float, MatMul};
use gemm::Parallelism;
use rayon::prelude::*;

/// Products smaller than this many multiply-adds run on the calling thread: the
/// fork-join costs more than it saves.
const PARALLEL_MIN_MACS: usize = 1 << 20;

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
/// are split by output rows into one single-threaded `gemm` per rayon thread: one
/// fork-join per product, each thread streaming through a large block.
pub fn matmul<F: Float>(out: &mut [F], a: &[F], b: &[F], s: MatMul) {
    assert_eq!(out.len(), s.m * s.n, "matmul output size");
    assert_eq!(a.len(), s.m * s.k, "matmul lhs size");
    assert_eq!(b.len(), s.k * s.n, "matmul rhs size");
    if s.m * s.n == 0 {
        return;
    }
    let a_rs = if s.a_transposed { s.m } else { s.k };
    let b_rs = if s.b_transposed { s.k } else { s.n };
    let parts = if s.m * s.k * s.n >= PARALLEL_MIN_MACS {
        rayon::current_num_threads().min(s.m)
    } else {
        1
    };
    let rows = s.m.div_ceil(parts);
    let (a_view, b_view) = (
        View::new(a, a_rs, s.a_transposed),
        View::new(b, b_rs, s.b_transposed),
    );
    out.par_chunks_mut(rows * s.n)
        .enumerate()
        .for_each(|(i, out)| {
            let a = a_view;
            // SAFETY: rows i·rows.. of `a` exist (sizes checked above); each task
            // writes only its own chunk of `out`.
            unsafe {
                let a = View {
                    ptr: a.ptr.offset((i * rows) as isize * a.rs),
                    ..a
                };
                gemm_view(
                    (out.len() / s.n, s.k, s.n),
                    out.as_mut_ptr(),
                    s.n,
                    a,
                    b_view,
                    F::ONE,
                    s.accumulate,
                );
            }
        });
}
