//! Launches of `attention.cu` and the backward's batched products between them:
//! causal attention over the heads of the fused `qkv` rows (see the `.cu` file).

use super::blas::Batch;
use super::buffer::Dev;
use super::context::Cuda;
use super::launch::{expect, expect_u32, int, packing, per_element, per_row_warp};
use crate::kernels::{AttnShape, MatMul};
use cudarc::driver::{LaunchConfig, PushKernelArg};

pub use crate::kernels::workspace::attention_scratch_len;

/// The fused forward's variants (`attention_forward_d{DP}` in `attention.cu`): the
/// head dimension it pads to, DP, and its warps per block (each takes 16 query rows),
/// as the `.cu` file instantiates them.
const FORWARD_TILES: [(usize, u32); 4] = [(16, 4), (32, 4), (64, 4), (128, 2)];

/// The largest head dimension the GPU's attention handles.
pub const MAX_HEAD_DIM: usize = FORWARD_TILES[FORWARD_TILES.len() - 1].0;

impl Cuda {
    /// rows `(B, T, parts·C)` ⇄ heads `(parts, B, H, T, D)`.
    fn attention_heads(
        &self,
        heads: Dev,
        rows: Dev,
        s: AttnShape,
        t: usize,
        parts: usize,
        to_heads: bool,
    ) {
        let len = parts * s.b * t * s.c();
        expect(heads, len, self.float_x(), "attention heads");
        expect(rows, len, self.float_x(), "attention rows");
        expect_u32(len, "attention heads");
        let (b, t_, h, d, parts_, to) = (
            int(s.b),
            int(t),
            int(s.h),
            int(s.d),
            int(parts),
            to_heads as i32,
        );
        let (packed, width) = packing(s.d, self.float_x(), [heads, rows]);
        let mut args = self.kernel("attention_heads");
        args.arg(&heads.ptr).arg(&rows.ptr);
        args.arg(&b).arg(&t_).arg(&h).arg(&d).arg(&parts_).arg(&to);
        args.arg(&packed);
        self.run("attention_heads", args, per_element(len.div_ceil(width)));
    }

    /// `batch` per-head products over `(B·H)` entries; `rows_a`, `rows_b`, `rows_out`
    /// are each entry's row counts, which fix its stride (entries are contiguous).
    fn attention_products(
        &self,
        out: Dev,
        a: Dev,
        b: Dev,
        shape: MatMul,
        s: AttnShape,
        strides: (usize, usize, usize),
    ) {
        let batch = Batch {
            count: s.b * s.h,
            stride_a: strides.0,
            stride_b: strides.1,
            stride_out: strides.2,
        };
        self.matmul_batched(out, a, b, shape, batch, 1.0);
    }

    /// Causal softmax attention: `out (B, Tq, C)` from `qkv (B, T, 3C)`, keeping the
    /// probabilities `att (B, H, Tq, T)`, in one fused kernel (`attention_forward_tile`)
    /// for head dimensions up to [`MAX_HEAD_DIM`]; a larger one is the backend's error.
    pub fn attention_forward(&self, out: Dev, att: Dev, qkv: Dev, s: AttnShape) {
        let (t, tq) = (s.t, s.tq());
        let x = self.float_x();
        expect(out, s.b * tq * s.c(), x, "attention out");
        expect(att, s.b * s.h * tq * t, x, "attention att");
        expect(qkv, s.b * t * 3 * s.c(), x, "attention qkv");
        let Some(&(dp, warps)) = FORWARD_TILES.iter().find(|(dp, _)| s.d <= *dp) else {
            let e = format!(
                "head dimension {} is over {MAX_HEAD_DIM}, the most it handles",
                s.d
            );
            return self.check::<(), _>("attention", Err(e));
        };
        let name = format!("attention_forward_d{dp}");
        let (t_, tq_, q0, h, d) = (int(t), int(tq), int(s.q0), int(s.h), int(s.d));
        let scale = 1.0 / (s.d as f32).sqrt();
        let packed = packing(s.d, x, [qkv]).0 | packing(t, x, [att]).0 << 1;
        let mut args = self.kernel(&name);
        args.arg(&out.ptr).arg(&att.ptr).arg(&qkv.ptr);
        args.arg(&t_).arg(&tq_).arg(&q0).arg(&h).arg(&d).arg(&scale);
        args.arg(&packed);
        let cfg = LaunchConfig {
            grid_dim: (
                (s.b * s.h) as u32,
                tq.div_ceil(16 * warps as usize) as u32,
                1,
            ),
            block_dim: (32 * warps, 1, 1),
            shared_mem_bytes: 0,
        };
        self.run(&name, args, cfg);
    }

    /// `dqkv (B, T, 3C)` (overwritten) from `dout (B, T, C)`, `qkv` and `att` of the
    /// forward; `datt (B, H, T, T)` and `scratch` ([`attention_scratch_len`]) are
    /// scratch. Full passes only (`q0 = 0`).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        dqkv: Dev,
        datt: Dev,
        dout: Dev,
        qkv: Dev,
        att: Dev,
        s: AttnShape,
        scratch: Dev,
    ) {
        assert_eq!(s.q0, 0, "attention backward needs a full pass");
        let (t, d) = (s.t, s.d);
        let x = self.float_x();
        expect(datt, s.b * s.h * t * t, x, "attention datt");
        expect(att, s.b * s.h * t * t, x, "attention att");
        expect(scratch, attention_scratch_len(s), x, "attention scratch");
        let part = s.b * t * s.c();
        let heads = scratch.sub(0, 3 * part);
        let dheads = scratch.sub(3 * part, 3 * part);
        let dy = scratch.sub(6 * part, part);
        let [q, k, v] = [0, 1, 2].map(|i| heads.sub(i * part, part));
        let [dq, dk, dv] = [0, 1, 2].map(|i| dheads.sub(i * part, part));
        self.attention_heads(heads, qkv, s, t, 3, true);
        self.attention_heads(dy, dout, s, t, 1, true);
        let square = (t * t, t * d, t * d);
        let product = |a_transposed, b_transposed, m, k, n| MatMul {
            m,
            k,
            n,
            a_transposed,
            b_transposed,
            accumulate: false,
        };
        // dV = Pᵀ dY: (T, T)ᵀ(T, D).
        self.attention_products(dv, att, dy, product(true, false, t, t, d), s, square);
        // dP = dY Vᵀ: (T, D)(D, T).
        self.attention_products(
            datt,
            dy,
            v,
            product(false, true, t, d, t),
            s,
            (t * d, t * d, t * t),
        );
        let (rows, t_) = (int(s.b * s.h * t), int(t));
        let scale = 1.0 / (d as f32).sqrt();
        let (packed, _) = packing(t, self.float_x(), [datt, att]);
        let mut args = self.kernel("attention_softmax_backward");
        args.arg(&datt.ptr)
            .arg(&att.ptr)
            .arg(&rows)
            .arg(&t_)
            .arg(&scale)
            .arg(&packed);
        self.run(
            "attention_softmax_backward",
            args,
            per_row_warp(s.b * s.h * t),
        );
        // dQ = dS K: (T, T)(T, D); dK = dSᵀ Q: (T, T)ᵀ(T, D).
        self.attention_products(dq, datt, k, product(false, false, t, t, d), s, square);
        self.attention_products(dk, datt, q, product(true, false, t, t, d), s, square);
        self.attention_heads(dheads, dqkv, s, t, 3, false);
    }
}
