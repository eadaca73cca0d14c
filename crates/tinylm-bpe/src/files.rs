//! GPT-2 tokenizer files: `vocab.json`, `merges.txt` and the byte-to-unicode table.
//!
//! Both files spell byte strings through GPT-2's [`bytes_to_unicode`] table, which maps
//! every byte to a printable character (space becomes `Ġ`, newline `Ċ`), so a token
//! never contains a space or a line break and `merges.txt` can be space-separated.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::{Deserializer, MapAccess, Visitor};

use crate::{invalid, Error, Merges, Result, Vocab};

/// GPT-2's table: byte `b` is spelled as the char `table[b]`.
///
/// Printable Latin-1 bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) map to themselves; the
/// remaining 68 bytes map, in byte order, to U+0100, U+0101, ...
pub fn bytes_to_unicode() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut table = ['\0'; 256];
    let mut next = 256;
    for (b, slot) in table.iter_mut().enumerate() {
        let b = b as u32;
        let code = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).expect("codes below 0x200 are chars");
    }
    table
}

/// The inverse table: a char of the GPT-2 alphabet → its byte.
fn unicode_to_bytes() -> rustc_hash::FxHashMap<char, u8> {
    bytes_to_unicode()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// `bytes` spelled through `table`.
fn spell(table: &[char; 256], bytes: &[u8]) -> String {
    bytes.iter().map(|&b| table[b as usize]).collect()
}

/// The bytes that `token` spells; `what` names the token's place for the error.
fn unspell(
    inverse: &rustc_hash::FxHashMap<char, u8>,
    token: &str,
    what: impl Fn() -> String,
) -> Result<Vec<u8>> {
    token
        .chars()
        .map(|c| {
            inverse.get(&c).copied().ok_or_else(|| {
                invalid!(
                    "{}: token {token:?} has the char {c:?} (U+{:04X}), which is not in GPT-2's byte-to-unicode table",
                    what(),
                    c as u32
                )
            })
        })
        .collect()
}

/// Writes `contents` to `path` through a temporary file in the same directory and a rename.
fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
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

fn read(path: &Path) -> Result<String> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    String::from_utf8(bytes).map_err(|e| {
        invalid!(
            "{}: invalid UTF-8 at byte offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// Writes `vocab` as GPT-2 `vocab.json`: `{"<spelled token>": id, ...}` in id order.
///
/// Tokens with equal bytes (two merges can build the same string) give repeated keys,
/// which [`load_vocab`] reads back as they were.
pub fn save_vocab(path: &Path, vocab: &Vocab) -> Result<()> {
    let table = bytes_to_unicode();
    let mut out = String::from("{");
    for (id, token) in vocab.iter().enumerate() {
        if id > 0 {
            out.push_str(", ");
        }
        let key = serde_json::to_string(&spell(&table, token)).expect("a string serializes");
        out.push_str(&format!("{key}: {id}"));
    }
    out.push_str("}\n");
    write_atomic(path, out.as_bytes())
}

/// The `(key, id)` entries of a JSON object in file order, repeated keys included.
struct Entries(Vec<(String, u64)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object mapping token strings to integer ids")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, u64>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(V)
    }
}

/// Reads a GPT-2 `vocab.json`. The ids must be exactly `0..n`, each once.
pub fn load_vocab(path: &Path) -> Result<Vocab> {
    let text = read(path)?;
    let Entries(entries) = serde_json::from_str(&text)
        .map_err(|e| invalid!("{}: invalid vocab.json: {e}", path.display()))?;
    let inverse = unicode_to_bytes();
    let n = entries.len();
    let mut vocab: Vec<Option<Vec<u8>>> = vec![None; n];
    for (token, id) in entries {
        let slot = usize::try_from(id)
            .ok()
            .and_then(|i| vocab.get_mut(i))
            .ok_or_else(|| {
                invalid!(
                    "{}: token {token:?} has id {id}, but ids must be dense in 0..{n} ({n} entries)",
                    path.display()
                )
            })?;
        if slot.is_some() {
            return Err(invalid!("{}: id {id} appears twice", path.display()));
        }
        *slot = Some(unspell(&inverse, &token, || path.display().to_string())?);
    }
    // n entries with distinct ids in 0..n: every slot is filled.
    Ok(vocab.into_iter().map(|t| t.expect("dense ids")).collect())
}

/// Writes GPT-2 `merges.txt`: a `#version: 0.2` line, then `left right` per line in rank order.
pub fn save_merges(path: &Path, merges: &Merges) -> Result<()> {
    let table = bytes_to_unicode();
    let mut out = String::from("#version: 0.2\n");
    for (left, right) in merges {
        out.push_str(&spell(&table, left));
        out.push(' ');
        out.push_str(&spell(&table, right));
        out.push('\n');
    }
    write_atomic(path, out.as_bytes())
}

/// Reads a GPT-2 `merges.txt` (an optional `#version` first line, then `left right` lines).
pub fn load_merges(path: &Path) -> Result<Merges> {
    let text = read(path)?;
    let inverse = unicode_to_bytes();
    let mut merges = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if i == 0 && line.starts_with("#version") {
            continue;
        }
        let at = || format!("{}:{}", path.display(), i + 1);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let (left, right) = match line.split_once(' ') {
            Some((l, r)) if !l.is_empty() && !r.is_empty() && !r.contains(' ') => (l, r),
            _ => {
                return Err(invalid!(
                    "{}: malformed merge {line:?}: expected two tokens separated by one space",
                    at()
                ))
            }
        };
        merges.push((unspell(&inverse, left, at)?, unspell(&inverse, right, at)?));
    }
    Ok(merges)
}

/// Writes `dir/vocab.json` and `dir/merges.txt`, creating `dir` if needed.
pub fn save_tokenizer(dir: &Path, vocab: &Vocab, merges: &Merges) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    save_vocab(&dir.join("vocab.json"), vocab)?;
    save_merges(&dir.join("merges.txt"), merges)
}

/// Reads `dir/vocab.json` and `dir/merges.txt`, and checks that every merge's parts and
/// result are in the vocabulary.
pub fn load_tokenizer(dir: &Path) -> Result<(Vocab, Merges)> {
    let (vocab_path, merges_path): (PathBuf, PathBuf) =
        (dir.join("vocab.json"), dir.join("merges.txt"));
    let vocab = load_vocab(&vocab_path)?;
    let merges = load_merges(&merges_path)?;
    let known: HashSet<&[u8]> = vocab.iter().map(Vec::as_slice).collect();
    for (rank, (left, right)) in merges.iter().enumerate() {
        let merged = [left.as_slice(), right.as_slice()].concat();
        for part in [left.as_slice(), right.as_slice(), merged.as_slice()] {
            if !known.contains(part) {
                return Err(invalid!(
                    "{}: merge {} (rank {rank}) uses the token {:?}, which is not in {}",
                    merges_path.display(),
                    rank + 1,
                    spell(&bytes_to_unicode(), part),
                    vocab_path.display()
                ));
            }
        }
    }
    Ok((vocab, merges))
}
