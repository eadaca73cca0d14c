//! [`CpuMixed`]: the CPU backend under bf16 mixed precision — PyTorch's CPU autocast
//! done by hand — and, for generation, with the weights in Q8_0 blocks. Every
//! matrix product multiplies bf16 operands (rounded to nearest, ties to even) and
//! sums in `f32` on the CPU's bf16 kernel
//! ([`Bf16Kernel::best`]); the weights' operand is a bf16 copy of the parameters
//! made once per update (by AdamW in the same pass, by an upload or a gather), and
//! the activations that backward reads only as product operands
//! ([`BufKind::Operands`]) and a KV cache ([`BufKind::Cache`]) are stored in bf16.
//! Everything else — master weights, gradients, AdamW moments, the residual
//! stream, RMSNorm statistics, attention's softmax, the logits and the loss — stays
//! `f32`, computed by the very kernels of [`Cpu`], to which the `f32` work is
//! handed.
//!
//! The design mirrors the CUDA backend's under bf16: the buffer's kind picks its
//! type, parameters carry their bf16 copy ([`MixedBuf`]), and the one model
//! orchestration runs on either.

use super::attention::{
    attention_backward_on, attention_forward_cached_on, attention_forward_on, HeadProduct,
};
use super::bf16::{matmul_bf16_on, matmul_bf16_view, Bf16Kernel, Bf16Operand, Operand as Bf16View};
use super::linear::View;
use super::memory::{with_scratch, zeroed, HostBuf, WRITE_CHUNK};
use super::{adamw, embedding, q8, rmsnorm, swiglu, Cpu};
use crate::config::RMS_NORM_EPS;
use crate::distributed::World;
use crate::kernels::float::Element;
use crate::kernels::{
    AdamWStep, Allocator, AttnShape, Backend, BackendKind, BatchPart, BufKind, Buffer, Collective,
    HostWrite, MatMul, ParamRead, ParamsInFile, Role, Span, SpanMut, StepStats, Stored, ValueType,
};
use crate::Result;
use half::bf16;
use rayon::prelude::*;

mod buf;

pub(crate) use buf::store;
use buf::{f32s, f32s_mut, load, operand, out, values_ref, Operand, Out, ParamCopy, ValuesRef};
pub use buf::{MixedBuf, Values};

/// The CPU backend under bf16 mixed precision, on one bf16 kernel — or, to
/// generate with 8-bit weights, with the weights' copy in Q8_0 blocks.
#[derive(Clone, Copy, Debug)]
pub struct CpuMixed {
    kernel: Bf16Kernel,
    weights: WeightCopy,
    /// Whether the linear layers' weights are kept in their copy alone
    /// ([`CpuMixed::forward_only`]).
    forward_only: bool,
}

/// What the parameters' copy that the products read holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WeightCopy {
    /// bf16 values.
    Bf16,
    /// Q8_0 blocks ([`q8`]): for generation only, whose products are all
    /// `x · Wᵀ` of `f32` activations (every activation stays `f32`).
    Q8,
}

impl CpuMixed {
    /// On the CPU's native bf16 kernel where it has one, else the portable one
    /// (the same values and sums, slower than `f32`).
    pub fn new() -> Self {
        CpuMixed::on(Bf16Kernel::best())
    }

    /// On `kernel` (which must run on this CPU).
    pub fn on(kernel: Bf16Kernel) -> Self {
        assert!(kernel.runs_here(), "this CPU cannot run {}", kernel.name());
        CpuMixed {
            kernel,
            weights: WeightCopy::Bf16,
            forward_only: false,
        }
    }

    /// For generation with the weights in Q8_0 blocks (`--precision q8_0`):
    /// the linear layers' products on int8 ([`q8::matmul_q8`]), attention's on
    /// the bf16 kernel, the rest in `f32`. A model on it runs forward only
    /// ([`CpuMixed::forward_only`]).
    pub fn q8() -> Self {
        CpuMixed {
            weights: WeightCopy::Q8,
            ..CpuMixed::new().forward_only()
        }
    }

