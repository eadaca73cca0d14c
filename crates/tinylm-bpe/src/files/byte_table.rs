//! GPT-2's byte-to-unicode table, which spells any bytes as printable text (the
//! alphabet of `vocab.json`, `merges.txt` and `tokenizer.json`).

use crate::{invalid, Result};

/// GPT-2's table: byte `b` is spelled as the char `table[b]`.
///
/// Printable Latin-1 bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) map to themselves; the
/// remaining 68 bytes map, in byte order, to U+0100, U+0101, ...
pub fn bytes_to_unicode() -> &'static [char; 256] {
    &BYTES_TO_UNICODE
}

/// [`bytes_to_unicode`]'s table, built at compile time.
static BYTES_TO_UNICODE: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut next = 256;
    let mut b = 0;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        let code = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = match char::from_u32(code) {
            Some(c) => c,
            None => panic!("codes below 0x200 are chars"),
        };
        b += 1;
    }
    table
};

/// The inverse table: a char of the GPT-2 alphabet → its byte.
pub(crate) fn unicode_to_bytes() -> rustc_hash::FxHashMap<char, u8> {
    bytes_to_unicode()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// `bytes` spelled through `table`.
pub(crate) fn spell(table: &[char; 256], bytes: &[u8]) -> String {
    bytes.iter().map(|&b| table[b as usize]).collect()
}

/// The bytes that `token` spells; `what` names the token's place for the error.
pub(crate) fn unspell(
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
