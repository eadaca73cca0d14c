//! The run's log: `log.jsonl` (one [`LogRecord`] per logged or evaluated step),
//! the records a resumed run keeps, and the throughput since the last logged step.

use super::config::TrainConfig;
use super::tensorboard::EventWriter;
use crate::files::write_bytes;
use crate::kernels::StepStats;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

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

/// A training step queued on the model, its statistics not read yet.
pub(super) struct QueuedStep {
    /// Steps done with it (its number, from 1) and tokens.
    pub step: u64,
    pub tokens: u64,
    pub lr: f64,
    /// When the loop began it (batch sampling included).
    pub at: Instant,
}

/// The run's log: `log.jsonl`, the records the plot is drawn from, and the
/// training throughput since the last logged step.
pub(super) struct Journal {
    log: std::fs::File,
    path: PathBuf,
    history: Vec<LogRecord>,
    /// Tokens per step `B·T`.
    step_tokens: u64,
    window_tokens: u64,
    window_s: f64,
    /// The TensorBoard event file, and the Unix time at which the run (across resumes)
    /// started: a record's wall time is that plus its `wallclock_s`.
    events: Option<(EventWriter, f64)>,
}

impl Journal {
    /// The log at `path` for a run at step `step` (0: a new run): a resumed run
    /// keeps the records up to its step (the file is rewritten without the later
    /// ones, temporary file and rename), a new one starts empty.
    pub fn open(path: PathBuf, step: u64, step_tokens: u64) -> Result<Journal> {
        let history = read_history(&path, step)?;
        let log = write_history(&path, &history)?;
        Ok(Journal {
            log,
            path,
            history,
            step_tokens,
            window_tokens: 0,
            window_s: 0.0,
            events: None,
        })
    }

    /// Also writes each logged record's scalars to a new event file in `dir`, after
    /// the configuration `config` (JSON) as text; `wallclock_s` is the run's time so far.
    /// A run resumed at `step` marks a restart at `step + 1`, so that readers drop
    /// what earlier files logged past its checkpoint.
    pub fn with_tensorboard(
        mut self,
        dir: &Path,
        config: &str,
        step: u64,
        wallclock_s: f64,
    ) -> Result<Journal> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut events = EventWriter::create(dir, now)?;
        if step > 0 {
            events.restart(step + 1, now)?;
        }
        let indented: String = config.lines().map(|l| format!("    {l}\n")).collect();
        events.text("config", step, now, &indented)?;
        self.events = Some((events, now - wallclock_s));
        Ok(self)
    }

    /// The records written so far (a resumed run's included).
    pub fn history(&self) -> &[LogRecord] {
        &self.history
    }

    /// The record of a finished step that took `step_s` seconds.
    pub fn record(
        &mut self,
        queued: &QueuedStep,
        stats: &StepStats,
        step_s: f64,
        val_loss: Option<f64>,
        wallclock_s: f64,
    ) -> LogRecord {
        self.window_s += step_s;
        self.window_tokens += self.step_tokens;
        LogRecord {
            step: queued.step,
            tokens: queued.tokens,
            wallclock_s,
            train_loss: stats.loss,
            val_loss,
            lr: queued.lr,
            grad_norm: stats.grad_norm(),
            tokens_per_s: self.window_tokens as f64 / self.window_s.max(1e-9),
        }
    }

    /// Writes `record` to the log when it was `evaluated` or falls on the log
    /// interval, and shows it to the progress callback.
    pub fn write(
        &mut self,
        cfg: &TrainConfig,
        record: &LogRecord,
        evaluated: bool,
        on_step: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<()> {
        if evaluated || record.step.is_multiple_of(cfg.log_interval) {
            self.append(record)?;
        }
        on_step(&Progress {
            record,
            total_steps: cfg.planned_steps(record.step, record.wallclock_s),
        });
        Ok(())
    }

    /// Writes `record` to the log (and the event file) and the history.
    pub fn append(&mut self, record: &LogRecord) -> Result<()> {
        writeln!(
            self.log,
            "{}",
            serde_json::to_string(record).expect("serializes")
        )
        .and_then(|_| self.log.flush())
        .map_err(|e| Error::io(&self.path, e))?;
        if let Some((events, started)) = &mut self.events {
            let mut scalars = vec![
                ("train/loss", record.train_loss),
                ("lr", record.lr),
                ("grad_norm", record.grad_norm),
                ("tokens_per_s", record.tokens_per_s),
            ];
            scalars.extend(record.val_loss.map(|v| ("val/loss", v)));
            events.scalars(record.step, *started + record.wallclock_s, &scalars)?;
        }
        self.history.push(record.clone());
        (self.window_tokens, self.window_s) = (0, 0.0);
        Ok(())
    }
}

/// The records of an existing `log.jsonl` up to `step` (none for a fresh run).
pub(super) fn read_history(path: &Path, step: u64) -> Result<Vec<LogRecord>> {
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
    let mut text = String::new();
    for r in records {
        text += &serde_json::to_string(r).expect("serializes");
        text.push('\n');
    }
    write_bytes(path, text.as_bytes())?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))
}
