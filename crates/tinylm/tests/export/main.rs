//! Exports: the RoPE row permutation, the Hugging Face directory (checked against a
//! Llama forward pass written from `transformers`' definition, and imported back
//! bit for bit), the GGUF file (read back by a reader written here), refusals, and
//! the one weights loader.

#[path = "../common/mod.rs"]
mod common;
mod gguf_file;

use common::softmax;
use gguf_file::read_gguf;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tinylm::config::{Ffn, Norm, Positional};
use tinylm::distributed::World;
use tinylm::export::gguf::{self, GgufDtype};
use tinylm::export::{hf, permute_rope_rows};
use tinylm::kernels::Precision;
use tinylm::params::{ParamLayout, Tensors};
use tinylm::safetensors_io::{load_safetensors, save_safetensors};
use tinylm::train::{train, Progress, TrainConfig};
use tinylm::{checkpoint, weights, Model, ModelConfig};
use tinylm_bpe::files::Bpe;
use tinylm_bpe::pretokenize::Pattern;

fn config(tie_embeddings: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 300,
        context_length: 16,
        d_model: 24,
        num_layers: 2,
        num_heads: 3,
        d_ff: 40,
        rope_theta: 500.0,
        tie_embeddings,
        ..ModelConfig::tinystories()
    }
}

/// The untied [`config`]'s model: its configuration, parameter layout and initial
/// parameters.
fn untied_model() -> (ModelConfig, ParamLayout, Vec<f32>) {
    let config = config(false);
    let layout = ParamLayout::new(&config);
    let params = layout.init(4);
    (config, layout, params)
}

/// A BPE tokenizer trained on a small text: 256 bytes, `<|endoftext|>`, merges.
fn tokenizer(dir: &Path, vocab_size: usize) -> Bpe {
    let text = dir.join("corpus.txt");
    let story = "Once upon a time there was a little dog. The dog liked to run in the park.";
    std::fs::write(&text, [story; 20].join("<|endoftext|>")).unwrap();
    let (vocab, merges) =
        tinylm_bpe::train::train_bpe(&text, vocab_size, &["<|endoftext|>".to_string()]).unwrap();
    tinylm_bpe::files::save_tokenizer(&dir.join("tok"), &vocab, &merges).unwrap();
    Bpe::load(&dir.join("tok")).unwrap()
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `(rows, cols)` times a vector.
fn matvec(w: &[f32], cols: usize, x: &[f64]) -> Vec<f64> {
    w.chunks_exact(cols)
        .map(|row| row.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum())
        .collect()
}

/// tinylm's (and Meta's) RoPE: adjacent pairs `(2i, 2i+1)` of each head.
fn rotate_pairs(q: &mut [f64], head_dim: usize, pos: usize, theta: f64) {
    for head in q.chunks_exact_mut(head_dim) {
        for i in 0..head_dim / 2 {
            let a = pos as f64 / theta.powf(2.0 * i as f64 / head_dim as f64);
            let (x0, x1) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = x0 * a.cos() - x1 * a.sin();
            head[2 * i + 1] = x0 * a.sin() + x1 * a.cos();
        }
    }
}

/// `transformers`' Llama RoPE: `q cos + rotate_half(q) sin`, halves `(i, i + D/2)`.
fn rotate_halves(q: &mut [f64], head_dim: usize, pos: usize, theta: f64) {
    let half = head_dim / 2;
    for head in q.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let a = pos as f64 / theta.powf(2.0 * i as f64 / head_dim as f64);
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0 * a.cos() - x1 * a.sin();
            head[i + half] = x1 * a.cos() + x0 * a.sin();
        }
    }
}

