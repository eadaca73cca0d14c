//! Launches of `rmsnorm.cu`.

use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, int, packing, per_row_warp};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::kernels::workspace::Scratch;
pub use crate::kernels::workspace::ROW_BLOCKS;

/// The widest row (`C`) the backward takes: its shared column sums
/// (`COLUMN_SUMS` f32 in `rmsnorm.cu`, 48 KiB) hold a row of `C` for each warp.
pub const MAX_WIDTH: usize = 12288;

/// Thread rows of the gain gradient's second stage (`DG_SLICES` in `rmsnorm.cu`).
const DG_SLICES: u32 = 32;

impl Cuda {
    /// `out (N, C) = x / sqrt(mean(x²) + eps) ⊙ g`, `rstd (N)` f32; `g (C)` f32.
    pub fn rmsnorm_forward(&self, out: Dev, rstd: Dev, x: Dev, g: Dev, eps: f32) {
        let (n, c) = (rstd.len, g.len);
        expect(out, n * c, self.float_x(), "rmsnorm out");
        expect(x, n * c, self.float_x(), "rmsnorm x");
        expect(rstd, n, DType::F32, "rmsnorm rstd");
        expect(g, c, DType::F32, "rmsnorm g");
        let (n_, c_) = (int(n), int(c));
        let (packed, _) = packing(c, self.float_x(), [out, x, g]);
        let mut args = self.kernel("rmsnorm_forward");
        args.arg(&out.ptr).arg(&rstd.ptr).arg(&x.ptr).arg(&g.ptr);
        args.arg(&n_).arg(&c_).arg(&eps).arg(&packed);
        self.run("rmsnorm_forward", args, per_row_warp(n));
    }

    /// `dx (N, C) (+)= ∂/∂x` (added when `accumulate`), `dg (C) f32 += ∂/∂g`;
    /// `scratch` holds at least `ROW_BLOCKS · C` f32; `C` at most [`MAX_WIDTH`].
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
        let need = Scratch::NormGain.len(c);
        expect(scratch, need, DType::F32, "rmsnorm scratch");
        assert!(c <= MAX_WIDTH, "rmsnorm: rows of {c} are over {MAX_WIDTH}");
        // As many warps as the shared column sums allow, up to 8; a block for each
        // of their row groups, up to ROW_BLOCKS.
        let warps = (MAX_WIDTH / c.max(1)).min(8);
        let blocks = n.div_ceil(warps).clamp(1, ROW_BLOCKS);
        let (n_, c_, acc, blocks_) = (int(n), int(c), accumulate as i32, int(blocks));
        let (packed, _) = packing(c, self.float_x(), [dx, dout, x, g]);
        let mut args = self.kernel("rmsnorm_backward");
        args.arg(&dx.ptr)
            .arg(&scratch.ptr)
            .arg(&dout.ptr)
            .arg(&x.ptr)
            .arg(&g.ptr)
            .arg(&rstd.ptr);
        args.arg(&n_).arg(&c_).arg(&acc).arg(&packed);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        self.run("rmsnorm_backward", args, cfg);
        let mut args = self.kernel("rmsnorm_backward_dg_finish");
        args.arg(&dg.ptr).arg(&scratch.ptr).arg(&blocks_).arg(&c_);
        let cfg = LaunchConfig {
            grid_dim: (c.div_ceil(32) as u32, 1, 1),
            block_dim: (32, DG_SLICES, 1),
            shared_mem_bytes: 0,
        };
        self.run("rmsnorm_backward_dg_finish", args, cfg);
    }
}
