//! `tinylm plot` on hand-written run directories (no training): SVG and PNG out,
//! bad input exits 2 with one line naming it.

use std::path::Path;
use std::process::Command;
use tinylm::train::{LogRecord, TrainConfig};

fn plot(args: &[&str], cwd: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .arg("plot")
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code(), text(out.stdout), text(out.stderr))
}

/// A run directory with `config.json` (learning rate `lr_max`) and a `log.jsonl` of
/// ten steps, validated every fifth.
fn write_run(dir: &Path, lr_max: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let config = TrainConfig {
        lr_max,
        out_dir: dir.to_path_buf(),
        ..TrainConfig::default()
    };
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string(&config).unwrap(),
    )
    .unwrap();
    let log: String = (1..=10u64)
        .map(|step| {
            let record = LogRecord {
                step,
                tokens: 256 * step,
                wallclock_s: 0.1 * step as f64,
                train_loss: 6.0 / step as f64,
                val_loss: (step % 5 == 0).then_some(5.0 / step as f64),
                lr: lr_max,
                grad_norm: 1.0,
                tokens_per_s: 2560.0,
            };
            serde_json::to_string(&record).unwrap() + "\n"
        })
        .collect();
    std::fs::write(dir.join("log.jsonl"), log).unwrap();
}

#[test]
fn plot_writes_svg_and_png() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("sweep");
    write_run(&sweep.join("lr1"), 1e-3);
    write_run(&sweep.join("lr2"), 3e-3);
    write_run(&tmp.path().join("single"), 1e-2);
    let (code, stdout, stderr) = plot(&["sweep", "single", "--out", "cmp.svg"], tmp.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "wrote cmp.svg (3 runs)");
    let svg = std::fs::read_to_string(tmp.path().join("cmp.svg")).unwrap();
    assert!(svg.contains("lr_max=0.003") && svg.contains("lr_max=0.01"));
    // Default output: loss.png in the current directory.
    let args = [
        "sweep", "--x", "tokens", "--log-x", "--log-y", "--title", "sweep",
    ];
    let (code, stdout, stderr) = plot(&args, tmp.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "wrote loss.png (2 runs)");
    let png = std::fs::read(tmp.path().join("loss.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
}

#[test]
fn plot_bad_input_is_one_line_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("empty/sub")).unwrap();
    let (code, _, stderr) = plot(&["empty"], tmp.path());
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        "error: empty: no runs (no log.jsonl in it or its subdirectories)\n"
    );
    write_run(&tmp.path().join("run"), 1e-3);
    let (code, _, stderr) = plot(&["run", "--out", "loss.jpg"], tmp.path());
    assert_eq!(code, Some(2));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("loss.jpg") && stderr.contains(".svg or .png"),
        "{stderr}"
    );
    assert!(!tmp.path().join("loss.jpg").exists());
    let (code, _, stderr) = plot(&["run", "--x", "epoch"], tmp.path());
    assert_eq!(code, Some(2));
    assert!(stderr.contains("step, tokens or wall"), "{stderr}");
}
