//! llama.cpp: a GGUF v3 file of the `llama` architecture with the GPT-2 tokenizer.
//!
//! Layout (little-endian): `GGUF`, version 3, the tensor and key counts, the
//! key-value pairs, one info per tensor (name, dimensions fastest-first, type, offset
//! into the data), padding to [`ALIGNMENT`], then each tensor's data, aligned.
//!
//! RoPE: llama.cpp's `llama` architecture rotates adjacent pairs (`LLAMA_ROPE_TYPE_NORM`)
//! and expects Q/K weights in Meta's original row order — its `convert_hf_to_gguf.py`
//! undoes `transformers`' halves permutation. That is tinylm's own order, so the
//! rows are stored as they are.

use super::{check_fits, check_llama, rename, Naming};
use crate::config::RMS_NORM_EPS;
use crate::files::write_file;
use crate::kernels::cpu::q8::{self, quantize_block};
use crate::params::ParamLayout;
use crate::{Error, ModelConfig, Result};
use std::io::Write;
use std::path::Path;
use tinylm_bpe::files::Bpe;
use tinylm_bpe::pretokenize::Pattern;

/// `general.alignment`'s default, which llama.cpp assumes when the key is absent.
pub const ALIGNMENT: usize = 32;

/// How a tensor's values are stored: the ggml types tinylm writes, as llama.cpp's
/// `convert_hf_to_gguf.py --outtype f32|f16|bf16|q8_0` stores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufDtype {
    F32,
    F16,
    /// bfloat16: an `f32` rounded to its upper 16 bits, to nearest, ties to even
    /// (ggml's `ggml_compute_fp32_to_bf16`; a NaN stays a quiet NaN).
    Bf16,
    /// Blocks of [`Q8_0_BLOCK`] values along a row: see [`quantize_q8_0`].
    Q8_0,
}

/// Values per Q8_0 block (ggml's `QK8_0`).
pub const Q8_0_BLOCK: usize = q8::BLOCK;

/// Bytes of one Q8_0 block: an f16 scale and 32 int8 values.
const Q8_0_BLOCK_BYTES: usize = 2 + Q8_0_BLOCK;

impl GgufDtype {
    /// The ggml type id: `GGML_TYPE_F32` = 0, `F16` = 1, `Q8_0` = 8, `BF16` = 30.
    pub fn ggml_type(self) -> u32 {
        match self {
            GgufDtype::F32 => 0,
            GgufDtype::F16 => 1,
            GgufDtype::Q8_0 => 8,
            GgufDtype::Bf16 => 30,
        }
    }

    /// `general.file_type` of a file whose matrices are stored so: `ALL_F32` = 0,
    /// `MOSTLY_F16` = 1, `MOSTLY_Q8_0` = 7, `MOSTLY_BF16` = 32.
    pub fn file_type(self) -> u32 {
        match self {
            GgufDtype::F32 => 0,
            GgufDtype::F16 => 1,
            GgufDtype::Q8_0 => 7,
            GgufDtype::Bf16 => 32,
        }
    }

    /// How a file of this type stores the tensor of `shape` (row-major, PyTorch
    /// order), as llama.cpp's converter decides: 1-D tensors (the RMSNorm gains) in
    /// f32; a matrix whose rows do not split into Q8_0 blocks in f16 (the
    /// converter's fallback); every other matrix, the token embedding and the
    /// output layer included, in this type.
    pub fn for_tensor(self, shape: &[usize]) -> GgufDtype {
        let row = shape.last().copied().unwrap_or(1);
        match self {
            _ if shape.len() <= 1 => GgufDtype::F32,
            GgufDtype::Q8_0 if !row.is_multiple_of(Q8_0_BLOCK) => GgufDtype::F16,
            dtype => dtype,
        }
    }

    /// Bytes that `n` values take (a whole number of blocks for Q8_0).
    fn bytes(self, n: usize) -> usize {
        match self {
            GgufDtype::F32 => 4 * n,
            GgufDtype::F16 | GgufDtype::Bf16 => 2 * n,
            GgufDtype::Q8_0 => n / Q8_0_BLOCK * Q8_0_BLOCK_BYTES,
        }
    }

