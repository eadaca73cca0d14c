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
        rmsnorm::rmsnorm_forward(out, rstd, x, g, rmsnorm::EPS);
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

    fn rope(&self, qkv: &mut [F], cos: &[F], sin: &[F], shape: AttnShape, inverse: bool) {
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

/// Runs `f` compiled for the widest vector instructions this CPU has — AVX-512 (with
/// the `avx512` feature), AVX2+FMA, NEON or the target's baseline — picked at run time
/// by `pulp`, so the elementwise loops inside `f` vectorize at that width. `f` must be
/// `#[inline(always)]` and do its loops itself (work it hands to rayon runs elsewhere).
#[inline(always)]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// Independent accumulators in reductions: without them a float sum is one serial
/// chain (the compiler may not reorder it) and does not vectorize.
const LANES: usize = 8;

/// `Σ f(x)` over `xs`, in `LANES` interleaved partial sums.
#[inline(always)]
pub(crate) fn sum_by<F: Float>(xs: &[F], f: impl Fn(F) -> F) -> F {
    let mut acc = [F::ZERO; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder().iter().map(|&x| f(x)).sum::<F>();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f(x);
        }
    }
    acc.into_iter().sum::<F>() + rest
}

/// `Σ a·b·c` over three equal-length slices, in `LANES` partial sums.
#[inline(always)]
pub(crate) fn dot3<F: Float>(a: &[F], b: &[F], c: &[F]) -> F {
    let n = a.len() / LANES * LANES;
    let mut acc = [F::ZERO; LANES];
    for ((a, b), c) in a[..n]
        .chunks_exact(LANES)
        .zip(b[..n].chunks_exact(LANES))
        .zip(c[..n].chunks_exact(LANES))
    {
        for l in 0..LANES {
            acc[l] += a[l] * b[l] * c[l];
        }
    }
    let rest = (n..a.len()).map(|i| a[i] * b[i] * c[i]).sum::<F>();
    acc.into_iter().sum::<F>() + rest
}

/// `Σ a·b` over two equal-length slices, in `LANES` partial sums.
#[inline(always)]
pub(crate) fn dot<F: Float>(a: &[F], b: &[F]) -> F {
    let n = a.len() / LANES * LANES;
    let mut acc = [F::ZERO; LANES];
    for (a, b) in a[..n].chunks_exact(LANES).zip(b[..n].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += a[l] * b[l];
        }
    }
    let rest = (n..a.len()).map(|i| a[i] * b[i]).sum::<F>();
    acc.into_iter().sum::<F>() + rest
}

/// `max(xs)` (`F::MIN` when empty), in `LANES` partial maxima.
#[inline(always)]
pub(crate) fn max<F: Float>(xs: &[F]) -> F {
    let mut acc = [F::MIN; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder().iter().fold(F::MIN, |m, &x| m.max(x));
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    acc.into_iter().fold(rest, F::max)
}