#[test]
fn permuted_rows_under_halves_rope_give_the_same_attention_scores() {
    let (heads, head_dim, d_in, theta) = (3, 8, 5, 10_000.0);
    let (wq, wk) = (
        values(heads * head_dim * d_in, 1),
        values(heads * head_dim * d_in, 2),
    );
    let (wq_hf, wk_hf) = (
        permute_rope_rows(&wq, d_in, head_dim, true),
        permute_rope_rows(&wk, d_in, head_dim, true),
    );
    assert_eq!(permute_rope_rows(&wq_hf, d_in, head_dim, false), wq);
    assert_ne!(wq_hf, wq);
    let xs: Vec<Vec<f64>> = (0..6)
        .map(|s| values(d_in, 10 + s).iter().map(|&v| v as f64).collect())
        .collect();
    let rotated = |w: &[f32], x: &[f64], pos, halves: bool| {
        let mut q = matvec(w, d_in, x);
        match halves {
            true => rotate_halves(&mut q, head_dim, pos, theta),
            false => rotate_pairs(&mut q, head_dim, pos, theta),
        }
        q
    };
    for (pq, xq) in xs.iter().enumerate() {
        for (pk, xk) in xs.iter().enumerate().take(pq + 1) {
            let (q, k) = (rotated(&wq, xq, pq, false), rotated(&wk, xk, pk, false));
            let (q_hf, k_hf) = (rotated(&wq_hf, xq, pq, true), rotated(&wk_hf, xk, pk, true));
            for h in 0..heads {
                let r = h * head_dim..(h + 1) * head_dim;
                let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
                let (s, s_hf) = (
                    dot(&q[r.clone()], &k[r.clone()]),
                    dot(&q_hf[r.clone()], &k_hf[r]),
                );
                assert!(
                    (s - s_hf).abs() < 1e-12,
                    "head {h}, positions {pq}, {pk}: {s} vs {s_hf}"
                );
            }
            // Not only the scores: the rotated vectors are the same permutation.
            for h in 0..heads {
                for i in 0..head_dim / 2 {
                    let (pair, half) = (h * head_dim + 2 * i, h * head_dim + i);
                    assert!((q[pair] - q_hf[half]).abs() < 1e-12);
                    assert!((q[pair + 1] - q_hf[half + head_dim / 2]).abs() < 1e-12);
                }
            }
        }
    }
    // Without the permutation the halves rotation gives other scores.
    let (q, k) = (
        rotated(&wq, &xs[3], 3, false),
        rotated(&wk, &xs[0], 0, false),
    );
    let (q_bad, k_bad) = (rotated(&wq, &xs[3], 3, true), rotated(&wk, &xs[0], 0, true));
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    assert!((dot(&q, &k) - dot(&q_bad, &k_bad)).abs() > 1e-6);
}

/// RMSNorm as `LlamaRMSNorm`: `x / sqrt(mean(x²) + eps) · g`.
fn rmsnorm(x: &[f64], g: &[f32], eps: f64) -> Vec<f64> {
    let rms = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(g).map(|(v, &g)| v / rms * g as f64).collect()
}

