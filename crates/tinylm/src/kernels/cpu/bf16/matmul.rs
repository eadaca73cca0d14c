//! The bf16 product and its threads: `out (m, n) (+)= a · b` with both operands
//! rounded to bf16 (nearest, ties to even) and the sums in `f32`, for every
//! [`MatMul`] the `f32` products take (either operand stored transposed, written or
//! accumulated), on the native micro-kernel of the CPU ([`Bf16Kernel`]).
//!
//! Blocking (Goto's, see `block`): `B`'s columns packed into panels of pairs
//! ([`pack`](super::pack)) per block of [`KC`] values of `k`, `A` packed per block of
//! [`MC`] rows and [`KC`] values, every tile one micro-kernel call — a panel of `B`
//! (32 KiB) stays in L1 while `A`'s block (256 KiB) and the output's stream from L2.
//! Threads split the output as the `f32` products do: one row block per thread,
//! column blocks of at most 1,024, one fork-join per product.

use super::pack::{Block, Layout, Microkernel, Operand, Tile};
use super::portable::Portable;
use super::round::Bf16Operand;
use crate::kernels::cpu::linear::{for_each_output_block, FEW_ROWS};
use crate::kernels::cpu::memory::{with_scratch, SharedMut};
use crate::kernels::MatMul;

#[cfg(all(target_arch = "x86_64", feature = "avx512"))]
use super::avx512::Avx512Bf16;
#[cfg(target_arch = "aarch64")]
use super::neon::ArmBf16;

/// Values of `k` per packed block: a panel of `B` (`KC/2` pairs × 32 columns, 32 KiB)
/// fits in L1 beside a tile's rows of `A`. (256 ran slower on the products with more
/// `k`: their output went to L2 and back twice as often.)
pub const KC: usize = 512;
/// Rows of `A` per packed block (`MC × KC` bf16 values in L2).
pub const MC: usize = 256;
/// Most `u32` pairs of `B` packed at once per thread (8 MiB), so that a long `k`
/// (an LM head's input gradient sums over the vocabulary) needs no more.
pub const MAX_PACKED_B: usize = 2 << 20;

/// A bf16 micro-kernel: the CPU's native one, or the portable one every CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// x86-64 `vdpbf16ps` (AVX512_BF16: AMD Zen 4 and later, Intel Cooper Lake and
    /// Sapphire Rapids and later); built with the `avx512` feature.
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    Avx512Bf16,
    /// Arm `bfdot` (FEAT_BF16: Neoverse V1/V2/N2, Graviton 3 and 4, Apple M2 and later).
    #[cfg(target_arch = "aarch64")]
    ArmBf16,
    /// The same values widened to `f32` and multiplied there: any CPU, slower than
    /// the `f32` products.
    Portable,
}

impl Bf16Kernel {
    /// The kernel built for this architecture that multiplies bf16 natively, whether
    /// or not this CPU has its instructions (`None` where none is built).
    pub fn native_built() -> Option<Bf16Kernel> {
        #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
        return Some(Bf16Kernel::Avx512Bf16);
        #[cfg(target_arch = "aarch64")]
        return Some(Bf16Kernel::ArmBf16);
        #[allow(unreachable_code)]
        None
    }

    /// The native kernel if this CPU has its instructions.
    pub fn native() -> Option<Bf16Kernel> {
        Self::native_built().filter(|k| k.runs_here())
    }

    /// The native kernel where the CPU has one, else the portable one.
    pub fn best() -> Bf16Kernel {
        Self::native().unwrap_or(Bf16Kernel::Portable)
    }

    /// Whether this CPU has the kernel's instructions.
    pub fn runs_here(self) -> bool {
        match self {
            #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
            Bf16Kernel::Avx512Bf16 => Avx512Bf16::detected(),
            #[cfg(target_arch = "aarch64")]
            Bf16Kernel::ArmBf16 => ArmBf16::detected(),
            Bf16Kernel::Portable => true,
        }
    }

    /// The kernel's tile, `(MR, NR)`: products split into blocks of whole tiles.
    fn tile(self) -> (usize, usize) {
        match self {
            #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
            Bf16Kernel::Avx512Bf16 => (Avx512Bf16::MR, Avx512Bf16::NR),
            #[cfg(target_arch = "aarch64")]
            Bf16Kernel::ArmBf16 => (ArmBf16::MR, ArmBf16::NR),
            Bf16Kernel::Portable => (Portable::MR, Portable::NR),
        }
    }

