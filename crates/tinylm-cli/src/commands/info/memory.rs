//! `tinylm info`'s memory tables: a training step's buffers as the model declares
//! them (from the accounting's record), the run's peak, and what fits in a limit.

use tinylm::accounting::{largest_fitting, largest_micro_batch, Memory, Part, RunMemory, RunShape};
use tinylm::kernels::{BackendKind, Precision};
use tinylm::text::{byte_size, row, table, thousands};
use tinylm::ModelConfig;

/// How a step's batch is run: over `ranks` ranks, in micro-batches of `micro`
/// sequences, with ZeRO stage `zero`.
pub struct Launch {
    pub ranks: usize,
    pub micro: usize,
    pub zero: u8,
}

/// The parts that print as one line, named.
const WHOLE: [(Part, &str); 5] = [
    (Part::Parameters, "parameters"),
    (Part::Gradients, "gradients"),
    (Part::Moments, "AdamW moments (m, v)"),
    (Part::RopeTables, "RoPE tables (cos, sin)"),
    (Part::Statistics, "step statistics"),
];

/// The parts that print a line per buffer, titled.
const BY_BUFFER: [(Part, &str); 3] = [
    (Part::Activations, "activations kept for backward:"),
    (Part::BackwardScratch, "backward scratch (one block):"),
    (Part::Workspace, "kernel work space:"),
];

/// The memory of a training step of `b × t` tokens as text; `m` is one rank's for
/// a step launched so: a line per part, and per buffer of the activations, the
/// backward scratch and the work space (a block's buffers once, with their bytes
/// per layer).
pub fn step_report(b: usize, t: usize, m: &Memory, launch: &Launch) -> String {
    let mut out = String::new();
    let share = |n: u64, of: u64| format!("{:.1}%", 100.0 * n as f64 / of as f64);
    let precision = match m.backend {
        BackendKind::Cpu | BackendKind::CpuQ8 => "f32 on the CPU".to_string(),
        BackendKind::CpuBf16 => {
            "on the CPU: bf16 product-only activations, f32 weights and moments".to_string()
        }
        BackendKind::Cuda(Precision::Bf16) => {
            "on a GPU: bf16 activations, f32 weights and moments".to_string()
        }
        BackendKind::Cuda(p) => format!("on a GPU, {p}"),
    };
    out += &format!("Memory for a training step ({precision}, AdamW), batch {b} × {t} tokens");
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
    let whole = WHOLE.map(|(part, name)| match (part, m.backend) {
        (Part::Parameters, BackendKind::Cuda(Precision::Bf16) | BackendKind::CpuBf16) => {
            ("parameters and their bf16 copy", m.bytes(part))
        }
        _ => (name, m.bytes(part)),
    });
    let collective = ("collectives' scratch (MPI)", m.collective);
    for (name, bytes) in whole.into_iter().chain([collective]) {
        if bytes > 0 {
            rows.push(row([name, "", "", &byte_size(bytes), &share(bytes, grand)]));
        }
    }
    for (part, title) in BY_BUFFER {
        let bytes = m.bytes(part);
        if bytes == 0 {
            continue;
        }
        rows.push(row([
            title,
            "",
            "",
            &byte_size(bytes),
            &share(bytes, grand),
        ]));
        // One line per name: a block's buffers are one name in every layer.
        let mut names: Vec<(&str, &str, u64, u64)> = Vec::new();
        for e in m.buffers.iter().filter(|e| e.part == part && e.bytes > 0) {
            match names.iter_mut().find(|n| n.0 == e.role.name) {
                Some(n) => (n.2, n.3) = (n.2 + e.bytes, n.3 + 1),
                None => names.push((e.role.name, e.role.shape, e.bytes, 1)),
            }
        }
        for (name, shape, bytes, copies) in names {
            let per = match copies {
                1 => String::new(),
                _ => byte_size(bytes / copies),
            };
            let name = format!("  {name}");
            rows.push(row([
                &name,
                shape,
                &per,
                &byte_size(bytes),
                &share(bytes, grand),
            ]));
        }
    }
    rows.push(row(["total", "", "", &byte_size(grand), ""]));
    out += &table(&rows, 2, 1);
    out
}

/// Where a run's memory goes beyond the step's buffers, and its peak.
pub fn peak_report(m: &RunMemory, files_given: bool) -> String {
    let on_gpu = m.step.backend.on_gpu();
    let (device, host) = (if on_gpu { "GPU" } else { "host" }, "host");
    let files = match files_given {
        true => byte_size(m.token_files),
        false => "-".to_string(),
    };
    let checkpoint = match on_gpu {
        true => "pinned staging, the largest tensor",
        false => "written from and read into the buffers",
    };
    let rows = vec![
        row(["", "memory", "bytes"]),
        row(["training step (above)", device, &byte_size(m.step.total())]),
        row(["evaluation: in the step's buffers", device, "0 B"]),
        row([
            &format!("checkpoints: {checkpoint}"),
            host,
            &byte_size(m.checkpoint_staging),
        ]),
        row(["token ids of a step", host, &byte_size(m.batch)]),
        row(["token files, memory-mapped (evictable)", host, &files]),
    ];
    let mut out = format!("Peak memory of the run, per rank\n{}", table(&rows, 2, 1));
    if !files_given {
        out += "  (token files not counted: give --train-data and --val-data)\n";
    }
    match on_gpu {
        true => {
            out += &format!(
                "  GPU memory needed: {} (plus the CUDA context); host: {} and the token files' pages\n",
                byte_size(m.required()),
                byte_size(m.host_extra())
            );
        }
        false => {
            out += &format!(
                "  memory needed: {}; peak resident with the token files' pages: {}\n",
                byte_size(m.required()),
                byte_size(m.peak_resident())
            );
        }
    }
    out
}

/// What fits in `limit` per rank: this batch (and in which micro-batches), and the
/// largest batch in one pass per rank.
pub fn fit_report(c: &ModelConfig, shape: &RunShape, share: usize, limit: u64) -> String {
    let ranks = shape.ranks;
    let needs = |share: usize, micro: usize| shape.memory(c, share, micro).required();
    let t = shape.seq_len;
    let mut out = format!(
        "Fitting in {} per rank ({})\n",
        byte_size(limit),
        match shape.backend {
            BackendKind::Cpu | BackendKind::CpuBf16 | BackendKind::CpuQ8 =>
                "host memory".to_string(),
            BackendKind::Cuda(p) => format!("GPU memory, {p}; leave room for the CUDA context"),
        }
    );
    let batch = share * ranks;
    match largest_micro_batch(share, limit, |m| needs(share, m)) {
        Some(m) if m == share => out += &format!(
            "  batch {batch} fits: {} per rank\n",
            byte_size(needs(share, share))
        ),
        Some(m) => out += &format!(
            "  batch {batch} fits in micro-batches of {m} (--micro-batch-size {m}, {} per step and rank): {} per rank\n",
            share / m,
            byte_size(needs(share, m))
        ),
        None => out += &format!(
            "  batch {batch} does not fit: even micro-batches of 1 need {} per rank (more ranks with --zero 1 shard the AdamW moments)\n",
            byte_size(needs(share, 1))
        ),
    }
    match largest_fitting(limit, |m| needs(m, m)) {
        0 => out += &format!("  not even one sequence of {t} tokens per rank fits\n"),
        m => out += &format!(
            "  largest batch without micro-batches: {} sequences of {t} tokens ({} per rank, {} each)\n",
            thousands((m * ranks) as u64),
            thousands(m as u64),
            byte_size(needs(m, m))
        ),
    }
    out
}
