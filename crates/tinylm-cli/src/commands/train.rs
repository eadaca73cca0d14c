//! `tinylm train`: train a model from a TOML/JSON config file and/or flags.
//!
//! The configuration is built in layers, each overriding the one before: the
//! defaults of [`TrainConfig`] — or, with `--resume`, the configuration the
//! checkpoint recorded — then the `--config` file, `--preset`, the `--model-config`
//! file and every individual flag (see [`resolve_config`]).

use anyhow::{anyhow, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use tinylm::train::{resolve_config, train, Progress, ResolvedConfig};
use tinylm::ModelConfig;

/// Set by Ctrl-C: the run checkpoints after the current step and exits.
static STOP: AtomicBool = AtomicBool::new(false);

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Training configuration, `.toml` or `.json`, with the keys of the flags below
    /// (underscores for dashes) and the model under `model`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the resolved configuration as JSON and exit without training.
    #[arg(long)]
    print_config: bool,
    /// Continue the run of this checkpoint with the configuration it recorded; the
    /// other flags override it (but for the model's).
    #[arg(long)]
    resume: Option<PathBuf>,

    /// Training tokens: a 1-D `.npy` (uint16, uint32, int32 or int64).
    #[arg(long)]
    train_data: Option<PathBuf>,
    /// Validation tokens (`.npy`).
    #[arg(long)]
    val_data: Option<PathBuf>,
    /// Tokenizer directory, recorded in the checkpoint for `tinylm generate`.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Output directory: log.jsonl, loss.svg, checkpoint.safetensors [default: runs/train].
    #[arg(long)]
    out_dir: Option<PathBuf>,

    /// Model configuration JSON (CS336 keys); the shape flags override it.
    #[arg(long)]
    model_config: Option<PathBuf>,
    /// Named model: tinystories (the default), gpt2-small, gpt2-medium, gpt2-large, gpt2-xl.
    #[arg(long)]
    preset: Option<String>,
    #[arg(long)]
    vocab_size: Option<usize>,
    #[arg(long)]
    context_length: Option<usize>,
    #[arg(long)]
    d_model: Option<usize>,
    #[arg(long)]
    num_layers: Option<usize>,
    #[arg(long)]
    num_heads: Option<usize>,
    #[arg(long)]
    d_ff: Option<usize>,
    #[arg(long)]
    rope_theta: Option<f64>,
    /// RMSNorm placement: pre, post or none.
    #[arg(long)]
    norm: Option<String>,
    /// Positional encoding: rope or none.
    #[arg(long)]
    positional: Option<String>,
    /// Feed-forward network: swiglu or silu.
    #[arg(long)]
    ffn: Option<String>,
    /// Share the embedding matrix with the LM head (true or false).
    #[arg(long)]
    tie_embeddings: Option<bool>,

    /// Sequences per step [default: 32].
    #[arg(long)]
    batch_size: Option<usize>,
    /// Optimizer steps [default: 5000].
    #[arg(long)]
    steps: Option<u64>,
    /// Token budget; sets steps = ceil(max_tokens / (batch_size · context_length)).
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Peak learning rate [default: 1e-3].
    #[arg(long)]
    lr_max: Option<f64>,
    /// Final learning rate [default: 1e-4].
    #[arg(long)]
    lr_min: Option<f64>,
    /// Linear warm-up steps [default: 100].
    #[arg(long)]
    warmup_steps: Option<u64>,
    /// End of the cosine cycle [default: the number of steps].
    #[arg(long)]
    cosine_steps: Option<u64>,
    /// AdamW β1 [default: 0.9].
    #[arg(long)]
    beta1: Option<f64>,
    /// AdamW β2 [default: 0.95].
    #[arg(long)]
    beta2: Option<f64>,
    /// AdamW ε [default: 1e-8].
    #[arg(long)]
    eps: Option<f64>,
    /// AdamW weight decay λ [default: 0.1].
    #[arg(long)]
    weight_decay: Option<f64>,
    /// Global gradient-norm limit, 0 for none [default: 1.0].
    #[arg(long)]
    grad_clip: Option<f64>,
    /// Seed of the initial weights and the batch order [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Worker threads, 0 for one per core [default: 0].
    #[arg(long)]
    threads: Option<usize>,
    /// Validate every N steps, 0 for only at the end [default: 500].
    #[arg(long)]
    eval_interval: Option<u64>,
    /// Validation batches per evaluation, 0 for the whole set [default: 0].
    #[arg(long)]
    eval_batches: Option<usize>,
    /// Checkpoint every N steps, 0 for only at the end [default: 1000].
    #[arg(long)]
    checkpoint_interval: Option<u64>,
    /// Log to log.jsonl every N steps [default: 10].
    #[arg(long)]
    log_interval: Option<u64>,
    /// Seconds the run may take, across resumes: it stops (evaluates, checkpoints)
    /// when the next step and that evaluation would end past them.
    #[arg(long)]
    time_budget_s: Option<f64>,
    /// Where to train: cpu, cuda, cuda:N or auto [default: cpu].
    #[arg(long)]
    device: Option<String>,
    /// GPU arithmetic: bf16 (mixed precision) or fp32 [default: bf16].
    #[arg(long)]
    precision: Option<String>,
    /// What the learning-rate schedule runs over: steps, or time (the time budget;
    /// the run then takes as many steps as fit) [default: steps].
    #[arg(long)]
    schedule: Option<String>,
}

