//! `tinylm train`: train a model from a TOML/JSON config file and/or flags.
//!
//! The configuration is built in layers, each overriding the one before: the
//! defaults of [`TrainConfig`] — or, with `--resume`, the configuration the
//! checkpoint recorded — then the `--config` file, `--preset` or the `--model-config`
//! file, and every individual flag (see [`resolve_config`]). Each flag is named as
//! the [`TrainConfig`] key it sets, the keys given are the parsed flags serialized
//! ([`TrainArgs::overrides`]), and the defaults the help shows are
//! [`TrainConfig::default`]'s.

use super::flags::{flag, flag_values, parse_spelling, show_defaults, ModelArgs};
use super::ranks::as_rank;
use super::stop_on_ctrl_c;
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::PathBuf;
use tinylm::accounting::{largest_micro_batch, RunShape};
use tinylm::device::{self, describe_precision, rank_device, Device, DeviceMemory};
use tinylm::distributed::World;
use tinylm::kernels::Precision;
use tinylm::text::byte_size;
use tinylm::train::{
    read_config_file, resolve_config, train, Progress, ResolvedConfig, Schedule, TrainConfig,
};

#[derive(Args, Debug)]
#[command(mut_args = show_defaults(&TrainConfig::default()))]
pub struct TrainArgs {
    /// Training configuration, `.toml` or `.json`, with the keys of the flags below
    /// (underscores for dashes) and the model under `model`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the resolved configuration as JSON and exit without training.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    keys: TrainFlags,
    #[command(flatten)]
    model: ModelArgs,
}

/// A flag for every key of [`TrainConfig`] but `model` (whose keys are
/// [`ModelArgs`]'): the fields are named as the keys, and a flag not given is
/// `None`, so that the `--config` file or the resumed checkpoint sets its key. The
/// defaults the help shows are [`TrainConfig::default`]'s.
#[derive(Args, Debug, Serialize)]
struct TrainFlags {
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
    /// Output directory: log.jsonl, loss.svg, checkpoint.safetensors.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Sequences per optimizer step, over all ranks.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Sequences per forward/backward [default: a rank's whole share]: the step's
    /// gradient is accumulated over batch_size / (ranks · micro_batch_size) of them.
    #[arg(long)]
    micro_batch_size: Option<usize>,
    /// ZeRO stage: 1 shards the AdamW moments over the ranks (0: every rank has all).
    #[arg(long)]
    zero: Option<u8>,
    /// Optimizer steps.
    #[arg(long)]
    steps: Option<u64>,
    /// Token budget; sets steps = ceil(max_tokens / (batch_size · context_length)).
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Peak learning rate.
    #[arg(long)]
    lr_max: Option<f64>,
    /// Final learning rate.
    #[arg(long)]
    lr_min: Option<f64>,
    /// Linear warm-up steps.
    #[arg(long)]
    warmup_steps: Option<u64>,
    /// End of the cosine cycle [default: the number of steps].
    #[arg(long)]
    cosine_steps: Option<u64>,
    /// AdamW β1.
    #[arg(long)]
    beta1: Option<f64>,
    /// AdamW β2.
    #[arg(long)]
    beta2: Option<f64>,
    /// AdamW ε.
    #[arg(long)]
    eps: Option<f64>,
    /// AdamW weight decay λ.
    #[arg(long)]
    weight_decay: Option<f64>,
    /// Global gradient-norm limit, 0 for none.
    #[arg(long)]
    grad_clip: Option<f64>,
    /// End the run as diverged when a step's loss exceeds this many times the first
    /// step's, 0 for only a non-finite loss.
    #[arg(long)]
    diverge_factor: Option<f64>,
    /// Seed of the initial weights and the batch order.
    #[arg(long)]
    seed: Option<u64>,
    /// Worker threads; 0: one per core (under mpirun: per rank).
    #[arg(long)]
    threads: Option<usize>,
    /// Validate every N steps, 0 for only at the end.
    #[arg(long)]
    eval_interval: Option<u64>,
    /// Validation batches per evaluation, 0 for the whole set.
    #[arg(long)]
    eval_batches: Option<usize>,
    /// Checkpoint every N steps, 0 for only at the end.
    #[arg(long)]
    checkpoint_interval: Option<u64>,
    /// Log to log.jsonl every N steps.
    #[arg(long)]
    log_interval: Option<u64>,
    /// Also write TensorBoard event files to OUT_DIR/tensorboard (default: true).
    #[arg(long)]
    tensorboard: Option<bool>,
    /// Seconds the run may take, across resumes: it stops (evaluates, checkpoints)
    /// when the next step and that evaluation would end past them.
    #[arg(long)]
    time_budget_s: Option<f64>,
    /// What the learning-rate schedule runs over: steps, or time (the time budget;
    /// the run then takes as many steps as fit).
    #[arg(long, value_parser = parse_spelling::<Schedule>)]
    schedule: Option<Schedule>,
    /// Where to train: cpu, cuda, cuda:N or auto.
    #[arg(long)]
    device: Option<Device>,
    /// Arithmetic: bf16 (mixed precision: bf16 products summed in f32), fp32, or
    /// auto (bf16 where the CPU or GPU multiplies bf16 natively, else fp32).
    #[arg(long)]
    precision: Option<Precision>,
}

