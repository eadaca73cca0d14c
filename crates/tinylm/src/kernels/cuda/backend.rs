//! [`Backend`] for [`Cuda`]: the model's buffers live on the device, in the type
//! their [`BufKind`] and the precision say, and every kernel is queued on the
//! backend's stream. Values reach the host only through `download` (which waits)
//! and a step's statistics ([`CudaStats`]: the loss and the gradient's sum of
//! squares), copied asynchronously to pinned host memory, whose read waits for
//! that copy alone. Token ids go in the other way, through pinned memory of their
//! own ([`CudaIds`]).

use super::attention::MAX_HEAD_DIM;
use super::buffer::{
    operand, view, view_mut, CudaBuf, CudaIds, CudaStats, DType, Dev, Pinned, STATS_BYTES,
};
use super::context::{driver_error, Cuda};
use super::rmsnorm;
use crate::config::RMS_NORM_EPS;
use crate::distributed::World;
use crate::kernels::workspace::{Scratch, ScratchType};
use crate::kernels::{
    AdamWStep, Allocation, Allocator, AttnShape, Backend, BackendKind, BatchPart, BufKind,
    Collective, MatMul, Role, Span, SpanMut, StepStats,
};
#[cfg(not(feature = "nccl"))]
use crate::Error;
use crate::Result;
use cudarc::driver::{DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use std::time::Instant;

impl Cuda {
    /// Scratch `slot` for a kernel call over `extent` ([`Scratch::len`]), or `None`
    /// (the error recorded) when it cannot be allocated. A buffer replaced by a
    /// larger one is freed in stream order, after the kernels queued on it.
    fn scratch(&self, slot: Scratch, extent: usize) -> Option<Dev> {
        let len = slot.len(extent);
        let dtype = match slot.holds() {
            ScratchType::F32 => DType::F32,
            ScratchType::F64 => DType::F64,
        };
        let mut scratch = self.scratch.lock().expect("scratch lock");
        if scratch
            .get(&slot)
            .is_none_or(|b| b.len() < len || b.dtype() != dtype)
        {
            scratch.remove(&slot);
            match self.alloc(len, dtype, &format!("kernel work space ({slot:?})")) {
                Ok(buf) => {
                    scratch.insert(slot, buf);
                }
                Err(e) => {
                    self.check::<(), _>("work space", Err(e));
                    return None;
                }
            }
        }
        Some(scratch[&slot].slice(0..len))
    }

    /// The bytes of the kernels' work space as it stands: each [`Scratch`] buffer
    /// allocated so far, and cuBLASLt's workspace.
    pub fn workspace_bytes(&self) -> (Vec<(Scratch, u64)>, u64) {
        let scratch = self.scratch.lock().expect("scratch lock");
        let slots = Scratch::ALL.iter().filter_map(|&slot| {
            let buf = scratch.get(&slot)?;
            Some((slot, buf.bytes()))
        });
        (slots.collect(), self.blas.workspace_bytes())
    }

    /// `len` elements of pinned host memory (at least one: the driver allocates no
    /// empty block), cached (not write-combined: the host reads it too); `what`
    /// names it in an error.
    fn pin<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &str,
    ) -> Result<PinnedHostSlice<T>> {
        // SAFETY: any bit pattern is a valid T (ValidAsZeroBits on plain numbers),
        // and the memory is written before a copy reads it.
        unsafe { self.ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }
            .map_err(|e| driver_error(&format!("allocating pinned host memory for {what}"), e))
    }

    /// [`Cuda::pin`] and the memory's copy event.
    fn alloc_pinned<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &str,
    ) -> Result<Pinned<T>> {
        let memory = self.pin(len, what)?;
        let copied = self
            .ctx
            .new_event(None)
            .map_err(|e| driver_error(&format!("creating the event of {what}"), e))?;
        Ok(Pinned { memory, copied })
    }

    /// Refreshes the bf16 copy of parameters `span` from their f32 values.
    fn refresh_shadow(&self, buf: &CudaBuf, start: usize, len: usize) {
        if let Some(shadow) = &buf.shadow {
            self.to_float_x(
                shadow.slice(start..start + len),
                buf.data.slice(start..start + len),
            );
        }
    }
}

impl Allocator<f32> for Cuda {
    type Buf = CudaBuf;
    type Ids = CudaIds;
    type Stats = CudaStats;

