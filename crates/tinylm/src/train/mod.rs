//! The training loop (SPEC §3): AdamW with the cosine schedule and clipping on
//! random batches of a memory-mapped token file, periodic validation, a JSONL log,
//! loss plots, checkpoints and bit-exact resume.
//!
//! Output directory `out_dir` (read back by [`RunDir`]):
//! - `config.json`: the run's configuration;
//! - `log.jsonl`: one JSON object per logged step with the keys `step, tokens,
//!   wallclock_s, train_loss, val_loss, lr, grad_norm, tokens_per_s` (`val_loss` is
//!   `null` unless the step was evaluated);
//! - `loss.svg`: train and validation loss against steps and against wall-clock,
//!   redrawn at each evaluation and at the end;
//! - `checkpoint.safetensors`: the latest checkpoint (see [`crate::checkpoint`]);
//! - `tensorboard/`: the logged scalars and the configuration as event files;
//! - `summary.json`: how the run ended ([`RunSummary`]).
//!
//! Step `k` (from 0) uses learning rate `lr_cosine_schedule(k, …)` and AdamW step
//! `k + 1` — or, with `schedule = "time"`, the schedule's iteration is the share of
//! the time budget used before the step (see [`Schedule`]). A run resumed from the
//! checkpoint of step `k` restores the weights, moments, step, seconds used and the
//! batch generator's state; [`resolve_config`] gives it the configuration the
//! checkpoint recorded, so on the same machine and thread count it reproduces the
//! uninterrupted run's losses bit for bit.
//!
//! The loop never waits for a step it has just queued ([`Model::optimizer_step`]): it
//! logs, reports and checks step `k − 1` while step `k` runs, so a non-finite loss
//! or gradient norm is found at most one step late (the error names its step). A
//! step that evaluates, checkpoints or stops is read at once, before anything is
//! saved, so the last good checkpoint is never overwritten after a non-finite value.
//!
//! A run diverges when a step's loss or gradient norm is not finite, or its loss
//! exceeds `diverge_factor` times the first step's: it ends at that step with the
//! divergence error, its log and plot kept up to the last finite loss and
//! `summary.json` saying `diverged` and where.

mod config;
mod log;
mod loss_plot;
mod run_dir;
pub mod tensorboard;

pub(crate) use config::differences;
pub use config::{
    read_config_file, resolve_config, BatchSplit, ConfigChange, ResolvedConfig, Schedule,
    TrainConfig, MAX_STEP_SCALE,
};
pub use log::{LogRecord, Progress};
pub use loss_plot::write_loss_plot;
pub use run_dir::{
    Divergence, RunDir, RunSummary, Status, CHECKPOINT_FILE, CONFIG_FILE, LOG_FILE, PLOT_FILE,
    SUMMARY_FILE, TENSORBOARD_DIR,
};

use crate::checkpoint::{self, check_same_config, BackendValues, CheckpointFile, Moments};
use crate::data::{Batch, SplitMix64, TokenDataset};
use crate::device::{rank_device, AnyBackend};
use crate::distributed::{shard, Reduce, World};
use crate::kernels::{Allocator, Backend, BatchPart, StepStats};
use crate::model::Model;
use crate::optim::AdamW;
use crate::{Error, Result};
use log::{Journal, QueuedStep};
use serde::Serialize;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
    evaluate_on(
        &World::single(),
        model,
        data,
        batch_size,
        max_batches,
        batch_size,
    )
}

