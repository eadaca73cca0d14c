//! `tinylm info`: parameter count, training memory and forward FLOPs of a model.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use tinylm::accounting::{
    forward_flops, forward_matmuls, largest_fitting, largest_micro_batch, InferenceMemory, Memory,
    ParamCounts, RunMemory, RunShape, Target,
};
use tinylm::config::Ffn;
use tinylm::device::Device;
use tinylm::kernels::Precision;
use tinylm::train::TrainConfig;
use tinylm::ModelConfig;

use super::flags::{flag, flag_values, ModelArgs};

/// The keys a model needs when neither `--model-config` nor `--preset` gives it
/// (the others have defaults).
const SHAPE_KEYS: [&str; 6] = [
    "vocab_size",
    "context_length",
    "d_model",
    "num_layers",
    "num_heads",
    "d_ff",
];

/// The flags of `tinylm info`; `--config` is the old spelling of `--model-config`.
#[derive(Args, Debug)]
#[command(mut_arg("model_config", |arg| arg.alias("config")))]
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
    /// GPU arithmetic: bf16 (mixed precision) or fp32.
    #[arg(long, default_value = "bf16")]
    precision: Precision,
    /// The run's token files, whose memory-mapped pages count in its resident memory.
    #[arg(long)]
    train_data: Option<PathBuf>,
    #[arg(long)]
    val_data: Option<PathBuf>,
    /// Also say what fits in this much memory per rank (`16GiB`, `512MiB`, or
    /// bytes; a GPU's with --device cuda): the largest batch, and the largest
    /// micro-batch for --batch-size.
    #[arg(long, alias = "fit-memory", value_parser = parse_bytes)]
    memory: Option<u64>,
}

/// `24GiB`, `24G`, `512MiB`, `512M`, `64KiB` or plain bytes.
fn parse_bytes(text: &str) -> std::result::Result<u64, String> {
    let units = [
        ("GiB", 1u64 << 30),
        ("G", 1 << 30),
        ("MiB", 1 << 20),
        ("M", 1 << 20),
        ("KiB", 1 << 10),
        ("K", 1 << 10),
        ("B", 1),
        ("", 1),
    ];
    let (number, unit) = units
        .iter()
        .find_map(|&(suffix, unit)| Some((text.trim().strip_suffix(suffix)?, unit)))
        .expect("the empty suffix matches");
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 24GiB, 512MiB or 1000000"))?;
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!("{text:?} is not a positive size"));
    }
    Ok((value * unit as f64) as u64)
}

