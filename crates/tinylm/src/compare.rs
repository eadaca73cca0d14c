//! Many runs compared: training loss (left panel) and validation loss (right panel)
//! against steps, tokens or wall-clock seconds, one color per run (the same in both
//! panels), and below them a legend naming each run by the configuration keys whose
//! values differ between the runs.

use crate::plot::{write_figure, DrawResult, Figure, FONT, PALETTE};
use crate::train::{LogRecord, RunDir, Status, LOG_FILE};
use crate::{Error, Result};
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What the comparison's x axis counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XAxis {
    /// Optimizer steps.
    #[default]
    Step,
    /// Training tokens processed.
    Tokens,
    /// Wall-clock seconds since the run started (across resumes).
    Wall,
}

impl XAxis {
    /// A record's position on the axis: steps, tokens or seconds.
    fn of(self, record: &LogRecord) -> f64 {
        match self {
            XAxis::Step => record.step as f64,
            XAxis::Tokens => record.tokens as f64,
            XAxis::Wall => record.wallclock_s,
        }
    }

    /// The axis's description.
    fn label(self) -> &'static str {
        match self {
            XAxis::Step => "step",
            XAxis::Tokens => "tokens",
            XAxis::Wall => "wall-clock (s)",
        }
    }
}

impl FromStr for XAxis {
    type Err = String;

    /// `step`, `tokens` or `wall`.
    fn from_str(text: &str) -> std::result::Result<XAxis, String> {
        match text {
            "step" => Ok(XAxis::Step),
            "tokens" => Ok(XAxis::Tokens),
            "wall" => Ok(XAxis::Wall),
            _ => Err(format!(
                "unknown x axis {text:?}: expected step, tokens or wall"
            )),
        }
    }
}

/// How [`write_comparison`] draws the runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareOptions {
    /// What the x axis counts.
    pub x: XAxis,
    /// Logarithmic x axis (points at x ≤ 0 are left out).
    pub log_x: bool,
    /// Logarithmic loss axes (losses ≤ 0 are left out).
    pub log_y: bool,
    /// A title above both panels.
    pub title: Option<String>,
}

/// The runs under `dirs`, in order: each is a run directory (it holds a `log.jsonl`)
/// or a sweep directory whose immediate subdirectories that are runs are taken,
/// sorted by name. An error names the directory with no run, or the file at fault.
pub fn find_runs(dirs: &[PathBuf]) -> Result<Vec<RunDir>> {
    let mut runs = Vec::new();
    for dir in dirs {
        if RunDir::is_run(dir) {
            runs.push(RunDir::open(dir)?);
            continue;
        }
        let mut subdirs = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let path = entry.map_err(|e| Error::io(dir, e))?.path();
            if RunDir::is_run(&path) {
                subdirs.push(path);
            }
        }
        if subdirs.is_empty() {
            return Err(Error::Invalid(format!(
                "{}: no runs (no {LOG_FILE} in it or its subdirectories)",
                dir.display()
            )));
        }
        subdirs.sort();
        for path in subdirs {
            runs.push(RunDir::open(&path)?);
        }
    }
    Ok(runs)
}

/// Writes the comparison of `runs` to `path`, SVG or PNG by its extension (temporary
/// file and rename). Non-finite losses are left out; a diverged run's curves end
/// with a cross at their last point.
pub fn write_comparison(path: &Path, runs: &[RunDir], opts: &CompareOptions) -> Result<()> {
    if runs.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no runs to plot",
            path.display()
        )));
    }
    let labels = labels(runs);
    let curves = runs
        .iter()
        .zip(labels)
        .enumerate()
        .map(|(i, (run, label))| Curve::new(run, label, line_style(i), opts))
        .collect();
    write_figure(path, &Comparison { curves, opts })
}

/// Configuration keys that never tell runs apart usefully: where a run writes, what
/// it resumed from, its thread count and whether it wrote TensorBoard files.
const IGNORED_KEYS: [&str; 4] = ["out_dir", "resume", "threads", "tensorboard"];

