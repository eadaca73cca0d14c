//! `tinylm train` and `tinylm eval` end to end: config file plus flags, outputs,
//! Ctrl-C, and errors (exit code 2).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tinylm_bpe::npy;

fn tinylm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Byte-level token files of a repetitive little text, and a TOML config for them.
fn setup(dir: &Path) -> PathBuf {
    let corpus = "once upon a time a small cat found a red ball in the garden.\n".repeat(80);
    let ids: Vec<u16> = corpus.bytes().map(u16::from).collect();
    let (train, val) = ids.split_at(ids.len() * 9 / 10);
    npy::write(&dir.join("train.npy"), &[train.len()], train).unwrap();
    npy::write(&dir.join("val.npy"), &[val.len()], val).unwrap();
    let config = dir.join("run.toml");
    let toml = format!(
        r#"train_data = "{0}/train.npy"
val_data = "{0}/val.npy"
out_dir = "{0}/run"
batch_size = 4
steps = 1000
lr_max = 0.01
warmup_steps = 2
eval_interval = 10
eval_batches = 2
log_interval = 1
threads = 2

[model]
vocab_size = 256
context_length = 16
d_model = 32
num_layers = 1
num_heads = 2
d_ff = 64
"#,
        dir.display()
    );
    std::fs::write(&config, toml).unwrap();
    config
}

#[test]
fn train_then_eval() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let config = config.to_str().unwrap();
    // Flags override the file: 20 steps instead of 1000.
    let out = tinylm(&["train", "--config", config, "--steps", "20", "--seed", "3"]);
    assert!(out.status.success(), "{}", text(&out));
    let log = std::fs::read_to_string(dir.path().join("run/log.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 20);
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 20);
    assert!(last["val_loss"].as_f64().unwrap() < 5.0);
    assert!(dir.path().join("run/loss.svg").exists());
    let ckpt = dir.path().join("run/checkpoint.safetensors");
    let ckpt = ckpt.to_str().unwrap();

    let val = dir.path().join("val.npy");
    let out = tinylm(&[
        "eval",
        "--checkpoint",
        ckpt,
        "--data",
        val.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |name: &str| -> f64 {
        let at = line.find(name).unwrap() + name.len();
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (loss, ppl) = (field("val_loss "), field("perplexity "));
    assert!((ppl - loss.exp()).abs() < 1e-2 * ppl, "{line}");
    // The full validation pass of the last training step matches.
    assert!(loss < 5.0, "{line}");

    // Resuming with another model shape: exit 2 naming the key.
    let out = tinylm(&[
        "train",
        "--config",
        config,
        "--resume",
        ckpt,
        "--d-model",
        "64",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("d_model"), "{}", text(&out));
    // Resuming with the same configuration continues from step 20.
    let out = tinylm(&[
        "train", "--config", config, "--resume", ckpt, "--steps", "25",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let log = std::fs::read_to_string(dir.path().join("run/log.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 25);
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let config = config.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--vocab-size", "100"], "train.npy"),
        (vec!["--context-length", "4000"], "context length 4000"),
        (vec!["--norm", "sideways"], "sideways"),
        (vec!["--batch-size", "0"], "batch_size"),
    ];
    for (flags, expect) in cases {
        let mut args = vec!["train", "--config", config];
        args.extend(flags);
        let out = tinylm(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(expect), "{args:?}: {}", text(&out));
    }
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "learning_rate = 3\n").unwrap();
    let out = tinylm(&["train", "--config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("bad.toml") && text(&out).contains("learning_rate"));

    let corrupt = dir.path().join("corrupt.safetensors");
    std::fs::write(&corrupt, b"not a checkpoint").unwrap();
    let val = dir.path().join("val.npy");
    let out = tinylm(&[
        "eval",
        "--checkpoint",
        corrupt.to_str().unwrap(),
        "--data",
        val.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("corrupt.safetensors"), "{}", text(&out));
}

#[test]
fn ctrl_c_saves_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let child = Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .args(["train", "--config", config.to_str().unwrap()])
        .args(["--steps", "1000000", "--eval-interval", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for a few logged steps, then interrupt.
    let log = dir.path().join("run/log.jsonl");
    let start = Instant::now();
    while std::fs::read_to_string(&log).map_or(0, |l| l.lines().count()) < 5 {
        assert!(start.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("resume with"), "{}", text(&out));
    let ckpt = tinylm::checkpoint::load(&dir.path().join("run/checkpoint.safetensors")).unwrap();
    let step: u64 = ckpt.meta("step", Path::new("ckpt")).unwrap();
    assert!((5..1_000_000).contains(&step), "{step}");
    // The final record of an interrupted run carries a validation loss.
    let last = std::fs::read_to_string(&log).unwrap();
    let last: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], step);
    assert!(last["val_loss"].is_number());
}
