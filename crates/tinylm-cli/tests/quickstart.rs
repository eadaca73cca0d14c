//! `tinylm quickstart` end to end on a small generated corpus with a seconds-long
//! budget, then `tinylm generate` on its checkpoint; on the embedded sample from an
//! empty directory; bad input exits with code 2.

use cli::{eval, failed, number_after, succeeded, tinylm};
use std::process::Command;

mod cli;

/// `n` short stories from a few templates, each followed by `<|endoftext|>`.
fn corpus(n: usize) -> String {
    let names = ["Lily", "Tom", "Mia", "Ben", "Sue"];
    let things = ["ball", "cat", "tree", "cake", "boat", "dog"];
    let feelings = ["happy", "sad", "sleepy", "brave"];
    let mut state = 12345u64;
    let mut pick = |items: &[&'static str]| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        items[(state >> 33) as usize % items.len()]
    };
    let mut out = String::new();
    for _ in 0..n {
        let (name, thing, feeling) = (pick(&names), pick(&things), pick(&feelings));
        out += &format!(
            "Once upon a time, {name} had a {thing}. {name} was {feeling}. \
             One day, {name} saw a big {}. \"Look!\" said {name}. The end.\n<|endoftext|>\n",
            pick(&things)
        );
    }
    out
}

/// Without `--corpus`, from a directory with nothing in it, the quickstart trains on
/// the TinyStories sample inside the binary.
#[test]
fn quickstart_trains_on_the_embedded_sample_from_any_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .args(["quickstart", "--minutes", "0.02", "--out", "run"])
        .current_dir(dir.path())
        .output()
        .expect("runs tinylm");
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("the TinyStories sample inside tinylm")
            && stdout.contains("5808 documents, 4.9 MB"),
        "{stdout}"
    );
    let samples = std::fs::read_to_string(dir.path().join("run/samples.txt")).unwrap();
    assert!(
        samples.starts_with("--- sample 1 ---\nOnce upon a time"),
        "{samples}"
    );
}

#[test]
fn quickstart_trains_evaluates_and_samples_then_generate_streams() {
    let dir = tempfile::tempdir().unwrap();
    let corpus_path = dir.path().join("stories.txt");
    std::fs::write(&corpus_path, corpus(400)).unwrap();
    let run = dir.path().join("run");
    let out = tinylm(&[
        "quickstart",
        "--corpus",
        corpus_path.to_str().unwrap(),
        "--minutes",
        "0.15",
        "--vocab-size",
        "300",
        "--threads",
        "2",
        "--out",
        run.to_str().unwrap(),
    ]);
    let stdout = succeeded(&out);
    for stage in [
        "[1/6]",
        "[2/6]",
        "[3/6]",
        "[4/6]",
        "[5/6]",
        "[6/6]",
        "validation loss",
    ] {
        assert!(stdout.contains(stage), "{stage} missing from\n{stdout}");
    }
    for file in [
        "tokenizer/vocab.json",
        "tokenizer/merges.txt",
        "train.npy",
        "val.npy",
        "log.jsonl",
        "loss.svg",
        "checkpoint.safetensors",
        "samples.txt",
    ] {
        assert!(run.join(file).is_file(), "{file} missing");
    }
    let samples = std::fs::read_to_string(run.join("samples.txt")).unwrap();
    assert!(samples.contains("--- sample 3 ---"), "{samples}");
    assert!(samples.contains("Once upon a time"), "{samples}");

    // The log: steps 1, 2, … with finite losses that fall.
    let log = std::fs::read_to_string(run.join("log.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(records.len() >= 3, "{log}");
    let loss = |r: &serde_json::Value| r["train_loss"].as_f64().unwrap();
    assert!(records.iter().all(|r| loss(r).is_finite()));
    assert!(
        loss(records.last().unwrap()) < loss(&records[0]),
        "training loss did not fall:\n{log}"
    );
    assert!(records.last().unwrap()["val_loss"].as_f64().is_some());
    // The report states the steps and tokens trained, as the log has them.
    let last = records.last().unwrap();
    let report = format!(
        "trained {} steps, {} tokens in",
        last["step"], last["tokens"]
    );
    assert!(stdout.contains(&report), "{report} missing from\n{stdout}");
    // The learning-rate schedule ran over the time budget.
    let ckpt = tinylm::checkpoint::load(&run.join("checkpoint.safetensors")).unwrap();
    let cfg: tinylm::train::TrainConfig = ckpt.meta("train_config", &run).unwrap();
    assert_eq!(cfg.schedule, tinylm::train::Schedule::Time);
    assert_eq!(cfg.time_budget_s, Some(0.15 * 60.0));

    // Greedy generation from the checkpoint (its tokenizer recorded inside) is
    // deterministic and continues the prompt.
    let ckpt = run.join("checkpoint.safetensors");
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--prompt",
            "Once upon a time,",
            "--max-tokens",
            "12",
        ];
        args.extend_from_slice(extra);
        succeeded(&tinylm(&args))
    };
    let greedy = generate(&["--temperature", "0"]);
    assert!(greedy.starts_with("Once upon a time,"), "{greedy}");
    assert!(greedy.len() > "Once upon a time,".len() + 1, "{greedy}");
    let tokenizer = run.join("tokenizer");
    assert_eq!(
        greedy,
        generate(&[
            "--temperature",
            "0",
            "--tokenizer",
            tokenizer.to_str().unwrap()
        ])
    );
    let sampled = generate(&["--temperature", "1.0", "--top-p", "0.9", "--seed", "3"]);
    assert_eq!(
        sampled,
        generate(&["--temperature", "1.0", "--top-p", "0.9", "--seed", "3"])
    );
}

