//! [`Cpu`]: the [`Backend`] whose buffers are in host memory ([`HostBuf`]), each
//! kernel a call into its family's file (forward and backward side by side).

use super::{
    adamw, attention, cross_entropy, embedding, global_norm, linear, memory, memory::HostBuf,
    rmsnorm, rope, simd::CHUNK, swiglu,
};
use crate::config::RMS_NORM_EPS;
use crate::distributed::World;
use crate::kernels::{
    AdamWStep, Allocator, AttnShape, Backend, BackendKind, BatchPart, BufKind, Collective, Float,
    HostWrite, MatMul, ParamRead, ParamsInFile, Role, Span, SpanMut, StepStats, Stored,
};
use crate::{Error, Result};
use rayon::prelude::*;
use std::time::Instant;

/// The CPU backend (stateless; threads come from the global rayon pool).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl<F: Float> Allocator<F> for Cpu {
    type Buf = HostBuf<F>;
    type Ids = Vec<u32>;
    type Stats = StepStats;

    fn alloc(&self, _role: Role, len: usize, _kind: BufKind) -> Result<HostBuf<F>> {
        Ok(memory::zeroed(len).into())
    }

    fn alloc_ids(&self, _role: Role, len: usize) -> Result<Vec<u32>> {
        Ok(vec![0; len])
    }

    fn alloc_stats(&self, _role: Role) -> Result<StepStats> {
        Ok(StepStats::unset())
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
}

impl<F: Float> Backend<F> for Cpu {
    type Staging = Vec<F>;

    /// The kernels have run: the statistics are ready now.
    fn send_stats(&self, stats: &mut StepStats) {
        stats.ready = Instant::now();
    }

    fn read_stats(&self, stats: &StepStats) -> Result<StepStats> {
        Ok(*stats)
    }

    fn upload(&self, dst: SpanMut<HostBuf<F>>, src: &[F]) -> Result<()> {
        dst.slice().copy_from_slice(src);
        Ok(())
    }

    fn upload_ids(&self, dst: &mut Vec<u32>, src: &[u32]) -> Result<()> {
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: Span<HostBuf<F>>, dst: &mut [F]) -> Result<()> {
        dst.copy_from_slice(src.slice());
        Ok(())
    }

