//! Sweeps: one training run per point of a grid of configuration values and/or a
//! list of named variants, each in its own directory under the sweep's, one after
//! another or several at once; then a summary (`summary.csv`, a table) and the
//! comparison plots.
//!
//! A sweep started again over the same directory skips the runs that ended
//! (finished or diverged: `summary.json` says so), resumes those with a checkpoint
//! (stopped, or killed after a checkpoint) and starts the others afresh. A run that
//! diverges ends as `diverged` and the sweep goes on; a run that fails otherwise is
//! reported `failed` with its error, and the sweep goes on too.

mod plan;

pub use plan::{config_key, points, Axis, AxisValue, Point, Variant};

use crate::compare::{write_comparison, CompareOptions, XAxis};
use crate::distributed::World;
use crate::files::write_bytes;
use crate::train::{self, Progress, RunDir, RunSummary, Status, TrainConfig};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The configuration keys whose values may differ between a run directory and the
/// point that reuses it: they change how a run is carried out, not its trajectory.
const HOW_KEYS: [&str; 4] = ["resume", "threads", "tensorboard", "out_dir"];

/// A sweep: its points, in the directory `out`, `parallel` at a time.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub out: PathBuf,
    pub points: Vec<Point>,
    pub parallel: usize,
}

/// How a point's run starts.
#[derive(Clone, Debug, PartialEq)]
pub enum Start {
    /// From step 0.
    Fresh,
    /// From the checkpoint in its directory.
    Resume(u64),
    /// It ended in an earlier sweep: nothing to do.
    Done,
}

/// What a point's run came to.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    /// How the run ended, `None` if it failed or never started.
    pub summary: Option<RunSummary>,
    /// The error of a run that failed (not a divergence).
    pub error: Option<String>,
    /// It had ended before this sweep started.
    pub skipped: bool,
}

impl RunResult {
    /// `finished`, `stopped`, `diverged`, `failed`, or `not run` (the sweep was stopped first).
    pub fn status(&self) -> String {
        match (&self.summary, &self.error) {
            (Some(s), _) => s.status.to_string(),
            (None, Some(_)) => "failed".into(),
            (None, None) => "not run".into(),
        }
    }
}

/// What a sweep reports as it goes (called from the worker threads).
pub trait Observer: Sync {
    /// Point `i`'s run starts (or is skipped, with [`Start::Done`]).
    fn start(&self, i: usize, point: &Point, start: &Start);
    /// Point `i`'s run finished a step.
    fn step(&self, i: usize, progress: &Progress);
    /// Point `i`'s run ended.
    fn end(&self, i: usize, point: &Point, result: &RunResult);
}

impl Sweep {
    /// The sweep of `points` in `out`, `parallel` runs at a time; each run's
    /// threads are `threads` of the base configuration, or with 0 the cores split
    /// between the parallel runs. A point whose directory holds a run of another
    /// configuration is an error naming the directory and the keys.
    pub fn new(out: &Path, mut points: Vec<Point>, parallel: usize) -> Result<Sweep> {
        if parallel == 0 {
            return Err(Error::Config("parallel must be at least 1".into()));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for point in &mut points {
            if point.config.threads == 0 && parallel > 1 {
                point.config.threads = (cores / parallel).max(1);
            }
            check_same_run(point)?;
        }
        Ok(Sweep {
            out: out.to_path_buf(),
            points,
            parallel,
        })
    }

    /// Runs every point not done yet, `parallel` at a time; stops starting runs
    /// once `stop` is set (the runs going on checkpoint and end). Then writes
    /// `summary.csv` and the comparison plots, and returns each point's result.
    pub fn run(&self, stop: &AtomicBool, observer: &dyn Observer) -> Result<Vec<RunResult>> {
        std::fs::create_dir_all(&self.out).map_err(|e| Error::io(&self.out, e))?;
        let results: Mutex<Vec<RunResult>> = Mutex::new(
            (0..self.points.len())
                .map(|_| RunResult {
                    summary: None,
                    error: None,
                    skipped: false,
                })
                .collect(),
        );
        let next = AtomicUsize::new(0);
        let worker = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= self.points.len() || stop.load(Ordering::Relaxed) {
                return;
            }
            let result = run_point(i, &self.points[i], stop, observer);
            observer.end(i, &self.points[i], &result);
            results.lock().expect("not poisoned")[i] = result;
        };
        std::thread::scope(|scope| {
            for _ in 0..self.parallel.min(self.points.len()) {
                scope.spawn(worker);
            }
        });
        let results = results.into_inner().expect("not poisoned");
        write_bytes(&self.out.join("summary.csv"), self.csv(&results).as_bytes())?;
        self.plot()?;
        Ok(results)
    }

    /// The comparison plots of the runs that have a log: `loss.svg`/`loss.png`
    /// against steps and `loss_wall.svg`/`loss_wall.png` against wall-clock seconds.
    fn plot(&self) -> Result<()> {
        let runs = self
            .points
            .iter()
            .map(|p| &p.config.out_dir)
            .filter(|dir| RunDir::is_run(dir))
            .map(|dir| RunDir::open(dir))
            .collect::<Result<Vec<_>>>()?;
        if runs.is_empty() {
            return Ok(());
        }
        for (x, stem) in [(XAxis::Step, "loss"), (XAxis::Wall, "loss_wall")] {
            let options = CompareOptions {
                x,
                ..CompareOptions::default()
            };
            for ext in ["svg", "png"] {
                write_comparison(&self.out.join(format!("{stem}.{ext}")), &runs, &options)?;
            }
        }
        Ok(())
    }