impl TrainArgs {
    /// The flags that were given, as `(path of the key, value)`.
    fn overrides(&self) -> Vec<(&'static str, Value)> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| Value::from(p.to_string_lossy()));
        let string = |s: &Option<String>| s.clone().map(Value::from);
        [
            ("resume", path(&self.resume)),
            ("train_data", path(&self.train_data)),
            ("val_data", path(&self.val_data)),
            ("tokenizer", path(&self.tokenizer)),
            ("out_dir", path(&self.out_dir)),
            ("model.vocab_size", self.vocab_size.map(Value::from)),
            ("model.context_length", self.context_length.map(Value::from)),
            ("model.d_model", self.d_model.map(Value::from)),
            ("model.num_layers", self.num_layers.map(Value::from)),
            ("model.num_heads", self.num_heads.map(Value::from)),
            ("model.d_ff", self.d_ff.map(Value::from)),
            ("model.rope_theta", self.rope_theta.map(Value::from)),
            ("model.norm", string(&self.norm)),
            ("model.positional", string(&self.positional)),
            ("model.ffn", string(&self.ffn)),
            ("model.tie_embeddings", self.tie_embeddings.map(Value::from)),
            ("batch_size", self.batch_size.map(Value::from)),
            ("steps", self.steps.map(Value::from)),
            ("max_tokens", self.max_tokens.map(Value::from)),
            ("lr_max", self.lr_max.map(Value::from)),
            ("lr_min", self.lr_min.map(Value::from)),
            ("warmup_steps", self.warmup_steps.map(Value::from)),
            ("cosine_steps", self.cosine_steps.map(Value::from)),
            ("beta1", self.beta1.map(Value::from)),
            ("beta2", self.beta2.map(Value::from)),
            ("eps", self.eps.map(Value::from)),
            ("weight_decay", self.weight_decay.map(Value::from)),
            ("grad_clip", self.grad_clip.map(Value::from)),
            ("seed", self.seed.map(Value::from)),
            ("threads", self.threads.map(Value::from)),
            ("eval_interval", self.eval_interval.map(Value::from)),
            ("eval_batches", self.eval_batches.map(Value::from)),
            (
                "checkpoint_interval",
                self.checkpoint_interval.map(Value::from),
            ),
            ("log_interval", self.log_interval.map(Value::from)),
            ("time_budget_s", self.time_budget_s.map(Value::from)),
            ("device", string(&self.device)),
            ("precision", string(&self.precision)),
            ("schedule", string(&self.schedule)),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }

    /// The configuration: defaults (or the checkpoint's) ← `--config` ← `--preset` ←
    /// `--model-config` ← flags.
    fn resolve(&self) -> Result<ResolvedConfig> {
        let mut given = match &self.config {
            Some(path) => read_config(path)?,
            None => Value::Object(Map::new()),
        };
        if let Some(name) = &self.preset {
            given["model"] = serde_json::to_value(ModelConfig::preset(name)?)?;
        }
        if let Some(path) = &self.model_config {
            let model = ModelConfig::from_json_file(path)?;
            given["model"] = serde_json::to_value(model)?;
        }
        for (key, value) in self.overrides() {
            match key.split_once('.') {
                Some((outer, inner)) => given[outer][inner] = value,
                None => given[key] = value,
            }
        }
        let source = match &self.config {
            Some(p) => format!("configuration ({} and flags)", p.display()),
            None => "configuration (flags)".to_string(),
        };
        resolve_config(given, &|key| self.source_of(key)).with_context(|| source)
    }

    /// Where the value of `key` came from: its flag, or the file or preset.
    fn source_of(&self, key: &str) -> String {
        if self.overrides().iter().any(|(k, _)| *k == key) {
            let flag = key.trim_start_matches("model.").replace('_', "-");
            return format!("--{flag}");
        }
        let model_key = key.strip_prefix("model.");
        match (model_key, &self.model_config, &self.preset, &self.config) {
            (Some(k), Some(file), _, _) => format!("{k} of --model-config {}", file.display()),
            (Some(k), None, Some(preset), _) => format!("{k} of --preset {preset}"),
            (_, _, _, Some(file)) => format!("{key} of --config {}", file.display()),
            _ => key.to_string(),
        }
    }
}

/// A TOML or JSON configuration file as a JSON value.
fn read_config(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => toml::from_str::<Value>(&text).map_err(|e| anyhow!("{e}")),
        Some("json") => serde_json::from_str::<Value>(&text).map_err(|e| anyhow!("{e}")),
        _ => Err(anyhow!("expected a .toml or .json file")),
    };
    value.with_context(|| format!("{}: not a valid configuration", path.display()))
}

