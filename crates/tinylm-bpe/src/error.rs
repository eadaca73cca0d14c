use std::path::PathBuf;

/// Every failure of the tokenizer crate. Messages name the file, position or value at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure on `path`. (`err` is shown in the message, not chained as a
    /// `source`, so that error reports print it once.)
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            err: source,
        }
    }
}

/// `Err(Error::Invalid(format!(...)))` in one line.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::Error::Invalid(format!($($arg)*)) };
}