    /// For a model that only runs forward (generation, evaluation): the linear
    /// layers' weights, which a forward pass reads only as the products' operand,
    /// are kept in their copy alone — a checkpoint's are read straight into it,
    /// part by part, and their `f32` values are never written, so their memory is
    /// never touched (a third of a bf16 model's, a fifth of a Q8_0 model's). The
    /// embeddings and the gains keep their `f32` values, and every output is the
    /// same as with them. Reading those weights back ([`Backend::download`]) is
    /// an error.
    pub fn forward_only(self) -> Self {
        CpuMixed {
            forward_only: true,
            ..self
        }
    }

    /// The kernel its products run on.
    pub fn kernel(&self) -> Bf16Kernel {
        self.kernel
    }

    /// `out = a · b` on this backend's bf16 kernel, a forward-only model's prompts
    /// as dot products ([`matmul_bf16_on`] with `forward_only`).
    fn bf16_product<A: Bf16Operand, B: Bf16Operand>(
        &self,
        out: &mut [f32],
        a: &[A],
        b: &[B],
        shape: MatMul,
    ) {
        matmul_bf16_on(self.kernel, self.forward_only, out, a, b, shape)
    }

    /// A copy of `len` parameters as this backend multiplies them (zeros).
    /// The copy of `len` parameters that its products read.
    fn param_copy(&self, len: usize) -> ParamCopy {
        ParamCopy::new(self.kind().storage(BufKind::Params).copy, len)
    }

    /// Whether parameters read so need their copy: those that a product reads,
    /// and on a backend that trains all (AdamW keeps every one up to date).
    fn needs_copy(&self, read: ParamRead) -> bool {
        !self.forward_only || read != ParamRead::Values
    }

    /// Whether `buf` is parameters whose weights this backend keeps in their copy
    /// alone ([`CpuMixed::forward_only`]).
    fn keeps_copy_alone(&self, buf: &MixedBuf) -> bool {
        self.forward_only && !matches!(buf.copy, ParamCopy::None)
    }
}

/// A view as the bf16 kernel takes it.
fn bf16_view<E>(v: View<E>) -> Bf16View<E> {
    Bf16View {
        ptr: v.ptr,
        rs: v.rs as usize,
        cs: v.cs as usize,
    }
}

/// Attention's per-head products on the bf16 kernel: both operands rounded to
/// bf16 as they are packed (a KV cache in bf16 is read as it is: the same
/// values), sums and the output in `f32` (the probabilities and scores themselves
/// stay `f32`; only their product operands are rounded).
impl<E: Bf16Operand> HeadProduct<f32, E> for CpuMixed {
    unsafe fn product(
        &self,
        shape: (usize, usize, usize),
        dst: *mut f32,
        dst_rs: usize,
        a: View<E>,
        b: View<E>,
        scale: f32,
        accumulate: bool,
    ) {
        matmul_bf16_view(
            self.kernel,
            shape,
            dst,
            dst_rs,
            bf16_view(a),
            bf16_view(b),
            accumulate,
        );
        if scale != 1.0 {
            assert!(!accumulate, "a scaled product is written, not accumulated");
            let (m, _, n) = shape;
            for i in 0..m {
                for x in std::slice::from_raw_parts_mut(dst.add(i * dst_rs), n) {
                    *x *= scale;
                }
            }
        }
    }

    unsafe fn mix(
        &self,
        shape: (usize, usize, usize),
        dst: *mut f32,
        dst_rs: usize,
        p: View<f32>,
        v: View<E>,
    ) {
        let (p, v) = (bf16_view(p), bf16_view(v));
        matmul_bf16_view(self.kernel, shape, dst, dst_rs, p, v, false);
    }

    /// Packing rounds `Kᵀ` and `Vᵀ` from their rows of `qkv` as fast as from a
    /// transposed copy.
    fn reads_strided(&self) -> bool {
        true
    }

    /// Each product packs both operands: blocks of 64 queries pack `K` and `V`
    /// half as often as blocks of 32 (at `T = 128`: attention 0.6 ms per step
    /// faster on Zen 5) for a little more of `P`'s zero triangle multiplied.
    fn query_block(&self) -> usize {
        64
    }
}

impl Default for CpuMixed {
    fn default() -> Self {
        CpuMixed::new()
    }
}

impl Allocator<f32> for CpuMixed {
    type Buf = MixedBuf;
    type Ids = Vec<u32>;
    type Stats = StepStats;

