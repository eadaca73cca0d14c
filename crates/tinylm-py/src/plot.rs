//! `tinylm.plot`: many runs' losses on one figure, as `tinylm plot` draws them
//! ([`tinylm::plot`]).

use crate::errors::{detached, invalid, model_error};
use pyo3::prelude::*;
use std::path::PathBuf;
use tinylm::compare::{find_runs, write_comparison, CompareOptions, XAxis};

/// Draws the runs of `runs` (a run or sweep directory, or a list of them) to `out`
/// (`.svg` or `.png`) against `x` (`step`, `tokens` or `wall`); returns `out`.
#[pyfunction]
#[pyo3(
    signature = (runs, out=PathBuf::from("loss.png"), x="step", log_x=false, log_y=false, title=None),
    text_signature = "(runs, out='loss.png', x='step', log_x=False, log_y=False, title=None)"
)]
pub fn plot(
    py: Python<'_>,
    runs: &Bound<'_, PyAny>,
    out: PathBuf,
    x: &str,
    log_x: bool,
    log_y: bool,
    title: Option<String>,
) -> PyResult<PathBuf> {
    let dirs: Vec<PathBuf> = match runs.extract::<PathBuf>() {
        Ok(dir) => vec![dir],
        Err(_) => runs.extract()?,
    };
    let options = CompareOptions {
        x: x.parse::<XAxis>().map_err(invalid)?,
        log_x,
        log_y,
        title,
    };
    detached(py, || {
        let runs = find_runs(&dirs).map_err(model_error)?;
        write_comparison(&out, &runs, &options).map_err(model_error)?;
        Ok(out)
    })
}