/// [`evaluate`] in forward passes of `pass_size` windows (a training run's
/// micro-batch, so that evaluation runs in the step's activations), pass `j` on
/// rank `j mod R` of `world`; the result the same on every rank.
fn evaluate_on<B: Backend<f32>>(
    world: &World,
    model: &mut Model<f32, B>,
    data: &TokenDataset,
    batch_size: usize,
    max_batches: usize,
    pass_size: usize,
) -> Result<EvalResult> {
    let t = model.config().context_length;
    data.check_context(t)?;
    let mut windows = data.num_windows(t);
    if max_batches > 0 {
        windows = windows.min(max_batches * batch_size);
    }
    let mut batch = Batch::new(pass_size, t);
    // The loss summed over windows, and the windows.
    let mut sums = [0.0f64, 0.0];
    for j in (world.rank()..windows.div_ceil(pass_size)).step_by(world.ranks()) {
        let first = j * pass_size;
        let rows = data.fill_windows(&mut batch, first).min(windows - first);
        let n = rows * t;
        let loss = model.forward_loss(&batch.inputs[..n], &batch.targets[..n], rows, t)?;
        sums[0] += loss as f64 * rows as f64;
        sums[1] += rows as f64;
    }
    world.all_reduce(&mut sums, Reduce::Sum);
    Ok(EvalResult {
        loss: sums[0] / sums[1],
        windows: sums[1] as usize,
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
    /// The first step's loss, which `diverge_factor` multiplies.
    start_loss: Option<f64>,
}

impl RunState {
    /// Seconds the next step and an evaluation after it are expected to take.
    fn expected_s(&self) -> f64 {
        self.step_s + self.eval_s
    }
}

/// Runs training as `cfg` says, as one rank of `world` (see [`crate::distributed`]):
/// every rank takes its share of each step's batch, rank 0 alone logs, plots and
/// writes checkpoints. `stop` is checked after every step (rank 0's decides): when
/// set, the run evaluates, checkpoints and returns (Ctrl-C). `on_step` sees every
/// step on rank 0.
pub fn train(
    cfg: &TrainConfig,
    world: &World,
    stop: &AtomicBool,
    on_step: &mut (dyn FnMut(&Progress) + Send),
) -> Result<TrainSummary> {
    cfg.validate()?;
    cfg.batch_split(world.ranks())?;
    let device = rank_device(cfg.device, world)?;
    let mut train = || {
        let backend = AnyBackend::open(device, cfg.precision)?;
        crate::on_backend!(backend, backend => run(cfg, backend, world, stop, on_step))
    };
    if cfg.threads == 0 {
        return train();
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .build()
        .map_err(|e| Error::Config(format!("cannot start {} threads: {e}", cfg.threads)))?
        .install(train)
}

fn run<B: Backend<f32>>(
    cfg: &TrainConfig,
    backend: B,
    world: &World,
    stop: &AtomicBool,
    on_step: &mut (dyn FnMut(&Progress) + Send),
) -> Result<TrainSummary> {
    let started = Instant::now();
    let (b, t) = (cfg.batch_size, cfg.model.context_length);
    let split = cfg.batch_split(world.ranks())?;
    let (train_data, val_data) = open_data(cfg)?;
    world.check_same(&describe_run(cfg)?)?;
    prepare_out_dir(cfg, world)?;
    let ranks = match world.ranks() {
        1 => None,
        _ => Some(backend.collective(world)?),
    };
    let ranks = ranks.as_deref();
    let mut run = Run::start(cfg, world, backend, started)?;
    let clip = (cfg.grad_clip > 0.0).then_some(cfg.grad_clip);
    let mut rng = SplitMix64::new(run.state.rng);
    let mut batch = Batch::new(split.share, t);
    // The step whose statistics are on their way.
    let mut in_flight: Option<QueuedStep> = None;
    // The loop runs one step ahead: it queues step k, then finishes step k - 1 with its
    // statistics (on a GPU they arrive while step k runs). A step that evaluates,
    // checkpoints or stops is finished at once, before another is queued; the run ends
    // only after such a step, so the last one always evaluates and checkpoints however
    // long the logging in between took. Decisions that read the clock or the stop
    // flag are rank 0's, broadcast, so that the ranks never disagree on a step.
    loop {
        let queued_at = Instant::now();
        let mut lr = [cfg.learning_rate(run.state.step, run.elapsed_s())];
        if cfg.schedule == Schedule::Time {
            world.broadcast_f64(&mut lr);
        }
        let lr = lr[0];
        train_data.fill_random_rows(&mut batch, &mut rng, b, world.rank() * split.share);
        let micro_tokens = split.micro * t;
        let micro_batches = batch
            .inputs
            .chunks(micro_tokens)
            .zip(batch.targets.chunks(micro_tokens));
        for (i, (inputs, targets)) in micro_batches.enumerate() {
            let part = BatchPart {
                rows: b * t,
                accumulate: i > 0,
            };
            run.model
                .accumulate_gradient(inputs, targets, split.micro, t, part)?;
        }
        run.model.optimizer_step(&mut run.opt, lr, clip, ranks)?;
        let state = &mut run.state;
        state.step += 1;
        state.tokens += (b * t) as u64;
        state.rng = rng.state;
        let queued = QueuedStep {
            step: state.step,
            tokens: state.tokens,
            lr,
            at: queued_at,
        };
        if let Some(previous) = in_flight.replace(queued) {
            let (_, record) = run.finish_step(&previous)?;
            if let (Some(journal), Some(record)) = (&mut run.journal, &record) {
                journal.write(cfg, record, false, on_step)?;
            }
        }

        // Another step and the final evaluation, as long as the last ones, would end
        // past the budget. Counted from the end of this step: on a GPU it may still
        // run, until about a step after the previous statistics arrived.
        let step_start = run.last_ready.map_or(queued_at, |r| r.max(queued_at));
        let running_s = (step_start
            + Duration::try_from_secs_f64(run.state.step_s).unwrap_or_default())
        .saturating_duration_since(Instant::now())
        .as_secs_f64();
        let [stop_flag, out_of_time] = world.root_flags([
            stop.load(Ordering::Relaxed),
            !cfg.step_fits(run.elapsed_s() + running_s, run.state.expected_s()),
        ]);
        let next = after_step(cfg, run.state.step, stop_flag, out_of_time);
        if !(next.evaluate || next.save) {
            continue;
        }
        // This step's parameters are evaluated or saved: its statistics first, so that
        // nothing is saved after a non-finite loss.
        let queued = in_flight.take().expect("queued above");
        let (stats, record) = run.finish_step(&queued)?;
        let val_loss = match (&val_data, next.evaluate) {
            (Some(v), true) => Some(run.evaluate(v, split.micro)?),
            _ => None,
        };
        run.state.wallclock_s = run.elapsed_s();
        if let (Some(journal), Some(record)) = (&mut run.journal, record) {
            let record = LogRecord {
                val_loss,
                wallclock_s: run.state.wallclock_s,
                ..record
            };
            journal.write(cfg, &record, next.evaluate, on_step)?;
            if next.evaluate {
                write_loss_plot(&cfg.out_dir.join(run_dir::PLOT_FILE), journal.history())?;
            }
        }
        if next.save {
            run.save()?;
        }
        // Out of time by the estimate above, but the state just measured and saved
        // (the numbers a resumed run would check) still has room for a step and an
        // evaluation: the step came out faster than estimated, so the run goes on.
        let state = &run.state;
        let [room_left] = world.root_flags([cfg.step_fits(state.wallclock_s, state.expected_s())]);
        if next.stop || (next.out_of_time && !room_left) {
            return run.end(next.stopped_early, stats.loss, val_loss);
        }
    }
}

/// The training and validation tokens, each checked against the model's context.
fn open_data(cfg: &TrainConfig) -> Result<(TokenDataset, Option<TokenDataset>)> {
    let open = |path: &Path| -> Result<TokenDataset> {
        let data = TokenDataset::open(path, cfg.model.vocab_size)?;
        data.check_context(cfg.model.context_length)?;
        Ok(data)
    };
    Ok((
        open(&cfg.train_data)?,
        cfg.val_data.as_deref().map(open).transpose()?,
    ))
}

/// Rank 0 makes the output directory and writes the run's configuration into it; a
/// new run refuses a directory that holds an earlier run's checkpoint or log, a
/// resumed one removes its `summary.json` (it has not ended yet).
fn prepare_out_dir(cfg: &TrainConfig, world: &World) -> Result<()> {
    if !world.is_root() {
        return Ok(());
    }
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| Error::io(&cfg.out_dir, e))?;
    let ckpt_path = cfg.out_dir.join(run_dir::CHECKPOINT_FILE);
    if cfg.resume.is_none() {
        for earlier in [&ckpt_path, &cfg.out_dir.join(run_dir::LOG_FILE)] {
            if std::fs::metadata(earlier).is_ok_and(|m| m.len() > 0) {
                return Err(Error::Invalid(format!(
                    "{} already exists: resume that run (--resume {}) or choose another output directory",
                    earlier.display(),
                    ckpt_path.display()
                )));
            }
        }
    }
    run_dir::write_config(&cfg.out_dir, cfg)?;
    let summary = cfg.out_dir.join(run_dir::SUMMARY_FILE);
    if summary.exists() {
        std::fs::remove_file(&summary).map_err(|e| Error::io(&summary, e))?;
    }
    Ok(())
}

/// A run in progress: the model, its optimizer, where the run stands and what rank 0
/// writes — what the training loop's phases share.
struct Run<'a, B: Backend<f32>> {
    cfg: &'a TrainConfig,
    world: &'a World,
    model: Model<f32, B>,
    opt: AdamW<B::Buf>,
    state: RunState,
    /// Rank 0's log (and TensorBoard's events); none on the other ranks.
    journal: Option<Journal>,
    /// The last checkpoint written (or resumed from) and its step.
    saved: Option<(PathBuf, u64)>,
    /// When the last step's statistics arrived.
    last_ready: Option<Instant>,
    /// When this process started, and the seconds the run had used before it.
    started: Instant,
    wall_offset: f64,
}

impl<'a, B: Backend<f32>> Run<'a, B> {
    /// A new run's freshly initialized model, or the resumed checkpoint's; rank 0's
    /// journal opened at its step. A run with no step left is an error.
    fn start(cfg: &'a TrainConfig, world: &'a World, backend: B, started: Instant) -> Result<Self> {
        let (model, mut opt, state) = match &cfg.resume {
            Some(path) => resume(cfg, world, path, backend)?,
            None => {
                let model = Model::init_with_backend(cfg.model.clone(), cfg.seed, backend)?;
                let opt = model.new_adamw_for(cfg.adamw(), optimizer_shard(cfg, world, &model))?;
                let state = RunState {
                    rng: cfg.seed,
                    ..RunState::default()
                };
                (model, opt, state)
            }
        };
        opt.hp = cfg.adamw();
        let tokens_per_step = (cfg.batch_size * cfg.model.context_length) as u64;
        let journal = match world.is_root() {
            true => {
                let log_path = cfg.out_dir.join(run_dir::LOG_FILE);
                let journal = Journal::open(log_path, state.step, tokens_per_step)?;
                Some(match cfg.tensorboard {
                    true => journal.with_tensorboard(
                        &cfg.out_dir.join(run_dir::TENSORBOARD_DIR),
                        &serde_json::to_string_pretty(cfg).expect("serializes"),
                        state.step,
                        state.wallclock_s,
                    )?,
                    false => journal,
                })
            }
            false => None,
        };
        if !(state.step < step_limit(cfg) && cfg.step_fits(state.wallclock_s, state.expected_s())) {
            return Err(nothing_to_do(cfg, &state));
        }
        Ok(Run {
            cfg,
            world,
            model,
            opt,
            saved: cfg.resume.clone().map(|p| (p, state.step)),
            wall_offset: state.wallclock_s,
            state,
            journal,
            last_ready: None,
            started,
        })
    }

    /// Seconds the run has used, before a resume included.
    fn elapsed_s(&self) -> f64 {
        self.wall_offset + self.started.elapsed().as_secs_f64()
    }

    /// Finishes step `queued`, the oldest in flight: its statistics read, its time
    /// noted, its log record made (rank 0), and the run ended if it diverged.
    fn finish_step(&mut self, queued: &QueuedStep) -> Result<(StepStats, Option<LogRecord>)> {
        let (stats, step_s) = read_step(self.world, &mut self.model, queued, &mut self.last_ready)?;
        self.state.step_s = step_s;
        self.state.wallclock_s = self.elapsed_s();
        let wallclock_s = self.state.wallclock_s;
        let record =
            (self.journal.as_mut()).map(|j| j.record(queued, &stats, step_s, None, wallclock_s));
        check_divergence(
            self.cfg,
            &mut self.state,
            &stats,
            queued,
            &mut self.journal,
            &record,
            &self.saved,
        )?;
        Ok((stats, record))
    }

    /// The validation loss of the current parameters on `val_data` (in batches of
    /// `micro` sequences), its time noted for the time budget.
    fn evaluate(&mut self, val_data: &TokenDataset, micro: usize) -> Result<f64> {
        let eval_start = Instant::now();
        let (b, batches) = (self.cfg.batch_size, self.cfg.eval_batches);
        let eval = evaluate_on(self.world, &mut self.model, val_data, b, batches, micro)?;
        self.state.eval_s = eval_start.elapsed().as_secs_f64();
        Ok(eval.loss)
    }

    /// Writes the checkpoint of the current step.
    fn save(&mut self) -> Result<()> {
        let path = self.cfg.out_dir.join(run_dir::CHECKPOINT_FILE);
        save(
            self.cfg,
            self.world,
            &path,
            &self.model,
            &self.opt,
            &self.state,
        )?;
        self.saved = Some((path, self.state.step));
        Ok(())
    }

    /// Ends the run after its last step (`stopped_early` by the stop flag or the time
    /// budget): rank 0 writes `summary.json`.
    fn end(
        self,
        stopped_early: bool,
        train_loss: f64,
        val_loss: Option<f64>,
    ) -> Result<TrainSummary> {
        if let Some(journal) = &self.journal {
            let status = match stopped_early {
                true => Status::Stopped,
                false => Status::Finished,
            };
            RunSummary::from_log(status, journal.history(), None).write(&self.cfg.out_dir)?;
        }
        Ok(TrainSummary {
            steps: self.state.step,
            tokens: self.state.tokens,
            wallclock_s: self.state.wallclock_s,
            train_loss,
            val_loss,
            stopped_early,
            checkpoint: self.cfg.out_dir.join(run_dir::CHECKPOINT_FILE),
        })
    }
}

/// The parameters this rank's AdamW moments cover: all of them, or under ZeRO-1
/// its shard.
fn optimizer_shard<B: Backend<f32>>(
    cfg: &TrainConfig,
    world: &World,
    model: &Model<f32, B>,
) -> Range<usize> {
    let n = model.layout().total;
    match cfg.zero {
        0 => 0..n,
        _ => shard(n, world.ranks(), world.rank()),
    }
}

/// What every rank of a run must agree on: each configuration key (`model.<key>`
/// for the model's) and each data file's size and a fingerprint of its first and
/// last MiB.
fn describe_run(cfg: &TrainConfig) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = cfg
        .keys()
        .into_iter()
        .map(|(key, value)| (key, value.to_string()))
        .collect();
    for path in std::iter::once(&cfg.train_data).chain(&cfg.val_data) {
        out.push((format!("data file {}", path.display()), fingerprint(path)?));
    }
    Ok(out)
}

