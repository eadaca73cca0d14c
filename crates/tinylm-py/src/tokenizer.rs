//! `tinylm.train_bpe` and `tinylm.Tokenizer` over `tinylm_bpe`.

use crate::errors::{bpe_error, detached, invalid};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyIterator, PyList, PyTuple};
use std::path::PathBuf;
use std::sync::Arc;
use tinylm_bpe::encode::{StreamEncoder, Tokenizer as RustTokenizer};
use tinylm_bpe::files::{tiktoken, Bpe};
use tinylm_bpe::pretokenize::Pattern;
use tinylm_bpe::train::{train_bpe_files, train_from_texts, TrainOptions};
use tinylm_bpe::{Merges, Vocab};

/// Text pulled from a Python iterator per batch of `train_from_iterator`.
const TRAIN_BATCH_BYTES: usize = 8 << 20;

/// A split pattern from Python: a name (`gpt2`, `gpt4`, `o200k`) or a regex.
fn pattern(spec: &str) -> PyResult<Pattern> {
    Pattern::parse(spec).map_err(bpe_error)
}

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

/// The pre-tokens of `text` under `pattern` (no special-token handling).
#[pyfunction]
#[pyo3(signature = (text, pattern = "gpt2"))]
pub fn pretokenize(py: Python<'_>, text: &str, pattern: &str) -> PyResult<Vec<String>> {
    let pattern = self::pattern(pattern)?;
    detached(py, || {
        Ok(pattern.pretokens(text).map(str::to_string).collect())
    })
}

/// Trains a byte-level BPE tokenizer on the text file `input_path` (CS336 semantics).
#[pyfunction]
#[pyo3(signature = (input_path, vocab_size, special_tokens = None, pattern = "gpt2"))]
pub fn train_bpe<'py>(
    py: Python<'py>,
    input_path: PathBuf,
    vocab_size: usize,
    special_tokens: Option<Vec<String>>,
    pattern: &str,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyList>)> {
    let specials = special_tokens.unwrap_or_default();
    let pattern = self::pattern(pattern)?;
    let options = TrainOptions {
        pattern: &pattern,
        ..TrainOptions::default()
    };
    let (vocab, merges) = detached(py, || {
        train_bpe_files(&[&input_path], vocab_size, &specials, options).map_err(bpe_error)
    })?;
    Ok((vocab_to_dict(py, &vocab)?, merges_to_list(py, &merges)?))
}

/// A byte-level BPE tokenizer: `encode`, `encode_batch`, `encode_iterable`, `decode`,
/// training, and the tokenizer file formats.
#[pyclass(module = "tinylm", frozen)]
pub struct Tokenizer {
    inner: Arc<RustTokenizer>,
    merges: Arc<Merges>,
}

impl Tokenizer {
    fn build(
        vocab: Vocab,
        merges: Merges,
        special_tokens: &[String],
        pattern: Pattern,
    ) -> tinylm_bpe::Result<Self> {
        let inner = RustTokenizer::new(vocab, &merges, special_tokens)?.with_pattern(pattern);
        Ok(Tokenizer {
            inner: Arc::new(inner),
            merges: Arc::new(merges),
        })
    }

    fn from_bpe(bpe: Bpe) -> PyResult<Self> {
        let specials = bpe.special_tokens();
        Tokenizer::build(bpe.vocab, bpe.merges, &specials, bpe.pattern).map_err(bpe_error)
    }

    /// The tokenizer's definition, as its files hold it.
    fn definition(&self) -> Bpe {
        let vocab = self.inner.vocab();
        let specials = self
            .inner
            .special_tokens()
            .iter()
            .filter_map(|s| vocab.iter().position(|t| t == s.as_bytes()))
            .map(|id| id as u32)
            .collect();
        Bpe {
            vocab: vocab.clone(),
            merges: self.merges.as_ref().clone(),
            specials,
            pattern: self.inner.pattern().clone(),
        }
    }
}

#[pymethods]
impl Tokenizer {
    #[new]
    #[pyo3(signature = (vocab, merges, special_tokens = None, pattern = "gpt2"))]
    fn new(
        vocab: &Bound<'_, PyDict>,
        merges: Vec<(Vec<u8>, Vec<u8>)>,
        special_tokens: Option<Vec<String>>,
        pattern: &str,
    ) -> PyResult<Self> {
        let vocab = vocab_from_dict(vocab)?;
        let specials = special_tokens.unwrap_or_default();
        Tokenizer::build(vocab, merges, &specials, self::pattern(pattern)?).map_err(bpe_error)
    }

