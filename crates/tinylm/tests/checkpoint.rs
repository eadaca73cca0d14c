//! Checkpoints: round trip, PyTorch names, corrupt files and config mismatches.

use std::collections::BTreeMap;
use tinylm::checkpoint::{self, check_same_config};
use tinylm::kernels::AdamWParams;
use tinylm::optim::AdamW;
use tinylm::params::ParamLayout;
use tinylm::safetensors_io::save_safetensors;
use tinylm::ModelConfig;

fn small() -> ModelConfig {
    ModelConfig {
        vocab_size: 50,
        context_length: 16,
        d_model: 16,
        num_layers: 2,
        num_heads: 2,
        d_ff: 64,
        ..ModelConfig::tinystories()
    }
}

#[test]
fn round_trip_restores_weights_moments_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let config = small();
    let layout = ParamLayout::new(&config);
    let params = layout.init(3);
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

#[test]
fn corrupt_and_mismatched_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let config = small();
    let layout = ParamLayout::new(&config);
    let params = layout.init(3);
    checkpoint::save(&path, &config, &params, None, &BTreeMap::new()).unwrap();
    let bytes = std::fs::read(&path).unwrap();

    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = checkpoint::load(&truncated).unwrap_err().to_string();
    assert!(e.contains("truncated.safetensors"), "{e}");

    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot json").unwrap();
    let e = checkpoint::load(&garbage).unwrap_err().to_string();
    assert!(e.contains("garbage.safetensors"), "{e}");

    let e = checkpoint::load(&dir.path().join("none.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("none.safetensors"), "{e}");

    // Plain safetensors without tinylm metadata.
    let plain = dir.path().join("plain.safetensors");
    save_safetensors(&plain, &layout.tensors(&params), &BTreeMap::new()).unwrap();
    let e = checkpoint::load(&plain).unwrap_err().to_string();
    assert!(
        e.contains("plain.safetensors") && e.contains("config"),
        "{e}"
    );

    // Metadata that promises another shape than the tensors have.
    let mut other = config.clone();
    other.d_ff = 128;
    let meta = BTreeMap::from([("config".to_string(), serde_json::to_string(&other).unwrap())]);
    let wrong = dir.path().join("wrong.safetensors");
    save_safetensors(&wrong, &layout.tensors(&params), &meta).unwrap();
    let e = checkpoint::load(&wrong).unwrap_err().to_string();
    assert!(
        e.contains("wrong.safetensors") && e.contains("ffn.w1.weight"),
        "{e}"
    );

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
