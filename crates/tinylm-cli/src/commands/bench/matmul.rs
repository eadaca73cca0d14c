//! `tinylm bench-matmul`: the matrix-product library alone on the shapes of a
//! training step's products, and its peak — what `tinylm bench` compares its step
//! with, timing one round of these products after each timed step.

use anyhow::{bail, Result};
use clap::Args;
use std::time::Instant;
use tinylm::kernels::cpu::linear::{matmul, matmul_isa};
use tinylm::kernels::cpu::memory::zeroed;
use tinylm::kernels::MatMul;
use tinylm::ModelConfig;

use super::model::{BenchModel, StepBatch};

#[derive(Args, Debug)]
pub struct BenchMatmulArgs {
    #[command(flatten)]
    model: BenchModel,
    #[command(flatten)]
    batch: StepBatch,
    /// Rounds of every product; each product's figure is its best round.
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
        let mut peak = PeakProducts::new(&config, b * t);
        for _ in 0..args.rounds {
            peak.time_each();
        }
        println!(
            "matrix products: gemm's {} kernels, {} threads, the products of a step of {b} x {t} tokens",
            matmul_isa(),
            rayon::current_num_threads()
        );
        peak.report("");
        Ok(())
    })
}

/// The matrix-product library alone on a step's distinct product shapes, each timed
/// once per [`PeakProducts::time_each`]; the peak is the best GFLOP/s of any.
pub struct PeakProducts {
    products: Vec<Product>,
    /// The best GFLOP/s of any product, round by round.
    pub round_peaks: Vec<f64>,
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
    /// The products of a step over `n` positions of model `c`.
    pub fn new(c: &ModelConfig, n: usize) -> Self {
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
    pub fn time_each(&mut self) {
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

    /// Prints each product's best GFLOP/s (the rounds described as `rounds_were`);
    /// returns the peak.
    pub fn report(&self, rounds_were: &str) -> f64 {
        println!(
            "\nmatrix-product peak (gemm crate, best of {} rounds{rounds_were}):",
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
