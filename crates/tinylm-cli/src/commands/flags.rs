//! Flags several commands share — the model ([`ModelArgs`]), the device
//! ([`DeviceArgs`]) and the worker threads ([`ThreadsArg`]) — and what keeps a flag
//! and the configuration key it sets one thing: the flag is the key's spelling
//! ([`flag`]), its value is read off the
//! parsed flags by the key ([`flag_values`]), its help shows the default the
//! configuration gives the key ([`show_defaults`]), and it takes the values a
//! configuration file spells ([`parse_spelling`]).

use anyhow::{bail, Context, Result};
use clap::builder::PossibleValuesParser;
use clap::{Arg, Args};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tinylm::config::{Ffn, Norm, Positional};
use tinylm::device::{self, Device};
use tinylm::kernels::{BackendKind, Precision};
use tinylm::ModelConfig;

/// `--threads`, one flag with one meaning for every command that works on the CPU:
/// the size of rayon's pool, per rank under `mpirun`; 0 or left out, one thread per
/// core. (`tinylm train` spells it as its configuration's key `threads`, with the
/// same meaning.)
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct ThreadsArg {
    /// Worker threads; 0 or left out: one per core (under mpirun: per rank).
    #[arg(id = "threads", long = "threads", value_name = "N")]
    count: Option<usize>,
}

impl ThreadsArg {
    /// The threads asked for, 0 for one per core (the library's convention).
    pub fn count(self) -> usize {
        self.count.unwrap_or(0)
    }

    /// Sizes rayon's global pool, which every parallel loop of the command then
    /// shares: call it before any of them runs. One per core is rayon's own default,
    /// so then it leaves the pool alone (a command another runs may call it too).
    pub fn apply(self) -> Result<()> {
        if self.count() == 0 {
            return Ok(());
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(self.count())
            .build_global()
            .context("starting the thread pool")
    }
}

/// `--device` and `--precision`, for the commands that run a model.
#[derive(Args, Clone, Copy, Debug)]
pub struct DeviceArgs {
    /// Where the model runs: cpu, cuda, cuda:N (GPU N) or auto (CUDA when a usable
    /// GPU is present).
    #[arg(long, default_value_t)]
    pub device: Device,
    /// Arithmetic: bf16 (mixed precision: bf16 products summed in f32), fp32, auto
    /// (bf16 where the CPU or GPU multiplies bf16 natively, else fp32), or — to
    /// generate and evaluate on the CPU — q8_0 (8-bit weights, llama.cpp's Q8_0).
    #[arg(long, default_value_t)]
    pub precision: Precision,
}

impl DeviceArgs {
    /// The backend these name ([`device::backend_kind`]), for the memory a
    /// command reports (the CPU's where they name none: the command's own opening
    /// of the backend says why).
    pub fn backend_kind(&self) -> BackendKind {
        device::backend_kind(self.device, self.precision).unwrap_or_default()
    }
}

/// The model: a base configuration — the `--model-config` file, the `--preset`, or
/// the command's own — with the shape flags given over it. The fields after
/// `preset` are [`ModelConfig`]'s keys, each `None` unless its flag is given.
#[derive(Args, Debug, Serialize)]
pub struct ModelArgs {
    /// Model configuration JSON (CS336 keys, or a run's `config.json`); the shape
    /// flags override it.
    #[arg(long, conflicts_with = "preset")]
    #[serde(skip)]
    pub model_config: Option<PathBuf>,
    /// Named model (`bench-small` is `tinylm bench`'s); the shape flags override it.
    #[arg(long, value_parser = PossibleValuesParser::new(ModelConfig::PRESETS))]
    #[serde(skip)]
    pub preset: Option<String>,
    /// Vocabulary size: token ids lie in 0..vocab_size.
    #[arg(long)]
    vocab_size: Option<usize>,
    /// Longest sequence the model reads, in tokens.
    #[arg(long)]
    context_length: Option<usize>,
    /// Width of the residual stream.
    #[arg(long)]
    d_model: Option<usize>,
    /// Transformer blocks.
    #[arg(long)]
    num_layers: Option<usize>,
    /// Attention heads (d_model must be a multiple).
    #[arg(long)]
    num_heads: Option<usize>,
    /// Hidden width of the feed-forward network.
    #[arg(long)]
    d_ff: Option<usize>,
    /// RoPE's base θ.
    #[arg(long)]
    rope_theta: Option<f64>,
    /// RMSNorm placement: pre, post or none.
    #[arg(long, value_parser = parse_spelling::<Norm>)]
    norm: Option<Norm>,
    /// Positional encoding: rope or none.
    #[arg(long, value_parser = parse_spelling::<Positional>)]
    positional: Option<Positional>,
    /// Feed-forward network: swiglu or silu.
    #[arg(long, value_parser = parse_spelling::<Ffn>)]
    ffn: Option<Ffn>,
    /// Share the embedding matrix with the LM head (the flag alone: true).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    tie_embeddings: Option<bool>,
}

impl ModelArgs {
    /// The configuration `--model-config` or `--preset` names, if either is given.
    pub fn base(&self) -> Result<Option<ModelConfig>> {
        Ok(match (&self.model_config, &self.preset) {
            (Some(path), _) => Some(ModelConfig::from_json_file(path)?),
            (None, Some(name)) => Some(ModelConfig::preset(name)?),
            (None, None) => None,
        })
    }

