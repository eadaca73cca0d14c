//! A training configuration file (`tinylm train --config run.toml`,
//! `tinylm.train("run.toml")`): `train::read_config_file` and `resolve_config`
//! over the defaults — or, for a `resume` key, over the configuration of a small
//! checkpoint written at start (the file named is replaced by it) — then what a
//! run computes from it before training: its steps, learning rates and batch
//! split, and `tinylm info`'s memory and FLOP arithmetic for the run and for
//! generation (with overflow checks: an overflow is a finding). A
//! refusal is an error; reading allocates at most 64 bytes per input
//! byte beyond 1 MiB; an accepted configuration, as the run directory's JSON,
//! resolves to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use tinylm::accounting::{training_flops, InferenceMemory, RunShape};
use tinylm::checkpoint;
use tinylm::device::{backend_kind, Device};
use tinylm::params::ParamLayout;
use tinylm::train::{read_config_file, resolve_config, TrainConfig};
use tinylm::ModelConfig;
use tinylm_fuzz::{scratch, within, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 64,
    fixed: 1 << 20,
};

/// A checkpoint of a small model, as `resume` names.
fn checkpoint() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let config = ModelConfig {
            vocab_size: 64,
            context_length: 8,
            d_model: 8,
            num_layers: 1,
            num_heads: 2,
            d_ff: 16,
            ..ModelConfig::tinystories()
        };
        let recorded = TrainConfig {
            model: config.clone(),
            train_data: "train.npy".into(),
            steps: 20,
            ..TrainConfig::default()
        };
        let meta = BTreeMap::from([(
            "train_config".to_string(),
            serde_json::to_string(&recorded).unwrap(),
        )]);
        let path = scratch().join("resume.safetensors");
        let params = ParamLayout::new(&config).init(0);
        checkpoint::save(&path, &config, &params, None, &meta).unwrap();
        path
    })
}

fuzz_target!(|data: &[u8]| {
    let path = write("run.toml", data);
    // The checkpoint that `resume` names is read too.
    let resume = checkpoint();
    let read = data.len() + std::fs::metadata(resume).unwrap().len() as usize;
    let resolved = within("read_config_file and resolve_config", read, BOUND, || {
        let mut given = read_config_file(&path)?;
        if !given["resume"].is_null() {
            given["resume"] = Value::String(resume.to_string_lossy().into_owned());
        }
        resolve_config(given, &|key| format!("`{key}`"))
    });
    let cfg = match resolved {
        Ok(resolved) => resolved.config,
        Err(e) => return assert!(!e.to_string().is_empty()),
    };
    // What the run computes before its first step.
    let total = cfg.total_steps();
    for step in [0, 1, total / 2, total.saturating_sub(1)] {
        let lr = cfg.learning_rate(step, 0.5);
        assert!(lr.is_finite(), "learning rate {lr} at step {step}");
    }
    let cpu = TrainConfig {
        device: Device::Cpu,
        ..cfg.clone()
    };
    if let (Ok(shape), Ok(split)) = (RunShape::of(&cpu, 1), cfg.batch_split(1)) {
        let memory = shape.memory(&cfg.model, split.share, split.micro);
        (memory.required(), memory.peak_resident());
    }
    let backends = [Device::Cpu, Device::Cuda(0)].map(|d| backend_kind(d, cfg.precision));
    for backend in backends.into_iter().flatten() {
        InferenceMemory::decoding(&cfg.model, 1, cfg.model.context_length, backend).total();
    }
    let t = cfg.model.context_length;
    training_flops(&cfg.model, cfg.batch_size, t);
    // The run directory's config.json resolves to the same configuration.
    let json = serde_json::to_value(&cfg).unwrap();
    let again =
        resolve_config(json, &|key| key.to_string()).expect("a resolved configuration resolves");
    assert_eq!(again.config, cfg);
});
