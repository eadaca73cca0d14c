//! The matrix-product launches of [`Cuda`]: the CPU twin is `kernels/cpu/linear.rs`,
//! the cuBLASLt call is in [`blas`](super::blas).

use super::blas::Batch;
use super::buffer::Dev;
use super::context::Cuda;
use crate::kernels::MatMul;

impl Cuda {
    /// `out = a·b` or `out += a·b` (see [`MatMul`]): `a`, `b` in `floatX`, `out` in
    /// `floatX` or f32.
    pub fn matmul(&self, out: Dev, a: Dev, b: Dev, shape: MatMul) {
        self.matmul_batched(out, a, b, shape, Batch::ONE, 1.0);
    }

    /// `batch.count` products `out_i (+)= alpha · a_i · b_i`, entry `i` at element
    /// offsets `i · stride` of each buffer (attention's per-head products).
    pub fn matmul_batched(
        &self,
        out: Dev,
        a: Dev,
        b: Dev,
        shape: MatMul,
        batch: Batch,
        alpha: f32,
    ) {
        let MatMul { m, k, n, .. } = shape;
        let last = |stride: usize, size: usize| (batch.count - 1) * stride + size;
        assert!(
            a.len >= last(batch.stride_a, m * k)
                && b.len >= last(batch.stride_b, k * n)
                && out.len >= last(batch.stride_out, m * n),
            "matmul operands smaller than {shape:?} x {batch:?}"
        );
        assert_eq!(a.dtype, b.dtype, "matmul operand types");
        if m * n * batch.count == 0 {
            return;
        }
        self.bind();
        let result = self
            .blas
            .matmul(self.stream(), out, a, b, shape, batch, alpha);
        self.check("matmul", result);
    }
}
