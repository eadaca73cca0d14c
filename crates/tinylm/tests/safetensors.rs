//! Files written by PyTorch load by name into the parameter layout.
//!
//! The fixtures are the state_dict of `bench/torch_model.py`'s `TransformerLM`
//! (vocab 11, d_model 8, 2 layers, 2 heads, d_ff 12), parameter `i` in
//! `named_parameters()` order filled with `i + (j % 8) / 4` at flat index `j`,
//! saved by `safetensors.torch.save_file` as float32 and as bfloat16.

use std::path::Path;
use tinylm::params::ParamLayout;
use tinylm::safetensors_io::load_safetensors;
use tinylm::ModelConfig;

fn fixture_config() -> ModelConfig {
    ModelConfig {
        vocab_size: 11,
        context_length: 8,
        d_model: 8,
        num_layers: 2,
        num_heads: 2,
        d_ff: 12,
        ..ModelConfig::tinystories()
    }
}

#[test]
fn pytorch_state_dicts_load_by_name() {
    let layout = ParamLayout::new(&fixture_config());
    for file in ["torch_f32.safetensors", "torch_bf16.safetensors"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(file);
        let (tensors, _) = load_safetensors(&path).unwrap();
        let params = layout.load_buffer(&tensors, &path).unwrap();
        for (i, spec) in layout.specs.iter().enumerate() {
            let got = &params[spec.range()];
            let want: Vec<f32> = (0..spec.len())
                .map(|j| i as f32 + (j % 8) as f32 / 4.0)
                .collect();
            assert_eq!(got, want, "{file}: {}", spec.name);
        }
    }
}
