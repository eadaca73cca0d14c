//! `tinylm sweep`: one training run per point of a grid (`--grid KEY=V1,V2`) and/or
//! a list of named variants (`--list no-norm,silu`), over a base configuration
//! given as to `tinylm train` (`--config` and flags), each run in a directory of
//! `--out` named by its values; then a table, `summary.csv` and comparison plots
//! (see [`tinylm::sweep`]). The same command again finishes an interrupted sweep.

use super::stop_on_ctrl_c;
use super::train::TrainArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use tinylm::sweep::{points, Axis, Observer, Point, RunResult, Start, Sweep, Variant};
use tinylm::train::Progress;

#[derive(Args, Debug)]
pub struct SweepArgs {
    /// Sweep directory: a run directory per point, summary.csv, loss.{svg,png}
    /// (against steps) and loss_wall.{svg,png} (against wall-clock).
    #[arg(long)]
    out: PathBuf,
    /// A grid axis: a training key (lr_max, batch_size, ...) or a model key (d_model,
    /// norm, ...) and its values; repeat for more axes (every combination runs).
    #[arg(long = "grid", value_name = "KEY=V1,V2,...")]
    grid: Vec<String>,
    /// Named variants, each run over the grid: presets (baseline, no-norm, post-norm,
    /// nope, silu with d_ff = 4·d_model) comma-separated, or NAME:KEY=V,KEY=V; repeatable.
    #[arg(long = "list", value_name = "VARIANTS")]
    list: Vec<String>,
    /// Runs at once; the cores are split between them unless --threads is given.
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    #[command(flatten)]
    base: TrainArgs,
}

pub fn run(args: SweepArgs) -> Result<()> {
    let sweep = plan(&args)?;
    if args.base.print_config() {
        for point in &sweep.points {
            println!(
                "# {}\n{}",
                point.name,
                serde_json::to_string_pretty(&point.config)?
            );
        }
        return Ok(());
    }
    let stop = stop_on_ctrl_c()?;
    let n = sweep.points.len();
    println!(
        "sweep of {n} runs in {}{}",
        sweep.out.display(),
        match sweep.parallel {
            1 => String::new(),
            p => format!(", {p} at a time"),
        }
    );
    let bars = Bars {
        multi: MultiProgress::new(),
        bars: Mutex::new(HashMap::new()),
        runs: n,
    };
    let results = sweep.run(stop, &bars)?;
    println!("\n{}", sweep.table(&results));
    println!("summary {}", sweep.out.join("summary.csv").display());
    if results.iter().any(|r| r.summary.is_some()) {
        println!(
            "plots   {} (steps), {} (wall-clock)",
            sweep.out.join("loss.png").display(),
            sweep.out.join("loss_wall.png").display()
        );
    }
    if stop.load(Ordering::Relaxed) {
        println!("stopped: the same command again continues the sweep");
    }
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        bail!("{failed} of {n} runs failed (their errors are above)");
    }
    Ok(())
}

/// The sweep the arguments describe; a bad axis, variant or base is an error
/// naming it.
fn plan(args: &SweepArgs) -> Result<Sweep> {
    // A configuration file's out_dir is replaced by each run's directory.
    let (base, flags) = args.base.given()?;
    if !base["resume"].is_null() {
        bail!("resume: a sweep resumes its runs itself: run the same command again");
    }
    if flags.iter().any(|(key, _)| key == "out_dir") {
        bail!("--out-dir: a sweep's runs go in subdirectories of --out");
    }
    let axes = args
        .grid
        .iter()
        .map(|spec| Axis::parse(spec).with_context(|| format!("--grid {spec}")))
        .collect::<Result<Vec<_>>>()?;
    let mut variants = Vec::new();
    for spec in &args.list {
        variants.extend(Variant::parse_list(spec).with_context(|| format!("--list {spec}"))?);
    }
    let points = points(&base, &axes, &variants, &args.out)?;
    Ok(Sweep::new(&args.out, points, args.parallel)?)
}

/// A progress bar per run going on, and a line per run ended.
struct Bars {
    multi: MultiProgress,
    bars: Mutex<HashMap<usize, ProgressBar>>,
    runs: usize,
}

impl Bars {
    /// Prints a line about point `i` above the bars (which are hidden without a terminal).
    fn line(&self, i: usize, point: &Point, text: &str) {
        let line = format!("[{}/{}] {}: {text}", i + 1, self.runs, point.name);
        match self.multi.is_hidden() {
            true => println!("{line}"),
            false => drop(self.multi.println(line)),
        }
    }
}

impl Observer for Bars {
    fn start(&self, i: usize, point: &Point, start: &Start) {
        match start {
            Start::Done => return,
            Start::Resume(step) => self.line(i, point, &format!("resuming at step {step}")),
            Start::Fresh => {}
        }
        let bar = self.multi.add(ProgressBar::new(point.config.total_steps()));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} {bar:24.cyan/blue} {pos}/{len} · {msg} · {elapsed_precise} < {eta_precise}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(point.name.clone());
        self.bars.lock().expect("not poisoned").insert(i, bar);
    }

    fn step(&self, i: usize, p: &Progress) {
        if let Some(bar) = self.bars.lock().expect("not poisoned").get(&i) {
            let r = p.record;
            bar.set_length(p.total_steps);
            bar.set_position(r.step);
            bar.set_message(format!(
                "loss {:.4} · {:.0} tok/s",
                r.train_loss, r.tokens_per_s
            ));
        }
    }

    fn end(&self, i: usize, point: &Point, result: &RunResult) {
        if let Some(bar) = self.bars.lock().expect("not poisoned").remove(&i) {
            bar.finish_and_clear();
        }
        let text = match (&result.summary, &result.error) {
            (_, Some(error)) => format!("failed: {error}"),
            (None, None) => "not run".to_string(),
            (Some(s), None) => {
                let loss = |name: &str, v: Option<f64>| {
                    v.map_or(String::new(), |v| format!(" · {name} {v:.4}"))
                };
                let status = match &s.diverged {
                    Some(d) => format!("diverged at step {}: {}", d.step, d.reason),
                    None => format!("{} after {} steps", s.status, s.steps),
                };
                format!(
                    "{status}{}{}{}",
                    loss("train", s.train_loss),
                    loss("val", s.val_loss),
                    match result.skipped {
                        true => " (ended earlier)".to_string(),
                        false => format!(" · {:.0} tok/s · {:.0} s", s.tokens_per_s, s.wallclock_s),
                    }
                )
            }
        };
        self.line(i, point, &text);
    }
}
