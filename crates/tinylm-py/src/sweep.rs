//! `tinylm.sweep`: the runs of a grid and/or list of variants over a base
//! configuration, as `tinylm sweep` runs them ([`tinylm::sweep`]); a line per run on
//! stderr; Ctrl-C stops the runs going on cleanly and raises `KeyboardInterrupt`.

use crate::errors::{detached, invalid, model_error};
use crate::model::from_py_json;
use crate::train::given_config;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tinylm::sweep::{points, Axis, AxisValue, Observer, Point, RunResult, Start, Sweep, Variant};
use tinylm::train::Progress;

/// Runs the sweep and returns a dict per run: `name`, `dir`, `values` (the
/// variant's and axes' values by column), `status`, `steps`, `train_loss`,
/// `val_loss`, `tokens_per_s`, `wallclock_s`, `diverged_step`, `error`.
#[pyfunction]
#[pyo3(signature = (out, config, grid=None, variants=None, parallel=1))]
pub fn sweep(
    py: Python<'_>,
    out: PathBuf,
    config: &Bound<'_, PyAny>,
    grid: Option<&Bound<'_, PyDict>>,
    variants: Option<&Bound<'_, PyAny>>,
    parallel: usize,
) -> PyResult<Vec<Py<PyDict>>> {
    // `out_dir` is replaced by each run's directory.
    let base = given_config(config)?;
    if !base["resume"].is_null() {
        return Err(invalid(
            "config: `resume` is the sweep's to set: a sweep called again resumes its runs",
        ));
    }
    let mut axes = Vec::new();
    for (key, values) in grid.into_iter().flatten() {
        let key: String = key.extract()?;
        let values: serde_json::Value = from_py_json(&values, &format!("grid[{key:?}]"))?;
        let Some(values) = values.as_array() else {
            return Err(invalid(format!("grid[{key:?}]: expected a list of values")));
        };
        let values = values.iter().cloned().map(AxisValue::of).collect();
        axes.push(Axis::new(&key, values).map_err(model_error)?);
    }
    let variants = match variants {
        None => Vec::new(),
        Some(v) => variants_of(v)?,
    };
    let points = points(&base, &axes, &variants, &out).map_err(model_error)?;
    let sweep = Sweep::new(&out, points, parallel).map_err(model_error)?;
    let lines = Lines {
        stop: AtomicBool::new(false),
        interrupt: Mutex::new(None),
        runs: sweep.points.len(),
    };
    let results = detached(py, || sweep.run(&lines.stop, &lines).map_err(model_error))?;
    eprint!("{}", sweep.table(&results));
    if let Some(e) = lines.interrupt.into_inner().expect("not poisoned") {
        return Err(e);
    }
    sweep
        .points
        .iter()
        .zip(&results)
        .map(|(point, result)| row(py, point, result))
        .collect()
}

/// Variants from a list (each a preset name or `NAME:KEY=V,...`) or a dict (name →
/// dict of keys).
fn variants_of(given: &Bound<'_, PyAny>) -> PyResult<Vec<Variant>> {
    if let Ok(dict) = given.cast::<PyDict>() {
        let mut out = Vec::new();
        for (name, keys) in dict {
            let name: String = name.extract()?;
            let keys: serde_json::Value = from_py_json(&keys, &format!("variants[{name:?}]"))?;
            let Some(keys) = keys.as_object() else {
                return Err(invalid(format!(
                    "variants[{name:?}]: expected a dict of keys"
                )));
            };
            let keys = keys.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            out.push(Variant::new(&name, keys).map_err(model_error)?);
        }
        return Ok(out);
    }
    if given.is_instance_of::<PyString>() {
        return Err(invalid(
            "variants: expected a list of names or a dict, got a string",
        ));
    }
    let mut out = Vec::new();
    for spec in given.try_iter()? {
        let spec: String = spec?.extract()?;
        out.extend(Variant::parse_list(&spec).map_err(model_error)?);
    }
    Ok(out)
}

/// The dict of a point's result.
fn row(py: Python<'_>, point: &Point, result: &RunResult) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    let s = result.summary.as_ref();
    let values = PyDict::new(py);
    for (column, value) in &point.values {
        values.set_item(column, value)?;
    }
    d.set_item("name", &point.name)?;
    d.set_item("dir", &point.config.out_dir)?;
    d.set_item("values", values)?;
    d.set_item("status", result.status())?;
    d.set_item("steps", s.map(|s| s.steps))?;
    d.set_item("train_loss", s.and_then(|s| s.train_loss))?;
    d.set_item("val_loss", s.and_then(|s| s.val_loss))?;
    d.set_item("tokens_per_s", s.map(|s| s.tokens_per_s))?;
    d.set_item("wallclock_s", s.map(|s| s.wallclock_s))?;
    d.set_item(
        "diverged_step",
        s.and_then(|s| s.diverged.as_ref()).map(|d| d.step),
    )?;
    d.set_item("error", &result.error)?;
    Ok(d.unbind())
}

/// A line per run on stderr; a pending Ctrl-C sets the stop flag.
struct Lines {
    stop: AtomicBool,
    interrupt: Mutex<Option<PyErr>>,
    runs: usize,
}

impl Observer for Lines {
    fn start(&self, i: usize, point: &Point, start: &Start) {
        let how = match start {
            Start::Fresh => "starting".to_string(),
            Start::Resume(step) => format!("resuming at step {step}"),
            Start::Done => return,
        };
        eprintln!("[{}/{}] {}: {how}", i + 1, self.runs, point.name);
    }

    fn step(&self, _: usize, _: &Progress) {
        if let Err(e) = Python::attach(|py| py.check_signals()) {
            *self.interrupt.lock().expect("not poisoned") = Some(e);
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    fn end(&self, i: usize, point: &Point, result: &RunResult) {
        let status = match (&result.summary, &result.error) {
            (_, Some(e)) => format!("failed: {e}"),
            (Some(s), None) => match &s.diverged {
                Some(d) => format!("diverged at step {}: {}", d.step, d.reason),
                None => format!("{} after {} steps", s.status, s.steps),
            },
            (None, None) => "not run".into(),
        };
        eprintln!("[{}/{}] {}: {status}", i + 1, self.runs, point.name);
    }
}