/// `LlamaForCausalLM`'s forward pass, written from its definition, over the
/// exported directory's own files (config.json and Llama tensor names): logits `(T, V)`.
fn llama_reference(dir: &Path, ids: &[u32]) -> Vec<f64> {
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let (tensors, _) = load_safetensors(&dir.join("model.safetensors")).unwrap();
    let get = |name: &str| &tensors[name].1;
    let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
    let (c, heads, layers, f) = (
        n("hidden_size"),
        n("num_attention_heads"),
        n("num_hidden_layers"),
        n("intermediate_size"),
    );
    let (eps, theta) = (
        cfg["rms_norm_eps"].as_f64().unwrap(),
        cfg["rope_theta"].as_f64().unwrap(),
    );
    let d = n("head_dim");
    let mut x: Vec<Vec<f64>> = ids
        .iter()
        .map(|&id| {
            get("model.embed_tokens.weight")[id as usize * c..][..c]
                .iter()
                .map(|&v| v as f64)
                .collect()
        })
        .collect();
    for l in 0..layers {
        let w = |s: &str| get(&format!("model.layers.{l}.{s}.weight"));
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, row) in x.iter().enumerate() {
            let h = rmsnorm(row, w("input_layernorm"), eps);
            let (mut q, mut k) = (
                matvec(w("self_attn.q_proj"), c, &h),
                matvec(w("self_attn.k_proj"), c, &h),
            );
            rotate_halves(&mut q, d, pos, theta);
            rotate_halves(&mut k, d, pos, theta);
            qs.push(q);
            ks.push(k);
            vs.push(matvec(w("self_attn.v_proj"), c, &h));
        }
        for t in 0..x.len() {
            let mut attn = vec![0f64; c];
            for h in 0..heads {
                let r = h * d..(h + 1) * d;
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        qs[t][r.clone()]
                            .iter()
                            .zip(&ks[s][r.clone()])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                for (s, p) in softmax(&scores).into_iter().enumerate() {
                    for i in r.clone() {
                        attn[i] += p * vs[s][i];
                    }
                }
            }
            let out = matvec(w("self_attn.o_proj"), c, &attn);
            x[t].iter_mut().zip(out).for_each(|(a, b)| *a += b);
            let h = rmsnorm(&x[t], w("post_attention_layernorm"), eps);
            let (gate, up) = (
                matvec(w("mlp.gate_proj"), c, &h),
                matvec(w("mlp.up_proj"), c, &h),
            );
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            assert_eq!(act.len(), f);
            let out = matvec(w("mlp.down_proj"), f, &act);
            x[t].iter_mut().zip(out).for_each(|(a, b)| *a += b);
        }
    }
    let head = match cfg["tie_word_embeddings"].as_bool().unwrap() {
        true => get("model.embed_tokens.weight"),
        false => get("lm_head.weight"),
    };
    x.iter()
        .flat_map(|row| matvec(head, c, &rmsnorm(row, get("model.norm.weight"), eps)))
        .collect()
}

#[test]
fn hf_export_computes_tinylms_logits_in_a_llama_forward_pass() {
    for tie in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let config = config(tie);
        let params = ParamLayout::new(&config).init(7);
        hf::export(
            &config,
            &params,
            &tokenizer(dir.path(), 290),
            &dir.path().join("hf"),
        )
        .unwrap();
        let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 300).collect();
        let mut model = Model::from_params(config, params).unwrap();
        let logits = model.forward(&ids, 1, ids.len()).unwrap().to_vec();
        let reference = llama_reference(&dir.path().join("hf"), &ids);
        let scale = reference.iter().fold(0f64, |m, v| m.max(v.abs()));
        let err = logits
            .iter()
            .zip(&reference)
            .fold(0f64, |m, (&a, b)| m.max((a as f64 - b).abs()));
        assert!(
            err / scale < 1e-5,
            "tie {tie}: relative error {}",
            err / scale
        );
    }
}

