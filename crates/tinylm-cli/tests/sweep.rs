//! `tinylm sweep` end to end on a tiny model: a 2×2 grid with a diverging point, a
//! sweep killed and started again, the ablation presets, and bad input (one line
//! naming the key or value, exit code 2).

use cli::{text, tinylm};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};
use tempfile::TempDir;

mod cli;

/// A base configuration in a temporary folder, and the folder a sweep of it writes.
struct Sweep {
    config: String,
    out: PathBuf,
    /// Holds the folder until the test ends.
    _dir: TempDir,
}

impl Sweep {
    /// Byte-level token files of a repetitive little text, and a TOML base
    /// configuration of `steps` steps for them.
    fn new(steps: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let settings = format!(
            "batch_size = 4
steps = {steps}
warmup_steps = 2
grad_clip = 0.0
eval_interval = 20
eval_batches = 2
log_interval = 5
checkpoint_interval = 20
threads = 1
"
        );
        let config = dir.path().join("base.toml");
        std::fs::write(&config, cli::byte_run(dir.path(), &settings)).unwrap();
        Sweep {
            config: config.to_string_lossy().into_owned(),
            out: dir.path().join("sweep"),
            _dir: dir,
        }
    }

    /// `tinylm sweep --config CONFIG --out OUT` and the flags `extra`.
    fn args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "sweep",
            "--config",
            &self.config,
            "--out",
            self.out.to_str().unwrap(),
        ];
        args.extend(extra);
        args
    }
}

fn summary(run: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(run.join("summary.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_grid_with_a_diverging_point_gives_every_run_a_summary_and_a_plot() {
    let sweep = Sweep::new(40);
    let out = &sweep.out;
    let args = sweep.args(&[
        "--grid",
        "lr_max=1e-2,30",
        "--grid",
        "d_model=16,32",
        "--parallel",
        "2",
    ]);
    let run = tinylm(&args);
    assert!(run.status.success(), "{}", text(&run));
    for (lr, status) in [("1e-2", "finished"), ("30", "diverged")] {
        for d in ["16", "32"] {
            let run_dir = out.join(format!("lr_max={lr},d_model={d}"));
            let s = summary(&run_dir);
            assert_eq!(s["status"], status, "{}", run_dir.display());
            let config = std::fs::read_to_string(run_dir.join("config.json")).unwrap();
            let config: serde_json::Value = serde_json::from_str(&config).unwrap();
            assert_eq!(config["model"]["d_model"].to_string(), d);
            assert!(run_dir.join("tensorboard").is_dir());
            let log = std::fs::read_to_string(run_dir.join("log.jsonl")).unwrap();
            match status {
                "finished" => assert_eq!(s["steps"], 40),
                // The curve is kept up to the divergence.
                _ => {
                    let at = s["diverged"]["step"].as_u64().unwrap();
                    assert!(at < 40 && !log.is_empty(), "{s}");
                }
            }
        }
    }
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "{csv}");
    assert!(lines[0].starts_with("lr_max,d_model,status,steps,train_loss,val_loss"));
    assert!(lines[1].starts_with("1e-2,16,finished,40,"), "{csv}");
    assert!(lines[3].starts_with("30,16,diverged at step"), "{csv}");
    for plot in ["loss.svg", "loss.png", "loss_wall.svg", "loss_wall.png"] {
        assert!(out.join(plot).metadata().unwrap().len() > 1000, "{plot}");
    }
    // The table names every run's values and status.
    let printed = text(&run);
    assert!(printed.contains("diverged at step") && printed.contains("finished"));

    // Started again: every run ended, nothing is redone.
    let log = out.join("lr_max=1e-2,d_model=16/log.jsonl");
    let before = std::fs::metadata(&log).unwrap().modified().unwrap();
    let again = tinylm(&args);
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(std::fs::metadata(&log).unwrap().modified().unwrap(), before);
    assert_eq!(
        std::fs::read_to_string(out.join("summary.csv")).unwrap(),
        csv
    );
}

#[test]
fn a_killed_sweep_started_again_resumes_without_redoing_finished_runs() {
    let sweep = Sweep::new(1500);
    let out = &sweep.out;
    let args = sweep.args(&["--grid", "lr_max=1e-2,3e-3", "--grid", "seed=0,1"]);
    let first = out.join("lr_max=1e-2,seed=0");
    let second = out.join("lr_max=1e-2,seed=1");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the first run ended and the second wrote a checkpoint.
    let deadline = Instant::now() + Duration::from_secs(300);
    while !(first.join("summary.json").exists() && second.join("checkpoint.safetensors").exists()) {
        assert!(Instant::now() < deadline, "the sweep made no progress");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sweep ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!second.join("summary.json").exists(), "killed too late");
    let modified = |p: &Path| -> SystemTime { p.metadata().unwrap().modified().unwrap() };
    let first_log = modified(&first.join("log.jsonl"));

    let again = tinylm(&args);
    assert!(again.status.success(), "{}", text(&again));
    let printed = text(&again);
    assert!(
        printed.contains("lr_max=1e-2,seed=1: resuming at step"),
        "{printed}"
    );
    assert_eq!(
        modified(&first.join("log.jsonl")),
        first_log,
        "the finished run was redone"
    );
    for run in [
        "lr_max=1e-2,seed=0",
        "lr_max=1e-2,seed=1",
        "lr_max=3e-3,seed=0",
        "lr_max=3e-3,seed=1",
    ] {
        let s = summary(&out.join(run));
        assert_eq!(
            (s["status"].as_str(), s["steps"].as_u64()),
            (Some("finished"), Some(1500)),
            "{run}"
        );
    }
    // The resumed run's log has every logged step once.
    let log = std::fs::read_to_string(second.join("log.jsonl")).unwrap();
    let steps: Vec<u64> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, (1..=300).map(|k| 5 * k).collect::<Vec<_>>());
}

