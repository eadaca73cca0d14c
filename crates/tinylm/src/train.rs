//! The training loop (SPEC §3): AdamW with the cosine schedule and clipping on
//! random batches of a memory-mapped token file, periodic validation, a JSONL log,
//! loss plots, checkpoints and bit-exact resume.
//!
//! Output directory `out_dir`:
//! - `log.jsonl`: one JSON object per logged step with the keys `step, tokens,
//!   wallclock_s, train_loss, val_loss, lr, grad_norm, tokens_per_s` (`val_loss` is
//!   `null` unless the step was evaluated);
//! - `loss.svg`: train and validation loss against steps and against wall-clock,
//!   redrawn at each evaluation and at the end;
//! - `checkpoint.safetensors`: the latest checkpoint (see [`crate::checkpoint`]).
//!
//! Step `k` (from 0) uses learning rate `lr_cosine_schedule(k, …)` and AdamW step
//! `k + 1` — or, with `schedule = "time"`, the schedule's iteration is the share of
//! the time budget used before the step (see [`Schedule`]). A run resumed from the
//! checkpoint of step `k` restores the weights, moments, step, seconds used and the
//! batch generator's state; [`resolve_config`] gives it the configuration the
//! checkpoint recorded, so on the same machine and thread count it reproduces the
//! uninterrupted run's losses bit for bit.
//!
//! The loop never waits for a step it has just queued ([`Model::train_step`]): it
//! logs, reports and checks step `k − 1` while step `k` runs, so a non-finite loss
//! or gradient norm is found at most one step late (the error names its step). A
//! step that evaluates, checkpoints or stops is read at once, before anything is
//! saved, so the last good checkpoint is never overwritten after a non-finite value.

use crate::checkpoint::{self, check_same_config};
use crate::data::{Batch, SplitMix64, TokenDataset};
use crate::device::{run_on, BackendTask, Device, Precision};
use crate::kernels::{Backend, StepStats};
use crate::model::Model;
use crate::optim::{lr_cosine_schedule, AdamW, AdamWParams};
use crate::plot::write_loss_plot;
use crate::{Error, ModelConfig, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
    /// Sequences per step `B`; the sequence length `T` is `model.context_length`.
    pub batch_size: usize,
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
    /// GPU arithmetic (`bf16` mixed precision or `fp32`); the CPU always uses f32.
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
            seed: 0,
            threads: 0,
            eval_interval: 500,
            eval_batches: 0,
            checkpoint_interval: 1000,
            log_interval: 10,
            time_budget_s: None,
            schedule: Schedule::Steps,
            resume: None,
            device: Device::Cpu,
            precision: Precision::Bf16,
        }
    }
}

