//! The kernel interface: [`Backend`], the kernels one backend provides over buffers
//! it owns ([`Allocator`]: buffers by [`Role`], holding their [`Allocation`]), and
//! the types its methods take — spans of buffers ([`Buffer`],
//! [`Span`], [`SpanMut`]), product and attention shapes ([`MatMul`],
//! [`AttnShape`]), a step's statistics ([`StepStats`]) and AdamW's scalars
//! ([`AdamWParams`], [`AdamWStep`], the clipping factor [`clip_scale`]), and the
//! arithmetic of a run ([`Precision`]); how a forward pass reads each parameter
//! ([`ParamRead`]) and how a file stores parameters that a backend maps
//! ([`Stored`]).

use super::cpu::memory::HostBuf;
use super::float::Float;
use super::kind::BackendKind;
pub use super::kind::{BufKind, Precision, STATS_BYTES};
use crate::distributed::World;
use crate::Result;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::time::Instant;

/// How a forward pass reads a parameter tensor: what a backend that multiplies a
/// copy of its parameters (bf16, Q8_0) keeps of it when it only runs forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamRead {
    /// Only as a matrix product's operand: a linear layer's weight (its copy alone).
    Operand,
    /// Only as values: an embedding looked up (not tied to the output layer), the
    /// gains (no copy).
    Values,
    /// Both: an embedding tied to the output layer.
    Both,
}

/// How a file stores a parameter buffer that a backend may map
/// ([`Backend::map_params`]): little-endian values of this type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    F32,
    Bf16,
}

/// A parameter buffer as it lies in a file, for [`Backend::map_params`]: `len`
/// values from byte `offset` on (little-endian, stored as `stored`, in
/// [`ParamLayout`] order), and how a forward pass reads each tensor's range
/// (as for [`Backend::write_host`]).
///
/// [`ParamLayout`]: crate::params::ParamLayout
pub struct ParamsInFile<'a> {
    pub file: &'a std::fs::File,
    pub offset: u64,
    pub len: usize,
    pub stored: Stored,
    pub reads: &'a [(Range<usize>, ParamRead)],
}

/// The shape of one matrix product `out (m, n) = a (m, k) · b (k, n)` over
/// contiguous row-major buffers, either operand possibly stored transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatMul {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// `a` is stored `(k, m)`.
    pub a_transposed: bool,
    /// `b` is stored `(n, k)` — a PyTorch `(out, in)` weight used as `x Wᵀ`.
    pub b_transposed: bool,
    /// `out += a·b` instead of `out = a·b`.
    pub accumulate: bool,
}

impl MatMul {
    /// `out (m, n) = a (m, k) · b (k, n)`, both stored as they are (attention's
    /// `P V`).
    pub fn plain(m: usize, k: usize, n: usize) -> Self {
        MatMul {
            m,
            k,
            n,
            a_transposed: false,
            b_transposed: false,
            accumulate: false,
        }
    }

    /// `y (N, out) = x (N, in) · Wᵀ`, `W (out, in)`: a linear layer's forward.
    pub fn linear(n: usize, d_in: usize, d_out: usize) -> Self {
        MatMul {
            b_transposed: true,
            ..MatMul::plain(n, d_in, d_out)
        }
    }

    /// `dx (N, in) = dy (N, out) · W`: a linear layer's input gradient.
    pub fn linear_dx(n: usize, d_in: usize, d_out: usize) -> Self {
        MatMul::plain(n, d_out, d_in)
    }

    /// `dW (out, in) = dyᵀ · x`: a linear layer's weight gradient.
    pub fn linear_dw(n: usize, d_in: usize, d_out: usize) -> Self {
        MatMul {
            a_transposed: true,
            ..MatMul::plain(d_out, n, d_in)
        }
    }

    /// The same product, accumulating into `out`.
    pub fn accumulating(self) -> Self {
        MatMul {
            accumulate: true,
            ..self
        }
    }