    /// What the kernel runs with, for reports.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
            Bf16Kernel::Avx512Bf16 => "AVX512_BF16 (vdpbf16ps)",
            #[cfg(target_arch = "aarch64")]
            Bf16Kernel::ArmBf16 => "Arm BF16 (bfdot)",
            Bf16Kernel::Portable => "portable (bf16 values, f32 arithmetic)",
        }
    }
}

/// `out (m, n) (+)= a · b` in bf16 (see [`MatMul`] for the shapes and transposes)
/// on [`Bf16Kernel::best`]: each operand element rounded to bf16 as it is packed
/// (`f32`) or taken as it is (`half::bf16`), products summed in `f32`, `out` written
/// or accumulated in `f32`.
pub fn matmul_bf16<A: Bf16Operand, B: Bf16Operand>(out: &mut [f32], a: &[A], b: &[B], s: MatMul) {
    matmul_bf16_on(Bf16Kernel::best(), false, out, a, b, s)
}

/// [`matmul_bf16`] on the given kernel. `forward_only`: for a model that only runs
/// forward (generation), where a linear layer's product of up to 128 rows — a
/// prompt's pass — runs as dot products too. (Training keeps the blocked product
/// past 16 rows, so that its sums do not change path with the micro-batch's size.)
///
/// # Panics
/// If the CPU lacks the kernel's instructions ([`Bf16Kernel::runs_here`]) or a
/// buffer's size is not the shape's.
pub fn matmul_bf16_on<A: Bf16Operand, B: Bf16Operand>(
    kernel: Bf16Kernel,
    forward_only: bool,
    out: &mut [f32],
    a: &[A],
    b: &[B],
    s: MatMul,
) {
    let few_rows = if forward_only {
        PROMPT_FEW_ROWS
    } else {
        FEW_ROWS
    };
    product(kernel, out, a, b, s, few_rows)
}

/// Rows up to which a forward-only model's linear layer runs as dot products
/// ([`matmul_bf16_on`] with `forward_only`). The dot products read each block of
/// the weight from memory once for all the rows, at a fraction of the bf16 peak;
/// the blocked product packs the weight (reading it twice and writing it once) and
/// runs near the peak, which pays off from a few hundred rows: on Zen 5 a 62-token
/// prompt of a 134M-parameter model took 24–29 ms instead of 32–48, 124 tokens
/// 44–55 ms instead of 60, 248 tokens (blocked either way) 93–100 ms. Attention's
/// per-head products keep [`FEW_ROWS`]: its query blocks of 64 were slower as dot
/// products (a training step's attention 10.4 → 12.7 ms).
const PROMPT_FEW_ROWS: usize = 128;

/// [`matmul_bf16_on`] with linear layers' products of at most `linear_rows` rows
/// as dot products.
fn product<A: Bf16Operand, B: Bf16Operand>(
    kernel: Bf16Kernel,
    out: &mut [f32],
    a: &[A],
    b: &[B],
    s: MatMul,
    linear_rows: usize,
) {
    assert_eq!(out.len(), s.m * s.n, "matmul output size");
    assert_eq!(a.len(), s.m * s.k, "matmul lhs size");
    assert_eq!(b.len(), s.k * s.n, "matmul rhs size");
    assert!(kernel.runs_here(), "this CPU cannot run {}", kernel.name());
    if s.m * s.n == 0 {
        return;
    }
    let a = Operand::new(a, if s.a_transposed { s.m } else { s.k }, s.a_transposed);
    let b = Operand::new(b, if s.b_transposed { s.k } else { s.n }, s.b_transposed);
    let shape = (s.m, s.k, s.n);
    // SAFETY: the operands address their shapes (sizes checked above), the CPU has
    // the kernel's instructions.
    if unsafe {
        few_rows(
            kernel,
            shape,
            out.as_mut_ptr(),
            s.n,
            a,
            b,
            s.accumulate,
            Some(linear_rows),
        )
    } {
        return;
    }
    let out = SharedMut(out.as_mut_ptr());
    for_each_output_block(s, kernel.tile(), |rows, cols| {
        // The whole operands (Sync), not their raw-pointer fields.
        let (a, b) = (a, b);
        // SAFETY: the block is inside every operand (sizes checked above) and each
        // task writes only its own block of `out`.
        unsafe {
            matmul_bf16_view(
                kernel,
                (rows.len(), s.k, cols.len()),
                out.get().add(rows.start * s.n + cols.start),
                s.n,
                a.at(rows.start, 0),
                b.at(0, cols.start),
                s.accumulate,
            )
        }
    });
}

