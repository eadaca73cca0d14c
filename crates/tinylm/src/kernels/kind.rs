//! What a backend is, in one value: where its buffers live, the type each kind of
//! buffer holds (and, from it, what attention keeps for the backward pass:
//! `AttentionKeeps::of`). The backends allocate
//! by it ([`Allocator::kind`](super::Allocator::kind)), the memory accounting sizes
//! buffers by it, `tinylm info` reports it; which kind a device and a precision
//! name on this machine is decided once, by
//! [`device::backend_kind`](crate::device::backend_kind).
//!
//! A new precision is a new variant here (its [`BackendKind::storage`] row says
//! what it stores in which type), its kernels, and the line of
//! [`device::backend_kind`](crate::device::backend_kind) that chooses it.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A run's arithmetic, on the CPU and on a GPU alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bf16 where the hardware multiplies bf16 natively — a GPU (compute
    /// capability 8.0 or newer), a CPU with AVX512_BF16 or Arm BF16 — and `fp32`
    /// elsewhere ([`crate::device::backend_kind`]).
    #[default]
    Auto,
    /// Mixed precision: matrix products of bf16 operands (rounded to nearest, ties
    /// to even) summed in f32, bf16 copies of the weights and bf16 activations
    /// where only products read them (on a GPU, every activation); f32 master
    /// weights, gradients, AdamW moments, normalization statistics, softmax and loss.
    Bf16,
    /// f32 everywhere.
    Fp32,
    /// Generation with 8-bit weights (the CPU; not for training): llama.cpp's
    /// Q8_0 blocks (32 int8 values and an f16 scale) multiplied by activations
    /// quantized the same way, int8 products summed exactly per block; attention's
    /// products as under bf16, the rest in f32.
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl Precision {
    /// This precision, where it can train (q8_0 cannot: an error saying so).
    pub fn for_training(self) -> Result<Self> {
        match self {
            Precision::Q8_0 => Err(Error::Config(
                "precision q8_0 stores weights for generation (generate, serve, eval), \
                 not for training: use bf16 or fp32"
                    .into(),
            )),
            precision => Ok(precision),
        }
    }
}

impl FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Precision::Auto),
            "bf16" => Ok(Precision::Bf16),
            "fp32" => Ok(Precision::Fp32),
            "q8_0" => Ok(Precision::Q8_0),
            _ => Err(Error::Config(format!(
                "unknown precision '{s}': expected auto, bf16, fp32 or q8_0"
            ))),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Auto => "auto",
            Precision::Bf16 => "bf16",
            Precision::Fp32 => "fp32",
            Precision::Q8_0 => "q8_0",
        })
    }
}

/// How a backend stores a buffer it allocates. The orchestration names the role; a
/// mixed-precision backend picks the element type from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufKind {
    /// The parameters: `F` master values. A mixed-precision backend also keeps a
    /// bf16 copy for matrix-product operands, refreshed by every write
    /// ([`Backend::upload`](super::Backend::upload),
    /// [`Backend::adamw`](super::Backend::adamw), a collective's gather).
    Params,
    /// Activations and their gradients that kernels other than the products read
    /// (the residual stream, attention's, the FFN's pre-activations, the logits):
    /// bf16 on a GPU under bf16 (its kernels compute on bf16 values), `F` on the CPU
    /// (its element-wise kernels read and write `f32`).
    Activations,
    /// Activations the backward pass reads only as matrix-product operands (the
    /// norms' outputs, the FFN's gated product, the gradients of its
    /// pre-activations): bf16 under bf16 on every backend, which halves their
    /// memory and loses nothing the products would not round away.
    Operands,
    /// A KV cache, which only attention's products read: bf16 wherever those are
    /// bf16 (on the CPU under bf16 or Q8_0 weights, on a GPU under bf16), which
    /// halves its memory and the bytes a decoding step reads, and loses nothing.
    Cache,
    /// Always full precision: parameter gradients, AdamW moments, RMSNorm
    /// statistics, RoPE tables.
    Full,
}

/// A backend: the CPU in f32, in bf16 mixed precision or with 8-bit weights for
/// generation, or a GPU in fp32 or bf16 (`auto` already resolved).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// Host memory, f32 throughout.
    #[default]
    Cpu,
    /// Host memory under bf16 mixed precision: the activations only products read
    /// ([`BufKind::Operands`]) and the KV cache in bf16, the parameters f32 with a
    /// bf16 copy, the rest f32.
    CpuBf16,
    /// Host memory for generation with 8-bit weights (`q8_0`): the parameters f32
    /// with a copy in Q8_0 blocks, the KV cache bf16, every other activation f32.
    CpuQ8,
    /// A GPU's memory in [`Precision::Fp32`] or [`Precision::Bf16`]: activations in
    /// the precision's width, parameters, gradients, moments and normalization
    /// statistics f32, and under bf16 a bf16 copy of the parameters for the products.
    Cuda(Precision),
}