impl TrainConfig {
    /// Number of optimizer steps: from `max_tokens` when set, else `steps`.
    pub fn total_steps(&self) -> u64 {
        let tokens_per_step = (self.batch_size * self.model.context_length) as u64;
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

    pub fn adamw(&self) -> AdamWParams {
        AdamWParams {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
        }
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

/// The training configuration a checkpoint recorded; for a checkpoint without one,
/// the defaults with the checkpoint's model.
fn recorded_config(path: &Path) -> Result<TrainConfig> {
    let metadata = crate::params::load_safetensors_metadata(path)?;
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
fn differences(recorded: &Value, value: &Value) -> Vec<ConfigChange> {
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

/// One line of `log.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// Steps completed.
    pub step: u64,
    /// Training tokens processed.
    pub tokens: u64,
    /// Seconds since the run started (across resumes), evaluation included.
    pub wallclock_s: f64,
    /// Loss of this step's batch.
    pub train_loss: f64,
    pub val_loss: Option<f64>,
    /// Learning rate of this step.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Training throughput since the previous logged step (evaluation excluded).
    pub tokens_per_s: f64,
}

/// What the progress callback sees after each step.
pub struct Progress<'a> {
    pub record: &'a LogRecord,
    /// The steps the run is expected to take ([`TrainConfig::planned_steps`]).
    pub total_steps: u64,
}

/// The outcome of [`train`].
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSummary {
    /// Steps completed (including those before a resume).
    pub steps: u64,
    pub tokens: u64,
    pub wallclock_s: f64,
    pub train_loss: f64,
    pub val_loss: Option<f64>,
    /// True when the stop flag or the time budget ended the run early.
    pub stopped_early: bool,
    pub checkpoint: PathBuf,
}

/// Validation loss over sequential windows (see [`crate::data`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalResult {
    /// Mean cross-entropy per token.
    pub loss: f64,
    /// Windows of `T` predictions evaluated.
    pub windows: usize,
}

impl EvalResult {
    pub fn perplexity(&self) -> f64 {
        self.loss.exp()
    }
}

/// Mean loss over the first `max_batches` batches (0: all) of `B` consecutive
/// validation windows of the model's context length.
pub fn evaluate<B: Backend<f32>>(
    model: &mut Model<f32, B>,
    data: &TokenDataset,
    batch_size: usize,
    max_batches: usize,
) -> Result<EvalResult> {
    let t = model.config().context_length;
    data.check_context(t)?;
    let mut batch = Batch::new(batch_size, t);
    let (mut sum, mut windows) = (0.0f64, 0usize);
    let mut batches = 0;
    while max_batches == 0 || batches < max_batches {
        let rows = data.fill_windows(&mut batch, windows);
        if rows == 0 {
            break;
        }
        let n = rows * t;
        let loss = model.forward_loss(&batch.inputs[..n], &batch.targets[..n], rows, t)?;
        sum += loss as f64 * rows as f64;
        windows += rows;
        batches += 1;
    }
    Ok(EvalResult {
        loss: sum / windows as f64,
        windows,
    })
}

/// Where a run stands; stored in checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct RunState {
    step: u64,
    tokens: u64,
    wallclock_s: f64,
    rng: u64,
    /// Seconds of the last step and of the last evaluation: what the next ones are
    /// expected to take against the time budget.
    step_s: f64,
    eval_s: f64,
}

/// Runs training as `cfg` says. `stop` is checked after every step: when set, the
/// run evaluates, checkpoints and returns (Ctrl-C). `on_step` sees every step.
pub fn train(
    cfg: &TrainConfig,
    stop: &AtomicBool,
    on_step: &mut (dyn FnMut(&Progress) + Send),
) -> Result<TrainSummary> {
    cfg.validate()?;
    let task = TrainTask { cfg, stop, on_step };
    if cfg.threads == 0 {
        return run_on(cfg.device, cfg.precision, task);
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .build()
        .map_err(|e| Error::Config(format!("cannot start {} threads: {e}", cfg.threads)))?
        .install(|| run_on(cfg.device, cfg.precision, task))
}

/// A training run, on whichever backend its device names.
struct TrainTask<'a, 'f> {
    cfg: &'a TrainConfig,
    stop: &'a AtomicBool,
    on_step: &'a mut (dyn FnMut(&Progress) + Send + 'f),
}

impl BackendTask for TrainTask<'_, '_> {
    type Output = TrainSummary;
    fn run<B: Backend<f32>>(self, backend: B) -> Result<TrainSummary> {
        run(self.cfg, backend, self.stop, self.on_step)
    }
}

fn run<B: Backend<f32>>(
    cfg: &TrainConfig,
    backend: B,
    stop: &AtomicBool,
    on_step: &mut (dyn FnMut(&Progress) + Send),
) -> Result<TrainSummary> {
    let started = Instant::now();
    let (b, t) = (cfg.batch_size, cfg.model.context_length);
    let train_data = TokenDataset::open(&cfg.train_data, cfg.model.vocab_size)?;
    train_data.check_context(t)?;
    let val_data = match &cfg.val_data {
        Some(p) => {
            let d = TokenDataset::open(p, cfg.model.vocab_size)?;
            d.check_context(t)?;
            Some(d)
        }
        None => None,
    };
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| Error::io(&cfg.out_dir, e))?;
    let ckpt_path = cfg.out_dir.join("checkpoint.safetensors");
    let log_path = cfg.out_dir.join("log.jsonl");
    let plot_path = cfg.out_dir.join("loss.svg");
    if cfg.resume.is_none() {
        // A new run never overwrites an earlier run's checkpoint or log.
        for earlier in [&ckpt_path, &log_path] {
            if std::fs::metadata(earlier).is_ok_and(|m| m.len() > 0) {
                return Err(Error::Invalid(format!(
                    "{} already exists: resume that run (--resume {}) or choose another output directory",
                    earlier.display(),
                    ckpt_path.display()
                )));
            }
        }
    }

    let (mut model, mut opt, mut state) = match &cfg.resume {
        Some(path) => resume(cfg, path, backend)?,
        None => {
            let model = Model::init_with_backend(cfg.model.clone(), cfg.seed, backend)?;
            let opt = model.new_adamw(cfg.adamw())?;
            let state = RunState {
                rng: cfg.seed,
                ..RunState::default()
            };
            (model, opt, state)
        }
    };
    opt.hp = cfg.adamw();
    let history = read_history(&log_path, state.step)?;
    let log = write_history(&log_path, &history)?;
    let mut journal = Journal {
        log,
        log_path,
        plot_path,
        history,
        step_tokens: (b * t) as u64,
        window_tokens: 0,
        window_s: 0.0,
    };

