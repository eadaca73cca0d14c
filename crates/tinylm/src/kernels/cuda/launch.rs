//! Launch shapes of the kernel families and the checks their wrappers make.

use super::buffer::{DType, Dev};
use cudarc::driver::LaunchConfig;

/// Threads per block of the one-thread-per-element and one-warp-per-row kernels.
pub const BLOCK: u32 = 256;

/// A one-dimensional launch of `blocks` blocks of [`BLOCK`] threads.
pub(crate) fn grid(blocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread per element of `n`.
pub(crate) fn per_element(n: usize) -> LaunchConfig {
    grid(n.div_ceil(BLOCK as usize))
}

/// One warp per row of `rows`.
pub(crate) fn per_row_warp(rows: usize) -> LaunchConfig {
    grid(rows.div_ceil(BLOCK as usize / 32))
}

/// Bytes of one access of the kernels that read rows in packs (`PACK` in
/// `common.cuh`).
const PACK_BYTES: usize = 16;

/// Whether rows of `c` values of `dtype` in every buffer of `rows` can be read in
/// packs (`c` a multiple of the pack, every buffer 16-byte aligned), as the kernels'
/// `packed` argument, and the values a thread then takes at a time: a pack (8 bf16,
/// 4 f32), else 1.
pub(crate) fn packing(c: usize, dtype: DType, rows: impl IntoIterator<Item = Dev>) -> (i32, usize) {
    let width = PACK_BYTES / dtype.size();
    let aligned = (rows.into_iter()).all(|x| x.ptr % PACK_BYTES as u64 == 0);
    match c.is_multiple_of(width) && aligned {
        true => (1, width),
        false => (0, 1),
    }
}

/// Asserts that `x` holds at least `len` elements of `dtype`.
pub(crate) fn expect(x: Dev, len: usize, dtype: DType, what: &str) {
    assert!(
        x.len >= len && x.dtype == dtype,
        "{what}: {:?} x {} given, {dtype:?} x {len} needed",
        x.dtype,
        x.len
    );
}

/// Asserts that a kernel indexing `len` elements with 32-bit arithmetic can.
pub(crate) fn expect_u32(len: usize, what: &str) {
    assert!(
        u32::try_from(len).is_ok(),
        "{what}: {len} elements exceed the kernel's 32-bit indexing"
    );
}

/// A shape argument as the kernels' `int`.
pub(crate) fn int(x: usize) -> i32 {
    i32::try_from(x).expect("shape fits a CUDA int")
}