    fn alloc(&self, _role: Role, len: usize, kind: BufKind) -> Result<MixedBuf> {
        let storage = self.kind().storage(kind);
        let values = match storage.values {
            ValueType::Bf16 => Values::Bf16(zeroed(len).into()),
            _ => Values::F32(zeroed(len).into()),
        };
        let copy = ParamCopy::new(storage.copy, len);
        Ok(MixedBuf { values, copy })
    }

    fn alloc_ids(&self, role: Role, len: usize) -> Result<Vec<u32>> {
        Allocator::<f32>::alloc_ids(&Cpu, role, len)
    }

    fn alloc_stats(&self, role: Role) -> Result<StepStats> {
        Allocator::<f32>::alloc_stats(&Cpu, role)
    }

    fn kind(&self) -> BackendKind {
        match self.weights {
            WeightCopy::Bf16 => BackendKind::CpuBf16,
            WeightCopy::Q8 => BackendKind::CpuQ8,
        }
    }
}

impl Backend<f32> for CpuMixed {
    type Staging = Vec<f32>;

    fn send_stats(&self, stats: &mut StepStats) {
        Backend::<f32>::send_stats(&Cpu, stats)
    }

    fn read_stats(&self, stats: &StepStats) -> Result<StepStats> {
        Backend::<f32>::read_stats(&Cpu, stats)
    }

    /// Parameters' copy refreshed; a bf16 buffer's values rounded.
    fn upload(&self, dst: SpanMut<MixedBuf>, src: &[f32]) -> Result<()> {
        let (start, len) = (dst.start, dst.len);
        let buf = &mut *dst.buf;
        match out(buf.at_mut(start..start + len)) {
            Out::F32(values) => store(values, src),
            Out::Bf16(values) => store(values, src),
        }
        buf.refresh_copy(start, len);
        Ok(())
    }

    fn upload_ids(&self, dst: &mut Vec<u32>, src: &[u32]) -> Result<()> {
        Backend::<f32>::upload_ids(&Cpu, dst, src)
    }

    fn download(&self, src: Span<MixedBuf>, dst: &mut [f32]) -> Result<()> {
        if self.keeps_copy_alone(src.buf) {
            return Err(crate::Error::Invalid(
                "a forward-only model keeps its weights in their bf16 or q8_0 copy alone: \
                 its parameters are not read back"
                    .into(),
            ));
        }
        let range = src.start..src.start + src.len;
        match &src.buf.values {
            Values::F32(values) => load(dst, &values[range]),
            Values::Bf16(values) => load(dst, &values[range]),
        }
        Ok(())
    }