pub fn run(args: TrainArgs) -> Result<()> {
    let resolved = args.resolve()?;
    let cfg = &resolved.config;
    if args.print_config {
        println!("{}", serde_json::to_string_pretty(&cfg)?);
        return Ok(());
    }
    if let Some(note) = resolved.resume_note() {
        println!("{note}");
    }
    ctrlc::set_handler(|| {
        if STOP.swap(true, Ordering::Relaxed) {
            std::process::exit(130); // a second Ctrl-C: leave at once
        }
    })
    .context("installing the Ctrl-C handler")?;

    let total = cfg.total_steps();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{bar:30.cyan/blue} {pos}/{len} steps · {msg} · {elapsed_precise} < {eta_precise}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let mut first = true;
    let summary = train(cfg, &STOP, &mut |p: &Progress| {
        let r = p.record;
        if first {
            // A resumed run starts part-way: measure the ETA from here.
            bar.set_position(r.step - 1);
            bar.reset_eta();
            first = false;
        }
        bar.set_length(p.total_steps);
        bar.set_position(r.step);
        bar.set_message(format!(
            "loss {:.4} · lr {:.2e} · {:.0} tok/s",
            r.train_loss, r.lr, r.tokens_per_s
        ));
        if let Some(v) = r.val_loss {
            bar.println(format!(
                "step {:>6}  train_loss {:.4}  val_loss {v:.4}  ({:.0} s)",
                r.step, r.train_loss, r.wallclock_s
            ));
        }
    });
    bar.finish_and_clear();
    let summary = summary?;
    let val = summary.val_loss.map_or(String::new(), |v| {
        format!(", val_loss {v:.4} (perplexity {:.2})", v.exp())
    });
    println!(
        "{} {} steps ({} tokens) in {:.1} s: train_loss {:.4}{val}",
        if summary.stopped_early {
            "stopped after"
        } else {
            "trained"
        },
        summary.steps,
        summary.tokens,
        summary.wallclock_s,
        summary.train_loss,
    );
    let out = &cfg.out_dir;
    println!(
        "checkpoint {}\nlog        {}\nplot       {}",
        summary.checkpoint.display(),
        out.join("log.jsonl").display(),
        out.join("loss.svg").display()
    );
    if summary.stopped_early {
        println!(
            "resume with: tinylm train --resume {}",
            summary.checkpoint.display()
        );
    }
    Ok(())
}
