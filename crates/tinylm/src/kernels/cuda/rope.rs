//! Launches of `rope.cu`.

use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, expect_u32, int, packing, per_element};
use crate::kernels::AttnShape;
use cudarc::driver::PushKernelArg;

impl Cuda {
    /// Rotates the query and key heads of the new rows `qkv (B, Tq, 3C)` in place
    /// (row `i` at position `q0 + i`), or by the inverse rotation when `inverse`;
    /// `cos`, `sin`: `(context_length, D/2)` f32.
    pub fn rope(&self, qkv: Dev, cos: Dev, sin: Dev, s: AttnShape, inverse: bool) {
        let rows = s.b * s.tq();
        expect(qkv, rows * 3 * s.c(), self.float_x(), "rope qkv");
        expect(cos, s.t * s.d / 2, DType::F32, "rope cos");
        expect(sin, s.t * s.d / 2, DType::F32, "rope sin");
        expect_u32(rows * 3 * s.c(), "rope qkv");
        let (rows_, tq, q0, h, d, inv) = (
            int(rows),
            int(s.tq()),
            int(s.q0),
            int(s.h),
            int(s.d),
            inverse as i32,
        );
        let (packed, width) = match packing(s.d, self.float_x(), [qkv]) {
            (1, width) => (1, width),
            _ => (0, 2),
        };
        let mut args = self.kernel("rope");
        args.arg(&qkv.ptr).arg(&cos.ptr).arg(&sin.ptr);
        args.arg(&rows_).arg(&tq).arg(&q0).arg(&h).arg(&d).arg(&inv);
        args.arg(&packed);
        self.run("rope", args, per_element(rows * 2 * s.c() / width));
    }
}