    /// `values` as this type's little-endian bytes.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            GgufDtype::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            GgufDtype::F16 => (values.iter())
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            GgufDtype::Bf16 => (values.iter())
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            GgufDtype::Q8_0 => quantize_q8_0(values),
        }
    }
}

/// `values` (a whole number of blocks of [`Q8_0_BLOCK`]) as Q8_0 blocks: each an
/// f16 scale and 32 int8 values ([`quantize_block`], ggml's
/// `quantize_row_q8_0_ref`), as GGUF stores them.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    assert!(
        values.len().is_multiple_of(Q8_0_BLOCK),
        "Q8_0 quantizes whole blocks of {Q8_0_BLOCK} values"
    );
    let mut out = Vec::with_capacity(GgufDtype::Q8_0.bytes(values.len()));
    let mut q = [0i8; Q8_0_BLOCK];
    for block in values.chunks_exact(Q8_0_BLOCK) {
        out.extend(quantize_block(block, &mut q).to_le_bytes());
        out.extend(q.map(|q| q as u8));
    }
    out
}

/// llama.cpp's token types.
pub const TOKEN_NORMAL: i32 = 1;
pub const TOKEN_CONTROL: i32 = 3;
pub const TOKEN_UNUSED: i32 = 5;

/// A metadata value (the GGUF value types tinylm writes).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    I32s(Vec<i32>),
    Strs(Vec<String>),
}

impl Value {
    /// The GGUF type id: UINT32 4, FLOAT32 6, BOOL 7, STRING 8, ARRAY 9.
    fn type_id(&self) -> u32 {
        match self {
            Value::U32(_) => 4,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::I32s(_) | Value::Strs(_) => 9,
        }
    }

    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        match self {
            Value::U32(x) => w.write_all(&x.to_le_bytes()),
            Value::F32(x) => w.write_all(&x.to_le_bytes()),
            Value::Bool(x) => w.write_all(&[*x as u8]),
            Value::Str(s) => write_str(w, s),
            Value::I32s(xs) => {
                w.write_all(&5u32.to_le_bytes())?; // INT32
                w.write_all(&(xs.len() as u64).to_le_bytes())?;
                xs.iter().try_for_each(|x| w.write_all(&x.to_le_bytes()))
            }
            Value::Strs(xs) => {
                w.write_all(&8u32.to_le_bytes())?; // STRING
                w.write_all(&(xs.len() as u64).to_le_bytes())?;
                xs.iter().try_for_each(|s| write_str(w, s))
            }
        }
    }
}

