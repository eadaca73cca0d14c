//! A training run's configuration: every hyper-parameter ([`TrainConfig`], with
//! its defaults), the schedule it implies, and for a resumed run the configuration
//! its checkpoint recorded with the given keys over it ([`resolve_config`]).

use crate::checkpoint;
use crate::config::ParamCounts;
use crate::device::Device;
use crate::kernels::{AdamWParams, Precision};
use crate::optim::lr_cosine_schedule;
use crate::{Error, ModelConfig, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The largest scale of a training step ([`TrainConfig::check_scale`]): 2^56, a
/// step of about 2^59 FLOPs (GPT-2 XL's at 512 × 1,024 tokens is 2^50).
pub const MAX_STEP_SCALE: u128 = 1 << 56;

/// What the learning-rate schedule runs over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Step `k` is at iteration `k` of the cosine schedule; the run ends after
    /// [`TrainConfig::total_steps`] steps (or earlier, when the time budget ends).
    #[default]
    Steps,
    /// The schedule runs over `time_budget_s`: a step starting `u` seconds into the run
    /// is at iteration `⌊total_steps · u / time_budget_s⌋`, so `steps`, `warmup_steps`
    /// and `cosine_steps` are in units of the budget's `1 / total_steps`, and the run
    /// takes as many steps as the budget holds, however fast they are. The schedule's
    /// end is where the budget's end is, whatever the load on the machine.
    Time,
}

/// Every hyper-parameter of a training run. TOML/JSON files use these keys, with
/// the model under `model` (the [`ModelConfig`] keys); missing keys take the defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Model shape and ablations (default: the CS336 TinyStories model).
    pub model: ModelConfig,
    /// Training tokens, a 1-D `.npy` of ids.
    pub train_data: PathBuf,
    /// Validation tokens (no validation when absent).
    pub val_data: Option<PathBuf>,
    /// Tokenizer directory, recorded in checkpoints for generation.
    pub tokenizer: Option<PathBuf>,
    /// Where the log, plot and checkpoint go.
    pub out_dir: PathBuf,
    /// Sequences per optimizer step `B` over all ranks; the sequence length `T` is
    /// `model.context_length`.
    pub batch_size: usize,
    /// Sequences one forward/backward holds (default: a rank's whole share,
    /// `batch_size / ranks`): each rank accumulates the step's gradient over
    /// `batch_size / (ranks · micro_batch_size)` of them. The trajectory is the same
    /// whatever it is.
    pub micro_batch_size: Option<usize>,
    /// ZeRO stage: 0, or 1 to shard the AdamW moments (and on GPUs the f32 master
    /// weights) over the ranks.
    pub zero: u8,
    /// Optimizer steps.
    pub steps: u64,
    /// Token budget: when set, `steps = ceil(max_tokens / (B·T))` instead.
    pub max_tokens: Option<u64>,
    pub lr_max: f64,
    pub lr_min: f64,
    pub warmup_steps: u64,
    /// End of the cosine cycle `T_c` (default: the number of steps).
    pub cosine_steps: Option<u64>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global gradient-norm limit (0: no clipping).
    pub grad_clip: f64,
    /// The run ends as diverged when a step's loss exceeds this many times the first
    /// step's (0: only a non-finite loss or gradient norm ends it).
    pub diverge_factor: f64,
    /// Seeds the initial weights and the batch order.
    pub seed: u64,
    /// Worker threads (0: one per core).
    pub threads: usize,
    /// Validate every this many steps (0: only at the end).
    pub eval_interval: u64,
    /// Cap on validation batches (0: the whole validation set).
    pub eval_batches: usize,
    /// Write the checkpoint every this many steps (0: only at the end).
    pub checkpoint_interval: u64,
    /// Log every this many steps.
    pub log_interval: u64,
    /// Also write the logged scalars and the configuration as TensorBoard event files,
    /// in `out_dir/tensorboard`.
    pub tensorboard: bool,
    /// Seconds the run may take, counted across resumes: it stops (evaluation and
    /// checkpoint) when the next step and that evaluation, as long as the last ones,
    /// would end past them.
    pub time_budget_s: Option<f64>,
    /// What the learning-rate schedule runs over: the steps, or the time budget.
    pub schedule: Schedule,
    /// Continue from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Where the model trains: `cpu`, `cuda`, `cuda:N` or `auto`.
    pub device: Device,
    /// Arithmetic: `bf16` mixed precision, `fp32`, or `auto` (bf16 where the CPU or
    /// GPU multiplies bf16 natively, else fp32).
    pub precision: Precision,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelConfig::tinystories(),
            train_data: PathBuf::new(),
            val_data: None,
            tokenizer: None,
            out_dir: PathBuf::from("runs/train"),
            batch_size: 32,
            micro_batch_size: None,
            zero: 0,
            steps: 5000,
            max_tokens: None,
            lr_max: 1e-3,
            lr_min: 1e-4,
            warmup_steps: 100,
            cosine_steps: None,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            diverge_factor: 2.0,
            seed: 0,
            threads: 0,
            eval_interval: 500,
            eval_batches: 0,
            checkpoint_interval: 1000,
            log_interval: 10,
            tensorboard: true,
            time_budget_s: None,
            schedule: Schedule::Steps,
            resume: None,
            device: Device::Cpu,
            precision: Precision::Auto,
        }
    }
}