/// Each run's legend label: `key=value` for each configuration key (without the
/// `model.` prefix) whose value differs between the runs that have a configuration,
/// or the directory's name when none differs or the run has none; the directory's
/// name in parentheses when two labels would be the same; ` (diverged at step N)`
/// for a diverged run.
fn labels(runs: &[RunDir]) -> Vec<String> {
    let configs: Vec<BTreeMap<String, Value>> = runs
        .iter()
        .map(|run| {
            let mut flat = run.flat_config();
            flat.retain(|key, _| !IGNORED_KEYS.contains(&key.as_str()));
            flat
        })
        .collect();
    let configured: Vec<&BTreeMap<String, Value>> =
        configs.iter().filter(|c| !c.is_empty()).collect();
    let differing: Vec<&String> = match configured.first() {
        Some(first) => first
            .keys()
            .filter(|&key| configured.iter().any(|c| c.get(key) != first.get(key)))
            .collect(),
        None => Vec::new(),
    };
    let names: Vec<String> = runs.iter().map(|run| dir_name(&run.path)).collect();
    let bases: Vec<String> = configs
        .iter()
        .zip(&names)
        .map(
            |(config, name)| match config.is_empty() || differing.is_empty() {
                true => name.clone(),
                false => differing
                    .iter()
                    .map(|&key| {
                        let short = key.strip_prefix("model.").unwrap_or(key);
                        format!("{short}={}", value_text(config.get(key)))
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            },
        )
        .collect();
    bases
        .iter()
        .zip(&names)
        .zip(runs)
        .map(|((base, name), run)| {
            let mut label = base.clone();
            if base != name && bases.iter().filter(|&b| b == base).count() > 1 {
                label.push_str(&format!(" ({name})"));
            }
            if let Some(summary) = run
                .summary
                .as_ref()
                .filter(|s| s.status == Status::Diverged)
            {
                match &summary.diverged {
                    Some(at) => label.push_str(&format!(" (diverged at step {})", at.step)),
                    None => label.push_str(" (diverged)"),
                }
            }
            label
        })
        .collect()
}

/// A run directory's name (of the absolute path for `.` and the like).
fn dir_name(path: &Path) -> String {
    let absolute = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    match absolute.file_name() {
        Some(name) => name.to_string_lossy().into_owned(),
        None => path.display().to_string(),
    }
}

/// A configuration value as a legend shows it: numbers by [`compact`], strings
/// unquoted, a missing or null value as `none`.
fn value_text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "none".to_string(),
        Some(Value::Number(n)) if n.is_f64() => compact(n.as_f64().expect("an f64")),
        Some(Value::String(s)) => s.clone(),
        Some(value) => value.to_string(),
    }
}

/// A number written short: plainly from 0.001 up to 100000 (`0.001`, `256`, `2.5`),
/// with an exponent outside (`3e-4`, `1e6`), 0 as `0`.
fn compact(x: f64) -> String {
    match x == 0.0 || (1e-3..1e5).contains(&x.abs()) {
        true => format!("{x}"),
        false => format!("{x:e}"),
    }
}

/// How a run's line is drawn: a palette color, dashed from the 21st run on.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LineStyle {
    color: RGBColor,
    /// Dash and gap lengths in pixels; `None`: solid.
    dash: Option<(u32, u32)>,
}

/// Run `i`'s line: the palette's colors in turn, solid for the first 20 runs, then
/// dashed, then dotted, then solid again.
fn line_style(i: usize) -> LineStyle {
    const DASHES: [Option<(u32, u32)>; 3] = [None, Some((8, 4)), Some((2, 3))];
    LineStyle {
        color: PALETTE[i % PALETTE.len()],
        dash: DASHES[i / PALETTE.len() % DASHES.len()],
    }
}

