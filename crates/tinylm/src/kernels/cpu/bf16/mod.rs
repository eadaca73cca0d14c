//! bf16 matrix products on the CPU: both operands rounded to bf16 (nearest, ties to
//! even), products summed in `f32`, written or accumulated into `f32` — what
//! PyTorch's CPU autocast does to a product — at the rate the CPU's bf16
//! instructions offer.
//!
//! [`round`] is the one rounding, [`element`] the bf16 buffers that store by it; [`pack`] the pair layouts the kernels read and the
//! [`Microkernel`](pack::Microkernel) interface; `avx512` (`vdpbf16ps`, x86-64), `neon`
//! (`bfdot`, aarch64) and [`portable`] (any CPU) implement it; [`matmul`] blocks, packs and
//! threads a product over one of them ([`matmul_bf16`], [`Bf16Kernel`]).

#[cfg(all(target_arch = "x86_64", feature = "avx512"))]
pub mod avx512;
pub mod element;
pub mod matmul;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod pack;
pub mod portable;
pub mod round;

pub use matmul::{matmul_bf16, matmul_bf16_on, matmul_bf16_view, Bf16Kernel};
pub use pack::Operand;
pub use round::{round_bf16, Bf16Operand};
