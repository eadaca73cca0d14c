//! Checkpoints: round trip, PyTorch names, corrupt files and config mismatches.

use std::collections::BTreeMap;
use std::path::Path;
use tinylm::checkpoint::{self, check_same_config};
use tinylm::kernels::AdamWParams;
use tinylm::optim::AdamW;
use tinylm::params::ParamLayout;
use tinylm::safetensors_io::save_safetensors;
use tinylm::ModelConfig;

/// A small model: its configuration, parameter layout and initial parameters.
fn small() -> (ModelConfig, ParamLayout, Vec<f32>) {
    let config = ModelConfig {
        vocab_size: 50,
        context_length: 16,
        d_model: 16,
        num_layers: 2,
        num_heads: 2,
        d_ff: 64,
        ..ModelConfig::tinystories()
    };
    let layout = ParamLayout::new(&config);
    let params = layout.init(3);
    (config, layout, params)
}

#[test]
fn round_trip_restores_weights_moments_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let (config, layout, params) = small();
    let mut opt = AdamW::new(layout.total, AdamWParams::default());
    opt.m = layout.init(4);
    opt.v = layout.init(5).iter().map(|x| x * x).collect();
    opt.step = 17;
    let extra = BTreeMap::from([("step".to_string(), "17".to_string())]);
    checkpoint::save(&path, &config, &params, Some(&opt), &extra).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "nothing beside the checkpoint: {names:?}");

    let ckpt = checkpoint::load(&path).unwrap();
    assert_eq!(ckpt.config, config);
    assert_eq!(ckpt.params, params);
    assert_eq!(ckpt.optimizer, Some(opt));
    assert_eq!(ckpt.meta::<u64>("step", &path).unwrap(), 17);
    // Weights under the SPEC names, moments under optim.m./optim.v.
    let (tensors, _) = tinylm::safetensors_io::load_safetensors(&path).unwrap();
    assert!(tensors.contains_key("layers.1.ffn.w3.weight"));
    assert!(tensors.contains_key("optim.m.lm_head.weight"));
    assert!(tensors.contains_key("optim.v.token_embeddings.weight"));
    assert_eq!(tensors.len(), 3 * layout.specs.len());

    // Weights only.
    checkpoint::save(&path, &config, &params, None, &BTreeMap::new()).unwrap();
    let ckpt = checkpoint::load(&path).unwrap();
    assert_eq!((ckpt.params, ckpt.optimizer), (params, None));
}

/// Asserts that loading the checkpoint at `path` fails with a message that holds
/// each of `needles`.
fn assert_refused(path: &Path, needles: &[&str]) {
    let e = checkpoint::load(path).unwrap_err().to_string();
    for needle in needles {
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
}

#[test]
fn corrupt_and_mismatched_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let (config, layout, params) = small();
    checkpoint::save(&path, &config, &params, None, &BTreeMap::new()).unwrap();
    let bytes = std::fs::read(&path).unwrap();

    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused(&truncated, &["truncated.safetensors"]);

    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot json").unwrap();
    assert_refused(&garbage, &["garbage.safetensors"]);

    assert_refused(&dir.path().join("none.safetensors"), &["none.safetensors"]);

    // Plain safetensors without tinylm metadata.
    let plain = dir.path().join("plain.safetensors");
    save_safetensors(&plain, &layout.tensors(&params), &BTreeMap::new()).unwrap();
    assert_refused(&plain, &["plain.safetensors", "config"]);

    // Metadata that promises another shape than the tensors have.
    let mut other = config.clone();
    other.d_ff = 128;
    let meta = BTreeMap::from([("config".to_string(), serde_json::to_string(&other).unwrap())]);
    let wrong = dir.path().join("wrong.safetensors");
    save_safetensors(&wrong, &layout.tensors(&params), &meta).unwrap();
    assert_refused(&wrong, &["wrong.safetensors", "ffn.w1.weight"]);

    // Resuming with another model config names the keys that differ.
    let mut run = config.clone();
    run.d_model = 32;
    run.tie_embeddings = true;
    let e = check_same_config(&path, &config, &run)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("c.safetensors") && e.contains("d_model is 16") && e.contains("32"),
        "{e}"
    );
    assert!(e.contains("tie_embeddings"), "{e}");
    assert!(check_same_config(&path, &config, &config).is_ok());
}
