//! tiktoken's rank files (`cl100k_base.tiktoken`, ...): one `<base64 token> <rank>`
//! line per token, standard base64, as `tiktoken.load.load_tiktoken_bpe` reads them.
//!
//! A rank is both the token's id and its merge priority: tiktoken merges any two
//! adjacent parts whose concatenation is a token, lowest rank first. The file holds no
//! merges, no special tokens and no split pattern; [`load`] takes the last two as
//! arguments and derives the merges as `transformers`' tiktoken converter does.

use std::path::Path;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::io::read;
use super::{check_unused_ids, Bpe};
use crate::atomic::write_bytes;
use crate::pretokenize::Pattern;
use crate::{invalid, Merges, Result, Vocab};

/// Writes the rank file of `bpe` at `path`: a line `base64(token) id` for every token
/// but the special ones and empty placeholders, in id order.
///
/// tiktoken encodes by these ranks, which is the merges' encoding when the merges are
/// those the ranks derive (as for a tokenizer read by [`load`]); a trained tokenizer's
/// merges can differ (a merge `(a, bc)` where `ab` ranks below `bc`).
/// A vocabulary where two ids have the same bytes cannot be a rank file: the error
/// names both ids and the token.
pub fn save(path: &Path, bpe: &Bpe) -> Result<()> {
    if let Some((first, second)) = bpe.repeated_token() {
        return Err(invalid!(
            "{}: tokens {first} and {second} are both {:?}: a rank file gives each token one rank",
            path.display(),
            String::from_utf8_lossy(&bpe.vocab[first as usize])
        ));
    }
    let mut out = String::new();
    for (id, token) in bpe.vocab.iter().enumerate() {
        if !token.is_empty() && !bpe.is_special(id as u32) {
            STANDARD.encode_string(token, &mut out);
            out.push(' ');
            out.push_str(&id.to_string());
            out.push('\n');
        }
    }
    write_bytes(path, out.as_bytes())
}

/// `text` as a Python string literal: raw (`r"..."`, `r'...'` or triple-quoted) when
/// one spells it exactly, else an escaped literal.
fn python_str(text: &str) -> String {
    // In a raw literal a backslash keeps the char after it (a quote included), so the
    // text fits when every unescaped quote differs from the delimiter and no backslash
    // is left dangling at the end.
    let fits = |quote: &str| {
        let q = quote.chars().next().expect("a quote");
        if text.chars().any(char::is_control) {
            return false;
        }
        let mut chars = text.char_indices();
        // Whether the text ends with an unescaped quote char (which would run into a
        // triple-quoted delimiter).
        let mut ends_with_quote = false;
        while let Some((i, c)) = chars.next() {
            ends_with_quote = false;
            if c == '\\' {
                if chars.next().is_none() {
                    return false;
                }
            } else if text[i..].starts_with(quote) {
                return false;
            } else if c == q {
                ends_with_quote = true;
            }
        }
        !ends_with_quote
    };
    match ["\"", "'", "\"\"\"", "'''"].into_iter().find(|q| fits(q)) {
        Some(q) => format!("r{q}{text}{q}"),
        // A JSON string literal is a Python one with the same value.
        None => serde_json::to_string(text).expect("a string serializes"),
    }
}

/// The Python lines that build the `tiktoken.Encoding` of `bpe` from its rank file at
/// `path` (see [`save`]), bound to `enc`.
pub fn python_snippet(path: &Path, bpe: &Bpe) -> String {
    let name = path
        .file_stem()
        .map_or_else(|| "tinylm".into(), |s| s.to_string_lossy().into_owned());
    let specials: Vec<String> = bpe
        .specials
        .iter()
        .zip(bpe.special_tokens())
        .map(|(id, text)| format!("{}: {id}", python_str(&text)))
        .collect();
    format!(
        "import tiktoken\nimport tiktoken.load\n\nenc = tiktoken.Encoding(\n    name={},\n    pat_str={},\n    mergeable_ranks=tiktoken.load.load_tiktoken_bpe({}),\n    special_tokens={{{}}},\n)\n",
        python_str(&name),
        python_str(bpe.pattern.regex()),
        python_str(&path.to_string_lossy()),
        specials.join(", ")
    )
}

