//! NumPy arrays in and out.
//!
//! - [`Floats`]: any array-like of any real dtype and layout, read as `f32` in
//!   row-major order (borrowed when it already is float32 and C-contiguous).
//! - [`InPlace`]: a float32 C-contiguous writeable array, modified where it lies.
//! - [`token_ids`]: an integer array of ids, checked against the vocabulary.
//! - [`output`]: a new float32 array of a given shape.

use crate::errors::invalid;
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::prelude::*;
use numpy::{AllowTypeChange, PyArrayDyn, PyArrayLikeDyn, PyReadwriteArrayDyn};
use pyo3::prelude::*;

/// A float array read as `f32`, row-major: `shape` and `data`.
pub struct Floats<'py> {
    pub shape: Vec<usize>,
    array: PyArrayLikeDyn<'py, f32, AllowTypeChange>,
    copy: Option<Vec<f32>>,
}

impl<'py> Floats<'py> {
    /// Reads `x` (named `name` in errors): a NumPy array or anything `np.asarray`
    /// takes, of a real dtype.
    pub fn new(x: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        if let Ok(array) = x.cast::<numpy::PyUntypedArray>() {
            let kind = array.dtype().kind();
            if !matches!(kind, b'f' | b'i' | b'u' | b'b') {
                return Err(invalid(format!(
                    "{name}: expected a real-valued array, got dtype {}",
                    array.dtype()
                )));
            }
        }
        let array: PyArrayLikeDyn<'py, f32, AllowTypeChange> = x
            .extract()
            .map_err(|e| invalid(format!("{name}: not a numeric array: {e}")))?;
        let shape = array.shape().to_vec();
        let copy = if array.is_c_contiguous() {
            None
        } else {
            Some(array.as_array().iter().copied().collect())
        };
        Ok(Floats { shape, array, copy })
    }

    /// The values in row-major order.
    pub fn data(&self) -> &[f32] {
        match &self.copy {
            Some(v) => v,
            None => self.array.as_slice().expect("checked C-contiguous"),
        }
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The size of the last axis (1 for a 0-d array).
    pub fn last(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows of the last axis: the product of the leading dims.
    pub fn rows(&self) -> usize {
        self.shape[..self.ndim().saturating_sub(1)].iter().product()
    }

    /// Checks the number of dimensions: at least `min` (`exact` for an exact count).
    pub fn expect_ndim(&self, name: &str, min: usize, exact: bool) -> PyResult<()> {
        let ok = if exact {
            self.ndim() == min
        } else {
            self.ndim() >= min
        };
        if ok {
            return Ok(());
        }
        Err(invalid(format!(
            "{name}: expected {}{min} dimensions, got shape {:?}",
            if exact { "" } else { "at least " },
            self.shape
        )))
    }

    /// The shape, checked to have `N` dimensions.
    pub fn dims<const N: usize>(&self, name: &str) -> PyResult<[usize; N]> {
        self.expect_ndim(name, N, true)?;
        Ok(self.shape[..].try_into().expect("checked N dimensions"))
    }

    /// Checks the shape is `expected`.
    pub fn expect_shape(&self, name: &str, expected: &[usize]) -> PyResult<()> {
        if self.shape != expected {
            return Err(invalid(format!(
                "{name}: expected shape {expected:?}, got {:?}",
                self.shape
            )));
        }
        Ok(())
    }
}

/// A float32 C-contiguous writeable array, modified in place.
pub struct InPlace<'py> {
    pub shape: Vec<usize>,
    array: PyReadwriteArrayDyn<'py, f32>,
}

impl<'py> InPlace<'py> {
    pub fn new(x: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        let array = x.cast::<PyArrayDyn<f32>>().map_err(|_| {
            let what = x
                .getattr("dtype")
                .map_or_else(|_| x.get_type().to_string(), |d| format!("dtype {d}"));
            invalid(format!(
                "{name}: expected a float32 NumPy array (modified in place), got {what}"
            ))
        })?;
        if !array.is_c_contiguous() {
            return Err(invalid(format!(
                "{name}: the array is not C-contiguous; in-place updates need one (np.ascontiguousarray copies)"
            )));
        }
        let array = array.try_readwrite().map_err(|e| {
            invalid(format!(
                "{name}: cannot write to the array ({e}): it must be writeable and not shared with another argument"
            ))
        })?;
        Ok(InPlace {
            shape: array.shape().to_vec(),
            array,
        })
    }

    pub fn data(&mut self) -> &mut [f32] {
        self.array.as_slice_mut().expect("checked C-contiguous")
    }
}

/// Token ids from an integer array-like, each in `[0, vocab)`: shape and ids.
pub fn token_ids(
    x: &Bound<'_, PyAny>,
    name: &str,
    vocab: usize,
) -> PyResult<(Vec<usize>, Vec<u32>)> {
    let np = PyModule::import(x.py(), "numpy")?;
    let array = np.getattr("asarray")?.call1((x,))?;
    let array = array.cast::<numpy::PyUntypedArray>()?;
    if !matches!(array.dtype().kind(), b'i' | b'u') {
        return Err(invalid(format!(
            "{name}: expected an integer array of token ids, got dtype {}",
            array.dtype()
        )));
    }
    let ids: PyArrayLikeDyn<'_, i64, AllowTypeChange> = array.extract()?;
    let shape = ids.shape().to_vec();
    let ids = ids
        .as_array()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            if id < 0 || id as u64 >= vocab as u64 {
                Err(invalid(format!(
                    "{name}: id {id} at flat index {i} is outside [0, {vocab})"
                )))
            } else {
                Ok(id as u32)
            }
        })
        .collect::<PyResult<Vec<u32>>>()?;
    Ok((shape, ids))
}

/// A new float32 array of `shape` holding `data` (row-major).
pub fn output<'py>(
    py: Python<'py>,
    shape: &[usize],
    data: Vec<f32>,
) -> Bound<'py, PyArrayDyn<f32>> {
    ArrayD::from_shape_vec(IxDyn(shape), data)
        .expect("data matches the shape")
        .into_pyarray(py)
}