/// A run as drawn: its label, line and points (x, loss), each finite and positive
/// on a logarithmic axis.
#[derive(Clone, Debug, PartialEq)]
struct Curve {
    label: String,
    style: LineStyle,
    train: Vec<(f64, f64)>,
    val: Vec<(f64, f64)>,
    /// The run diverged: its curves end with a cross.
    diverged: bool,
}

impl Curve {
    fn new(run: &RunDir, label: String, style: LineStyle, opts: &CompareOptions) -> Curve {
        let keep = |&(x, y): &(f64, f64)| {
            x.is_finite() && y.is_finite() && (!opts.log_x || x > 0.0) && (!opts.log_y || y > 0.0)
        };
        let at = |r: &LogRecord, loss| (opts.x.of(r), loss);
        Curve {
            label,
            style,
            train: run
                .records
                .iter()
                .map(|r| at(r, r.train_loss))
                .filter(keep)
                .collect(),
            val: run
                .records
                .iter()
                .filter_map(|r| r.val_loss.map(|v| at(r, v)))
                .filter(keep)
                .collect(),
            diverged: run
                .summary
                .as_ref()
                .is_some_and(|s| s.status == Status::Diverged),
        }
    }

    /// The validation points, or the training points.
    fn points(&self, validation: bool) -> &[(f64, f64)] {
        match validation {
            true => &self.val,
            false => &self.train,
        }
    }
}

/// An axis, linear or logarithmic: one type for both, so that one chart type serves
/// every combination of `--log-x` and `--log-y`.
enum Scale {
    Linear(RangedCoordf64),
    Log(LogCoord<f64>),
}

impl Scale {
    /// The axis over the values `values` (padded by 5%; from 0 on a linear axis whose
    /// values are all ≥ 0 when `from_zero`); `(0, 1)` or `(1, 10)` without values.
    fn over(values: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> Scale {
        let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        match (log, lo <= hi) {
            (true, true) => Scale::Log((lo * 0.95..hi * 1.05).log_scale().into()),
            (true, false) => Scale::Log((1.0..10.0).log_scale().into()),
            (false, true) => {
                let lo = if from_zero && lo >= 0.0 { 0.0 } else { lo };
                let pad = ((hi - lo) * 0.05).max(1e-3);
                let lo = if lo == 0.0 { 0.0 } else { lo - pad };
                Scale::Linear((lo..hi + pad).into())
            }
            (false, false) => Scale::Linear((0.0..1.0).into()),
        }
    }
}

impl Ranged for Scale {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        match self {
            Scale::Linear(r) => r.map(value, limit),
            Scale::Log(r) => r.map(value, limit),
        }
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        match self {
            Scale::Linear(r) => r.key_points(hint),
            Scale::Log(r) => log_key_points(r.range(), hint.max_num_points()),
        }
    }

    fn range(&self) -> Range<f64> {
        match self {
            Scale::Linear(r) => r.range(),
            Scale::Log(r) => r.range(),
        }
    }
}

/// At most `max` ticks on a logarithmic axis over `range` (values > 0): the powers
/// of ten in it (every k-th when there are too many); with fewer than three, the
/// multiples 1, 2 and 5 of them; with fewer than three of those (or too many), the
/// ticks a linear axis would have.
fn log_key_points(range: Range<f64>, max: usize) -> Vec<f64> {
    let (lo, hi) = (
        range.start.log10().floor() as i32,
        range.end.log10().ceil() as i32,
    );
    let ticks = |mantissas: &[f64]| -> Vec<f64> {
        (lo..=hi)
            .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| range.contains(v))
            .collect()
    };
    let decades = ticks(&[1.0]);
    if decades.len() >= 3 {
        let every = decades.len().div_ceil(max.max(1));
        return decades.into_iter().step_by(every).take(max).collect();
    }
    let multiples = ticks(&[1.0, 2.0, 5.0]);
    match (3..=max).contains(&multiples.len()) {
        true => multiples,
        false => RangedCoordf64::from(range).key_points(max),
    }
}