    let total = cfg.total_steps();
    // The time schedule ends on the budget alone, however many steps it holds.
    let step_limit = match cfg.schedule {
        Schedule::Steps => total,
        Schedule::Time => u64::MAX,
    };
    let clip = (cfg.grad_clip > 0.0).then_some(cfg.grad_clip);
    let mut rng = SplitMix64::new(state.rng);
    let mut batch = Batch::new(b, t);
    let wall_offset = state.wallclock_s;
    let mut last = None;
    // The last checkpoint written (or resumed from) and its step.
    let mut saved = cfg.resume.clone().map(|p| (p, state.step));
    let mut stopped_early = false;
    // The step whose statistics are on their way, and when the last ones arrived.
    let mut in_flight: Option<Launched> = None;
    let mut last_ready: Option<Instant> = None;
    // The loop runs one step ahead: it queues step k, then finishes step k - 1 with its
    // statistics (on a GPU they arrive while step k runs). A step that evaluates,
    // checkpoints or stops is finished at once, before another is queued.
    // Only the first step is checked here against the budget; after it, each step decides
    // whether another follows (`stopping` below), so the last one always evaluates and
    // checkpoints however long the logging in between took.
    while last.is_some()
        || in_flight.is_some()
        || (state.step < step_limit
            && cfg.step_fits(state.wallclock_s, state.step_s + state.eval_s))
    {
        let launched_at = Instant::now();
        let lr = cfg.learning_rate(state.step, wall_offset + started.elapsed().as_secs_f64());
        train_data.fill_random(&mut batch, &mut rng);
        model.train_step(&batch.inputs, &batch.targets, b, t, &mut opt, lr, clip)?;
        state.step += 1;
        state.tokens += (b * t) as u64;
        state.rng = rng.state;
        let launched = Launched {
            step: state.step,
            tokens: state.tokens,
            lr,
            at: launched_at,
        };
        if let Some(previous) = in_flight.replace(launched) {
            let (stats, step_s) = read_step(&mut model, &previous, &mut last_ready, &saved)?;
            state.step_s = step_s;
            state.wallclock_s = wall_offset + started.elapsed().as_secs_f64();
            let record = journal.record(&previous, &stats, step_s, None, state.wallclock_s);
            journal.write(cfg, &record, false, on_step)?;
            last = Some(record);
        }

        let done = state.step;
        // Another step and the final evaluation, as long as the last ones, would end
        // past the budget. Counted from the end of this step: on a GPU it may still
        // run, until about a step after the previous statistics arrived.
        let step_start = last_ready.map_or(launched_at, |r| r.max(launched_at));
        let running_s = (step_start
            + Duration::try_from_secs_f64(state.step_s).unwrap_or_default())
        .saturating_duration_since(Instant::now())
        .as_secs_f64();
        let used_s = wall_offset + started.elapsed().as_secs_f64() + running_s;
        let out_of_time = !cfg.step_fits(used_s, state.step_s + state.eval_s);
        let stop_now = done == step_limit || stop.load(Ordering::Relaxed);
        let stopping = stop_now || out_of_time;
        let schedule_done = match cfg.schedule {
            Schedule::Steps => done >= total,
            Schedule::Time => out_of_time,
        };
        stopped_early = stopping && !schedule_done;
        let eval_now =
            stopping || (cfg.eval_interval > 0 && done.is_multiple_of(cfg.eval_interval));
        let save_now = stopping
            || (cfg.checkpoint_interval > 0 && done.is_multiple_of(cfg.checkpoint_interval));
        if !(eval_now || save_now) {
            continue;
        }
        // This step's parameters are evaluated or saved: its statistics first, so that
        // nothing is saved after a non-finite loss.
        let launched = in_flight.take().expect("queued above");
        let (stats, step_s) = read_step(&mut model, &launched, &mut last_ready, &saved)?;
        state.step_s = step_s;
        let eval_start = Instant::now();
        let val_loss = match (&val_data, eval_now) {
            (Some(v), true) => Some(evaluate(&mut model, v, b, cfg.eval_batches)?.loss),
            _ => None,
        };
        if val_loss.is_some() {
            state.eval_s = eval_start.elapsed().as_secs_f64();
        }
        state.wallclock_s = wall_offset + started.elapsed().as_secs_f64();
        let record = journal.record(&launched, &stats, step_s, val_loss, state.wallclock_s);
        journal.write(cfg, &record, eval_now, on_step)?;
        last = Some(record);
        if save_now {
            save(cfg, &ckpt_path, &model, &opt, &state)?;
            saved = Some((ckpt_path.clone(), done));
        }
        // Out of time by the estimate above, but the state just measured and saved
        // (the numbers a resumed run would check) still has room for a step and an
        // evaluation: the step came out faster than estimated, so the run goes on.
        let room_left = cfg.step_fits(state.wallclock_s, state.step_s + state.eval_s);
        if stop_now || (out_of_time && !room_left) {
            break;
        }
    }
    let last = last.ok_or_else(|| {
        Error::Config(match cfg.time_budget_s {
            Some(budget_s) if !cfg.step_fits(state.wallclock_s, state.step_s + state.eval_s) => {
                format!(
                    "nothing to do: the run has used its time budget ({:.1} s of time_budget_s = {budget_s}, and a step takes {:.2} s)",
                    state.wallclock_s,
                    state.step_s + state.eval_s
                )
            }
            _ => format!(
                "nothing to do: the run is already at step {} of {total}",
                state.step
            ),
        })
    })?;
    Ok(TrainSummary {
        steps: state.step,
        tokens: state.tokens,
        wallclock_s: state.wallclock_s,
        train_loss: last.train_loss,
        val_loss: last.val_loss,
        stopped_early,
        checkpoint: ckpt_path,
    })
}

