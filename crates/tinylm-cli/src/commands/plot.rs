//! `tinylm plot`: the loss curves of many runs in one figure, SVG or PNG.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use tinylm::compare::{find_runs, write_comparison, CompareOptions, XAxis};

#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Run directories (each with a log.jsonl) or sweep directories whose
    /// subdirectories are runs (taken in name order).
    #[arg(required = true, value_name = "RUN_OR_SWEEP_DIR")]
    dirs: Vec<PathBuf>,
    /// What the x axis counts: step, tokens or wall (wall-clock seconds).
    #[arg(long, default_value = "step")]
    x: XAxis,
    /// Logarithmic x axis.
    #[arg(long)]
    log_x: bool,
    /// Logarithmic loss axes.
    #[arg(long)]
    log_y: bool,
    /// The figure: .svg or .png.
    #[arg(long, default_value = "loss.png")]
    out: PathBuf,
    /// A title above both panels.
    #[arg(long)]
    title: Option<String>,
}

pub fn run(args: PlotArgs) -> Result<()> {
    let runs = find_runs(&args.dirs)?;
    let opts = CompareOptions {
        x: args.x,
        log_x: args.log_x,
        log_y: args.log_y,
        title: args.title,
    };
    write_comparison(&args.out, &runs, &opts)?;
    let s = if runs.len() == 1 { "" } else { "s" };
    println!("wrote {} ({} run{s})", args.out.display(), runs.len());
    Ok(())
}
