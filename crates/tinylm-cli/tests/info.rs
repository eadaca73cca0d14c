//! `tinylm info` from a preset, a config file and shape flags; bad input exits 2.

use std::process::Command;

fn info(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .arg("info")
        .args(args)
        .output()
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code(), text(out.stdout), text(out.stderr))
}

#[test]
fn preset_file_and_flags_agree() {
    let (code, preset, _) = info(&["--preset", "gpt2-xl"]);
    assert_eq!(code, Some(0));
    assert!(
        preset.contains("2,127,057,600") && preset.contains("4.51 TFLOP"),
        "{preset}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xl.json");
    let (code, printed, _) = info(&["--preset", "gpt2-xl", "--print-config"]);
    assert_eq!(code, Some(0));
    assert_eq!(printed.trim_end(), tinylm::ModelConfig::gpt2_xl().to_json());
    std::fs::write(&path, printed).unwrap();
    let (_, file, _) = info(&["--model-config", path.to_str().unwrap()]);
    assert_eq!(file, preset);
    let shape = [
        "--vocab-size",
        "50257",
        "--context-length",
        "1024",
        "--d-model",
        "1600",
        "--num-layers",
        "48",
        "--num-heads",
        "25",
        "--d-ff",
        "6400",
    ];
    let (_, flags, _) = info(&shape);
    assert_eq!(flags, preset);
    // Flags override a preset: SiLU drops w3 (48 · 1,600 · 6,400 parameters).
    let (_, silu, _) = info(&["--preset", "gpt2-xl", "--ffn", "silu", "--batch-size", "4"]);
    assert!(
        silu.contains("1,635,537,600") && silu.contains("batch 4 × 1024"),
        "{silu}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--d-model", "64"],
            "missing --vocab-size, --context-length, --num-layers",
        ),
        (
            &["--preset", "gpt2-xl", "--num-heads", "7"],
            "not divisible by num_heads 7",
        ),
        (
            &["--preset", "tinystories", "--seq-len", "257"],
            "--seq-len 257 exceeds the context length 256",
        ),
        (&["--preset", "gpt9"], "invalid value 'gpt9' for '--preset"),
    ];
    for (args, message) in cases {
        let (code, _, stderr) = info(args);
        assert_eq!(code, Some(2), "{args:?}");
        assert!(stderr.contains(message), "'{message}' not in {stderr}");
    }
}
