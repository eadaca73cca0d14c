//! Launches of `embedding.cu`.

use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, expect_u32, int, packing, per_element};
use cudarc::driver::PushKernelArg;

impl Cuda {
    /// `out (N, C) floatX = table[ids]`, `table (V, C)` f32, `ids (N)`.
    pub fn embedding_forward(&self, out: Dev, ids: Dev, table: Dev) {
        let (n, c) = (ids.len, out.len / ids.len.max(1));
        expect(out, n * c, self.float_x(), "embedding out");
        expect(ids, n, DType::U32, "embedding ids");
        expect(table, c, DType::F32, "embedding table");
        expect_u32(n * c, "embedding out");
        let (n_, c_) = (int(n), int(c));
        let (packed, width) = packing(c, self.float_x(), [out, table]);
        let mut args = self.kernel("embedding_forward");
        args.arg(&out.ptr)
            .arg(&ids.ptr)
            .arg(&table.ptr)
            .arg(&n_)
            .arg(&c_)
            .arg(&packed);
        self.run("embedding_forward", args, per_element(n * c / width));
    }

    /// `dtable (V, C) f32 += scatter(dout (N, C) floatX)` at rows `ids (N)`.
    pub fn embedding_backward(&self, dtable: Dev, dout: Dev, ids: Dev) {
        let (n, c) = (ids.len, dout.len / ids.len.max(1));
        expect(dout, n * c, self.float_x(), "embedding dout");
        expect(ids, n, DType::U32, "embedding ids");
        expect(dtable, c, DType::F32, "embedding dtable");
        expect_u32(n * c, "embedding dout");
        let (n_, c_) = (int(n), int(c));
        let mut args = self.kernel("embedding_backward");
        args.arg(&dtable.ptr)
            .arg(&dout.ptr)
            .arg(&ids.ptr)
            .arg(&n_)
            .arg(&c_);
        self.run("embedding_backward", args, per_element(n * c));
    }
}