/// A training step queued on the model, its statistics not read yet.
struct Launched {
    /// Steps done with it (its number, from 1) and tokens.
    step: u64,
    tokens: u64,
    lr: f64,
    /// When the loop began it (batch sampling included).
    at: Instant,
}

/// Waits for the statistics of `launched`, the oldest step in flight, and checks
/// them (a non-finite value is the divergence error naming that step). Returns them
/// and the step's time: from its start — its launch, or when the previous statistics
/// arrived if it was queued behind them — to its statistics' arrival. On the CPU,
/// where a step runs inside its launch, that is the launch's time.
fn read_step<B: Backend<f32>>(
    model: &mut Model<f32, B>,
    launched: &Launched,
    last_ready: &mut Option<Instant>,
    saved: &Option<(PathBuf, u64)>,
) -> Result<(StepStats, f64)> {
    let stats = model.step_stats()?;
    if !stats.loss.is_finite() {
        return Err(diverged(launched.step, "loss", stats.loss, saved));
    }
    if !stats.grad_norm().is_finite() {
        return Err(diverged(
            launched.step,
            "gradient norm",
            stats.grad_norm(),
            saved,
        ));
    }
    let start = last_ready.map_or(launched.at, |r| r.max(launched.at));
    *last_ready = Some(stats.ready);
    let step_s = stats.ready.saturating_duration_since(start).as_secs_f64();
    Ok((stats, step_s))
}

/// The run's log: `log.jsonl`, the records the plot is drawn from, and the
/// training throughput since the last logged step.
struct Journal {
    log: std::fs::File,
    log_path: PathBuf,
    plot_path: PathBuf,
    history: Vec<LogRecord>,
    /// Tokens per step `B·T`.
    step_tokens: u64,
    window_tokens: u64,
    window_s: f64,
}

impl Journal {
    /// The record of a finished step that took `step_s` seconds.
    fn record(
        &mut self,
        launched: &Launched,
        stats: &StepStats,
        step_s: f64,
        val_loss: Option<f64>,
        wallclock_s: f64,
    ) -> LogRecord {
        self.window_s += step_s;
        self.window_tokens += self.step_tokens;
        LogRecord {
            step: launched.step,
            tokens: launched.tokens,
            wallclock_s,
            train_loss: stats.loss,
            val_loss,
            lr: launched.lr,
            grad_norm: stats.grad_norm(),
            tokens_per_s: self.window_tokens as f64 / self.window_s.max(1e-9),
        }
    }

