//! Rust errors and panics as Python exceptions.
//!
//! - a missing file: `FileNotFoundError`; other I/O failures: `OSError`;
//! - bad input (shapes, values, file contents, configurations): `ValueError`;
//! - a panic (a bug, never expected): `RuntimeError` with the panic's message, never
//!   an abort of the interpreter.

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::{PyErr, PyResult, Python};
use std::panic::{catch_unwind, AssertUnwindSafe};
use tinylm::kernels::cpu::on_pool;

/// The exception for an I/O failure, with `message` (which names the file).
fn io_error(kind: std::io::ErrorKind, message: String) -> PyErr {
    match kind {
        std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
        _ => PyOSError::new_err(message),
    }
}

pub fn bpe_error(e: tinylm_bpe::Error) -> PyErr {
    match &e {
        tinylm_bpe::Error::Io(io) => io_error(io.err.kind(), e.to_string()),
        tinylm_bpe::Error::Invalid(_) => PyValueError::new_err(e.to_string()),
    }
}

pub fn model_error(e: tinylm::Error) -> PyErr {
    match e {
        tinylm::Error::Io(ref io) => io_error(io.err.kind(), e.to_string()),
        tinylm::Error::Tokenizer(e) => bpe_error(e),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// `ValueError(message)`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// Runs `f` without the GIL on rayon's pool (`on_pool`), turning a panic into
/// `RuntimeError`.
pub fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> PyResult<T> + Send) -> PyResult<T> {
    py.detach(|| on_pool(|| guarded(f)))
}

/// Runs `f` (with the GIL held), turning a panic into `RuntimeError`.
pub fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        Err(PyRuntimeError::new_err(format!(
            "internal error in tinylm (please report): {message}"
        )))
    })
}
