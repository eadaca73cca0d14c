//! The CPU backend: every kernel multi-threaded with rayon (the global pool, sized
//! by `--threads`), matrix products through the `gemm` crate.

pub mod attention;
pub mod cross_entropy;
pub mod embedding;
pub mod linear;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

use super::{AttnShape, Backend, Float, MatMul};

/// The CPU backend (stateless; threads come from the global rayon pool).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl<F: Float> Backend<F> for Cpu {
    fn matmul(&self, out: &mut [F], a: &[F], b: &[F], shape: MatMul) {
        linear::matmul(out, a, b, shape);
    }

    fn copy(&self, dst: &mut [F], src: &[F]) {
        dst.copy_from_slice(src);
    }

    fn embedding_forward(&self, out: &mut [F], ids: &[u32], table: &[F]) {
        embedding::embedding_forward(out, ids, table);
    }

    fn embedding_backward(&self, dtable: &mut [F], dout: &[F], ids: &[u32]) {
        embedding::embedding_backward(dtable, dout, ids);
    }

    fn rmsnorm_forward(&self, out: &mut [F], rstd: &mut [F], x: &[F], g: &[F]) {
        rmsnorm::rmsnorm_forward(out, rstd, x, g);
    }

    fn rmsnorm_backward(
        &self,
        dx: &mut [F],
        dg: &mut [F],
        dout: &[F],
        x: &[F],
        g: &[F],
        rstd: &[F],
        accumulate: bool,
    ) {
        rmsnorm::rmsnorm_backward(dx, dg, dout, x, g, rstd, accumulate);
    }

    fn swiglu_forward(&self, out: &mut [F], a: &[F], b: Option<&[F]>) {
        swiglu::swiglu_forward(out, a, b);
    }

    fn swiglu_backward(
        &self,
        da: &mut [F],
        db: Option<&mut [F]>,
        dout: &[F],
        a: &[F],
        b: Option<&[F]>,
    ) {
        swiglu::swiglu_backward(da, db, dout, a, b);
    }

    fn rope(
        &self,
        qkv: &mut [F],
        cos: &[F],
        sin: &[F],
        shape: AttnShape,
        inverse: bool,
    ) {
        rope::rope(qkv, cos, sin, shape, inverse);
    }

    fn attention_forward(&self, out: &mut [F], att: &mut [F], qkv: &[F], shape: AttnShape) {
        attention::attention_forward(out, att, qkv, shape);
    }

    fn attention_backward(
        &self,
        dqkv: &mut [F],
        datt: &mut [F],
        dout: &[F],
        qkv: &[F],
        att: &[F],
        shape: AttnShape,
    ) {
        attention::attention_backward(dqkv, datt, dout, qkv, att, shape);
    }

    fn cross_entropy(&self, logits: &mut [F], targets: &[u32], grad: bool) -> F {
        cross_entropy::cross_entropy(logits, targets, grad)
    }
}

/// Elements per rayon task in elementwise kernels: big enough to amortize the
/// scheduling, small enough to balance two or more threads.
pub(crate) const CHUNK: usize = 1 << 14;

/// A raw pointer that parallel tasks may share to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<F>(pub *mut F);
// SAFETY: used only where each task writes a disjoint region (argued at each use).
unsafe impl<F> Send for SharedMut<F> {}
unsafe impl<F> Sync for SharedMut<F> {}

impl<F> SharedMut<F> {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    pub fn get(&self) -> *mut F {
        self.0
    }
}
