//! The CPU backend: every kernel multi-threaded with rayon (the global pool, sized
//! by `--threads`), matrix products through the `gemm` crate.
//!
//! One file per kernel family, forward and backward side by side with their
//! derivations; [`backend`] implements the [`Backend`](crate::kernels::Backend)
//! over them, [`simd`] holds the vector code they share and [`memory`] the buffers.

pub mod adamw;
pub mod attention;
pub mod backend;
pub mod bf16;
#[cfg(feature = "mpi")]
mod collective;
pub mod cross_entropy;
pub mod embedding;
pub mod global_norm;
pub mod linear;
pub mod memory;
pub mod rmsnorm;
pub mod rope;
pub mod simd;
pub mod softmax;
pub mod swiglu;

pub use backend::Cpu;
