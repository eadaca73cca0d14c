//! The CPU kernels' vector code: run-time dispatch to the widest instructions the
//! CPU has (`vectorized`) and reductions in interleaved partial sums that vectorize.

use crate::kernels::Float;

/// Elements per rayon task in elementwise kernels: big enough to amortize the
/// scheduling, small enough to balance two or more threads.
pub(crate) const CHUNK: usize = 1 << 14;

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
pub(crate) const LANES: usize = 8;

/// `Σ f(x)` over `xs`, in `LANES` interleaved partial sums of `f`'s type (which may
/// be wider than the elements': `f64` sums of `f32` squares).
#[inline(always)]
pub(crate) fn sum_by<T: Copy, F: Float>(xs: &[T], f: impl Fn(T) -> F) -> F {
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
