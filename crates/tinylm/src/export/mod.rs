//! Conversion to the tools people already run: Hugging Face `transformers`
//! ([`hf`]: a `LlamaForCausalLM` directory, and back) and llama.cpp ([`gguf`]).
//!
//! tinylm's default architecture (pre-norm RMSNorm with eps 1e-5, SwiGLU, RoPE, no
//! biases, multi-head attention) is exactly Llama's, so the conversion is exact:
//! the tensors are renamed, and only the rows of `q_proj` and `k_proj` move, because
//! the two rotate different pairs of a head's channels (see [`permute_rope_rows`]).

pub mod gguf;
pub mod hf;

use crate::config::{Ffn, Norm, Positional};
use crate::{Error, ModelConfig, Result};
use tinylm_bpe::files::Bpe;

/// Refuses the ablations that have no Llama equivalent, naming the setting.
pub fn check_llama(config: &ModelConfig) -> Result<()> {
    let setting = if config.norm != Norm::Pre {
        format!("norm = {}", json(&config.norm))
    } else if config.positional != Positional::Rope {
        format!("positional = {} (NoPE)", json(&config.positional))
    } else if config.ffn != Ffn::Swiglu {
        format!("ffn = {}", json(&config.ffn))
    } else {
        return Ok(());
    };
    Err(Error::Config(format!(
        "the model has {setting}, which Llama cannot express: only norm = \"pre\", positional = \"rope\", ffn = \"swiglu\" (tied or not) export"
    )))
}

/// A config value as its JSON text (`"post"`).
fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("serializes")
}

/// Moves the rows of a query or key projection `(H·D, C)` between RoPE layouts.
///
/// tinylm (like Meta's Llama and llama.cpp) rotates adjacent channels `(2i, 2i+1)`
/// of a head by the angle of frequency `i`; `transformers` rotates the halves
/// `(i, i + D/2)` by the same angle. Putting each head's even rows first, then its
/// odd rows (`halves[i] = pairs[2i]`, `halves[D/2 + i] = pairs[2i + 1]`) makes the
/// projection's output in the halves layout the same permutation of tinylm's output,
/// before and after rotation, so every `q·k` is unchanged. `to_halves = false`
/// applies the inverse permutation.
pub fn permute_rope_rows(w: &[f32], d_in: usize, head_dim: usize, to_halves: bool) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; w.len()];
    for (head_in, head_out) in w
        .chunks_exact(head_dim * d_in)
        .zip(out.chunks_exact_mut(head_dim * d_in))
    {
        for i in 0..half {
            for (pair_row, half_row) in [(2 * i, i), (2 * i + 1, half + i)] {
                let (from, to) = match to_halves {
                    true => (pair_row, half_row),
                    false => (half_row, pair_row),
                };
                head_out[to * d_in..(to + 1) * d_in]
                    .copy_from_slice(&head_in[from * d_in..(from + 1) * d_in]);
            }
        }
    }
    out
}

/// Where a tensor goes: its name in `transformers`' Llama or in llama.cpp's GGUF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    Hf,
    Gguf,
}

/// A block's tensors: tinylm's name after `layers.{i}.`, then `transformers`' after
/// `model.layers.{i}.`, then llama.cpp's after `blk.{i}.`.
const LAYER_NAMES: [(&str, &str, &str); 9] = [
    ("ln1.weight", "input_layernorm.weight", "attn_norm.weight"),
    (
        "attn.q_proj.weight",
        "self_attn.q_proj.weight",
        "attn_q.weight",
    ),
    (
        "attn.k_proj.weight",
        "self_attn.k_proj.weight",
        "attn_k.weight",
    ),
    (
        "attn.v_proj.weight",
        "self_attn.v_proj.weight",
        "attn_v.weight",
    ),
    (
        "attn.output_proj.weight",
        "self_attn.o_proj.weight",
        "attn_output.weight",
    ),
    (
        "ln2.weight",
        "post_attention_layernorm.weight",
        "ffn_norm.weight",
    ),
    ("ffn.w1.weight", "mlp.gate_proj.weight", "ffn_gate.weight"),
    ("ffn.w2.weight", "mlp.down_proj.weight", "ffn_down.weight"),
    ("ffn.w3.weight", "mlp.up_proj.weight", "ffn_up.weight"),
];

/// The name of tinylm's tensor `name` (a [`crate::params::ParamLayout`] name) under `naming`.
pub fn rename(name: &str, naming: Naming) -> String {
    let pick = |hf: &str, gguf: &str| match naming {
        Naming::Hf => hf.to_string(),
        Naming::Gguf => gguf.to_string(),
    };
    match name {
        "token_embeddings.weight" => pick("model.embed_tokens.weight", "token_embd.weight"),
        "ln_final.weight" => pick("model.norm.weight", "output_norm.weight"),
        "lm_head.weight" => pick("lm_head.weight", "output.weight"),
        _ => {
            let rest = name.strip_prefix("layers.").expect("a layout name");
            let (layer, suffix) = rest.split_once('.').expect("a layout name");
            let (_, hf, gguf) = LAYER_NAMES
                .iter()
                .find(|(tinylm, _, _)| *tinylm == suffix)
                .expect("a layout name");
            match naming {
                Naming::Hf => format!("model.layers.{layer}.{hf}"),
                Naming::Gguf => format!("blk.{layer}.{gguf}"),
            }
        }
    }
}

/// Whether the tensor `name` is a query or key projection, whose rows RoPE pairs.
pub fn is_rope_projection(name: &str) -> bool {
    name.ends_with("attn.q_proj.weight") || name.ends_with("attn.k_proj.weight")
}

/// Checks the tokenizer `bpe` fits a model of `vocab_size` tokens.
pub fn check_fits(bpe: &Bpe, vocab_size: usize) -> Result<()> {
    if bpe.vocab.len() > vocab_size {
        return Err(Error::Invalid(format!(
            "the tokenizer has {} tokens but the model only {vocab_size}",
            bpe.vocab.len()
        )));
    }
    Ok(())
}
