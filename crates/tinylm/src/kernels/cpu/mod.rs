//! The CPU backend: every kernel multi-threaded with rayon (the global pool, sized
//! by `--threads`), matrix products through the `gemm` crate.

pub mod attention;
pub mod cross_entropy;
pub mod embedding;
pub mod linear;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

use super::{AdamWStep, AttnShape, Backend, BufKind, Float, MatMul, Span, SpanMut, StepStats};
use crate::{optim, Result};
use rayon::prelude::*;
use std::time::Instant;

/// A zeroed buffer of `len` elements. On Linux a buffer of several MiB asks for
/// transparent huge pages before its first touch (`madvise`; a no-op where the
/// kernel has them off): the products' packing and attention walk rows that lie
/// kilobytes apart, and 2 MiB pages spare those walks most of their TLB misses.
pub fn zeroed<F: Float>(len: usize) -> Vec<F> {
    let buf = vec![F::ZERO; len];
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        let (start, end) = (
            buf.as_ptr() as usize,
            buf.as_ptr() as usize + len * size_of::<F>(),
        );
        let first = start.next_multiple_of(HUGE_PAGE);
        let last = end / HUGE_PAGE * HUGE_PAGE;
        if last > first {
            // SAFETY: the range lies inside `buf`'s allocation; the advice changes
            // how its pages are backed, never their contents.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                )
            };
        }
    }
    buf
}

