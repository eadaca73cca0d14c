//! A backend wrapper that times every kernel call by kind: where a step's time goes.

use super::{AttnShape, Backend, Float, MatMul};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The kinds of kernel a step's time is split into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Matmul,
    Attention,
    Norm,
    Swiglu,
    Rope,
    Embedding,
    CrossEntropy,
    Residual,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Matmul,
        Kind::Attention,
        Kind::Norm,
        Kind::Swiglu,
        Kind::Rope,
        Kind::Embedding,
        Kind::CrossEntropy,
        Kind::Residual,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Matmul => "matmul (linear layers, LM head)",
            Kind::Attention => "attention (scores, softmax, P·V)",
            Kind::Norm => "RMSNorm",
            Kind::Swiglu => "SwiGLU / SiLU",
            Kind::Rope => "RoPE",
            Kind::Embedding => "embedding",
            Kind::CrossEntropy => "cross-entropy",
            Kind::Residual => "residual copies",
        }
    }
}

/// Wraps a backend, accumulating wall-clock nanoseconds per [`Kind`] and the FLOPs
/// of the matrix products.
#[derive(Default)]
pub struct Profiled<B> {
    pub inner: B,
    nanos: [AtomicU64; 8],
    matmul_flops: AtomicU64,
}

impl<B> Profiled<B> {
    pub fn new(inner: B) -> Self {
        Profiled {
            inner,
            nanos: Default::default(),
            matmul_flops: AtomicU64::new(0),
        }
    }

    /// Seconds spent in each kind since the last reset.
    pub fn seconds(&self) -> Vec<(Kind, f64)> {
        Kind::ALL
            .iter()
            .map(|&k| {
                (
                    k,
                    self.nanos[k as usize].load(Ordering::Relaxed) as f64 * 1e-9,
                )
            })
            .collect()
    }

    /// FLOPs of the matrix products since the last reset.
    pub fn matmul_flops(&self) -> u64 {
        self.matmul_flops.load(Ordering::Relaxed)
    }

    pub fn reset(&self) {
        self.nanos
            .iter()
            .for_each(|n| n.store(0, Ordering::Relaxed));
        self.matmul_flops.store(0, Ordering::Relaxed);
    }

    fn time<R>(&self, kind: Kind, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        let ns = start.elapsed().as_nanos() as u64;
        self.nanos[kind as usize].fetch_add(ns, Ordering::Relaxed);
        r
    }
}

impl<F: Float, B: Backend<F>> Backend<F> for Profiled<B> {
    fn matmul(&self, out: &mut [F], a: &[F], b: &[F], shape: MatMul) {
        self.matmul_flops
            .fetch_add(shape.flops(), Ordering::Relaxed);
        self.time(Kind::Matmul, || self.inner.matmul(out, a, b, shape))
    }

    fn copy(&self, dst: &mut [F], src: &[F]) {
        self.time(Kind::Residual, || self.inner.copy(dst, src))
    }

    fn embedding_forward(&self, out: &mut [F], ids: &[u32], table: &[F]) {
        self.time(Kind::Embedding, || {
            self.inner.embedding_forward(out, ids, table)
        })
    }

    fn embedding_backward(&self, dtable: &mut [F], dout: &[F], ids: &[u32]) {
        self.time(Kind::Embedding, || {
            self.inner.embedding_backward(dtable, dout, ids)
        })
    }

    fn rmsnorm_forward(&self, out: &mut [F], rstd: &mut [F], x: &[F], g: &[F]) {
        self.time(Kind::Norm, || self.inner.rmsnorm_forward(out, rstd, x, g))
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
        self.time(Kind::Norm, || {
            self.inner
                .rmsnorm_backward(dx, dg, dout, x, g, rstd, accumulate)
        })
    }

    fn swiglu_forward(&self, out: &mut [F], a: &[F], b: Option<&[F]>) {
        self.time(Kind::Swiglu, || self.inner.swiglu_forward(out, a, b))
    }

    fn swiglu_backward(
        &self,
        da: &mut [F],
        db: Option<&mut [F]>,
        dout: &[F],
        a: &[F],
        b: Option<&[F]>,
    ) {
        self.time(Kind::Swiglu, || {
            self.inner.swiglu_backward(da, db, dout, a, b)
        })
    }

    fn rope(&self, qkv: &mut [F], cos: &[F], sin: &[F], shape: AttnShape, inverse: bool) {
        self.time(Kind::Rope, || {
            self.inner.rope(qkv, cos, sin, shape, inverse)
        })
    }

    fn attention_forward(&self, out: &mut [F], att: &mut [F], qkv: &[F], shape: AttnShape) {
        self.time(Kind::Attention, || {
            self.inner.attention_forward(out, att, qkv, shape)
        })
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
        self.time(Kind::Attention, || {
            self.inner
                .attention_backward(dqkv, datt, dout, qkv, att, shape)
        })
    }

    fn cross_entropy(&self, logits: &mut [F], targets: &[u32], grad: bool) -> F {
        self.time(Kind::CrossEntropy, || {
            self.inner.cross_entropy(logits, targets, grad)
        })
    }
}