    /// `2·m·k·n`.
    pub fn flops(&self) -> u64 {
        2 * (self.m * self.k * self.n) as u64
    }
}

/// Shape of a batch of sequences for attention: `B` sequences of `T` positions,
/// `H` heads of `D` channels (`C = H·D`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub d: usize,
    /// Only positions `q0..t` are queries (all positions are keys): 0 for a full
    /// pass, `t - 1` to decode one token against a KV cache.
    pub q0: usize,
}

impl AttnShape {
    /// Queries per sequence.
    pub fn tq(&self) -> usize {
        self.t - self.q0
    }
    /// `C = H·D`.
    pub fn c(&self) -> usize {
        self.h * self.d
    }
}

/// What attention's forward keeps for its backward: a backend's choice, which the
/// buffers' declarations ([`crate::buffers`]) and the memory accounting read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKeeps {
    /// The probabilities `P (B, H, Tq, T)`; the backward's scratch is their gradient
    /// `(B, H, T, T)` (the CPU, whose backward runs as matrix products over them).
    Probabilities,
    /// Each query row's log-sum-exp `(B, H, Tq)` (f32), from which the backward
    /// recomputes `P` tile by tile; its scratch is one f32 per query row `(B, H, T)`
    /// (flash attention, on a GPU).
    LogSumExp,
}

impl AttentionKeeps {
    /// What a backend of `kind` keeps: the CPU the probabilities, a GPU's flash
    /// attention each row's log-sum-exp.
    pub fn of(kind: BackendKind) -> Self {
        match kind.on_gpu() {
            false => AttentionKeeps::Probabilities,
            true => AttentionKeeps::LogSumExp,
        }
    }

    /// Values the forward keeps for `heads = B·H` heads of `tq` query rows against
    /// `keys` keys.
    pub fn forward_len(self, heads: usize, tq: usize, keys: usize) -> usize {
        match self {
            AttentionKeeps::Probabilities => heads * tq * keys,
            AttentionKeeps::LogSumExp => heads * tq,
        }
    }

    /// [`AttentionKeeps::forward_len`] of a pass of shape `s`.
    pub fn kept_len(self, s: AttnShape) -> usize {
        self.forward_len(s.b * s.h, s.tq(), s.t)
    }

    /// Values of the backward's scratch for `heads` heads of `t` positions.
    pub fn backward_len(self, heads: usize, t: usize) -> usize {
        self.forward_len(heads, t, t)
    }

    /// How both are stored.
    pub fn kind(self) -> BufKind {
        match self {
            AttentionKeeps::Probabilities => BufKind::Activations,
            AttentionKeeps::LogSumExp => BufKind::Full,
        }
    }

    /// The forward's buffer and the backward's scratch, for the accounting's table.
    pub fn roles(self) -> [Role; 2] {
        let role = |name, shape| Role { name, shape };
        match self {
            AttentionKeeps::Probabilities => [
                role("attention probabilities", "(B, H, T, T)"),
                role("d attention probabilities", "(B, H, T, T)"),
            ],
            AttentionKeeps::LogSumExp => [
                role("attention log-sum-exp", "(B, H, T)"),
                role("attention Σ dout·out", "(B, H, T)"),
            ],
        }
    }
}

/// What a buffer is: its name and its shape in the letters of the model's doc
/// (`"(B, T, C)"`), for the memory accounting's table and an allocation's error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Role {
    pub name: &'static str,
    pub shape: &'static str,
}

/// Memory an allocation holds where its backend keeps it: host memory on the CPU,
/// device memory on a GPU.
pub trait Allocation {
    fn bytes(&self) -> u64;
}

/// Where buffers come from: a backend allocates them in its memory; the memory
/// accounting's planner only sizes them ([`crate::accounting`]), running the very
/// declarations the model allocates with ([`crate::buffers`]).
pub trait Allocator<F: Float> {
    /// A buffer of `F` values (in the precision its [`BufKind`] says).
    type Buf: Buffer;
    /// A buffer of token ids.
    type Ids: Allocation + Send + Sync;
    /// One step's statistics (loss and gradient sum of squares) where the kernels
    /// write them, and their host copy: [`StepStats`] on the CPU, a device buffer
    /// and pinned host memory on a GPU.
    type Stats: Allocation + Send + Sync;

