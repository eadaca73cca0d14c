//! Hugging Face `transformers`: a `LlamaForCausalLM` directory that
//! `AutoModelForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)`
//! load as they are, and the reverse.
//!
//! The directory holds `config.json` (every field Llama needs, written explicitly),
//! `model.safetensors` (Llama's tensor names, `{"format": "pt"}` metadata; `q_proj`
//! and `k_proj` rows in the halves RoPE layout, see [`super::permute_rope_rows`]),
//! `tokenizer.json` (byte-level BPE: GPT-2 pre-tokenizer and decoder, the merges,
//! the special tokens as added tokens), `tokenizer_config.json`
//! (`PreTrainedTokenizerFast`, so no Llama tokenizer class replaces the byte-level
//! pre-tokenizer) and `generation_config.json` (tinylm's sampling defaults).

use super::{check_fits, check_llama, is_rope_projection, permute_rope_rows, rename, Naming};
use crate::config::RMS_NORM_EPS;
use crate::files::write_dir;
use crate::generate::Sampling;
use crate::params::{layout_for_file, ParamLayout};
use crate::safetensors_io::{load_safetensors, save_safetensors};
use crate::{Error, ModelConfig, Result};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;
use tinylm_bpe::files::{self, Bpe};

/// Writes the `transformers` directory `out` for the model `(config, params)` and its
/// tokenizer. `out` must not exist or be empty; it appears only once complete.
pub fn export(config: &ModelConfig, params: &[f32], tokenizer: &Bpe, out: &Path) -> Result<()> {
    check_llama(config)?;
    check_fits(tokenizer, config.vocab_size)?;
    let layout = ParamLayout::new(config);
    let permuted: Vec<Vec<f32>> = layout
        .specs
        .iter()
        .map(|s| match is_rope_projection(&s.name) {
            true => permute_rope_rows(&params[s.range()], s.shape[1], config.head_dim(), true),
            false => Vec::new(),
        })
        .collect();
    let tensors: Vec<(String, Vec<usize>, &[f32])> = layout
        .specs
        .iter()
        .zip(&permuted)
        .map(|(s, p)| {
            let values = match is_rope_projection(&s.name) {
                true => p.as_slice(),
                false => &params[s.range()],
            };
            (rename(&s.name, Naming::Hf), s.shape.clone(), values)
        })
        .collect();
    let eot = tokenizer.end_of_text();
    let tokenizer_json = files::hf::to_json(tokenizer)?;
    let files = [
        ("config.json", config_json(config, eot)),
        ("tokenizer.json", tokenizer_json),
        (
            "tokenizer_config.json",
            tokenizer_config_json(config, tokenizer),
        ),
        ("generation_config.json", generation_config_json(eot)),
    ];
    write_dir(out, |dir| {
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        save_safetensors(&dir.join("model.safetensors"), &tensors, &meta)?;
        for (name, value) in &files {
            let path = dir.join(name);
            let text = serde_json::to_string_pretty(value).expect("serializes") + "\n";
            std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    })
}

/// `config.json` of `LlamaForCausalLM`, every field written (Llama's defaults differ
/// from tinylm's, e.g. `rms_norm_eps` 1e-6). `rope_theta` appears both as the legacy
/// key and in `rope_parameters` (transformers ≥ 5).
fn config_json(c: &ModelConfig, eot: Option<u32>) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_heads,
        "head_dim": c.head_dim(),
        "hidden_act": "silu",
        "max_position_embeddings": c.context_length,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": c.rope_theta,
        "rope_scaling": null,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "pretraining_tp": 1,
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": null,
        "initializer_range": 0.02,
        "use_cache": true,
        "torch_dtype": "float32",
    })
}

fn tokenizer_config_json(c: &ModelConfig, t: &Bpe) -> Value {
    let eot = t.end_of_text().map(|id| t.spelled(id));
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eot,
        "eos_token": eot,
        "add_bos_token": false,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": c.context_length,
    })
}

/// `tinylm generate`'s sampling defaults ([`Sampling::DEFAULT`]).
fn generation_config_json(eot: Option<u32>) -> Value {
    json!({
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "do_sample": true,
        "temperature": Sampling::DEFAULT.temperature,
        "top_p": Sampling::DEFAULT.top_p,
    })
}

