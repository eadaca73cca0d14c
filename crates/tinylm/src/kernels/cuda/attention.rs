//! Launches of `attention.cu`: causal flash attention over the heads of the fused
//! `qkv` rows (see the `.cu` file), one kernel forward and two backward.

use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, int, packing};
use crate::kernels::AttnShape;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The forward's variants (`attention_forward_d{DP}` in `attention.cu`): the head
/// dimension it pads to, DP, and its warps per block (each takes 16 query rows), as
/// the `.cu` file instantiates them.
const FORWARD_TILES: [(usize, u32); 4] = [(16, 4), (32, 4), (64, 4), (128, 2)];

/// The backward's variants (`attention_backward_dq_d{DP}` and `_dkv_d{DP}`): DP and
/// warps per block (each takes 16 query rows, or 16 keys).
const BACKWARD_TILES: [(usize, u32); 4] = [(16, 4), (32, 4), (64, 2), (128, 1)];

/// The largest head dimension the GPU's attention handles.
pub const MAX_HEAD_DIM: usize = FORWARD_TILES[FORWARD_TILES.len() - 1].0;

/// The variant of `tiles` for head dimension `d` and its launch over `rows` rows of
/// each of `B·H` heads, or `None` past [`MAX_HEAD_DIM`].
fn tile_launch(tiles: &[(usize, u32)], s: AttnShape, rows: usize) -> Option<(usize, LaunchConfig)> {
    let &(dp, warps) = tiles.iter().find(|(dp, _)| s.d <= *dp)?;
    let cfg = LaunchConfig {
        grid_dim: (
            (s.b * s.h) as u32,
            rows.div_ceil(16 * warps as usize) as u32,
            1,
        ),
        block_dim: (32 * warps, 1, 1),
        shared_mem_bytes: 0,
    };
    Some((dp, cfg))
}

impl Cuda {
    /// Causal softmax attention: `out (B, Tq, C)` from `qkv (B, T, 3C)`, keeping each
    /// query row's base-2 log-sum-exp `lse (B, H, Tq)` (f32) for the backward, in one
    /// fused kernel (`attention_forward_tile`) for head dimensions up to
    /// [`MAX_HEAD_DIM`]; a larger one is the backend's error.
    pub fn attention_forward(&self, out: Dev, lse: Dev, qkv: Dev, s: AttnShape) {
        let (t, tq) = (s.t, s.tq());
        let x = self.float_x();
        expect(out, s.b * tq * s.c(), x, "attention out");
        expect(lse, s.b * s.h * tq, DType::F32, "attention log-sum-exp");
        expect(qkv, s.b * t * 3 * s.c(), x, "attention qkv");
        let Some((dp, cfg)) = tile_launch(&FORWARD_TILES, s, tq) else {
            return self.head_dim_error(s);
        };
        let name = format!("attention_forward_d{dp}");
        let (t_, tq_, q0, h, d) = (int(t), int(tq), int(s.q0), int(s.h), int(s.d));
        let scale = 1.0 / (s.d as f32).sqrt();
        let packed = packing(s.d, x, [qkv]).0;
        let mut args = self.kernel(&name);
        args.arg(&out.ptr).arg(&lse.ptr).arg(&qkv.ptr);
        args.arg(&t_).arg(&tq_).arg(&q0).arg(&h).arg(&d).arg(&scale);
        args.arg(&packed);
        self.run(&name, args, cfg);
    }

    /// `dqkv (B, T, 3C)` (overwritten) from `dout (B, T, C)`, and the forward's `out`,
    /// `qkv` and `lse`; `drow (B, H, T)` (f32) is scratch, each query row's
    /// `Σ dout·out`. Full passes only (`q0 = 0`).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        dqkv: Dev,
        drow: Dev,
        dout: Dev,
        out: Dev,
        qkv: Dev,
        lse: Dev,
        s: AttnShape,
    ) {
        assert_eq!(s.q0, 0, "attention backward needs a full pass");
        let x = self.float_x();
        let (rows, part) = (s.b * s.h * s.t, s.b * s.t * s.c());
        expect(dqkv, 3 * part, x, "attention dqkv");
        expect(drow, rows, DType::F32, "attention row sums");
        expect(dout, part, x, "attention dout");
        expect(out, part, x, "attention out");
        expect(qkv, 3 * part, x, "attention qkv");
        expect(lse, rows, DType::F32, "attention log-sum-exp");
        let Some((dp, cfg)) = tile_launch(&BACKWARD_TILES, s, s.t) else {
            return self.head_dim_error(s);
        };
        let (t, h, d) = (int(s.t), int(s.h), int(s.d));
        let scale = 1.0 / (s.d as f32).sqrt();
        let packed = packing(s.d, x, [dqkv, dout, out, qkv]).0;
        // dQ and each row's Σ dout·out, then dK and dV, which read those sums.
        let name = format!("attention_backward_dq_d{dp}");
        let mut args = self.kernel(&name);
        args.arg(&dqkv.ptr)
            .arg(&drow.ptr)
            .arg(&dout.ptr)
            .arg(&out.ptr);
        args.arg(&qkv.ptr).arg(&lse.ptr);
        args.arg(&t).arg(&h).arg(&d).arg(&scale).arg(&packed);
        self.run(&name, args, cfg);
        let name = format!("attention_backward_dkv_d{dp}");
        let mut args = self.kernel(&name);
        args.arg(&dqkv.ptr)
            .arg(&dout.ptr)
            .arg(&qkv.ptr)
            .arg(&lse.ptr);
        args.arg(&drow.ptr);
        args.arg(&t).arg(&h).arg(&d).arg(&scale).arg(&packed);
        self.run(&name, args, cfg);
    }

    /// A head dimension over [`MAX_HEAD_DIM`], recorded for the next synchronization.
    fn head_dim_error(&self, s: AttnShape) {
        let e = format!(
            "head dimension {} is over {MAX_HEAD_DIM}, the most it handles",
            s.d
        );
        self.check::<(), _>("attention", Err(e))
    }
}
