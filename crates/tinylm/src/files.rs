//! Files written whole or not at all: into `<path>.tmp`, synced, then renamed over
//! `path`, so that a crash never leaves a torn file and a failure leaves no
//! temporary one.

use crate::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

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

/// Writes the file `path` with `write`, which fills a buffered `<path>.tmp`; the
/// file is then flushed, synced and renamed over `path`. A failure of `write` or of
/// the file is the error (an I/O one names `path`), and the temporary file is
/// removed.
pub fn write_file<E: WriteFailure>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::result::Result<(), E>,
) -> Result<()> {
    let tmp = temp_path(path);
    let written = File::create(&tmp).map_err(|e| e.at(path)).and_then(|file| {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        write(&mut out).map_err(|e| e.at(path))?;
        let file = out.into_inner().map_err(|e| e.into_error().at(path))?;
        file.sync_all().map_err(|e| e.at(path))?;
        std::fs::rename(&tmp, path).map_err(|e| e.at(path))
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// [`write_file`] of `bytes`.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file(path, |out| out.write_all(bytes))
}

/// Creates the directory `out` with the files `fill` writes: they go into the
/// directory `<out>.tmp`, renamed to `out` once complete, so a failure leaves
/// nothing behind. `out` must not exist or be an empty directory.
pub fn write_dir(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if out.is_file() || std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_some()) {
        return Err(Error::Invalid(format!(
            "{}: already exists and is not empty; refusing to overwrite it",
            out.display()
        )));
    }
    let tmp = temp_path(out);
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(out, e))?;
    let done = fill(&tmp).and_then(|()| {
        if out.exists() {
            std::fs::remove_dir(out).map_err(|e| Error::io(out, e))?;
        }
        std::fs::rename(&tmp, out).map_err(|e| Error::io(out, e))
    });
    if done.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    done
}

/// `<path>.tmp`.
fn temp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    tmp.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_or_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        write_bytes(&path, b"first").unwrap();
        let err = write_file(&path, |out| {
            out.write_all(b"half").unwrap();
            Err(Error::Device("the GPU is gone".into()))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "the GPU is gone");
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        let err = write_file(&path, |_| Err(std::io::Error::other("disk full"))).unwrap_err();
        assert_eq!(err.to_string(), format!("{}: disk full", path.display()));
        write_bytes(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.txt"]);
    }
}