/// A model read from a `transformers` directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    pub config: ModelConfig,
    /// The flat parameter buffer in [`ParamLayout`] order.
    pub params: Vec<f32>,
    /// The directory's `tokenizer.json`, when it has one.
    pub tokenizer: Option<Bpe>,
}

/// Reads a `LlamaForCausalLM` directory of a shape tinylm runs: multi-head attention
/// (no grouped keys), no biases, SiLU, RMSNorm eps 1e-5, plain RoPE, one
/// `model.safetensors`, a byte-level BPE `tokenizer.json` or none. Anything else is
/// refused with an error naming the field or tensor.
pub fn import(dir: &Path) -> Result<Imported> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(Error::Invalid(format!(
            "{}: no config.json: expected a Hugging Face LlamaForCausalLM directory",
            dir.display()
        )));
    }
    let config = read_config(&config_path)?;
    let weights_path = dir.join("model.safetensors");
    if !weights_path.is_file() {
        let found = ["model.safetensors.index.json", "pytorch_model.bin"]
            .iter()
            .find(|f| dir.join(f).exists())
            .map_or(String::new(), |f| {
                format!(" (it has {f}: only a single model.safetensors is read)")
            });
        return Err(Error::Invalid(format!(
            "{}: no model.safetensors{found}",
            dir.display()
        )));
    }
    let (mut tensors, _) = load_safetensors(&weights_path)?;
    let layout = layout_for_file(&config, tensors.len(), &weights_path)?;
    let names: Vec<String> = (layout.specs.iter())
        .map(|spec| rename(&spec.name, Naming::Hf))
        .collect();
    // Every tensor is checked before the model is allocated, so that a config.json
    // claiming a larger model than the file holds costs nothing.
    let mut problems: Vec<String> = (layout.specs.iter().zip(&names))
        .filter_map(|(spec, name)| match tensors.get(name) {
            None => Some(format!("missing tensor '{name}' of shape {:?}", spec.shape)),
            Some((shape, _)) if *shape != spec.shape => Some(format!(
                "tensor '{name}' has shape {shape:?}, expected {:?}",
                spec.shape
            )),
            Some(_) => None,
        })
        .collect();
    // Tied: a saved `lm_head.weight` must be the embedding matrix itself (below).
    let tied_head = config.tie_embeddings.then_some("lm_head.weight");
    problems.extend(
        (tensors.keys())
            .filter(|name| !names.contains(name) && Some(name.as_str()) != tied_head)
            .map(|name| {
                format!("unexpected tensor '{name}' (tinylm has no biases or extra weights)")
            }),
    );
    let refuse = |problems: &[String]| {
        Error::Invalid(format!(
            "{}: {}",
            weights_path.display(),
            problems.join("; ")
        ))
    };
    if !problems.is_empty() {
        return Err(refuse(&problems));
    }
    let mut params = vec![0f32; layout.total];
    for (spec, name) in layout.specs.iter().zip(&names) {
        let (_, values) = tensors.remove(name).expect("checked above");
        let values = match is_rope_projection(&spec.name) {
            true => permute_rope_rows(&values, spec.shape[1], config.head_dim(), false),
            false => values,
        };
        params[spec.range()].copy_from_slice(&values);
    }
    if let Some((_, values)) = tied_head.and_then(|name| tensors.remove(name)) {
        if values[..] != params[layout.token_embeddings.clone()] {
            return Err(refuse(&[
                "tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight".into(),
            ]));
        }
    }
    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer = match tokenizer_path.is_file() {
        true => {
            let t = files::hf::load(&tokenizer_path)?;
            check_fits(&t, config.vocab_size)
                .map_err(|e| Error::Invalid(format!("{}: {e}", tokenizer_path.display())))?;
            Some(t)
        }
        false => None,
    };
    Ok(Imported {
        config,
        params,
        tokenizer,
    })
}

/// A `config.json` field, `default` when absent or null.
fn field<'a>(obj: &'a Map<String, Value>, key: &str, default: &'a Value) -> &'a Value {
    obj.get(key).filter(|v| !v.is_null()).unwrap_or(default)
}