/// The CPU backend (stateless; threads come from the global rayon pool).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl<F: Float> Backend<F> for Cpu {
    type Buf = Vec<F>;
    type Ids = Vec<u32>;
    type Stats = StepStats;

    fn alloc(&self, len: usize, _kind: BufKind) -> Result<Vec<F>> {
        Ok(zeroed(len))
    }

    fn alloc_ids(&self, len: usize) -> Result<Vec<u32>> {
        Ok(vec![0; len])
    }

    fn alloc_stats(&self) -> Result<StepStats> {
        Ok(StepStats::unset())
    }

    /// The kernels have run: the statistics are ready now.
    fn send_stats(&self, stats: &mut StepStats) {
        stats.ready = Instant::now();
    }

    fn read_stats(&self, stats: &StepStats) -> Result<StepStats> {
        Ok(*stats)
    }

    fn upload(&self, dst: SpanMut<Vec<F>>, src: &[F]) -> Result<()> {
        dst.slice().copy_from_slice(src);
        Ok(())
    }

    fn upload_ids(&self, dst: &mut Vec<u32>, src: &[u32]) -> Result<()> {
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: Span<Vec<F>>, dst: &mut [F]) -> Result<()> {
        dst.copy_from_slice(src.slice());
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn matmul(&self, out: SpanMut<Vec<F>>, a: Span<Vec<F>>, b: Span<Vec<F>>, shape: MatMul) {
        linear::matmul(out.slice(), a.slice(), b.slice(), shape);
    }

    fn copy(&self, dst: SpanMut<Vec<F>>, src: Span<Vec<F>>) {
        let src = src.slice();
        assert_eq!(dst.len, src.len(), "copy size");
        (dst.slice().par_chunks_mut(CHUNK))
            .zip(src.par_chunks(CHUNK))
            .for_each(|(dst, src)| dst.copy_from_slice(src));
    }

    fn fill_zero(&self, dst: SpanMut<Vec<F>>) {
        (dst.slice().par_chunks_mut(CHUNK)).for_each(|dst| dst.fill(F::ZERO));
    }

    fn embedding_forward(&self, out: SpanMut<Vec<F>>, ids: &Vec<u32>, table: Span<Vec<F>>) {
        embedding::embedding_forward(out.slice(), ids, table.slice());
    }

    fn embedding_backward(&self, dtable: SpanMut<Vec<F>>, dout: Span<Vec<F>>, ids: &Vec<u32>) {
        embedding::embedding_backward(dtable.slice(), dout.slice(), ids);
    }

    fn rmsnorm_forward(
        &self,
        out: SpanMut<Vec<F>>,
        rstd: SpanMut<Vec<F>>,
        x: Span<Vec<F>>,
        g: Span<Vec<F>>,
    ) {
        rmsnorm::rmsnorm_forward(
            out.slice(),
            rstd.slice(),
            x.slice(),
            g.slice(),
            rmsnorm::EPS,
        );
    }

    fn rmsnorm_backward(
        &self,
        dx: SpanMut<Vec<F>>,
        dg: SpanMut<Vec<F>>,
        dout: Span<Vec<F>>,
        x: Span<Vec<F>>,
        g: Span<Vec<F>>,
        rstd: Span<Vec<F>>,
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

    fn swiglu_forward(&self, out: SpanMut<Vec<F>>, a: Span<Vec<F>>, b: Option<Span<Vec<F>>>) {
        swiglu::swiglu_forward(out.slice(), a.slice(), b.map(Span::slice));
    }

    fn swiglu_backward(
        &self,
        da: SpanMut<Vec<F>>,
        db: Option<SpanMut<Vec<F>>>,
        dout: Span<Vec<F>>,
        a: Span<Vec<F>>,
        b: Option<Span<Vec<F>>>,
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
        qkv: SpanMut<Vec<F>>,
        cos: Span<Vec<F>>,
        sin: Span<Vec<F>>,
        shape: AttnShape,
        inverse: bool,
    ) {
        rope::rope(qkv.slice(), cos.slice(), sin.slice(), shape, inverse);
    }

    fn attention_forward(
        &self,
        out: SpanMut<Vec<F>>,
        att: SpanMut<Vec<F>>,
        qkv: Span<Vec<F>>,
        shape: AttnShape,
    ) {
        attention::attention_forward(out.slice(), att.slice(), qkv.slice(), shape);
    }

    fn attention_backward(
        &self,
        dqkv: SpanMut<Vec<F>>,
        datt: SpanMut<Vec<F>>,
        dout: Span<Vec<F>>,
        qkv: Span<Vec<F>>,
        att: Span<Vec<F>>,
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
        logits: SpanMut<Vec<F>>,
        targets: &Vec<u32>,
        grad: bool,
        stats: &mut StepStats,
    ) {
        stats.loss = cross_entropy::cross_entropy(logits.slice(), targets, grad).to_f64();
    }

    fn sum_squares(&self, x: Span<Vec<F>>, stats: &mut StepStats) {
        stats.sum_squares = optim::sum_squares(x.slice());
    }

    fn adamw(
        &self,
        params: SpanMut<Vec<F>>,
        grads: Span<Vec<F>>,
        m: SpanMut<Vec<F>>,
        v: SpanMut<Vec<F>>,
        step: &AdamWStep,
        stats: &StepStats,
    ) {
        optim::adamw_step(
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

thread_local! {
    /// One worker thread's scratch buffer (see [`with_scratch`]), a `Vec<F>` for the
    /// float type last asked for.
    static SCRATCH: std::cell::Cell<Option<Box<dyn std::any::Any>>> =
        const { std::cell::Cell::new(None) };
}

/// Runs `f` on this thread's scratch of `len` elements (contents unspecified). The
/// buffer grows to the largest size asked for and is kept, so once a shape has run,
/// later calls allocate nothing — for work inside a rayon task that needs a few
/// KiB of its own (attention's transposed head). A nested call gets a fresh buffer.
pub(crate) fn with_scratch<F: Float, R>(len: usize, f: impl FnOnce(&mut [F]) -> R) -> R {
    let mut slot = SCRATCH
        .take()
        .filter(|b| b.is::<Vec<F>>())
        .unwrap_or_else(|| Box::new(Vec::<F>::new()));
    let buf = slot
        .downcast_mut::<Vec<F>>()
        .expect("a Vec<F>, checked above");
    if buf.len() < len {
        buf.resize(len, F::ZERO);
    }
    let out = f(&mut buf[..len]);
    SCRATCH.set(Some(slot));
    out
}

/// `dst (cols, rows)` = the transpose of `src (rows, cols)` (row stride `src_rs`),
/// in blocks of rows so each block's source cache lines are read once.
pub(crate) fn transpose<F: Float>(
    dst: &mut [F],
    src: &[F],
    rows: usize,
    cols: usize,
    src_rs: usize,
) {
    const BLOCK: usize = 16;
    assert_eq!(dst.len(), rows * cols, "transpose destination size");
    for r0 in (0..rows).step_by(BLOCK) {
        let r1 = (r0 + BLOCK).min(rows);
        for (j, dst_row) in dst.chunks_exact_mut(rows).enumerate() {
            for (r, x) in (r0..r1).zip(&mut dst_row[r0..r1]) {
                *x = src[r * src_rs + j];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{transpose, with_scratch};

    /// The `VmFlags` of the mapping that holds `addr`, from `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((start, end)) = range.split_once('-') {
                if let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                ) {
                    inside = (start..end).contains(&addr);
                    continue;
                }
            }
            if let Some(flags) = line.strip_prefix("VmFlags:").filter(|_| inside) {
                return flags.to_string();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_ask_for_huge_pages_and_are_zero() {
        use super::zeroed;
        let buf: Vec<f32> = zeroed(8 << 20);
        let aligned = (buf.as_ptr() as usize).next_multiple_of(2 << 20);
        let flags = vm_flags(aligned);
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "32 MiB buffer without MADV_HUGEPAGE: VmFlags{flags}"
        );
        assert!(buf.iter().all(|&x| x == 0.0));
        let small: Vec<f64> = zeroed(100);
        assert_eq!(small, vec![0.0; 100]);
    }

    #[test]
    fn transpose_handles_strides_and_partial_blocks() {
        let (rows, cols, rs) = (37, 5, 9);
        let src: Vec<f32> = (0..rows * rs).map(|i| i as f32).collect();
        let mut dst = vec![f32::NAN; rows * cols];
        transpose(&mut dst, &src, rows, cols, rs);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(dst[c * rows + r], src[r * rs + c], "({r}, {c})");
            }
        }
    }

    #[test]
    fn scratch_is_kept_per_thread_and_per_float_type() {
        let first = with_scratch::<f32, _>(1000, |s| {
            s.fill(1.0);
            s.as_ptr()
        });
        // Smaller requests reuse the same buffer; a nested call gets its own.
        let again = with_scratch::<f32, _>(10, |s| {
            let nested = with_scratch::<f32, _>(10, |n| n.as_ptr());
            assert_ne!(nested, s.as_ptr());
            s.as_ptr()
        });
        assert_eq!(first, again);
        assert_eq!(with_scratch::<f64, _>(3, |s| s.len()), 3);
    }
}