/// The model of `--model-config` or `--preset`, else of the shape flags alone
/// (all of [`SHAPE_KEYS`] given; the ablations as the CS336 model's), with the
/// flags given over it.
fn model(args: &ModelArgs) -> Result<ModelConfig> {
    let base = match args.base()? {
        Some(base) => base,
        None => {
            let given = flag_values(args)?;
            let missing: Vec<String> = SHAPE_KEYS
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
    print!("{}", report(&c, b, t, &memory.step, &launch));
    print!("\n{}", peak_report(&memory, args.train_data.is_some()));
    if let Some(limit) = args.memory {
        print!("\n{}", fit_report(&c, &shape, split.share, limit));
    }
    print!("\n{}", flops_report(&c, b, t));
    Ok(())
}

/// Where a run's memory goes beyond the step's buffers, and its peak.
fn peak_report(m: &RunMemory, files_given: bool) -> String {
    let on_gpu = matches!(m.step.target, Target::Cuda(_));
    let (device, host) = (if on_gpu { "GPU" } else { "host" }, "host");
    let files = match files_given {
        true => bytes_h(m.token_files),
        false => "-".to_string(),
    };
    let checkpoint = match on_gpu {
        true => "pinned staging, the largest tensor",
        false => "written from and read into the buffers",
    };
    let rows = vec![
        row(["", "memory", "bytes"]),
        row(["training step (above)", device, &bytes_h(m.step.total())]),
        row(["evaluation: in the step's buffers", device, "0 B"]),
        row([
            &format!("checkpoints: {checkpoint}"),
            host,
            &bytes_h(m.checkpoint_staging),
        ]),
        row(["token ids of a step", host, &bytes_h(m.batch)]),
        row(["token files, memory-mapped (evictable)", host, &files]),
    ];
    let mut out = format!("Peak memory of the run, per rank\n{}", table(&rows));
    if !files_given {
        out += "  (token files not counted: give --train-data and --val-data)\n";
    }
    match on_gpu {
        true => {
            out += &format!(
                "  GPU memory needed: {} (plus the CUDA context); host: {} and the token files' pages\n",
                bytes_h(m.required()),
                bytes_h(m.host_extra())
            );
        }
        false => {
            out += &format!(
                "  memory needed: {}; peak resident with the token files' pages: {}\n",
                bytes_h(m.required()),
                bytes_h(m.peak_resident())
            );
        }
    }
    out
}

/// One line saying what a model that only runs forward holds (`tinylm generate`,
/// `tinylm forward`).
pub(super) fn inference_line(m: &InferenceMemory, target: Target) -> String {
    let place = match target {
        Target::Cpu => "host memory".to_string(),
        Target::Cuda(p) => format!("GPU memory ({p})"),
    };
    let mut parts = vec![format!("parameters {}", bytes_h(m.parameters))];
    if m.kv_cache > 0 {
        parts.push(format!("KV cache {}", bytes_h(m.kv_cache)));
    }
    parts.push(format!("activations {}", bytes_h(m.activations)));
    format!(
        "memory: {} of {place} ({}), and {} of logits on the host",
        bytes_h(m.total() - m.host_logits),
        parts.join(", "),
        bytes_h(m.host_logits)
    )
}

/// What fits in `limit` per rank: this batch (and in which micro-batches), and the
/// largest batch in one pass per rank.
fn fit_report(c: &ModelConfig, shape: &RunShape, share: usize, limit: u64) -> String {
    let ranks = shape.ranks;
    let needs = |share: usize, micro: usize| shape.memory(c, share, micro).required();
    let t = shape.seq_len;
    let mut out = format!(
        "Fitting in {} per rank ({})\n",
        bytes_h(limit),
        match shape.target {
            Target::Cpu => "host memory".to_string(),
            Target::Cuda(p) => format!("GPU memory, {p}; leave room for the CUDA context"),
        }
    );
    let batch = share * ranks;
    match largest_micro_batch(share, limit, |m| needs(share, m)) {
        Some(m) if m == share => out += &format!(
            "  batch {batch} fits: {} per rank\n",
            bytes_h(needs(share, share))
        ),
        Some(m) => out += &format!(
            "  batch {batch} fits in micro-batches of {m} (--micro-batch-size {m}, {} per step and rank): {} per rank\n",
            share / m,
            bytes_h(needs(share, m))
        ),
        None => out += &format!(
            "  batch {batch} does not fit: even micro-batches of 1 need {} per rank (more ranks with --zero 1 shard the AdamW moments)\n",
            bytes_h(needs(share, 1))
        ),
    }
    match largest_fitting(limit, |m| needs(m, m)) {
        0 => out += &format!("  not even one sequence of {t} tokens per rank fits\n"),
        m => out += &format!(
            "  largest batch without micro-batches: {} sequences of {t} tokens ({} per rank, {} each)\n",
            group((m * ranks) as u64),
            group(m as u64),
            bytes_h(needs(m, m))
        ),
    }
    out
}

/// How a step's batch is run: over `ranks` ranks, in micro-batches of `micro`
/// sequences, with ZeRO stage `zero`.
struct Launch {
    ranks: usize,
    micro: usize,
    zero: u8,
}

/// The three tables as text; `m` is one rank's memory for a step launched so.
fn report(c: &ModelConfig, b: usize, t: usize, m: &Memory, launch: &Launch) -> String {
    let mut out = format!(
        "model: vocab_size {} · context_length {} · d_model {} · num_layers {} · num_heads {} (d_k {}) · d_ff {}\n       norm {} · positional {} · ffn {} · {} · rope_theta {}\n\n",
        group(c.vocab_size as u64),
        group(c.context_length as u64),
        group(c.d_model as u64),
        c.num_layers,
        c.num_heads,
        c.head_dim(),
        group(c.d_ff as u64),
        spelling(&c.norm),
        spelling(&c.positional),
        spelling(&c.ffn),
        if c.tie_embeddings { "tied embeddings" } else { "untied" },
        c.rope_theta,
    );

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
                per_layer.map_or(String::new(), group),
                group(n),
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
        &group(total),
        &format!("({})", count(total)),
        "",
    ]));
    let non_emb = p.non_embedding();
    rows.push(row([
        "non-embedding",
        "",
        &group(non_emb),
        &format!("({})", count(non_emb)),
        &share(non_emb, total),
    ]));
    out += "Parameters\n";
    out += &table(&rows);

    let precision = match m.target {
        Target::Cpu => "f32 on the CPU".to_string(),
        Target::Cuda(Precision::Bf16) => {
            "on a GPU: bf16 activations, f32 weights and moments".to_string()
        }
        Target::Cuda(p) => format!("on a GPU, {p}"),
    };
    out += &format!("\nMemory for a training step ({precision}, AdamW), batch {b} × {t} tokens");
    if launch.micro < b {
        out += &format!(" in micro-batches of {} × {t}", launch.micro);
    }
    if launch.ranks > 1 {
        let zero = if launch.zero == 1 { ", ZeRO-1" } else { "" };
        out += &format!(", one of {} ranks{zero}", launch.ranks);
    }
    out += "\n";
    let mut rows = vec![row(["", "shape", "per layer", "total", "share"])];
    let grand = m.total();
    for (name, bytes) in [
        ("parameters", m.parameters),
        ("parameters' bf16 copy", m.parameter_copy),
        ("gradients", m.gradients),
        ("AdamW moments (m, v)", m.adamw),
        ("collectives' scratch (MPI)", m.collective),
    ]
    .into_iter()
    .filter(|&(_, bytes)| bytes > 0)
    {
        rows.push(row([name, "", "", &bytes_h(bytes), &share(bytes, grand)]));
    }
    let groups = [
        (
            "activations kept for backward:",
            &m.activations,
            m.activation_bytes(),
        ),
        (
            "backward scratch (one block):",
            &m.backward_scratch,
            m.scratch_bytes(),
        ),
        ("kernel work space:", &m.workspace, m.workspace_bytes()),
    ];
    for (title, buffers, bytes) in groups.into_iter().filter(|g| !g.1.is_empty()) {
        rows.push(row([title, "", "", &bytes_h(bytes), &share(bytes, grand)]));
        for a in buffers {
            let per = if a.copies > 1 {
                bytes_h(a.element_bytes * a.elements)
            } else {
                String::new()
            };
            rows.push(row([
                &format!("  {}", a.name),
                &a.shape,
                &per,
                &bytes_h(a.bytes()),
                &share(a.bytes(), grand),
            ]));
        }
    }
    rows.push(row(["total", "", "", &bytes_h(grand), ""]));
    out += &table(&rows);
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
            &format!("({}×{})({}×{})", mm.m, mm.n, mm.n, mm.p),
            &format!("×{}", mm.count),
            &flops_h(mm.flops()),
            &format!("×{}", mm.copies),
            &flops_h(mm.total_flops()),
            &share(mm.total_flops(), fwd),
        ]));
    }
    let tokens = (b * t) as u64;
    rows.push(row(["forward", "", "", "", "", &flops_h(fwd), ""]));
    rows.push(row([
        "training step (≈ 3× forward)",
        "",
        "",
        "",
        "",
        &flops_h(3 * fwd),
        "",
    ]));
    out += &table(&rows);
    out += &format!(
        "per token: {} forward, {} training ({} training FLOPs per parameter per token)\n",
        flops_h(fwd / tokens),
        flops_h(3 * fwd / tokens),
        format_args!("{:.1}", 3.0 * fwd as f64 / tokens as f64 / total as f64),
    );
    out
}

