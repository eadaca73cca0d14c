//! The matrix-product launches of [`Cuda`]: the CPU twin is `kernels/cpu/linear.rs`,
//! the cuBLASLt call is in [`blas`](super::blas).

use super::buffer::Dev;
use super::context::Cuda;
use crate::kernels::MatMul;

impl Cuda {
    /// `out = a·b` or `out += a·b` (see [`MatMul`]): `a`, `b` in `floatX`, `out` in
    /// `floatX` or f32.
    pub fn matmul(&self, out: Dev, a: Dev, b: Dev, shape: MatMul) {
        let MatMul { m, k, n, .. } = shape;
        assert!(
            a.len >= m * k && b.len >= k * n && out.len >= m * n,
            "matmul operands smaller than {shape:?}"
        );
        assert_eq!(a.dtype, b.dtype, "matmul operand types");
        if m * n == 0 {
            return;
        }
        self.bind();
        let result = self.blas.matmul(self.stream(), out, a, b, shape);
        self.check("matmul", result);
    }
}