    /// Writes `record` to the log when it was `evaluated` or falls on the log
    /// interval, shows it to the progress callback, and redraws the plot after an
    /// evaluation.
    fn write(
        &mut self,
        cfg: &TrainConfig,
        record: &LogRecord,
        evaluated: bool,
        on_step: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<()> {
        if evaluated || record.step.is_multiple_of(cfg.log_interval) {
            writeln!(
                self.log,
                "{}",
                serde_json::to_string(record).expect("serializes")
            )
            .and_then(|_| self.log.flush())
            .map_err(|e| Error::io(&self.log_path, e))?;
            self.history.push(record.clone());
            (self.window_tokens, self.window_s) = (0, 0.0);
        }
        on_step(&Progress {
            record,
            total_steps: cfg.planned_steps(record.step, record.wallclock_s),
        });
        if evaluated {
            write_loss_plot(&self.plot_path, &self.history)?;
        }
        Ok(())
    }
}

/// The error for a non-finite loss or gradient at step `step` (from 1).
fn diverged(step: u64, what: &str, value: f64, saved: &Option<(PathBuf, u64)>) -> Error {
    let kept = match saved {
        Some((path, step)) => format!(
            "the last good checkpoint, {} (step {step}), is kept",
            path.display()
        ),
        None => "no checkpoint was written yet".to_string(),
    };
    Error::Invalid(format!(
        "training diverged: {what} is {value} at step {step} ({kept}); try a lower lr_max or a grad_clip"
    ))
}

/// A model, its optimizer state and where the run stands.
type Resumed<B> = (Model<f32, B>, AdamW<<B as Backend<f32>>::Buf>, RunState);

/// Loads `path` for resuming: the same model config, weights, AdamW state and run state.
fn resume<B: Backend<f32>>(cfg: &TrainConfig, path: &Path, backend: B) -> Result<Resumed<B>> {
    let ckpt = checkpoint::load(path)?;
    check_same_config(path, &ckpt.config, &cfg.model)?;
    let opt = ckpt.optimizer.as_ref().ok_or_else(|| {
        Error::Invalid(format!(
            "{}: no optimizer state (optim.m.*, optim.v.*) to resume from",
            path.display()
        ))
    })?;
    // Entries that checkpoints written before the time schedule lack.
    let seconds = |key| match ckpt.metadata.contains_key(key) {
        true => ckpt.meta(key, path),
        false => Ok(0.0),
    };
    let state = RunState {
        step: ckpt.meta("step", path)?,
        tokens: ckpt.meta("tokens", path)?,
        wallclock_s: ckpt.meta("wallclock_s", path)?,
        rng: ckpt.meta("rng_state", path)?,
        step_s: seconds("last_step_s")?,
        eval_s: seconds("last_eval_s")?,
    };
    let model = Model::with_backend(ckpt.config, &ckpt.params, backend)?;
    let opt = model.upload_adamw(opt)?;
    Ok((model, opt, state))
}

/// Writes the checkpoint with the run's metadata.
fn save<B: Backend<f32>>(
    cfg: &TrainConfig,
    path: &Path,
    model: &Model<f32, B>,
    opt: &AdamW<B::Buf>,
    s: &RunState,
) -> Result<()> {
    let meta: BTreeMap<String, String> = [
        ("step", json(s.step)),
        ("tokens", json(s.tokens)),
        ("wallclock_s", json(s.wallclock_s)),
        ("rng_state", json(s.rng)),
        ("last_step_s", json(s.step_s)),
        ("last_eval_s", json(s.eval_s)),
        ("train_config", json(cfg)),
        ("train_data", json(&cfg.train_data)),
        ("val_data", json(&cfg.val_data)),
        ("tokenizer", json(&cfg.tokenizer)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let params = model.download_params()?;
    let opt = model.download_adamw(opt)?;
    checkpoint::save(path, model.config(), &params, Some(&opt), &meta)
}

/// A value as a JSON value.
fn to_value(value: impl Serialize) -> Value {
    serde_json::to_value(value).expect("serializes")
}

/// A value as JSON text.
fn json(value: impl Serialize) -> String {
    serde_json::to_string(&value).expect("serializes")
}

/// The records of an existing `log.jsonl` up to `step` (none for a fresh run).
fn read_history(path: &Path, step: u64) -> Result<Vec<LogRecord>> {
    if step == 0 || !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let r: LogRecord = serde_json::from_str(line).map_err(|e| {
            Error::Invalid(format!(
                "{}:{}: not a log record: {e}",
                path.display(),
                i + 1
            ))
        })?;
        if r.step <= step {
            out.push(r);
        }
    }
    Ok(out)
}

/// Rewrites `path` with `records` (temporary file and rename) and opens it for appending.
fn write_history(path: &Path, records: &[LogRecord]) -> Result<std::fs::File> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut text = String::new();
    for r in records {
        text += &serde_json::to_string(r).expect("serializes");
        text.push('\n');
    }
    std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))
}
