//! `tinylm.train_bpe` and `tinylm.Tokenizer` over `tinylm_bpe`.

use crate::errors::{bpe_error, detached, invalid};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyIterator, PyList, PyTuple};
use std::path::PathBuf;
use std::sync::Arc;
use tinylm_bpe::encode::{StreamEncoder, Tokenizer as RustTokenizer};
use tinylm_bpe::{Merges, Vocab};

/// `{id: bytes}` of a dense vocabulary.
fn vocab_to_dict<'py>(py: Python<'py>, vocab: &Vocab) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (id, token) in vocab.iter().enumerate() {
        dict.set_item(id, PyBytes::new(py, token))?;
    }
    Ok(dict)
}

/// `[(left, right), ...]` of merges.
fn merges_to_list<'py>(py: Python<'py>, merges: &Merges) -> PyResult<Bound<'py, PyList>> {
    let pairs = merges.iter().map(|(l, r)| {
        PyTuple::new(py, [PyBytes::new(py, l), PyBytes::new(py, r)]).expect("two items")
    });
    PyList::new(py, pairs)
}

/// A dense vocabulary from `{id: bytes}`: the ids must be exactly `0..len`.
fn vocab_from_dict(vocab: &Bound<'_, PyDict>) -> PyResult<Vocab> {
    let mut dense: Vec<Option<Vec<u8>>> = vec![None; vocab.len()];
    for (id, token) in vocab.iter() {
        let id: usize = id
            .extract()
            .map_err(|_| invalid(format!("vocab key {id} is not a non-negative integer id")))?;
        let token: Vec<u8> = token
            .extract::<Vec<u8>>()
            .map_err(|_| invalid(format!("vocab[{id}] is not bytes")))?;
        let slot = dense.get_mut(id).ok_or_else(|| {
            invalid(format!(
                "vocab id {id} is out of range: the ids of a vocabulary of {} tokens must be 0..{}",
                vocab.len(),
                vocab.len()
            ))
        })?;
        *slot = Some(token);
    }
    Ok(dense
        .into_iter()
        .map(|t| t.expect("ids are distinct and below len"))
        .collect())
}

/// Trains a byte-level BPE tokenizer on the text file `input_path` (CS336 semantics).
#[pyfunction]
#[pyo3(signature = (input_path, vocab_size, special_tokens = None))]
pub fn train_bpe<'py>(
    py: Python<'py>,
    input_path: PathBuf,
    vocab_size: usize,
    special_tokens: Option<Vec<String>>,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyList>)> {
    let specials = special_tokens.unwrap_or_default();
    let (vocab, merges) = detached(py, || {
        tinylm_bpe::train::train_bpe(&input_path, vocab_size, &specials).map_err(bpe_error)
    })?;
    Ok((vocab_to_dict(py, &vocab)?, merges_to_list(py, &merges)?))
}

/// A byte-level BPE tokenizer (GPT-2 semantics): `encode`, `encode_iterable`, `decode`.
#[pyclass(module = "tinylm", frozen)]
pub struct Tokenizer {
    inner: Arc<RustTokenizer>,
}

#[pymethods]
impl Tokenizer {
    #[new]
    #[pyo3(signature = (vocab, merges, special_tokens = None))]
    fn new(
        vocab: &Bound<'_, PyDict>,
        merges: Vec<(Vec<u8>, Vec<u8>)>,
        special_tokens: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let vocab = vocab_from_dict(vocab)?;
        let inner = RustTokenizer::new(vocab, &merges, &special_tokens.unwrap_or_default())
            .map_err(bpe_error)?;
        Ok(Tokenizer {
            inner: Arc::new(inner),
        })
    }

    /// Reads a GPT-2 style `vocab.json` and `merges.txt`.
    #[classmethod]
    #[pyo3(signature = (vocab_filepath, merges_filepath, special_tokens = None))]
    fn from_files(
        _cls: &Bound<'_, pyo3::types::PyType>,
        vocab_filepath: PathBuf,
        merges_filepath: PathBuf,
        special_tokens: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let specials = special_tokens.unwrap_or_default();
        let inner = RustTokenizer::from_files(&vocab_filepath, &merges_filepath, &specials)
            .map_err(bpe_error)?;
        Ok(Tokenizer {
            inner: Arc::new(inner),
        })
    }

    /// Number of tokens, special tokens included.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// The vocabulary `{id: bytes}`, special tokens included.
    #[getter]
    fn vocab<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        vocab_to_dict(py, self.inner.vocab())
    }

    /// The token ids of `text`.
    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        detached(py, || Ok(self.inner.encode(text)))
    }

    /// The ids of the concatenation of the strings of `iterable`, lazily.
    fn encode_iterable(&self, iterable: &Bound<'_, PyAny>) -> PyResult<EncodeIterable> {
        let chunks = iterable.try_iter()?.unbind();
        Ok(EncodeIterable {
            stream: StreamEncoder::new(Arc::clone(&self.inner)),
            chunks: Some(chunks),
            ready: Vec::new(),
            next: 0,
        })
    }

    /// The text of `ids` (malformed UTF-8 becomes U+FFFD).
    fn decode(&self, ids: Vec<i64>) -> PyResult<String> {
        let ids = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                u32::try_from(id)
                    .map_err(|_| invalid(format!("token id {id} (position {i}) is out of range")))
            })
            .collect::<PyResult<Vec<u32>>>()?;
        self.inner.decode(&ids).map_err(bpe_error)
    }

    fn __repr__(&self) -> String {
        format!("Tokenizer(vocab_size={})", self.inner.vocab_size())
    }
}

/// The iterator of `Tokenizer.encode_iterable`: pulls one string at a time and yields
/// the ids that became final; memory does not grow with the input.
#[pyclass(module = "tinylm")]
pub struct EncodeIterable {
    stream: StreamEncoder<Arc<RustTokenizer>>,
    chunks: Option<Py<PyIterator>>,
    ready: Vec<u32>,
    next: usize,
}

#[pymethods]
impl EncodeIterable {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<u32>> {
        while self.next == self.ready.len() {
            let Some(chunks) = &self.chunks else {
                return Ok(None);
            };
            self.ready.clear();
            self.next = 0;
            match chunks.bind(py).clone().next() {
                Some(chunk) => {
                    let chunk = chunk?;
                    let text: &str = chunk.extract().map_err(|_| {
                        invalid(format!(
                            "encode_iterable expects strings, got {}",
                            chunk
                                .get_type()
                                .name()
                                .map_or("?".into(), |n| n.to_string())
                        ))
                    })?;
                    self.stream.push(text, &mut self.ready);
                }
                None => {
                    self.chunks = None;
                    self.stream.finish(&mut self.ready);
                }
            }
        }
        self.next += 1;
        Ok(Some(self.ready[self.next - 1]))
    }
}