    fn alloc(&self, role: Role, len: usize, kind: BufKind) -> Result<CudaBuf> {
        let storage = self.kind().storage(kind);
        let data = Cuda::alloc(self, len, DType::of(storage.values), role.name)?;
        let shadow = (storage.copy)
            .map(|copy| Cuda::alloc(self, len, DType::of(copy), "parameters (bf16 copy)"))
            .transpose()?;
        Ok(CudaBuf { data, shadow })
    }

    fn alloc_ids(&self, role: Role, len: usize) -> Result<CudaIds> {
        Ok(CudaIds {
            device: Cuda::alloc(self, len, DType::U32, role.name)?,
            staging: self.alloc_pinned(len, role.name)?,
        })
    }

    fn alloc_stats(&self, role: Role) -> Result<CudaStats> {
        Ok(CudaStats {
            device: Cuda::alloc(self, STATS_BYTES / 8, DType::F64, role.name)?,
            host: self.alloc_pinned(STATS_BYTES, role.name)?,
        })
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda(self.precision())
    }
}

impl Backend<f32> for Cuda {
    /// Copied to and from synchronously ([`Backend::upload`] and
    /// [`Backend::download`] wait), so no event guards it.
    type Staging = PinnedHostSlice<f32>;

    fn send_stats(&self, stats: &mut CudaStats) {
        self.bind();
        let device = stats
            .device
            .memory
            .as_ref()
            .expect("statistics are never empty");
        let copied = self.stream().memcpy_dtoh(device, &mut stats.host.memory);
        self.check("copy of the step statistics", copied);
        // `read_stats` waits for this event: the copy and every kernel before it.
        let recorded = stats.host.copied.record(self.stream());
        self.check("recording the statistics' event", recorded);
    }

    fn read_stats(&self, stats: &CudaStats) -> Result<StepStats> {
        let waited = stats.host.copied.synchronize();
        self.take_error()?;
        waited.map_err(|e| self.wait_error("running the training step", e))?;
        // `as_slice` waits for the copy's own event: queued work that failed since
        // (another rank's collective) is explained like the wait above.
        let bytes = stats
            .host
            .memory
            .as_slice()
            .map_err(|e| self.wait_error("reading the step statistics", e))?;
        let ready = Instant::now();
        let loss = f32::from_ne_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let sum_squares = f64::from_ne_bytes(bytes[8..16].try_into().expect("8 bytes"));
        Ok(StepStats {
            loss: loss as f64,
            sum_squares,
            ready,
        })
    }

    fn upload(&self, dst: SpanMut<CudaBuf>, src: &[f32]) -> Result<()> {
        let (start, len) = (dst.start, dst.len);
        let buf = &*dst.buf;
        let target = buf.data.slice(start..start + len);
        if target.dtype == DType::F32 {
            Cuda::upload(self, target, src);
        } else {
            let staging = Cuda::alloc(self, len, DType::F32, "upload staging")?;
            Cuda::upload(self, staging.view(), src);
            self.to_float_x(target, staging.view());
        }
        self.refresh_shadow(buf, start, len);
        self.synchronize()
    }

    /// Stages `src` in `dst`'s pinned memory and queues its copy to the device,
    /// returning without waiting for it: only the next upload into `dst` waits, for
    /// this copy alone, before it overwrites the staging memory.
    fn upload_ids(&self, dst: &mut CudaIds, src: &[u32]) -> Result<()> {
        let target = dst.device.slice(0..src.len());
        if src.is_empty() {
            return self.take_error();
        }
        dst.staging
            .copied
            .synchronize()
            .map_err(|e| self.wait_error("waiting for the previous copy of token ids", e))?;
        let staged = &mut dst
            .staging
            .memory
            .as_mut_slice()
            .map_err(|e| self.wait_error("writing token ids to pinned memory", e))?[..src.len()];
        staged.copy_from_slice(src);
        self.bind();
        // SAFETY: `target` holds `src.len()` u32 of a live buffer; `staged` is pinned
        // and not written again before `copied` has passed this copy (waited for
        // above by the next upload, and by `Pinned`'s drop).
        let copied = unsafe {
            cudarc::driver::result::memcpy_htod_async(target.ptr, staged, self.stream().cu_stream())
        };
        self.check("copy of the token ids", copied);
        let recorded = dst.staging.copied.record(self.stream());
        self.check("recording the token ids' event", recorded);
        self.take_error()
    }