/// Products of at most `linear` rows (a linear layer's, split among the threads by
/// `b`'s rows as `linear::for_each_column_block` splits them) or, on the calling
/// thread where `linear` is `None`, [`FEW_ROWS`] rows (attention's) against a right
/// operand contiguous along `k` — a decoding step's or a prompt's linear layers
/// (`x · Wᵀ`) and its attention's scores against the cached keys (`q · Kᵀ`) — on
/// AVX512_BF16 run as dot products ([`avx512::few_rows`](super::avx512::few_rows)):
/// `b` streams from memory once, as it is stored, where packing it for the blocked
/// product would read it twice and write it once. And, on
/// the calling thread, products of at most `FEW_X` rows against a right operand
/// contiguous along `n` — a decoding step's `P · V` against the cached values —
/// pair by pair of `b`'s rows ([`avx512::few_rows_by_rows`](super::avx512::few_rows_by_rows)),
/// again without packing. Whether it ran (elsewhere the blocked product runs).
///
/// # Safety
/// As [`matmul_bf16_view`]'s.
#[allow(clippy::too_many_arguments)]
unsafe fn few_rows<A: Bf16Operand, B: Bf16Operand>(
    kernel: Bf16Kernel,
    (m, k, n): (usize, usize, usize),
    c: *mut f32,
    ldc: usize,
    a: Operand<A>,
    b: Operand<B>,
    accumulate: bool,
    linear: Option<usize>,
) -> bool {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if kernel == Bf16Kernel::Avx512Bf16 && a.cs == 1 {
        use super::avx512;
        use crate::kernels::cpu::few_dots::FEW_X;
        use crate::kernels::cpu::linear::for_each_column_block;
        let x_rs = k.next_multiple_of(32);
        if m <= linear.unwrap_or(FEW_ROWS) && b.rs == 1 {
            let (c, w) = (SharedMut(c), SharedMut(b.ptr.cast_mut()));
            with_scratch::<u16, _>(m * x_rs, |x| {
                // SAFETY: `a` holds `m` rows of `k`, `x` `m · x_rs` values; the CPU
                // has the kernel's instructions (both checked by the callers).
                avx512::round_rows(x, a.ptr, m, k, a.rs, x_rs);
                let x = SharedMut(x.as_mut_ptr());
                let block = |cols| {
                    // The whole wrappers (Sync), not their pointers.
                    let (c, x, w) = (&c, &x, &w);
                    // SAFETY: shapes as above; each block writes only its own columns.
                    avx512::few_rows(
                        (c.get(), ldc),
                        (x.get(), x_rs),
                        (w.get().cast_const(), b.cs),
                        (m, k),
                        cols,
                        accumulate,
                    )
                };
                match linear {
                    Some(_) => for_each_column_block(MatMul::linear(m, k, n), block),
                    None => block(0..n),
                }
            });
            return true;
        }
        if m <= FEW_X && b.cs == 1 && linear.is_none() {
            with_scratch::<u16, _>(m * x_rs, |x| {
                // SAFETY: as above; `b`'s rows, `b.rs` apart, hold `n` values each.
                avx512::round_rows(x, a.ptr, m, k, a.rs, x_rs);
                let (x, b) = ((x.as_ptr(), x_rs), (b.ptr, b.rs));
                avx512::few_rows_by_rows((c, ldc), x, b, (m, k, n), accumulate);
            });
            return true;
        }
    }
    let _ = (kernel, (m, k, n), c, ldc, a, b, accumulate, linear);
    false
}