/// A tokenizer of 290 tokens and a model of `config(false)` exported into
/// `dir/hf`: the tokenizer and the directory.
fn exported_hf(dir: &Path) -> (Bpe, PathBuf) {
    let config = config(false);
    let tok = tokenizer(dir, 290);
    let params = ParamLayout::new(&config).init(1);
    let out = dir.join("hf");
    hf::export(&config, &params, &tok, &out).unwrap();
    (tok, out)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn hf_directory_has_llamas_fields_names_and_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let (tok, out) = exported_hf(dir.path());
    let cfg = read_json(&out.join("config.json"));
    let eot = tok.end_of_text().unwrap();
    assert_eq!(tok.vocab[eot as usize], b"<|endoftext|>");
    for (key, expected) in [
        ("architectures", serde_json::json!(["LlamaForCausalLM"])),
        ("model_type", "llama".into()),
        ("rms_norm_eps", 1e-5.into()),
        ("rope_theta", 500.0.into()),
        ("head_dim", 8.into()),
        ("num_key_value_heads", 3.into()),
        ("num_attention_heads", 3.into()),
        ("hidden_size", 24.into()),
        ("intermediate_size", 40.into()),
        ("max_position_embeddings", 16.into()),
        ("vocab_size", 300.into()),
        ("tie_word_embeddings", false.into()),
        ("attention_bias", false.into()),
        ("mlp_bias", false.into()),
        ("hidden_act", "silu".into()),
        ("bos_token_id", eot.into()),
        ("eos_token_id", eot.into()),
    ] {
        assert_eq!(cfg[key], expected, "{key}");
    }
    let (tensors, meta) = load_safetensors(&out.join("model.safetensors")).unwrap();
    assert_eq!(meta.get("format").map(String::as_str), Some("pt"));
    let mut names: Vec<&str> = tensors.keys().map(String::as_str).collect();
    names.sort();
    let mut expected = vec![
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ];
    let per_layer = [
        "input_layernorm",
        "mlp.down_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "post_attention_layernorm",
        "self_attn.k_proj",
        "self_attn.o_proj",
        "self_attn.q_proj",
        "self_attn.v_proj",
    ];
    let layer_names: Vec<String> = (0..2)
        .flat_map(|l| {
            per_layer
                .iter()
                .map(move |s| format!("model.layers.{l}.{s}.weight"))
        })
        .collect();
    expected.extend(layer_names.iter().map(String::as_str));
    expected.sort();
    assert_eq!(names, expected);

    let t = read_json(&out.join("tokenizer.json"));
    assert_eq!(t["model"]["type"], "BPE");
    assert_eq!(t["pre_tokenizer"]["type"], "ByteLevel");
    assert_eq!(t["pre_tokenizer"]["add_prefix_space"], false);
    assert_eq!(t["decoder"]["type"], "ByteLevel");
    assert_eq!(
        t["model"]["merges"].as_array().unwrap().len(),
        tok.merges.len()
    );
    assert_eq!(
        t["model"]["vocab"]["Ġt"],
        serde_json::json!(tok.vocab.iter().position(|v| v == b" t").unwrap())
    );
    let added = t["added_tokens"].as_array().unwrap();
    assert_eq!(added.len(), 1);
    assert_eq!(added[0]["content"], "<|endoftext|>");
    assert_eq!(added[0]["id"], eot);
    assert_eq!(added[0]["special"], true);
    let tc = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tc["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(tc["eos_token"], "<|endoftext|>");
    assert_eq!(
        read_json(&out.join("generation_config.json"))["eos_token_id"],
        eot
    );
    // The directory's tokenizer reads back as the original.
    assert_eq!(
        tinylm_bpe::files::hf::load(&out.join("tokenizer.json")).unwrap(),
        tok
    );
}

#[test]
fn hf_round_trip_gives_back_identical_tensors_and_tokenizer() {
    for tie in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let config = config(tie);
        let tok = tokenizer(dir.path(), 290);
        let params = ParamLayout::new(&config).init(3);
        hf::export(&config, &params, &tok, &dir.path().join("hf")).unwrap();
        let back = hf::import(&dir.path().join("hf")).unwrap();
        assert_eq!(back.config, config);
        assert_eq!(
            back.params.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            params.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(back.tokenizer, Some(tok));
    }
}

/// A bf16 training run's checkpoint exports as any other: it holds the `f32` master
/// weights, which the loader export reads and the Hugging Face directory and the
/// GGUF file carry bit for bit.
#[test]
fn a_bf16_runs_checkpoint_exports_its_f32_master_weights() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = config(false);
    let tok = tokenizer(d, 290);
    let ids: Vec<u16> = (0..4000u32)
        .map(|i| ((i * 37 + i / 7) % 290) as u16)
        .collect();
    tinylm_bpe::npy::write(&d.join("train.npy"), &[ids.len()], &ids).unwrap();
    let cfg = TrainConfig {
        model: config.clone(),
        train_data: d.join("train.npy"),
        val_data: None,
        out_dir: d.join("run"),
        batch_size: 4,
        steps: 5,
        eval_interval: 0,
        precision: Precision::Bf16,
        threads: 2,
        ..TrainConfig::default()
    };
    let never = std::sync::atomic::AtomicBool::new(false);
    let run = train(&cfg, &World::single(), &never, &mut |_: &Progress| {}).unwrap();
    let params = weights::load(&run.checkpoint, None).unwrap().params;
    let layout = ParamLayout::new(&config);
    assert_ne!(params, layout.init(cfg.seed), "the run trained");
    assert!(
        params.iter().any(|x| x.to_bits() & 0xffff != 0),
        "the f32 master weights, not their bf16 copy"
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    hf::export(&config, &params, &tok, &d.join("hf")).unwrap();
    assert_eq!(
        bits(&hf::import(&d.join("hf")).unwrap().params),
        bits(&params)
    );
    gguf::export(&config, &params, &tok, &d.join("m.gguf"), GgufDtype::F32).unwrap();
    let gguf = read_gguf(&std::fs::read(d.join("m.gguf")).unwrap());
    assert_eq!(gguf.tensors.len(), layout.specs.len());
}

#[test]
fn split_patterns_travel_with_hf_and_are_refused_by_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(false);
    let params = ParamLayout::new(&config).init(3);
    for pattern in [Pattern::Gpt4, Pattern::O200k] {
        let tok = Bpe {
            pattern: pattern.clone(),
            ..tokenizer(dir.path(), 290)
        };
        let out = dir.path().join(format!("hf-{}", pattern.name()));
        hf::export(&config, &params, &tok, &out).unwrap();
        assert_eq!(hf::import(&out).unwrap().tokenizer, Some(tok.clone()));
        assert_eq!(Bpe::load(&out).unwrap(), tok);
        let gguf_path = dir.path().join("m.gguf");
        let err = gguf::export(&config, &params, &tok, &gguf_path, GgufDtype::F32)
            .unwrap_err()
            .to_string();
        let expected = format!(
            "llama.cpp export supports the gpt2 split pattern; this tokenizer uses {}",
            pattern.name()
        );
        assert!(err.contains(&expected), "{err}");
        assert!(!gguf_path.exists());
    }
}