impl TrainArgs {
    /// The flags given, as `(key, value)`: [`TrainConfig`]'s keys, `model.<key>` for
    /// the model's.
    fn overrides(&self) -> Result<Vec<(String, Value)>> {
        let model = flag_values(&self.model)?;
        let model = model.into_iter().map(|(k, v)| (format!("model.{k}"), v));
        Ok(flag_values(&self.keys)?.into_iter().chain(model).collect())
    }

    /// The configuration: defaults (or the checkpoint's) ← `--config` ← `--preset` or
    /// `--model-config` ← flags.
    fn resolve(&self) -> Result<ResolvedConfig> {
        let (given, overrides) = self.given()?;
        resolve_config(given, &|key| self.source_of(key, &overrides)).with_context(|| self.source())
    }

    /// The keys given — `--config` ← `--preset` or `--model-config` ← flags — as a
    /// table (the model's under `model`), and the flags given.
    pub fn given(&self) -> Result<(Value, Vec<(String, Value)>)> {
        let mut given = match &self.config {
            Some(path) => read_config_file(path)?,
            None => Value::Object(Map::new()),
        };
        if let Some(model) = self.model.base()? {
            given["model"] = serde_json::to_value(model)?;
        }
        let overrides = self.overrides()?;
        for (key, value) in &overrides {
            match key.split_once('.') {
                Some((outer, inner)) => given[outer][inner] = value.clone(),
                None => given[key.as_str()] = value.clone(),
            }
        }
        Ok((given, overrides))
    }

    /// Where the configuration comes from, for errors.
    fn source(&self) -> String {
        match &self.config {
            Some(p) => format!("configuration ({} and flags)", p.display()),
            None => "configuration (flags)".to_string(),
        }
    }

    /// Whether `--print-config` was given.
    pub fn print_config(&self) -> bool {
        self.print_config
    }

    /// Where the value of `key` came from: its flag (when in `overrides`), or the
    /// file or preset.
    fn source_of(&self, key: &str, overrides: &[(String, Value)]) -> String {
        if overrides.iter().any(|(k, _)| k == key) {
            return flag(key);
        }
        let model_key = key.strip_prefix("model.");
        let model = &self.model;
        match (model_key, &model.model_config, &model.preset, &self.config) {
            (Some(k), Some(file), _, _) => format!("{k} of --model-config {}", file.display()),
            (Some(k), None, Some(preset), _) => format!("{k} of --preset {preset}"),
            (_, _, _, Some(file)) => format!("{key} of --config {}", file.display()),
            _ => key.to_string(),
        }
    }
}

/// A warning when the run will not fit in the memory of this rank's device (a
/// GPU's, or the host's shared by the ranks on this machine), by the memory model
/// of `tinylm info`; `None` when it fits or the system does not say.
fn memory_warning(cfg: &TrainConfig, world: &World) -> Option<String> {
    let device = rank_device(cfg.device, world).ok()?;
    let memory = device::memory(device).ok()??;
    // Ranks on the CPU share the host's memory; each GPU is a rank's own.
    let sharing = match device {
        Device::Cpu => world.local_ranks(),
        _ => 1,
    };
    warning_for(cfg, world.ranks(), sharing, device, memory)
}