    /// `base` with the shape flags given over it, validated.
    pub fn apply(&self, base: ModelConfig) -> Result<ModelConfig> {
        let mut config = serde_json::to_value(base)?;
        for (key, value) in flag_values(self)? {
            config[key] = value;
        }
        let config: ModelConfig = serde_json::from_value(config)?;
        config.validate()?;
        Ok(config)
    }
}

/// The values of the flags given, by key (the field's name): `flags` as JSON, the
/// flags not given (`None`) left out.
pub fn flag_values(flags: &impl Serialize) -> Result<Map<String, Value>> {
    match serde_json::to_value(flags).context("the flags as configuration keys")? {
        Value::Object(values) => Ok(values.into_iter().filter(|(_, v)| !v.is_null()).collect()),
        other => bail!("the flags are not a table of keys: {other}"),
    }
}

/// The flag that sets a configuration key: `--d-model` for `d_model` or `model.d_model`.
pub fn flag(key: &str) -> String {
    let name = key.rsplit('.').next().unwrap_or(key);
    format!("--{}", name.replace('_', "-"))
}

/// For `#[command(mut_args = show_defaults(&config))]`: appends `[default: V]` to
/// the help of every flag whose id is a key of `config`, V the key's value there
/// (tables within `config` searched too, so that a training configuration's model
/// reaches the shape flags). The help shows the configuration's defaults while the
/// flags themselves have none: a flag not given stays unset, and a configuration
/// file or a resumed checkpoint can set its key. Keys without a value (null, an
/// empty path) show none.
pub fn show_defaults(config: &impl Serialize) -> impl FnMut(Arg) -> Arg {
    let mut defaults = BTreeMap::new();
    // A configuration that does not serialize shows no defaults (the train tests
    // check TrainConfig's are shown) rather than failing the command.
    collect_defaults(
        serde_json::to_value(config).unwrap_or_default(),
        &mut defaults,
    );
    move |arg| {
        let Some(default) = defaults.get(arg.get_id().as_str()) else {
            return arg;
        };
        let with_default = |help: &str| format!("{help} [default: {default}]").trim().to_string();
        let help = with_default(&arg.get_help().map(ToString::to_string).unwrap_or_default());
        let long_help = arg.get_long_help().map(|h| with_default(&h.to_string()));
        let arg = arg.help(help);
        match long_help {
            Some(long_help) => arg.long_help(long_help),
            None => arg,
        }
    }
}

/// Every key of `config` (tables searched) with a value to show, as the help shows it.
fn collect_defaults(config: Value, defaults: &mut BTreeMap<String, String>) {
    let Value::Object(keys) = config else {
        return;
    };
    for (key, value) in keys {
        let shown = match value {
            Value::Object(_) => {
                collect_defaults(value, defaults);
                continue;
            }
            Value::Null => continue,
            Value::String(text) if text.is_empty() => continue,
            Value::String(text) => text,
            value => value.to_string(),
        };
        defaults.insert(key, shown);
    }
}

/// Parses a value as configuration files spell it (`pre`, `rope`, `swiglu`, `time`,
/// …); the error names the value and the spellings allowed.
pub fn parse_spelling<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_value(Value::String(text.to_string())).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Command, FromArgMatches};

    fn parse(argv: &[&str]) -> Result<ModelArgs, clap::Error> {
        let matches = ModelArgs::augment_args(Command::new("model")).try_get_matches_from(argv)?;
        ModelArgs::from_arg_matches(&matches)
    }

    #[test]
    fn the_flags_given_override_the_base_and_no_other_key() {
        let args = parse(&[
            "model",
            "--d-model",
            "64",
            "--norm",
            "post",
            "--tie-embeddings",
        ]);
        let config = args.unwrap().apply(ModelConfig::tinystories()).unwrap();
        let expected = ModelConfig {
            d_model: 64,
            norm: Norm::Post,
            tie_embeddings: true,
            ..ModelConfig::tinystories()
        };
        assert_eq!(config, expected);
        let args = parse(&["model", "--tie-embeddings", "false", "--ffn", "silu"]).unwrap();
        let config = args.apply(expected.clone()).unwrap();
        assert!(!config.tie_embeddings && config.ffn == Ffn::Silu);
        // The result is validated.
        let args = parse(&["model", "--num-heads", "7"]).unwrap();
        let err = args.apply(ModelConfig::tinystories()).unwrap_err();
        assert!(err.to_string().contains("divisible"), "{err}");
    }

    #[test]
    fn a_bad_value_is_named_with_the_values_allowed() {
        let err = parse(&["model", "--norm", "sideways"])
            .unwrap_err()
            .to_string();
        for part in ["sideways", "--norm", "pre", "post", "none"] {
            assert!(err.contains(part), "{part} not in {err}");
        }
        let err = parse(&["model", "--model-config", "m.json", "--preset", "gpt2-xl"]);
        assert!(err.unwrap_err().to_string().contains("cannot be used with"));
    }
}
