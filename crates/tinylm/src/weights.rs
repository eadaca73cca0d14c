//! One way to read a model's weights wherever a command needs them: a training
//! checkpoint as it is (the optimizer state is skipped), a weights-only safetensors
//! with the SPEC names (the config given separately), or an exported Hugging Face
//! directory (imported on the fly). Anything else is refused with one line saying
//! what was expected. A file's weights are read when wanted, tensor by tensor,
//! straight into a model's buffers ([`OpenedWeights::model`]; a CPU model
//! maps them where tinylm wrote them) or into host memory.

use crate::checkpoint::{model_from, Load};
use crate::export::hf;
use crate::kernels::Backend;
use crate::model::Model;
use crate::params::ParamLayout;
use crate::safetensors_io::{FileBuffer, SafetensorsFile};
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
    open(path, config)?.load()
}

/// Weights opened where they are (see [`open`]): a file's read when wanted.
pub struct OpenedWeights {
    pub config: ModelConfig,
    /// The tokenizer directory the input records or contains, if any.
    pub tokenizer: Option<PathBuf>,
    values: Values,
}

/// Where opened weights are.
enum Values {
    /// In a safetensors file, every tensor checked against the config's layout.
    File(SafetensorsFile, ParamLayout),
    /// In host memory (imported from a Hugging Face directory).
    Host(Vec<f32>),
}

/// Opens the weights at `path` as [`load`] reads them, checking everything but
/// reading no tensor of a file yet.
pub fn open(path: &Path, config: Option<&ModelConfig>) -> Result<OpenedWeights> {
    let opened = if path.is_dir() {
        let imported = hf::import(path)?;
        let has_tokenizer = imported.tokenizer.is_some();
        OpenedWeights {
            config: imported.config,
            tokenizer: has_tokenizer.then(|| path.to_path_buf()),
            values: Values::Host(imported.params),
        }
    } else {
        open_file(path, config)?
    };
    if let Some(given) = config.filter(|c| **c != opened.config) {
        return Err(Error::Config(format!(
            "{} holds a model config that differs from the one given: {} vs {}",
            path.display(),
            serde_json::to_string(&opened.config).expect("serializes"),
            serde_json::to_string(given).expect("serializes")
        )));
    }
    Ok(opened)
}

impl OpenedWeights {
    /// The weights in host memory.
    pub fn load(self) -> Result<Weights> {
        let params = match self.values {
            Values::File(file, layout) => weights_of(&file, &layout)?.to_vec(0..layout.total)?,
            Values::Host(params) => params,
        };
        Ok(Weights {
            config: self.config,
            params,
            tokenizer: self.tokenizer,
        })
    }

    /// A model run by `backend` with these weights: a file's mapped where the
    /// backend can, else read tensor by tensor into its parameter buffer
    /// ([`CheckpointFile::model`](crate::checkpoint::CheckpointFile::model)).
    pub fn model<B: Backend<f32>>(&self, backend: B) -> Result<Model<f32, B>> {
        let config = self.config.clone();
        match &self.values {
            Values::File(file, layout) => {
                model_from(&weights_of(file, layout)?, config, backend, Load::Map)
            }
            Values::Host(params) => Model::with_backend(config, params, backend),
        }
    }
}

/// The weights of `file` (every tensor but a checkpoint's `optim.*` moments),
/// checked against `layout`.
fn weights_of<'a>(file: &'a SafetensorsFile, layout: &'a ParamLayout) -> Result<FileBuffer<'a>> {
    file.buffer(layout, |name| (!name.starts_with("optim.")).then_some(name))
}

fn open_file(path: &Path, config: Option<&ModelConfig>) -> Result<OpenedWeights> {
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
        return open(dir, config);
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
    let layout = file.layout(&config)?;
    weights_of(&file, &layout)?;
    let tokenizer = metadata
        .get("tokenizer")
        .and_then(|text| serde_json::from_str::<Option<PathBuf>>(text).ok())
        .flatten();
    Ok(OpenedWeights {
        config,
        tokenizer,
        values: Values::File(file, layout),
    })
}
