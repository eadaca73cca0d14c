//! `tinylm bench`, `bench-matmul` and `bench-allreduce` on a tiny model: they run,
//! report every figure, and reject bad arguments with exit code 2.

use cli::{succeeded, tinylm};

mod cli;

const TINY: [&str; 14] = [
    "bench",
    "--vocab-size",
    "64",
    "--context-length",
    "16",
    "--d-model",
    "16",
    "--num-layers",
    "1",
    "--num-heads",
    "2",
    "--d-ff",
    "32",
    "--no-peak",
];

/// The products' line of `tinylm bench` in `precision`: gemm's in fp32, tinylm's
/// bf16 kernels (native or portable, whatever the CPU) in bf16.
fn products_line(precision: &str) -> &'static str {
    match precision {
        "fp32" => "matrix products: gemm's ",
        _ => "matrix products: tinylm's bf16 kernels, ",
    }
}

#[test]
fn bench_reports_throughput_and_breakdown() {
    for precision in ["fp32", "bf16"] {
        let mut args = TINY.to_vec();
        args.extend(["--batch-size", "2", "--steps", "2", "--threads", "1"]);
        args.extend(["--precision", precision]);
        let text = succeeded(&tinylm(&args));
        for want in [
            "tokens/s",
            "GFLOP/s",
            "CPU time",
            "where a step's time goes",
            "matmul",
            "attention",
            "AdamW, gradient norm, zeroing",
            "other (orchestration)",
            "total",
            &format!("precision {precision}"),
            products_line(precision),
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(
            !text.contains("of the measured matrix-product peak"),
            "{text}"
        );
    }
}

#[test]
fn bench_reports_the_step_as_a_share_of_the_product_peak() {
    // The peak of the products the step runs: gemm's f32 kernel for its ISA, or
    // tinylm's bf16 kernel.
    for (precision, kernels) in [
        ("fp32", &["AVX-512F", "AVX2+FMA", "NEON", "scalar"][..]),
        ("bf16", &["tinylm bf16"]),
    ] {
        let mut args = TINY[..TINY.len() - 1].to_vec(); // without --no-peak
        args.extend(["--batch-size", "2", "--steps", "1", "--threads", "1"]);
        args.extend(["--precision", precision]);
        let out = tinylm(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let line = text
            .lines()
            .find(|l| l.contains("of the measured matrix-product peak"))
            .unwrap_or_else(|| panic!("no share of the peak in\n{text}"));
        let share: f64 = line
            .split("GFLOP/s = ")
            .nth(1)
            .and_then(|rest| rest.split('%').next())
            .and_then(|pct| pct.parse().ok())
            .unwrap_or_else(|| panic!("no percentage in {line:?}"));
        assert!(share > 0.0, "{line}");
        assert!(kernels.iter().any(|k| line.contains(k)), "{line}");
        let paired = text
            .lines()
            .find(|l| l.contains("each step against the peak of the products timed right after it"))
            .unwrap_or_else(|| panic!("no step-by-step share in\n{text}"));
        assert!(paired.ends_with("1 steps)"), "{paired}");
    }
}

#[test]
fn bench_rejects_bad_arguments() {
    for extra in [
        &["--seq-len", "17"][..],
        &["--threads", "two"],
        &["--num-heads", "3"],
    ] {
        let mut args = TINY.to_vec();
        args.extend(extra);
        let out = tinylm(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("error:"));
    }
}

#[test]
fn bench_matmul_times_every_product_of_the_step_in_f32_and_bf16() {
    let mut args = TINY[..TINY.len() - 1].to_vec(); // without --no-peak
    args[0] = "bench-matmul";
    args.extend(["--batch-size", "2", "--rounds", "2", "--threads", "1"]);
    let out = tinylm(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("best of 2 rounds"), "{text}");
    assert!(
        text.contains("AVX512_BF16") || text.contains("portable"),
        "{text}"
    );
    // Six weight matrices (SwiGLU's w1 and w3 apart) × three products (forward,
    // input and weight gradient) over 2 x 16 positions, each with its count per step
    // and positive f32 and bf16 GFLOP/s.
    let rows: Vec<&str> = (text.lines())
        .filter(|l| l.starts_with("  ") && l.contains(" x ") && l.contains('·'))
        .collect();
    assert_eq!(rows.len(), 18, "{text}");
    for form in ["x·Wᵀ", "dy·W", "dyᵀ·x"] {
        assert_eq!(
            rows.iter().filter(|r| r.contains(form)).count(),
            6,
            "{form} in\n{text}"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r.contains("qkv") && r.contains("(   32 x    16 x    48)")),
        "qkv x·Wᵀ in\n{text}"
    );
    let total = |what: &str| {
        (text.lines().find(|l| l.contains(what)))
            .unwrap_or_else(|| panic!("no {what:?} in\n{text}"))
    };
    let totals = [
        total("all, weighted by their count per step"),
        total("peak (the best of any product)"),
    ];
    for row in rows.iter().chain(&totals) {
        // The last three figures: f32 GFLOP/s, bf16 GFLOP/s, their ratio.
        let figures: Vec<f64> = (row.split_whitespace().rev().take(3))
            .map(|x| x.trim_end_matches('x').parse().unwrap_or(f64::NAN))
            .collect();
        assert!(figures.iter().all(|&x| x > 0.0), "{row}");
    }
    args.extend(["--rounds", "0"]);
    assert_eq!(tinylm(&args).status.code(), Some(2));
}

#[test]
fn bench_allreduce_needs_a_launcher() {
    let mut args = TINY[..TINY.len() - 1].to_vec();
    args[0] = "bench-allreduce";
    let out = tinylm(&args);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mpirun -np R"));
}

/// `tinylm bench` as 2 ranks of `mpirun` (Open MPI or MPICH, which a build with the
/// `mpi` feature needs anyway; `.ci/run` runs this test): rank 0 alone reports the
/// step over both ranks and the gradient all-reduce, `bench-allreduce` a line per
/// buffer size, and a batch that does not divide over the ranks is an error that
/// ends both.
#[cfg(feature = "mpi")]
#[test]
fn bench_under_mpirun_reports_the_all_reduce() {
    let mpirun = |args: &[&str]| -> std::process::Output {
        std::process::Command::new("mpirun")
            .args(["-np", "2", env!("CARGO_BIN_EXE_tinylm")])
            .args(args)
            // Open MPI: allowed as root (CI containers), and on a 1-core machine.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            .output()
            .expect("running mpirun (install Open MPI: apt-get install openmpi-bin)")
    };
    let mut args = TINY.to_vec();
    args.extend(["--batch-size", "4", "--steps", "2", "--threads", "1"]);
    let text = succeeded(&mpirun(&args));
    for (want, times) in [
        ("over 2 ranks (2 sequences each)", 1),
        ("gradient all-reduce + AdamW", 1),
        ("gradient all-reduce alone", 1),
        ("algorithm bandwidth", 2),
        ("share of the step", 1),
    ] {
        assert_eq!(text.matches(want).count(), times, "{want:?} in\n{text}");
    }
    assert!(!text.contains("where a step's time goes"), "{text}");

    let mut args = TINY[..TINY.len() - 1].to_vec();
    args[0] = "bench-allreduce";
    args.extend(["--threads", "1"]);
    let out = mpirun(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("256 MiB") && text.contains("(the model's gradient)"),
        "{text}"
    );

    let mut args = TINY.to_vec();
    args.extend(["--batch-size", "3", "--steps", "1", "--threads", "1"]);
    let out = mpirun(&args);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not divide over 2 ranks"), "{stderr}");
}

#[test]
fn bench_on_a_device() {
    let mut args = TINY.to_vec();
    args.extend(["--batch-size", "2", "--steps", "2", "--threads", "1"]);
    let out = tinylm(&[&args[..], &["--device", "gpu"]].concat());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown device 'gpu'"));
    // `auto` runs wherever it can.
    let out = tinylm(&[&args[..], &["--device", "auto"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // CUDA: figures on a GPU build with a GPU, else one line saying what is missing.
    let out = tinylm(&[&args[..], &["--device", "cuda", "--precision", "fp32"]].concat());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if out.status.success() {
        assert!(stdout.contains("device: cuda:0, precision fp32") && stdout.contains("tokens/s"));
    } else {
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.to_lowercase().contains("cuda"), "{stderr}");
    }
}
