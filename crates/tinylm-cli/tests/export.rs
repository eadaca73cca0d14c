//! `tinylm export` / `tinylm import` end to end, every weights-reading command on
//! every form of weights, and bad input: one line, exit code 2, nothing left behind.

use std::collections::BTreeMap;
use std::path::Path;
use tinylm::config::Norm;
use tinylm::kernels::AdamWParams;
use tinylm::optim::AdamW;
use tinylm::params::ParamLayout;
use tinylm::{checkpoint, ModelConfig};
use tinylm_bpe::npy;

mod cli;
use cli::{failed, succeeded, tinylm};

fn config() -> ModelConfig {
    ModelConfig {
        vocab_size: 290,
        context_length: 16,
        d_model: 16,
        num_layers: 2,
        num_heads: 2,
        d_ff: 32,
        ..ModelConfig::tinystories()
    }
}

fn ok(args: &[&str]) -> String {
    succeeded(&tinylm(args))
}

/// Expects exit code 2 and exactly one line on stderr containing `message`.
fn fails(args: &[&str], message: &str) {
    let err = failed(&tinylm(args), &[message]);
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `tinylm export KIND --checkpoint CKPT [--tokenizer TOK] --out OUT` fails with `message`.
fn export_fails(kind: &str, ckpt: &str, tokenizer: Option<&str>, out: &str, message: &str) {
    let mut args = vec!["export", kind, "--checkpoint", ckpt];
    if let Some(tok) = tokenizer {
        args.extend(["--tokenizer", tok]);
    }
    args.extend(["--out", out]);
    fails(&args, message);
}

/// A tokenizer `tok/`, a training checkpoint `ckpt.safetensors` (with optimizer
/// state, recording `tok`) of `config`, and ids `ids.npy`.
fn setup(dir: &Path, config: &ModelConfig, record_tokenizer: bool) {
    let text = dir.join("corpus.txt");
    let story = "Once upon a time there was a little dog. The dog liked to run in the park.";
    std::fs::write(&text, [story; 20].join("<|endoftext|>")).unwrap();
    let (vocab, merges) =
        tinylm_bpe::train::train_bpe(&text, 290, &["<|endoftext|>".to_string()]).unwrap();
    tinylm_bpe::files::save_tokenizer(&dir.join("tok"), &vocab, &merges).unwrap();
    let layout = ParamLayout::new(config);
    let mut opt = AdamW::new(layout.total, AdamWParams::default());
    opt.m = layout.init(2);
    opt.step = 3;
    let mut meta = BTreeMap::new();
    if record_tokenizer {
        meta.insert(
            "tokenizer".to_string(),
            serde_json::to_string(&dir.join("tok")).unwrap(),
        );
    }
    let params = layout.init(1);
    checkpoint::save(
        &dir.join("ckpt.safetensors"),
        config,
        &params,
        Some(&opt),
        &meta,
    )
    .unwrap();
    let ids: Vec<i64> = (0..30).map(|i| (i * 7 + 3) % 290).collect();
    npy::write(&dir.join("ids.npy"), &[2, 15], &ids).unwrap();
    npy::write(&dir.join("data.npy"), &[30], &ids).unwrap();
}

#[test]
fn export_import_round_trip_and_every_command_reads_every_form() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    setup(dir.path(), &config(), true);
    ok(&[
        "export",
        "hf",
        "--checkpoint",
        &d("ckpt.safetensors"),
        "--out",
        &d("hf"),
    ]);
    // Each storage type by its llama.cpp name: the file's `general.file_type`
    // (ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7, MOSTLY_BF16 32) follows it.
    for (dtype, file_type) in [("f32", 0u32), ("f16", 1), ("bf16", 32), ("q8_0", 7)] {
        let out = d(&format!("m-{dtype}.gguf"));
        ok(&[
            "export",
            "gguf",
            "--checkpoint",
            &d("ckpt.safetensors"),
            "--out",
            &out,
            "--dtype",
            dtype,
        ]);
        let bytes = std::fs::read(&out).unwrap();
        assert!(bytes.starts_with(b"GGUF\x03\0\0\0"));
        let key = b"general.file_type";
        let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
        let value = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        assert_eq!(value, file_type, "{dtype}");
    }
    ok(&[
        "import",
        "hf",
        &d("hf"),
        "--out",
        &d("imported/ckpt.safetensors"),
    ]);
    let original = checkpoint::load(&dir.path().join("ckpt.safetensors")).unwrap();
    let imported = checkpoint::load(&dir.path().join("imported/ckpt.safetensors")).unwrap();
    assert_eq!(imported.config, original.config);
    assert_eq!(imported.params, original.params);
    assert_eq!(
        std::fs::read(d("imported/tokenizer/merges.txt")).unwrap(),
        std::fs::read(d("tok/merges.txt")).unwrap()
    );
    assert_eq!(
        std::fs::read(d("imported/tokenizer/vocab.json")).unwrap(),
        std::fs::read(d("tok/vocab.json")).unwrap()
    );

    // The weights alone: in f32 the checkpoint's; in bf16 (the default) those
    // values rounded, every tensor BF16, half the bytes, the tokenizer recorded.
    for (dtype, out) in [("f32", "w-f32.safetensors"), ("bf16", "w-bf16.safetensors")] {
        let ckpt = d("ckpt.safetensors");
        let mut args = vec!["export", "weights", "--checkpoint", &ckpt];
        let out = d(out);
        args.extend(["--out", &out]);
        if dtype == "f32" {
            args.extend(["--dtype", "f32"]);
        }
        ok(&args);
    }
    let f32_weights = checkpoint::load(&dir.path().join("w-f32.safetensors")).unwrap();
    assert_eq!(f32_weights.params, original.params);
    assert!(f32_weights.optimizer.is_none());
    let rounded: Vec<f32> = (original.params.iter())
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect();
    let bf16_weights = checkpoint::load(&dir.path().join("w-bf16.safetensors")).unwrap();
    assert_eq!(bf16_weights.params, rounded);
    let bytes = std::fs::read(d("w-bf16.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8_lossy(&bytes[8..8 + header_len]);
    assert!(
        header.contains("\"BF16\"") && !header.contains("\"F32\""),
        "{header}"
    );
    assert_eq!(bytes.len() - 8 - header_len, 2 * original.params.len());
    // Generating under bf16 from it (mapped as the weights it multiplies) writes
    // what it writes from an f32 checkpoint of the rounded values (read into
    // f32 values and rounded again).
    let meta = BTreeMap::from([(
        "tokenizer".to_string(),
        serde_json::to_string(&dir.path().join("tok")).unwrap(),
    )]);
    let rounded_ckpt = dir.path().join("rounded.safetensors");
    checkpoint::save(&rounded_ckpt, &config(), &rounded, None, &meta).unwrap();
    let bf16 = ["--precision", "bf16"];
    assert_eq!(
        ok(&greedy_8(&d("w-bf16.safetensors"), &bf16)),
        ok(&greedy_8(&d("rounded.safetensors"), &bf16))
    );

    // forward, eval and generate take the checkpoint (no --config), the exported
    // directory, the imported checkpoint and the weights alone, with the same
    // results.
    let mut logits = Vec::new();
    let mut evals = Vec::new();
    let mut texts = Vec::new();
    for (i, weights) in [
        d("ckpt.safetensors"),
        d("hf"),
        d("imported/ckpt.safetensors"),
        d("w-f32.safetensors"),
    ]
    .iter()
    .enumerate()
    {
        let out = d(&format!("logits{i}.npy"));
        ok(&[
            "forward",
            "--weights",
            weights,
            "--input",
            &d("ids.npy"),
            "--logits-out",
            &out,
            "--threads",
            "1",
        ]);
        logits.push(std::fs::read(&out).unwrap());
        let eval = ok(&[
            "eval",
            "--checkpoint",
            weights,
            "--data",
            &d("data.npy"),
            "--threads",
            "1",
        ]);
        evals.push(eval.split("windows").next().unwrap().to_string());
        texts.push(ok(&greedy_8(weights, &[])));
    }
    assert!(logits.windows(2).all(|w| w[0] == w[1]));
    assert!(evals.windows(2).all(|w| w[0] == w[1]), "{evals:?}");
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "{texts:?}");
    assert!(texts[0].starts_with("Once upon"));
    // --verbose leaves the text as it is and reports to stderr the load, the prompt's
    // tokens and the 7 tokens generated after the first.
    let ckpt = d("ckpt.safetensors");
    let out = tinylm(&greedy_8(&ckpt, &["--verbose"]));
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), texts[0]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let bpe = tinylm_bpe::files::Bpe::load(&dir.path().join("tok")).unwrap();
    let tokenizer = tinylm_bpe::encode::Tokenizer::new(bpe.vocab, &bpe.merges, &[]).unwrap();
    let prompt_tokens = tokenizer.encode("Once upon").len();
    for needle in [
        "load:".to_string(),
        format!("/ {prompt_tokens} tokens ("),
        "first token:".to_string(),
        "/ 7 tokens after the first (".to_string(),
    ] {
        assert!(stderr.contains(&needle), "'{needle}' not in {stderr}");
    }
}

