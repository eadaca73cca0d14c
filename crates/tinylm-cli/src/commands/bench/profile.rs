//! Where a step's time goes: the step `tinylm bench` timed, run again with every
//! kernel call timed by kind, and the CPU time of this process's threads.

use std::time::Instant;
use tinylm::kernels::profile::Kind;
use tinylm::kernels::{Backend, Profiled};
use tinylm::{Model, ModelConfig, Result};

use super::model::Step;

/// Steps the profile times (after one untimed).
const PROFILED_STEPS: usize = 5;

/// The timed step again on `backend` (in the run's precision) with every kernel
/// call timed, from `params`: prints the split per kind of kernel. On a GPU each
/// call waits for the device ([`Profiled`]), so the profiled step is slower than
/// the timed one.
pub fn profile<B: Backend<f32>>(
    backend: B,
    c: &ModelConfig,
    params: &[f32],
    step: &Step,
) -> Result<()> {
    let mut model = Model::with_backend(c.clone(), params, Profiled::new(backend))?;
    let mut opt = model.new_adamw(step.training.adamw())?;
    let mut total = 0.0;
    for i in 0..=PROFILED_STEPS {
        if i == 1 {
            model.backend().reset();
            total = 0.0;
        }
        let start = Instant::now();
        step.run(&mut model, &mut opt, None)?;
        model.backend().sync()?;
        total += start.elapsed().as_secs_f64();
    }
    let per_step = |s: f64| s / PROFILED_STEPS as f64 * 1e3;
    println!("\nwhere a step's time goes (mean of {PROFILED_STEPS} timed steps):");
    let profiled = model.backend();
    let seconds = profiled.seconds();
    let accounted: f64 = seconds.iter().map(|r| r.1).sum();
    let other = ("other (orchestration)", (total - accounted).max(0.0), None);
    let kinds = seconds.iter().map(|&(kind, s)| {
        let gflops = (kind == Kind::Matmul).then(|| profiled.matmul_flops() as f64 / s * 1e-9);
        (kind.name(), s, gflops)
    });
    for (name, s, gflops) in kinds.chain([other]) {
        let rate = gflops.map_or(String::new(), |g| format!("  {g:>6.1} GFLOP/s"));
        println!(
            "  {name:<34} {:>7.2} ms  {:>5.1}%{rate}",
            per_step(s),
            100.0 * s / total
        );
    }
    println!("  {:<34} {:>7.2} ms", "total", per_step(total));
    Ok(())
}

/// CPU seconds this process's threads have run so far (Linux; `None` elsewhere).
/// Unlike wall-clock time it does not count time lost to other processes, so it
/// shows the engine's own cost on a busy machine.
pub fn cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 * 1e-9)
}