#[test]
fn ablations_without_a_llama_equivalent_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), 290);
    type Change = fn(&mut ModelConfig);
    let cases: [(Change, &str); 4] = [
        (|c| c.norm = Norm::Post, "norm = \"post\""),
        (|c| c.norm = Norm::None, "norm = \"none\""),
        (|c| c.positional = Positional::None, "positional = \"none\""),
        (|c| c.ffn = Ffn::Silu, "ffn = \"silu\""),
    ];
    for (change, named) in cases {
        let mut config = config(false);
        change(&mut config);
        let params = ParamLayout::new(&config).init(0);
        let out = dir.path().join("hf");
        let err = hf::export(&config, &params, &tok, &out)
            .unwrap_err()
            .to_string();
        assert!(err.contains(named), "{err}");
        assert!(!out.exists());
        let file = dir.path().join("m.gguf");
        let err = gguf::export(&config, &params, &tok, &file, GgufDtype::F32).unwrap_err();
        assert!(err.to_string().contains(named));
        assert!(!file.exists());
    }
    // A tokenizer larger than the model's vocabulary.
    let mut small = config(false);
    small.vocab_size = 280;
    let params = ParamLayout::new(&small).init(0);
    let err = hf::export(&small, &params, &tok, &dir.path().join("hf")).unwrap_err();
    assert!(
        err.to_string()
            .contains("290 tokens but the model only 280"),
        "{err}"
    );
}

