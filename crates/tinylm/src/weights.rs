//! One way to read a model's weights wherever a command needs them: a training
//! checkpoint as it is (the optimizer state is skipped), a weights-only safetensors
//! with the SPEC names (the config given separately), or an exported Hugging Face
//! directory (imported on the fly). Anything else is refused with one line saying
//! what was expected.

use crate::export::hf;
use crate::params::{ParamLayout, SafetensorsFile};
use crate::{Error, ModelConfig, Result};
use std::path::{Path, PathBuf};

/// What every accepted input holds.
const EXPECTED: &str = "expected a tinylm checkpoint (`tinylm train`'s .safetensors), a weights-only .safetensors with the SPEC tensor names together with a model config, or a Hugging Face LlamaForCausalLM directory (`tinylm export hf`)";

/// A model's weights and where its tokenizer is.
#[derive(Clone, Debug, PartialEq)]
pub struct Weights {
    pub config: ModelConfig,
    /// The flat parameter buffer in [`ParamLayout`] order.
    pub params: Vec<f32>,
    /// The tokenizer directory the input records or contains, if any.
    pub tokenizer: Option<PathBuf>,
}

/// Reads the weights at `path` (see the module docs). `config` is required for a
/// weights-only file; for a checkpoint or a directory it must equal the one they hold.
pub fn load(path: &Path, config: Option<&ModelConfig>) -> Result<Weights> {
    let weights = if path.is_dir() {
        let imported = hf::import(path)?;
        let has_tokenizer = imported.tokenizer.is_some();
        Weights {
            config: imported.config,
            params: imported.params,
            tokenizer: has_tokenizer.then(|| path.to_path_buf()),
        }
    } else {
        load_file(path, config)?
    };
    if let Some(given) = config.filter(|c| **c != weights.config) {
        return Err(Error::Config(format!(
            "{} holds a model config that differs from the one given: {} vs {}",
            path.display(),
            serde_json::to_string(&weights.config).expect("serializes"),
            serde_json::to_string(given).expect("serializes")
        )));
    }
    Ok(weights)
}

fn load_file(path: &Path, config: Option<&ModelConfig>) -> Result<Weights> {
    let mut magic = [0u8; 4];
    let is_gguf = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == b"GGUF");
    if is_gguf {
        return Err(Error::Invalid(format!(
            "{}: a GGUF file is for llama.cpp and is not read back; {EXPECTED}",
            path.display()
        )));
    }
    if path.file_name().is_some_and(|n| n == "model.safetensors")
        && path.with_file_name("config.json").is_file()
    {
        let dir = path.parent().expect("a file name has a parent");
        return load(dir, config);
    }
    let file = SafetensorsFile::open(path).map_err(|e| match e {
        Error::Invalid(msg) => Error::Invalid(format!("{msg}; {EXPECTED}")),
        other => other,
    })?;
    let metadata = file.metadata();
    let saved: Option<ModelConfig> = match metadata.get("config") {
        Some(text) => Some(serde_json::from_str(text).map_err(|e| {
            Error::Invalid(format!(
                "{}: checkpoint entry 'config' is invalid: {e}",
                path.display()
            ))
        })?),
        None => None,
    };
    let config = match (saved, config) {
        (Some(saved), _) => saved,
        (None, Some(given)) => given.clone(),
        (None, None) => {
            return Err(Error::Invalid(format!(
                "{}: a safetensors file without a model config (no 'config' metadata entry): pass the model config; {EXPECTED}",
                path.display()
            )))
        }
    };
    config
        .validate()
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    let layout = ParamLayout::new(&config);
    let weights = file.buffer(&layout, |name| {
        (!name.starts_with("optim.")).then_some(name)
    })?;
    let params = weights.to_vec(0..layout.total)?;
    let tokenizer = metadata
        .get("tokenizer")
        .and_then(|text| serde_json::from_str::<Option<PathBuf>>(text).ok())
        .flatten();
    Ok(Weights {
        config,
        params,
        tokenizer,
    })
}
