//! The work space of the GPU backend's kernels, sized here once for the kernels
//! that take it and for the memory accounting ([`crate::accounting`]): one buffer
//! per use ([`Scratch`]), grown to the largest request of a run, and cuBLASLt's.

use super::AttnShape;

/// A use of work space: one buffer each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scratch {
    /// Attention's backward: heads of q, k, v and of their gradients
    /// ([`attention_scratch_len`]).
    Attention,
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
    /// The activations' type (bf16 under mixed precision).
    Activations,
    F32,
    F64,
}

impl Scratch {
    pub const ALL: [Scratch; 4] = [
        Scratch::Attention,
        Scratch::NormGain,
        Scratch::Losses,
        Scratch::Squares,
    ];

    /// The type of its values: reductions are f32, the sum of squares f64.
    pub fn holds(self) -> ScratchType {
        match self {
            Scratch::Attention => ScratchType::Activations,
            Scratch::NormGain | Scratch::Losses => ScratchType::F32,
            Scratch::Squares => ScratchType::F64,
        }
    }

    /// What it is, for the memory accounting's table.
    pub fn describe(self) -> (&'static str, &'static str) {
        match self {
            Scratch::Attention => ("attention heads and gradients", "7 × (B, T, C)"),
            Scratch::NormGain => ("RMSNorm gain partial sums", "(ROW_BLOCKS, C)"),
            Scratch::Losses => ("per-row losses", "(B, T)"),
            Scratch::Squares => ("sum-of-squares partials (f64)", "(NORM_BLOCKS)"),
        }
    }
}

/// Row blocks of RMSNorm's gain-gradient first stage: its scratch is
/// `(ROW_BLOCKS, C)` f32.
pub const ROW_BLOCKS: usize = 128;

/// Blocks of the sum of squares' first stage: fixed, so the summation order (and
/// the result) is the same every step. Its scratch is `NORM_BLOCKS` f64.
pub const NORM_BLOCKS: usize = 264;

/// Scratch elements attention's backward needs for shape `s`: the heads of `q`,
/// `k`, `v` and of their gradients `(3, B, H, T, D)` each, and one `(B, H, T, D)`.
/// (The forward is one kernel that reads the fused rows and takes none.)
pub fn attention_scratch_len(s: AttnShape) -> usize {
    7 * s.b * s.t * s.c()
}

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