/// An ablation switch's JSON spelling (`pre`, `rope`, `swiglu`, ...).
fn spelling<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

/// Columns padded to their widest cell: the first left-aligned, the rest right.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width = |i: usize| {
        rows.iter()
            .filter_map(|r| r.get(i))
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..cols).map(width).collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            let pad = " ".repeat(widths[i] - cell.chars().count());
            if i == 0 {
                line += &format!("  {cell}{pad}");
            } else {
                line += &format!("  {pad}{cell}");
            }
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

/// `1234567` → `1,234,567`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// `x` scaled to the largest unit it reaches (`units[k]` = `base^k`), 3 significant digits.
fn scaled(x: f64, base: f64, units: &[&str]) -> String {
    let mut k = 0;
    let mut v = x;
    while v >= base && k + 1 < units.len() {
        v /= base;
        k += 1;
    }
    let digits = match v {
        _ if k == 0 || v >= 100.0 => 0,
        _ if v >= 10.0 => 1,
        _ => 2,
    };
    format!("{v:.digits$} {}", units[k]).trim_end().to_string()
}

fn count(n: u64) -> String {
    scaled(n as f64, 1000.0, &["", "K", "M", "B", "T"])
}

pub(super) fn bytes_h(n: u64) -> String {
    scaled(n as f64, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB", "PiB"])
}

fn flops_h(n: u64) -> String {
    scaled(
        n as f64,
        1000.0,
        &["FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_grouping() {
        assert_eq!(group(2_127_057_600), "2,127,057,600");
        assert_eq!(group(999), "999");
        assert_eq!(count(2_127_057_600), "2.13 B");
        assert_eq!(count(512), "512");
        assert_eq!(flops_h(4_513_336_524_800), "4.51 TFLOP");
        assert_eq!(bytes_h(3 << 30), "3.00 GiB");
        assert_eq!(parse_bytes("24GiB"), Ok(24 << 30));
        assert_eq!(parse_bytes("1.5 M"), Ok(3 << 19));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("lots").unwrap_err().contains("\"lots\""));
        assert_eq!(bytes_h(1000), "1000 B");
    }

    #[test]
    fn gpt2_xl_report_has_the_reference_numbers() {
        let c = ModelConfig::gpt2_xl();
        let single = Launch {
            ranks: 1,
            micro: 1,
            zero: 0,
        };
        let text = report(&c, 1, 1024, &Memory::new(&c, 1, 1024, Target::Cpu), &single)
            + &flops_report(&c, 1, 1024);
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
