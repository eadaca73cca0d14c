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
use half::bf16;
use std::time::Instant;
use tinylm::config::{Ffn, ModelConfig};
use tinylm::device::{rank_device, run_on, BackendTask, Device};
use tinylm::distributed::{Reduce, World};
use tinylm::kernels::cpu::bf16::{matmul_bf16, Bf16Kernel};
use tinylm::kernels::cpu::linear::{matmul, matmul_isa};
use tinylm::kernels::cpu::memory::zeroed;
use tinylm::kernels::{profile::Kind, AdamWParams, Backend, BatchPart, BufKind, Buffer};
use tinylm::kernels::{Collective, Cpu, MatMul, Precision, Profiled};
use tinylm::params::ParamLayout;
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
    /// Time the step's matrix products alone instead of training steps: the `f32`
    /// products and the bf16 kernel's (bf16 operands), alternating, best of
    /// `--steps` rounds.
    #[arg(long, conflicts_with = "allreduce_only")]
    products: bool,
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
    if args.products && ranks > 1 {
        bail!("--products times one process's products: start tinylm bench without a launcher");
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
        .install(|| {
            if args.products {
                print_model(&config);
                bench_products(&config, b * t, args.steps);
                Ok(())
            } else if args.allreduce_only {
                bench_all_reduce(&config, &args, world)
            } else {
                bench(&config, b, t, &args, world)
            }
        })
}