/// [`memory_warning`] for a run over `ranks` ranks, `sharing` of which share
/// `device` and its `memory`.
fn warning_for(
    cfg: &TrainConfig,
    ranks: usize,
    sharing: usize,
    device: Device,
    memory: DeviceMemory,
) -> Option<String> {
    let shape = RunShape::of(cfg, ranks).ok()?;
    let split = cfg.batch_split(ranks).ok()?;
    let sharing = sharing as u64;
    let needs = |micro| sharing * shape.memory(&cfg.model, split.share, micro).required();
    let needed = needs(split.micro);
    if needed <= memory.available {
        return None;
    }
    let hint = match largest_micro_batch(split.share, memory.available, needs) {
        Some(m) => format!("--micro-batch-size {m} fits and trains the same"),
        None => "not even micro-batches of 1 fit: a smaller model, or more ranks with --zero 1"
            .to_string(),
    };
    let ranks_note = match sharing {
        1 => String::new(),
        n => format!(" for its {n} ranks on this machine"),
    };
    Some(format!(
        "this run needs about {}{ranks_note} (see `tinylm info`), more than the {} available of {} on {device}: it may be killed; {hint}",
        byte_size(needed),
        byte_size(memory.available),
        byte_size(memory.total),
    ))
}

/// Trains as one rank of the ranks a launcher (`mpirun`, `srun`) started, or alone
/// ([`as_rank`]).
pub fn run(args: TrainArgs) -> Result<()> {
    as_rank(|world| run_rank(args, world))
}