/// `tinylm generate`'s arguments for 8 greedy tokens after "Once upon" from `weights`
/// on one thread, then `extra`.
fn greedy_8<'a>(weights: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "generate",
        "--checkpoint",
        weights,
        "--prompt",
        "Once upon",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--threads",
        "1",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn bad_input_is_one_line_exit_2_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    setup(dir.path(), &config(), false);
    let ckpt = d("ckpt.safetensors");
    // A checkpoint that records no tokenizer, and no --tokenizer.
    export_fails(
        "hf",
        &ckpt,
        None,
        &d("hf"),
        "records no tokenizer: pass --tokenizer DIR",
    );
    export_fails("gguf", &ckpt, None, &d("m.gguf"), "records no tokenizer");
    export_fails("hf", &ckpt, Some(&d("nowhere")), &d("hf"), "nowhere");
    let weights = d("w.safetensors");
    export_fails("weights", &ckpt, Some(&d("nowhere")), &weights, "nowhere");
    assert!(!Path::new(&weights).exists());
    // An output that cannot be written: its parent is a file.
    std::fs::write(d("file"), "x").unwrap();
    export_fails("hf", &ckpt, Some(&d("tok")), &d("file/hf"), "file/hf");
    export_fails(
        "gguf",
        &ckpt,
        Some(&d("tok")),
        &d("file/m.gguf"),
        "file/m.gguf",
    );
    // A directory that is not empty is not overwritten.
    std::fs::create_dir(d("full")).unwrap();
    std::fs::write(d("full/keep.txt"), "mine").unwrap();
    export_fails("hf", &ckpt, Some(&d("tok")), &d("full"), "not empty");
    assert_eq!(std::fs::read_to_string(d("full/keep.txt")).unwrap(), "mine");
    // An ablation Llama cannot express.
    let post = tempfile::tempdir().unwrap();
    setup(
        post.path(),
        &ModelConfig {
            norm: Norm::Post,
            ..config()
        },
        true,
    );
    let post_ckpt = post.path().join("ckpt.safetensors");
    export_fails(
        "hf",
        post_ckpt.to_str().unwrap(),
        None,
        &d("hf"),
        "norm = \"post\"",
    );
    export_fails(
        "gguf",
        post_ckpt.to_str().unwrap(),
        None,
        &d("m.gguf"),
        "norm = \"post\"",
    );
    // Neither a checkpoint nor weights.
    for cmd in [
        vec![
            "forward",
            "--weights",
            &d("file"),
            "--input",
            &d("ids.npy"),
            "--logits-out",
            &d("l.npy"),
        ],
        vec!["eval", "--checkpoint", &d("file"), "--data", &d("data.npy")],
        vec!["generate", "--checkpoint", &d("file")],
        vec![
            "export",
            "hf",
            "--checkpoint",
            &d("file"),
            "--out",
            &d("hf"),
        ],
    ] {
        fails(&cmd, "expected a tinylm checkpoint");
    }
    fails(
        &["import", "hf", &d("tok"), "--out", &d("x.safetensors")],
        "no config.json",
    );
    // Nothing half-written: only what the test made is there.
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "ckpt.safetensors",
            "corpus.txt",
            "data.npy",
            "file",
            "full",
            "ids.npy",
            "tok"
        ]
    );
}
