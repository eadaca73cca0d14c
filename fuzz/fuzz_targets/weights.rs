//! Weights-only safetensors with a model config (`forward --config C.json`; the
//! input's two parts): `ModelConfig::from_json_file`, `weights::open` and `load`,
//! and `safetensors_io::load_safetensors`, which reads any safetensors file's tensors. A
//! refusal names the file at fault; reading allocates at most 16 bytes per input
//! byte beyond 1 MiB (values are read as f32); accepted tensors written back by
//! `safetensors_io::save_safetensors` read back the same, bit for bit.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tinylm::params::ParamLayout;
use tinylm::safetensors_io::{load_safetensors, save_safetensors};
use tinylm::{weights, ModelConfig};
use tinylm_fuzz::{parts, refused, refused_naming, same_bits, scratch, within, write, Bound};

const BOUND: Bound = Bound {
    per_byte: 16,
    fixed: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    let [config, tensors] = parts::<2>(data);
    let config_path = write("config.json", config);
    let path = write("weights.safetensors", tensors);
    let read = within("load_safetensors", data.len(), BOUND, || {
        load_safetensors(&path)
    });
    match &read {
        Ok((tensors, metadata)) => {
            let views: Vec<(String, Vec<usize>, &[f32])> = (tensors.iter())
                .map(|(name, (shape, values))| (name.clone(), shape.clone(), &values[..]))
                .collect();
            let back = scratch().join("back.safetensors");
            save_safetensors(&back, &views, metadata).expect("tensors that were read are written");
            let (again, again_metadata) =
                load_safetensors(&back).expect("written tensors read back");
            assert_eq!(&again_metadata, metadata);
            assert!(again.len() == tensors.len());
            for ((name, (shape, values)), (again_name, (again_shape, again_values))) in
                tensors.iter().zip(&again)
            {
                assert!(
                    name == again_name && shape == again_shape && same_bits(values, again_values)
                );
            }
        }
        Err(e) => refused(e, &path),
    }
    let config = within("ModelConfig::from_json_file", config.len(), BOUND, || {
        ModelConfig::from_json_file(&config_path)
    });
    let config = match config {
        Ok(config) => config,
        Err(e) => return refused(&e, &config_path),
    };
    let weights = within("weights::open and load", data.len(), BOUND, || {
        weights::open(&path, Some(&config)).and_then(|w| w.load())
    });
    match weights {
        Ok(w) => assert_eq!(w.params.len(), ParamLayout::new(&w.config).total),
        Err(e) => refused_naming(&e, &[&path, &config_path]),
    }
});
