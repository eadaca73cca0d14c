//! Hugging Face `tokenizer.json`: a byte-level BPE tokenizer of the `tokenizers` library.
//!
//! The file written is a BPE model over GPT-2's byte alphabet (tokens spelled through
//! [`super::bytes_to_unicode`]) that merges by rank (`ignore_merges` false), the special tokens
//! as added tokens (`special` true, `normalized` false), no normalizer, and the
//! pre-tokenizer of the split pattern:
//!
//! - GPT-2's pattern: `ByteLevel` with `use_regex` true (its built-in regex is GPT-2's).
//! - any other: a `Sequence` of `Split` on the pattern's regex, then `ByteLevel` with
//!   `use_regex` false. The `Split` keeps exactly the matches, each as its own piece
//!   (`behavior` `Removed` with `invert` true: the text between matches is the part
//!   removed), as tiktoken does; a custom pattern that keeps gaps uses `Isolated`
//!   (matches and the text between them are pieces). The named patterns match every
//!   char, so for them the two are the same, and `Isolated` is written. The regex is
//!   tiktoken's, but for one thing: Oniguruma, the engine of `tokenizers`, reads a
//!   possessive interval `{1,3}+` as a repetition of the repetition, so GPT-4's
//!   `\p{N}{1,3}+` is written `\p{N}{1,3}` (the same matches), and a custom regex with
//!   one is refused.
//!
//! Reading accepts these shapes and refuses, with the file and the JSON key, anything
//! that would encode differently: another model type, a normalizer, another
//! pre-tokenizer, a `Split` on a plain string, `byte_fallback`, a subword prefix or
//! suffix, `ignore_merges` (a word in the vocabulary skips the merges), dropout.
//!
//! Ids: the model's vocabulary and the added tokens together must hold every id from 0
//! to the largest id of the model's vocabulary; ids above it that only added tokens
//! leave unused become empty placeholder tokens (as [`super::tiktoken::load`] makes).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::byte_table::unicode_to_bytes;
use super::io::read;
use super::{check_unused_ids, Bpe};
use crate::atomic::write_bytes;
use crate::pretokenize::{Pattern, GPT4_PATTERN};
use crate::{invalid, Error, Result};

/// `ByteLevel` with GPT-2's settings: its regex when `use_regex`, no prefix space.
fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