    /// A zeroed buffer of `len` values for `role`.
    fn alloc(&self, role: Role, len: usize, kind: BufKind) -> Result<Self::Buf>;
    /// A buffer of `len` token ids for `role`.
    fn alloc_ids(&self, role: Role, len: usize) -> Result<Self::Ids>;
    /// A buffer for one step's statistics.
    fn alloc_stats(&self, role: Role) -> Result<Self::Stats>;
    /// What the backend is: the one description of how it stores each kind of
    /// buffer and what its attention keeps.
    fn kind(&self) -> BackendKind;

    /// What its attention keeps between the forward and the backward.
    fn attention_keeps(&self) -> AttentionKeeps {
        AttentionKeeps::of(self.kind())
    }
}

/// A buffer a backend owns: host memory on the CPU (a `HostBuf`),
/// device memory on a GPU.
pub trait Buffer: Allocation + Send + Sync {
    /// Number of values.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole buffer.
    fn all(&self) -> Span<'_, Self> {
        Span {
            buf: self,
            start: 0,
            len: self.len(),
        }
    }

    /// Values `range` of the buffer.
    fn at(&self, range: Range<usize>) -> Span<'_, Self> {
        assert!(range.start <= range.end && range.end <= self.len());
        Span {
            buf: self,
            start: range.start,
            len: range.end - range.start,
        }
    }

    fn all_mut(&mut self) -> SpanMut<'_, Self> {
        let len = self.len();
        SpanMut {
            buf: self,
            start: 0,
            len,
        }
    }

    fn at_mut(&mut self, range: Range<usize>) -> SpanMut<'_, Self> {
        assert!(range.start <= range.end && range.end <= self.len());
        SpanMut {
            buf: self,
            start: range.start,
            len: range.end - range.start,
        }
    }
}

impl<T> Allocation for Vec<T> {
    fn bytes(&self) -> u64 {
        (self.capacity() * size_of::<T>()) as u64
    }
}

impl<T: Send + Sync> Buffer for HostBuf<T> {
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
}

/// A mapped buffer's values count as the memory they hold: once read, the file's
/// pages are the process's resident memory as owned values would be.
impl<T> Allocation for HostBuf<T> {
    fn bytes(&self) -> u64 {
        match self {
            HostBuf::Owned(values) => values.bytes(),
            HostBuf::Mapped(_) => size_of_val::<[T]>(self) as u64,
        }
    }
}

impl<'a, T> Span<'a, HostBuf<T>> {
    /// The host values.
    pub fn slice(self) -> &'a [T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<'a, T> SpanMut<'a, HostBuf<T>> {
    /// The host values.
    pub fn slice(self) -> &'a mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// Fills values `offset..offset + out.len()` of a buffer being written from the
/// host ([`Backend::write_host`]): `write(offset, out)`, from any thread.
pub type HostWrite<'a, F> = dyn Fn(usize, &mut [F]) -> Result<()> + Sync + 'a;

/// Values `start..start + len` of a backend buffer, read-only.
pub struct Span<'a, B: ?Sized> {
    pub buf: &'a B,
    pub start: usize,
    pub len: usize,
}

impl<B: ?Sized> Clone for Span<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: ?Sized> Copy for Span<'_, B> {}

/// Values `start..start + len` of a backend buffer, to write.
pub struct SpanMut<'a, B: ?Sized> {
    pub buf: &'a mut B,
    pub start: usize,
    pub len: usize,
}

impl<B: ?Sized> SpanMut<'_, B> {
    /// A shorter-lived mutable span over the same values.
    pub fn reborrow(&mut self) -> SpanMut<'_, B> {
        SpanMut {
            buf: self.buf,
            start: self.start,
            len: self.len,
        }
    }
}

