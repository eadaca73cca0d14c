//! The benchmarks: `tinylm bench` (a training step: its time, where the time goes,
//! its share of the matrix-product peak), `tinylm bench-matmul` (that peak alone)
//! and `tinylm bench-allreduce` (the ranks' all-reduce alone), over the benchmark
//! model, the step and the flags they share ([`model`]), where a step's time goes
//! ([`profile`]).

pub mod allreduce;
pub mod matmul;
pub mod model;
pub mod profile;
pub mod step;
