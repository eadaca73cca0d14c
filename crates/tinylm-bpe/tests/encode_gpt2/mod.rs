//! GPT-2 (`r50k_base`) from `tiktoken-rs`, as a reference and as a tinylm [`Tokenizer`].

use std::collections::HashMap;
use std::sync::OnceLock;
use tiktoken_rs::CoreBPE;
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::{Merges, Vocab};

pub const EOT: &str = "<|endoftext|>";
pub const EOT_ID: u32 = 50256;

/// tiktoken's GPT-2 encoder (with `<|endoftext|>` as its special token).
pub fn reference() -> &'static CoreBPE {
    tiktoken_rs::r50k_base_singleton()
}

/// GPT-2's vocabulary (ids 0..50256, without the special) and merges, rebuilt from the
/// ranks: token `r` (r ≥ 256) is the merge of the two parts that byte-pair merging its
/// bytes with the ranks below `r` stops at.
pub fn vocab_and_merges() -> &'static (Vocab, Merges) {
    static CELL: OnceLock<(Vocab, Merges)> = OnceLock::new();
    CELL.get_or_init(|| {
        let bpe = reference();
        let vocab: Vocab = (0..EOT_ID)
            .map(|id| bpe.decode_bytes(&[id]).unwrap())
            .collect();
        let ranks: HashMap<&[u8], u32> = vocab
            .iter()
            .enumerate()
            .map(|(id, t)| (t.as_slice(), id as u32))
            .collect();
        let merges = vocab[256..]
            .iter()
            .enumerate()
            .map(|(i, token)| {
                let parts = merge_below(token, &ranks, 256 + i as u32);
                assert_eq!(parts.len(), 2, "token {} is not one merge", 256 + i);
                (parts[0].to_vec(), parts[1].to_vec())
            })
            .collect();
        (vocab, merges)
    })
}

/// Byte-pair merging of `piece` with only the ranks below `limit` (plain reference code).
fn merge_below<'a>(piece: &'a [u8], ranks: &HashMap<&[u8], u32>, limit: u32) -> Vec<&'a [u8]> {
    let mut parts: Vec<&[u8]> = piece.chunks(1).collect();
    loop {
        let best = (0..parts.len().saturating_sub(1))
            .filter_map(|i| {
                let joined = &piece
                    [offset(piece, parts[i])..offset(piece, parts[i + 1]) + parts[i + 1].len()];
                ranks.get(joined).filter(|&&r| r < limit).map(|&r| (r, i))
            })
            .min();
        let Some((_, i)) = best else { return parts };
        let start = offset(piece, parts[i]);
        parts[i] = &piece[start..start + parts[i].len() + parts[i + 1].len()];
        parts.remove(i + 1);
    }
}

fn offset(piece: &[u8], part: &[u8]) -> usize {
    part.as_ptr() as usize - piece.as_ptr() as usize
}

/// tinylm's tokenizer with GPT-2's vocabulary and merges and the given specials.
pub fn tokenizer(specials: &[&str]) -> Tokenizer {
    let (vocab, merges) = vocab_and_merges();
    let specials: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    Tokenizer::new(vocab.clone(), merges, &specials).unwrap()
}

/// tinylm's GPT-2 tokenizer with `<|endoftext|>`, built once.
pub fn gpt2() -> &'static Tokenizer {
    static CELL: OnceLock<Tokenizer> = OnceLock::new();
    CELL.get_or_init(|| tokenizer(&[EOT]))
}

/// Varied text: English words, contractions, numbers, punctuation, whitespace runs,
/// non-Latin scripts, emoji, and `<|endoftext|>`, from a seed (deterministic).
pub fn generated_text(seed: u64, words: usize) -> String {
    const PIECES: &[&str] = &[
        "the",
        "The",
        " quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "Once",
        "upon",
        "a",
        "time",
        "there",
        "was",
        "little",
        "girl",
        "named",
        "Lily",
        "tokenization",
        "antidisestablishmentarianism",
        "don't",
        "we're",
        "I'll",
        "she'd",
        "you've",
        "'s",
        "'",
        "''",
        "123",
        "4567890",
        "3.14",
        "½",
        "١٢٣",
        "é",
        "café",
        "naïve",
        "Zürich",
        "中文",
        "日本語のテキスト",
        "한국어",
        "Здравствуйте",
        "مرحبا",
        "👋",
        "👨‍👩‍👧",
        "🇫🇷",
        ",",
        ".",
        "!",
        "?",
        "...",
        "--",
        "—",
        "“",
        "”",
        "(",
        ")",
        "#",
        "$",
        "%",
        "&&",
        "<|",
        "|>",
        "<|endoftext",
        "<|endoftext|>",
        " ",
        "  ",
        "   ",
        "\n",
        "\n\n",
        "\r\n",
        "\t",
        "\u{a0}",
        "\u{3000}",
        "\u{2028}",
        "\u{301}",
        "\u{feff}",
        "=====",
        "::",
        "x²",
    ];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut text = String::new();
    for _ in 0..words {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(PIECES[(state % PIECES.len() as u64) as usize]);
        if state & 0x300 != 0 {
            text.push(' ');
        }
    }
    text
}
