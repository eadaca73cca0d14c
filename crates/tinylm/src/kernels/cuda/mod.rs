//! The CUDA backend (cargo feature `cuda`): CUDA C kernels in this directory, one
//! file per kernel family with forward and backward side by side (the CPU twins are
//! in `kernels/cpu/`) and a launch wrapper beside each (`rmsnorm.cu` and
//! `rmsnorm.rs`, like llm.c's `.cuh`), compiled at run time by NVRTC for the
//! device's architecture and cached on disk; matrix products through cuBLASLt.
//! cudarc loads the driver, NVRTC and cuBLASLt with `dlopen`, so building needs no
//! CUDA toolkit, and a machine without them gets a clear error, not a panic.
//!
//! Precision ([`Precision`](crate::kernels::Precision)): activations and matmul
//! operands are `floatX` (bf16 or f32); master parameters, their gradients, AdamW
//! moments, RMSNorm statistics, RoPE tables and losses are f32.
//!
//! Beside the families: [`context`] (the device, its stream and compiled kernels),
//! [`buffer`] (device memory), [`launch`] (launch shapes and checks), [`nvrtc`]
//! (the families' sources and their compilation), [`blas`] (the cuBLASLt call) with
//! its launch wrapper [`matmul`], [`backend`] (the [`Backend`] over all of them),
//! and with the feature `nccl`, `collective` (the ranks' collectives over NCCL).
//!
//! [`Backend`]: crate::kernels::Backend

pub mod adamw;
pub mod attention;
pub mod backend;
pub mod blas;
pub mod buffer;
#[cfg(feature = "nccl")]
mod collective;
pub mod context;
pub mod convert;
pub mod cross_entropy;
pub mod embedding;
pub mod global_norm;
pub mod launch;
pub mod matmul;
pub mod nvrtc;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

pub use buffer::{CudaBuf, CudaIds, CudaStats, DType, Dev, DeviceBuffer, HostElement};
pub use context::{Cuda, CUBLASLT_LIBRARY, DRIVER_LIBRARY};
pub use nvrtc::{COMMON, FAMILIES};