/// Exports, then edits `config.json` (or the tensors) and checks import names the field.
#[test]
fn import_refuses_what_tinylm_cannot_run_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (_, out) = exported_hf(dir.path());
    let original = read_json(&out.join("config.json"));
    let edits: [(&str, Value, &str); 8] = [
        ("num_key_value_heads", 1.into(), "num_key_value_heads"),
        ("attention_bias", true.into(), "attention_bias"),
        ("mlp_bias", true.into(), "mlp_bias"),
        ("hidden_act", "gelu".into(), "hidden_act"),
        ("rms_norm_eps", Value::Null, "rms_norm_eps"),
        (
            "rope_scaling",
            serde_json::json!({"type": "linear", "factor": 2.0}),
            "rope_scaling",
        ),
        ("model_type", "gpt2".into(), "model_type"),
        ("head_dim", 16.into(), "head_dim"),
    ];
    for (key, value, named) in edits {
        let mut cfg = original.clone();
        cfg[key] = value;
        if key == "model_type" {
            cfg["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
        }
        std::fs::write(out.join("config.json"), cfg.to_string()).unwrap();
        let err = hf::import(&out).unwrap_err().to_string();
        assert!(
            err.contains(named) && err.contains("config.json"),
            "{key}: {err}"
        );
    }
    std::fs::write(out.join("config.json"), original.to_string()).unwrap();
    // A bias tensor.
    let weights = out.join("model.safetensors");
    let (mut tensors, _) = load_safetensors(&weights).unwrap();
    tensors.insert(
        "model.layers.0.self_attn.q_proj.bias".into(),
        (vec![24], vec![0.0; 24]),
    );
    save(&weights, &tensors);
    let err = hf::import(&out).unwrap_err().to_string();
    assert!(
        err.contains("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"),
        "{err}"
    );
    // A tokenizer that is not byte-level BPE.
    let mut t = read_json(&out.join("tokenizer.json"));
    t["pre_tokenizer"] = serde_json::json!({"type": "Metaspace"});
    std::fs::write(out.join("tokenizer.json"), t.to_string()).unwrap();
    let err = tinylm_bpe::files::hf::load(&out.join("tokenizer.json")).unwrap_err();
    assert!(err.to_string().contains("pre_tokenizer"), "{err}");
}

fn save(path: &Path, tensors: &Tensors) {
    let list: Vec<(String, Vec<usize>, &[f32])> = tensors
        .iter()
        .map(|(n, (s, v))| (n.clone(), s.clone(), v.as_slice()))
        .collect();
    save_safetensors(
        path,
        &list,
        &BTreeMap::from([("format".into(), "pt".into())]),
    )
    .unwrap();
}

#[test]
fn weights_load_reads_checkpoints_weight_files_and_hf_directories() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (config, layout, params) = untied_model();
    let tok = tokenizer(d, 290);
    // A training checkpoint, optimizer state and all, recording its tokenizer.
    let mut opt = tinylm::optim::AdamW::new(layout.total, Default::default());
    opt.m = layout.init(5);
    let meta = BTreeMap::from([(
        "tokenizer".to_string(),
        serde_json::to_string(&d.join("tok")).unwrap(),
    )]);
    checkpoint::save(
        &d.join("ckpt.safetensors"),
        &config,
        &params,
        Some(&opt),
        &meta,
    )
    .unwrap();
    let w = weights::load(&d.join("ckpt.safetensors"), None).unwrap();
    assert_eq!(
        (&w.config, &w.params, w.tokenizer.as_deref()),
        (&config, &params, Some(d.join("tok").as_path()))
    );
    // Weights only: needs the config.
    save_safetensors(
        &d.join("w.safetensors"),
        &layout.tensors(&params),
        &BTreeMap::new(),
    )
    .unwrap();
    let err = weights::load(&d.join("w.safetensors"), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("without a model config") && err.contains("expected a tinylm checkpoint"),
        "{err}"
    );
    assert_eq!(
        weights::load(&d.join("w.safetensors"), Some(&config))
            .unwrap()
            .params,
        params
    );
    // A checkpoint with a config that differs from the given one.
    let mut other = config.clone();
    other.d_ff = 48;
    let err = weights::load(&d.join("ckpt.safetensors"), Some(&other)).unwrap_err();
    assert!(err.to_string().contains("differs"), "{err}");
    // An exported directory, or its model.safetensors.
    hf::export(&config, &params, &tok, &d.join("hf")).unwrap();
    for path in [d.join("hf"), d.join("hf/model.safetensors")] {
        let w = weights::load(&path, None).unwrap();
        assert_eq!(
            (&w.config, &w.params, w.tokenizer.as_deref()),
            (&config, &params, Some(d.join("hf").as_path()))
        );
    }
    assert_eq!(Bpe::load(&d.join("hf")).unwrap(), tok);
    // Neither: a GGUF file, a text file, an empty directory.
    gguf::export(&config, &params, &tok, &d.join("m.gguf"), GgufDtype::F32).unwrap();
    std::fs::write(d.join("notes.txt"), "hello").unwrap();
    std::fs::create_dir(d.join("empty")).unwrap();
    for (name, says) in [
        ("m.gguf", "GGUF"),
        ("notes.txt", "not a valid safetensors file"),
        ("empty", "no config.json"),
    ] {
        let err = weights::load(&d.join(name), None).unwrap_err().to_string();
        assert!(err.contains(says) && err.contains(name), "{name}: {err}");
        assert!(err.contains("expected"), "{name}: {err}");
    }
}

