//! `tinylm bench`: training-step throughput of the CPU engine (forward, backward,
//! AdamW update), its achieved GFLOP/s, where the step's time goes, and the peak of
//! the matrix-product library on the step's own shapes.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::time::Instant;
use tinylm::config::{Ffn, ModelConfig};
use tinylm::device::{resolve, run_on, BackendTask, Device};
use tinylm::kernels::cpu::linear::{matmul, matmul_isa};
use tinylm::kernels::cpu::memory::zeroed;
use tinylm::kernels::{profile::Kind, AdamWParams, Backend, Cpu, MatMul, Profiled};
use tinylm::{Model, Result as LmResult};

use super::flags::{show_defaults, DeviceArgs, ModelArgs};

/// The flags of `tinylm bench`; `--config` is the old spelling of `--model-config`.
#[derive(Args, Debug)]
#[command(mut_args = show_defaults(&default_model_config()))]
#[command(mut_arg("model_config", |arg| arg.alias("config")))]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Tokens per sequence (default: the context length).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed training steps (after two warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Skip the matrix-product peak measurement.
    #[arg(long)]
    no_peak: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

/// The model timed unless `--model-config` or `--preset` names another: the
/// benchmark model of bench/configs/bench-small.json (4 layers, d_model 256, a
/// vocabulary of 4,096 and a context of 128 tokens), the CS336 architecture.
fn default_model_config() -> ModelConfig {
    ModelConfig {
        vocab_size: 4096,
        context_length: 128,
        d_model: 256,
        num_layers: 4,
        num_heads: 8,
        d_ff: 704,
        ..ModelConfig::tinystories()
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    let base = args.model.base()?.unwrap_or_else(default_model_config);
    let config = args.model.apply(base).context("model configuration")?;
    let (b, t) = (
        args.batch_size,
        args.seq_len.unwrap_or(config.context_length),
    );
    if b == 0 || t == 0 || t > config.context_length {
        bail!(
            "--batch-size must be positive and --seq-len in 1..={}",
            config.context_length
        );
    }
    if args.threads == 0 || args.steps == 0 {
        bail!("--threads and --steps must be at least 1");
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .context("cannot start the thread pool")?
        .install(|| bench(&config, b, t, &args))
}

/// Model FLOPs of one training step: 6 per parameter of every matrix product
/// (forward 2, backward 4) per token, plus attention's `QKᵀ` and `PV` as full `T×T`
/// products (the usual model-FLOPs count; the kernels skip most of the masked
/// triangle), 3× forward.
fn step_flops(c: &ModelConfig, b: usize, t: usize) -> f64 {
    let (d, f) = (c.d_model as f64, c.d_ff as f64);
    let ffn_mats = if c.ffn == Ffn::Swiglu { 3.0 } else { 2.0 };
    let matmul_params =
        c.num_layers as f64 * (4.0 * d * d + ffn_mats * d * f) + c.vocab_size as f64 * d;
    let tokens = (b * t) as f64;
    let attention = c.num_layers as f64 * 3.0 * 4.0 * b as f64 * (t * t) as f64 * d;
    6.0 * matmul_params * tokens + attention
}

fn bench(c: &ModelConfig, b: usize, t: usize, args: &BenchArgs) -> Result<()> {
    let n = b * t;
    // Uniform random tokens: the step's cost does not depend on them.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut tokens = |len: usize| -> Vec<u32> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % c.vocab_size as u64) as u32
            })
            .collect()
    };
    let (ids, targets) = (tokens(n), tokens(n));
    let flops = step_flops(c, b, t);
    println!(
        "model: vocab {} · ctx {} · d_model {} · {} layers · {} heads · d_ff {} · {:?}/{:?}/{:?}",
        c.vocab_size,
        c.context_length,
        c.d_model,
        c.num_layers,
        c.num_heads,
        c.d_ff,
        c.norm,
        c.positional,
        c.ffn
    );
    println!(
        "step: batch {b} x {t} tokens, {} threads, {:.1} GFLOP per step (6·N·tokens + attention)",
        rayon::current_num_threads(),
        flops * 1e-9
    );
    let device = resolve(args.device.device)?;
    if device == Device::Cpu {
        println!(
            "matrix products: gemm's {} kernels (chosen at run time for this CPU)",
            matmul_isa()
        );
    } else {
        println!("device: {device}, precision {}", args.device.precision);
    }
    // The products' peak is measured between the timed steps, so that both see the
    // same machine: on a shared one, a product timed alone after the steps (or a step
    // alone) may catch a quiet moment the other never had.
    let mut peak = (device == Device::Cpu && !args.no_peak).then(|| PeakProducts::new(c, n));
    let timed = TimedSteps {
        c,
        ids: &ids,
        targets: &targets,
        b,
        t,
        steps: args.steps,
        peak: peak.as_mut(),
    };
    let (mut times, loss, cpu_per_step, params) = run_on(device, args.device.precision, timed)?;
    // Each step's GFLOP/s over the product peak timed right after it (same machine state).
    let paired: Option<Vec<f64>> = peak.as_ref().map(|p| {
        let mut shares: Vec<f64> = (times.iter().zip(&p.round_peaks))
            .map(|(s, peak)| flops / s * 1e-9 / peak)
            .collect();
        shares.sort_by(f64::total_cmp);
        shares
    });
    times.sort_by(f64::total_cmp);
    let (best, median) = (times[0], times[times.len() / 2]);
    println!(
        "\ntraining step (forward + backward + AdamW), {} steps, loss {loss:.3}:",
        args.steps
    );
    println!(
        "  best   {:>8.1} ms  {:>8.0} tokens/s  {:>6.1} GFLOP/s",
        best * 1e3,
        n as f64 / best,
        flops / best * 1e-9
    );
    println!(
        "  median {:>8.1} ms  {:>8.0} tokens/s  {:>6.1} GFLOP/s",
        median * 1e3,
        n as f64 / median,
        flops / median * 1e-9
    );
    if device != Device::Cpu {
        return Ok(());
    }

    if let Some(cpu) = cpu_per_step {
        let threads = rayon::current_num_threads() as f64;
        println!(
            "  CPU time {:.1} ms per step over all threads; / {threads} threads = {:.1} ms \
             ({:.0} tokens/s if the threads had their cores to themselves)",
            cpu * 1e3,
            cpu / threads * 1e3,
            n as f64 * threads / cpu
        );
    }

    breakdown(c, params, &ids, &targets, b, t)?;
    if let (Some(peak), Some(shares)) = (peak, paired) {
        let peak = peak.report();
        let step = flops / best * 1e-9;
        println!(
            "\nwhole step (best) {step:.1} GFLOP/s = {:.0}% of the measured matrix-product peak \
             {peak:.1} GFLOP/s ({})",
            100.0 * step / peak,
            matmul_isa()
        );
        println!(
            "each step against the peak of the products timed right after it: median {:.0}% \
             (lowest {:.0}%, highest {:.0}%, {} steps)",
            100.0 * shares[shares.len() / 2],
            100.0 * shares[0],
            100.0 * shares[shares.len() - 1],
            shares.len()
        );
    }
    Ok(())
}

