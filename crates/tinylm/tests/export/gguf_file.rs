//! The GGUF file: every key, shape and tensor llama.cpp reads, read back by a
//! reader written here from the format's description; bf16 and Q8_0 bytes as
//! llama.cpp's.

use super::*;

/// A GGUF reader written from the format's description, independent of the writer.
pub(super) struct Gguf {
    version: u32,
    pub(super) kv: BTreeMap<String, Value>,
    /// name → (dims fastest-first, ggml type, values as f32)
    pub(super) tensors: BTreeMap<String, (Vec<u64>, u32, Vec<f32>)>,
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

pub(super) fn read_gguf(bytes: &[u8]) -> Gguf {
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
