//! `tinylm bench`: training-step throughput of the CPU engine (forward, backward,
//! AdamW update), its achieved GFLOP/s, where the step's time goes, and the peak of
//! the matrix-product library on the step's own shapes.
//!
//! Started by a launcher (`mpirun -np R`, `srun`), every rank runs its share of the
//! step's batch as `tinylm train` does, the gradient summed over the ranks between
//! backward and AdamW, and rank 0 reports the step over all ranks and the gradient
//! all-reduce alone: its time, its bandwidth and its share of the step.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::time::Instant;
use tinylm::accounting::training_flops;
use tinylm::config::ModelConfig;
use tinylm::data::SplitMix64;
use tinylm::device::{rank_device, run_on, BackendTask, Device};
use tinylm::distributed::{Reduce, World};
use tinylm::kernels::cpu::linear::{matmul, matmul_isa};
use tinylm::kernels::cpu::memory::zeroed;
use tinylm::kernels::{profile::Kind, AdamWParams, Backend, BatchPart, BufKind, Buffer};
use tinylm::kernels::{Collective, Cpu, MatMul, Profiled};
use tinylm::params::ParamLayout;
use tinylm::text::byte_size;
use tinylm::{Model, Result as LmResult};

use super::flags::{show_defaults, DeviceArgs, ModelArgs};
use super::ranks::as_rank;

/// The flags of `tinylm bench`; `--config` is the old spelling of `--model-config`.
#[derive(Args, Debug)]
#[command(mut_args = show_defaults(&default_model_config()))]
#[command(mut_arg("model_config", |arg| arg.alias("config")))]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Sequences per step, over all ranks.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Tokens per sequence (default: the context length).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Worker threads (per rank).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed training steps (after two warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Skip the matrix-product peak measurement.
    #[arg(long)]
    no_peak: bool,
    /// Under a launcher (`mpirun -np R`): time the all-reduce alone, on buffers of
    /// 4 KiB to 256 MiB and of the model's gradient, instead of training steps.
    #[arg(long)]
    allreduce_only: bool,
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

/// Benchmarks as one rank of the ranks a launcher (`mpirun`, `srun`) started, or
/// alone ([`as_rank`]).
pub fn run(args: BenchArgs) -> Result<()> {
    as_rank(|world| run_rank(args, world))
}

