//! `tinylm.checkpoint`: model and optimizer state dicts and the iteration in one
//! safetensors file (`tinylm::safetensors_io::{save,load}_safetensors`).
//!
//! Model tensors keep their names, optimizer tensors get the prefix `optim.` (so a
//! training checkpoint's `optim.m.<name>` / `optim.v.<name>` moments load as
//! `m.<name>` / `v.<name>`), the iteration is the metadata entry `iteration`, and
//! the caller's metadata entries are stored as given.

use crate::arrays::{output, Floats};
use crate::errors::{detached, invalid, model_error};
use pyo3::exceptions::PyFileNotFoundError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tinylm::safetensors_io::{load_safetensors, save_safetensors};

const OPTIM: &str = "optim.";
const ITERATION: &str = "iteration";

/// Where a checkpoint goes or comes from: a path, or a binary file object.
enum Target<'py> {
    Path(PathBuf),
    File(Bound<'py, PyAny>),
}

impl<'py> Target<'py> {
    fn new(x: &Bound<'py, PyAny>, method: &str) -> PyResult<Self> {
        if x.hasattr(method)? {
            Ok(Target::File(x.clone()))
        } else {
            Ok(Target::Path(x.extract().map_err(|_| {
                invalid(format!(
                    "expected a path or a binary file object with a .{method}() method, got {}",
                    x.get_type()
                ))
            })?))
        }
    }
}

/// `(name, array)` pairs of a state dict, names prefixed.
fn tensors<'py>(
    state: &Bound<'py, PyDict>,
    prefix: &str,
    what: &str,
) -> PyResult<Vec<(String, Floats<'py>)>> {
    state
        .iter()
        .map(|(k, v)| {
            let name: String = k
                .extract()
                .map_err(|_| invalid(format!("{what}: keys must be strings, got {k}")))?;
            let array = Floats::new(&v, &format!("{what}['{name}']"))?;
            Ok((format!("{prefix}{name}"), array))
        })
        .collect()
}

/// Writes the model and optimizer state dicts (float arrays, stored as float32), the
/// iteration and string metadata to `path_or_binary_file`.
#[pyfunction]
#[pyo3(signature = (path_or_binary_file, model_state, optimizer_state, iteration, metadata = None))]
pub fn save(
    py: Python<'_>,
    path_or_binary_file: &Bound<'_, PyAny>,
    model_state: &Bound<'_, PyDict>,
    optimizer_state: &Bound<'_, PyDict>,
    iteration: u64,
    metadata: Option<BTreeMap<String, String>>,
) -> PyResult<()> {
    let target = Target::new(path_or_binary_file, "write")?;
    let mut arrays = tensors(model_state, "", "model_state")?;
    if let Some((name, _)) = arrays.iter().find(|(n, _)| n.starts_with(OPTIM)) {
        return Err(invalid(format!(
            "model_state: the name '{name}' is reserved (prefix '{OPTIM}' marks optimizer tensors)"
        )));
    }
    arrays.extend(tensors(optimizer_state, OPTIM, "optimizer_state")?);
    let mut meta = metadata.unwrap_or_default();
    if meta.contains_key(ITERATION) {
        return Err(invalid(format!(
            "metadata: the key '{ITERATION}' is reserved"
        )));
    }
    meta.insert(ITERATION.into(), iteration.to_string());
    let views: Vec<(String, Vec<usize>, &[f32])> = arrays
        .iter()
        .map(|(name, a)| (name.clone(), a.shape.clone(), a.data()))
        .collect();
    let write = |path: &Path| -> PyResult<()> {
        // A missing directory is named as what it is (`save_safetensors` would
        // name the file).
        if let Some(dir) = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
        {
            return Err(PyFileNotFoundError::new_err(format!(
                "{}: no such directory",
                dir.display()
            )));
        }
        save_safetensors(path, &views, &meta).map_err(model_error)
    };
    match target {
        Target::Path(path) => detached(py, || write(&path)),
        Target::File(file) => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("checkpoint.safetensors");
            detached(py, || write(&path))?;
            let bytes = std::fs::read(&path)?;
            file.call_method1("write", (PyBytes::new(py, &bytes),))?;
            Ok(())
        }
    }
}

/// Reads a checkpoint: `(model_state, optimizer_state, iteration, metadata)`. Also
/// reads the training loop's checkpoints (iteration = their `step`).
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn load<'py>(
    py: Python<'py>,
    path_or_binary_file: &Bound<'py, PyAny>,
) -> PyResult<(
    Bound<'py, PyDict>,
    Bound<'py, PyDict>,
    u64,
    BTreeMap<String, String>,
)> {
    let (tensors, mut meta) = match Target::new(path_or_binary_file, "read")? {
        Target::Path(path) => detached(py, || load_safetensors(&path).map_err(model_error))?,
        Target::File(file) => {
            let bytes: Vec<u8> = file.call_method0("read")?.extract()?;
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("checkpoint.safetensors");
            std::fs::write(&path, bytes)?;
            detached(py, || load_safetensors(&path).map_err(model_error))?
        }
    };
    let iteration = ["iteration", "step"]
        .iter()
        .find_map(|k| meta.get(*k).and_then(|v| v.trim().parse::<u64>().ok()))
        .ok_or_else(|| invalid("not a checkpoint: no 'iteration' (or 'step') metadata entry"))?;
    meta.remove(ITERATION);
    let (model, optim) = (PyDict::new(py), PyDict::new(py));
    for (name, (shape, values)) in tensors {
        match name.strip_prefix(OPTIM) {
            Some(base) => optim.set_item(base, output(py, &shape, values))?,
            None => model.set_item(name, output(py, &shape, values))?,
        }
    }
    Ok((model, optim, iteration, meta))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let checkpoint = PyModule::new(m.py(), "checkpoint")?;
    checkpoint.add_function(wrap_pyfunction!(save, &checkpoint)?)?;
    checkpoint.add_function(wrap_pyfunction!(load, &checkpoint)?)?;
    m.add_submodule(&checkpoint)
}