/// A file's size and a hash of its first and last MiB.
fn fingerprint(path: &Path) -> Result<String> {
    use std::hash::Hasher;
    use std::io::{Read, Seek, SeekFrom};
    const MIB: u64 = 1 << 20;
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut bytes = Vec::new();
    for start in [0, len.saturating_sub(MIB)] {
        bytes.clear();
        file.seek(SeekFrom::Start(start))
            .and_then(|_| (&mut file).take(MIB).read_to_end(&mut bytes))
            .map_err(|e| Error::io(path, e))?;
        hasher.write(&bytes);
    }
    Ok(format!(
        "{len} bytes, content hash {:016x}",
        hasher.finish()
    ))
}

/// The steps a run may take: the schedule's, or unbounded when the time budget
/// alone ends it.
fn step_limit(cfg: &TrainConfig) -> u64 {
    match cfg.schedule {
        Schedule::Steps => cfg.total_steps(),
        Schedule::Time => u64::MAX,
    }
}

/// What the loop does after queuing step `done` (from 1).
#[derive(Clone, Copy, Debug, PartialEq)]
struct AfterStep {
    /// Evaluate this step's parameters on the validation set.
    evaluate: bool,
    /// Write the checkpoint.
    save: bool,
    /// The run ends here: its last step, or the stop flag.
    stop: bool,
    /// Another step and an evaluation would end past the time budget: the run ends
    /// here unless this step, once measured, leaves room after all.
    out_of_time: bool,
    /// The run ends before its schedule does (the stop flag, or the budget of a
    /// step schedule).
    stopped_early: bool,
}