/// The tinylm config of a Llama `config.json`, or an error naming the field at fault.
fn read_config(path: &Path) -> Result<ModelConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid(format!("{}: invalid JSON: {e}", path.display())))?;
    let obj = value
        .as_object()
        .ok_or_else(|| Error::Invalid(format!("{}: not a JSON object", path.display())))?;
    let refuse =
        |key: &str, why: String| Err(Error::Invalid(format!("{}: {key}: {why}", path.display())));
    let null = Value::Null;
    let is_llama = field(obj, "model_type", &null) == "llama"
        || field(obj, "architectures", &null)
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "LlamaForCausalLM"));
    if !is_llama {
        return refuse(
            "model_type",
            format!(
                "{} is not \"llama\" (only LlamaForCausalLM models are imported)",
                field(obj, "model_type", &null)
            ),
        );
    }
    let count = |key: &str| -> Result<usize> {
        match obj.get(key).and_then(Value::as_u64) {
            Some(n) if n > 0 => Ok(n as usize),
            _ => Err(Error::Invalid(format!(
                "{}: {key}: expected a positive integer, found {}",
                path.display(),
                field(obj, key, &null)
            ))),
        }
    };
    let (d_model, num_heads) = (count("hidden_size")?, count("num_attention_heads")?);
    let kv_heads = field(obj, "num_key_value_heads", &json!(num_heads)).clone();
    if kv_heads != json!(num_heads) {
        return refuse(
            "num_key_value_heads",
            format!("{kv_heads} differs from num_attention_heads {num_heads}: tinylm has multi-head attention only"),
        );
    }
    if d_model % num_heads != 0 {
        return refuse(
            "hidden_size",
            format!("{d_model} is not divisible by num_attention_heads {num_heads}"),
        );
    }
    let head_dim = json!(d_model / num_heads);
    if *field(obj, "head_dim", &head_dim) != head_dim {
        return refuse(
            "head_dim",
            format!(
                "{} is not hidden_size / num_attention_heads = {head_dim}",
                field(obj, "head_dim", &null)
            ),
        );
    }
    for (key, expected, default) in [
        ("hidden_act", json!("silu"), json!("silu")),
        ("attention_bias", json!(false), json!(false)),
        ("mlp_bias", json!(false), json!(false)),
        ("rope_scaling", Value::Null, Value::Null),
        ("pretraining_tp", json!(1), json!(1)),
    ] {
        let found = obj.get(key).unwrap_or(&default);
        if *found != expected {
            return refuse(
                key,
                format!("{found} is not supported (tinylm needs {expected})"),
            );
        }
    }
    let eps = field(obj, "rms_norm_eps", &json!(1e-6)).as_f64();
    if eps != Some(RMS_NORM_EPS) {
        return refuse(
            "rms_norm_eps",
            format!(
                "{} is not tinylm's 1e-5 (transformers' default, when absent, is 1e-6)",
                field(obj, "rms_norm_eps", &null)
            ),
        );
    }
    let rope = field(obj, "rope_parameters", &null);
    if let Some(kind) = rope.get("rope_type").filter(|t| *t != "default") {
        return refuse(
            "rope_parameters.rope_type",
            format!("{kind} is not supported (only \"default\" RoPE)"),
        );
    }
    let rope_theta = rope
        .get("rope_theta")
        .or(obj.get("rope_theta"))
        .map_or(Some(10_000.0), Value::as_f64);
    let Some(rope_theta) = rope_theta else {
        return refuse("rope_theta", "expected a number".into());
    };
    let tie = field(obj, "tie_word_embeddings", &json!(false));
    let Some(tie_embeddings) = tie.as_bool() else {
        return refuse("tie_word_embeddings", format!("{tie} is not a boolean"));
    };
    let config = ModelConfig {
        vocab_size: count("vocab_size")?,
        context_length: count("max_position_embeddings")?,
        d_model,
        num_layers: count("num_hidden_layers")?,
        num_heads,
        d_ff: count("intermediate_size")?,
        rope_theta,
        tie_embeddings,
        ..ModelConfig::tinystories()
    };
    config
        .validate()
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    Ok(config)
}
