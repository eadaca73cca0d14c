//! The training loop: loss falls on text, logs and plots, bit-exact resume,
//! divergence and config mismatches.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use tinylm::data::SplitMix64;
use tinylm::train::{train, LogRecord, Progress, TrainConfig};
use tinylm::{checkpoint, ModelConfig};
use tinylm_bpe::npy;

/// Byte-level ids of `n` generated sentences ("the small dog sees a red ball. …").
fn corpus(n: usize, seed: u64) -> Vec<u16> {
    let subjects = [
        "the dog",
        "a cat",
        "the little girl",
        "tom",
        "the old man",
        "a bird",
    ];
    let verbs = ["sees", "likes", "finds", "wants", "has", "plays with"];
    let adjectives = ["a red", "the big", "a small", "the happy", "a blue"];
    let objects = ["ball.", "tree.", "house.", "box.", "flower.", "friend."];
    let mut rng = SplitMix64::new(seed);
    let mut pick = |words: &[&'static str]| words[rng.below(words.len() as u64) as usize];
    let mut text = String::new();
    for _ in 0..n {
        let s = [
            pick(&subjects),
            pick(&verbs),
            pick(&adjectives),
            pick(&objects),
        ];
        text += &s.join(" ");
        text.push('\n');
    }
    text.bytes().map(u16::from).collect()
}

fn setup(dir: &Path) -> TrainConfig {
    let write = |name: &str, ids: &[u16]| -> PathBuf {
        let p = dir.join(name);
        npy::write(&p, &[ids.len()], ids).unwrap();
        p
    };
    TrainConfig {
        model: ModelConfig {
            vocab_size: 256,
            context_length: 32,
            d_model: 32,
            num_layers: 2,
            num_heads: 2,
            d_ff: 64,
            ..ModelConfig::tinystories()
        },
        train_data: write("train.npy", &corpus(2000, 1)),
        val_data: Some(write("val.npy", &corpus(100, 2))),
        out_dir: dir.join("run"),
        batch_size: 8,
        steps: 60,
        lr_max: 1e-2,
        lr_min: 1e-3,
        warmup_steps: 5,
        eval_interval: 20,
        eval_batches: 4,
        checkpoint_interval: 0,
        log_interval: 1,
        threads: 2,
        ..TrainConfig::default()
    }
}

fn read_log(cfg: &TrainConfig) -> Vec<LogRecord> {
    std::fs::read_to_string(cfg.out_dir.join("log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn never() -> AtomicBool {
    AtomicBool::new(false)
}

#[test]
fn loss_falls_and_outputs_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path());
    let mut seen = 0;
    let summary = train(&cfg, &never(), &mut |p: &Progress| {
        seen += 1;
        assert_eq!(p.total_steps, 60);
    })
    .unwrap();
    assert_eq!((seen, summary.steps, summary.tokens), (60, 60, 60 * 8 * 32));
    assert!(!summary.stopped_early);

    let log = read_log(&cfg);
    assert_eq!(log.len(), 60);
    let first = log[0].train_loss;
    assert!((first - 256f64.ln()).abs() < 0.7, "initial loss {first}");
    let last: f64 = log[50..].iter().map(|r| r.train_loss).sum::<f64>() / 10.0;
    assert!(last < 2.5 && last < first - 2.5, "loss {first} -> {last}");
    let evals: Vec<u64> = log
        .iter()
        .filter(|r| r.val_loss.is_some())
        .map(|r| r.step)
        .collect();
    assert_eq!(evals, vec![20, 40, 60]);
    assert!(summary.val_loss.unwrap() < 2.5);
    assert_eq!(log[0].lr, 0.0); // warm-up starts at 0 (SPEC schedule, t = 0)
    assert!(log
        .iter()
        .all(|r| r.grad_norm > 0.0 && r.tokens_per_s > 0.0));
    let line = std::fs::read_to_string(cfg.out_dir.join("log.jsonl")).unwrap();
    let keys: Vec<String> = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(
        line.lines().next().unwrap(),
    )
    .unwrap()
    .keys()
    .cloned()
    .collect();
    let mut want = [
        "step",
        "tokens",
        "wallclock_s",
        "train_loss",
        "val_loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
    ];
    want.sort();
    assert_eq!(keys, want);

    let svg = std::fs::read_to_string(cfg.out_dir.join("loss.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("wall-clock"));
    let ckpt = checkpoint::load(&summary.checkpoint).unwrap();
    assert_eq!(ckpt.meta::<u64>("step", &summary.checkpoint).unwrap(), 60);
    assert_eq!(ckpt.optimizer.unwrap().step, 60);
}

#[test]
fn resumed_run_equals_uninterrupted_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    cfg.steps = 24;
    cfg.out_dir = dir.path().join("straight");
    train(&cfg, &never(), &mut |_: &Progress| {}).unwrap();
    let straight = read_log(&cfg);

    // Stop after step 10 (as Ctrl-C would: the flag is read after each update, so
    // setting it while reporting step 9 ends the run after step 10), then resume.
    cfg.out_dir = dir.path().join("resumed");
    let stop = AtomicBool::new(false);
    let s = train(&cfg, &stop, &mut |p: &Progress| {
        if p.record.step == 9 {
            stop.store(true, Ordering::Relaxed);
        }
    })
    .unwrap();
    assert!(s.stopped_early);
    assert_eq!(s.steps, 10);
    cfg.resume = Some(s.checkpoint.clone());
    let s = train(&cfg, &never(), &mut |_: &Progress| {}).unwrap();
    assert_eq!(s.steps, 24);
    let resumed = read_log(&cfg);

    let losses = |log: &[LogRecord]| -> Vec<(u64, u64, f64, f64)> {
        log.iter()
            .map(|r| (r.step, r.train_loss.to_bits(), r.lr, r.grad_norm))
            .collect()
    };
    assert_eq!(losses(&straight), losses(&resumed));
    let a = checkpoint::load(&dir.path().join("straight/checkpoint.safetensors")).unwrap();
    let b = checkpoint::load(&s.checkpoint).unwrap();
    assert_eq!(a.params, b.params);
    assert_eq!(a.optimizer, b.optimizer);
}

#[test]
fn bad_resume_divergence_and_data_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    cfg.steps = 2;
    let s = train(&cfg, &never(), &mut |_: &Progress| {}).unwrap();

    // Resume with another model shape.
    let mut other = cfg.clone();
    other.model.d_model = 64;
    other.steps = 4;
    other.resume = Some(s.checkpoint.clone());
    let e = train(&other, &never(), &mut |_: &Progress| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("checkpoint.safetensors") && e.contains("d_model"),
        "{e}"
    );

    // Divergence: a absurd learning rate without clipping; the last good checkpoint stays.
    let mut wild = cfg.clone();
    wild.out_dir = dir.path().join("wild");
    wild.steps = 50;
    wild.lr_max = 1e8;
    wild.lr_min = 1e8;
    wild.warmup_steps = 0;
    wild.grad_clip = 0.0;
    wild.checkpoint_interval = 1;
    let e = train(&wild, &never(), &mut |_: &Progress| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("diverged") && e.contains("last good checkpoint"),
        "{e}"
    );
    let kept = checkpoint::load(&wild.out_dir.join("checkpoint.safetensors")).unwrap();
    assert!(kept.params.iter().all(|x| x.is_finite()));

    // Ids outside the model's vocabulary.
    let mut small_vocab = cfg.clone();
    small_vocab.model.vocab_size = 100;
    let e = train(&small_vocab, &never(), &mut |_: &Progress| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("train.npy") && e.contains("element"), "{e}");
    // A validation file shorter than the context.
    let short = dir.path().join("short.npy");
    npy::write(&short, &[5], &[1u16, 2, 3, 4, 5]).unwrap();
    let mut c = cfg.clone();
    c.val_data = Some(short);
    let e = train(&c, &never(), &mut |_: &Progress| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("short.npy") && e.contains("context length 32"),
        "{e}"
    );
}

#[test]
fn config_keys_defaults_and_token_budget() {
    let cfg: TrainConfig =
        serde_json::from_str(r#"{"train_data": "t.npy", "batch_size": 4, "max_tokens": 10000}"#)
            .unwrap();
    assert_eq!(cfg.model, ModelConfig::tinystories());
    assert_eq!(cfg.total_steps(), 10); // ceil(10000 / (4 · 256))
    assert!(cfg.validate().is_ok());
    let e = serde_json::from_str::<TrainConfig>(r#"{"learning_rate": 1}"#).unwrap_err();
    assert!(e.to_string().contains("learning_rate"));
    for (field, bad) in [("beta2", "1.0"), ("eps", "0.0"), ("lr_max", "-1.0")] {
        let json = format!(r#"{{"train_data": "t.npy", "{field}": {bad}}}"#);
        let e = serde_json::from_str::<TrainConfig>(&json)
            .unwrap()
            .validate();
        assert!(e.unwrap_err().to_string().contains(field), "{field}");
    }
    let e = TrainConfig::default().validate().unwrap_err().to_string();
    assert!(e.contains("train_data"), "{e}");
}

/// Adds coverage with real text when the shared corpus is present.
#[test]
fn loss_falls_on_real_text_when_available() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/tiny_shakespeare.txt");
    let Ok(text) = std::fs::read(&path) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    let ids: Vec<u16> = text[..200_000].iter().map(|&b| u16::from(b)).collect();
    cfg.train_data = dir.path().join("shakespeare.npy");
    npy::write(&cfg.train_data, &[ids.len()], &ids).unwrap();
    cfg.val_data = None;
    cfg.steps = 80;
    cfg.lr_max = 5e-3;
    let s = train(&cfg, &never(), &mut |_: &Progress| {}).unwrap();
    let log = read_log(&cfg);
    let late: f64 = log[70..].iter().map(|r| r.train_loss).sum::<f64>() / 10.0;
    assert!(
        late < log[0].train_loss - 2.0 && late < 3.3,
        "{} -> {late}",
        log[0].train_loss
    );
    assert_eq!(s.val_loss, None);
}
