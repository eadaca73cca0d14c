//! Launches of `cross_entropy.cu`.

use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, grid, int, packing};
use crate::kernels::BatchPart;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Threads per row of the fused cross-entropy.
const THREADS_PER_ROW: u32 = 256;

impl Cuda {
    /// `loss (1)` f32 = the cross-entropy of `logits (N, V)` against `targets (N)`
    /// summed over the N rows and divided by `part.rows` (added to `loss` with
    /// `part.accumulate`); with `grad`, the logits are overwritten by
    /// `(softmax − onehot)/part.rows`. `losses (N)` f32 is scratch. Queued: read
    /// `loss` when it is needed.
    pub fn cross_entropy(
        &self,
        loss: Dev,
        losses: Dev,
        logits: Dev,
        targets: Dev,
        grad: bool,
        part: BatchPart,
    ) {
        let n = targets.len;
        let v = logits.len / n.max(1);
        expect(logits, n * v, self.float_x(), "cross-entropy logits");
        expect(targets, n, DType::U32, "cross-entropy targets");
        expect(losses, n, DType::F32, "cross-entropy losses");
        expect(loss, 1, DType::F32, "cross-entropy loss");
        let (n_, v_, grad_) = (int(n), int(v), grad as i32);
        let (rows, accumulate) = (int(part.rows), part.accumulate as i32);
        let (packed, _) = packing(v, self.float_x(), [logits]);
        let mut args = self.kernel("cross_entropy_forward_backward");
        args.arg(&logits.ptr).arg(&losses.ptr).arg(&targets.ptr);
        args.arg(&rows).arg(&v_).arg(&grad_).arg(&packed);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (THREADS_PER_ROW, 1, 1),
            shared_mem_bytes: 0,
        };
        self.run("cross_entropy_forward_backward", args, cfg);
        let mut args = self.kernel("cross_entropy_mean");
        args.arg(&loss.ptr)
            .arg(&losses.ptr)
            .arg(&n_)
            .arg(&rows)
            .arg(&accumulate);
        let one_block = LaunchConfig {
            block_dim: (1024, 1, 1),
            ..grid(1)
        };
        self.run("cross_entropy_mean", args, one_block);
    }
}
