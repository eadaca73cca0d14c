//! `tinylm bench`: a training step of the engine — the training loop's own step,
//! clipping included — timed, its achieved GFLOP/s, where its time goes (the same
//! step again with every kernel timed), and on the CPU its share of the
//! matrix-product peak measured between the timed steps.
//!
//! Started by a launcher (`mpirun -np R`, `srun`), every rank runs its share of the
//! step's batch as `tinylm train` does, the gradient summed over the ranks between
//! backward and AdamW, and rank 0 reports the step over all ranks and the gradient
//! all-reduce alone: its time, its bandwidth and its share of the step.

use anyhow::{bail, Result};
use clap::Args;
use std::time::Instant;
use tinylm::accounting::training_flops;
use tinylm::config::ModelConfig;
use tinylm::data::SplitMix64;
use tinylm::device::{backend_kind, describe_precision, rank_device, AnyBackend, Device};
use tinylm::distributed::{Reduce, World};
use tinylm::kernels::cpu::bf16::Bf16Kernel;
use tinylm::kernels::cpu::linear::matmul_isa;
use tinylm::kernels::{Backend, BackendKind};
use tinylm::train::TrainConfig;
use tinylm::{on_backend, Model, Result as LmResult};

use super::allreduce::{bandwidths, time_all_reduce};
use super::matmul::PeakProducts;
use super::model::{BenchModel, Step, StepBatch};
use super::profile::{cpu_seconds, profile};
use crate::commands::flags::DeviceArgs;
use crate::commands::ranks::as_rank;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: BenchModel,
    #[command(flatten)]
    batch: StepBatch,
    /// Timed training steps (after two warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Skip the matrix-product peak measurement.
    #[arg(long)]
    no_peak: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

/// Benchmarks as one rank of the ranks a launcher (`mpirun`, `srun`) started, or
/// alone ([`as_rank`]).
pub fn run(args: BenchArgs) -> Result<()> {
    as_rank(|world| run_rank(args, world))
}

/// Times each all-reduce of the gradient alone.
const ALL_REDUCE_REPS: usize = 10;

fn run_rank(args: BenchArgs, world: &World) -> Result<()> {
    let c = args.model.config()?;
    let (b, t) = args.batch.shape(&c)?;
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let ranks = world.ranks();
    if !b.is_multiple_of(ranks) {
        bail!("--batch-size {b} does not divide over {ranks} ranks: choose a multiple of {ranks}");
    }
    args.model.on_threads(|| bench(&args, &c, b, t, world))
}