/// Reads the rank file at `path` as a tokenizer with the split `pattern` and the
/// special tokens `specials`.
///
/// Ranks must be dense from 0, except for ids that a special token of `specials` names.
/// A special `(text, None)` takes the id after the largest used so far, `(text,
/// Some(id))` that id. Ids left unused below a special token's id (cl100k_base has
/// none at 100256) hold empty placeholder tokens, which never encode.
///
/// The merges are derived as `transformers`' tiktoken converter does: for each token of
/// rank `r` and at least two bytes, rank-based BPE on its bytes with the ranks below
/// `r` must end in exactly two parts `(left, right)`, the merge of rank `r`'s token;
/// the merges are in rank order.
pub fn load(path: &Path, pattern: Pattern, specials: &[(String, Option<u32>)]) -> Result<Bpe> {
    let text = read(path)?;
    let at = |line: usize| format!("{}:{line}", path.display());
    let mut ranked: Vec<(u32, Vec<u8>, usize)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let mut parts = line.split(' ');
        let (Some(token), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(invalid!(
                "{}: malformed line {line:?}: expected a base64 token, a space and a rank",
                at(i + 1)
            ));
        };
        let rank: u32 = rank.parse().map_err(|_| {
            invalid!(
                "{}: the rank {rank:?} is not a number (line {line:?})",
                at(i + 1)
            )
        })?;
        let bytes = STANDARD
            .decode(token)
            .map_err(|e| invalid!("{}: {token:?} is not base64: {e}", at(i + 1)))?;
        if bytes.is_empty() {
            return Err(invalid!("{}: the token of rank {rank} is empty", at(i + 1)));
        }
        ranked.push((rank, bytes, i + 1));
    }
    ranked.sort_unstable_by_key(|&(rank, _, line)| (rank, line));
    for pair in ranked.windows(2) {
        if pair[0].0 == pair[1].0 {
            return Err(invalid!(
                "{}: rank {} appears on lines {} and {}",
                path.display(),
                pair[0].0,
                pair[0].2,
                pair[1].2
            ));
        }
    }
    let mut ranks: FxHashMap<&[u8], (u32, usize)> = FxHashMap::default();
    ranks.reserve(ranked.len());
    for (rank, bytes, line) in &ranked {
        if let Some((other, other_line)) = ranks.insert(bytes, (*rank, *line)) {
            return Err(invalid!(
                "{}: the token {:?} has ranks {other} (line {other_line}) and {rank} (line {line})",
                path.display(),
                String::from_utf8_lossy(bytes)
            ));
        }
    }
    // The special tokens' ids.
    let mut next = ranked.last().map_or(0, |r| u64::from(r.0) + 1);
    let mut special_ids: FxHashMap<u32, &str> = FxHashMap::default();
    for (text, id) in specials {
        let id = match id {
            Some(id) => *id,
            None => u32::try_from(next).map_err(|_| {
                invalid!(
                    "{}: no id is left for the special token {text:?} after the rank {}",
                    path.display(),
                    u32::MAX
                )
            })?,
        };
        if text.is_empty() {
            return Err(invalid!(
                "{}: a special token must not be empty",
                path.display()
            ));
        }
        if let Some(&(rank, line)) = ranks.get(text.as_bytes()) {
            return Err(invalid!(
                "{}: the special token {text:?} is the token of rank {rank} (line {line})",
                path.display()
            ));
        }
        if ranked.binary_search_by_key(&id, |r| r.0).is_ok() {
            return Err(invalid!(
                "{}: the special token {text:?} has the id {id}, which is a rank",
                path.display()
            ));
        }
        if let Some(other) = special_ids.insert(id, text) {
            return Err(invalid!(
                "{}: the special tokens {other:?} and {text:?} both have the id {id}",
                path.display()
            ));
        }
        if special_ids
            .values()
            .filter(|t| **t == text.as_str())
            .count()
            > 1
        {
            return Err(invalid!(
                "{}: the special token {text:?} is given twice",
                path.display()
            ));
        }
        next = next.max(u64::from(id) + 1);
    }
    // Dense ranks: every id below the last rank is a rank or a special token.
    let mut expected = 0u32;
    for (rank, _, _) in &ranked {
        while expected < *rank {
            if !special_ids.contains_key(&expected) {
                return Err(invalid!(
                    "{}: no token has the rank {expected} (ranks must be dense from 0, but for the special tokens' ids)",
                    path.display()
                ));
            }
            expected += 1;
        }
        expected = rank + 1;
    }
    check_unused_ids(next, ranked.len() + special_ids.len(), || {
        format!("{}: the special tokens' id {}", path.display(), next - 1)
    })?;
    let mut vocab: Vocab = vec![Vec::new(); next as usize];
    for (rank, bytes, _) in &ranked {
        vocab[*rank as usize] = bytes.clone();
    }
    for (&id, text) in &special_ids {
        vocab[id as usize] = text.as_bytes().to_vec();
    }
    let rank_of = |bytes: &[u8]| ranks.get(bytes).map(|&(r, _)| r);
    let merges: Vec<Option<(Vec<u8>, Vec<u8>)>> = ranked
        .par_iter()
        .map(|(rank, bytes, line)| {
            if bytes.len() < 2 {
                return Ok(None);
            }
            let parts = rank_bpe(bytes, *rank, &rank_of);
            match parts.as_slice() {
                [l, r] => Ok(Some((bytes[..*l].to_vec(), bytes[*l..*r].to_vec()))),
                _ => Err(invalid!(
                    "{}:{line}: the token {:?} of rank {rank} is not the merge of two tokens of lower rank (BPE with the lower ranks leaves it in {} parts)",
                    path.display(),
                    String::from_utf8_lossy(bytes),
                    parts.len()
                )),
            }
        })
        .collect::<Result<_>>()?;
    let merges: Merges = merges.into_iter().flatten().collect();
    let mut specials: Vec<u32> = special_ids.into_keys().collect();
    specials.sort_unstable();
    Ok(Bpe {
        vocab,
        merges,
        specials,
        pattern,
    })
}

/// tiktoken's byte-pair merge of `bytes` with only the ranks below `limit`: the ends
/// of the parts it leaves. Repeatedly merges the adjacent pair whose concatenation has
/// the lowest rank (the leftmost on a tie).
fn rank_bpe(bytes: &[u8], limit: u32, rank_of: &dyn Fn(&[u8]) -> Option<u32>) -> Vec<usize> {
    // `starts[i]`: where part i starts; the last entry is `bytes.len()`.
    let mut starts: Vec<usize> = (0..=bytes.len()).collect();
    let pair_rank = |starts: &[usize], i: usize| -> Option<u32> {
        rank_of(&bytes[starts[i]..starts[i + 2]]).filter(|&r| r < limit)
    };
    let mut ranks: Vec<Option<u32>> = (0..starts.len() - 2)
        .map(|i| pair_rank(&starts, i))
        .collect();
    loop {
        let best = ranks
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (r, i)))
            .min();
        let Some((_, i)) = best else { break };
        starts.remove(i + 1);
        ranks.remove(i);
        if i < ranks.len() {
            ranks[i] = pair_rank(&starts, i);
        }
        if i > 0 {
            ranks[i - 1] = pair_rank(&starts, i - 1);
        }
    }
    starts[1..].to_vec()
}