/// AdamW hyper-parameters (SPEC defaults β = (0.9, 0.999), ε = 1e-8).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWParams {
    fn default() -> Self {
        AdamWParams {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// The SPEC's ε of gradient clipping.
pub const CLIP_EPS: f64 = 1e-6;

/// The factor clipping multiplies gradients by: `max/(norm + eps)` when
/// `norm > max`, else 1 (also 1 when `max` is not positive: clipping off).
pub fn clip_scale(norm: f64, max: f64, eps: f64) -> f32 {
    if max > 0.0 && norm > max {
        (max / (norm + eps)) as f32
    } else {
        1.0
    }
}

/// One AdamW update's scalars (SPEC §3), step `t` counting from 1. With `max_norm`,
/// gradients are first multiplied by the clipping factor [`AdamWStep::grad_scale`]
/// of the gradient's sum of squares, which the backend reads from the step's
/// statistics ([`Backend::sum_squares`]) where they are: on a GPU, on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    pub lr: f64,
    pub t: u64,
    pub hp: AdamWParams,
    /// The global gradient-norm limit (`None`: no clipping).
    pub max_norm: Option<f64>,
}

impl AdamWStep {
    /// The factor gradients with sum of squares `sum_squares` are multiplied by:
    /// [`clip_scale`]`(sqrt(sum_squares), max_norm, CLIP_EPS)` (f64, then rounded to
    /// f32), or 1 without clipping. The CUDA kernel does the same operations.
    pub fn grad_scale(&self, sum_squares: f64) -> f32 {
        self.max_norm
            .map_or(1.0, |max| clip_scale(sum_squares.sqrt(), max, CLIP_EPS))
    }
}

/// Where the `N` rows of one [`Backend::cross_entropy`] sit in the batch whose mean
/// loss is wanted: a micro-batch of an optimizer step's batch, on one of its ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPart {
    /// Rows (positions) of the whole batch: the mean's divisor.
    pub rows: usize,
    /// Add to the loss of the parts before it instead of replacing it.
    pub accumulate: bool,
}

impl BatchPart {
    /// `rows` positions that are the whole batch.
    pub fn whole(rows: usize) -> Self {
        BatchPart {
            rows,
            accumulate: false,
        }
    }
}

/// A training step's statistics as they reach the host ([`Backend::read_stats`]).
/// The CPU backend's statistics buffer is one (held inline: no allocation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// Mean cross-entropy of the step's batch ([`Backend::cross_entropy`]).
    pub loss: f64,
    /// `Σ g²` of its gradient before clipping ([`Backend::sum_squares`]).
    pub sum_squares: f64,
    /// When they were ready: when the CPU wrote them, or when the host saw a GPU's
    /// copy complete.
    pub ready: Instant,
}

impl Allocation for StepStats {
    fn bytes(&self) -> u64 {
        0
    }
}

impl StepStats {
    /// The global L2 norm of the gradient.
    pub fn grad_norm(&self) -> f64 {
        self.sum_squares.sqrt()
    }

    /// Not yet written: NaN values.
    pub fn unset() -> Self {
        StepStats {
            loss: f64::NAN,
            sum_squares: f64::NAN,
            ready: Instant::now(),
        }
    }
}

/// Collectives of one optimizer step over a backend's buffers `Buf` and step
/// statistics `Stats`, queued in order with the kernels around them. Every rank
/// calls the same ones on buffers of the same length.
pub trait Collective<Buf, Stats> {
    /// This process's rank and the number of ranks.
    fn rank(&self) -> usize;
    fn ranks(&self) -> usize;
    /// `buf` ← the sum over ranks of `buf`.
    fn all_reduce_sum(&self, buf: SpanMut<Buf>) -> Result<()>;
    /// This rank's [`shard`](crate::distributed::shard) of `buf` ← the sum over ranks of that shard; the rest
    /// of `buf` is left undefined.
    fn reduce_scatter_sum(&self, buf: SpanMut<Buf>) -> Result<()>;
    /// Every rank's [`shard`](crate::distributed::shard) of `buf` from that rank, to every rank.
    fn all_gather(&self, buf: SpanMut<Buf>) -> Result<()>;
    /// The gradient sum of squares in `stats` ← its sum over ranks (each rank's is
    /// its shard's).
    fn all_reduce_sum_squares(&self, stats: &mut Stats) -> Result<()>;
}

