//! GPT-2's `vocab.json` and `merges.txt`.
//!
//! Both files spell byte strings through GPT-2's [`bytes_to_unicode`] table, which maps
//! every byte to a printable character (space becomes `Ġ`, newline `Ċ`), so a token
//! never contains a space or a line break and `merges.txt` can be space-separated.

use std::fmt;
use std::path::Path;

use serde::de::{Deserializer, MapAccess, Visitor};

use super::byte_table::{bytes_to_unicode, spell, unicode_to_bytes, unspell};
use super::io::read;
use crate::atomic::write_bytes;
use crate::encode::Tokenizer;
use crate::{invalid, Error, Merges, Result, Vocab};

/// Reads a GPT-2 `vocab.json` and `merges.txt` and builds the tokenizer (GPT-2's split
/// pattern); an inconsistency between the two names both files.
pub fn tokenizer(
    vocab_json: &Path,
    merges_txt: &Path,
    special_tokens: &[String],
) -> Result<Tokenizer> {
    let vocab = load_vocab(vocab_json)?;
    let merges = load_merges(merges_txt)?;
    Tokenizer::new(vocab, &merges, special_tokens).map_err(|e| match e {
        Error::Invalid(msg) => invalid!(
            "{} and {}: {msg}",
            vocab_json.display(),
            merges_txt.display()
        ),
        other => other,
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
        let key = serde_json::to_string(&spell(table, token)).expect("a string serializes");
        out.push_str(&format!("{key}: {id}"));
    }
    out.push_str("}\n");
    write_bytes(path, out.as_bytes())
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
        out.push_str(&spell(table, left));
        out.push(' ');
        out.push_str(&spell(table, right));
        out.push('\n');
    }
    write_bytes(path, out.as_bytes())
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
