//! Loss plots as SVG or PNG: one run's curves ([`write_loss_plot`], which training
//! redraws) and the comparison of many runs ([`write_comparison`], `tinylm plot`).
//!
//! Text is drawn with DejaVu Sans, embedded in the binary and registered with
//! plotters before any drawing, so no system font is needed. The format follows the
//! output's extension (`.svg` or `.png`); the file is written to a temporary file
//! and renamed.

mod bitmap;
mod compare;
mod figure;
mod font;
mod run;

pub use compare::{find_runs, write_comparison, CompareOptions, XAxis};
pub use figure::PALETTE;
pub use run::write_loss_plot;