/// The kernels one backend provides, over buffers it owns ([`Allocator::Buf`]).
/// Shapes: `N` rows of `C` channels etc. (see the module doc); every span is
/// row-major and exactly the size its shape says.
///
/// Kernels may run asynchronously (a GPU stream): they return nothing, and a
/// backend that can fail keeps the first failure for [`Backend::sync`]. Values
/// reach the host only through [`Backend::download`], which waits for the kernels
/// before it, and [`Backend::read_stats`]: a step's loss and gradient sum of squares
/// stay in a small buffer of the backend's ([`Allocator::Stats`]) until
/// [`Backend::send_stats`] queues their copy to the host, and only reading them
/// waits — for that copy alone, so the next step can be queued meanwhile.
pub trait Backend<F: Float>: Allocator<F> + Sync {
    /// Host memory that values cross in between the host and the buffers, one
    /// piece at a time (a checkpoint's tensors): a `Vec` on the CPU; page-locked
    /// memory on a GPU, which the device copies directly where pageable memory
    /// would be staged by the driver.
    type Staging: Send;

    /// Queues the copy of `stats` to the host; returns without waiting.
    fn send_stats(&self, stats: &mut Self::Stats);
    /// The statistics [`Backend::send_stats`] sent, when their copy is done (waits
    /// for it and the kernels before it only); the first failure of those kernels.
    fn read_stats(&self, stats: &Self::Stats) -> Result<StepStats>;
    /// `dst = src` from the host.
    fn upload(&self, dst: SpanMut<Self::Buf>, src: &[F]) -> Result<()>;
    /// `dst = src` from the host; `src.len()` ids are written.
    fn upload_ids(&self, dst: &mut Self::Ids, src: &[u32]) -> Result<()>;
    /// `dst = src` to the host (waits for the kernels writing `src`).
    fn download(&self, src: Span<Self::Buf>, dst: &mut [F]) -> Result<()>;

