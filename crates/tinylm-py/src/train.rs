//! `tinylm.train`: the training loop of `tinylm::train`, with its log, plots and
//! checkpoints in the run directory; progress lines on stderr; Ctrl-C stops the run
//! cleanly (evaluation and checkpoint first) and then raises `KeyboardInterrupt`.
//! A config with `resume` continues that checkpoint's run with the configuration it
//! recorded, the config's other keys overriding it ([`resolve_config`]).

use crate::errors::{detached, model_error};
use crate::model::from_py_json;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use tinylm::distributed::World;
use tinylm::train::{read_config_file, resolve_config, Progress};

/// The keys of `config`: a dict, or a `.toml`/`.json` file.
pub fn given_config(config: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    match config.extract::<PathBuf>() {
        Ok(path) if !config.is_instance_of::<pyo3::types::PyDict>() => {
            read_config_file(&path).map_err(model_error)
        }
        _ => from_py_json(config, "config"),
    }
}

/// Trains a model as `config` says (a dict with the training keys and the model
/// under `model`, or a `.toml`/`.json` file of them) and returns the run directory.
#[pyfunction]
pub fn train(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let given = given_config(config)?;
    let resolved = resolve_config(given, &|key| format!("'{key}'")).map_err(model_error)?;
    if let Some(note) = resolved.resume_note() {
        eprintln!("{note}");
    }
    let cfg = resolved.config;
    let stop = AtomicBool::new(false);
    let interrupt: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);
    let log_every = cfg.log_interval.max(1);
    let mut on_step = |p: &Progress| {
        let r = p.record;
        if r.step.is_multiple_of(log_every) || r.step == p.total_steps {
            let val = r.val_loss.map_or(String::new(), |v| format!(" val {v:.4}"));
            eprintln!(
                "step {}/{}: train {:.4}{val} lr {:.2e} {:.0} tok/s",
                r.step, p.total_steps, r.train_loss, r.lr, r.tokens_per_s
            );
        }
        if let Err(e) = Python::attach(|py| py.check_signals()) {
            *interrupt.lock().expect("not poisoned") = Some(e);
            stop.store(true, Ordering::Relaxed);
        }
    };
    let summary = detached(py, || {
        tinylm::train::train(&cfg, &World::single(), &stop, &mut on_step).map_err(model_error)
    })?;
    if let Some(e) = interrupt.into_inner().expect("not poisoned") {
        return Err(e);
    }
    let _ = summary;
    Ok(cfg.out_dir)
}