    /// The `f32` values where they are (not a bf16 buffer's).
    fn host<'a>(&self, src: Span<'a, MixedBuf>) -> Option<&'a [f32]> {
        match &src.buf.values {
            Values::F32(_) if !self.keeps_copy_alone(src.buf) => Some(f32s(src).slice()),
            _ => None,
        }
    }

    /// `f32` values written in place, then their copy where they have one (the
    /// parameters': a checkpoint is read straight into them) and a product reads
    /// it — or, for a weight on a forward-only backend, the copy alone, from each
    /// part's values in a thread's scratch.
    fn write_host(
        &self,
        dst: SpanMut<MixedBuf>,
        read: ParamRead,
        write: &HostWrite<'_, f32>,
    ) -> Option<Result<()>> {
        let range = dst.start..dst.start + dst.len;
        if read == ParamRead::Operand && self.keeps_copy_alone(dst.buf) {
            return Some(match &mut dst.buf.copy {
                ParamCopy::Bf16(copy) => copy[range]
                    .par_chunks_mut(WRITE_CHUNK)
                    .enumerate()
                    .try_for_each(|(i, copy)| {
                        with_scratch(copy.len(), |values: &mut [f32]| {
                            write(i * WRITE_CHUNK, values)?;
                            bf16::store_slice(copy, values);
                            Ok(())
                        })
                    }),
                ParamCopy::Q8(copy) => copy.write(range, write),
                ParamCopy::None => unreachable!("kept alone: a copy"),
            });
        }
        let Values::F32(values) = &mut dst.buf.values else {
            return None;
        };
        Some(write(0, &mut values[range]).map(|()| {
            if self.needs_copy(read) {
                dst.buf.refresh_copy(dst.start, dst.len)
            }
        }))
    }

    /// An `f32` file's values mapped, their copy made from them: only the copy is
    /// fresh memory (the embedding's and the gains' values stay the file's pages).
    /// A bf16 file's, on a forward-only backend that multiplies bf16, mapped as the
    /// values themselves, with no copy: the products, the embedding and RMSNorm
    /// read them as they lie, and loading takes no fresh memory at all (after an
    /// idle pause, a virtual machine's host can take half a second to back 256 MiB
    /// of fresh huge pages). Q8_0 blocks are made from values read in.
    fn map_params(&self, params: &ParamsInFile<'_>) -> Option<MixedBuf> {
        if cfg!(target_endian = "big") {
            return None;
        }
        match (params.stored, self.weights) {
            (Stored::F32, _) => {
                let mut buf = MixedBuf {
                    values: Values::F32(HostBuf::map(params.file, params.offset, params.len)?),
                    copy: self.param_copy(params.len),
                };
                for (range, _) in params
                    .reads
                    .iter()
                    .filter(|(_, read)| self.needs_copy(*read))
                {
                    buf.refresh_copy(range.start, range.len());
                }
                Some(buf)
            }
            (Stored::Bf16, WeightCopy::Bf16) if self.forward_only => Some(MixedBuf {
                values: Values::Bf16(HostBuf::map(params.file, params.offset, params.len)?),
                copy: ParamCopy::None,
            }),
            (Stored::Bf16, _) => None,
        }
    }

    fn alloc_staging(&self, len: usize) -> Result<Vec<f32>> {
        Backend::<f32>::alloc_staging(&Cpu, len)
    }

    fn staged<'a>(&self, staging: &'a mut Vec<f32>) -> Result<&'a mut [f32]> {
        Ok(staging)
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// Q8_0 weights: every linear layer's input splits into whole blocks.
    fn check_model(&self, config: &crate::ModelConfig) -> Result<()> {
        let dims = [("d_model", config.d_model), ("d_ff", config.d_ff)];
        match dims.into_iter().find(|(_, d)| !d.is_multiple_of(q8::BLOCK)) {
            Some((name, d)) if self.weights == WeightCopy::Q8 => {
                Err(crate::Error::Config(format!(
                    "q8_0 weights need {name} to be a multiple of {} (it is {d}): use bf16",
                    q8::BLOCK
                )))
            }
            _ => Ok(()),
        }
    }

    /// bf16 operands (the parameters' copy, bf16 activations as they are, `f32`
    /// activations rounded as they are packed), `f32` sums into `f32` `out`.
    fn matmul(&self, out: SpanMut<MixedBuf>, a: Span<MixedBuf>, b: Span<MixedBuf>, shape: MatMul) {
        let out = f32s_mut(out).slice();
        match (operand(a), operand(b)) {
            (Operand::F32(a), Operand::F32(b)) => self.bf16_product(out, a, b, shape),
            (Operand::F32(a), Operand::Bf16(b)) => self.bf16_product(out, a, b, shape),
            (Operand::Bf16(a), Operand::F32(b)) => self.bf16_product(out, a, b, shape),
            (Operand::Bf16(a), Operand::Bf16(b)) => self.bf16_product(out, a, b, shape),
            (Operand::F32(a), Operand::Q8(w, start)) => q8::matmul_q8(out, a, w, start, shape),
            _ => panic!("q8_0 weights multiply f32 activations, as the weights' right operand"),
        }
    }

    /// Into a bf16 buffer (a KV cache's rows), rounded.
    fn copy(&self, dst: SpanMut<MixedBuf>, src: Span<MixedBuf>) {
        let src = f32s(src).slice();
        match out(dst) {
            Out::F32(values) => store(values, src),
            Out::Bf16(values) => store(values, src),
        }
    }

    fn fill_zero(&self, dst: SpanMut<MixedBuf>) {
        match out(dst) {
            Out::F32(values) => values.par_iter_mut().for_each(|x| *x = 0.0),
            Out::Bf16(values) => values.par_iter_mut().for_each(|x| *x = bf16::ZERO),
        }
    }

    fn embedding_forward(&self, out: SpanMut<MixedBuf>, ids: &Vec<u32>, table: Span<MixedBuf>) {
        let out = f32s_mut(out).slice();
        match values_ref(table) {
            ValuesRef::F32(table) => embedding::embedding_forward(out, ids, table),
            ValuesRef::Bf16(table) => embedding::embedding_forward(out, ids, table),
        }
    }

    fn embedding_backward(&self, dtable: SpanMut<MixedBuf>, dout: Span<MixedBuf>, ids: &Vec<u32>) {
        Cpu.embedding_backward(f32s_mut(dtable), f32s(dout), ids);
    }

    fn rmsnorm_forward(
        &self,
        out_span: SpanMut<MixedBuf>,
        rstd: SpanMut<MixedBuf>,
        x: Span<MixedBuf>,
        g: Span<MixedBuf>,
    ) {
        let (rstd, x) = (f32s_mut(rstd).slice(), f32s(x).slice());
        match (out(out_span), values_ref(g)) {
            (Out::F32(o), ValuesRef::F32(g)) => {
                rmsnorm::rmsnorm_forward(o, rstd, x, g, RMS_NORM_EPS)
            }
            (Out::Bf16(o), ValuesRef::F32(g)) => {
                rmsnorm::rmsnorm_forward(o, rstd, x, g, RMS_NORM_EPS)
            }
            (Out::F32(o), ValuesRef::Bf16(g)) => {
                rmsnorm::rmsnorm_forward(o, rstd, x, g, RMS_NORM_EPS)
            }
            (Out::Bf16(o), ValuesRef::Bf16(g)) => {
                rmsnorm::rmsnorm_forward(o, rstd, x, g, RMS_NORM_EPS)
            }
        }
    }

    fn rmsnorm_backward(
        &self,
        dx: SpanMut<MixedBuf>,
        dg: SpanMut<MixedBuf>,
        dout: Span<MixedBuf>,
        x: Span<MixedBuf>,
        g: Span<MixedBuf>,
        rstd: Span<MixedBuf>,
        accumulate: bool,
    ) {
        Cpu.rmsnorm_backward(
            f32s_mut(dx),
            f32s_mut(dg),
            f32s(dout),
            f32s(x),
            f32s(g),
            f32s(rstd),
            accumulate,
        );
    }

    fn swiglu_forward(
        &self,
        out_span: SpanMut<MixedBuf>,
        a: Span<MixedBuf>,
        b: Option<Span<MixedBuf>>,
    ) {
        let (a, b) = (f32s(a).slice(), b.map(|b| f32s(b).slice()));
        match out(out_span) {
            Out::F32(o) => swiglu::swiglu_forward(o, a, b),
            Out::Bf16(o) => swiglu::swiglu_forward(o, a, b),
        }
    }

    fn swiglu_backward(
        &self,
        da: SpanMut<MixedBuf>,
        db: Option<SpanMut<MixedBuf>>,
        dout: Span<MixedBuf>,
        a: Span<MixedBuf>,
        b: Option<Span<MixedBuf>>,
    ) {
        let (dout, a, b) = (
            f32s(dout).slice(),
            f32s(a).slice(),
            b.map(|b| f32s(b).slice()),
        );
        match (out(da), db.map(out)) {
            (Out::F32(da), None) => swiglu::swiglu_backward(da, None, dout, a, b),
            (Out::F32(da), Some(Out::F32(db))) => swiglu::swiglu_backward(da, Some(db), dout, a, b),
            (Out::Bf16(da), None) => swiglu::swiglu_backward(da, None, dout, a, b),
            (Out::Bf16(da), Some(Out::Bf16(db))) => {
                swiglu::swiglu_backward(da, Some(db), dout, a, b)
            }
            _ => panic!("swiglu_backward: da and db of different types"),
        }
    }

    fn rope(
        &self,
        qkv: SpanMut<MixedBuf>,
        cos: Span<MixedBuf>,
        sin: Span<MixedBuf>,
        shape: AttnShape,
        inverse: bool,
    ) {
        Cpu.rope(f32s_mut(qkv), f32s(cos), f32s(sin), shape, inverse);
    }

    fn attention_forward(
        &self,
        out: SpanMut<MixedBuf>,
        att: SpanMut<MixedBuf>,
        qkv: Span<MixedBuf>,
        shape: AttnShape,
    ) {
        let (out, att, qkv) = (f32s_mut(out), f32s_mut(att), f32s(qkv));
        attention_forward_on(out.slice(), att.slice(), qkv.slice(), shape, self);
    }

    fn attention_forward_cached(
        &self,
        out: SpanMut<MixedBuf>,
        att: SpanMut<MixedBuf>,
        caches: &[(Span<MixedBuf>, AttnShape)],
    ) {
        let (out, att) = (f32s_mut(out), f32s_mut(att));
        let caches: Vec<_> = (caches.iter())
            .map(|&(qkv, s)| match operand(qkv) {
                Operand::Bf16(values) => (values, s),
                _ => panic!("a KV cache of this backend is bf16 (`BufKind::Cache`)"),
            })
            .collect();
        attention_forward_cached_on(out.slice(), att.slice(), &caches, self);
    }

    fn attention_backward(
        &self,
        dqkv: SpanMut<MixedBuf>,
        datt: SpanMut<MixedBuf>,
        dout: Span<MixedBuf>,
        _out: Span<MixedBuf>,
        qkv: Span<MixedBuf>,
        att: Span<MixedBuf>,
        shape: AttnShape,
    ) {
        attention_backward_on(
            f32s_mut(dqkv).slice(),
            f32s_mut(datt).slice(),
            f32s(dout).slice(),
            f32s(qkv).slice(),
            f32s(att).slice(),
            shape,
            self,
        );
    }

    fn cross_entropy(
        &self,
        logits: SpanMut<MixedBuf>,
        targets: &Vec<u32>,
        grad: bool,
        part: BatchPart,
        stats: &mut StepStats,
    ) {
        Cpu.cross_entropy(f32s_mut(logits), targets, grad, part, stats);
    }

    fn sum_squares(&self, x: Span<MixedBuf>, stats: &mut StepStats) {
        Cpu.sum_squares(f32s(x), stats);
    }

    /// The CPU's collectives on the `f32` values; a gather of parameters refreshes
    /// their copy.
    fn collective<'w>(
        &self,
        world: &'w World,
    ) -> Result<Box<dyn Collective<MixedBuf, StepStats> + 'w>> {
        let f32s = Backend::<f32>::collective(&Cpu, world)?;
        Ok(Box::new(MixedCollective { f32s }))
    }

    /// AdamW on the `f32` master weights, their bf16 copy written in the same pass.
    fn adamw(
        &self,
        params: SpanMut<MixedBuf>,
        grads: Span<MixedBuf>,
        m: SpanMut<MixedBuf>,
        v: SpanMut<MixedBuf>,
        step: &AdamWStep,
        stats: &StepStats,
    ) {
        let range = params.start..params.start + params.len;
        let buf = params.buf;
        let Values::F32(values) = &mut buf.values else {
            panic!("parameters are f32");
        };
        let bf16_copy = match &mut buf.copy {
            ParamCopy::Bf16(copy) => Some(&mut copy[range.clone()]),
            _ => None,
        };
        adamw::adamw_update(
            &mut values[range.clone()],
            bf16_copy,
            f32s(grads).slice(),
            f32s_mut(m).slice(),
            f32s_mut(v).slice(),
            step.t,
            step.lr,
            &step.hp,
            step.grad_scale(stats.sum_squares),
        );
        if let ParamCopy::Q8(copy) = &mut buf.copy {
            copy.refresh(values, range);
        }
    }
}

