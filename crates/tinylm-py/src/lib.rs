//! The `tinylm._tinylm` extension module: the CS336 interfaces over the Rust core.
//! The Python package `tinylm` (under `python/tinylm/`) only re-exports these.
//!
//! Conventions: float inputs may have any real dtype and layout and are read as
//! float32; outputs are new float32 arrays; in-place functions take float32
//! C-contiguous arrays and modify them where they lie. Errors raise `ValueError`,
//! `FileNotFoundError` or `OSError` with the Rust message; long work runs without
//! the GIL; a panic raises `RuntimeError` instead of aborting.

mod arrays;
mod checkpoint;
mod corpus;
mod data;
mod errors;
mod model;
mod nn;
mod optim;
mod plot;
mod sweep;
mod tokenizer;
mod train;

use pyo3::prelude::*;
use pyo3::wrap_pymodule;

#[pymodule]
fn _tinylm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(tokenizer::train_bpe, m)?)?;
    m.add_function(wrap_pyfunction!(tokenizer::pretokenize, m)?)?;
    m.add_function(wrap_pyfunction!(corpus::tinystories, m)?)?;
    m.add_class::<tokenizer::Tokenizer>()?;
    m.add_class::<tokenizer::EncodeIterable>()?;
    m.add_class::<model::TransformerLM>()?;
    m.add_function(wrap_pyfunction!(model::preset_config, m)?)?;
    m.add_function(wrap_pyfunction!(train::train, m)?)?;
    m.add_function(wrap_pyfunction!(sweep::sweep, m)?)?;
    m.add_function(wrap_pyfunction!(plot::plot, m)?)?;
    m.add_wrapped(wrap_pymodule!(nn::module))?;
    optim::register(m)?;
    data::register(m)?;
    checkpoint::register(m)?;
    Ok(())
}
