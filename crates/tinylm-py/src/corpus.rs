//! `tinylm.tinystories()`: the TinyStories sample inside tinylm, as text.

use pyo3::prelude::*;

/// The TinyStories sample inside tinylm (5,808 stories, 4.9 MB, CDLA-Sharing-1.0),
/// each story followed by a line `<|endoftext|>`.
#[pyfunction]
pub fn tinystories() -> String {
    tinylm_corpus::tinystories()
}
