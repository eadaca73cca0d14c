//! Reading tokenizer files: UTF-8 text in.

use std::fs;
use std::path::Path;

use crate::{invalid, Error, Result};

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