/// [`CpuMixed`]'s collectives: the CPU's, on the `f32` values.
struct MixedCollective<'w> {
    f32s: Box<dyn Collective<HostBuf<f32>, StepStats> + 'w>,
}

impl Collective<MixedBuf, StepStats> for MixedCollective<'_> {
    fn rank(&self) -> usize {
        self.f32s.rank()
    }

    fn ranks(&self) -> usize {
        self.f32s.ranks()
    }

    fn all_reduce_sum(&self, buf: SpanMut<MixedBuf>) -> Result<()> {
        self.f32s.all_reduce_sum(f32s_mut(buf))
    }

    fn reduce_scatter_sum(&self, buf: SpanMut<MixedBuf>) -> Result<()> {
        self.f32s.reduce_scatter_sum(f32s_mut(buf))
    }

    fn all_gather(&self, mut buf: SpanMut<MixedBuf>) -> Result<()> {
        let (start, len) = (buf.start, buf.len);
        self.f32s.all_gather(f32s_mut(buf.reborrow()))?;
        buf.buf.refresh_copy(start, len);
        Ok(())
    }

    fn all_reduce_sum_squares(&self, stats: &mut StepStats) -> Result<()> {
        self.f32s.all_reduce_sum_squares(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::bf16::round_bf16;
    use crate::kernels::cpu::softmax::tests::values;

    /// The definition of attention's bf16 products: both operands rounded to bf16
    /// (nearest, ties to even), the products summed in f64 and stored in `f32`.
    struct RoundedF64;

    impl HeadProduct<f32> for RoundedF64 {
        unsafe fn product(
            &self,
            (m, k, n): (usize, usize, usize),
            dst: *mut f32,
            dst_rs: usize,
            a: View<f32>,
            b: View<f32>,
            scale: f32,
            accumulate: bool,
        ) {
            let at = |v: View<f32>, i: usize, j: usize| {
                let x = *v.ptr.offset(i as isize * v.rs + j as isize * v.cs);
                f32::from_bits((round_bf16(x) as u32) << 16) as f64
            };
            for i in 0..m {
                for j in 0..n {
                    let sum: f64 = (0..k).map(|kk| at(a, i, kk) * at(b, kk, j)).sum();
                    let c = &mut *dst.add(i * dst_rs + j);
                    let sum = sum as f32 * scale;
                    *c = if accumulate { *c + sum } else { sum };
                }
            }
        }

        unsafe fn mix(
            &self,
            shape: (usize, usize, usize),
            dst: *mut f32,
            dst_rs: usize,
            p: View<f32>,
            v: View<f32>,
        ) {
            self.product(shape, dst, dst_rs, p, v, 1.0, false)
        }
    }

    /// A copy into a bf16 buffer (a KV cache's rows) stores each value rounded as
    /// the products round it; a copy into `f32` values keeps them.
    #[test]
    fn a_copy_into_a_bf16_buffer_rounds_each_value() {
        let be = CpuMixed::new();
        let want = values(70_000, 3.0, 5);
        let role = crate::buffers::KV_CACHE;
        let mut src = be.alloc(role, want.len(), BufKind::Activations).unwrap();
        be.upload(src.all_mut(), &want).unwrap();
        for kind in [BufKind::Cache, BufKind::Activations] {
            let mut dst = be.alloc(role, want.len() + 10, kind).unwrap();
            be.copy(dst.at_mut(10..10 + want.len()), src.all());
            let mut got = vec![0.0; want.len()];
            be.download(dst.at(10..10 + want.len()), &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let w = match kind {
                    BufKind::Cache => f32::from_bits(u32::from(round_bf16(*w)) << 16),
                    _ => *w,
                };
                assert_eq!(g.to_bits(), w.to_bits(), "{kind:?} value {i}");
            }
        }
    }

    fn assert_close(what: &str, got: &[f32], want: &[f32]) {
        let norm = want.iter().map(|w| w.abs()).fold(0f32, f32::max);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * norm, "{what}[{i}]: {g} vs {w}");
        }
    }

    /// Attention forward and backward on each bf16 kernel this CPU runs equal the
    /// same kernels with every product by the definition (operands rounded to bf16,
    /// sums in f64), to `f32` rounding: several query blocks and a ragged last one.
    #[test]
    fn attention_on_the_bf16_kernels_is_its_rounded_definition() {
        let s = AttnShape {
            b: 2,
            t: 70,
            h: 2,
            d: 8,
            q0: 0,
        };
        let (n, c) = (s.b * s.t, s.c());
        let qkv = values(n * 3 * c, 1.5, 1);
        let dout = values(n * c, 1.0, 2);
        // (out, att, dqkv) of a forward and backward pass on `products`.
        let run = |products: &dyn HeadProduct<f32>| {
            let (mut out, mut att) = (vec![0.0; n * c], vec![0.0; s.b * s.h * s.t * s.t]);
            let (mut dqkv, mut datt) = (vec![0.0; qkv.len()], vec![0.0; att.len()]);
            attention_forward_on(&mut out, &mut att, &qkv, s, products);
            attention_backward_on(&mut dqkv, &mut datt, &dout, &qkv, &att, s, products);
            (out, att, dqkv)
        };
        let want = run(&RoundedF64);
        let mut kernels = vec![Bf16Kernel::Portable];
        kernels.extend(Bf16Kernel::native());
        for kernel in kernels {
            let got = run(&CpuMixed::on(kernel));
            assert_close(&format!("{} out", kernel.name()), &got.0, &want.0);
            assert_close(&format!("{} att", kernel.name()), &got.1, &want.1);
            assert_close(&format!("{} dqkv", kernel.name()), &got.2, &want.2);
        }
    }
}
