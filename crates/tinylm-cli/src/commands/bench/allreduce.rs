//! `tinylm bench-allreduce`: under a launcher (`mpirun -np R`), the ranks'
//! all-reduce alone on buffers of 4 KiB to 256 MiB and of a model's gradient, with
//! its bandwidths as nccl-tests define them; and the timing of one all-reduce that
//! `tinylm bench` also reports for a step's gradient.

use anyhow::{bail, Result};
use clap::Args;
use std::time::Instant;
use tinylm::device::{rank_device, AnyBackend};
use tinylm::distributed::{Reduce, World};
use tinylm::kernels::{Backend, BufKind, Buffer, Collective, Role};
use tinylm::params::ParamLayout;
use tinylm::text::byte_size;
use tinylm::{on_backend, Result as LmResult};

use super::model::BenchModel;
use crate::commands::flags::DeviceArgs;
use crate::commands::ranks::as_rank;

#[derive(Args, Debug)]
pub struct BenchAllreduceArgs {
    /// The model whose gradient is one of the sizes.
    #[command(flatten)]
    model: BenchModel,
    #[command(flatten)]
    device: DeviceArgs,
}

/// Times the all-reduce as one rank of the ranks a launcher started ([`as_rank`]).
pub fn run(args: BenchAllreduceArgs) -> Result<()> {
    as_rank(|world| run_rank(args, world))
}

fn run_rank(args: BenchAllreduceArgs, world: &World) -> Result<()> {
    let config = args.model.config()?;
    if world.ranks() == 1 {
        bail!("tinylm bench-allreduce times the ranks' all-reduce: start it under `mpirun -np R`");
    }
    let gradient = ParamLayout::new(&config).total;
    let mut sizes: Vec<usize> = (0..9).map(|k| 1usize << (10 + 2 * k)).collect();
    sizes.push(gradient);
    sizes.sort_unstable();
    sizes.dedup();
    let device = rank_device(args.device.device, world)?;
    let times = args.model.on_threads(|| {
        let backend = AnyBackend::open(device, args.device.precision)?;
        Ok(on_backend!(backend, backend => time_sizes(&backend, world, &sizes)?))
    })?;
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

/// The all-reduce of each of `sizes` values in `backend`, timed [`time_all_reduce`]'s
/// way, for longer the smaller the buffer.
fn time_sizes<B: Backend<f32>>(
    backend: &B,
    world: &World,
    sizes: &[usize],
) -> LmResult<Vec<Vec<f64>>> {
    let ranks = backend.collective(world)?;
    let times = sizes.iter().map(|&len| {
        let reps = ((1usize << 26) / len).clamp(5, 50);
        time_all_reduce(backend, ranks.as_ref(), world, len, reps)
    });
    times.collect()
}

/// An all-reduce's algorithm and bus bandwidths in GB/s (10⁹ bytes/s), as
/// nccl-tests define them: `bytes / seconds`, and that times `2(R-1)/R`, the share
/// of the buffer each rank sends and receives in a ring all-reduce (so that it
/// compares with the links' bandwidth whatever the number of ranks).
pub fn bandwidths(bytes: f64, seconds: f64, ranks: usize) -> (f64, f64) {
    let algbw = bytes / seconds * 1e-9;
    let r = ranks as f64;
    (algbw, algbw * 2.0 * (r - 1.0) / r)
}

/// Times `reps` all-reduces (after two untimed ones) of a buffer of `len` values in
/// `backend`, each started on every rank together (after a barrier) and timed from
/// the backend idle to the backend idle; each one's seconds on the slowest rank.
pub fn time_all_reduce<B: Backend<f32>>(
    backend: &B,
    ranks: &dyn Collective<B::Buf, B::Stats>,
    world: &World,
    len: usize,
    reps: usize,
) -> LmResult<Vec<f64>> {
    let role = Role {
        name: "all-reduce buffer",
        shape: "",
    };
    let mut buf = backend.alloc(role, len, BufKind::Full)?;
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