fn write_str(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

/// The metadata of the model: the `llama` keys and the GPT-2 tokenizer. Token ids the
/// tokenizer lacks (a model vocabulary larger than its tokenizer) become unused
/// `[PAD<id>]` tokens, as in llama.cpp's converter, so the token list matches the
/// embedding's rows.
pub fn metadata(config: &ModelConfig, tokenizer: &Bpe, dtype: GgufDtype) -> Vec<(String, Value)> {
    let n = tokenizer.vocab.len() as u32;
    let (tokens, types): (Vec<String>, Vec<i32>) = (0..config.vocab_size as u32)
        .map(|id| match (id < n, id < n && tokenizer.is_special(id)) {
            (true, true) => (tokenizer.spelled(id), TOKEN_CONTROL),
            (true, false) => (tokenizer.spelled(id), TOKEN_NORMAL),
            (false, _) => (format!("[PAD{id}]"), TOKEN_UNUSED),
        })
        .unzip();
    let u32_of = |x: usize| Value::U32(x as u32);
    let mut kv = vec![
        ("general.architecture", Value::Str("llama".into())),
        ("general.name", Value::Str("tinylm".into())),
        ("general.file_type", Value::U32(dtype.file_type())),
        ("general.alignment", u32_of(ALIGNMENT)),
        ("llama.vocab_size", u32_of(config.vocab_size)),
        ("llama.context_length", u32_of(config.context_length)),
        ("llama.embedding_length", u32_of(config.d_model)),
        ("llama.block_count", u32_of(config.num_layers)),
        ("llama.feed_forward_length", u32_of(config.d_ff)),
        ("llama.attention.head_count", u32_of(config.num_heads)),
        ("llama.attention.head_count_kv", u32_of(config.num_heads)),
        ("llama.rope.dimension_count", u32_of(config.head_dim())),
        ("llama.rope.freq_base", Value::F32(config.rope_theta as f32)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(RMS_NORM_EPS as f32),
        ),
        ("tokenizer.ggml.model", Value::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Value::Str("gpt-2".into())),
        ("tokenizer.ggml.tokens", Value::Strs(tokens)),
        ("tokenizer.ggml.token_type", Value::I32s(types)),
        (
            "tokenizer.ggml.merges",
            Value::Strs(tokenizer.spelled_merges()),
        ),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ("tokenizer.ggml.add_eos_token", Value::Bool(false)),
    ];
    if let Some(eot) = tokenizer.end_of_text() {
        kv.push(("tokenizer.ggml.bos_token_id", Value::U32(eot)));
        kv.push(("tokenizer.ggml.eos_token_id", Value::U32(eot)));
    }
    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Refuses a tokenizer whose split pattern is not GPT-2's: the file names its
/// pre-tokenizer `gpt-2` (`tokenizer.ggml.pre`), and llama.cpp would split differently.
pub fn check_pattern(tokenizer: &Bpe) -> Result<()> {
    match tokenizer.pattern {
        Pattern::Gpt2 => Ok(()),
        ref other => Err(Error::Invalid(format!(
            "llama.cpp export supports the gpt2 split pattern; this tokenizer uses {}",
            match other {
                Pattern::Custom(_) => format!("the custom pattern {:?}", other.regex()),
                named => named.name().to_string(),
            }
        ))),
    }
}

/// Writes the GGUF file `out` (through a temporary file renamed into place) for the
/// model `(config, params)` and its tokenizer. Tensors take llama.cpp's names
/// (`token_embd`, `blk.N.attn_q`, …, `output_norm`, `output`; no `output` when the
/// embeddings are tied, llama.cpp then reuses `token_embd`).
pub fn export(
    config: &ModelConfig,
    params: &[f32],
    tokenizer: &Bpe,
    out: &Path,
    dtype: GgufDtype,
) -> Result<()> {
    check_llama(config)?;
    check_fits(tokenizer, config.vocab_size)?;
    check_pattern(tokenizer)?;
    let layout = ParamLayout::new(config);
    let kv = metadata(config, tokenizer, dtype);
    // (name, dims fastest-first, dtype, values)
    let tensors: Vec<(String, Vec<u64>, GgufDtype, &[f32])> = layout
        .specs
        .iter()
        .map(|s| {
            let dims = s.shape.iter().rev().map(|&d| d as u64).collect();
            (
                rename(&s.name, Naming::Gguf),
                dims,
                dtype.for_tensor(&s.shape),
                &params[s.range()],
            )
        })
        .collect();
    write_file(out, |w| -> std::io::Result<()> {
        w.write_all(b"GGUF")?;
        w.write_all(&3u32.to_le_bytes())?;
        w.write_all(&(tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(kv.len() as u64).to_le_bytes())?;
        let mut header_len = 24;
        let mut counted = CountingWriter { inner: w, count: 0 };
        for (key, value) in &kv {
            write_str(&mut counted, key)?;
            counted.write_all(&value.type_id().to_le_bytes())?;
            value.write(&mut counted)?;
        }
        let mut offset = 0usize;
        for (name, dims, dtype, values) in &tensors {
            write_str(&mut counted, name)?;
            counted.write_all(&(dims.len() as u32).to_le_bytes())?;
            dims.iter()
                .try_for_each(|d| counted.write_all(&d.to_le_bytes()))?;
            counted.write_all(&dtype.ggml_type().to_le_bytes())?;
            counted.write_all(&(offset as u64).to_le_bytes())?;
            offset = align(offset + dtype.bytes(values.len()));
        }
        header_len += counted.count;
        let w = counted.inner;
        w.write_all(&vec![0u8; align(header_len) - header_len])?;
        for (_, _, dtype, values) in &tensors {
            let bytes = dtype.encode(values);
            w.write_all(&bytes)?;
            w.write_all(&vec![0u8; align(bytes.len()) - bytes.len()])?;
        }
        Ok(())
    })
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Counts the bytes written through it (the header's length decides its padding).
struct CountingWriter<W> {
    inner: W,
    count: usize,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
