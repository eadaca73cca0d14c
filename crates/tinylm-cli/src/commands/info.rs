//! `tinylm info`: parameter count, training memory and forward FLOPs of a model.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use tinylm::accounting::{forward_flops, forward_matmuls, ParamCounts, RunShape};
use tinylm::config::Ffn;
use tinylm::device::{self, describe_precision, Device};
use tinylm::kernels::Precision;
use tinylm::train::TrainConfig;
use tinylm::ModelConfig;

use super::flags::{flag, flag_values, ModelArgs};
use memory::{fit_report, peak_report, step_report, Launch};
use tinylm::text::{count, flop_count, parse_byte_size, row, table, thousands};

mod memory;

/// The flags of `tinylm info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Sequences per batch (per optimizer step, over all ranks) for the memory and
    /// FLOP tables.
    #[arg(long, default_value_t = 1)]
    batch_size: usize,
    /// Sequences per forward/backward [default: a rank's whole share]: the memory
    /// table's activations are for one micro-batch.
    #[arg(long)]
    micro_batch_size: Option<usize>,
    /// Ranks the batch is split over (the memory table is one rank's).
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// ZeRO stage of the run: 1 shards the AdamW moments over the ranks.
    #[arg(long, default_value_t = 0)]
    zero: u8,
    /// Tokens per sequence (default: the context length).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Where the run trains: cpu, or cuda (a GPU's memory, in --precision).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Arithmetic: bf16 (mixed precision), fp32, or auto (bf16 where the CPU or GPU
    /// multiplies bf16 natively, else fp32).
    #[arg(long, default_value_t)]
    precision: Precision,
    /// The run's token files, whose memory-mapped pages count in its resident memory.
    #[arg(long)]
    train_data: Option<PathBuf>,
    #[arg(long)]
    val_data: Option<PathBuf>,
    /// Also say what fits in this much memory per rank (`16GiB`, `512MiB`, or
    /// bytes; a GPU's with --device cuda): the largest batch, and the largest
    /// micro-batch for --batch-size.
    #[arg(long, alias = "fit-memory", value_parser = parse_byte_size)]
    memory: Option<u64>,
    /// Print the model's configuration as JSON (a `--model-config` file: `tinylm
    /// info --preset tinystories --print-config > model.json`) and nothing else.
    #[arg(long)]
    print_config: bool,
}

/// The model of `--model-config` or `--preset`, else of the shape flags alone
/// (all of [`ModelConfig::SHAPE_KEYS`] given; the ablations as the CS336 model's), with the
/// flags given over it.
fn model(args: &ModelArgs) -> Result<ModelConfig> {
    let base = match args.base()? {
        Some(base) => base,
        None => {
            let given = flag_values(args)?;
            let missing: Vec<String> = ModelConfig::SHAPE_KEYS
                .iter()
                .filter(|key| !given.contains_key(**key))
                .map(|key| flag(key))
                .collect();
            if !missing.is_empty() {
                bail!(
                    "give --model-config, --preset or all shape flags (missing {})",
                    missing.join(", ")
                );
            }
            ModelConfig::tinystories()
        }
    };
    args.apply(base)
}

pub fn run(args: InfoArgs) -> Result<()> {
    let c = model(&args.model).context("model configuration")?;
    if args.print_config {
        println!("{}", c.to_json());
        return Ok(());
    }
    let (b, t) = (args.batch_size, args.seq_len.unwrap_or(c.context_length));
    if b == 0 || t == 0 {
        bail!("--batch-size and --seq-len must be positive");
    }
    if t > c.context_length {
        bail!(
            "--seq-len {t} exceeds the context length {}",
            c.context_length
        );
    }
    if args.ranks == 0 || args.zero > 1 {
        bail!("--ranks must be positive and --zero 0 or 1");
    }
    for path in [&args.train_data, &args.val_data].into_iter().flatten() {
        std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    }
    let run = TrainConfig {
        model: c.clone(),
        batch_size: b,
        micro_batch_size: args.micro_batch_size,
        device: args.device,
        precision: args.precision,
        zero: args.zero,
        train_data: args.train_data.clone().unwrap_or_default(),
        val_data: args.val_data.clone(),
        ..TrainConfig::default()
    };
    run.check_scale()?;
    let split = run.batch_split(args.ranks)?;
    let shape = RunShape {
        seq_len: t,
        ..RunShape::of(&run, args.ranks)?
    };
    let memory = shape.memory(&c, split.share, split.micro);
    let launch = Launch {
        ranks: args.ranks,
        micro: split.micro,
        zero: args.zero,
    };
    print!("{}", model_report(&c));
    let device = match args.device {
        Device::Auto => device::resolve(Device::Auto)?,
        device => device,
    };
    println!(
        "\nprecision: {}",
        describe_precision(device, args.precision)
    );
    print!("\n{}", step_report(b, t, &memory.step, &launch));
    print!("\n{}", peak_report(&memory, args.train_data.is_some()));
    if let Some(limit) = args.memory {
        print!("\n{}", fit_report(&c, &shape, split.share, limit));
    }
    print!("\n{}", flops_report(&c, b, t));
    Ok(())
}

