//! `tinylm export hf|gguf|weights`: a trained model for Hugging Face
//! `transformers` or for llama.cpp (see `tinylm::export`), or its weights alone in
//! tinylm's own format (`tinylm::checkpoint::save_weights`).

use super::tokenizer::tokenizer_dir;
use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use tinylm::checkpoint;
use tinylm::export::gguf::{self, GgufDtype};
use tinylm::export::{check_llama, hf};
use tinylm::kernels::Stored;
use tinylm::weights::{self, Weights};
use tinylm_bpe::files::Bpe;

#[derive(Args)]
pub struct ExportArgs {
    #[command(subcommand)]
    command: ExportCommand,
}

#[derive(Subcommand)]
enum ExportCommand {
    /// A `LlamaForCausalLM` directory that `transformers`' `from_pretrained` loads.
    Hf(HfArgs),
    /// A GGUF v3 file (`llama` architecture, GPT-2 tokenizer) that llama.cpp runs.
    Gguf(GgufArgs),
    /// The weights alone, as a tinylm checkpoint without the optimizer state, in
    /// f32 or bf16 (half the size): what generate, serve and eval open. Under
    /// `--precision bf16` a bf16 file is mapped as the weights the CPU multiplies.
    Weights(WeightsArgs),
}

/// The model and tokenizer to export.
#[derive(Args)]
struct Source {
    /// A checkpoint of `tinylm train` (the optimizer state is ignored), or an
    /// exported Hugging Face directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Tokenizer directory (`tokenizer.json`, or `vocab.json` and `merges.txt`)
    /// [default: the one the checkpoint records].
    #[arg(long)]
    tokenizer: Option<PathBuf>,
}

#[derive(Args)]
struct HfArgs {
    #[command(flatten)]
    source: Source,
    /// The directory to create (must not exist, or be empty).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct GgufArgs {
    #[command(flatten)]
    source: Source,
    /// The `.gguf` file to write.
    #[arg(long)]
    out: PathBuf,
    /// How the matrices are stored, as llama.cpp's `convert_hf_to_gguf.py
    /// --outtype` stores them: RMSNorm gains stay f32; q8_0 (blocks of 32 int8
    /// values with an f16 scale) covers the embedding and output layer too, and
    /// stores a matrix whose rows are not a multiple of 32 in f16.
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    dtype: Dtype,
}

#[derive(Args)]
struct WeightsArgs {
    #[command(flatten)]
    source: Source,
    /// The `.safetensors` file to write.
    #[arg(long)]
    out: PathBuf,
    /// How the weights are stored: f32 as trained, or bf16 (rounded to nearest).
    #[arg(long, value_enum, default_value_t = WeightsDtype::Bf16)]
    dtype: WeightsDtype,
}

#[derive(Clone, Copy, ValueEnum)]
enum WeightsDtype {
    F32,
    Bf16,
}

#[derive(Clone, Copy, ValueEnum)]
enum Dtype {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
}

pub fn run(args: ExportArgs) -> Result<()> {
    match args.command {
        ExportCommand::Hf(a) => {
            let (w, tokenizer) = load(&a.source)?;
            hf::export(&w.config, &w.params, &tokenizer, &a.out)?;
            eprintln!("{} -> {}", a.source.checkpoint.display(), a.out.display());
        }
        ExportCommand::Gguf(a) => {
            let (w, tokenizer) = load(&a.source)?;
            let dtype = match a.dtype {
                Dtype::F32 => GgufDtype::F32,
                Dtype::F16 => GgufDtype::F16,
                Dtype::Bf16 => GgufDtype::Bf16,
                Dtype::Q8_0 => GgufDtype::Q8_0,
            };
            gguf::export(&w.config, &w.params, &tokenizer, &a.out, dtype)?;
            eprintln!("{} -> {}", a.source.checkpoint.display(), a.out.display());
        }
        ExportCommand::Weights(a) => {
            let w = weights::load(&a.source.checkpoint, None)?;
            // The tokenizer, recorded by its absolute path (found from anywhere):
            // one given must exist; one the checkpoint records that is gone is
            // left out (generate then asks for --tokenizer).
            let tokenizer = match (&a.source.tokenizer, &w.tokenizer) {
                (Some(dir), _) => Some(
                    std::fs::canonicalize(dir)
                        .with_context(|| format!("tokenizer directory {}", dir.display()))?,
                ),
                (None, Some(dir)) => std::fs::canonicalize(dir)
                    .inspect_err(|_| {
                        eprintln!(
                            "warning: {} records the tokenizer {}, which is not there: \
                             the weights record none",
                            a.source.checkpoint.display(),
                            dir.display()
                        )
                    })
                    .ok(),
                (None, None) => None,
            };
            let extra = tokenizer.map(|dir| {
                let json = serde_json::to_string(&dir).expect("a path serializes");
                ("tokenizer".to_string(), json)
            });
            let stored = match a.dtype {
                WeightsDtype::F32 => Stored::F32,
                WeightsDtype::Bf16 => Stored::Bf16,
            };
            let extra = extra.into_iter().collect();
            checkpoint::save_weights(&a.out, &w.config, &w.params, stored, &extra)?;
            eprintln!("{} -> {}", a.source.checkpoint.display(), a.out.display());
        }
    }
    Ok(())
}

fn load(source: &Source) -> Result<(Weights, Bpe)> {
    let w = weights::load(&source.checkpoint, None)?;
    check_llama(&w.config)?;
    let dir = tokenizer_dir(
        source.tokenizer.as_deref(),
        w.tokenizer.as_deref(),
        &source.checkpoint,
    )?;
    let tokenizer =
        Bpe::load(&dir).with_context(|| format!("loading the tokenizer in {}", dir.display()))?;
    Ok((w, tokenizer))
}