    fn download(&self, src: Span<CudaBuf>, dst: &mut [f32]) -> Result<()> {
        let source = view(src);
        if source.dtype == DType::F32 {
            return Cuda::download(self, source, dst);
        }
        let staging = Cuda::alloc(self, src.len, DType::F32, "download staging")?;
        self.to_f32(staging.view(), source);
        Cuda::download(self, staging.view(), dst)
    }

    fn alloc_staging(&self, len: usize) -> Result<PinnedHostSlice<f32>> {
        self.pin(len, "staging")
    }

    fn staged<'a>(&self, staging: &'a mut PinnedHostSlice<f32>) -> Result<&'a mut [f32]> {
        staging
            .as_mut_slice()
            .map_err(|e| self.wait_error("reading pinned staging memory", e))
    }

    fn sync(&self) -> Result<()> {
        self.synchronize()
    }

    fn matmul(&self, out: SpanMut<CudaBuf>, a: Span<CudaBuf>, b: Span<CudaBuf>, shape: MatMul) {
        Cuda::matmul(self, view_mut(out), operand(a), operand(b), shape);
    }

    fn copy(&self, dst: SpanMut<CudaBuf>, src: Span<CudaBuf>) {
        let (start, len, buf) = (dst.start, dst.len, &*dst.buf);
        let (to, from) = (buf.data.slice(start..start + len), view(src));
        match (to.dtype, from.dtype) {
            (t, f) if t == f => Cuda::copy(self, to, from),
            (DType::F32, _) => self.to_f32(to, from),
            _ => self.to_float_x(to, from),
        }
        self.refresh_shadow(buf, start, len);
    }

    fn fill_zero(&self, dst: SpanMut<CudaBuf>) {
        let (start, len, buf) = (dst.start, dst.len, &*dst.buf);
        self.zero(buf.data.slice(start..start + len));
        if let Some(shadow) = &buf.shadow {
            self.zero(shadow.slice(start..start + len));
        }
    }

    fn embedding_forward(&self, out: SpanMut<CudaBuf>, ids: &CudaIds, table: Span<CudaBuf>) {
        Cuda::embedding_forward(self, view_mut(out), ids.view(), view(table));
    }

    fn embedding_backward(&self, dtable: SpanMut<CudaBuf>, dout: Span<CudaBuf>, ids: &CudaIds) {
        Cuda::embedding_backward(self, view_mut(dtable), view(dout), ids.view());
    }

    fn rmsnorm_forward(
        &self,
        out: SpanMut<CudaBuf>,
        rstd: SpanMut<CudaBuf>,
        x: Span<CudaBuf>,
        g: Span<CudaBuf>,
    ) {
        let (out, rstd) = (view_mut(out), view_mut(rstd));
        Cuda::rmsnorm_forward(self, out, rstd, view(x), view(g), RMS_NORM_EPS as f32);
    }

    fn rmsnorm_backward(
        &self,
        dx: SpanMut<CudaBuf>,
        dg: SpanMut<CudaBuf>,
        dout: Span<CudaBuf>,
        x: Span<CudaBuf>,
        g: Span<CudaBuf>,
        rstd: Span<CudaBuf>,
        accumulate: bool,
    ) {
        let Some(scratch) = self.scratch(Scratch::NormGain, g.len) else {
            return;
        };
        let (dx, dg) = (view_mut(dx), view_mut(dg));
        let (dout, x, g, rstd) = (view(dout), view(x), view(g), view(rstd));
        Cuda::rmsnorm_backward(self, dx, dg, dout, x, g, rstd, accumulate, scratch);
    }

    fn swiglu_forward(&self, out: SpanMut<CudaBuf>, a: Span<CudaBuf>, b: Option<Span<CudaBuf>>) {
        Cuda::swiglu_forward(self, view_mut(out), view(a), b.map(view));
    }

    fn swiglu_backward(
        &self,
        da: SpanMut<CudaBuf>,
        db: Option<SpanMut<CudaBuf>>,
        dout: Span<CudaBuf>,
        a: Span<CudaBuf>,
        b: Option<Span<CudaBuf>>,
    ) {
        let (da, db) = (view_mut(da), db.map(view_mut));
        Cuda::swiglu_backward(self, da, db, view(dout), view(a), b.map(view));
    }

    fn rope(
        &self,
        qkv: SpanMut<CudaBuf>,
        cos: Span<CudaBuf>,
        sin: Span<CudaBuf>,
        shape: AttnShape,
        inverse: bool,
    ) {
        Cuda::rope(self, view_mut(qkv), view(cos), view(sin), shape, inverse);
    }

    fn check_model(&self, config: &crate::ModelConfig) -> Result<()> {
        match config.head_dim() {
            d if d > MAX_HEAD_DIM => Err(crate::Error::Config(format!(
                "the GPU's attention handles head dimensions up to {MAX_HEAD_DIM}, and \
                 d_model / num_heads is {d}: use more heads, or --device cpu"
            ))),
            _ if config.d_model > rmsnorm::MAX_WIDTH => Err(crate::Error::Config(format!(
                "the GPU's RMSNorm handles d_model up to {}, and it is {}: use --device cpu",
                rmsnorm::MAX_WIDTH,
                config.d_model
            ))),
            _ => Ok(()),
        }
    }

    fn attention_forward(
        &self,
        out: SpanMut<CudaBuf>,
        att: SpanMut<CudaBuf>,
        qkv: Span<CudaBuf>,
        shape: AttnShape,
    ) {
        let (out, att) = (view_mut(out), view_mut(att));
        Cuda::attention_forward(self, out, att, view(qkv), shape);
    }

    fn attention_backward(
        &self,
        dqkv: SpanMut<CudaBuf>,
        datt: SpanMut<CudaBuf>,
        dout: Span<CudaBuf>,
        out: Span<CudaBuf>,
        qkv: Span<CudaBuf>,
        att: Span<CudaBuf>,
        shape: AttnShape,
    ) {
        let (dqkv, datt) = (view_mut(dqkv), view_mut(datt));
        let (dout, out, qkv, att) = (view(dout), view(out), view(qkv), view(att));
        Cuda::attention_backward(self, dqkv, datt, dout, out, qkv, att, shape);
    }

    fn cross_entropy(
        &self,
        logits: SpanMut<CudaBuf>,
        targets: &CudaIds,
        grad: bool,
        part: BatchPart,
        stats: &mut CudaStats,
    ) {
        let targets = targets.view();
        let Some(losses) = self.scratch(Scratch::Losses, targets.len) else {
            return;
        };
        let logits = view_mut(logits);
        Cuda::cross_entropy(self, stats.loss(), losses, logits, targets, grad, part);
    }

    #[cfg(feature = "nccl")]
    fn collective<'w>(
        &self,
        world: &'w World,
    ) -> Result<Box<dyn Collective<CudaBuf, CudaStats> + 'w>> {
        Ok(Box::new(super::collective::Nccl::new(self, world)?))
    }

    #[cfg(not(feature = "nccl"))]
    fn collective<'w>(
        &self,
        world: &'w World,
    ) -> Result<Box<dyn Collective<CudaBuf, CudaStats> + 'w>> {
        Err(Error::Ranks(format!(
            "training on {} ranks on GPUs needs NCCL: rebuild tinylm with `--features nccl`",
            world.ranks()
        )))
    }

    fn sum_squares(&self, x: Span<CudaBuf>, stats: &mut CudaStats) {
        let Some(partial) = self.scratch(Scratch::Squares, 0) else {
            return;
        };
        Cuda::sum_squares(self, stats.sum_squares(), view(x), partial);
    }

    fn adamw(
        &self,
        params: SpanMut<CudaBuf>,
        grads: Span<CudaBuf>,
        m: SpanMut<CudaBuf>,
        v: SpanMut<CudaBuf>,
        step: &AdamWStep,
        stats: &CudaStats,
    ) {
        let (start, len, buf) = (params.start, params.len, &*params.buf);
        let shadow = buf.shadow.as_ref().map(|s| s.slice(start..start + len));
        let p = buf.data.slice(start..start + len);
        let (g, m, v) = (view(grads), view_mut(m), view_mut(v));
        Cuda::adamw(
            self,
            p,
            shadow,
            g,
            m,
            v,
            step.t,
            step.lr,
            &step.hp,
            step.max_norm.map(|max| (stats.sum_squares(), max)),
        );
    }
}
