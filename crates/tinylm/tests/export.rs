//! Exports: the RoPE row permutation, the Hugging Face directory (checked against a
//! Llama forward pass written from `transformers`' definition, and imported back
//! bit for bit), the GGUF file (read back by a reader written here), refusals, and
//! the one weights loader.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
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
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for (s, score) in scores.iter().enumerate() {
                    for i in r.clone() {
                        attn[i] += (score - max).exp() / z * vs[s][i];
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

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn hf_directory_has_llamas_fields_names_and_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(false);
    let tok = tokenizer(dir.path(), 290);
    let params = ParamLayout::new(&config).init(1);
    let out = dir.path().join("hf");
    hf::export(&config, &params, &tok, &out).unwrap();
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
    let config = config(false);
    let tok = tokenizer(dir.path(), 290);
    let params = ParamLayout::new(&config).init(3);
    let out = dir.path().join("hf");
    hf::export(&config, &params, &tok, &out).unwrap();
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

/// A GGUF reader written from the format's description, independent of the writer.
struct Gguf {
    version: u32,
    kv: BTreeMap<String, Value>,
    /// name → (dims fastest-first, ggml type, values as f32)
    tensors: BTreeMap<String, (Vec<u64>, u32, Vec<f32>)>,
    /// name → the tensor's bytes as stored
    bytes: BTreeMap<String, Vec<u8>>,
}

/// A read position in a GGUF file.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let b = self.bytes[self.at..self.at + N].try_into().unwrap();
        self.at += N;
        b
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }

    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        self.at += n;
        String::from_utf8(self.bytes[self.at - n..self.at].to_vec()).unwrap()
    }

    /// A value of GGUF type `ty` (the types tinylm writes, and INT32).
    fn value(&mut self, ty: u32) -> Value {
        match ty {
            4 => self.u32().into(),
            5 => i32::from_le_bytes(self.take()).into(),
            6 => (f32::from_le_bytes(self.take()) as f64).into(),
            7 => (self.take::<1>()[0] != 0).into(),
            8 => self.string().into(),
            9 => {
                let elem = self.u32();
                let n = self.u64();
                Value::Array((0..n).map(|_| self.value(elem)).collect())
            }
            other => panic!("unexpected GGUF value type {other}"),
        }
    }
}

fn read_gguf(bytes: &[u8]) -> Gguf {
    let mut c = Cursor { bytes, at: 0 };
    assert_eq!(&c.take::<4>(), b"GGUF");
    let version = c.u32();
    let (n_tensors, n_kv) = (c.u64(), c.u64());
    let mut kv = BTreeMap::new();
    for _ in 0..n_kv {
        let key = c.string();
        let ty = c.u32();
        assert!(kv.insert(key, c.value(ty)).is_none(), "repeated key");
    }
    let infos: Vec<(String, Vec<u64>, u32, u64)> = (0..n_tensors)
        .map(|_| {
            let name = c.string();
            let n_dims = c.u32();
            let dims = (0..n_dims).map(|_| c.u64()).collect();
            (name, dims, c.u32(), c.u64())
        })
        .collect();
    let data_start = c.at.div_ceil(32) * 32;
    assert!(bytes[c.at..data_start].iter().all(|&b| b == 0));
    let mut stored = BTreeMap::new();
    let tensors = infos
        .into_iter()
        .map(|(name, dims, ty, offset)| {
            assert_eq!(offset % 32, 0, "{name} is not aligned");
            let n = dims.iter().product::<u64>() as usize;
            let start = data_start + offset as usize;
            let len = match ty {
                0 => 4 * n,
                1 | 30 => 2 * n,
                8 => n / 32 * 34,
                other => panic!("unexpected tensor type {other}"),
            };
            let data = &bytes[start..start + len];
            let values = match ty {
                0 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                1 => data
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes(b.try_into().unwrap()).to_f32())
                    .collect(),
                // bf16: the upper half of an f32.
                30 => data
                    .chunks_exact(2)
                    .map(|b| {
                        f32::from_bits((u16::from_le_bytes(b.try_into().unwrap()) as u32) << 16)
                    })
                    .collect(),
                // Q8_0: blocks of an f16 scale d and 32 int8 q, x = d·q.
                _ => data
                    .chunks_exact(34)
                    .flat_map(|block| {
                        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                        block[2..].iter().map(move |&q| d * q as i8 as f32)
                    })
                    .collect(),
            };
            stored.insert(name.clone(), data.to_vec());
            (name, (dims, ty, values))
        })
        .collect();
    Gguf {
        version,
        kv,
        tensors,
        bytes: stored,
    }
}

