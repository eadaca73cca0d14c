//! Launches of `adamw.cu`.

use super::buffer::{DType, Dev, NULL};
use super::context::Cuda;
use super::launch::{expect, grid, BLOCK};
use crate::kernels::{AdamWParams, CLIP_EPS};
use cudarc::driver::PushKernelArg;

/// The most blocks (of [`BLOCK`] threads) of the grid-stride AdamW loop.
pub const MAX_BLOCKS: usize = 65535;

impl Cuda {
    /// AdamW step number `step` (from 1) on the flat buffers `params`, `grads`, `m`,
    /// `v` (f32), exactly as [`adamw_step`](crate::kernels::cpu::adamw::adamw_step). With `clip` — the
    /// gradient's sum of squares `(1)` f64 on the device and the norm limit — the
    /// gradient is first scaled by [`clip_scale`](crate::kernels::clip_scale) of them, computed by
    /// the kernel. `shadow` (floatX), when given, receives the new parameters for
    /// the matrix products.
    #[allow(clippy::too_many_arguments)]
    pub fn adamw(
        &self,
        params: Dev,
        shadow: Option<Dev>,
        grads: Dev,
        m: Dev,
        v: Dev,
        step: u64,
        lr: f64,
        hp: &AdamWParams,
        clip: Option<(Dev, f64)>,
    ) {
        let n = params.len;
        for (x, what) in [(params, "params"), (grads, "grads"), (m, "m"), (v, "v")] {
            expect(x, n, DType::F32, what);
        }
        if let Some(shadow) = shadow {
            expect(shadow, n, self.float_x(), "shadow");
        }
        assert!(step >= 1, "adamw: steps count from 1");
        // The same f64 → f32 arithmetic as the CPU's adamw_step.
        let t = step as i32;
        let alpha_t = (lr * (1.0 - hp.beta2.powi(t)).sqrt() / (1.0 - hp.beta1.powi(t))) as f32;
        let (b1, b2, eps) = (hp.beta1 as f32, hp.beta2 as f32, hp.eps as f32);
        let decay = (lr * hp.weight_decay) as f32;
        let shadow_ptr = shadow.map_or(NULL, |s| s.ptr);
        if let Some((sum, _)) = clip {
            expect(sum, 1, DType::F64, "adamw sum of squares");
        }
        let (sum_ptr, max_norm) = clip.map_or((NULL, 0.0), |(sum, max)| (sum.ptr, max));
        let n_ = n as u64;
        let mut args = self.kernel("adamw");
        args.arg(&params.ptr)
            .arg(&shadow_ptr)
            .arg(&grads.ptr)
            .arg(&m.ptr)
            .arg(&v.ptr);
        args.arg(&n_)
            .arg(&alpha_t)
            .arg(&b1)
            .arg(&b2)
            .arg(&eps)
            .arg(&decay);
        args.arg(&sum_ptr).arg(&max_norm).arg(&CLIP_EPS);
        self.run(
            "adamw",
            args,
            grid(n.div_ceil(BLOCK as usize).min(MAX_BLOCKS)),
        );
    }
}