fn run_rank(args: BenchArgs, world: &World) -> Result<()> {
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
    let ranks = world.ranks();
    if !b.is_multiple_of(ranks) {
        bail!("--batch-size {b} does not divide over {ranks} ranks: choose a multiple of {ranks}");
    }
    if args.allreduce_only && ranks == 1 {
        bail!(
            "--allreduce-only times the ranks' all-reduce: start tinylm bench under `mpirun -np R`"
        );
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .context("cannot start the thread pool")?
        .install(|| match args.allreduce_only {
            true => bench_all_reduce(&config, &args, world),
            false => bench(&config, b, t, &args, world),
        })
}

fn bench(c: &ModelConfig, b: usize, t: usize, args: &BenchArgs, world: &World) -> Result<()> {
    let (ranks, root) = (world.ranks(), world.is_root());
    let n = b * t;
    // Uniform random tokens: the step's cost does not depend on them.
    let mut rng = SplitMix64::new(0x2545_f491_4f6c_dd1d);
    let mut tokens = |len: usize| -> Vec<u32> {
        let vocab = c.vocab_size as u64;
        (0..len).map(|_| rng.below(vocab) as u32).collect()
    };
    // The whole batch on every rank, each taking its share.
    let (ids, targets) = (tokens(n), tokens(n));
    let share = b / ranks;
    let mine = world.rank() * share * t..(world.rank() + 1) * share * t;
    let flops = training_flops(c, b, t) as f64;
    let device = rank_device(args.device.device, world)?;
    if root {
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
        let threads = rayon::current_num_threads();
        match ranks {
            1 => println!(
                "step: batch {b} x {t} tokens, {threads} threads, {:.1} GFLOP per step \
                 (6·N·tokens + attention)",
                flops * 1e-9
            ),
            _ => println!(
                "step: batch {b} x {t} tokens over {ranks} ranks ({share} sequences each), \
                 {threads} threads per rank, {:.1} GFLOP per step (6·N·tokens + attention)",
                flops * 1e-9
            ),
        }
        if device == Device::Cpu {
            println!(
                "matrix products: gemm's {} kernels (chosen at run time for this CPU)",
                matmul_isa()
            );
        } else {
            println!("device: {device}, precision {}", args.device.precision);
        }
    }
    // The products' peak is measured between the timed steps, so that both see the
    // same machine: on a shared one, a product timed alone after the steps (or a step
    // alone) may catch a quiet moment the other never had.
    let mut peak =
        (device == Device::Cpu && !args.no_peak && ranks == 1).then(|| PeakProducts::new(c, n));
    let timed = TimedSteps {
        c,
        ids: &ids[mine.clone()],
        targets: &targets[mine],
        b: share,
        t,
        rows: n,
        steps: args.steps,
        world,
        peak: peak.as_mut(),
    };
    let Timings {
        steps: mut times,
        loss,
        cpu_per_step,
        params,
        all_reduce,
    } = run_on(device, args.device.precision, timed)?;
    if !root {
        return Ok(());
    }
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
    match ranks {
        1 => println!(
            "\ntraining step (forward + backward + AdamW), {} steps, loss {loss:.3}:",
            args.steps
        ),
        _ => println!(
            "\ntraining step (forward + backward + gradient all-reduce + AdamW), {} steps, \
             loss {loss:.3}, the slowest rank's time; tokens/s over all ranks:",
            args.steps
        ),
    }
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
    if let Some(mut all_reduce) = all_reduce {
        all_reduce.sort_by(f64::total_cmp);
        let values = params.len();
        let bytes = (values * size_of::<f32>()) as f64;
        println!(
            "\ngradient all-reduce alone ({values} f32 values, {:.1} MB), {} times, the slowest \
             rank's time; bus bandwidth = 2(R-1)/R · bytes / time:",
            bytes * 1e-6,
            all_reduce.len()
        );
        let (ar_best, ar_median) = (all_reduce[0], all_reduce[all_reduce.len() / 2]);
        for (name, s) in [("best", ar_best), ("median", ar_median)] {
            let (algbw, busbw) = bandwidths(bytes, s, ranks);
            println!(
                "  {name:<6} {:>8.2} ms  algorithm bandwidth {algbw:>6.2} GB/s  bus bandwidth \
                 {busbw:>6.2} GB/s",
                s * 1e3
            );
        }
        println!(
            "  share of the step: {:.1}% (median all-reduce / median step)",
            100.0 * ar_median / median
        );
        println!(
            "\n(where the time goes and the matrix-product peak: tinylm bench as one process)"
        );
        return Ok(());
    }
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

/// An all-reduce's algorithm and bus bandwidths in GB/s (10⁹ bytes/s), as
/// nccl-tests define them: `bytes / seconds`, and that times `2(R-1)/R`, the share
/// of the buffer each rank sends and receives in a ring all-reduce (so that it
/// compares with the links' bandwidth whatever the number of ranks).
fn bandwidths(bytes: f64, seconds: f64, ranks: usize) -> (f64, f64) {
    let algbw = bytes / seconds * 1e-9;
    let r = ranks as f64;
    (algbw, algbw * 2.0 * (r - 1.0) / r)
}

/// `--allreduce-only`: the ranks' all-reduce alone on buffers of 4 KiB to 256 MiB
/// and of the model's gradient, on rank 0 a line for each.
fn bench_all_reduce(c: &ModelConfig, args: &BenchArgs, world: &World) -> Result<()> {
    let gradient = ParamLayout::new(c).total;
    let mut sizes: Vec<usize> = (0..9).map(|k| 1usize << (10 + 2 * k)).collect();
    sizes.push(gradient);
    sizes.sort_unstable();
    sizes.dedup();
    let device = rank_device(args.device.device, world)?;
    let times = run_on(
        device,
        args.device.precision,
        AllReduceSizes {
            world,
            sizes: &sizes,
        },
    )?;
    if !world.is_root() {
        return Ok(());
    }
    let ranks = world.ranks();
    println!(
        "all-reduce (f32 sum) over {ranks} ranks on {device}, each size timed alone; the \
         slowest rank's time, bandwidths from the median, GB/s = 10⁹ bytes/s, bus bandwidth \
         = 2(R-1)/R · bytes / time"
    );
    println!(
        "  {:>14} {:>10} {:>6} {:>10} {:>10} {:>11} {:>11}",
        "bytes", "values", "times", "best ms", "median ms", "algbw GB/s", "busbw GB/s"
    );
    for (&len, mut seconds) in sizes.iter().zip(times) {
        seconds.sort_by(f64::total_cmp);
        let bytes = len * size_of::<f32>();
        let median = seconds[seconds.len() / 2];
        let (algbw, busbw) = bandwidths(bytes as f64, median, ranks);
        println!(
            "  {:>14} {len:>10} {:>6} {:>10.3} {:>10.3} {algbw:>11.2} {busbw:>11.2}{}",
            byte_size(bytes as u64),
            seconds.len(),
            seconds[0] * 1e3,
            median * 1e3,
            if len == gradient {
                "  (the model's gradient)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// The all-reduce of each of `sizes` values on any backend, timed
/// [`time_all_reduce`]'s way, for longer the smaller the buffer.
struct AllReduceSizes<'a> {
    world: &'a World,
    sizes: &'a [usize],
}

impl BackendTask for AllReduceSizes<'_> {
    type Output = Vec<Vec<f64>>;

    fn run<B: Backend<f32>>(self, backend: B) -> LmResult<Self::Output> {
        let ranks = backend.collective(self.world)?;
        let times = self.sizes.iter().map(|&len| {
            let reps = ((1usize << 26) / len).clamp(5, 50);
            time_all_reduce(&backend, ranks.as_ref(), self.world, len, reps)
        });
        times.collect()
    }
}

/// Times `reps` all-reduces (after two untimed ones) of a buffer of `len` values in
/// `backend`, each started on every rank together (after a barrier) and timed from
/// the backend idle to the backend idle; each one's seconds on the slowest rank.
fn time_all_reduce<B: Backend<f32>>(
    backend: &B,
    ranks: &dyn Collective<B::Buf, B::Stats>,
    world: &World,
    len: usize,
    reps: usize,
) -> LmResult<Vec<f64>> {
    let mut buf = backend.alloc(len, BufKind::Full)?;
    // Zeros: every sum stays zero (no overflow to infinities, no subnormals).
    backend.upload(buf.all_mut(), &vec![0.0; len])?;
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps + 2 {
        world.all_reduce(&mut [0.0], Reduce::Sum);
        backend.sync()?;
        let start = Instant::now();
        ranks.all_reduce_sum(buf.all_mut())?;
        backend.sync()?;
        if i >= 2 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    world.all_reduce(&mut times, Reduce::Max);
    Ok(times)
}

/// Two warm-up steps, then `steps` timed training steps on any backend, each
/// waiting for its kernels. With several ranks, each runs its share `b` of the
/// batch and the gradient is summed over them, then the all-reduce is timed alone.
struct TimedSteps<'a> {
    c: &'a ModelConfig,
    ids: &'a [u32],
    targets: &'a [u32],
    b: usize,
    t: usize,
    /// Positions of the whole step's batch, over all ranks.
    rows: usize,
    steps: usize,
    world: &'a World,
    /// Products timed once after each timed step.
    peak: Option<&'a mut PeakProducts>,
}

/// What [`TimedSteps`] measured.
struct Timings {
    /// Each timed step's seconds (the slowest rank's).
    steps: Vec<f64>,
    /// The last step's loss, over all ranks.
    loss: f32,
    /// CPU seconds per timed step of this process's threads (Linux).
    cpu_per_step: Option<f64>,
    /// The final parameters.
    params: Vec<f32>,
    /// With several ranks, the seconds of each gradient all-reduce timed alone (the
    /// slowest rank's).
    all_reduce: Option<Vec<f64>>,
}

/// Times each all-reduce of the gradient alone.
const ALL_REDUCE_REPS: usize = 10;

impl BackendTask for TimedSteps<'_> {
    type Output = Timings;

    fn run<B: Backend<f32>>(mut self, backend: B) -> LmResult<Timings> {
        let world = self.world;
        let ranks = match world.ranks() {
            1 => None,
            _ => Some(backend.collective(world)?),
        };
        let ranks = ranks.as_deref();
        let mut model = Model::init_with_backend(self.c.clone(), 0, backend)?;
        let mut opt = model.new_adamw(AdamWParams {
            beta2: 0.95,
            weight_decay: 0.1,
            ..AdamWParams::default()
        })?;
        // The training loop's step (clipping included), timed until its statistics
        // reach the host: this rank's share of the batch, the gradient summed over
        // the ranks.
        let mut step = |model: &mut Model<f32, B>| -> LmResult<f32> {
            let (ids, targets) = (self.ids, self.targets);
            let part = BatchPart::whole(self.rows);
            model.accumulate_gradient(ids, targets, self.b, self.t, part)?;
            model.optimizer_step(&mut opt, 1e-3, Some(1.0), ranks)?;
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
        // Each rank's loss is its share's part of the batch mean.
        let mut losses = [f64::from(loss)];
        world.all_reduce(&mut losses, Reduce::Sum);
        world.all_reduce(&mut times, Reduce::Max);
        let all_reduce = match ranks {
            Some(ranks) => Some(time_all_reduce(
                model.backend(),
                ranks,
                world,
                model.layout().total,
                ALL_REDUCE_REPS,
            )?),
            None => None,
        };
        Ok(Timings {
            steps: times,
            loss: losses[0] as f32,
            cpu_per_step,
            params: model.download_params()?,
            all_reduce,
        })
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
        model.adamw_step(&mut opt, 1e-3, None)?;
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
