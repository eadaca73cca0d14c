//! `tinylm.data.get_batch`: random windows of a 1-D token array with the training
//! loop's documented generator (`tinylm::data::SplitMix64`).

use crate::errors::invalid;
use numpy::ndarray::Array2;
use numpy::prelude::*;
use numpy::{PyArray2, PyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;
use std::hash::{BuildHasher, RandomState};
use tinylm::data::SplitMix64;

/// A seed from the OS's randomness (for `seed=None`).
pub fn random_seed() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// `B` windows of the 1-D integer `dataset` at starts `s ∈ [0, n − T)`, drawn one
/// after another with `SplitMix64(seed).below(n − T)`: `x = dataset[s : s+T]`,
/// `y = dataset[s+1 : s+T+1]`, both int64 `(B, T)`. Memory-mapped arrays are read
/// in place.
#[pyfunction]
#[pyo3(signature = (dataset, batch_size, context_length, seed = None))]
#[allow(clippy::type_complexity)]
pub fn get_batch<'py>(
    py: Python<'py>,
    dataset: &Bound<'py, PyAny>,
    batch_size: usize,
    context_length: usize,
    seed: Option<u64>,
) -> PyResult<(Bound<'py, PyArray2<i64>>, Bound<'py, PyArray2<i64>>)> {
    let np = PyModule::import(py, "numpy")?;
    let array = np.getattr("asarray")?.call1((dataset,))?;
    let array = array.cast::<PyUntypedArray>()?;
    if array.ndim() != 1 || !matches!(array.dtype().kind(), b'i' | b'u') {
        return Err(invalid(format!(
            "dataset: expected a 1-D integer array of token ids, got shape {:?} and dtype {}",
            array.shape(),
            array.dtype()
        )));
    }
    let n = array.len();
    if context_length == 0 || n <= context_length {
        return Err(invalid(format!(
            "dataset of {n} tokens is too short for context_length {context_length} (need at least {})",
            context_length.saturating_add(1)
        )));
    }
    let ids = batch_size
        .checked_mul(context_length)
        .filter(|&ids| ids <= isize::MAX as usize / 16)
        .ok_or_else(|| {
            invalid(format!(
                "batch_size {batch_size} x context_length {context_length} is too large"
            ))
        })?;
    let mut rng = SplitMix64::new(seed.unwrap_or_else(random_seed));
    let starts: Vec<usize> = (0..batch_size)
        .map(|_| rng.below((n - context_length) as u64) as usize)
        .collect();
    // Read the windows through a typed view without converting the whole array.
    let window = |s: usize, k: usize| -> PyResult<Vec<i64>> {
        let slice = array.call_method1(
            "__getitem__",
            (pyo3::types::PySlice::new(
                py,
                (s + k) as isize,
                (s + k + context_length) as isize,
                1,
            ),),
        )?;
        let slice = slice.call_method1("astype", ("int64",))?;
        let typed = slice.cast::<PyArrayDyn<i64>>()?.readonly();
        Ok(typed.as_array().iter().copied().collect())
    };
    let (mut x, mut y) = (Vec::with_capacity(ids), Vec::new());
    for &s in &starts {
        x.extend(window(s, 0)?);
        y.extend(window(s, 1)?);
    }
    let shape = (batch_size, context_length);
    Ok((
        Array2::from_shape_vec(shape, x)
            .expect("B·T ids")
            .into_pyarray(py),
        Array2::from_shape_vec(shape, y)
            .expect("B·T ids")
            .into_pyarray(py),
    ))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let data = PyModule::new(m.py(), "data")?;
    data.add_function(wrap_pyfunction!(get_batch, &data)?)?;
    m.add_submodule(&data)
}