/// How one step's batch is cut ([`TrainConfig::batch_split`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSplit {
    /// Sequences of the batch each rank takes.
    pub share: usize,
    /// Sequences per forward/backward: a step is `share / micro` of them per rank.
    pub micro: usize,
}

impl TrainConfig {
    /// Number of optimizer steps: from `max_tokens` when set, else `steps`.
    pub fn total_steps(&self) -> u64 {
        let tokens_per_step =
            (self.batch_size as u64).saturating_mul(self.model.context_length as u64);
        match self.max_tokens {
            Some(n) => n.div_ceil(tokens_per_step.max(1)),
            None => self.steps,
        }
    }

    /// The learning rate of step `step` (from 0), which starts `used_s` seconds into
    /// the run (see [`Schedule`]).
    pub fn learning_rate(&self, step: u64, used_s: f64) -> f64 {
        let total = self.total_steps();
        let iteration = match (self.schedule, self.time_budget_s) {
            (Schedule::Time, Some(budget_s)) => (total as f64 * used_s / budget_s) as u64,
            _ => step,
        };
        let cycle = self.cosine_steps.unwrap_or(total);
        lr_cosine_schedule(
            iteration,
            self.lr_max,
            self.lr_min,
            self.warmup_steps,
            cycle,
        )
    }

    /// Whether `step_s` seconds of work (a step, and an evaluation after it),
    /// starting `used_s` seconds into the run, end inside the time budget (always,
    /// without one).
    pub fn step_fits(&self, used_s: f64, step_s: f64) -> bool {
        self.time_budget_s
            .is_none_or(|budget_s| used_s + step_s <= budget_s)
    }

    /// The steps the run is expected to take after `done` steps in `used_s` seconds:
    /// [`Self::total_steps`], or with the time schedule the pace so far extended to
    /// the whole budget.
    pub fn planned_steps(&self, done: u64, used_s: f64) -> u64 {
        match (self.schedule, self.time_budget_s) {
            (Schedule::Time, Some(budget_s)) if done > 0 && used_s > 0.0 => {
                done.max((done as f64 * budget_s / used_s) as u64)
            }
            _ => self.total_steps(),
        }
    }

