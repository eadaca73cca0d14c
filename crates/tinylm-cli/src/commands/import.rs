//! `tinylm import hf DIR --out CKPT`: a `transformers` `LlamaForCausalLM` directory
//! of a shape tinylm runs, as a tinylm checkpoint (see `tinylm::export::hf::import`).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tinylm::checkpoint;
use tinylm::export::hf;
use tinylm::files::write_dir;

#[derive(Args)]
pub struct ImportArgs {
    #[command(subcommand)]
    command: ImportCommand,
}

#[derive(Subcommand)]
enum ImportCommand {
    /// A Hugging Face `LlamaForCausalLM` directory (config.json, model.safetensors,
    /// tokenizer.json).
    Hf(HfArgs),
}

#[derive(Args)]
struct HfArgs {
    /// The directory to import.
    dir: PathBuf,
    /// The checkpoint to write (`.safetensors`).
    #[arg(long)]
    out: PathBuf,
    /// Where to write the tokenizer as `vocab.json`, `merges.txt` and `tokenizer.json`
    /// (must not exist, or be empty) [default: `tokenizer` next to --out].
    #[arg(long)]
    tokenizer_out: Option<PathBuf>,
}

pub fn run(args: ImportArgs) -> Result<()> {
    let ImportCommand::Hf(a) = args.command;
    let imported = hf::import(&a.dir)?;
    let mut metadata = BTreeMap::from([(
        "source".to_string(),
        serde_json::to_string(&a.dir).expect("serializes"),
    )]);
    let tokenizer_dir = match &imported.tokenizer {
        Some(t) => {
            let dir = a.tokenizer_out.clone().unwrap_or_else(|| {
                let parent = a.out.parent().filter(|p| !p.as_os_str().is_empty());
                parent.map_or_else(|| PathBuf::from("tokenizer"), |p| p.join("tokenizer"))
            });
            write_dir(&dir, |tmp| t.save(tmp))?;
            metadata.insert(
                "tokenizer".into(),
                serde_json::to_string(&dir).expect("serializes"),
            );
            Some(dir)
        }
        None => None,
    };
    let saved = checkpoint::save(&a.out, &imported.config, &imported.params, None, &metadata)
        .with_context(|| format!("writing {}", a.out.display()));
    if saved.is_err() {
        if let Some(dir) = &tokenizer_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    saved?;
    eprintln!(
        "{} -> {}{}",
        a.dir.display(),
        a.out.display(),
        tokenizer_dir.map_or(" (no tokenizer.json)".into(), |d| format!(
            ", tokenizer -> {}",
            d.display()
        ))
    );
    Ok(())
}
