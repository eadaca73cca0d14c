//! Launches of `attention.cu` and the batched products between them: causal
//! attention over heads split out of the fused `qkv` rows (see the `.cu` file).

use super::blas::Batch;
use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, expect_u32, int, packing, per_element, per_row_warp};
use crate::kernels::{AttnShape, MatMul};
use cudarc::driver::PushKernelArg;

pub use crate::kernels::workspace::{attention_scores_len, attention_scratch_len};

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
    /// probabilities `att (B, H, Tq, T)`; `scratch` has [`attention_scratch_len`]
    /// `floatX`, `scores` [`attention_scores_len`] f32.
    pub fn attention_forward(
        &self,
        out: Dev,
        att: Dev,
        qkv: Dev,
        s: AttnShape,
        scratch: Dev,
        scores: Dev,
    ) {
        let (t, tq, d) = (s.t, s.tq(), s.d);
        let x = self.float_x();
        expect(out, s.b * tq * s.c(), x, "attention out");
        expect(att, s.b * s.h * tq * t, x, "attention att");
        expect(scratch, attention_scratch_len(s), x, "attention scratch");
        expect(
            scores,
            attention_scores_len(s),
            DType::F32,
            "attention scores",
        );
        let part = s.b * t * s.c();
        let heads = scratch.sub(0, 3 * part);
        let (q, k, v) = (
            heads.sub(0, part),
            heads.sub(part, part),
            heads.sub(2 * part, part),
        );
        let y = scratch.sub(3 * part, s.b * tq * s.c());
        self.attention_heads(heads, qkv, s, t, 3, true);
        // S = Q[q0..] Kᵀ per head: (Tq, D)(D, T), written in f32.
        let product = MatMul {
            m: tq,
            k: d,
            n: t,
            a_transposed: false,
            b_transposed: true,
            accumulate: false,
        };
        let q_new = q.sub(s.q0 * d, part - s.q0 * d);
        self.attention_products(scores, q_new, k, product, s, (t * d, t * d, tq * t));
        let (rows, tq_, t_, q0) = (int(s.b * s.h * tq), int(tq), int(t), int(s.q0));
        let scale = 1.0 / (d as f32).sqrt();
        // Rows in packs: T a multiple of the floatX pack (and so of four f32 scores).
        let (packed, _) = packing(t, self.float_x(), [att]);
        let packed = packed & packing(t, DType::F32, [scores]).0;
        let mut args = self.kernel("attention_softmax_forward");
        args.arg(&att.ptr)
            .arg(&scores.ptr)
            .arg(&rows)
            .arg(&tq_)
            .arg(&t_)
            .arg(&q0)
            .arg(&scale)
            .arg(&packed);
        self.run(
            "attention_softmax_forward",
            args,
            per_row_warp(s.b * s.h * tq),
        );
        // Y = P V per head: (Tq, T)(T, D).
        let values = MatMul {
            m: tq,
            k: t,
            n: d,
            a_transposed: false,
            b_transposed: false,
            accumulate: false,
        };
        self.attention_products(y, att, v, values, s, (tq * t, t * d, tq * d));
        self.attention_heads(y, out, s, tq, 1, false);
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