impl ValueFormatter<f64> for Scale {
    /// A tick's label: [`compact`] after rounding to 6 significant digits, which
    /// drops the float noise of computed tick positions (`0.30000000000000004`).
    fn format(value: &f64) -> String {
        compact(format!("{value:.5e}").parse().expect("a formatted f64"))
    }
}

/// Pixels: the figure's width, the panels' height, the title band's.
const WIDTH: u32 = 1400;
const PANEL_HEIGHT: u32 = 480;
const TITLE_HEIGHT: u32 = 40;
/// Legend: a row's height, the line sample's length, the margin around the legend
/// and between columns, the font size.
const ROW: u32 = 22;
const SAMPLE: u32 = 30;
const GAP: u32 = 24;
const LEGEND_FONT: u32 = 15;

/// The figure: both panels, the legend below them, the title above.
struct Comparison<'a> {
    curves: Vec<Curve>,
    opts: &'a CompareOptions,
}

impl Comparison<'_> {
    /// The legend's columns and rows: as many columns of the widest entry as the
    /// width holds (at least one, at most one per run), filled column by column.
    fn legend_grid(&self) -> (u32, u32) {
        let font = (FONT, LEGEND_FONT).into_font();
        let widest = self
            .curves
            .iter()
            .map(|c| font.box_size(&c.label).map_or(0, |(w, _)| w))
            .max()
            .unwrap_or(0);
        let column = SAMPLE + 10 + widest + GAP;
        let n = self.curves.len() as u32;
        let columns = ((WIDTH - GAP) / column).clamp(1, n.max(1));
        (columns, n.div_ceil(columns))
    }

    /// The legend: each run's line sample and label, at [`Self::legend_grid`]'s places.
    fn draw_legend<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let (columns, rows) = self.legend_grid();
        let column = (WIDTH - GAP) / columns;
        let text = (FONT, LEGEND_FONT).into_font().color(&BLACK);
        for (k, curve) in self.curves.iter().enumerate() {
            let (col, row) = (k as u32 / rows, k as u32 % rows);
            let x = (GAP + col * column) as i32;
            let y = (GAP / 2 + row * ROW + ROW / 2) as i32;
            let line = [(x, y), (x + SAMPLE as i32, y)];
            let style = curve.style.color.stroke_width(2);
            match curve.style.dash {
                None => area.draw(&PathElement::new(line, style))?,
                Some((dash, gap)) => area.draw(&DashedPathElement::new(line, dash, gap, style))?,
            }
            let anchor = (x + SAMPLE as i32 + 10, y - LEGEND_FONT as i32 / 2);
            area.draw_text(&curve.label, &text, anchor)?;
        }
        Ok(())
    }
}