/// The benchmark of a step of `b` sequences of `t` tokens, on the command's threads.
fn bench(args: &BenchArgs, c: &ModelConfig, b: usize, t: usize, world: &World) -> Result<()> {
    let (ranks, root, n, share) = (world.ranks(), world.is_root(), b * t, b / world.ranks());
    let flops = training_flops(c, b, t) as f64;
    let device = rank_device(args.device.device, world)?;
    // Uniform random tokens: the step's cost does not depend on them. The whole
    // batch on every rank, each taking its share.
    let mut rng = SplitMix64::new(0x2545_f491_4f6c_dd1d);
    let batch: Vec<u32> = (0..2 * n)
        .map(|_| rng.below(c.vocab_size as u64) as u32)
        .collect();
    let (ids, targets) = batch.split_at(n);
    let mine = world.rank() * share * t..(world.rank() + 1) * share * t;
    let step = Step {
        ids: &ids[mine.clone()],
        targets: &targets[mine],
        b: share,
        t,
        rows: n,
        training: TrainConfig::default(),
    };
    let precision = backend_kind(device, args.device.precision.for_training()?)?.precision();
    if root {
        print_setup(c, b, t, flops, device, &args.device, ranks);
    }
    // The products' peak is measured between the timed steps, so that both see the
    // same machine: on a shared one, a product timed alone after the steps (or a step
    // alone) may catch a quiet moment the other never had.
    let mut peak = (device == Device::Cpu && !args.no_peak && ranks == 1)
        .then(|| PeakProducts::new(c, n, precision));
    let backend = AnyBackend::open(device, args.device.precision)?;
    let timings = on_backend!(backend, backend => {
        timed_steps(backend, c, &step, args.steps, world, peak.as_mut())?
    });
    if !root {
        return Ok(());
    }
    let mut times = timings.steps.clone();
    times.sort_by(f64::total_cmp);
    let (best, median) = (times[0], times[times.len() / 2]);
    match ranks {
        1 => println!(
            "\ntraining step (forward + backward + AdamW), {} steps, loss {:.3}:",
            args.steps, timings.loss
        ),
        _ => println!(
            "\ntraining step (forward + backward + gradient all-reduce + AdamW), {} steps, \
             loss {:.3}, the slowest rank's time; tokens/s over all ranks:",
            args.steps, timings.loss
        ),
    }
    for (name, s) in [("best", best), ("median", median)] {
        println!(
            "  {name:<6} {:>8.1} ms  {:>8.0} tokens/s  {:>6.1} GFLOP/s",
            s * 1e3,
            n as f64 / s,
            flops / s * 1e-9
        );
    }
    if let Some(all_reduce) = timings.all_reduce {
        report_all_reduce(all_reduce, timings.params.len(), median, ranks);
        return Ok(());
    }
    if let (Device::Cpu, Some(cpu)) = (device, timings.cpu_per_step) {
        let threads = rayon::current_num_threads() as f64;
        println!(
            "  CPU time {:.1} ms per step over all threads; / {threads} threads = {:.1} ms \
             ({:.0} tokens/s if the threads had their cores to themselves)",
            cpu * 1e3,
            cpu / threads * 1e3,
            n as f64 * threads / cpu
        );
    }
    let backend = AnyBackend::open(device, precision)?;
    on_backend!(backend, backend => profile(backend, c, &timings.params, &step))?;
    if let Some(peak) = peak {
        report_peak(&peak, &timings.steps, flops, best);
    }
    Ok(())
}

/// The model, the step's shape and its FLOPs, and what runs the products.
fn print_setup(
    c: &ModelConfig,
    b: usize,
    t: usize,
    flops: f64,
    device: Device,
    flags: &DeviceArgs,
    ranks: usize,
) {
    println!("{}", c.describe());
    let gflop = flops * 1e-9;
    match ranks {
        1 => println!(
            "step: batch {b} x {t} tokens, {} threads, {gflop:.1} GFLOP per step \
             (6·N·tokens + attention)",
            rayon::current_num_threads()
        ),
        _ => println!(
            "step: batch {b} x {t} tokens over {ranks} ranks ({} sequences each), {} \
             threads per rank, {gflop:.1} GFLOP per step (6·N·tokens + attention)",
            b / ranks,
            rayon::current_num_threads()
        ),
    }
    let precision = describe_precision(device, flags.precision);
    match backend_kind(device, flags.precision) {
        Ok(BackendKind::CpuBf16) => println!(
            "precision {precision}\nmatrix products: tinylm's bf16 kernels, {} (bf16 \
             operands summed in f32)",
            Bf16Kernel::best().name()
        ),
        Ok(BackendKind::Cpu) => println!(
            "precision {precision}\nmatrix products: gemm's {} kernels (chosen at run time \
             for this CPU)",
            matmul_isa()
        ),
        _ => println!("device: {device}, precision {precision}"),
    }
}

/// What [`timed_steps`] measured.
struct Timings {
    /// Each timed step's seconds (the slowest rank's).
    steps: Vec<f64>,
    /// The last step's loss, over all ranks.
    loss: f64,
    /// CPU seconds per timed step of this process's threads (Linux).
    cpu_per_step: Option<f64>,
    /// The final parameters.
    params: Vec<f32>,
    /// With several ranks, the seconds of each gradient all-reduce timed alone (the
    /// slowest rank's).
    all_reduce: Option<Vec<f64>>,
}