fn run_rank(args: TrainArgs, world: &World) -> Result<()> {
    let resolved = args.resolve()?;
    let cfg = &resolved.config;
    let root = world.is_root();
    if args.print_config {
        if root {
            println!("{}", serde_json::to_string_pretty(&cfg)?);
        }
        return Ok(());
    }
    if root {
        let device = rank_device(cfg.device, world)?;
        println!(
            "training on {device} in {}",
            describe_precision(device, cfg.precision)
        );
    }
    if let (Some(note), true) = (resolved.resume_note(), root) {
        println!("{note}");
    }
    if world.ranks() > 1 && root {
        let split = cfg.batch_split(world.ranks())?;
        println!(
            "{} ranks: {} sequences each per step, in micro-batches of {}{}",
            world.ranks(),
            split.share,
            split.micro,
            if cfg.zero == 1 {
                ", AdamW state sharded (ZeRO-1)"
            } else {
                ""
            }
        );
    }
    if let Some(warning) = memory_warning(cfg, world) {
        eprintln!("warning: {warning}");
    }
    // Ctrl-C, or the SIGTERM a launcher forwards: rank 0's flag ends every rank.
    let stop = stop_on_ctrl_c()?;

    let total = cfg.total_steps();
    let bar = match root {
        true => ProgressBar::new(total),
        false => ProgressBar::hidden(),
    };
    let bar = bar.with_style(
        ProgressStyle::with_template(
            "{bar:30.cyan/blue} {pos}/{len} steps · {msg} · {elapsed_precise} < {eta_precise}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let mut first = true;
    let summary = train(cfg, world, stop, &mut |p: &Progress| {
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
    if !root {
        return Ok(());
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Command, FromArgMatches};
    use std::collections::{BTreeMap, BTreeSet};
    use tinylm::config::{Ffn, Norm, Positional};
    use tinylm::ModelConfig;

    /// The flags that set no key of [`TrainConfig`], on purpose: the configuration
    /// file and printing it, and the model's base (the model key is set whole).
    const NOT_KEYS: [&str; 4] = ["config", "print_config", "model_config", "preset"];

    fn command() -> Command {
        TrainArgs::augment_args(Command::new("train"))
    }

    /// The warning names the need, what is available, and the micro-batch that fits;
    /// ranks sharing the host multiply the need.
    #[test]
    fn memory_warning_says_what_fits() {
        let cfg = TrainConfig {
            model: ModelConfig::tinystories(),
            batch_size: 64,
            ..TrainConfig::default()
        };
        let shape = RunShape::of(&cfg, 1).unwrap();
        let needs = |micro| shape.memory(&cfg.model, 64, micro).required();
        let memory = |available| DeviceMemory {
            available,
            total: 1 << 40,
        };
        assert_eq!(
            warning_for(&cfg, 1, 1, Device::Cpu, memory(needs(64))),
            None
        );
        let w = warning_for(&cfg, 1, 1, Device::Cpu, memory(needs(16))).unwrap();
        assert!(
            w.contains(&byte_size(needs(64)))
                && w.contains(&byte_size(needs(16)))
                && w.contains("--micro-batch-size 16 fits"),
            "{w}"
        );
        let w = warning_for(&cfg, 1, 1, Device::Cpu, memory(needs(1) - 1)).unwrap();
        assert!(w.contains("not even micro-batches of 1"), "{w}");
        // Two ranks of 32 sequences each on one host need twice a rank's memory.
        let rank = RunShape::of(&cfg, 2)
            .unwrap()
            .memory(&cfg.model, 32, 32)
            .required();
        assert_eq!(warning_for(&cfg, 2, 2, Device::Cpu, memory(2 * rank)), None);
        let w = warning_for(&cfg, 2, 2, Device::Cpu, memory(2 * rank - 1)).unwrap();
        assert!(w.contains("for its 2 ranks on this machine"), "{w}");
    }

    #[test]
    fn every_key_has_a_flag_and_every_flag_a_key() {
        // Every optional key set and every switch off its default, so that each
        // key has a value to give its flag.
        let config = TrainConfig {
            model: ModelConfig {
                norm: Norm::Post,
                positional: Positional::None,
                ffn: Ffn::Silu,
                tie_embeddings: true,
                ..ModelConfig::tinystories()
            },
            train_data: "train.npy".into(),
            val_data: Some("val.npy".into()),
            tokenizer: Some("tokenizer".into()),
            max_tokens: Some(1 << 20),
            micro_batch_size: Some(4),
            cosine_steps: Some(900),
            time_budget_s: Some(60.0),
            schedule: Schedule::Time,
            resume: Some("checkpoint.safetensors".into()),
            device: Device::Cuda(1),
            precision: Precision::Fp32,
            ..TrainConfig::default()
        };
        let keys = config.keys();
        let mut argv = vec!["train".to_string()];
        for (key, value) in &keys {
            let text = match value {
                Value::String(text) => text.clone(),
                Value::Null => panic!("{key} has no value to give its flag: set it above"),
                value => value.to_string(),
            };
            argv.extend([flag(key), text]);
        }
        let matches = command()
            .try_get_matches_from(&argv)
            .unwrap_or_else(|e| panic!("a key without its flag: {e}"));
        let args = TrainArgs::from_arg_matches(&matches).unwrap();
        let given: BTreeMap<String, Value> = args.overrides().unwrap().into_iter().collect();
        assert_eq!(given, keys, "the flags give other keys or values");

        let flags: BTreeSet<String> = command()
            .get_arguments()
            .map(|arg| arg.get_id().as_str())
            .filter(|id| !NOT_KEYS.contains(id))
            .map(flag)
            .collect();
        let flags_of_keys: BTreeSet<String> = keys.keys().map(|key| flag(key)).collect();
        assert_eq!(flags, flags_of_keys, "a flag that sets no key");
    }

    #[test]
    fn the_help_shows_the_defaults_of_train_config() {
        let command = command();
        let help = |id: &str| {
            let arg = command.get_arguments().find(|a| a.get_id() == id);
            arg.and_then(|a| a.get_help()).map(ToString::to_string)
        };
        assert_eq!(help("steps").unwrap(), "Optimizer steps [default: 5000]");
        assert_eq!(
            help("d_model").unwrap(),
            "Width of the residual stream [default: 512]"
        );
        assert_eq!(
            help("schedule").unwrap().rsplit('[').next(),
            Some("default: steps]")
        );
        for (key, value) in TrainConfig::default().keys() {
            let id = key.rsplit('.').next().unwrap();
            let shown = match value {
                Value::Null => continue,
                Value::String(text) if text.is_empty() => continue,
                Value::String(text) => text,
                value => value.to_string(),
            };
            let help = help(id).unwrap_or_default();
            assert!(
                help.ends_with(&format!("[default: {shown}]")),
                "{key}: {help}"
            );
        }
    }
}