#[test]
fn the_ablation_presets_change_the_model_as_the_handout_says() {
    let sweep = Sweep::new(10);
    let run = tinylm(&sweep.args(&[
        "--list",
        "baseline,no-norm,post-norm,nope,silu",
        "--list",
        "wide:d_model=64,num_heads=4",
        "--print-config",
    ]));
    assert!(run.status.success(), "{}", text(&run));
    let printed = String::from_utf8_lossy(&run.stdout).into_owned();
    let configs: Vec<(String, serde_json::Value)> = printed
        .split("# ")
        .skip(1)
        .map(|part| {
            let (name, json) = part.split_once('\n').unwrap();
            (name.to_string(), serde_json::from_str(json).unwrap())
        })
        .collect();
    let model = |name: &str| configs.iter().find(|(n, _)| n == name).unwrap().1["model"].clone();
    assert_eq!(configs.len(), 6);
    assert_eq!(
        (
            model("baseline")["norm"].as_str(),
            model("baseline")["ffn"].as_str()
        ),
        (Some("pre"), Some("swiglu"))
    );
    assert_eq!(model("no-norm")["norm"], "none");
    assert_eq!(model("post-norm")["norm"], "post");
    assert_eq!(model("nope")["positional"], "none");
    assert_eq!(
        (
            model("silu")["ffn"].as_str(),
            model("silu")["d_ff"].as_u64()
        ),
        (Some("silu"), Some(4 * 32))
    );
    assert_eq!(
        (
            model("wide")["d_model"].as_u64(),
            model("wide")["num_heads"].as_u64()
        ),
        (Some(64), Some(4))
    );
    assert!(!sweep.out.exists(), "--print-config trained");
}

#[test]
fn bad_axes_and_variants_are_one_line_naming_them() {
    let sweep = Sweep::new(10);
    for (extra, expected) in [
        (vec!["--grid", "lr_mx=1e-3,1e-2"], "unknown key `lr_mx`"),
        (vec!["--grid", "lr_max=1e-3,fast"], "value `fast`"),
        (vec!["--grid", "batch_size=4,2.5"], "value `2.5`"),
        (vec!["--grid", "lr_max="], "`lr_max` has no values"),
        (vec!["--grid", "lr_max"], "expected KEY=V1,V2"),
        (vec!["--grid", "out_dir=a,b"], "`out_dir` cannot be swept"),
        (
            vec!["--list", "no-norm,sideways"],
            "unknown variant `sideways`",
        ),
        (vec!["--grid", "lr_max=1e-3,1e-3"], "lists 1e-3 twice"),
        (vec![], "nothing to sweep"),
    ] {
        let run = tinylm(&sweep.args(&extra));
        let stderr = String::from_utf8_lossy(&run.stderr).trim().to_string();
        assert_eq!(run.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    assert!(!sweep.out.exists(), "a bad sweep wrote its directory");
}
