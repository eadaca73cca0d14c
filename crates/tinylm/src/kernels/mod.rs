//! The kernel layer: the interface the model orchestration is written against
//! ([`backend`]) and the backends that implement it.
//!
//! Every layer is a forward and a backward kernel, llm.c style: plain buffers in,
//! plain buffers out, shapes in the doc comments as `(B, T, C)` with `N = B·T` rows,
//! `C = d_model`, `F = d_ff`, `H` heads of `D = C / H` channels, `V = vocab_size`.
//! A weight matrix's gradient is written by its one product ([`MatMul::linear_dw`]);
//! the norm-gain and embedding kernels *accumulate* (`+=`) into theirs, so a tied
//! matrix receives the LM head's product and then the embedding's rows. Activation
//! gradients are written or accumulated as each signature says.
//!
//! [`Backend`] is the whole interface: [`model`](crate::model) runs forward and
//! backward only through it. The CPU backend ([`cpu::Cpu`]) implements it for any
//! [`Float`] (`f32` for real work, `f64` for the finite-difference gradient checks),
//! [`cpu::CpuMixed`] in bf16 mixed precision; [`Profiled`] wraps any backend to time
//! its kernels. The methods take spans of buffers the backend owns
//! ([`Allocator::Buf`]: a `Vec` on the CPU, device memory on
//! a GPU), so the orchestration is written once for every backend.
//!
//! The kernel layer is a leaf: of the crate above it, it imports only the error
//! type, the RMSNorm ε of [`config`](crate::config) and the ranks
//! ([`World`](crate::distributed::World)) the backends' collectives run over; the
//! model, the optimizer's host API and the training loop use it, never the reverse.

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod float;
pub mod kind;
pub mod profile;
pub mod workspace;

pub use backend::{
    clip_scale, AdamWParams, AdamWStep, Allocation, Allocator, AttentionKeeps, AttnShape, Backend,
    BatchPart, BufKind, Buffer, Collective, HostWrite, MatMul, ParamRead, ParamsInFile, Precision,
    Role, Span, SpanMut, StepStats, Stored, CLIP_EPS, STATS_BYTES,
};
pub use cpu::{Cpu, CpuMixed, HostBuf};
pub use float::Float;
pub use kind::{BackendKind, Storage, ValueType};
pub use profile::Profiled;