    /// Each rank's share of a step's batch and the micro-batch it is run in, for
    /// `ranks` ranks: an error naming the numbers when they do not divide.
    pub fn batch_split(&self, ranks: usize) -> Result<BatchSplit> {
        if !self.batch_size.is_multiple_of(ranks) {
            return Err(Error::Config(format!(
                "batch_size {} does not divide over {ranks} ranks: choose a multiple of {ranks}",
                self.batch_size
            )));
        }
        let share = self.batch_size / ranks;
        let micro = self.micro_batch_size.unwrap_or(share);
        if !share.is_multiple_of(micro) {
            return Err(Error::Config(format!(
                "micro_batch_size {micro} does not divide a rank's share of {share} sequences \
                 (batch_size {} over {ranks} ranks)",
                self.batch_size
            )));
        }
        Ok(BatchSplit { share, micro })
    }

    /// Every key with its value, `model.<key>` for the model's, in key order.
    pub fn keys(&self) -> std::collections::BTreeMap<String, Value> {
        let Value::Object(keys) = to_value(self) else {
            unreachable!("a TrainConfig is a table");
        };
        let mut flat = std::collections::BTreeMap::new();
        for (key, value) in keys {
            match value {
                Value::Object(inner) => {
                    flat.extend(inner.into_iter().map(|(k, v)| (format!("{key}.{k}"), v)))
                }
                value => drop(flat.insert(key, value)),
            }
        }
        flat
    }

    pub fn adamw(&self) -> AdamWParams {
        AdamWParams {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
        }
    }

    /// Checks that a step's scale — its tokens `B·T` times the model's parameters
    /// plus `context_length × d_model × num_layers` — is at most [`MAX_STEP_SCALE`]
    /// (the model being valid): every count of `tinylm info` for the step, its
    /// memory and its FLOPs, is less than 128 times that, so none overflows.
    pub fn check_scale(&self) -> Result<()> {
        let c = &self.model;
        let params = u128::from(ParamCounts::new(c).total());
        let context = [c.context_length, c.d_model, c.num_layers].map(|n| n as u128);
        let scale = (self.batch_size as u128)
            .checked_mul(c.context_length as u128)
            .and_then(|tokens| tokens.checked_mul(params + context.iter().product::<u128>()));
        if scale.is_none_or(|scale| scale > MAX_STEP_SCALE) {
            return Err(Error::Config(format!(
                "batch_size {} is too large for this model: a step of batch_size × context_length tokens times (parameters + context_length × d_model × num_layers) would be more than 2^56",
                self.batch_size
            )));
        }
        Ok(())
    }

    /// Checks every value is usable.
    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        let bad = |msg: String| Err(Error::Config(msg));
        if self.train_data.as_os_str().is_empty() {
            return bad("train_data is required".into());
        }
        if self.batch_size == 0 {
            return bad("batch_size must be positive".into());
        }
        if self.micro_batch_size == Some(0) {
            return bad("micro_batch_size must be positive".into());
        }
        if self.zero > 1 {
            return bad(format!("zero must be 0 or 1, got {}", self.zero));
        }
        self.check_scale()?;
        self.precision.for_training()?;
        if self.total_steps() == 0 {
            return bad("the number of steps must be positive".into());
        }
        if self.log_interval == 0 {
            return bad("log_interval must be positive".into());
        }
        for (name, v) in [("lr_max", self.lr_max), ("lr_min", self.lr_min)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!("{name} must be a non-negative number, got {v}"));
            }
        }
        for (name, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return bad(format!("{name} must lie in [0, 1), got {v}"));
            }
        }
        if let Some(s) = self.time_budget_s {
            if !(s.is_finite() && s > 0.0) {
                return bad(format!("time_budget_s must be a positive number, got {s}"));
            }
        }
        if self.schedule == Schedule::Time && self.time_budget_s.is_none() {
            return bad("schedule = \"time\" needs a time_budget_s to run over".into());
        }
        if !(self.diverge_factor == 0.0 || self.diverge_factor > 1.0) {
            return bad(format!(
                "diverge_factor must be 0 (off) or above 1, got {}",
                self.diverge_factor
            ));
        }
        if !(self.eps > 0.0 && self.weight_decay >= 0.0 && self.grad_clip >= 0.0) {
            return bad(format!(
                "eps must be positive and weight_decay, grad_clip non-negative (got {}, {}, {})",
                self.eps, self.weight_decay, self.grad_clip
            ));
        }
        Ok(())
    }
}

