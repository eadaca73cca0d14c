//! The text tinylm trains on out of the box: 5,808 genuine TinyStories (Eldan & Li
//! 2023, `CDLA-Sharing-1.0`; source and licence in `data/` beside this crate),
//! zstd-compressed into the library — 1.0 MB for 4.9 MB of text — so that the
//! quickstart, the tests and the Python package need no file and no download.

use std::io::Read;

/// `data/tinystories.txt.zst`: one zstd frame.
const TINYSTORIES_ZST: &[u8] = include_bytes!("../data/tinystories.txt.zst");

/// How commands name the sample in what they print.
pub const TINYSTORIES_NAME: &str = "the TinyStories sample inside tinylm";

/// The TinyStories sample, decompressed: UTF-8 text, each story followed by a line
/// `<|endoftext|>` (4,893,550 bytes).
pub fn tinystories() -> String {
    let mut frame = ruzstd::decoding::StreamingDecoder::new(TINYSTORIES_ZST)
        .expect("the embedded TinyStories sample is a zstd frame");
    let mut text = String::with_capacity(4_893_550);
    frame
        .read_to_string(&mut text)
        .expect("the embedded TinyStories sample decompresses to UTF-8 text");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_whole_stories_ending_in_separators() {
        let text = tinystories();
        assert_eq!(text.len(), 4_893_550);
        assert_eq!(text.matches("<|endoftext|>").count(), 5_808);
        assert!(text.starts_with("Lily was a princess who loved to jump."));
        assert!(text.trim_end().ends_with("<|endoftext|>"));
    }
}