    /// The values of `src` where they lie, when the backend keeps its buffers in
    /// host memory (the CPU); `None` for a device, whose values are [`download`]ed.
    ///
    /// [`download`]: Backend::download
    fn host<'a>(&self, _src: Span<'a, Self::Buf>) -> Option<&'a [F]> {
        None
    }
    /// [`Backend::host`] to write: `write(offset, out)` fills `out` with values
    /// `offset..offset + out.len()` of `dst` (called once for all of them, or for
    /// parts from several threads) where they lie, when they lie in host memory,
    /// and what mirrors them (the copy of mixed-precision parameters) is brought up
    /// to date; `None`, without calling `write`, for a device, whose values are
    /// [`upload`]ed. `read`: how a forward pass reads the values — a backend that
    /// multiplies a copy of the parameters and only runs forward may keep a
    /// weight's copy alone, and make no copy of what no product reads.
    ///
    /// [`upload`]: Backend::upload
    fn write_host(
        &self,
        _dst: SpanMut<Self::Buf>,
        _read: ParamRead,
        _write: &HostWrite<'_, F>,
    ) -> Option<Result<()>> {
        None
    }
    /// The parameters as they lie in a file, mapped instead of read into fresh
    /// memory — where this backend multiplies values stored so: the CPU in `f32`
    /// maps `f32` files, under bf16 it maps `f32` files' values (making their copy
    /// from them) and, running forward only, bf16 files as the weights it
    /// multiplies. The file's pages in the page cache become the buffer's, at no
    /// cost but the page tables. `None` where it keeps its parameters elsewhere or
    /// in another form (a GPU, Q8_0 blocks of a bf16 file), or where the file
    /// cannot be mapped: the parameters are then read in.
    fn map_params(&self, _params: &ParamsInFile<'_>) -> Option<Self::Buf> {
        None
    }
    /// Staging memory for `len` values (see [`Backend::Staging`]).
    fn alloc_staging(&self, len: usize) -> Result<Self::Staging>;
    /// The values of `staging`, to fill before an [`upload`] from them or to
    /// [`download`] into (both return when the copy is done).
    ///
    /// [`upload`]: Backend::upload
    /// [`download`]: Backend::download
    fn staged<'a>(&self, staging: &'a mut Self::Staging) -> Result<&'a mut [F]>;
    /// Waits for every kernel launched so far; the first failure since the last call.
    fn sync(&self) -> Result<()>;
    /// An error naming what this backend cannot run of a model of `config` (the
    /// shapes its kernels need); checked before the model is made.
    fn check_model(&self, _config: &crate::ModelConfig) -> Result<()> {
        Ok(())
    }

    /// `out = a·b` or `out += a·b` (see [`MatMul`]).
    fn matmul(
        &self,
        out: SpanMut<Self::Buf>,
        a: Span<Self::Buf>,
        b: Span<Self::Buf>,
        shape: MatMul,
    );

    /// `dst = src`.
    fn copy(&self, dst: SpanMut<Self::Buf>, src: Span<Self::Buf>);
    /// `dst = 0`.
    fn fill_zero(&self, dst: SpanMut<Self::Buf>);

    /// `out (N, C) = table[ids]`, `table (V, C)`; `N` = `out.len / C`.
    fn embedding_forward(&self, out: SpanMut<Self::Buf>, ids: &Self::Ids, table: Span<Self::Buf>);
    /// `dtable (V, C) += scatter(dout (N, C))` at rows `ids (N)`.
    fn embedding_backward(
        &self,
        dtable: SpanMut<Self::Buf>,
        dout: Span<Self::Buf>,
        ids: &Self::Ids,
    );

    /// `out (N, C) = x / sqrt(mean(x²) + 1e-5) ⊙ g`; keeps `rstd (N)` for backward.
    fn rmsnorm_forward(
        &self,
        out: SpanMut<Self::Buf>,
        rstd: SpanMut<Self::Buf>,
        x: Span<Self::Buf>,
        g: Span<Self::Buf>,
    );
    /// `dx (N, C) (+)= ∂/∂x`, `dg (C) += ∂/∂g` for the gradient `dout (N, C)`;
    /// `dx` is accumulated into when `accumulate`, else overwritten.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self,
        dx: SpanMut<Self::Buf>,
        dg: SpanMut<Self::Buf>,
        dout: Span<Self::Buf>,
        x: Span<Self::Buf>,
        g: Span<Self::Buf>,
        rstd: Span<Self::Buf>,
        accumulate: bool,
    );

    /// SwiGLU `out = SiLU(a) ⊙ b`, or plain `out = SiLU(a)` when `b` is `None`;
    /// all `(N, F)`.
    fn swiglu_forward(
        &self,
        out: SpanMut<Self::Buf>,
        a: Span<Self::Buf>,
        b: Option<Span<Self::Buf>>,
    );
    /// `da`, `db` (overwritten) from `dout`; `db`/`b` are `None` together for SiLU.
    fn swiglu_backward(
        &self,
        da: SpanMut<Self::Buf>,
        db: Option<SpanMut<Self::Buf>>,
        dout: Span<Self::Buf>,
        a: Span<Self::Buf>,
        b: Option<Span<Self::Buf>>,
    );

    /// Rotates the query and key parts of the new rows `qkv (B, Tq, 3C)` in place by
    /// RoPE (adjacent pairs; row `i` is at position `q0 + i`), or by the inverse
    /// rotation — the backward pass — when `inverse`. `cos`, `sin`: `(context_length, D/2)`.
    fn rope(
        &self,
        qkv: SpanMut<Self::Buf>,
        cos: Span<Self::Buf>,
        sin: Span<Self::Buf>,
        shape: AttnShape,
        inverse: bool,
    );

    /// Causal softmax attention: `out (B, Tq, C)` from `qkv (B, T, 3C)` = rows
    /// `[q | k | v]`, query row `i` (position `q0 + i`) attending keys `0..=q0+i`;
    /// keeps in `att` what [`Allocator::attention_keeps`] says
    /// ([`AttentionKeeps::kept_len`] values).
    fn attention_forward(
        &self,
        out: SpanMut<Self::Buf>,
        att: SpanMut<Self::Buf>,
        qkv: Span<Self::Buf>,
        shape: AttnShape,
    );
    /// [`Backend::attention_forward`] of a decoding pass over several sequences:
    /// sequence `i`, `caches[i] = (qkv (T, 3C), shape)` with `shape.b == 1` (its KV
    /// cache, this pass's rows in place), has its `Tq` output rows next in
    /// `out (Σ Tq, C)` and what it keeps next in `att`. One
    /// [`Backend::attention_forward`] per sequence unless a backend does better.
    fn attention_forward_cached(
        &self,
        out: SpanMut<Self::Buf>,
        att: SpanMut<Self::Buf>,
        caches: &[(Span<Self::Buf>, AttnShape)],
    ) {
        let (mut row, mut prob) = (out.start, att.start);
        for &(qkv, shape) in caches {
            let rows = shape.tq() * shape.c();
            let probs = self.attention_keeps().kept_len(shape);
            self.attention_forward(
                SpanMut {
                    buf: &mut *out.buf,
                    start: row,
                    len: rows,
                },
                SpanMut {
                    buf: &mut *att.buf,
                    start: prob,
                    len: probs,
                },
                qkv,
                shape,
            );
            (row, prob) = (row + rows, prob + probs);
        }
    }
    /// `dqkv (B, T, 3C)` (overwritten) from `dout (B, T, C)` and the forward's `out`,
    /// `qkv` and `att`; `datt` is scratch ([`AttentionKeeps::backward_len`] values).
    /// Full passes only (`q0 = 0`).
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        dqkv: SpanMut<Self::Buf>,
        datt: SpanMut<Self::Buf>,
        dout: Span<Self::Buf>,
        out: Span<Self::Buf>,
        qkv: Span<Self::Buf>,
        att: Span<Self::Buf>,
        shape: AttnShape,
    );

    /// Cross-entropy of `logits (N, V)` against `targets (N)`, summed over the rows
    /// and divided by `part.rows`, into `stats`' loss (added to it with
    /// `part.accumulate`); with `grad`, the logits are overwritten in the same pass by
    /// `∂loss/∂logits = (softmax − onehot)/part.rows`. [`BatchPart::whole`]: the mean.
    fn cross_entropy(
        &self,
        logits: SpanMut<Self::Buf>,
        targets: &Self::Ids,
        grad: bool,
        part: BatchPart,
        stats: &mut Self::Stats,
    );

    /// `Σ x²` in `f64` into `stats`' sum of squares, the same sum whatever the
    /// number of threads.
    fn sum_squares(&self, x: Span<Self::Buf>, stats: &mut Self::Stats);

    /// The collectives of a training step over the several ranks of `world`, on this
    /// backend's buffers (MPI's on the CPU, NCCL's on GPUs); an error saying what to
    /// build where this build has none.
    fn collective<'w>(
        &self,
        world: &'w World,
    ) -> Result<Box<dyn Collective<Self::Buf, Self::Stats> + 'w>>;

    /// One AdamW update of `params` from `grads`, moments `m`, `v` (all the same
    /// length); with `step.max_norm`, clipped by the sum of squares in `stats`.
    fn adamw(
        &self,
        params: SpanMut<Self::Buf>,
        grads: Span<Self::Buf>,
        m: SpanMut<Self::Buf>,
        v: SpanMut<Self::Buf>,
        step: &AdamWStep,
        stats: &Self::Stats,
    );
}