fn assert_fails(args: &[&str], needle: &str) {
    failed(&tinylm(args), &[needle]);
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let one_doc = dir.path().join("one.txt");
    std::fs::write(&one_doc, "just one document without separators\n").unwrap();
    let out = dir.path().join("run");
    let one = one_doc.to_str().unwrap();
    let out_dir = out.to_str().unwrap();
    assert_fails(
        &["quickstart", "--corpus", one, "--out", out_dir],
        "<|endoftext|>",
    );
    assert_fails(
        &[
            "quickstart",
            "--corpus",
            "no/such/file.txt",
            "--out",
            out_dir,
        ],
        "no/such/file.txt",
    );
    assert_fails(
        &["quickstart", "--corpus", one, "--minutes", "0"],
        "--minutes",
    );
    // An unknown device, and CUDA in a build without it, fail before any work.
    let fresh = dir.path().join("fresh");
    let fresh_dir = fresh.to_str().unwrap();
    let on_device = |device| {
        [
            "quickstart",
            "--corpus",
            one,
            "--out",
            fresh_dir,
            "--device",
            device,
        ]
    };
    assert_fails(&on_device("gpu"), "'gpu'");
    if !cfg!(feature = "cuda") {
        assert_fails(&on_device("cuda"), "--features cuda");
    }
    assert!(
        !fresh.exists(),
        "nothing is written for a device it cannot use"
    );
    // A non-empty run directory is never overwritten.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "x").unwrap();
    assert_fails(
        &["quickstart", "--corpus", one, "--out", out_dir],
        "not empty",
    );

    let missing = dir.path().join("missing.safetensors");
    assert_fails(
        &["generate", "--checkpoint", missing.to_str().unwrap()],
        "missing.safetensors",
    );
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"not a checkpoint").unwrap();
    assert_fails(
        &["generate", "--checkpoint", garbage.to_str().unwrap()],
        "garbage.safetensors",
    );
    assert_fails(
        &["generate", "--checkpoint", "x", "--top-p", "1.5"],
        "top_p",
    );
}

/// Generation's reduced-precision weights cost little: a quickstart model's
/// perplexity on its held-out text with bf16 products and with 8-bit (q8_0)
/// weights lies within 1% of its `f32` perplexity.
#[test]
fn bf16_and_q8_0_weights_keep_the_f32_perplexity() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    succeeded(&tinylm(&[
        "quickstart",
        "--minutes",
        "0.1",
        "--out",
        run.to_str().unwrap(),
    ]));
    let (ckpt, val) = (run.join("checkpoint.safetensors"), run.join("val.npy"));
    let perplexity = |precision: &str| -> f64 {
        let out = eval(
            &ckpt,
            &val,
            &["--max-batches", "4", "--precision", precision],
        );
        number_after(&succeeded(&out), "perplexity ")
    };
    let f32_ppl = perplexity("fp32");
    assert!(f32_ppl > 5.0, "a model still learning: {f32_ppl}");
    for precision in ["bf16", "q8_0"] {
        let ppl = perplexity(precision);
        assert!(
            (ppl / f32_ppl - 1.0).abs() < 0.01,
            "{precision}: perplexity {ppl} against f32's {f32_ppl}"
        );
    }
}