/// A run's configuration, and for a resumed run what differs from the configuration
/// its checkpoint recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedConfig {
    pub config: TrainConfig,
    /// The keys given with `resume` whose values differ from the recorded run's.
    pub changes: Vec<ConfigChange>,
}

impl ResolvedConfig {
    /// For a resumed run, a line saying so and naming every change.
    pub fn resume_note(&self) -> Option<String> {
        let path = self.config.resume.as_ref()?;
        let changes: Vec<String> = self.changes.iter().map(|c| c.to_string()).collect();
        Some(format!(
            "resuming {} with its recorded configuration{}",
            path.display(),
            match changes.is_empty() {
                true => String::new(),
                false => format!(", changed: {}", changes.join(", ")),
            }
        ))
    }
}

/// A key of a resumed run whose value differs from the recorded one.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigChange {
    /// The key, `model.<key>` for the model's.
    pub key: String,
    pub recorded: Value,
    pub value: Value,
}

impl std::fmt::Display for ConfigChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} -> {}", self.key, self.recorded, self.value)
    }
}

/// The configuration of a run from the keys `given` (a JSON object with any of
/// [`TrainConfig`]'s keys, the model's under `model`) over the defaults — or, when
/// `given` names a checkpoint under `resume`, over the configuration that
/// checkpoint recorded (`train_config`): the resumed run continues with the same
/// model, data, schedule, steps and seed unless a given key says otherwise. Given
/// keys that differ from the recorded values are returned as changes; a change to
/// the model is an error naming the key as `name` spells it (a CLI flag, a dict key).
/// A given `steps` without `max_tokens` drops a recorded `max_tokens`.
pub fn resolve_config(mut given: Value, name: &dyn Fn(&str) -> String) -> Result<ResolvedConfig> {
    if !given.is_object() {
        return Err(Error::Config(format!(
            "expected a table of training keys, got {given}"
        )));
    }
    // The checkpoint to resume from and the configuration it recorded.
    let recorded = match &given["resume"] {
        Value::Null => None,
        value => {
            let path =
                PathBuf::deserialize(value).map_err(|e| Error::Config(format!("resume: {e}")))?;
            Some((recorded_config(&path)?, path))
        }
    };
    let mut merged = to_value(
        recorded
            .as_ref()
            .map(|(r, _)| r.clone())
            .unwrap_or_default(),
    );
    if given.get("steps").is_some() && given.get("max_tokens").is_none() {
        merged["max_tokens"] = Value::Null;
    }
    merge(&mut merged, given.take());
    let config: TrainConfig =
        serde_json::from_value(merged).map_err(|e| Error::Config(e.to_string()))?;
    config.validate()?;
    let Some((recorded, path)) = recorded else {
        return Ok(ResolvedConfig {
            config,
            changes: Vec::new(),
        });
    };
    let changes = differences(&to_value(recorded), &to_value(&config));
    let model: Vec<String> = changes
        .iter()
        .filter_map(|c| {
            let key = c.key.strip_prefix("model.")?;
            Some(format!(
                "{} {} (the checkpoint's {key} is {})",
                name(&c.key),
                c.value,
                c.recorded
            ))
        })
        .collect();
    if !model.is_empty() {
        return Err(Error::Config(format!(
            "cannot resume from {}: a resumed run keeps its model, but {} would change it",
            path.display(),
            model.join(", ")
        )));
    }
    Ok(ResolvedConfig { config, changes })
}