/// llama.cpp's `convert_hf_to_gguf.py` permute (`reshape(H, 2, D/2, C).swapaxes(1, 2)`),
/// which takes `transformers`' q/k rows back to Meta's: row `(h, i, s)` ← `(h, s, i)`.
fn llama_cpp_unpermute(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let d = w.len() / cols / heads;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for i in 0..d / 2 {
            for s in 0..2 {
                let (to, from) = (h * d + 2 * i + s, h * d + s * d / 2 + i);
                out[to * cols..(to + 1) * cols].copy_from_slice(&w[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

#[test]
fn gguf_file_has_every_llama_key_shape_and_tensor() {
    // Q8_0 with d_model 96 (rows of 96: three blocks) and d_ff 40 (ffn_down's rows of 40:
    // the f16 fallback).
    for (tie, dtype, d_model) in [
        (false, GgufDtype::F32, 24),
        (true, GgufDtype::F16, 24),
        (true, GgufDtype::Bf16, 24),
        (false, GgufDtype::Q8_0, 96),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(tie);
        config.vocab_size = 320; // larger than the tokenizer: padded with unused tokens
        config.d_model = d_model;
        let tok = tokenizer(dir.path(), 290);
        let params = ParamLayout::new(&config).init(9);
        let path = dir.path().join("m.gguf");
        gguf::export(&config, &params, &tok, &path, dtype).unwrap();
        let g = read_gguf(&std::fs::read(&path).unwrap());
        assert_eq!(g.version, 3);
        let eot = tok.end_of_text().unwrap();
        let spelled: Vec<Value> = (0..320u32)
            .map(|id| match id < 290 {
                true => tok.spelled(id).into(),
                false => format!("[PAD{id}]").into(),
            })
            .collect();
        let types: Vec<Value> = (0..320u32)
            .map(|id| match id {
                _ if id == eot => 3.into(),
                _ if id < 290 => 1.into(),
                _ => 5.into(),
            })
            .collect();
        let expected: BTreeMap<String, Value> = [
            ("general.architecture", "llama".into()),
            ("general.name", "tinylm".into()),
            (
                "general.file_type",
                match dtype {
                    GgufDtype::F32 => 0,
                    GgufDtype::F16 => 1,
                    GgufDtype::Q8_0 => 7,
                    GgufDtype::Bf16 => 32,
                }
                .into(),
            ),
            ("general.alignment", 32.into()),
            ("llama.vocab_size", 320.into()),
            ("llama.context_length", 16.into()),
            ("llama.embedding_length", d_model.into()),
            ("llama.block_count", 2.into()),
            ("llama.feed_forward_length", 40.into()),
            ("llama.attention.head_count", 3.into()),
            ("llama.attention.head_count_kv", 3.into()),
            ("llama.rope.dimension_count", (d_model / 3).into()),
            ("llama.rope.freq_base", 500.0.into()),
            (
                "llama.attention.layer_norm_rms_epsilon",
                (1e-5f32 as f64).into(),
            ),
            ("tokenizer.ggml.model", "gpt2".into()),
            ("tokenizer.ggml.pre", "gpt-2".into()),
            ("tokenizer.ggml.tokens", Value::Array(spelled)),
            ("tokenizer.ggml.token_type", Value::Array(types)),
            (
                "tokenizer.ggml.merges",
                Value::Array(tok.spelled_merges().into_iter().map(Value::from).collect()),
            ),
            ("tokenizer.ggml.add_bos_token", false.into()),
            ("tokenizer.ggml.add_eos_token", false.into()),
            ("tokenizer.ggml.bos_token_id", eot.into()),
            ("tokenizer.ggml.eos_token_id", eot.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(g.kv, expected);
        assert_eq!(g.kv["tokenizer.ggml.tokens"][eot as usize], "<|endoftext|>");
        assert!(g.kv["tokenizer.ggml.merges"][0]
            .as_str()
            .unwrap()
            .contains(' '));

        // Tensors: llama.cpp's names, shapes fastest-first, q/k as llama.cpp's own
        // converter would store transformers' rows.
        hf::export(&config, &params, &tok, &dir.path().join("hf")).unwrap();
        let (hf_tensors, _) = load_safetensors(&dir.path().join("hf/model.safetensors")).unwrap();
        let layout = ParamLayout::new(&config);
        let mut names = vec!["token_embd.weight".to_string(), "output_norm.weight".into()];
        if !tie {
            names.push("output.weight".into());
        }
        for l in 0..2 {
            for t in [
                "attn_norm",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_norm",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            ] {
                names.push(format!("blk.{l}.{t}.weight"));
            }
        }
        names.sort();
        assert_eq!(g.tensors.keys().cloned().collect::<Vec<_>>(), names);
        for spec in &layout.specs {
            let gname = tinylm::export::rename(&spec.name, tinylm::export::Naming::Gguf);
            let (dims, ty, values) = &g.tensors[&gname];
            let shape: Vec<u64> = spec.shape.iter().rev().map(|&d| d as u64).collect();
            assert_eq!(dims, &shape, "{gname}");
            let want_ty = match (spec.shape.len(), dtype) {
                (1, _) => 0,
                (_, GgufDtype::Q8_0) if spec.shape[1] % 32 != 0 => 1,
                (_, GgufDtype::F32) => 0,
                (_, GgufDtype::F16) => 1,
                (_, GgufDtype::Q8_0) => 8,
                (_, GgufDtype::Bf16) => 30,
            };
            assert_eq!(*ty, want_ty, "{gname}");
            let hf_name = tinylm::export::rename(&spec.name, tinylm::export::Naming::Hf);
            let hf_values = &hf_tensors[&hf_name].1;
            let from_hf = match gname.ends_with("attn_q.weight") || gname.ends_with("attn_k.weight")
            {
                true => llama_cpp_unpermute(hf_values, 3, d_model),
                false => hf_values.clone(),
            };
            assert_eq!(g.bytes[&gname], stored_as(*ty, &from_hf), "{gname}");
            let ours = &params[spec.range()];
            let bytes = &g.bytes[&gname];
            assert_eq!(
                bytes,
                &stored_as(*ty, ours),
                "{gname}: not tinylm's own rows"
            );
            // Q8_0 read back as d·q: within half a step d = max|x|/127 of each value,
            // plus |q| ≤ 127 times d's rounding to f16 (a relative 2⁻¹¹).
            for (block, stored) in ours.chunks(32).zip(values.chunks(32)) {
                let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (x, y) in block.iter().zip(stored) {
                    let tolerance = match *ty {
                        8 => amax / 127.0 * (0.5 + 127.0 / 2048.0),
                        _ => x.abs() / 256.0 + 1e-7,
                    };
                    assert!((x - y).abs() <= tolerance, "{gname}: {x} read back as {y}");
                }
            }
        }
    }
}

/// The bytes of `values` stored as ggml type `ty`: f32 and f16 as they are, bf16
/// by ggml's rounding (`ggml_compute_fp32_to_bf16`, written out here), Q8_0 by the
/// writer's blocks (checked against llama.cpp's own quantizer by
/// `gguf_bf16_and_q8_0_bytes_are_llama_cpps`).
fn stored_as(ty: u32, values: &[f32]) -> Vec<u8> {
    match ty {
        0 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        1 => (values.iter())
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        30 => values
            .iter()
            .flat_map(|x| {
                let u = x.to_bits();
                let bits = match u & 0x7fff_ffff > 0x7f80_0000 {
                    true => (u >> 16) | 64,
                    false => (u + (0x7fff + ((u >> 16) & 1))) >> 16,
                };
                (bits as u16).to_le_bytes()
            })
            .collect(),
        8 => gguf::quantize_q8_0(values),
        other => panic!("unexpected tensor type {other}"),
    }
}

/// bf16 and Q8_0 bytes equal those of llama.cpp's Python package `gguf`
/// (`gguf.quants.quantize`, bit-exact with ggml's C) for values that probe the
/// edge cases: ties, a zero block, scales that underflow f16, subnormals, the
/// largest magnitude negative (`tests/fixtures/gguf_quants.py` wrote them).
#[test]
fn gguf_bf16_and_q8_0_bytes_are_llama_cpps() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_quants.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let values: Vec<f32> = fixture["values_f32_bits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|bits| f32::from_bits(bits.as_u64().unwrap() as u32))
        .collect();
    assert_eq!(values.len(), 8 * 32);
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for (dtype, key) in [(GgufDtype::Bf16, "bf16"), (GgufDtype::Q8_0, "q8_0")] {
        let ours = hex(&dtype.encode(&values));
        assert_eq!(ours, fixture[key].as_str().unwrap(), "{key}");
    }
}

#[test]
fn weights_load_reads_checkpoints_weight_files_and_hf_directories() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = config(false);
    let layout = ParamLayout::new(&config);
    let params = layout.init(4);
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
    let config = config(false);
    let layout = ParamLayout::new(&config);
    let params = layout.init(4);
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