/// `c (m, n)` (row stride `ldc`) `= a (m, k) · b (k, n)`, or `c +=` when
/// `accumulate`, in bf16 on the calling thread, over strided views: the per-head
/// products of attention, whose `Q`, `K` and `V` are `(T, D)` views of rows `3C`
/// apart (a view contiguous along one dimension packs fastest).
///
/// # Safety
/// The views must address `(m, k)` and `(k, n)` values; `c` must be writable for
/// `(m, n)` and alias neither.
///
/// # Panics
/// If the CPU lacks the kernel's instructions.
pub unsafe fn matmul_bf16_view<A: Bf16Operand, B: Bf16Operand>(
    kernel: Bf16Kernel,
    (m, k, n): (usize, usize, usize),
    c: *mut f32,
    ldc: usize,
    a: Operand<A>,
    b: Operand<B>,
    accumulate: bool,
) {
    assert!(kernel.runs_here(), "this CPU cannot run {}", kernel.name());
    if m * n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                std::slice::from_raw_parts_mut(c.add(i * ldc), n).fill(0.0);
            }
        }
        return;
    }
    if few_rows(kernel, (m, k, n), c, ldc, a, b, accumulate, None) {
        return;
    }
    let shape = (m, k, n);
    match kernel {
        #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
        Bf16Kernel::Avx512Bf16 => block::<Avx512Bf16, A, B>(shape, c, ldc, a, b, accumulate),
        #[cfg(target_arch = "aarch64")]
        Bf16Kernel::ArmBf16 => block::<ArmBf16, A, B>(shape, c, ldc, a, b, accumulate),
        Bf16Kernel::Portable => block::<Portable, A, B>(shape, c, ldc, a, b, accumulate),
    }
}

/// `c (m, n)` (row stride `ldc`) `(+)= a (m, k) · b (k, n)` on the calling thread,
/// packing into this thread's scratch.
///
/// `B` is packed for a whole chunk of `k` at once (all of `k` unless that passes
/// [`MAX_PACKED_B`]), then each block of [`MC`] rows runs through the chunk's
/// blocks of [`KC`]: the block's output stays in L2 between them instead of
/// going out to memory and back once per block of `k`.
///
/// # Safety
/// The operands must address their shapes; `c` must be writable and alias neither;
/// the CPU must have `K`'s instructions.
unsafe fn block<K: Microkernel, A: Bf16Operand, B: Bf16Operand>(
    (m, k, n): (usize, usize, usize),
    c: *mut f32,
    ldc: usize,
    a: Operand<A>,
    b: Operand<B>,
    accumulate: bool,
) {
    let n_padded = n.next_multiple_of(K::NR);
    let chunk = (MAX_PACKED_B / (n_padded * KC / 2)).max(1) * KC;
    let chunk_pairs = chunk.min(k).div_ceil(2);
    let mc_max = MC.min(m).next_multiple_of(K::MR);
    let kp_max = KC.min(k).div_ceil(2);
    // B's columns as the rows of the packed panels: element (j, kk).
    let b_rows = Operand {
        ptr: b.ptr,
        rs: b.cs,
        cs: b.rs,
    };
    let a_layout = if a.cs == 1 {
        Layout::Rows
    } else {
        Layout::Panels(K::MR)
    };
    let b_size = n_padded * chunk_pairs.next_multiple_of(KC / 2);
    with_scratch::<u32, _>(b_size + mc_max * kp_max, |scratch| {
        let (b_pack, a_pack) = scratch.split_at_mut(b_size);
        for chunk0 in (0..k).step_by(chunk) {
            let chunk_end = (chunk0 + chunk).min(k);
            // Each block of KC values of k packed as its own panels, one after another.
            for k0 in (chunk0..chunk_end).step_by(KC) {
                let kc = KC.min(chunk_end - k0);
                let at = n_padded * (k0 - chunk0) / 2;
                let block = Block {
                    src: b_rows.at(0, k0),
                    rows: n,
                    kc,
                    padded_rows: n_padded,
                };
                K::pack(&mut b_pack[at..], Layout::Panels(K::NR), block);
            }
            // The blocks of A in the order they are packed: (first row, first of k).
            let a_blocks = (0..m)
                .step_by(MC)
                .flat_map(|i0| (chunk0..chunk_end).step_by(KC).map(move |k0| (i0, k0)));
            let mut next_blocks = a_blocks.clone().skip(1);
            for (i0, k0) in a_blocks {
                let mc = MC.min(m - i0);
                let mc_padded = mc.next_multiple_of(K::MR);
                let kc = KC.min(chunk_end - k0);
                let kp = kc.div_ceil(2);
                let block = Block {
                    src: a.at(i0, k0),
                    rows: mc,
                    kc,
                    padded_rows: mc_padded,
                };
                K::pack(a_pack, a_layout, block);
                let (a_rs, a_ps) = a_layout.strides(kp);
                let b_block = b_pack.as_ptr().add(n_padded * (k0 - chunk0) / 2);
                let accumulate = accumulate || k0 > 0;
                // The next block of A is fetched while this one is multiplied, so that
                // packing it does not wait for memory (A is often read from memory: an
                // LM head's gradient is the size of the logits).
                let tiles = n.div_ceil(K::NR) * mc.div_ceil(K::MR);
                let mut ahead = next_blocks.next().map(|(i1, k1)| {
                    Ahead::new(a.at(i1, k1), MC.min(m - i1), KC.min(chunk_end - k1), tiles)
                });
                for j0 in (0..n).step_by(K::NR) {
                    let b_panel = b_block.add(j0 * kp);
                    for r0 in (0..mc).step_by(K::MR) {
                        if let Some(ahead) = ahead.as_mut() {
                            ahead.step::<K>();
                        }
                        let tile = Tile {
                            kp,
                            a: a_pack.as_ptr().add(r0 * kp),
                            a_rs,
                            a_ps,
                            b: b_panel,
                        };
                        let c_tile = c.add((i0 + r0) * ldc + j0);
                        let (rows, cols) = (K::MR.min(mc - r0), K::NR.min(n - j0));
                        if rows == K::MR && cols == K::NR {
                            K::tile(tile, c_tile, ldc, accumulate);
                        } else {
                            edge_tile::<K>(tile, c_tile, ldc, accumulate, rows, cols);
                        }
                    }
                }
            }
        }
    });
}