/// Two warm-up steps, then `steps` timed training steps on any backend, each
/// waiting for its kernels; the step times, the last loss, the CPU seconds per
/// timed step (all threads) and the final parameters.
struct TimedSteps<'a> {
    c: &'a ModelConfig,
    ids: &'a [u32],
    targets: &'a [u32],
    b: usize,
    t: usize,
    steps: usize,
    /// Products timed once after each timed step.
    peak: Option<&'a mut PeakProducts>,
}

impl BackendTask for TimedSteps<'_> {
    type Output = (Vec<f64>, f32, Option<f64>, Vec<f32>);

    fn run<B: Backend<f32>>(mut self, backend: B) -> LmResult<Self::Output> {
        let mut model = Model::init_with_backend(self.c.clone(), 0, backend)?;
        let mut opt = model.new_adamw(AdamWParams {
            beta2: 0.95,
            weight_decay: 0.1,
            ..AdamWParams::default()
        })?;
        // The training loop's step (clipping included), timed until its statistics
        // reach the host.
        let mut step = |model: &mut Model<f32, B>| -> LmResult<f32> {
            let (ids, targets) = (self.ids, self.targets);
            model.train_step(ids, targets, self.b, self.t, &mut opt, 1e-3, Some(1.0))?;
            Ok(model.step_stats()?.loss as f32)
        };
        for _ in 0..2 {
            step(&mut model)?;
        }
        let mut times = Vec::with_capacity(self.steps);
        let mut loss = 0.0;
        // CPU seconds of the steps alone (not of the peak products between them).
        let mut cpu = Some(0.0);
        for _ in 0..self.steps {
            let (start, cpu_start) = (Instant::now(), cpu_seconds());
            loss = step(&mut model)?;
            times.push(start.elapsed().as_secs_f64());
            cpu = cpu
                .zip(cpu_seconds().zip(cpu_start))
                .map(|(sum, (end, start))| sum + end - start);
            if let Some(peak) = self.peak.as_deref_mut() {
                peak.time_each();
            }
        }
        let cpu_per_step = cpu.map(|sum| sum / self.steps as f64);
        Ok((times, loss, cpu_per_step, model.download_params()?))
    }
}