/// Bytes of a step's statistics on a device: the loss (f32, then 4 bytes of
/// padding) and the gradient's sum of squares (f64).
pub const STATS_BYTES: usize = 16;

/// Values of a Q8_0 block (ggml's `QK8_0`), which share one f16 scale.
pub const Q8_0_BLOCK: usize = 32;

/// The type a buffer's values are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    F32,
    Bf16,
    /// llama.cpp's Q8_0 blocks: 32 int8 values and an f16 scale.
    Q8_0,
}

impl ValueType {
    /// Bytes of `len` values.
    pub fn bytes(self, len: usize) -> u64 {
        match self {
            ValueType::F32 => 4 * len as u64,
            ValueType::Bf16 => 2 * len as u64,
            // Per block of 32 values, 32 int8 values and an f16 scale.
            ValueType::Q8_0 => (len.div_ceil(Q8_0_BLOCK) * (Q8_0_BLOCK + 2)) as u64,
        }
    }
}

/// How a backend stores a buffer of one [`BufKind`]: its values, and for the
/// parameters a copy of them that the matrix products read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Storage {
    pub values: ValueType,
    pub copy: Option<ValueType>,
}

impl Storage {
    /// Bytes of a buffer of `len` values, its copy included.
    pub fn bytes(self, len: usize) -> u64 {
        self.values.bytes(len) + self.copy.map_or(0, |copy| copy.bytes(len))
    }
}

impl BackendKind {
    /// How it stores a buffer of `kind`.
    pub fn storage(self, kind: BufKind) -> Storage {
        use ValueType::*;
        let (values, copy) = match (self, kind) {
            (_, BufKind::Full) | (BackendKind::Cpu | BackendKind::Cuda(Precision::Fp32), _) => {
                (F32, None)
            }
            (BackendKind::CpuBf16 | BackendKind::Cuda(_), BufKind::Params) => (F32, Some(Bf16)),
            (BackendKind::CpuQ8, BufKind::Params) => (F32, Some(Q8_0)),
            (BackendKind::CpuBf16 | BackendKind::CpuQ8, BufKind::Activations) => (F32, None),
            (BackendKind::CpuQ8, BufKind::Operands) => (F32, None),
            (_, BufKind::Activations | BufKind::Operands | BufKind::Cache) => (Bf16, None),
        };
        Storage { values, copy }
    }

    /// Whether its buffers are a GPU's (else host memory).
    pub fn on_gpu(self) -> bool {
        matches!(self, BackendKind::Cuda(_))
    }

    /// The precision it computes in.
    pub fn precision(self) -> Precision {
        match self {
            BackendKind::Cpu => Precision::Fp32,
            BackendKind::CpuBf16 => Precision::Bf16,
            BackendKind::CpuQ8 => Precision::Q8_0,
            BackendKind::Cuda(precision) => precision,
        }
    }

    /// Bytes of device memory a step's statistics take ([`STATS_BYTES`] on a GPU;
    /// the CPU holds them inline).
    pub fn stats_bytes(self) -> u64 {
        match self.on_gpu() {
            false => 0,
            true => STATS_BYTES as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_carry_the_copy_products_read() {
        let params = |kind: BackendKind| kind.storage(BufKind::Params).bytes(64);
        assert_eq!(params(BackendKind::Cpu), 256);
        assert_eq!(params(BackendKind::CpuBf16), 256 + 128);
        assert_eq!(params(BackendKind::Cuda(Precision::Bf16)), 256 + 128);
        assert_eq!(params(BackendKind::Cuda(Precision::Fp32)), 256);
        // Two blocks of 32 int8 values and an f16 scale.
        assert_eq!(params(BackendKind::CpuQ8), 256 + 2 * 34);
        let cache = |kind: BackendKind| kind.storage(BufKind::Cache).values;
        assert_eq!(cache(BackendKind::CpuQ8), ValueType::Bf16);
        assert_eq!(cache(BackendKind::Cpu), ValueType::F32);
        let operands = |kind: BackendKind| kind.storage(BufKind::Operands).values;
        assert_eq!(operands(BackendKind::CpuBf16), ValueType::Bf16);
        assert_eq!(operands(BackendKind::CpuQ8), ValueType::F32);
        let activations = |kind: BackendKind| kind.storage(BufKind::Activations).values;
        assert_eq!(activations(BackendKind::CpuBf16), ValueType::F32);
        assert_eq!(
            activations(BackendKind::Cuda(Precision::Bf16)),
            ValueType::Bf16
        );
    }
}
