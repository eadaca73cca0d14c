//! A backend wrapper that times every kernel call by kind: where a step's time goes.

use super::{
    AdamWStep, Allocator, AttnShape, Backend, BackendKind, BatchPart, BufKind, Collective, Float,
    HostWrite, MatMul, ParamRead, ParamsInFile, Role, Span, SpanMut, StepStats,
};
use crate::distributed::World;
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
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
    Optimizer,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Matmul,
        Kind::Attention,
        Kind::Norm,
        Kind::Swiglu,
        Kind::Rope,
        Kind::Embedding,
        Kind::CrossEntropy,
        Kind::Residual,
        Kind::Optimizer,
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
            Kind::Optimizer => "AdamW, gradient norm, zeroing",
        }
    }
}

/// Wraps a backend, accumulating wall-clock nanoseconds per [`Kind`] and the FLOPs
/// of the matrix products.
///
/// A GPU runs kernels after their launch returns, so each timed call waits for the
/// device before and after ([`Backend::sync`]; nothing on the CPU): a kernel's time is
/// its launch, its run and one wait. The waits make a profiled step slower than a
/// step, by a few microseconds per kernel; the split between kinds is what it shows.
#[derive(Default)]
pub struct Profiled<B> {
    pub inner: B,
    nanos: [AtomicU64; 9],
    matmul_flops: AtomicU64,
    /// The first failure a wait inside a timed call saw, for the next [`Backend::sync`].
    failure: Mutex<Option<Error>>,
}

impl<B> Profiled<B> {
    pub fn new(inner: B) -> Self {
        Profiled {
            inner,
            nanos: Default::default(),
            matmul_flops: AtomicU64::new(0),
            failure: Mutex::new(None),
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

    /// `f`, its time (with the device's work) added to `kind`'s.
    fn time<F: Float, R>(&self, kind: Kind, f: impl FnOnce() -> R) -> R
    where
        B: Backend<F>,
    {
        self.wait::<F>();
        let start = Instant::now();
        let r = f();
        self.wait::<F>();
        let ns = start.elapsed().as_nanos() as u64;
        self.nanos[kind as usize].fetch_add(ns, Ordering::Relaxed);
        r
    }

    /// Waits for the device, keeping its first failure for [`Backend::sync`].
    fn wait<F: Float>(&self)
    where
        B: Backend<F>,
    {
        if let Err(e) = self.inner.sync() {
            let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
            failure.get_or_insert(e);
        }
    }
}

impl<F: Float, B: Backend<F>> Allocator<F> for Profiled<B> {
    type Buf = B::Buf;
    type Ids = B::Ids;
    type Stats = B::Stats;

    fn alloc(&self, role: Role, len: usize, kind: BufKind) -> Result<B::Buf> {
        self.inner.alloc(role, len, kind)
    }

    fn alloc_ids(&self, role: Role, len: usize) -> Result<B::Ids> {
        self.inner.alloc_ids(role, len)
    }

    fn alloc_stats(&self, role: Role) -> Result<B::Stats> {
        self.inner.alloc_stats(role)
    }

    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
}

impl<F: Float, B: Backend<F>> Backend<F> for Profiled<B> {
    type Staging = B::Staging;

    fn send_stats(&self, stats: &mut B::Stats) {
        self.inner.send_stats(stats)
    }

    fn read_stats(&self, stats: &B::Stats) -> Result<StepStats> {
        self.inner.read_stats(stats)
    }

    fn upload(&self, dst: SpanMut<B::Buf>, src: &[F]) -> Result<()> {
        self.inner.upload(dst, src)
    }

    fn upload_ids(&self, dst: &mut B::Ids, src: &[u32]) -> Result<()> {
        self.inner.upload_ids(dst, src)
    }

    fn download(&self, src: Span<B::Buf>, dst: &mut [F]) -> Result<()> {
        self.inner.download(src, dst)
    }

    fn host<'a>(&self, src: Span<'a, B::Buf>) -> Option<&'a [F]> {
        self.inner.host(src)
    }

    fn write_host(
        &self,
        dst: SpanMut<B::Buf>,
        read: ParamRead,
        write: &HostWrite<'_, F>,
    ) -> Option<Result<()>> {
        self.inner.write_host(dst, read, write)
    }

    fn map_params(&self, params: &ParamsInFile<'_>) -> Option<B::Buf> {
        self.inner.map_params(params)
    }

    fn alloc_staging(&self, len: usize) -> Result<B::Staging> {
        self.inner.alloc_staging(len)
    }

