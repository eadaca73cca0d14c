//! What the bench commands measure: the benchmark model (or another the flags
//! name), on a number of threads, and a training step — the training loop's own,
//! on this rank's share of a batch.

use anyhow::{bail, Context, Result};
use clap::Args;
use tinylm::kernels::{Backend, BatchPart, Collective};
use tinylm::optim::AdamW;
use tinylm::train::TrainConfig;
use tinylm::{Model, ModelConfig, Result as LmResult};

use crate::commands::flags::{show_defaults, ModelArgs, ThreadsArg};

/// The model and the threads of a bench command.
#[derive(Args, Debug)]
#[command(mut_args = show_defaults(&benchmark_model()))]
pub struct BenchModel {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    threads: ThreadsArg,
}

/// The sequences of a step.
#[derive(Args, Debug)]
pub struct StepBatch {
    /// Sequences per step, over all ranks.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Tokens per sequence (default: the context length).
    #[arg(long)]
    pub seq_len: Option<usize>,
}

/// The model timed unless `--model-config` or `--preset` names another: the
/// `bench-small` preset.
fn benchmark_model() -> ModelConfig {
    ModelConfig::preset("bench-small").expect("bench-small is a preset")
}

impl BenchModel {
    /// The model the flags give.
    pub fn config(&self) -> Result<ModelConfig> {
        let base = self.model.base()?.unwrap_or_else(benchmark_model);
        self.model.apply(base).context("model configuration")
    }

    /// Runs `work` on a thread of a pool of `--threads` threads.
    pub fn on_threads<R: Send>(&self, work: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        self.threads.apply()?;
        tinylm::kernels::cpu::on_pool(work)
    }
}

impl StepBatch {
    /// `(B, T)`: `--batch-size` sequences of `--seq-len` tokens, checked against the
    /// model's context.
    pub fn shape(&self, c: &ModelConfig) -> Result<(usize, usize)> {
        let (b, t) = (self.batch_size, self.seq_len.unwrap_or(c.context_length));
        if b == 0 || t == 0 || t > c.context_length {
            bail!(
                "--batch-size must be positive and --seq-len in 1..={}",
                c.context_length
            );
        }
        Ok((b, t))
    }
}

/// This rank's share of a step's batch.
pub struct Step<'a> {
    pub ids: &'a [u32],
    pub targets: &'a [u32],
    pub b: usize,
    pub t: usize,
    /// Positions of the whole step's batch, over all ranks.
    pub rows: usize,
    /// Whose AdamW settings, peak learning rate and clipping norm the step takes:
    /// training's defaults (TinyStories').
    pub training: TrainConfig,
}

impl Step<'_> {
    /// The training loop's step — forward, backward, the gradient summed over
    /// `ranks`, AdamW at training's default peak learning rate and clipping norm —
    /// until its statistics reach the host; its loss.
    pub fn run<B: Backend<f32>>(
        &self,
        model: &mut Model<f32, B>,
        opt: &mut AdamW<B::Buf>,
        ranks: Option<&dyn Collective<B::Buf, B::Stats>>,
    ) -> LmResult<f64> {
        let part = BatchPart::whole(self.rows);
        model.accumulate_gradient(self.ids, self.targets, self.b, self.t, part)?;
        let training = &self.training;
        model.optimizer_step(opt, training.lr_max, Some(training.grad_clip), ranks)?;
        Ok(model.step_stats()?.loss)
    }
}