/// The model's line of a report.
fn print_model(c: &ModelConfig) {
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

fn bench(c: &ModelConfig, b: usize, t: usize, args: &BenchArgs, world: &World) -> Result<()> {
    let (ranks, root) = (world.ranks(), world.is_root());
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
    // The whole batch on every rank, each taking its share.
    let (ids, targets) = (tokens(n), tokens(n));
    let share = b / ranks;
    let mine = world.rank() * share * t..(world.rank() + 1) * share * t;
    let flops = step_flops(c, b, t);
    let device = rank_device(args.device.device, world)?;
    if root {
        print_model(c);
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
    let mut peak = (device == Device::Cpu && !args.no_peak && ranks == 1)
        .then(|| PeakProducts::new(c, n, Precision::Fp32));
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
    if let (Some(peak_products), Some(shares)) = (peak, paired) {
        let peak = peak_products.report();
        let step = flops / best * 1e-9;
        println!(
            "\nwhole step (best) {step:.1} GFLOP/s = {:.0}% of the measured matrix-product peak \
             {peak:.1} GFLOP/s ({})",
            100.0 * step / peak,
            peak_products.library()
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
            byte_size(bytes),
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

/// `bytes` in KiB, MiB or GiB.
fn byte_size(bytes: usize) -> String {
    let units = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    match units.iter().find(|&&(_, size)| bytes >= size) {
        Some(&(unit, size)) if bytes.is_multiple_of(size) => format!("{} {unit}", bytes / size),
        Some(&(unit, size)) => format!("{:.1} {unit}", bytes as f64 / size as f64),
        None => format!("{bytes} B"),
    }
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

/// The step's distinct matrix products: a name, the shape and how many times a step
/// runs it (forward, input gradient and weight gradient of every weight matrix).
fn step_products(c: &ModelConfig, n: usize) -> Vec<(String, MatMul, usize)> {
    let (d, f, v, layers) = (c.d_model, c.d_ff, c.vocab_size, c.num_layers);
    let w1 = if c.ffn == Ffn::Swiglu { 2 } else { 1 };
    let matrices = [
        ("qkv    ", d, 3 * d, layers),
        ("o_proj ", d, d, layers),
        ("w1/w3  ", d, f, w1 * layers),
        ("w2     ", f, d, layers),
        ("lm_head", d, v, 1),
    ];
    let mut products = Vec::new();
    for (form, shape) in [
        ("x·Wᵀ", MatMul::linear as fn(usize, usize, usize) -> MatMul),
        ("dy·W", MatMul::linear_dx),
        ("dyᵀ·x", MatMul::linear_dw),
    ] {
        for &(name, d_in, d_out, count) in &matrices {
            products.push((format!("{name}  {form}"), shape(n, d_in, d_out), count));
        }
    }
    products
}

/// The step's products alone ([`step_products`]) in one precision — `f32` on the
/// `gemm` crate, or bf16 operands on tinylm's bf16 kernel — each timed once per
/// [`PeakProducts::time_each`]; the peak is the best GFLOP/s of any.
struct PeakProducts {
    precision: Precision,
    products: Vec<Product>,
    /// The best GFLOP/s of any product, round by round.
    round_peaks: Vec<f64>,
}

/// One product of [`PeakProducts`]: its operands and its best time so far.
struct Product {
    name: String,
    shape: MatMul,
    per_step: usize,
    operands: Operands,
    out: Vec<f32>,
    best_s: f64,
}

/// A product's operands in the precision it is timed in.
enum Operands {
    F32(Vec<f32>, Vec<f32>),
    Bf16(Vec<bf16>, Vec<bf16>),
}

impl PeakProducts {
    fn new(c: &ModelConfig, n: usize, precision: Precision) -> Self {
        let products = step_products(c, n)
            .into_iter()
            .map(|(name, s, per_step)| {
                // Allocated as the step's buffers are (huge pages where they exist).
                let filled = |len, value| {
                    let mut buf = zeroed(len);
                    buf.fill(value);
                    buf
                };
                let (a, b) = (filled(s.m * s.k, 0.5), filled(s.k * s.n, 0.25));
                let operands = match precision {
                    Precision::Fp32 => Operands::F32(a, b),
                    Precision::Bf16 => {
                        let to_bf16 = |x: Vec<f32>| x.into_iter().map(bf16::from_f32).collect();
                        Operands::Bf16(to_bf16(a), to_bf16(b))
                    }
                };
                Product {
                    name,
                    shape: s,
                    per_step,
                    operands,
                    out: zeroed(s.m * s.n),
                    best_s: f64::MAX,
                }
            })
            .collect();
        PeakProducts {
            precision,
            products,
            round_peaks: Vec::new(),
        }
    }

    /// What the products run on.
    fn library(&self) -> String {
        match self.precision {
            Precision::Fp32 => format!("gemm crate, {}", matmul_isa()),
            Precision::Bf16 => format!("tinylm bf16, {}", Bf16Kernel::best().name()),
        }
    }

    /// Times every product once (one round).
    fn time_each(&mut self) {
        let mut round_peak = 0f64;
        for p in &mut self.products {
            let start = Instant::now();
            match &p.operands {
                Operands::F32(a, b) => matmul(&mut p.out, a, b, p.shape),
                Operands::Bf16(a, b) => matmul_bf16(&mut p.out, a, b, p.shape),
            }
            let seconds = start.elapsed().as_secs_f64();
            p.best_s = p.best_s.min(seconds);
            round_peak = round_peak.max(p.shape.flops() as f64 / seconds * 1e-9);
        }
        self.round_peaks.push(round_peak);
    }

    /// Prints each product's best GFLOP/s; returns the peak.
    fn report(&self) -> f64 {
        println!(
            "\nmatrix-product peak ({}, best of {} rounds, each after a timed step):",
            self.library(),
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

    /// The step's products as a whole: their FLOPs over their best times, each
    /// counted as often as a step runs it.
    fn weighted_gflops(&self) -> f64 {
        let flops: f64 = (self.products.iter())
            .map(|p| (p.per_step as u64 * p.shape.flops()) as f64)
            .sum();
        let seconds: f64 = (self.products.iter())
            .map(|p| p.per_step as f64 * p.best_s)
            .sum();
        flops / seconds * 1e-9
    }
}

/// `--products`: the step's products alone, `f32` and bf16 alternating round by
/// round, each product's best GFLOP/s in both and the step's products as a whole.
fn bench_products(c: &ModelConfig, n: usize, rounds: usize) {
    let mut f32s = PeakProducts::new(c, n, Precision::Fp32);
    let mut bf16s = PeakProducts::new(c, n, Precision::Bf16);
    for _ in 0..rounds {
        f32s.time_each();
        bf16s.time_each();
    }
    println!(
        "\nthe step's matrix products alone ({n} rows), f32 ({}) and bf16 ({}; bf16 operands, \
         f32 sums and output) alternating, best of {rounds} rounds:",
        f32s.library(),
        bf16s.library()
    );
    println!(
        "  {:<16} ({:>5} x {:>5} x {:>5})  {:>8}  {:>11}  {:>12}  {:>8}",
        "product", "m", "k", "n", "per step", "f32 GFLOP/s", "bf16 GFLOP/s", "bf16/f32"
    );
    for (p, q) in f32s.products.iter().zip(&bf16s.products) {
        let s = p.shape;
        let (f, b) = (
            s.flops() as f64 / p.best_s * 1e-9,
            s.flops() as f64 / q.best_s * 1e-9,
        );
        println!(
            "  {:<16} ({:>5} x {:>5} x {:>5})  {:>8}  {f:>11.1}  {b:>12.1}  {:>7.2}x",
            p.name,
            s.m,
            s.k,
            s.n,
            p.per_step,
            b / f
        );
    }
    let (f, b) = (f32s.weighted_gflops(), bf16s.weighted_gflops());
    println!(
        "  {:<48}  {f:>11.1}  {b:>12.1}  {:>7.2}x",
        "all, weighted by their count per step",
        b / f
    );
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