/// The stop/evaluate/save decision after step `done`, given whether the stop flag
/// is set and whether another step would end `out_of_time`. A stopping run always
/// evaluates and saves; otherwise the intervals say (0: never).
fn after_step(cfg: &TrainConfig, done: u64, stop_flag: bool, out_of_time: bool) -> AfterStep {
    let stop = done == step_limit(cfg) || stop_flag;
    let stopping = stop || out_of_time;
    let schedule_done = match cfg.schedule {
        Schedule::Steps => done >= cfg.total_steps(),
        Schedule::Time => out_of_time,
    };
    let every = |interval: u64| interval > 0 && done.is_multiple_of(interval);
    AfterStep {
        evaluate: stopping || every(cfg.eval_interval),
        save: stopping || every(cfg.checkpoint_interval),
        stop,
        out_of_time,
        stopped_early: stopping && !schedule_done,
    }
}

/// The error for a run with no step left: at its last step, or out of time.
fn nothing_to_do(cfg: &TrainConfig, state: &RunState) -> Error {
    Error::Config(match cfg.time_budget_s {
        Some(budget_s) if !cfg.step_fits(state.wallclock_s, state.expected_s()) => format!(
            "nothing to do: the run has used its time budget ({:.1} s of time_budget_s = {budget_s}, and a step takes {:.2} s)",
            state.wallclock_s,
            state.expected_s()
        ),
        _ => format!(
            "nothing to do: the run is already at step {} of {}",
            state.step,
            cfg.total_steps()
        ),
    })
}

