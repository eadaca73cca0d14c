//! Files and directories written whole or not at all, the one way every crate of
//! tinylm writes its outputs: the contents go to a temporary file in the target's
//! directory ([`tempfile::NamedTempFile`], removed if anything fails or the writer is
//! dropped), which is then flushed, synced to disk and renamed over the target
//! ([`NamedTempFile::persist`]). A crash or an error never leaves a torn file, and
//! concurrent writers of one target never see each other's half-written files.

use crate::{invalid, Error, Result};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use tempfile::NamedTempFile;

/// A file being written to its temporary name; [`AtomicFile::commit`] puts it at
/// the target, dropping it uncommitted removes it.
pub struct AtomicFile {
    target: PathBuf,
    out: BufWriter<NamedTempFile>,
}

impl AtomicFile {
    /// A temporary file beside `path` (buffered), with the permissions a new file
    /// gets from `File::create`.
    pub fn create(path: &Path) -> Result<Self> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let mut builder = tempfile::Builder::new();
        builder.prefix(".tinylm-").suffix(".tmp");
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let file = builder.tempfile_in(dir).map_err(|e| Error::io(path, e))?;
        Ok(AtomicFile {
            target: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
        })
    }

    /// The file it will become.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Flushes the file, syncs it to disk and renames it over the target.
    pub fn commit(self) -> Result<()> {
        let io = |e| Error::io(&self.target, e);
        let file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.as_file().sync_all().map_err(io)?;
        file.persist(&self.target).map_err(|e| io(e.error))?;
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.out.write_all(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.out.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl Seek for AtomicFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.out.seek(pos)
    }
}

/// Writes `bytes` to `path`, whole or not at all.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes).map_err(|e| Error::io(path, e))?;
    file.commit()
}

/// Creates the directory `out` with the files `fill` writes into the directory it
/// is given: a temporary one beside `out`, renamed to `out` once complete and
/// removed on failure, so a failure leaves nothing behind. `out` must not exist or
/// be an empty directory.
pub fn write_dir<E: From<Error>>(
    out: &Path,
    fill: impl FnOnce(&Path) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    if out.is_file() || std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_some()) {
        return Err(invalid!(
            "{}: already exists and is not empty; refusing to overwrite it",
            out.display()
        )
        .into());
    }
    let io = |e| Error::io(out, e);
    let parent = match out.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent).map_err(io)?;
    let tmp = tempfile::Builder::new()
        .prefix(".tinylm-")
        .suffix(".tmp")
        .tempdir_in(parent)
        .map_err(io)?;
    fill(tmp.path())?;
    if out.exists() {
        std::fs::remove_dir(out).map_err(io)?;
    }
    let tmp = tmp.keep();
    std::fs::rename(&tmp, out).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp);
        io(e).into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_is_replaced_whole_or_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        write_bytes(&path, b"first").unwrap();
        let mut half = AtomicFile::create(&path).unwrap();
        half.write_all(b"half").unwrap();
        drop(half);
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        write_bytes(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(names(dir.path()), ["a.txt"]);
        let err = write_bytes(&dir.path().join("no/such/dir/b.txt"), b"x").unwrap_err();
        assert!(err.to_string().contains("no/such/dir/b.txt"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_file_gets_the_permissions_of_a_new_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (ours, plain) = (dir.path().join("ours"), dir.path().join("plain"));
        write_bytes(&ours, b"x").unwrap();
        std::fs::write(&plain, b"x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(&ours), mode(&plain));
    }

    #[test]
    fn a_directory_appears_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let failed: Result<()> = write_dir(&out, |tmp| {
            write_bytes(&tmp.join("one"), b"1")?;
            Err(invalid!("the second file failed"))
        });
        assert_eq!(failed.unwrap_err().to_string(), "the second file failed");
        assert!(names(dir.path()).is_empty());
        write_dir(&out, |tmp| write_bytes(&tmp.join("one"), b"1")).unwrap();
        assert_eq!(names(&out), ["one"]);
        let again: Result<()> = write_dir(&out, |_| Ok(()));
        assert!(again.unwrap_err().to_string().contains("not empty"));
    }
}
