//! A run directory, as [`super::train`] leaves it and as `tinylm plot` and
//! `tinylm sweep` read it back:
//!
//! - `config.json`: the run's resolved [`TrainConfig`], written when it starts or resumes;
//! - `log.jsonl`: the logged records ([`LogRecord`]);
//! - `summary.json`: how the run ended ([`RunSummary`]), written when it does
//!   (finished, stopped early, or diverged); absent while it runs or after a kill;
//! - `loss.svg`, `checkpoint.safetensors`, `tensorboard/`.

use super::config::TrainConfig;
use super::log::{read_history, LogRecord};
use crate::files::write_bytes;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
pub const LOG_FILE: &str = "log.jsonl";
pub const SUMMARY_FILE: &str = "summary.json";
pub const CHECKPOINT_FILE: &str = "checkpoint.safetensors";
pub const PLOT_FILE: &str = "loss.svg";
pub const TENSORBOARD_DIR: &str = "tensorboard";

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// It took every step of its schedule.
    Finished,
    /// The stop flag (Ctrl-C) or the time budget ended it before its schedule did;
    /// its checkpoint resumes it.
    Stopped,
    /// A non-finite loss or gradient norm, or a loss above `diverge_factor` times
    /// the first step's, ended it.
    Diverged,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Finished => "finished",
            Status::Stopped => "stopped",
            Status::Diverged => "diverged",
        })
    }
}

/// Where and why a run diverged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// The step (from 1) whose loss or gradient norm ended the run.
    pub step: u64,
    /// What was wrong, e.g. `loss is NaN`.
    pub reason: String,
}

/// `summary.json`: how a run ended and its last figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub status: Status,
    /// Steps completed (a diverged run's last good step).
    pub steps: u64,
    pub tokens: u64,
    pub wallclock_s: f64,
    /// Loss of the last good step's batch.
    pub train_loss: Option<f64>,
    /// The last validation loss.
    pub val_loss: Option<f64>,
    /// Training throughput over the run: tokens over the seconds spent in steps.
    pub tokens_per_s: f64,
    pub diverged: Option<Divergence>,
}

impl RunSummary {
    /// The summary of a run that ended with `status` and logged `records`: the last
    /// record's figures, the last validation loss, and the training throughput over
    /// every logged window.
    pub fn from_log(
        status: Status,
        records: &[LogRecord],
        diverged: Option<Divergence>,
    ) -> RunSummary {
        let last = records.last();
        // Each record's window: the tokens since the one before, at its throughput.
        let mut tokens_before = 0;
        let mut seconds = 0.0;
        for r in records {
            seconds += (r.tokens - tokens_before) as f64 / r.tokens_per_s.max(1e-9);
            tokens_before = r.tokens;
        }
        RunSummary {
            status,
            steps: last.map_or(0, |r| r.step),
            tokens: last.map_or(0, |r| r.tokens),
            wallclock_s: last.map_or(0.0, |r| r.wallclock_s),
            train_loss: last.map(|r| r.train_loss),
            val_loss: records.iter().rev().find_map(|r| r.val_loss),
            tokens_per_s: match seconds > 0.0 {
                true => tokens_before as f64 / seconds,
                false => 0.0,
            },
            diverged,
        }
    }

    /// Writes `dir/summary.json` (temporary file and rename).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("serializes");
        write_bytes(&dir.join(SUMMARY_FILE), text.as_bytes())
    }
}

/// A run directory read back: its configuration, log and outcome.
#[derive(Clone, Debug)]
pub struct RunDir {
    pub path: PathBuf,
    /// `config.json`, or for a run without one the configuration its checkpoint
    /// recorded; `None` when neither is there.
    pub config: Option<TrainConfig>,
    pub records: Vec<LogRecord>,
    /// `summary.json`: `None` while the run goes on, or after it was killed.
    pub summary: Option<RunSummary>,
}

impl RunDir {
    /// Whether `dir` holds a run (a `log.jsonl`).
    pub fn is_run(dir: &Path) -> bool {
        dir.join(LOG_FILE).is_file()
    }

    /// Reads the run in `dir`; an error names the file at fault.
    pub fn open(dir: &Path) -> Result<RunDir> {
        let log = dir.join(LOG_FILE);
        if !log.is_file() {
            return Err(Error::Invalid(format!(
                "{}: not a run directory (no {LOG_FILE})",
                dir.display()
            )));
        }
        let records = read_history(&log, u64::MAX)?;
        let config = match read_json::<TrainConfig>(&dir.join(CONFIG_FILE))? {
            Some(config) => Some(config),
            None if dir.join(CHECKPOINT_FILE).is_file() => {
                Some(super::config::recorded_config(&dir.join(CHECKPOINT_FILE))?)
            }
            None => None,
        };
        Ok(RunDir {
            path: dir.to_path_buf(),
            config,
            records,
            summary: read_json(&dir.join(SUMMARY_FILE))?,
        })
    }

    /// The configuration's keys and values, `model.<key>` for the model's (empty
    /// without a configuration).
    pub fn flat_config(&self) -> BTreeMap<String, Value> {
        self.config
            .as_ref()
            .map(TrainConfig::keys)
            .unwrap_or_default()
    }
}

/// Writes `dir/config.json`: the run's configuration (temporary file and rename).
pub(super) fn write_config(dir: &Path, config: &TrainConfig) -> Result<()> {
    let text = serde_json::to_string_pretty(config).expect("serializes");
    write_bytes(&dir.join(CONFIG_FILE), text.as_bytes())
}

/// The JSON file at `path` parsed, `None` when it does not exist.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
}
