//! The work space of the GPU backend's kernels, sized here once for the kernels
//! that take it and for the memory accounting ([`crate::accounting`]): one buffer
//! per use ([`Scratch`]), grown to the largest request of a run, and cuBLASLt's.

/// A use of work space: one buffer each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scratch {
    /// RMSNorm gain-gradient partial sums `(ROW_BLOCKS, C)` ([`ROW_BLOCKS`]).
    NormGain,
    /// Per-row losses `(N)`.
    Losses,
    /// Sum-of-squares partials, [`NORM_BLOCKS`] of them.
    Squares,
}

/// What a [`Scratch`] buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScratchType {
    F32,
    F64,
}

impl Scratch {
    pub const ALL: [Scratch; 3] = [Scratch::NormGain, Scratch::Losses, Scratch::Squares];

    /// The type of its values: reductions are f32, the sum of squares f64.
    pub fn holds(self) -> ScratchType {
        match self {
            Scratch::NormGain | Scratch::Losses => ScratchType::F32,
            Scratch::Squares => ScratchType::F64,
        }
    }

    /// Its values for a kernel call over `extent`: the gain's width `C`
    /// (`NormGain`), the rows `N` (`Losses`); `Squares` holds a fixed count.
    pub fn len(self, extent: usize) -> usize {
        match self {
            Scratch::NormGain => ROW_BLOCKS * extent,
            Scratch::Losses => extent,
            Scratch::Squares => NORM_BLOCKS,
        }
    }

    /// Its bytes for a kernel call over `extent` (see [`Scratch::len`]).
    pub fn bytes(self, extent: usize) -> u64 {
        let width = match self.holds() {
            ScratchType::F32 => 4,
            ScratchType::F64 => 8,
        };
        width * self.len(extent) as u64
    }

    /// What it is, for the memory accounting's table.
    pub fn describe(self) -> (&'static str, &'static str) {
        match self {
            Scratch::NormGain => ("RMSNorm gain partial sums", "(ROW_BLOCKS, C)"),
            Scratch::Losses => ("per-row losses", "(B, T)"),
            Scratch::Squares => ("sum-of-squares partials (f64)", "(NORM_BLOCKS)"),
        }
    }
}

/// Row blocks of RMSNorm's backward at most (the first stage of its gain gradient):
/// its scratch is `(ROW_BLOCKS, C)` f32. About four blocks of 8 warps for each of
/// an H100's 132 SMs.
pub const ROW_BLOCKS: usize = 512;

/// Blocks of the sum of squares' first stage: fixed, so the summation order (and
/// the result) is the same every step. Its scratch is `NORM_BLOCKS` f64.
pub const NORM_BLOCKS: usize = 264;

/// cuBLASLt's workspace on a GPU of compute capability `major.x`: NVIDIA's
/// recommendation, 32 MiB on Hopper and newer, 4 MiB before.
pub const fn cublaslt_workspace_bytes(major: i32) -> usize {
    if major >= 9 {
        32 << 20
    } else {
        4 << 20
    }
}

/// The cuBLASLt workspace the memory accounting counts: the larger, Hopper's.
pub const CUBLASLT_WORKSPACE: usize = cublaslt_workspace_bytes(9);
