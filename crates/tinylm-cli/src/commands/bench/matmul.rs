//! `tinylm bench-matmul`: the matrix products of a training step alone — every
//! weight matrix's forward, input-gradient and weight-gradient product — in `f32`
//! (the `gemm` crate) and with bf16 operands (tinylm's bf16 kernel), alternating
//! round by round, and their peaks. `tinylm bench` times one round of the same
//! products after each timed step, in the run's precision, to put the step beside
//! its peak.

use anyhow::{bail, Result};
use clap::Args;
use half::bf16;
use std::time::Instant;
use tinylm::kernels::cpu::bf16::{matmul_bf16, Bf16Kernel};
use tinylm::kernels::cpu::linear::{matmul, matmul_isa};
use tinylm::kernels::cpu::memory::zeroed;
use tinylm::kernels::{MatMul, Precision};
use tinylm::model::products::Linear;
use tinylm::ModelConfig;

use super::model::{BenchModel, StepBatch};

#[derive(Args, Debug)]
pub struct BenchMatmulArgs {
    #[command(flatten)]
    model: BenchModel,
    #[command(flatten)]
    batch: StepBatch,
    /// Rounds of every product in each precision; each figure is its best round.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
}

pub fn run(args: BenchMatmulArgs) -> Result<()> {
    let config = args.model.config()?;
    let (b, t) = args.batch.shape(&config)?;
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    args.model.on_threads(|| {
        let n = b * t;
        let mut f32s = PeakProducts::new(&config, n, Precision::Fp32);
        let mut bf16s = PeakProducts::new(&config, n, Precision::Bf16);
        for _ in 0..args.rounds {
            f32s.time_each();
            bf16s.time_each();
        }
        println!("{}", config.describe());
        println!(
            "the step's matrix products alone ({b} x {t} = {n} rows, {} threads), f32 ({}) and \
             bf16 ({}; bf16 operands, f32 sums and output) alternating, best of {} rounds:",
            rayon::current_num_threads(),
            f32s.library(),
            bf16s.library(),
            args.rounds
        );
        report_side_by_side(&f32s, &bf16s);
        Ok(())
    })
}

/// The step's matrix products as the model runs them ([`Linear`], the list its
/// passes take their shapes from): a name, the shape and how many times a step runs
/// it — forward, input gradient and weight gradient of every weight matrix.
fn step_products(c: &ModelConfig, n: usize) -> Vec<(String, MatMul, usize)> {
    let mut products = Vec::new();
    for (form, shape) in [
        (
            "x·Wᵀ",
            Linear::forward as fn(Linear, &ModelConfig, usize) -> MatMul,
        ),
        ("dy·W", Linear::dx),
        ("dyᵀ·x", Linear::dw),
    ] {
        for linear in Linear::all(c) {
            let name = format!("{:<16}  {form}", linear.name());
            products.push((name, shape(linear, c, n), linear.copies(c)));
        }
    }
    products
}

/// The step's products alone ([`step_products`]) in one precision — `f32` on the
/// `gemm` crate (`fp32`, `auto`), or bf16 operands on tinylm's bf16 kernel — each timed once per
/// [`PeakProducts::time_each`]; the peak is the best GFLOP/s of any.
pub struct PeakProducts {
    precision: Precision,
    products: Vec<Product>,
    /// The best GFLOP/s of any product, round by round.
    pub round_peaks: Vec<f64>,
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

impl Product {
    fn gflops(&self) -> f64 {
        self.shape.flops() as f64 / self.best_s * 1e-9
    }
}

impl PeakProducts {
    /// The products of a step over `n` positions of model `c`.
    pub fn new(c: &ModelConfig, n: usize, precision: Precision) -> Self {
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
                    Precision::Bf16 => {
                        let to_bf16 = |x: Vec<f32>| x.into_iter().map(bf16::from_f32).collect();
                        Operands::Bf16(to_bf16(a), to_bf16(b))
                    }
                    Precision::Fp32 | Precision::Auto | Precision::Q8_0 => Operands::F32(a, b),
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
    pub fn library(&self) -> String {
        match self.precision {
            Precision::Bf16 => format!("tinylm bf16, {}", Bf16Kernel::best().name()),
            Precision::Fp32 | Precision::Auto | Precision::Q8_0 => {
                format!("gemm crate, {}", matmul_isa())
            }
        }
    }

    /// Times every product once (one round).
    pub fn time_each(&mut self) {
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

    /// The best GFLOP/s of any product.
    fn peak(&self) -> f64 {
        self.products
            .iter()
            .map(Product::gflops)
            .fold(0.0, f64::max)
    }

    /// Prints each product's best GFLOP/s (the rounds described as `rounds_were`);
    /// returns the peak.
    pub fn report(&self, rounds_were: &str) -> f64 {
        println!(
            "\nmatrix-product peak ({}, best of {} rounds{rounds_were}):",
            self.library(),
            self.round_peaks.len()
        );
        for p in &self.products {
            let s = p.shape;
            println!(
                "  {:<16} ({:>5} x {:>5} x {:>5})  {:>6.1} GFLOP/s",
                p.name,
                s.m,
                s.k,
                s.n,
                p.gflops()
            );
        }
        let peak = self.peak();
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

/// Each product's best GFLOP/s in `f32` and bf16, the step's products as a whole,
/// and each precision's peak.
fn report_side_by_side(f32s: &PeakProducts, bf16s: &PeakProducts) {
    println!(
        "  {:<16} ({:>5} x {:>5} x {:>5})  {:>8}  {:>11}  {:>12}  {:>8}",
        "product", "m", "k", "n", "per step", "f32 GFLOP/s", "bf16 GFLOP/s", "bf16/f32"
    );
    for (p, q) in f32s.products.iter().zip(&bf16s.products) {
        let s = p.shape;
        let (f, b) = (p.gflops(), q.gflops());
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
    let (f, b) = (f32s.peak(), bf16s.peak());
    println!(
        "  {:<48}  {f:>11.1}  {b:>12.1}  {:>7.2}x",
        "peak (the best of any product)",
        b / f
    );
}
