//! Launches of `global_norm.cu`.

use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, packing};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::kernels::workspace::Scratch;
pub use crate::kernels::workspace::NORM_BLOCKS;
/// Threads per block of the first stage: its grid-stride loop covers
/// `NORM_BLOCKS · NORM_THREADS` elements a pass.
pub const NORM_THREADS: u32 = 512;

impl Cuda {
    /// `sum (1)` f64 = `Σ x²` over `x` (f32); `scratch`: `NORM_BLOCKS` f64.
    pub fn sum_squares(&self, sum: Dev, x: Dev, scratch: Dev) {
        expect(x, x.len, DType::F32, "sum_squares x");
        expect(sum, 1, DType::F64, "sum_squares sum");
        let need = Scratch::Squares.len(0);
        expect(scratch, need, DType::F64, "sum_squares scratch");
        let n = x.len as u64;
        // In 16-byte packs when x is aligned (any length: the tail goes one by one).
        let (packed, _) = packing(4, DType::F32, [x]);
        let mut args = self.kernel("global_norm_partial");
        args.arg(&scratch.ptr).arg(&x.ptr).arg(&n).arg(&packed);
        let cfg = LaunchConfig {
            grid_dim: (NORM_BLOCKS as u32, 1, 1),
            block_dim: (NORM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        self.run("global_norm_partial", args, cfg);
        let blocks = NORM_BLOCKS as i32;
        let mut args = self.kernel("global_norm_finish");
        args.arg(&sum.ptr).arg(&scratch.ptr).arg(&blocks);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        self.run("global_norm_finish", args, cfg);
    }
}