/// The model and its parameters by component, as text.
fn model_report(c: &ModelConfig) -> String {
    let mut out = c.describe() + "\n\n";

    let p = ParamCounts::new(c);
    let total = p.total();
    let share = |n: u64, of: u64| format!("{:.1}%", 100.0 * n as f64 / of as f64);
    let layers = p.num_layers;
    let ffn_names = if c.ffn == Ffn::Swiglu {
        "w1, w2, w3"
    } else {
        "w1, w2"
    };
    let mut rows = vec![row(["component", "per layer", "total", "", "share"])];
    let mut component = |name: String, per_layer: Option<u64>, n: u64| {
        if n > 0 {
            rows.push(vec![
                name,
                per_layer.map_or(String::new(), thousands),
                thousands(n),
                format!("({})", count(n)),
                share(n, total),
            ]);
        }
    };
    component("token_embeddings".into(), None, p.embedding);
    let per_layer = |name: &str, n: u64| (format!("{name} × {layers}"), Some(n), n * layers);
    let (name, per, n) = per_layer("attention (q, k, v, output_proj)", p.attention_per_layer);
    component(name, per, n);
    let (name, per, n) = per_layer(&format!("ffn ({ffn_names})"), p.ffn_per_layer);
    component(name, per, n);
    let (name, per, n) = per_layer("norms (ln1, ln2)", p.norms_per_layer);
    component(name, per, n);
    component("ln_final".into(), None, p.ln_final);
    component("lm_head".into(), None, p.lm_head);
    rows.push(row([
        "total",
        "",
        &thousands(total),
        &format!("({})", count(total)),
        "",
    ]));
    let non_emb = p.non_embedding();
    rows.push(row([
        "non-embedding",
        "",
        &thousands(non_emb),
        &format!("({})", count(non_emb)),
        &share(non_emb, total),
    ]));
    out += "Parameters\n";
    out += &table(&rows, 2, 1);

    out
}

/// The matmuls of one forward pass over `b × t` tokens, their FLOPs and shares.
fn flops_report(c: &ModelConfig, b: usize, t: usize) -> String {
    let total = ParamCounts::new(c).total();
    let share = |n: u64, of: u64| format!("{:.1}%", 100.0 * n as f64 / of as f64);
    let matmuls = forward_matmuls(c, b, t);
    let fwd = forward_flops(c, b, t);
    let mut out =
        format!("Matmuls of one forward pass, batch {b} × {t} tokens (2mnp FLOPs each)\n");
    let mut rows = vec![row([
        "matmul",
        "(m×n)(n×p)",
        "count",
        "FLOPs",
        "× layers",
        "total",
        "share",
    ])];
    for mm in &matmuls {
        rows.push(row([
            mm.name,
            &format!(
                "({}×{})({}×{})",
                mm.shape.m, mm.shape.k, mm.shape.k, mm.shape.n
            ),
            &format!("×{}", mm.count),
            &flop_count(mm.flops()),
            &format!("×{}", mm.copies),
            &flop_count(mm.total_flops()),
            &share(mm.total_flops(), fwd),
        ]));
    }
    let tokens = (b * t) as u64;
    rows.push(row(["forward", "", "", "", "", &flop_count(fwd), ""]));
    rows.push(row([
        "training step (≈ 3× forward)",
        "",
        "",
        "",
        "",
        &flop_count(3 * fwd),
        "",
    ]));
    out += &table(&rows, 2, 1);
    out += &format!(
        "per token: {} forward, {} training ({} training FLOPs per parameter per token)\n",
        flop_count(fwd / tokens),
        flop_count(3 * fwd / tokens),
        format_args!("{:.1}", 3.0 * fwd as f64 / tokens as f64 / total as f64),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tinylm::accounting::Memory;
    use tinylm::kernels::BackendKind;

    #[test]
    fn gpt2_xl_report_has_the_reference_numbers() {
        let c = ModelConfig::gpt2_xl();
        let single = Launch {
            ranks: 1,
            micro: 1,
            zero: 0,
        };
        let step = Memory::new(&c, 1, 1024, BackendKind::Cpu);
        let text =
            model_report(&c) + &step_report(1, 1024, &step, &single) + &flops_report(&c, 1, 1024);
        for part in [
            "2,127,057,600",
            "(2.13 B)",
            "4.51 TFLOP",
            "13.5 TFLOP",
            "lm_head",
            "Q Kᵀ",
        ] {
            assert!(text.contains(part), "{part} missing from\n{text}");
        }
    }
}