    fn staged<'a>(&self, staging: &'a mut B::Staging) -> Result<&'a mut [F]> {
        self.inner.staged(staging)
    }

    fn check_model(&self, config: &crate::ModelConfig) -> Result<()> {
        self.inner.check_model(config)
    }

    fn sync(&self) -> Result<()> {
        let failure = self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        failure.map_or_else(|| self.inner.sync(), Err)
    }

    fn matmul(&self, out: SpanMut<B::Buf>, a: Span<B::Buf>, b: Span<B::Buf>, shape: MatMul) {
        self.matmul_flops
            .fetch_add(shape.flops(), Ordering::Relaxed);
        self.time::<F, _>(Kind::Matmul, || self.inner.matmul(out, a, b, shape))
    }

    fn copy(&self, dst: SpanMut<B::Buf>, src: Span<B::Buf>) {
        self.time::<F, _>(Kind::Residual, || self.inner.copy(dst, src))
    }

    fn fill_zero(&self, dst: SpanMut<B::Buf>) {
        self.time::<F, _>(Kind::Optimizer, || self.inner.fill_zero(dst))
    }

    fn embedding_forward(&self, out: SpanMut<B::Buf>, ids: &B::Ids, table: Span<B::Buf>) {
        self.time::<F, _>(Kind::Embedding, || {
            self.inner.embedding_forward(out, ids, table)
        })
    }

    fn embedding_backward(&self, dtable: SpanMut<B::Buf>, dout: Span<B::Buf>, ids: &B::Ids) {
        self.time::<F, _>(Kind::Embedding, || {
            self.inner.embedding_backward(dtable, dout, ids)
        })
    }

    fn rmsnorm_forward(
        &self,
        out: SpanMut<B::Buf>,
        rstd: SpanMut<B::Buf>,
        x: Span<B::Buf>,
        g: Span<B::Buf>,
    ) {
        self.time::<F, _>(Kind::Norm, || self.inner.rmsnorm_forward(out, rstd, x, g))
    }

    fn rmsnorm_backward(
        &self,
        dx: SpanMut<B::Buf>,
        dg: SpanMut<B::Buf>,
        dout: Span<B::Buf>,
        x: Span<B::Buf>,
        g: Span<B::Buf>,
        rstd: Span<B::Buf>,
        accumulate: bool,
    ) {
        self.time::<F, _>(Kind::Norm, || {
            self.inner
                .rmsnorm_backward(dx, dg, dout, x, g, rstd, accumulate)
        })
    }

    fn swiglu_forward(&self, out: SpanMut<B::Buf>, a: Span<B::Buf>, b: Option<Span<B::Buf>>) {
        self.time::<F, _>(Kind::Swiglu, || self.inner.swiglu_forward(out, a, b))
    }

    fn swiglu_backward(
        &self,
        da: SpanMut<B::Buf>,
        db: Option<SpanMut<B::Buf>>,
        dout: Span<B::Buf>,
        a: Span<B::Buf>,
        b: Option<Span<B::Buf>>,
    ) {
        self.time::<F, _>(Kind::Swiglu, || {
            self.inner.swiglu_backward(da, db, dout, a, b)
        })
    }

    fn rope(
        &self,
        qkv: SpanMut<B::Buf>,
        cos: Span<B::Buf>,
        sin: Span<B::Buf>,
        shape: AttnShape,
        inverse: bool,
    ) {
        self.time::<F, _>(Kind::Rope, || {
            self.inner.rope(qkv, cos, sin, shape, inverse)
        })
    }

    fn attention_forward(
        &self,
        out: SpanMut<B::Buf>,
        att: SpanMut<B::Buf>,
        qkv: Span<B::Buf>,
        shape: AttnShape,
    ) {
        self.time::<F, _>(Kind::Attention, || {
            self.inner.attention_forward(out, att, qkv, shape)
        })
    }

    fn attention_forward_cached(
        &self,
        out: SpanMut<B::Buf>,
        att: SpanMut<B::Buf>,
        caches: &[(Span<B::Buf>, AttnShape)],
    ) {
        self.time::<F, _>(Kind::Attention, || {
            self.inner.attention_forward_cached(out, att, caches)
        })
    }

    fn attention_backward(
        &self,
        dqkv: SpanMut<B::Buf>,
        datt: SpanMut<B::Buf>,
        dout: Span<B::Buf>,
        out: Span<B::Buf>,
        qkv: Span<B::Buf>,
        att: Span<B::Buf>,
        shape: AttnShape,
    ) {
        self.time::<F, _>(Kind::Attention, || {
            self.inner
                .attention_backward(dqkv, datt, dout, out, qkv, att, shape)
        })
    }

    fn cross_entropy(
        &self,
        logits: SpanMut<B::Buf>,
        targets: &B::Ids,
        grad: bool,
        part: BatchPart,
        stats: &mut B::Stats,
    ) {
        self.time::<F, _>(Kind::CrossEntropy, || {
            self.inner.cross_entropy(logits, targets, grad, part, stats)
        })
    }

    fn collective<'w>(
        &self,
        world: &'w World,
    ) -> Result<Box<dyn Collective<B::Buf, B::Stats> + 'w>> {
        self.inner.collective(world)
    }

    fn sum_squares(&self, x: Span<B::Buf>, stats: &mut B::Stats) {
        self.time::<F, _>(Kind::Optimizer, || self.inner.sum_squares(x, stats))
    }

    fn adamw(
        &self,
        params: SpanMut<B::Buf>,
        grads: Span<B::Buf>,
        m: SpanMut<B::Buf>,
        v: SpanMut<B::Buf>,
        step: &AdamWStep,
        stats: &B::Stats,
    ) {
        self.time::<F, _>(Kind::Optimizer, || {
            self.inner.adamw(params, grads, m, v, step, stats)
        })
    }
}
