//! The CUDA backend (cargo feature `cuda`): CUDA C kernels in this directory, one
//! file per kernel family with forward and backward side by side (the CPU twins are
//! in `kernels/cpu/`), compiled at run time by NVRTC for the device's architecture.
//! cudarc loads the driver, NVRTC and cuBLASLt with `dlopen`, so building needs no
//! CUDA toolkit.

pub mod nvrtc;

pub use nvrtc::Precision;

/// The header prepended to every family: `floatX`, conversions, reductions.
pub const COMMON: &str = include_str!("common.cuh");

/// Every kernel family: its name (the file stem) and its CUDA C source.
pub const FAMILIES: &[(&str, &str)] = &[
    ("adamw", include_str!("adamw.cu")),
    ("attention", include_str!("attention.cu")),
    ("convert", include_str!("convert.cu")),
    ("cross_entropy", include_str!("cross_entropy.cu")),
    ("embedding", include_str!("embedding.cu")),
    ("global_norm", include_str!("global_norm.cu")),
    ("rmsnorm", include_str!("rmsnorm.cu")),
    ("rope", include_str!("rope.cu")),
    ("swiglu", include_str!("swiglu.cu")),
];
