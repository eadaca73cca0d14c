//! Files written whole or not at all ([`tinylm_bpe::atomic`]: a temporary file in
//! the target's directory, synced, then renamed over it), with the model crate's
//! errors: checkpoints, exports, run files, plots.

use crate::{Error, Result};
use std::io::Write;
use std::path::Path;
pub use tinylm_bpe::atomic::{write_dir, AtomicFile};

/// What a writer fails with: an I/O error (named by the file being written) or
/// one of the crate's own (a GPU's tensor that could not be fetched).
pub trait WriteFailure {
    /// The error, naming `path` where it does not name anything yet.
    fn at(self, path: &Path) -> Error;
}

impl WriteFailure for std::io::Error {
    fn at(self, path: &Path) -> Error {
        Error::io(path, self)
    }
}

impl WriteFailure for Error {
    fn at(self, _: &Path) -> Error {
        self
    }
}

/// Writes the file `path` with `write`, which fills its (buffered) temporary file;
/// the file is then committed. A failure of `write` or of the file is the error (an
/// I/O one names `path`), and nothing is left behind.
pub fn write_file<E: WriteFailure>(
    path: &Path,
    write: impl FnOnce(&mut AtomicFile) -> std::result::Result<(), E>,
) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    write(&mut file).map_err(|e| e.at(path))?;
    Ok(file.commit()?)
}

/// [`write_file`] of `bytes`.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file(path, |out| out.write_all(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_names_the_file_or_keeps_its_own_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        write_bytes(&path, b"first").unwrap();
        let err = write_file(&path, |out| {
            out.write_all(b"half").unwrap();
            Err(Error::Device("the GPU is gone".into()))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "the GPU is gone");
        let err = write_file(&path, |_| Err(std::io::Error::other("disk full"))).unwrap_err();
        assert_eq!(err.to_string(), format!("{}: disk full", path.display()));
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }
}
