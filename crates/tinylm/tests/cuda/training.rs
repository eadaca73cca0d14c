//! Training on the GPU against training on the CPU: a 200-step run, a clipped run
//! step by step, and a checkpoint moved between the two.

use super::*;

fn training_config(dir: &Path, steps: u64) -> TrainConfig {
    // Byte-level text with structure: "the dog sees a red ball." and so on.
    let words = [
        "the dog ", "a cat ", "sees ", "likes ", "a red ", "the big ", "ball. ", "tree.\n",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let text: String = (0..40_000)
        .map(|_| words[rng.random_range(0..words.len())])
        .collect();
    let ids: Vec<u16> = text.bytes().map(u16::from).collect();
    let (train_ids, val_ids) = ids.split_at(ids.len() * 9 / 10);
    let write = |name: &str, ids: &[u16]| {
        let path = dir.join(name);
        tinylm_bpe::npy::write(&path, &[ids.len()], ids).unwrap();
        path
    };
    TrainConfig {
        model: ModelConfig {
            vocab_size: 256,
            context_length: 64,
            d_model: 64,
            num_layers: 2,
            num_heads: 4,
            d_ff: 128,
            ..ModelConfig::tinystories()
        },
        train_data: write("train.npy", train_ids),
        val_data: Some(write("val.npy", val_ids)),
        out_dir: dir.join("run"),
        batch_size: 16,
        steps,
        lr_max: 3e-3,
        lr_min: 3e-4,
        warmup_steps: 10,
        eval_interval: 0,
        eval_batches: 4,
        checkpoint_interval: 0,
        log_interval: 1,
        threads: 2,
        ..TrainConfig::default()
    }
}

/// Trains `cfg`; its log's records.
fn train_log(cfg: &TrainConfig) -> Vec<LogRecord> {
    train(
        cfg,
        &World::single(),
        &AtomicBool::new(false),
        &mut |_: &Progress| {},
    )
    .unwrap();
    std::fs::read_to_string(cfg.out_dir.join("log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn train_losses(cfg: &TrainConfig) -> Vec<f64> {
    train_log(cfg)
        .into_iter()
        .filter(|r| r.train_loss.is_finite())
        .map(|r| r.train_loss)
        .collect()
}

#[test]
fn a_200_step_run_on_the_gpu_tracks_the_cpu_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = training_config(dir.path(), 200);
    // What this run adds to the shorter ones is its length: the whole cosine schedule
    // and AdamW's bias correction long after warm-up. So it takes 4 sequences a step,
    // not 16, a quarter of the emulated GPU's time (CI runs it there).
    cfg.batch_size = 4;
    cfg.out_dir = dir.path().join("cpu");
    let cpu_losses = train_losses(&cfg);
    assert_eq!(cpu_losses.len(), 200);
    // fp32: every step within 2% of the CPU's; bf16: the last 20 steps' mean within 3%.
    for (precision, per_step, tail) in [
        (Precision::Fp32, 2e-2, 1e-2),
        (Precision::Bf16, f64::INFINITY, 3e-2),
    ] {
        cfg.out_dir = dir.path().join(precision.to_string());
        cfg.device = Device::Cuda(0);
        cfg.precision = precision;
        let gpu_losses = train_losses(&cfg);
        assert_eq!(gpu_losses.len(), 200);
        for (step, (g, c)) in gpu_losses.iter().zip(&cpu_losses).enumerate() {
            assert!(
                (g - c).abs() <= per_step * c,
                "{precision} step {step}: GPU loss {g}, CPU {c}"
            );
        }
        let mean = |l: &[f64]| l[l.len() - 20..].iter().sum::<f64>() / 20.0;
        let (g, c) = (mean(&gpu_losses), mean(&cpu_losses));
        println!(
            "{precision}: last-20 mean loss GPU {g:.4}, CPU {c:.4} (first {:.4})",
            cpu_losses[0]
        );
        assert!(
            (g - c).abs() <= tail * c,
            "{precision}: last-20 mean loss GPU {g}, CPU {c}"
        );
        assert!(
            g < 0.6 * gpu_losses[0],
            "{precision}: the loss did not fall"
        );
    }
}

#[test]
fn a_clipped_run_on_the_gpu_tracks_the_cpu_run_step_by_step_in_fp32() {
    // Every step within 1% of the CPU's (the 200-step run allows 2%), with clipping on
    // every step (the norm limit well under the gradient norms), computed
    // by the AdamW kernel from the device's sum of squares while the loop reads each
    // step's statistics one step late.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = training_config(dir.path(), 30);
    cfg.grad_clip = 0.05;
    cfg.out_dir = dir.path().join("cpu");
    let on_cpu = train_log(&cfg);
    assert_eq!(on_cpu.len(), 30);
    assert!(on_cpu.iter().all(|r| r.grad_norm > 2.0 * cfg.grad_clip));
    cfg.out_dir = dir.path().join("gpu");
    cfg.device = Device::Cuda(0);
    cfg.precision = Precision::Fp32;
    let on_gpu = train_log(&cfg);
    assert_eq!(on_gpu.len(), 30);
    for (g, c) in on_gpu.iter().zip(&on_cpu) {
        assert_eq!((g.step, g.tokens, g.lr), (c.step, c.tokens, c.lr));
        for (what, got, want) in [
            ("loss", g.train_loss, c.train_loss),
            ("gradient norm", g.grad_norm, c.grad_norm),
        ] {
            assert!(
                (got - want).abs() <= 1e-2 * want,
                "step {}: GPU {what} {got}, CPU {want}",
                c.step
            );
        }
    }
}

#[test]
fn a_checkpoint_moves_between_gpu_and_cpu_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = training_config(dir.path(), 10);
    cfg.device = Device::Cuda(0);
    cfg.precision = Precision::Fp32;
    cfg.out_dir = dir.path().join("gpu");
    let summary = train(
        &cfg,
        &World::single(),
        &AtomicBool::new(false),
        &mut |_: &Progress| {},
    )
    .unwrap();
    let saved = checkpoint::load(&summary.checkpoint).unwrap();
    let file = CheckpointFile::open(&summary.checkpoint).unwrap();
    let host = saved.optimizer.as_ref().unwrap();
    // The saved parameters go to the GPU (read tensor by tensor through pinned
    // staging memory) and back unchanged, in both precisions (bf16 keeps f32 master
    // weights); so do the moments, whole or a ZeRO-1 shard of them cut inside a
    // tensor; and the checkpoint the GPU writes holds the same tensors.
    for precision in PRECISIONS {
        let model = file.model(gpu(precision)).unwrap();
        assert!(
            model.download_params().unwrap() == saved.params,
            "{precision}: parameters changed"
        );
        let total = saved.params.len();
        for covers in [0..total, total / 2 + 3..total] {
            let shard = model
                .download_adamw(&file.adamw(&model, covers.clone()).unwrap())
                .unwrap();
            assert_eq!(shard.covers, covers);
            assert!(shard.m == host.m[covers.clone()] && shard.v == host.v[covers.clone()]);
            assert_eq!(shard.step, host.step);
        }
        let opt = file.adamw(&model, 0..total).unwrap();
        let on_gpu = |buf| BackendValues {
            backend: model.backend(),
            buf,
        };
        let (params, m, v) = (on_gpu(model.param_buffer()), on_gpu(&opt.m), on_gpu(&opt.v));
        let moments = Moments {
            hp: opt.hp,
            step: opt.step,
            m: &m,
            v: &v,
        };
        let written = dir.path().join(format!("written-{precision}.safetensors"));
        let metadata = saved.metadata.clone();
        checkpoint::save_from(&written, &cfg.model, &params, Some(moments), &metadata).unwrap();
        assert!(
            checkpoint::load(&written).unwrap() == saved,
            "{precision}: written"
        );
    }
    // Resumed on the CPU and on the GPU for ten more steps, the runs agree.
    let mut resumed = Vec::new();
    for device in [Device::Cpu, Device::Cuda(0)] {
        cfg.steps = 20;
        cfg.device = device;
        cfg.resume = Some(summary.checkpoint.clone());
        cfg.out_dir = dir.path().join(format!("resumed-{device}"));
        std::fs::create_dir_all(&cfg.out_dir).unwrap();
        resumed.push(train_losses(&cfg));
    }
    let (on_cpu, on_gpu) = (&resumed[0], &resumed[1]);
    assert_eq!(on_cpu.len(), on_gpu.len());
    assert_close(
        &on_gpu.iter().map(|&x| x as f32).collect::<Vec<_>>(),
        &on_cpu.iter().map(|&x| x as f32).collect::<Vec<_>>(),
        1e-4,
        "losses resumed from a GPU checkpoint, GPU vs CPU",
    );
}