impl Figure for Comparison<'_> {
    fn size(&self) -> (u32, u32) {
        let title = if self.opts.title.is_some() {
            TITLE_HEIGHT
        } else {
            0
        };
        let (_, rows) = self.legend_grid();
        (WIDTH, title + PANEL_HEIGHT + rows * ROW + GAP)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        let body = match &self.opts.title {
            Some(title) => root.titled(title, (FONT, 24))?,
            None => root.clone(),
        };
        let (panels, legend) = body.split_vertically(PANEL_HEIGHT);
        let (log_x, log_y) = (self.opts.log_x, self.opts.log_y);
        // Both panels span every point's x, so that they line up.
        let xs = || {
            self.curves
                .iter()
                .flat_map(|c| c.train.iter().chain(&c.val))
                .map(|p| p.0)
        };
        for (area, validation) in panels.split_evenly((1, 2)).iter().zip([false, true]) {
            // The loss axis spans the runs that did not diverge (every run when all
            // did): a diverged run's points above it are drawn on its top edge.
            let steady = self.curves.iter().any(|c| !c.diverged);
            let losses = self
                .curves
                .iter()
                .filter(|c| !(steady && c.diverged))
                .flat_map(|c| c.points(validation))
                .map(|p| p.1);
            let caption = if validation {
                "validation loss"
            } else {
                "training loss"
            };
            let mut chart = ChartBuilder::on(area)
                .caption(caption, (FONT, 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(
                    Scale::over(xs(), log_x, true),
                    Scale::over(losses, log_y, false),
                )?;
            chart
                .configure_mesh()
                .x_desc(self.opts.x.label())
                .y_desc("loss")
                .draw()?;
            let top = chart.y_range().end;
            for curve in &self.curves {
                let points: Vec<(f64, f64)> = curve
                    .points(validation)
                    .iter()
                    .map(|&(x, y)| (x, y.min(top)))
                    .collect();
                let style = curve.style.color.stroke_width(2);
                match curve.style.dash {
                    None => chart.draw_series(LineSeries::new(points.iter().copied(), style))?,
                    Some((dash, gap)) => chart.draw_series(DashedLineSeries::new(
                        points.iter().copied(),
                        dash,
                        gap,
                        style,
                    ))?,
                };
                if validation {
                    let marks = points.iter().map(|&p| Circle::new(p, 3, style.filled()));
                    chart.draw_series(marks)?;
                }
                if let Some(&last) = points.last().filter(|_| curve.diverged) {
                    chart.draw_series([Cross::new(last, 6, curve.style.color.stroke_width(3))])?;
                }
            }
        }
        self.draw_legend(&legend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{Divergence, RunSummary, TrainConfig};

    /// A record at step `step` (64 tokens a step, 0.5 s a step) with these losses.
    fn record(step: u64, train_loss: f64, val_loss: Option<f64>) -> LogRecord {
        LogRecord {
            step,
            tokens: 64 * step,
            wallclock_s: 0.5 * step as f64,
            train_loss,
            val_loss,
            lr: 1e-3,
            grad_norm: 1.0,
            tokens_per_s: 128.0,
        }
    }

    /// Writes a run directory `dir` by hand: `config.json` (when given), `log.jsonl`
    /// with ten records of falling loss, and for a diverged run `summary.json`.
    fn write_run(dir: &Path, config: Option<&TrainConfig>, diverged_at: Option<u64>) {
        std::fs::create_dir_all(dir).unwrap();
        if let Some(config) = config {
            let text = serde_json::to_string(config).unwrap();
            std::fs::write(dir.join("config.json"), text).unwrap();
        }
        let lines: String = (1..=10)
            .map(|s| {
                let val = (s % 5 == 0).then(|| 4.0 / s as f64);
                serde_json::to_string(&record(s, 5.0 / s as f64, val)).unwrap() + "\n"
            })
            .collect();
        std::fs::write(dir.join("log.jsonl"), lines).unwrap();
        if let Some(step) = diverged_at {
            RunSummary {
                status: Status::Diverged,
                steps: step - 1,
                tokens: 64 * (step - 1),
                wallclock_s: 5.0,
                train_loss: Some(0.5),
                val_loss: Some(0.4),
                tokens_per_s: 128.0,
                diverged: Some(Divergence {
                    step,
                    reason: "loss is NaN".into(),
                }),
            }
            .write(dir)
            .unwrap();
        }
    }

    /// A configuration with these values, and `out_dir` the run's own (ignored).
    fn config(out_dir: &str, lr_max: f64, d_model: usize) -> TrainConfig {
        let mut config = TrainConfig {
            out_dir: out_dir.into(),
            lr_max,
            ..TrainConfig::default()
        };
        config.model.d_model = d_model;
        config
    }

    #[test]
    fn plot_svg_names_runs_by_the_keys_that_differ() {
        let tmp = tempfile::tempdir().unwrap();
        let sweep = tmp.path().join("sweep");
        write_run(&sweep.join("b"), Some(&config("b", 3e-4, 64)), None);
        write_run(&sweep.join("a"), Some(&config("a", 1e-3, 64)), Some(11));
        write_run(&sweep.join("c"), Some(&config("c", 1e-3, 128)), None);
        std::fs::create_dir_all(sweep.join("not-a-run")).unwrap();
        let runs = find_runs(std::slice::from_ref(&sweep)).unwrap();
        let names: Vec<_> = runs.iter().map(|r| dir_name(&r.path)).collect();
        assert_eq!(names, ["a", "b", "c"]);
        let out = tmp.path().join("cmp.svg");
        write_comparison(&out, &runs, &CompareOptions::default()).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        for label in [
            "lr_max=0.001, d_model=64 (diverged at step 11)",
            "lr_max=3e-4, d_model=64",
            "lr_max=0.001, d_model=128",
            "training loss",
            "validation loss",
        ] {
            assert!(svg.contains(label), "{label} missing");
        }
        assert!(
            !svg.contains("out_dir") && !svg.contains("seed="),
            "only differing keys"
        );
        let files = std::fs::read_dir(tmp.path()).unwrap().flatten();
        let files: Vec<_> = files.filter(|e| e.path().is_file()).collect();
        assert_eq!(files.len(), 1, "nothing beside the figure: {files:?}");
    }

    #[test]
    fn plot_labels_fall_back_to_directory_names() {
        let tmp = tempfile::tempdir().unwrap();
        let same = config("x", 1e-3, 64);
        write_run(&tmp.path().join("plain"), None, None);
        write_run(&tmp.path().join("twin1"), Some(&same), None);
        write_run(&tmp.path().join("twin2"), Some(&same), None);
        let runs = find_runs(&[tmp.path().to_path_buf()]).unwrap();
        assert_eq!(labels(&runs), ["plain", "twin1", "twin2"]);
        // Two runs alike but for a third: the directory tells them apart.
        write_run(
            &tmp.path().join("zother"),
            Some(&config("z", 2e-3, 64)),
            None,
        );
        let runs = find_runs(&[tmp.path().to_path_buf()]).unwrap();
        assert_eq!(
            labels(&runs),
            [
                "plain",
                "lr_max=0.001 (twin1)",
                "lr_max=0.001 (twin2)",
                "lr_max=0.002"
            ]
        );
    }

    #[test]
    fn plot_png_decodes_and_shows_the_title() {
        let tmp = tempfile::tempdir().unwrap();
        write_run(&tmp.path().join("r1"), Some(&config("r1", 1e-3, 64)), None);
        write_run(
            &tmp.path().join("r2"),
            Some(&config("r2", 2e-3, 64)),
            Some(4),
        );
        let runs = find_runs(&[tmp.path().join("r1"), tmp.path().join("r2")]).unwrap();
        let out = tmp.path().join("cmp.png");
        for (x, log) in [(XAxis::Tokens, true), (XAxis::Wall, false)] {
            let opts = CompareOptions {
                x,
                log_x: log,
                log_y: log,
                title: Some("learning-rate sweep".into()),
            };
            write_comparison(&out, &runs, &opts).unwrap();
            let png = image::open(&out).unwrap().to_rgb8();
            assert_eq!(png.width(), WIDTH);
            // The title band holds nothing but the title's text: dark pixels there.
            let dark = (0..TITLE_HEIGHT)
                .flat_map(|y| (0..WIDTH).map(move |x| (x, y)))
                .filter(|&(x, y)| png.get_pixel(x, y).0.iter().all(|&v| v < 128))
                .count();
            assert!(dark > 200, "{dark} dark pixels in the title band");
        }
    }

    #[test]
    fn plot_curves_skip_what_an_axis_cannot_show() {
        let run = RunDir {
            path: "r".into(),
            config: None,
            records: vec![
                record(1, f64::NAN, Some(0.0)),
                record(2, 2.0, Some(1.0)),
                record(3, f64::INFINITY, None),
            ],
            summary: None,
        };
        let style = line_style(0);
        let linear = Curve::new(&run, "r".into(), style, &CompareOptions::default());
        assert_eq!(linear.train, [(2.0, 2.0)]);
        assert_eq!(linear.val, [(1.0, 0.0), (2.0, 1.0)]);
        let opts = CompareOptions {
            log_y: true,
            ..CompareOptions::default()
        };
        assert_eq!(Curve::new(&run, "r".into(), style, &opts).val, [(2.0, 1.0)]);
    }

    #[test]
    fn plot_log_axes_have_ticks_at_any_span() {
        assert_eq!(log_key_points(0.5..2000.0, 10), [1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(log_key_points(1e-3..1e9, 3), [1e-3, 1e1, 1e5]);
        assert_eq!(log_key_points(0.9..30.0, 10), [1.0, 2.0, 5.0, 10.0, 20.0]);
        // Within a decade: a linear axis's ticks.
        assert_eq!(log_key_points(2.4..7.6, 10), [3.0, 4.0, 5.0, 6.0, 7.0]);
        assert!(log_key_points(2.4..7.6, 0).is_empty());
    }

    #[test]
    fn plot_many_runs_cycle_colors_with_dashes() {
        assert_eq!(line_style(20).color, line_style(0).color);
        assert_eq!(
            (line_style(19).dash, line_style(20).dash),
            (None, Some((8, 4)))
        );
        assert_ne!(line_style(40).dash, line_style(20).dash);
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..25 {
            let dir = format!("run{i:02}");
            write_run(
                &tmp.path().join(&dir),
                Some(&config(&dir, 1e-4 * (i + 1) as f64, 64)),
                None,
            );
        }
        let runs = find_runs(&[tmp.path().to_path_buf()]).unwrap();
        let out = tmp.path().join("many.svg");
        write_comparison(&out, &runs, &CompareOptions::default()).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.contains("lr_max=0.0025") && svg.contains("lr_max=1e-4"));
    }

    #[test]
    fn plot_bad_input_names_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let empty = tmp.path().join("empty");
        std::fs::create_dir_all(empty.join("sub")).unwrap();
        let err = find_runs(std::slice::from_ref(&empty))
            .unwrap_err()
            .to_string();
        let expected = format!(
            "{}: no runs (no log.jsonl in it or its subdirectories)",
            empty.display()
        );
        assert_eq!(err, expected);
        write_run(&tmp.path().join("r"), None, None);
        let runs = find_runs(&[tmp.path().join("r")]).unwrap();
        let bad = tmp.path().join("loss.pdf");
        let err = write_comparison(&bad, &runs, &CompareOptions::default()).unwrap_err();
        assert!(err.to_string().contains("loss.pdf") && err.to_string().contains(".svg or .png"));
        assert!("epoch"
            .parse::<XAxis>()
            .unwrap_err()
            .contains("step, tokens or wall"));
        assert_eq!("tokens".parse::<XAxis>(), Ok(XAxis::Tokens));
    }

    #[test]
    fn plot_numbers_are_compact() {
        let cases = [
            (0.001, "0.001"),
            (3e-4, "3e-4"),
            (256.0, "256"),
            (1e5, "1e5"),
            (0.0, "0"),
        ];
        for (x, text) in cases {
            assert_eq!(compact(x), text);
        }
        assert_eq!(Scale::format(&0.30000000000000004), "0.3");
        assert_eq!(value_text(Some(&serde_json::json!(64))), "64");
        assert_eq!(value_text(Some(&Value::Null)), "none");
    }

    #[test]
    fn plot_single_run_svg_and_png() {
        let tmp = tempfile::tempdir().unwrap();
        let records: Vec<_> = (1..=5)
            .map(|s| record(s, 1.0 / s as f64, Some(0.5)))
            .collect();
        for name in ["loss.svg", "loss.png"] {
            crate::train::write_loss_plot(&tmp.path().join(name), &records).unwrap();
        }
        let svg = std::fs::read_to_string(tmp.path().join("loss.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("loss vs step"));
        let png = image::open(tmp.path().join("loss.png")).unwrap();
        assert_eq!((png.width(), png.height()), (1200, 450));
    }
}