/// A config (in a checkpoint, given with a weights file, or a directory's
/// `config.json`) that claims a larger model than its file holds is refused
/// before anything of the claimed size is allocated: an import allocated the
/// claimed model (4 TB for 10⁹ × 512 embeddings) before it looked at the
/// tensors, and every reader built the layout of every claimed layer.
#[test]
fn a_config_larger_than_its_file_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (config, layout, params) = untied_model();
    let deep = ModelConfig {
        num_layers: 10_000,
        ..config.clone()
    };
    let says_layers = |err: String, path: &Path, tensors: usize| {
        let expected = format!(
            "{}: the model configuration has 10000 layers, but the file holds only {tensors} tensors",
            path.display()
        );
        assert!(err.contains(&expected), "{err}");
    };
    // A checkpoint whose metadata claims the deep model.
    let ckpt = d.join("ckpt.safetensors");
    let meta = BTreeMap::from([("config".to_string(), serde_json::to_string(&deep).unwrap())]);
    save_safetensors(&ckpt, &layout.tensors(&params), &meta).unwrap();
    let n = layout.specs.len();
    says_layers(checkpoint::load(&ckpt).unwrap_err().to_string(), &ckpt, n);
    says_layers(
        weights::load(&ckpt, None).unwrap_err().to_string(),
        &ckpt,
        n,
    );
    // Weights only, with the deep config given.
    let w = d.join("w.safetensors");
    save_safetensors(&w, &layout.tensors(&params), &BTreeMap::new()).unwrap();
    says_layers(
        weights::load(&w, Some(&deep)).unwrap_err().to_string(),
        &w,
        n,
    );
    // A Hugging Face directory whose config.json claims it, or a vocabulary of 10⁹.
    let out = d.join("hf");
    hf::export(&config, &params, &tokenizer(d, 290), &out).unwrap();
    let original = read_json(&out.join("config.json"));
    let weights = out.join("model.safetensors");
    let mut cfg = original.clone();
    cfg["num_hidden_layers"] = 10_000.into();
    std::fs::write(out.join("config.json"), cfg.to_string()).unwrap();
    says_layers(hf::import(&out).unwrap_err().to_string(), &weights, n);
    let mut cfg = original;
    cfg["vocab_size"] = 1_000_000_000.into();
    std::fs::write(out.join("config.json"), cfg.to_string()).unwrap();
    let err = hf::import(&out).unwrap_err().to_string();
    let expected = format!(
        "tensor 'model.embed_tokens.weight' has shape [{}, {d_model}], expected [1000000000, {d_model}]",
        config.vocab_size,
        d_model = config.d_model
    );
    assert!(
        err.contains(&weights.display().to_string()) && err.contains(&expected),
        "{err}"
    );
}