/// Waits for the statistics of `queued`, the oldest step in flight, and sums the
/// loss over the ranks. Returns them and the step's time: from its start — its
/// launch, or when the previous statistics arrived if it was queued behind them —
/// to its statistics' arrival. On the CPU, where a step runs inside its launch,
/// that is the launch's time.
fn read_step<B: Backend<f32>>(
    world: &World,
    model: &mut Model<f32, B>,
    queued: &QueuedStep,
    last_ready: &mut Option<Instant>,
) -> Result<(StepStats, f64)> {
    let mut stats = model.step_stats()?;
    // Each rank's loss is its share of the batch's mean.
    let mut loss = [stats.loss];
    world.all_reduce(&mut loss, Reduce::Sum);
    stats.loss = loss[0];
    let start = last_ready.map_or(queued.at, |r| r.max(queued.at));
    *last_ready = Some(stats.ready);
    let step_s = stats.ready.saturating_duration_since(start).as_secs_f64();
    Ok((stats, step_s))
}

/// Ends the run as diverged when the statistics of step `queued` say so
/// ([`divergence`]); the first step's loss becomes the run's start loss. Rank 0
/// first logs the step (when its loss and gradient norm are finite), redraws the
/// plot and writes `summary.json`. Every rank sees the same summed loss, so all of
/// them end here.
fn check_divergence(
    cfg: &TrainConfig,
    state: &mut RunState,
    stats: &StepStats,
    queued: &QueuedStep,
    journal: &mut Option<Journal>,
    record: &Option<LogRecord>,
    saved: &Option<(PathBuf, u64)>,
) -> Result<()> {
    let start_loss = *state.start_loss.get_or_insert(stats.loss);
    let Some(reason) = divergence(cfg.diverge_factor, stats, start_loss) else {
        return Ok(());
    };
    if let Some(journal) = journal {
        // Logged only when finite: the log (JSON) has no NaN or infinity.
        let finite = stats.loss.is_finite() && stats.grad_norm().is_finite();
        if let Some(record) = record.as_ref().filter(|_| finite) {
            journal.append(record)?;
        }
        write_loss_plot(&cfg.out_dir.join(run_dir::PLOT_FILE), journal.history())?;
        let at = Divergence {
            step: queued.step,
            reason: reason.clone(),
        };
        RunSummary::from_log(Status::Diverged, journal.history(), Some(at)).write(&cfg.out_dir)?;
    }
    let kept = match saved {
        Some((path, step)) => format!(
            "the last good checkpoint, {} (step {step}), is kept",
            path.display()
        ),
        None => "no checkpoint was written yet".to_string(),
    };
    Err(Error::Diverged(format!(
        "training diverged: {reason} at step {} ({kept}); try a lower lr_max or a grad_clip",
        queued.step
    )))
}

