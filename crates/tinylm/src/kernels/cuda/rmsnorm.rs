//! Launches of `rmsnorm.cu`.

use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, int, packing, per_element, per_row_warp};
use cudarc::driver::{LaunchConfig, PushKernelArg};

pub use crate::kernels::workspace::ROW_BLOCKS;

impl Cuda {
    /// `out (N, C) = x / sqrt(mean(x²) + eps) ⊙ g`, `rstd (N)` f32; `g (C)` f32.
    pub fn rmsnorm_forward(&self, out: Dev, rstd: Dev, x: Dev, g: Dev, eps: f32) {
        let (n, c) = (rstd.len, g.len);
        expect(out, n * c, self.float_x(), "rmsnorm out");
        expect(x, n * c, self.float_x(), "rmsnorm x");
        expect(rstd, n, DType::F32, "rmsnorm rstd");
        expect(g, c, DType::F32, "rmsnorm g");
        let (n_, c_) = (int(n), int(c));
        let (packed, _) = packing(c, self.float_x(), [out, x]);
        let mut args = self.kernel("rmsnorm_forward");
        args.arg(&out.ptr).arg(&rstd.ptr).arg(&x.ptr).arg(&g.ptr);
        args.arg(&n_).arg(&c_).arg(&eps).arg(&packed);
        self.run("rmsnorm_forward", args, per_row_warp(n));
    }

    /// `dx (N, C) (+)= ∂/∂x` (added when `accumulate`), `dg (C) f32 += ∂/∂g`;
    /// `scratch` holds at least `ROW_BLOCKS · C` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_backward(
        &self,
        dx: Dev,
        dg: Dev,
        dout: Dev,
        x: Dev,
        g: Dev,
        rstd: Dev,
        accumulate: bool,
        scratch: Dev,
    ) {
        let (n, c) = (rstd.len, g.len);
        for (buf, what) in [(dx, "rmsnorm dx"), (dout, "rmsnorm dout"), (x, "rmsnorm x")] {
            expect(buf, n * c, self.float_x(), what);
        }
        expect(dg, c, DType::F32, "rmsnorm dg");
        expect(scratch, ROW_BLOCKS * c, DType::F32, "rmsnorm scratch");
        let (n_, c_, acc, blocks) = (int(n), int(c), accumulate as i32, int(ROW_BLOCKS));
        let (packed, width) = packing(c, self.float_x(), [dx, dout, x]);
        let mut args = self.kernel("rmsnorm_backward_dx");
        args.arg(&dx.ptr)
            .arg(&dout.ptr)
            .arg(&x.ptr)
            .arg(&g.ptr)
            .arg(&rstd.ptr);
        args.arg(&n_).arg(&c_).arg(&acc).arg(&packed);
        self.run("rmsnorm_backward_dx", args, per_row_warp(n));
        let mut args = self.kernel("rmsnorm_backward_dg_partial");
        args.arg(&scratch.ptr)
            .arg(&dout.ptr)
            .arg(&x.ptr)
            .arg(&rstd.ptr);
        args.arg(&n_).arg(&c_).arg(&packed);
        let cfg = LaunchConfig {
            grid_dim: (c.div_ceil(32 * width) as u32, ROW_BLOCKS as u32, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        self.run("rmsnorm_backward_dg_partial", args, cfg);
        let mut args = self.kernel("rmsnorm_backward_dg_finish");
        args.arg(&dg.ptr).arg(&scratch.ptr).arg(&blocks).arg(&c_);
        self.run("rmsnorm_backward_dg_finish", args, per_element(c));
    }
}
