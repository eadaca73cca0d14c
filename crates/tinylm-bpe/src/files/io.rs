//! Reading and writing tokenizer files: UTF-8 text in, whole files out.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::{invalid, Error, Result};

/// Writes `contents` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.tmp{}", std::process::id()));
    let written = fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(contents)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    Ok(())
}

/// The UTF-8 text of the file `path`.
pub(crate) fn read(path: &Path) -> Result<String> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    String::from_utf8(bytes).map_err(|e| {
        invalid!(
            "{}: invalid UTF-8 at byte offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}