/// Why a step with `stats` ends the run, if it does: a non-finite loss or gradient
/// norm, or a loss above `factor` (0: off) times `start_loss`.
fn divergence(factor: f64, stats: &StepStats, start_loss: f64) -> Option<String> {
    let norm = stats.grad_norm();
    if !stats.loss.is_finite() {
        Some(format!("loss is {}", stats.loss))
    } else if !norm.is_finite() {
        Some(format!("gradient norm is {norm}"))
    } else if factor > 0.0 && stats.loss > factor * start_loss {
        Some(format!(
            "loss {:.4} is above diverge_factor {factor} times the first step's {start_loss:.4}",
            stats.loss
        ))
    } else {
        None
    }
}

/// A model, its optimizer state and where the run stands.
type Resumed<B> = (Model<f32, B>, AdamW<<B as Allocator<f32>>::Buf>, RunState);
/// Loads `path` for resuming: the same model config, weights, AdamW state (this
/// rank's shard of it under ZeRO-1) and run state. Every rank reads the file, one
/// tensor at a time straight into its buffers.
fn resume<B: Backend<f32>>(
    cfg: &TrainConfig,
    world: &World,
    path: &Path,
    backend: B,
) -> Result<Resumed<B>> {
    let ckpt = CheckpointFile::open(path)?;
    check_same_config(path, ckpt.config(), &cfg.model)?;
    ckpt.require_optimizer()?;
    // Entries that checkpoints written before the time schedule lack.
    let has = |key| ckpt.metadata().contains_key(key);
    let seconds = |key| match has(key) {
        true => ckpt.meta(key),
        false => Ok(0.0),
    };
    let state = RunState {
        step: ckpt.meta("step")?,
        tokens: ckpt.meta("tokens")?,
        wallclock_s: ckpt.meta("wallclock_s")?,
        rng: ckpt.meta("rng_state")?,
        step_s: seconds("last_step_s")?,
        eval_s: seconds("last_eval_s")?,
        start_loss: match has("start_loss") {
            true => ckpt.meta("start_loss")?,
            false => None,
        },
    };
    let model = ckpt.model_to_train(backend)?;
    let opt = ckpt.adamw(&model, optimizer_shard(cfg, world, &model))?;
    Ok((model, opt, state))
}

