//! OpenAI's published rank files (`cl100k_base.tiktoken`, `o200k_base.tiktoken`), as
//! the `tiktoken-rs` crate (a dev-dependency, so always downloaded) ships them.

use std::path::PathBuf;

/// `tiktoken-rs`'s `assets` folder in the cargo registry. Panics when it cannot be
/// found: these tests never skip.
pub fn assets() -> PathBuf {
    // The registry is under CARGO_HOME; rustup's cargo lives in CARGO_HOME/bin.
    let homes = [
        std::env::var_os("CARGO_HOME").map(PathBuf::from),
        std::env::var_os("CARGO")
            .map(PathBuf::from)
            .and_then(|cargo| Some(cargo.parent()?.parent()?.to_path_buf())),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")),
    ];
    homes
        .into_iter()
        .flatten()
        .filter_map(|home| std::fs::read_dir(home.join("registry/src")).ok())
        .flat_map(|indexes| indexes.flatten())
        .map(|index| index.path().join("tiktoken-rs-0.12.1/assets"))
        .find(|p| p.join("cl100k_base.tiktoken").is_file())
        .expect("tiktoken-rs-0.12.1/assets (a dev-dependency) is not in the cargo registry under CARGO_HOME, CARGO's home or ~/.cargo")
}
