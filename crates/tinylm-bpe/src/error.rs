use std::path::PathBuf;

/// An I/O failure on `path`, in the tokenizer's errors and the model crate's.
/// (`err` is shown in the message, not chained as a `source`, so that error reports
/// print it once.)
#[derive(Debug, thiserror::Error)]
#[error("{}: {err}", path.display())]
pub struct FileError {
    pub path: PathBuf,
    pub err: std::io::Error,
}

impl FileError {
    pub fn new(path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        let path = path.into();
        FileError { path, err }
    }
}

/// Every failure of the tokenizer crate. Messages name the file, position or value at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(FileError),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        Error::Io(FileError::new(path, err))
    }
}

/// `Err(Error::Invalid(format!(...)))` in one line.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::Error::Invalid(format!($($arg)*)) };
}