/// Writes the checkpoint with the run's metadata: one file, by rank 0, with the
/// AdamW moments gathered from every rank's shard under ZeRO-1.
fn save<B: Backend<f32>>(
    cfg: &TrainConfig,
    world: &World,
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
        ("start_loss", json(s.start_loss)),
        ("train_config", json(cfg)),
        ("train_data", json(&cfg.train_data)),
        ("val_data", json(&cfg.val_data)),
        ("tokenizer", json(&cfg.tokenizer)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // Written from the backend's buffers: no host copy of the model or, unless
    // rank 0 gathers ZeRO-1 shards, of the moments.
    let on_backend = |buf| BackendValues {
        backend: model.backend(),
        buf,
    };
    let params = on_backend(model.param_buffer());
    let moments = |m, v| Moments {
        hp: opt.hp,
        step: opt.step,
        m,
        v,
    };
    if opt.covers.len() < model.layout().total {
        let shard = model.download_adamw(opt)?;
        let (m, v) = (world.gather(shard.m), world.gather(shard.v));
        let (Some(m), Some(v)) = (m, v) else {
            return Ok(()); // Not rank 0: its shard is sent.
        };
        let (m, v) = (m.as_slice(), v.as_slice());
        return checkpoint::save_from(path, model.config(), &params, Some(moments(&m, &v)), &meta);
    }
    if !world.is_root() {
        return Ok(());
    }
    let (m, v) = (on_backend(&opt.m), on_backend(&opt.v));
    checkpoint::save_from(path, model.config(), &params, Some(moments(&m, &v)), &meta)
}

/// A value as JSON text.
fn json(value: impl Serialize) -> String {
    serde_json::to_string(&value).expect("serializes")
}