/// The cache lines of a block of `A`, `rows × kc` values of an [`Operand`], fetched a
/// share per tile over the `tiles` micro-kernel calls before it is packed: the runs
/// along the dimension the operand is contiguous in, line by line.
struct Ahead {
    /// The next line to fetch: its run's first byte, and its offset in the run.
    run: *const u8,
    at: usize,
    /// Bytes between runs, bytes in a run.
    stride: usize,
    run_bytes: usize,
    /// Lines still to fetch, and per tile.
    left: usize,
    per_tile: usize,
}

impl Ahead {
    fn new<E>(src: Operand<E>, rows: usize, kc: usize, tiles: usize) -> Self {
        let size = size_of::<E>();
        let (runs, stride, run_bytes) = if src.cs == 1 {
            (rows, src.rs * size, kc * size)
        } else {
            (kc, src.cs * size, rows * size)
        };
        let lines = runs * run_bytes.div_ceil(64);
        Ahead {
            run: src.ptr.cast(),
            at: 0,
            stride,
            run_bytes,
            left: lines,
            per_tile: lines.div_ceil(tiles.max(1)),
        }
    }

    /// Fetches the next tile's share (counters, no division: this runs once per
    /// micro-kernel call).
    #[inline(always)]
    fn step<K: Microkernel>(&mut self) {
        let count = self.per_tile.min(self.left);
        self.left -= count;
        for _ in 0..count {
            K::prefetch(self.run.wrapping_add(self.at));
            self.at += 64;
            if self.at >= self.run_bytes {
                self.run = self.run.wrapping_add(self.stride);
                self.at = 0;
            }
        }
    }
}

/// Largest `MR × NR` of any kernel.
const MAX_TILE: usize = 8 * 32;

/// A tile at the output's edge (`rows × cols` of the kernel's `MR × NR` inside `c`):
/// computed whole in a buffer of its own (the packed operands are zero beyond the
/// edge), its inside copied out.
unsafe fn edge_tile<K: Microkernel>(
    tile_operands: Tile,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    rows: usize,
    cols: usize,
) {
    let mut tile = [0f32; MAX_TILE];
    assert!(K::MR * K::NR <= MAX_TILE, "tile larger than MAX_TILE");
    let row = |i: usize| i * K::NR..i * K::NR + cols;
    if accumulate {
        for i in 0..rows {
            tile[row(i)].copy_from_slice(std::slice::from_raw_parts(c.add(i * ldc), cols));
        }
    }
    K::tile(tile_operands, tile.as_mut_ptr(), K::NR, accumulate);
    for i in 0..rows {
        std::slice::from_raw_parts_mut(c.add(i * ldc), cols).copy_from_slice(&tile[row(i)]);
    }
}