/// Where `regex` has a possessive interval `{n}+`, `{n,}+` or `{n,m}+`, its byte
/// offset. Oniguruma (the regex engine of `tokenizers`) reads these as a repetition of
/// the repetition (`\d{1,3}+` is any run of digits), unlike tiktoken's engines.
fn possessive_interval(regex: &str) -> Option<usize> {
    let b = regex.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'{' => {
                let close = b[i + 1..]
                    .iter()
                    .position(|&c| c == b'}')
                    .map(|p| i + 1 + p);
                if let Some(close) = close {
                    let inner = &regex[i + 1..close];
                    let interval = !inner.is_empty()
                        && inner.bytes().next().is_some_and(|c| c.is_ascii_digit())
                        && inner.bytes().all(|c| c.is_ascii_digit() || c == b',')
                        && inner.bytes().filter(|&c| c == b',').count() <= 1;
                    if interval && b.get(close + 1) == Some(&b'+') {
                        return Some(i);
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// GPT-4's pattern as written for Oniguruma: `\p{N}{1,3}+` loses its `+`, the same
/// matches there, as nothing follows it in its alternative.
fn gpt4_pattern_onig() -> String {
    GPT4_PATTERN.replace(r"\p{N}{1,3}+", r"\p{N}{1,3}")
}

/// The pre-tokenizer of `pattern` (see the module's documentation); a custom regex with
/// a possessive interval, which `tokenizers` would read differently, is an error.
fn pre_tokenizer(pattern: &Pattern) -> Result<Value> {
    if *pattern == Pattern::Gpt2 {
        return Ok(byte_level(true));
    }
    let regex = match pattern {
        Pattern::Gpt4 => gpt4_pattern_onig(),
        other => other.regex().to_string(),
    };
    if let Some(at) = possessive_interval(&regex) {
        return Err(invalid!(
            "the split pattern {regex:?} has a possessive repetition at byte {at}, which the tokenizers library reads as a repetition of the repetition: write it without the last +, or as an atomic group (?>...)"
        ));
    }
    let (behavior, invert) = match pattern {
        Pattern::Custom(_) if !pattern.keeps_gaps() => ("Removed", true),
        _ => ("Isolated", false),
    };
    Ok(json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": behavior, "invert": invert},
        byte_level(false),
    ]}))
}

/// The `tokenizer.json` of `bpe`. Empty placeholder tokens are left out; where several
/// ids have the same bytes, the lowest keeps them. A custom split pattern with a
/// possessive interval (`{1,3}+`) is an error: `tokenizers` would split differently.
pub fn to_json(bpe: &Bpe) -> Result<Value> {
    let pre_tokenizer = pre_tokenizer(&bpe.pattern)?;
    let added: Vec<Value> = bpe
        .specials
        .iter()
        .map(|&id| {
            json!({"id": id, "content": bpe.spelled(id), "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let mut vocab = Map::new();
    for (id, token) in bpe.vocab.iter().enumerate() {
        if !token.is_empty() {
            vocab.entry(bpe.spelled(id as u32)).or_insert(json!(id));
        }
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": byte_level(true),
        "decoder": byte_level(true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": bpe.spelled_merges(),
        },
    }))
}

/// Writes `bpe` as the `tokenizer.json` at `path` (whole or not at all).
pub fn save(path: &Path, bpe: &Bpe) -> Result<()> {
    let json = to_json(bpe).map_err(|e| invalid!("{}: {e}", path.display()))?;
    let text = serde_json::to_string_pretty(&json).expect("serializes") + "\n";
    write_bytes(path, text.as_bytes())
}

/// Reads a byte-level BPE `tokenizer.json` (see the module's documentation).
pub fn load(path: &Path) -> Result<Bpe> {
    let text = read(path)?;
    let root: Value = serde_json::from_str(&text)
        .map_err(|e| invalid!("{}: invalid JSON: {e}", path.display()))?;
    let refuse = |key: &str, why: String| invalid!("{}: {key}: {why}", path.display());
    let model = &root["model"];
    if model["type"] != "BPE" {
        return Err(refuse(
            "model.type",
            format!(
                "{} is not \"BPE\" (only byte-level BPE tokenizers are read)",
                model["type"]
            ),
        ));
    }
    if !root["normalizer"].is_null() {
        return Err(refuse(
            "normalizer",
            format!(
                "{} is not supported (tinylm's tokenizer has none)",
                root["normalizer"]
            ),
        ));
    }
    let pattern = read_pre_tokenizer(&root["pre_tokenizer"], &refuse)?;
    let decoder = &root["decoder"];
    if !(decoder.is_null() || decoder["type"] == "ByteLevel") {
        return Err(refuse(
            "decoder",
            format!("{} is not ByteLevel", decoder["type"]),
        ));
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if !(model[key].is_null() || model[key] == "") {
            return Err(refuse(
                &format!("model.{key}"),
                format!("{} is not supported", model[key]),
            ));
        }
    }
    for (key, why) in [
        ("byte_fallback", "byte-level BPE needs no byte fallback"),
        (
            "ignore_merges",
            "a word in the vocabulary would skip the merges",
        ),
    ] {
        if model[key] == true {
            return Err(refuse(
                &format!("model.{key}"),
                format!("true is not supported ({why})"),
            ));
        }
    }
    if !(model["dropout"].is_null() || model["dropout"] == 0.0) {
        return Err(refuse(
            "model.dropout",
            format!(
                "{} is not supported (merges would be random)",
                model["dropout"]
            ),
        ));
    }
    let inverse = unicode_to_bytes();
    let unspell = |key: &str, token: &str| -> Result<Vec<u8>> {
        token
            .chars()
            .map(|c| {
                inverse.get(&c).copied().ok_or_else(|| {
                    refuse(
                        key,
                        format!("token {token:?} has {c:?}, which is not in GPT-2's byte alphabet"),
                    )
                })
            })
            .collect()
    };
    let added = match &root["added_tokens"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a.clone(),
        other => {
            return Err(refuse(
                "added_tokens",
                format!("expected a list, found {other}"),
            ))
        }
    };
    let mut specials: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (i, t) in added.iter().enumerate() {
        let key = format!("added_tokens[{i}]");
        let (Some(id), Some(content)) = (t["id"].as_u64(), t["content"].as_str()) else {
            return Err(refuse(&key, format!("malformed entry {t}")));
        };
        for flag in ["single_word", "lstrip", "rstrip"] {
            if t[flag] == true {
                return Err(refuse(
                    &format!("{key}.{flag}"),
                    format!("true is not supported (token {content:?})"),
                ));
            }
        }
        if content.is_empty() || u32::try_from(id).is_err() {
            return Err(refuse(&key, format!("malformed entry {t}")));
        }
        if specials.insert(id, content.as_bytes().to_vec()).is_some() {
            return Err(refuse(&key, format!("id {id} appears twice")));
        }
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| refuse("model.vocab", "expected an object of token → id".into()))?;
    let mut tokens: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .filter(|&id| u32::try_from(id).is_ok())
            .ok_or_else(|| refuse("model.vocab", format!("{token:?} has the id {id}")))?;
        if let Some(special) = specials.get(&id) {
            // An added token listed in the vocabulary too, as `tokenizers` writes it.
            if special != token.as_bytes() {
                return Err(refuse(
                    "model.vocab",
                    format!(
                        "{token:?} has the id {id} of the added token {:?}",
                        String::from_utf8_lossy(special)
                    ),
                ));
            }
            continue;
        }
        if tokens.insert(id, unspell("model.vocab", token)?).is_some() {
            return Err(refuse(
                "model.vocab",
                format!("{token:?} has the id {id}, which another token has too"),
            ));
        }
    }
    let model_end = tokens.keys().next_back().map_or(0, |&id| id + 1);
    if let Some(id) =
        (0..model_end).find(|id| !tokens.contains_key(id) && !specials.contains_key(id))
    {
        return Err(refuse(
            "model.vocab",
            format!(
                "no token has the id {id}: ids must be dense in 0..{model_end} (a vocabulary where two ids have the same bytes cannot be a tokenizer.json)"
            ),
        ));
    }
    let end = specials
        .keys()
        .next_back()
        .map_or(model_end, |&id| model_end.max(id + 1));
    check_unused_ids(end, tokens.len() + specials.len(), || {
        format!("{}: added_tokens: the id {}", path.display(), end - 1)
    })?;
    let vocab: Vec<Vec<u8>> = (0..end)
        .map(|id| {
            specials
                .get(&id)
                .or(tokens.get(&id))
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let merges = model["merges"]
        .as_array()
        .ok_or_else(|| refuse("model.merges", "expected a list".into()))?
        .iter()
        .enumerate()
        .map(|(rank, m)| {
            let (left, right) = match m {
                Value::String(s) => s.split_once(' ').unwrap_or((s, "")),
                Value::Array(pair) if pair.len() == 2 => (
                    pair[0].as_str().unwrap_or(""),
                    pair[1].as_str().unwrap_or(""),
                ),
                _ => ("", ""),
            };
            let key = format!("model.merges[{rank}]");
            if left.is_empty() || right.is_empty() || right.contains(' ') {
                return Err(refuse(&key, format!("malformed merge {m}")));
            }
            Ok((unspell(&key, left)?, unspell(&key, right)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Bpe {
        vocab,
        merges,
        specials: specials.keys().map(|&id| id as u32).collect(),
        pattern,
    })
}

/// The split pattern of a `pre_tokenizer`: `ByteLevel` with its regex (GPT-2's), or a
/// `Sequence` of a regex `Split` and a `ByteLevel` without regex.
fn read_pre_tokenizer(pre: &Value, refuse: &dyn Fn(&str, String) -> Error) -> Result<Pattern> {
    let check_byte_level = |key: &str, value: &Value, use_regex: bool| -> Result<()> {
        if value["type"] != "ByteLevel" {
            return Err(refuse(
                &format!("{key}.type"),
                format!("{} is not supported (expected ByteLevel)", value["type"]),
            ));
        }
        if value["add_prefix_space"] == true {
            return Err(refuse(
                &format!("{key}.add_prefix_space"),
                "true is not supported".into(),
            ));
        }
        // `use_regex` defaults to true.
        if (value["use_regex"] != false) != use_regex {
            return Err(refuse(
                &format!("{key}.use_regex"),
                format!(
                    "{} is not supported here (expected {use_regex})",
                    value["use_regex"]
                ),
            ));
        }
        Ok(())
    };
    match pre["type"].as_str() {
        Some("ByteLevel") => {
            check_byte_level("pre_tokenizer", pre, true)?;
            Ok(Pattern::Gpt2)
        }
        Some("Sequence") => {
            let parts = pre["pretokenizers"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            let [split, byte_level] = parts else {
                return Err(refuse(
                    "pre_tokenizer.pretokenizers",
                    "only [Split, ByteLevel] is supported".into(),
                ));
            };
            let key = "pre_tokenizer.pretokenizers[0]";
            if split["type"] != "Split" {
                return Err(refuse(
                    &format!("{key}.type"),
                    format!("{} is not supported (expected Split)", split["type"]),
                ));
            }
            let Some(regex) = split["pattern"]["Regex"].as_str() else {
                return Err(refuse(
                    &format!("{key}.pattern"),
                    format!(
                        "{} is not supported (only a {{\"Regex\": ...}} pattern)",
                        split["pattern"]
                    ),
                ));
            };
            let keep_gaps = match (split["behavior"].as_str(), split["invert"] == true) {
                (Some("Isolated"), false) => true,
                (Some("Removed"), true) => false,
                (behavior, invert) => {
                    return Err(refuse(
                        &format!("{key}.behavior"),
                        format!(
                            "{} with invert {invert} is not supported (only Isolated, or Removed with invert true)",
                            behavior.unwrap_or("null")
                        ),
                    ))
                }
            };
            check_byte_level("pre_tokenizer.pretokenizers[1]", byte_level, false)?;
            if regex == gpt4_pattern_onig() {
                return Ok(Pattern::Gpt4);
            }
            if let Some(at) = possessive_interval(regex) {
                return Err(refuse(
                    &format!("{key}.pattern"),
                    format!("{regex:?} has a repetition of a repetition at byte {at} ({{n,m}}+ is not possessive in the tokenizers library), which tinylm's regex engine reads differently"),
                ));
            }
            Pattern::from_regex(regex, keep_gaps)
                .map_err(|e| refuse(&format!("{key}.pattern"), e.to_string()))
        }
        _ => Err(refuse(
            "pre_tokenizer",
            format!(
                "{} is not supported (expected ByteLevel, or a Sequence of Split and ByteLevel)",
                pre["type"]
            ),
        )),
    }
}