    /// Reads a GPT-2 style `vocab.json` and `merges.txt`.
    #[classmethod]
    #[pyo3(signature = (vocab_filepath, merges_filepath, special_tokens = None, pattern = "gpt2"))]
    fn from_files(
        _cls: &Bound<'_, pyo3::types::PyType>,
        vocab_filepath: PathBuf,
        merges_filepath: PathBuf,
        special_tokens: Option<Vec<String>>,
        pattern: &str,
    ) -> PyResult<Self> {
        let vocab = tinylm_bpe::files::load_vocab(&vocab_filepath).map_err(bpe_error)?;
        let merges = tinylm_bpe::files::load_merges(&merges_filepath).map_err(bpe_error)?;
        let specials = special_tokens.unwrap_or_default();
        // An inconsistency between the two files names both, as the CLI's error does.
        let pattern = self::pattern(pattern)?;
        Tokenizer::build(vocab, merges, &specials, pattern).map_err(|e| {
            let files = format!(
                "{} and {}",
                vocab_filepath.display(),
                merges_filepath.display()
            );
            bpe_error(match e {
                tinylm_bpe::Error::Invalid(msg) => {
                    tinylm_bpe::Error::Invalid(format!("{files}: {msg}"))
                }
                other => other,
            })
        })
    }

    /// Reads a tokenizer directory (`tinylm bpe train`'s): `tokenizer.json` when it has
    /// one (with its split pattern), else `vocab.json` and `merges.txt` (GPT-2's).
    #[classmethod]
    fn load(_cls: &Bound<'_, pyo3::types::PyType>, py: Python<'_>, dir: PathBuf) -> PyResult<Self> {
        let bpe = detached(py, || Bpe::load(&dir).map_err(bpe_error))?;
        Tokenizer::from_bpe(bpe)
    }

    /// Reads a Hugging Face `tokenizer.json` (byte-level BPE).
    #[classmethod]
    fn from_tokenizer_json(
        _cls: &Bound<'_, pyo3::types::PyType>,
        py: Python<'_>,
        path: PathBuf,
    ) -> PyResult<Self> {
        let bpe = detached(py, || tinylm_bpe::files::hf::load(&path).map_err(bpe_error))?;
        Tokenizer::from_bpe(bpe)
    }

    /// Reads a tiktoken rank file (`base64 rank` per line) with the split pattern it was
    /// made for; `special_tokens` maps each special token to its id (a list gives them
    /// the ids after the last rank).
    #[classmethod]
    #[pyo3(signature = (path, pattern, special_tokens = None))]
    fn from_tiktoken(
        _cls: &Bound<'_, pyo3::types::PyType>,
        py: Python<'_>,
        path: PathBuf,
        pattern: &str,
        special_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let specials: Vec<(String, Option<u32>)> = match special_tokens {
            None => Vec::new(),
            Some(s) if s.is_instance_of::<PyDict>() => s
                .extract::<std::collections::BTreeMap<String, u32>>()?
                .into_iter()
                .map(|(name, id)| (name, Some(id)))
                .collect(),
            Some(s) => s
                .extract::<Vec<String>>()?
                .into_iter()
                .map(|name| (name, None))
                .collect(),
        };
        let pattern = self::pattern(pattern)?;
        let bpe = detached(py, || {
            tiktoken::load(&path, pattern, &specials).map_err(bpe_error)
        })?;
        Tokenizer::from_bpe(bpe)
    }

    /// Trains on the text files `files` (each a document of its own), CS336 semantics.
    #[classmethod]
    #[pyo3(signature = (files, vocab_size, special_tokens = None, pattern = "gpt2"))]
    fn train(
        _cls: &Bound<'_, pyo3::types::PyType>,
        py: Python<'_>,
        files: Vec<PathBuf>,
        vocab_size: usize,
        special_tokens: Option<Vec<String>>,
        pattern: &str,
    ) -> PyResult<Self> {
        trained(py, special_tokens, pattern, |specials, options| {
            train_bpe_files(&files, vocab_size, specials, options)
        })
    }

