//! `tinylm forward` end to end: logits, loss and gradients equal the library's f32
//! model bit for bit in its default precision, fp32 (PyTorch's), whatever the CPU
//! multiplies natively; `--precision bf16` answers in bf16, within bf16's tolerance
//! of f32; and bad input is a clear error with exit code 2.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tinylm::model::Model;
use tinylm::params::ParamLayout;
use tinylm::safetensors_io::{load_safetensors, save_safetensors};
use tinylm::ModelConfig;
use tinylm_bpe::npy::{self, MappedNpy};

fn config() -> ModelConfig {
    ModelConfig {
        vocab_size: 23,
        context_length: 8,
        d_model: 12,
        num_layers: 2,
        num_heads: 3,
        d_ff: 32,
        ..ModelConfig::tinystories()
    }
}

/// A directory with `config.json`, `w.safetensors` (seeded init) and ids/targets `(2, 5)`.
struct Setup {
    dir: tempfile::TempDir,
    config: ModelConfig,
    params: Vec<f32>,
    ids: Vec<i64>,
    targets: Vec<i64>,
}

impl Setup {
    fn new(config: ModelConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let layout = ParamLayout::new(&config);
        let params = layout.init(5);
        std::fs::write(dir.path().join("config.json"), config.to_json()).unwrap();
        let w = dir.path().join("w.safetensors");
        save_safetensors(&w, &layout.tensors(&params), &BTreeMap::new()).unwrap();
        let ids: Vec<i64> = (0..10).map(|i| (i * 7 + 3) % 23).collect();
        let targets: Vec<i64> = (0..10).map(|i| (i * 5 + 1) % 23).collect();
        npy::write(&dir.path().join("ids.npy"), &[2, 5], &ids).unwrap();
        npy::write(&dir.path().join("targets.npy"), &[2, 5], &targets).unwrap();
        Setup {
            dir,
            config,
            params,
            ids,
            targets,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `tinylm forward` in its default precision with the default files, `extra`
    /// flags last.
    fn run(&self, extra: &[&str]) -> Output {
        let p = |n: &str| self.path(n).to_str().unwrap().to_string();
        let mut args = vec![
            "forward".to_string(),
            "--config".into(),
            p("config.json"),
            "--weights".into(),
            p("w.safetensors"),
            "--logits-out".into(),
            p("logits.npy"),
            "--threads".into(),
            "2".into(),
        ];
        if !extra.contains(&"--input") {
            args.extend(["--input".into(), p("ids.npy")]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Command::new(env!("CARGO_BIN_EXE_tinylm"))
            .args(&args)
            .output()
            .unwrap()
    }

    /// Runs with `extra` and expects exit code 2 with `message` in stderr.
    fn fails(&self, extra: &[&str], message: &str) {
        let out = self.run(extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(message), "'{message}' not in: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

fn as_u32(v: &[i64]) -> Vec<u32> {
    v.iter().map(|&x| x as u32).collect()
}

fn read_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let a = MappedNpy::open(path).unwrap();
    (
        a.header.shape.clone(),
        (0..a.len()).map(|i| a.f32_at(i)).collect(),
    )
}

#[test]
fn logits_loss_and_gradients_match_the_library() {
    let s = Setup::new(config());
    let targets = s.path("targets.npy");
    let grads = s.path("grads.safetensors");
    let out = s.run(&[
        "--targets",
        targets.to_str().unwrap(),
        "--grads-out",
        grads.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();

    let mut model = Model::from_params(s.config.clone(), s.params.clone()).unwrap();
    let (ids, targets) = (as_u32(&s.ids), as_u32(&s.targets));
    let want_logits = model.forward(&ids, 2, 5).unwrap().to_vec();
    let (shape, logits) = read_f32(&s.path("logits.npy"));
    assert_eq!(shape, vec![2, 5, 23]);
    assert_eq!(logits, want_logits);

    let loss = model.forward_loss(&ids, &targets, 2, 5).unwrap();
    model.backward().unwrap();
    let printed: f32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("loss "))
        .expect("a loss line")
        .parse()
        .unwrap();
    assert_eq!(printed, loss);
    assert!(loss > 0.5 && loss < 10.0, "{loss}");

    let (tensors, meta) = load_safetensors(&grads).unwrap();
    assert_eq!(meta["loss"], loss.to_string());
    let layout = model.layout();
    assert_eq!(tensors.len(), layout.specs.len());
    assert_eq!(layout.load_buffer(&tensors, &grads).unwrap(), model.grads());
    assert!(model.grads().iter().any(|&g| g != 0.0));
}

/// `--precision bf16` is honoured: the logits differ from f32's, by no more than
/// bf16's tolerance (8 significant bits, 2⁻⁹ relative per rounding; the library's
/// own bf16 check bounds the logits at 1e-2, `crates/tinylm/tests/bf16.rs`).
#[test]
fn bf16_on_request_is_within_bf16_tolerance_of_the_default() {
    let s = Setup::new(config());
    let out = s.run(&["--precision", "bf16"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, bf16) = read_f32(&s.path("logits.npy"));
    let mut model = Model::from_params(s.config.clone(), s.params.clone()).unwrap();
    let f32s = model.forward(&as_u32(&s.ids), 2, 5).unwrap().to_vec();
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&b, &f) in bf16.iter().zip(&f32s) {
        diff += (b as f64 - f as f64).powi(2);
        norm += (f as f64).powi(2);
    }
    let error = (diff / norm).sqrt();
    assert!(
        error > 0.0 && error < 1e-2,
        "bf16 logits {error:.2e} from f32's"
    );
}

#[test]
fn one_dimensional_and_unsigned_ids() {
    let mut c = config();
    c.tie_embeddings = true;
    c.norm = tinylm::config::Norm::Post;
    let s = Setup::new(c);
    let ids: Vec<u16> = vec![1, 22, 0, 7];
    let path = s.path("ids16.npy");
    npy::write(&path, &[4], &ids).unwrap();
    let out = s.run(&["--input", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "no loss without targets");
    let (shape, logits) = read_f32(&s.path("logits.npy"));
    assert_eq!(shape, vec![4, 23]);
    let mut model = Model::from_params(s.config.clone(), s.params.clone()).unwrap();
    assert_eq!(logits, model.forward(&[1, 22, 0, 7], 1, 4).unwrap());
}

#[test]
fn bad_configurations_are_named() {
    let s = Setup::new(config());
    let write_config = |json: &str| std::fs::write(s.path("config.json"), json).unwrap();
    let shape = r#""vocab_size":23,"context_length":8,"num_layers":2,"d_ff":32"#;
    write_config(&format!(r#"{{{shape},"d_model":12,"num_heads":5}}"#));
    s.fails(&[], "d_model 12 is not divisible by num_heads 5");
    write_config(&format!(r#"{{{shape},"d_model":12,"num_heads":4}}"#));
    s.fails(&[], "RoPE needs an even head dimension");
    s.fails(&[], "config.json");
}

#[test]
fn bad_ids_and_targets_are_named() {
    let s = Setup::new(config());
    let write = |name: &str, shape: &[usize], ids: &[i64]| {
        let path = s.path(name);
        npy::write(&path, shape, ids).unwrap();
        path.to_str().unwrap().to_string()
    };
    let big = write("big.npy", &[2, 3], &[0, 1, 2, 3, 23, 5]);
    s.fails(
        &["--input", &big],
        "big.npy: token id 23 at position (1, 1) is outside the vocabulary [0, 23)",
    );
    let negative = write("neg.npy", &[3], &[0, -1, 2]);
    s.fails(&["--input", &negative], "token id -1 at position (0, 1)");
    let long = write("long.npy", &[1, 9], &[0; 9]);
    s.fails(
        &["--input", &long],
        "long.npy: sequences of 9 tokens exceed the context length 8",
    );
    let cube = write("cube.npy", &[1, 2, 2], &[0; 4]);
    s.fails(&["--input", &cube], "must have shape (B, T) or (T,)");
    let floats = s.path("f.npy");
    npy::write(&floats, &[2], &[1.0f32, 2.0]).unwrap();
    s.fails(&["--input", floats.to_str().unwrap()], "must be integers");
    let short = write("short.npy", &[2, 4], &[0; 8]);
    s.fails(
        &["--targets", &short],
        "short.npy: targets have shape [2, 4], the input",
    );
    let bad_target = write("bt.npy", &[2, 5], &[0, 0, 0, 0, 0, 0, 0, 99, 0, 0]);
    s.fails(
        &["--targets", &bad_target],
        "token id 99 at position (1, 2)",
    );
}

#[test]
fn mismatched_weights_are_named() {
    let s = Setup::new(config());
    let layout = ParamLayout::new(&s.config);
    let mut tensors = layout.tensors(&s.params);
    tensors.retain(|(name, _, _)| name != "layers.1.ffn.w3.weight");
    tensors[0].1 = vec![23 * 12];
    let extra = [0.5f32; 3];
    tensors.push(("layers.0.attn.bias".into(), vec![3], &extra));
    let w = s.path("w.safetensors");
    save_safetensors(&w, &tensors, &BTreeMap::new()).unwrap();
    for part in [
        "w.safetensors",
        "missing tensor 'layers.1.ffn.w3.weight' of shape [32, 12]",
        "tensor 'token_embeddings.weight' has shape [276], expected [23, 12]",
        "unexpected tensor 'layers.0.attn.bias'",
    ] {
        s.fails(&[], part);
    }
    std::fs::write(&w, b"not safetensors").unwrap();
    s.fails(&[], "not a valid safetensors file");
    let targets = s.path("targets.npy");
    let out = s.run(&["--grads-out", targets.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "--grads-out requires --targets");
}
