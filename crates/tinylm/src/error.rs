use std::path::PathBuf;
use tinylm_bpe::FileError;

/// Every failure of the model crate. Messages name the file, position or value at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(FileError),
    /// An invalid model or training configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Bad input: shapes, token ids, file contents.
    #[error("{0}")]
    Invalid(String),
    /// Training diverged (the message names the step and what was not finite or
    /// too large).
    #[error("{0}")]
    Diverged(String),
    /// A compute device or its libraries failed or are missing (the message says
    /// which, and what to do).
    #[error("{0}")]
    Device(String),
    /// The ranks of a distributed run disagree, or their launcher or collective
    /// library failed (the message names the rank and what to do).
    #[error("{0}")]
    Ranks(String),
    #[error(transparent)]
    Tokenizer(#[from] tinylm_bpe::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        Error::Io(FileError::new(path, err))
    }
}