    /// The summary's columns: the variant and the axes, then the figures.
    fn columns(&self) -> Vec<String> {
        let mut columns: Vec<String> = self
            .points
            .first()
            .map(|p| p.values.iter().map(|(c, _)| c.clone()).collect())
            .unwrap_or_default();
        columns.extend(
            [
                "status",
                "steps",
                "train_loss",
                "val_loss",
                "tokens_per_s",
                "wallclock_s",
            ]
            .map(String::from),
        );
        columns
    }

    /// Each point's row: its values, then its results as text.
    fn rows(&self, results: &[RunResult]) -> Vec<Vec<String>> {
        let number =
            |v: Option<f64>, digits: usize| v.map_or(String::new(), |v| format!("{v:.digits$}"));
        self.points
            .iter()
            .zip(results)
            .map(|(point, result)| {
                let s = result.summary.as_ref();
                let mut row: Vec<String> = point.values.iter().map(|(_, v)| v.clone()).collect();
                let status = match s.and_then(|s| s.diverged.as_ref()) {
                    Some(d) => format!("diverged at step {}", d.step),
                    None => result.status(),
                };
                row.extend([
                    status,
                    s.map_or(String::new(), |s| s.steps.to_string()),
                    number(s.and_then(|s| s.train_loss), 4),
                    number(s.and_then(|s| s.val_loss), 4),
                    number(s.map(|s| s.tokens_per_s), 0),
                    number(s.map(|s| s.wallclock_s), 1),
                ]);
                row
            })
            .collect()
    }

    /// `summary.csv`: a header and a row per point.
    pub fn csv(&self, results: &[RunResult]) -> String {
        let field = |f: &str| match f.contains([',', '"', '\n']) {
            true => format!("\"{}\"", f.replace('"', "\"\"")),
            false => f.to_string(),
        };
        let line = |fields: &[String]| {
            fields
                .iter()
                .map(|f| field(f))
                .collect::<Vec<_>>()
                .join(",")
                + "\n"
        };
        let mut text = line(&self.columns());
        for row in self.rows(results) {
            text += &line(&row);
        }
        text
    }

    /// The summary as an aligned text table.
    pub fn table(&self, results: &[RunResult]) -> String {
        let mut rows = vec![self.columns()];
        rows.extend(self.rows(results));
        crate::text::table(&rows, 0, usize::MAX)
    }
}

/// How point's run starts, from what its directory holds: a summary of a run that
/// ended, a checkpoint to resume, or nothing usable (a run killed before its first
/// checkpoint leaves a log and event files, cleared here).
fn start_of(point: &Point) -> Result<Start> {
    let dir = &point.config.out_dir;
    if RunDir::is_run(dir)
        && RunDir::open(dir)?
            .summary
            .is_some_and(|s| s.status != Status::Stopped)
    {
        return Ok(Start::Done);
    }
    let checkpoint = dir.join(train::CHECKPOINT_FILE);
    if checkpoint.is_file() {
        let metadata = crate::safetensors_io::load_safetensors_metadata(&checkpoint)?;
        let step = crate::checkpoint::meta(&metadata, "step", &checkpoint)?;
        return Ok(Start::Resume(step));
    }
    for stale in [train::LOG_FILE, train::TENSORBOARD_DIR] {
        let path = dir.join(stale);
        let removed = match path.is_dir() {
            true => std::fs::remove_dir_all(&path),
            false => std::fs::remove_file(&path),
        };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(&path, e)),
            _ => {}
        }
    }
    Ok(Start::Fresh)
}

/// Runs point `i` as its directory says ([`start_of`]).
fn run_point(i: usize, point: &Point, stop: &AtomicBool, observer: &dyn Observer) -> RunResult {
    let failed = |e: Error| RunResult {
        summary: None,
        error: Some(e.to_string()),
        skipped: false,
    };
    let start = match start_of(point) {
        Ok(start) => start,
        Err(e) => return failed(e),
    };
    observer.start(i, point, &start);
    let dir = &point.config.out_dir;
    let summary = || RunDir::open(dir).map(|run| run.summary);
    if start == Start::Done {
        return match summary() {
            Ok(summary) => RunResult {
                summary,
                error: None,
                skipped: true,
            },
            Err(e) => failed(e),
        };
    }
    let config = TrainConfig {
        resume: match start {
            Start::Resume(_) => Some(dir.join(train::CHECKPOINT_FILE)),
            _ => None,
        },
        ..point.config.clone()
    };
    let outcome = train::train(&config, &World::single(), stop, &mut |p| {
        observer.step(i, p)
    });
    match outcome {
        Ok(_) | Err(Error::Diverged(_)) => match summary() {
            Ok(Some(summary)) => RunResult {
                summary: Some(summary),
                error: None,
                skipped: false,
            },
            Ok(None) => failed(Error::Invalid(format!(
                "{}: the run left no {}",
                dir.display(),
                train::SUMMARY_FILE
            ))),
            Err(e) => failed(e),
        },
        Err(e) => failed(e),
    }
}

/// Checks that `point`'s directory holds no run of another configuration (but for
/// [`HOW_KEYS`]): reusing it would mix two runs.
fn check_same_run(point: &Point) -> Result<()> {
    let dir = &point.config.out_dir;
    let path = dir.join(train::CONFIG_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let recorded: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    let now = serde_json::to_value(&point.config).expect("serializes");
    let changes: Vec<String> = train::differences(&recorded, &now)
        .into_iter()
        .filter(|c| !HOW_KEYS.contains(&c.key.as_str()))
        .map(|c| c.to_string())
        .collect();
    match changes.is_empty() {
        true => Ok(()),
        false => Err(Error::Config(format!(
            "{} holds a run of another configuration ({}): sweep into another directory, or remove it",
            dir.display(),
            changes.join(", ")
        ))),
    }
}