    /// Trains on the strings of `iterator` (each a document of its own, e.g. a
    /// dataset's texts), pulled in batches of about 8 MB and counted in parallel:
    /// memory follows the unique pre-tokens, not the text.
    #[classmethod]
    #[pyo3(signature = (iterator, vocab_size, special_tokens = None, pattern = "gpt2"))]
    fn train_from_iterator(
        _cls: &Bound<'_, pyo3::types::PyType>,
        py: Python<'_>,
        iterator: &Bound<'_, PyAny>,
        vocab_size: usize,
        special_tokens: Option<Vec<String>>,
        pattern: &str,
    ) -> PyResult<Self> {
        let texts = iterator.try_iter()?.unbind();
        // The texts are pulled with the GIL taken back for each one; a Python error
        // ends the iteration and is raised after.
        let failure: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);
        let pulled = std::iter::from_fn(|| {
            Python::attach(|py| match texts.bind(py).clone().next()? {
                Ok(item) => match item.extract::<String>() {
                    Ok(text) => Some(text),
                    Err(_) => {
                        let kind = item.get_type().name().map_or("?".into(), |n| n.to_string());
                        *failure.lock().expect("no panics") = Some(invalid(format!(
                            "train_from_iterator expects strings, got {kind}"
                        )));
                        None
                    }
                },
                Err(e) => {
                    *failure.lock().expect("no panics") = Some(e);
                    None
                }
            })
        });
        let tokenizer = trained(py, special_tokens, pattern, |specials, options| {
            train_from_texts(pulled, vocab_size, specials, options, TRAIN_BATCH_BYTES)
        });
        match failure.into_inner().expect("no panics") {
            Some(e) => Err(e),
            None => tokenizer,
        }
    }

    /// Writes `vocab.json`, `merges.txt` and `tokenizer.json` into `dir`.
    fn save(&self, py: Python<'_>, dir: PathBuf) -> PyResult<()> {
        let bpe = self.definition();
        detached(py, || bpe.save(&dir).map_err(bpe_error))
    }

    /// Writes the Hugging Face `tokenizer.json` to `path`.
    fn to_tokenizer_json(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let bpe = self.definition();
        detached(py, || {
            tinylm_bpe::files::hf::save(&path, &bpe).map_err(bpe_error)
        })
    }

    /// Writes the tiktoken rank file `path` and returns the `tiktoken.Encoding` built
    /// from it (same ids, split pattern and special tokens).
    #[pyo3(signature = (path, name = "tinylm"))]
    fn to_tiktoken<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        name: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let bpe = self.definition();
        detached(py, || tiktoken::save(&path, &bpe).map_err(bpe_error))?;
        // The ranks are handed over directly: tiktoken's own loader caches files by
        // their path, so a rewritten file would come back stale.
        let tiktoken = py.import("tiktoken")?;
        let ranks = PyDict::new(py);
        let specials = PyDict::new(py);
        for (id, token) in bpe.vocab.iter().enumerate() {
            if bpe.is_special(id as u32) {
                specials.set_item(String::from_utf8_lossy(token), id)?;
            } else if !token.is_empty() {
                ranks.set_item(PyBytes::new(py, token), id)?;
            }
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("name", name)?;
        kwargs.set_item("pat_str", bpe.pattern.regex())?;
        kwargs.set_item("mergeable_ranks", ranks)?;
        kwargs.set_item("special_tokens", specials)?;
        tiktoken.getattr("Encoding")?.call((), Some(&kwargs))
    }

    /// The split pattern's name (`gpt2`, `gpt4`, `o200k`, or `custom`).
    #[getter]
    fn pattern(&self) -> &'static str {
        self.inner.pattern().name()
    }

    /// The split pattern's regex (tiktoken's `pat_str`).
    #[getter]
    fn pattern_regex(&self) -> String {
        self.inner.pattern().regex().to_string()
    }

    /// The special tokens.
    #[getter]
    fn special_tokens(&self) -> Vec<String> {
        self.inner.special_tokens().to_vec()
    }

    /// The merges `[(left, right), ...]` in rank order.
    #[getter]
    fn merges<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        merges_to_list(py, &self.merges)
    }

    /// The ids of each text of `texts`, encoded in parallel on `num_threads` threads
    /// (default: all cores), without the GIL.
    #[pyo3(signature = (texts, num_threads = None))]
    fn encode_batch(
        &self,
        py: Python<'_>,
        texts: Vec<String>,
        num_threads: Option<usize>,
    ) -> PyResult<Vec<Vec<u32>>> {
        let encode = || self.inner.encode_batch(&texts);
        detached(py, || match num_threads {
            None => Ok(encode()),
            Some(0) => Err(invalid("num_threads must be at least 1")),
            Some(n) => rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| invalid(format!("cannot start {n} threads: {e}")))
                .map(|pool| pool.install(encode)),
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
        format!(
            "Tokenizer(vocab_size={}, pattern={:?})",
            self.inner.vocab_size(),
            self.inner.pattern().name()
        )
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

/// A tokenizer that `train` makes (with the GIL released) from `special_tokens`
/// and the options of the split pattern named `pattern`.
fn trained(
    py: Python<'_>,
    special_tokens: Option<Vec<String>>,
    pattern: &str,
    train: impl FnOnce(&[String], TrainOptions) -> tinylm_bpe::Result<(Vocab, Merges)> + Send,
) -> PyResult<Tokenizer> {
    let specials = special_tokens.unwrap_or_default();
    let pattern = self::pattern(pattern)?;
    let options = TrainOptions {
        pattern: &pattern,
        ..TrainOptions::default()
    };
    let (vocab, merges) = detached(py, || train(&specials, options).map_err(bpe_error))?;
    Tokenizer::build(vocab, merges, &specials, pattern).map_err(bpe_error)
}