    fn host<'a>(&self, src: Span<'a, HostBuf<F>>) -> Option<&'a [F]> {
        Some(src.slice())
    }

    fn write_host(
        &self,
        dst: SpanMut<HostBuf<F>>,
        _read: ParamRead,
        write: &HostWrite<'_, F>,
    ) -> Option<Result<()>> {
        Some(write(0, dst.slice()))
    }

    /// `f32` values on a little-endian host (a file's bytes as they lie).
    fn map_params(&self, params: &ParamsInFile<'_>) -> Option<HostBuf<F>> {
        let f32s = std::any::TypeId::of::<F>() == std::any::TypeId::of::<f32>();
        if !f32s || params.stored != Stored::F32 || cfg!(target_endian = "big") {
            return None;
        }
        HostBuf::map(params.file, params.offset, params.len)
    }

    fn alloc_staging(&self, len: usize) -> Result<Vec<F>> {
        Ok(vec![F::ZERO; len])
    }

    fn staged<'a>(&self, staging: &'a mut Vec<F>) -> Result<&'a mut [F]> {
        Ok(staging)
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn matmul(
        &self,
        out: SpanMut<HostBuf<F>>,
        a: Span<HostBuf<F>>,
        b: Span<HostBuf<F>>,
        shape: MatMul,
    ) {
        linear::matmul(out.slice(), a.slice(), b.slice(), shape);
    }

    fn copy(&self, dst: SpanMut<HostBuf<F>>, src: Span<HostBuf<F>>) {
        let src = src.slice();
        assert_eq!(dst.len, src.len(), "copy size");
        (dst.slice().par_chunks_mut(CHUNK))
            .zip(src.par_chunks(CHUNK))
            .for_each(|(dst, src)| dst.copy_from_slice(src));
    }

    fn fill_zero(&self, dst: SpanMut<HostBuf<F>>) {
        (dst.slice().par_chunks_mut(CHUNK)).for_each(|dst| dst.fill(F::ZERO));
    }

    fn embedding_forward(&self, out: SpanMut<HostBuf<F>>, ids: &Vec<u32>, table: Span<HostBuf<F>>) {
        embedding::embedding_forward(out.slice(), ids, table.slice());
    }

    fn embedding_backward(
        &self,
        dtable: SpanMut<HostBuf<F>>,
        dout: Span<HostBuf<F>>,
        ids: &Vec<u32>,
    ) {
        embedding::embedding_backward(dtable.slice(), dout.slice(), ids);
    }

    fn rmsnorm_forward(
        &self,
        out: SpanMut<HostBuf<F>>,
        rstd: SpanMut<HostBuf<F>>,
        x: Span<HostBuf<F>>,
        g: Span<HostBuf<F>>,
    ) {
        rmsnorm::rmsnorm_forward(
            out.slice(),
            rstd.slice(),
            x.slice(),
            g.slice(),
            RMS_NORM_EPS,
        );
    }

    fn rmsnorm_backward(
        &self,
        dx: SpanMut<HostBuf<F>>,
        dg: SpanMut<HostBuf<F>>,
        dout: Span<HostBuf<F>>,
        x: Span<HostBuf<F>>,
        g: Span<HostBuf<F>>,
        rstd: Span<HostBuf<F>>,
        accumulate: bool,
    ) {
        rmsnorm::rmsnorm_backward(
            dx.slice(),
            dg.slice(),
            dout.slice(),
            x.slice(),
            g.slice(),
            rstd.slice(),
            accumulate,
        );
    }

    fn swiglu_forward(
        &self,
        out: SpanMut<HostBuf<F>>,
        a: Span<HostBuf<F>>,
        b: Option<Span<HostBuf<F>>>,
    ) {
        swiglu::swiglu_forward(out.slice(), a.slice(), b.map(Span::slice));
    }

    fn swiglu_backward(
        &self,
        da: SpanMut<HostBuf<F>>,
        db: Option<SpanMut<HostBuf<F>>>,
        dout: Span<HostBuf<F>>,
        a: Span<HostBuf<F>>,
        b: Option<Span<HostBuf<F>>>,
    ) {
        swiglu::swiglu_backward(
            da.slice(),
            db.map(SpanMut::slice),
            dout.slice(),
            a.slice(),
            b.map(Span::slice),
        );
    }

    fn rope(
        &self,
        qkv: SpanMut<HostBuf<F>>,
        cos: Span<HostBuf<F>>,
        sin: Span<HostBuf<F>>,
        shape: AttnShape,
        inverse: bool,
    ) {
        rope::rope(qkv.slice(), cos.slice(), sin.slice(), shape, inverse);
    }

    fn attention_forward(
        &self,
        out: SpanMut<HostBuf<F>>,
        att: SpanMut<HostBuf<F>>,
        qkv: Span<HostBuf<F>>,
        shape: AttnShape,
    ) {
        attention::attention_forward(out.slice(), att.slice(), qkv.slice(), shape);
    }

    fn attention_forward_cached(
        &self,
        out: SpanMut<HostBuf<F>>,
        att: SpanMut<HostBuf<F>>,
        caches: &[(Span<HostBuf<F>>, AttnShape)],
    ) {
        let caches: Vec<_> = caches.iter().map(|&(qkv, s)| (qkv.slice(), s)).collect();
        attention::attention_forward_cached(out.slice(), att.slice(), &caches);
    }

    fn attention_backward(
        &self,
        dqkv: SpanMut<HostBuf<F>>,
        datt: SpanMut<HostBuf<F>>,
        dout: Span<HostBuf<F>>,
        _out: Span<HostBuf<F>>,
        qkv: Span<HostBuf<F>>,
        att: Span<HostBuf<F>>,
        shape: AttnShape,
    ) {
        attention::attention_backward(
            dqkv.slice(),
            datt.slice(),
            dout.slice(),
            qkv.slice(),
            att.slice(),
            shape,
        );
    }

    fn cross_entropy(
        &self,
        logits: SpanMut<HostBuf<F>>,
        targets: &Vec<u32>,
        grad: bool,
        part: BatchPart,
        stats: &mut StepStats,
    ) {
        let loss = cross_entropy::cross_entropy(logits.slice(), targets, grad, part.rows).to_f64();
        stats.loss = if part.accumulate {
            stats.loss + loss
        } else {
            loss
        };
    }

    #[cfg(feature = "mpi")]
    fn collective<'w>(
        &self,
        world: &'w World,
    ) -> Result<Box<dyn Collective<HostBuf<F>, StepStats> + 'w>> {
        let mpi = world
            .mpi()
            .ok_or_else(|| Error::Ranks("one rank has no collectives".into()))?;
        Ok(Box::new(super::collective::MpiCollective::<F>::new(mpi)))
    }

    #[cfg(not(feature = "mpi"))]
    fn collective<'w>(
        &self,
        world: &'w World,
    ) -> Result<Box<dyn Collective<HostBuf<F>, StepStats> + 'w>> {
        Err(Error::Ranks(format!(
            "training on {} ranks needs MPI: rebuild tinylm with `--features mpi`",
            world.ranks()
        )))
    }

    fn sum_squares(&self, x: Span<HostBuf<F>>, stats: &mut StepStats) {
        stats.sum_squares = global_norm::sum_squares(x.slice());
    }

    fn adamw(
        &self,
        params: SpanMut<HostBuf<F>>,
        grads: Span<HostBuf<F>>,
        m: SpanMut<HostBuf<F>>,
        v: SpanMut<HostBuf<F>>,
        step: &AdamWStep,
        stats: &StepStats,
    ) {
        adamw::adamw_step(
            params.slice(),
            grads.slice(),
            m.slice(),
            v.slice(),
            step.t,
            step.lr,
            &step.hp,
            step.grad_scale(stats.sum_squares),
        );
    }
}
