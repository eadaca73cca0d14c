//! Launches of `global_norm.cu`.

use super::{expect, Cuda, DType, Dev};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Blocks of the first stage: fixed, so the summation order (and the result) is the
/// same every step. Its scratch is `NORM_BLOCKS` f64 = `2 · NORM_BLOCKS` f32.
pub const NORM_BLOCKS: usize = 264;

impl Cuda {
    /// `norm_scale (2)` f32 = the global L2 norm of `grads` (f32) and the clipping
    /// factor `max/(norm + eps)` when `max > 0` and `norm > max`, else 1 — all on the
    /// device (the factor feeds [`Cuda::adamw`]). `scratch`: `2 · NORM_BLOCKS` f32.
    pub fn global_norm(&self, norm_scale: Dev, grads: Dev, max_norm: f64, eps: f64, scratch: Dev) {
        expect(grads, grads.len, DType::F32, "global_norm grads");
        expect(norm_scale, 2, DType::F32, "global_norm norm_scale");
        expect(scratch, 2 * NORM_BLOCKS, DType::F32, "global_norm scratch");
        let n = grads.len as u64;
        let mut args = self.kernel("global_norm_partial");
        args.arg(&scratch.ptr).arg(&grads.ptr).arg(&n);
        let cfg = LaunchConfig {
            grid_dim: (NORM_BLOCKS as u32, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        self.run("global_norm_partial", args, cfg);
        let blocks = NORM_BLOCKS as i32;
        let mut args = self.kernel("global_norm_finish");
        args.arg(&norm_scale.ptr)
            .arg(&scratch.ptr)
            .arg(&blocks)
            .arg(&max_norm)
            .arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        self.run("global_norm_finish", args, cfg);
    }
}