/// Re-runs a few steps with every kernel call timed and prints the split per kind.
fn breakdown(
    c: &ModelConfig,
    params: Vec<f32>,
    ids: &[u32],
    targets: &[u32],
    b: usize,
    t: usize,
) -> Result<()> {
    let mut model = Model::with_backend(c.clone(), &params, Profiled::new(Cpu))?;
    let mut opt = model.new_adamw(AdamWParams::default())?;
    let steps = 5;
    let mut total = 0.0;
    for i in 0..=steps {
        if i == 1 {
            model.backend().reset();
            total = 0.0;
        }
        let start = Instant::now();
        model.forward_loss(ids, targets, b, t)?;
        model.backward()?;
        model.adamw_step(&mut opt, 1e-3, None);
        total += start.elapsed().as_secs_f64();
    }
    let per_step = |s: f64| s / steps as f64 * 1e3;
    println!("\nwhere a step's time goes (mean of {steps} timed steps):");
    let seconds = model.backend().seconds();
    let mut rows: Vec<(String, f64)> = seconds
        .iter()
        .map(|&(k, s)| (k.name().to_string(), s))
        .collect();
    let accounted: f64 = rows.iter().map(|r| r.1).sum();
    rows.push(("other (orchestration)".into(), (total - accounted).max(0.0)));
    for (name, s) in &rows {
        let extra = if name.starts_with("matmul") {
            let matmul_s = seconds
                .iter()
                .find(|r| r.0 == Kind::Matmul)
                .map_or(0.0, |r| r.1);
            format!(
                "  {:>6.1} GFLOP/s",
                model.backend().matmul_flops() as f64 / matmul_s * 1e-9
            )
        } else {
            String::new()
        };
        println!(
            "  {name:<34} {:>7.2} ms  {:>5.1}%{extra}",
            per_step(*s),
            100.0 * s / total
        );
    }
    println!("  {:<34} {:>7.2} ms", "total", per_step(total));
    Ok(())
}

/// The matrix-product library alone on the step's distinct shapes, each timed once
/// per [`PeakProducts::time_each`]; the peak is the best GFLOP/s of any.
struct PeakProducts {
    products: Vec<Product>,
    /// The best GFLOP/s of any product, round by round.
    round_peaks: Vec<f64>,
}

/// One product of [`PeakProducts`]: its operands and its best time so far.
struct Product {
    name: &'static str,
    shape: MatMul,
    a: Vec<f32>,
    b: Vec<f32>,
    out: Vec<f32>,
    best_s: f64,
}

impl PeakProducts {
    fn new(c: &ModelConfig, n: usize) -> Self {
        let (d, f, v) = (c.d_model, c.d_ff, c.vocab_size);
        let shapes = [
            ("qkv      x·Wᵀ", MatMul::linear(n, d, 3 * d)),
            ("w1/w3    x·Wᵀ", MatMul::linear(n, d, f)),
            ("w2       x·Wᵀ", MatMul::linear(n, f, d)),
            ("lm_head  x·Wᵀ", MatMul::linear(n, d, v)),
            ("w1/w3    dy·W", MatMul::linear_dx(n, d, f)),
            ("lm_head  dy·W", MatMul::linear_dx(n, d, v)),
            ("w1/w3    dyᵀ·x", MatMul::linear_dw(n, d, f)),
            ("lm_head  dyᵀ·x", MatMul::linear_dw(n, d, v)),
        ];
        let products = shapes
            .into_iter()
            .map(|(name, s)| {
                // Allocated as the step's buffers are (huge pages where they exist).
                let filled = |len, value| {
                    let mut buf = zeroed(len);
                    buf.fill(value);
                    buf
                };
                Product {
                    name,
                    shape: s,
                    a: filled(s.m * s.k, 0.5),
                    b: filled(s.k * s.n, 0.25),
                    out: zeroed(s.m * s.n),
                    best_s: f64::MAX,
                }
            })
            .collect();
        PeakProducts {
            products,
            round_peaks: Vec::new(),
        }
    }

    /// Times every product once (one round).
    fn time_each(&mut self) {
        let mut round_peak = 0f64;
        for p in &mut self.products {
            let start = Instant::now();
            matmul(&mut p.out, &p.a, &p.b, p.shape);
            let seconds = start.elapsed().as_secs_f64();
            p.best_s = p.best_s.min(seconds);
            round_peak = round_peak.max(p.shape.flops() as f64 / seconds * 1e-9);
        }
        self.round_peaks.push(round_peak);
    }

    /// Prints each product's best GFLOP/s; returns the peak.
    fn report(&self) -> f64 {
        println!(
            "\nmatrix-product peak (gemm crate, best of {} rounds, each after a timed step):",
            self.round_peaks.len()
        );
        let mut peak = 0f64;
        for p in &self.products {
            let s = p.shape;
            let gflops = s.flops() as f64 / p.best_s * 1e-9;
            peak = peak.max(gflops);
            println!(
                "  {:<16} ({:>5} x {:>5} x {:>5})  {:>6.1} GFLOP/s",
                p.name, s.m, s.k, s.n, gflops
            );
        }
        println!("  peak {peak:.1} GFLOP/s");
        peak
    }
}

/// CPU seconds this process's threads have run so far (Linux; `None` elsewhere).
/// Unlike wall-clock time it does not count time lost to other processes, so it
/// shows the engine's own cost on a busy machine.
fn cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 * 1e-9)
}
