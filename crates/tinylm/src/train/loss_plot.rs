//! One run's loss curves: train and validation loss against steps (left panel) and
//! against wall-clock seconds (right panel).

use super::LogRecord;
use crate::plot::{write_figure, DrawResult, Figure, FONT, PALETTE};
use crate::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const TRAIN: RGBColor = PALETTE[0];
const VAL: RGBColor = PALETTE[3];

/// Writes the plot of `records` to `path`, SVG or PNG by its extension (temporary
/// file and rename).
pub fn write_loss_plot(path: &Path, records: &[LogRecord]) -> Result<()> {
    write_figure(path, &LossPlot(records))
}

/// One run's records, drawn as two panels.
struct LossPlot<'a>(&'a [LogRecord]);

impl Figure for LossPlot<'_> {
    fn size(&self) -> (u32, u32) {
        (1200, 450)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let records = self.0;
        root.fill(&WHITE)?;
        let panels = root.split_evenly((1, 2));
        let losses = records
            .iter()
            .flat_map(|r| std::iter::once(r.train_loss).chain(r.val_loss))
            .filter(|l| l.is_finite());
        let (lo, hi) = losses.fold((f64::MAX, f64::MIN), |(lo, hi), l| (lo.min(l), hi.max(l)));
        let (lo, hi) = if lo <= hi { (lo, hi) } else { (0.0, 1.0) };
        let pad = ((hi - lo) * 0.05).max(1e-3);
        for (area, wall) in panels.iter().zip([false, true]) {
            let label = if wall { "wall-clock (s)" } else { "step" };
            let x_of = |r: &LogRecord| if wall { r.wallclock_s } else { r.step as f64 };
            let x_max = records.iter().map(&x_of).fold(0.0, f64::max).max(1e-9);
            let mut chart = ChartBuilder::on(area)
                .caption(format!("loss vs {label}"), (FONT, 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(48)
                .build_cartesian_2d(0.0..x_max, (lo - pad)..(hi + pad))?;
            let digits = if wall && x_max < 100.0 { 1 } else { 0 };
            chart
                .configure_mesh()
                .x_desc(label)
                .y_desc("loss")
                .x_label_formatter(&|x| format!("{x:.digits$}"))
                .draw()?;
            let train = records.iter().map(|r| (x_of(r), r.train_loss));
            chart
                .draw_series(LineSeries::new(train, TRAIN))?
                .label("train")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], TRAIN));
            let val: Vec<(f64, f64)> = records
                .iter()
                .filter_map(|r| r.val_loss.map(|v| (x_of(r), v)))
                .collect();
            chart
                .draw_series(LineSeries::new(val.iter().copied(), VAL.stroke_width(2)))?
                .label("validation")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], VAL));
            chart.draw_series(val.iter().map(|&p| Circle::new(p, 3, VAL.filled())))?;
            chart
                .configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE)
                .draw()?;
        }
        Ok(())
    }
}
