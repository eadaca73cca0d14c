//! `tinylm train` and `tinylm eval` end to end: config file plus flags, outputs,
//! resume with the recorded configuration, Ctrl-C, and errors (exit code 2).

use cli::{eval, number_after, text, tinylm};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod cli;

/// Byte-level token files of a repetitive little text, and a TOML config for them.
fn setup(dir: &Path) -> PathBuf {
    let settings = format!(
        "out_dir = \"{}/run\"
batch_size = 4
steps = 1000
lr_max = 0.01
warmup_steps = 2
eval_interval = 10
eval_batches = 2
log_interval = 1
threads = 2
",
        dir.display()
    );
    let config = dir.join("run.toml");
    std::fs::write(&config, cli::byte_run(dir, &settings)).unwrap();
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

    let out = eval(&ckpt, &dir.path().join("val.npy"), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let (loss, ppl) = (
        number_after(&line, "val_loss "),
        number_after(&line, "perplexity "),
    );
    assert!((ppl - loss.exp()).abs() < 1e-2 * ppl, "{line}");
    // The full validation pass of the last training step matches.
    assert!(loss < 5.0, "{line}");

    let ckpt = ckpt.to_str().unwrap();
    // Resuming with another model shape: exit 2 naming the flag and the key.
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
    assert!(text(&out).contains("--d-model") && text(&out).contains("d_model"));
    // Resuming with the same configuration continues from step 20.
    let out = tinylm(&[
        "train", "--config", config, "--resume", ckpt, "--steps", "25",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let log = std::fs::read_to_string(dir.path().join("run/log.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 25);
}

fn log_of(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn resume_with_no_flags_continues_the_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let config = config.to_str().unwrap();
    let flags = |out: &str| {
        let out = dir.path().join(out);
        let out = out.to_str().unwrap().to_string();
        [
            "--config",
            config,
            "--steps",
            "24",
            "--seed",
            "5",
            "--out-dir",
        ]
        .map(String::from)
        .into_iter()
        .chain([out])
        .collect::<Vec<String>>()
    };
    let train = |extra: &[String]| {
        let mut args = vec!["train".to_string()];
        args.extend_from_slice(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tinylm(&args)
    };
    let out = train(&flags("straight"));
    assert!(out.status.success(), "{}", text(&out));

    // The same run, stopped after step 10 as Ctrl-C stops it (the handler sets the
    // flag the loop reads after each step), with the configuration the CLI resolves.
    let mut print = flags("resumed");
    print.push("--print-config".into());
    let out = train(&print);
    assert!(out.status.success(), "{}", text(&out));
    let cfg: tinylm::train::TrainConfig = serde_json::from_slice(&out.stdout).unwrap();
    let stop = AtomicBool::new(false);
    let first = tinylm::train::train(
        &cfg,
        &tinylm::distributed::World::single(),
        &stop,
        &mut |p| {
            if p.record.step == 9 {
                stop.store(true, Ordering::Relaxed);
            }
        },
    )
    .unwrap();
    assert_eq!((first.steps, first.stopped_early), (10, true));

    // Resume with no other flag: the recorded run continues to its planned end.
    let ckpt = first.checkpoint.to_str().unwrap().to_string();
    let out = train(&["--resume".into(), ckpt.clone()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("with its recorded configuration") && !text(&out).contains("changed"),
        "{}",
        text(&out)
    );
    let (straight, resumed) = (log_of(&dir.path().join("straight")), log_of(&cfg.out_dir));
    assert_eq!(resumed.len(), 24);
    let losses = |log: &[serde_json::Value]| -> Vec<String> {
        let keys = [
            "step",
            "tokens",
            "train_loss",
            "val_loss",
            "lr",
            "grad_norm",
        ];
        log.iter()
            .map(|r| keys.map(|k| r[k].to_string()).join(" "))
            .collect()
    };
    assert_eq!(losses(&straight), losses(&resumed));
    let load = |run: &str| {
        tinylm::checkpoint::load(&dir.path().join(run).join("checkpoint.safetensors")).unwrap()
    };
    let (a, b) = (load("straight"), load("resumed"));
    assert_eq!(a.params, b.params);
    assert_eq!(a.optimizer, b.optimizer);

    // The run is at its end: resuming again has nothing to do.
    let out = train(&["--resume".into(), ckpt.clone()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nothing to do"), "{}", text(&out));

    // A flag that changes the model is refused, named; nothing is written.
    let log_before = std::fs::read(cfg.out_dir.join("log.jsonl")).unwrap();
    for (flags, named) in [
        (
            vec!["--d-model", "64"],
            "--d-model 64 (the checkpoint's d_model is 32)",
        ),
        (vec!["--tie-embeddings", "true"], "--tie-embeddings true"),
        (vec!["--preset", "tinystories"], "of --preset tinystories"),
    ] {
        let mut args = vec!["--resume".to_string(), ckpt.clone()];
        args.extend(flags.iter().map(|f| f.to_string()));
        let out = train(&args);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", text(&out));
        assert!(text(&out).contains(named), "{flags:?}: {}", text(&out));
        assert!(text(&out).contains("keeps its model"), "{}", text(&out));
    }
    assert_eq!(
        std::fs::read(cfg.out_dir.join("log.jsonl")).unwrap(),
        log_before
    );

    // A schedule change is allowed and printed: 6 more steps at another peak rate.
    let out = train(&[
        "--resume".into(),
        ckpt,
        "--steps".into(),
        "30".into(),
        "--lr-max".into(),
        "0.005".into(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("changed: lr_max 0.01 -> 0.005, steps 24 -> 30"),
        "{stdout}"
    );
    let log = log_of(&cfg.out_dir);
    assert_eq!(log.len(), 30);
    assert_eq!(losses(&log[..24]), losses(&straight));
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
    let out = eval(&corrupt, &dir.path().join("val.npy"), &[]);
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
    assert!(
        text(&out).contains("resume with: tinylm train --resume"),
        "{}",
        text(&out)
    );
    let ckpt = tinylm::checkpoint::load(&dir.path().join("run/checkpoint.safetensors")).unwrap();
    let step: u64 = ckpt.meta("step", Path::new("ckpt")).unwrap();
    assert!((5..1_000_000).contains(&step), "{step}");
    // The final record of an interrupted run carries a validation loss.
    let last = std::fs::read_to_string(&log).unwrap();
    let last: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], step);
    assert!(last["val_loss"].is_number());
}