/// A training configuration file as the keys it gives: TOML or JSON by its
/// extension, a table of training keys whose `model`, if any, is a table too (so
/// that flags can set keys in it). Errors name the file.
pub fn read_config_file(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let bad = |why: String| Error::Config(format!("{}: {why}", path.display()));
    let value: Value = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => toml::from_str(&text).map_err(|e| bad(e.to_string()))?,
        Some("json") => serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?,
        _ => return Err(bad("expected a .toml or .json file".into())),
    };
    let model = &value["model"];
    if !(value.is_object() && (model.is_object() || model.is_null())) {
        return Err(bad(
            "expected a table of training keys, the model's under `model`".into(),
        ));
    }
    Ok(value)
}

/// The training configuration a checkpoint recorded; for a checkpoint without one,
/// the defaults with the checkpoint's model.
pub(super) fn recorded_config(path: &Path) -> Result<TrainConfig> {
    let metadata = crate::safetensors_io::load_safetensors_metadata(path)?;
    let mut config = match metadata.get("train_config") {
        Some(_) => checkpoint::meta(&metadata, "train_config", path)?,
        None => TrainConfig {
            model: checkpoint::meta(&metadata, "config", path)?,
            ..TrainConfig::default()
        },
    };
    config.resume = Some(path.to_path_buf());
    Ok(config)
}

/// Deep-merges `over` into `base` (objects key by key, everything else replaced).
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (k, v) in over {
                merge(base.entry(k).or_insert(Value::Object(Map::new())), v);
            }
        }
        (base, over) => *base = over,
    }
}

/// The keys (one level into objects, `outer.inner`) whose values differ, but `resume`.
pub(crate) fn differences(recorded: &Value, value: &Value) -> Vec<ConfigChange> {
    let mut out = Vec::new();
    for (key, was) in recorded.as_object().into_iter().flatten() {
        let now = &value[key];
        match (was, now) {
            (Value::Object(_), Value::Object(_)) => {
                out.extend(differences(was, now).into_iter().map(|c| ConfigChange {
                    key: format!("{key}.{}", c.key),
                    ..c
                }))
            }
            _ if was != now && key != "resume" => out.push(ConfigChange {
                key: key.clone(),
                recorded: was.clone(),
                value: now.clone(),
            }),
            _ => {}
        }
    }
    out
}

/// A value as a JSON value.
fn to_value(value: impl Serialize) -> Value {
    serde_json::to_value(value).expect("serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_that_is_no_table_is_named() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("list.json", "[1]"),
            ("model.toml", "model = 3\n"),
            ("run.yaml", "a: 1\n"),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let err = read_config_file(&path).unwrap_err().to_string();
            assert!(err.contains(name), "{err}");
            assert!(
                err.contains("table") || err.contains(".toml or .json"),
                "{err}"
            );
        }
        let path = dir.path().join("run.toml");
        std::fs::write(&path, "steps = 3\n[model]\nd_model = 64\n").unwrap();
        let given = read_config_file(&path).unwrap();
        assert_eq!(
            (given["steps"].as_u64(), given["model"]["d_model"].as_u64()),
            (Some(3), Some(64))
        );
    }

    /// A batch no machine holds made `tinylm info`'s counts of its memory and
    /// FLOPs wrap around (shares of 1,051%, 26 FLOP per token) and
    /// `batch_size × context_length` overflow in `total_steps`.
    #[test]
    fn a_step_past_the_largest_scale_is_refused() {
        let base = TrainConfig {
            train_data: "t.npy".into(),
            ..TrainConfig::default()
        };
        let c = &base.model;
        let per_sequence = c.context_length as u128
            * (u128::from(ParamCounts::new(c).total())
                + (c.context_length * c.d_model * c.num_layers) as u128);
        let largest = (MAX_STEP_SCALE / per_sequence) as usize;
        let with = |batch_size| {
            TrainConfig {
                batch_size,
                ..base.clone()
            }
            .validate()
        };
        assert!(with(largest).is_ok());
        for batch_size in [largest + 1, 100_000_000_000_000, usize::MAX] {
            let err = with(batch_size).unwrap_err().to_string();
            assert!(
                err.contains(&format!("batch_size {batch_size} is too large")),
                "{err}"
            );
        }
    }
}