/// Two warm-up steps, then `steps` timed [`Step::run`]s on `backend`, with a round
/// of `peak`'s products after each; with several ranks, then the gradient's
/// all-reduce alone.
fn timed_steps<B: Backend<f32>>(
    backend: B,
    c: &ModelConfig,
    step: &Step,
    steps: usize,
    world: &World,
    mut peak: Option<&mut PeakProducts>,
) -> LmResult<Timings> {
    let ranks = match world.ranks() {
        1 => None,
        _ => Some(backend.collective(world)?),
    };
    let ranks = ranks.as_deref();
    let mut model = Model::init_with_backend(c.clone(), 0, backend)?;
    let mut opt = model.new_adamw(step.training.adamw())?;
    for _ in 0..2 {
        step.run(&mut model, &mut opt, ranks)?;
    }
    let (mut times, mut loss) = (Vec::with_capacity(steps), 0.0);
    // CPU seconds of the steps alone (not of the peak products between them).
    let mut cpu = Some(0.0);
    for _ in 0..steps {
        let (start, cpu_start) = (Instant::now(), cpu_seconds());
        loss = step.run(&mut model, &mut opt, ranks)?;
        times.push(start.elapsed().as_secs_f64());
        cpu = cpu
            .zip(cpu_seconds().zip(cpu_start))
            .map(|(sum, (end, start))| sum + end - start);
        if let Some(peak) = peak.as_deref_mut() {
            peak.time_each();
        }
    }
    // Each rank's loss is its share's part of the batch mean.
    let mut losses = [loss];
    world.all_reduce(&mut losses, Reduce::Sum);
    world.all_reduce(&mut times, Reduce::Max);
    let total = model.layout().total;
    let all_reduce = ranks
        .map(|ranks| time_all_reduce(model.backend(), ranks, world, total, ALL_REDUCE_REPS))
        .transpose()?;
    Ok(Timings {
        steps: times,
        loss: losses[0],
        cpu_per_step: cpu.map(|sum| sum / steps as f64),
        params: model.download_params()?,
        all_reduce,
    })
}

/// The gradient's all-reduce alone over `ranks` ranks: its times, bandwidths and
/// share of the median step.
fn report_all_reduce(mut seconds: Vec<f64>, values: usize, median_step: f64, ranks: usize) {
    seconds.sort_by(f64::total_cmp);
    let bytes = (values * size_of::<f32>()) as f64;
    println!(
        "\ngradient all-reduce alone ({values} f32 values, {:.1} MB), {} times, the slowest \
         rank's time; bus bandwidth = 2(R-1)/R · bytes / time:",
        bytes * 1e-6,
        seconds.len()
    );
    let median = seconds[seconds.len() / 2];
    for (name, s) in [("best", seconds[0]), ("median", median)] {
        let (algbw, busbw) = bandwidths(bytes, s, ranks);
        println!(
            "  {name:<6} {:>8.2} ms  algorithm bandwidth {algbw:>6.2} GB/s  bus bandwidth \
             {busbw:>6.2} GB/s",
            s * 1e3
        );
    }
    println!(
        "  share of the step: {:.1}% (median all-reduce / median step)",
        100.0 * median / median_step
    );
    println!("\n(where the time goes and the matrix-product peak: tinylm bench as one process)");
}

/// The peak of the products timed between the steps, and the steps' share of it:
/// the best step's against the peak, and each step's against the round after it.
fn report_peak(peak: &PeakProducts, steps: &[f64], flops: f64, best: f64) {
    let mut shares: Vec<f64> = (steps.iter().zip(&peak.round_peaks))
        .map(|(s, peak)| flops / s * 1e-9 / peak)
        .collect();
    shares.sort_by(f64::total_cmp);
    let peak_gflops = peak.report(", each after a timed step");
    let step = flops / best * 1e-9;
    println!(
        "\nwhole step (best) {step:.1} GFLOP/s = {:.0}% of the measured matrix-product peak \
         {peak_gflops:.1} GFLOP/s ({})",
        100.0 * step / peak_gflops,
        peak.library()
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
