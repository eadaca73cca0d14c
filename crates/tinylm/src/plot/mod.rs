//! Figures as SVG or PNG, the drawing that a run's loss plot
//! ([`crate::train::write_loss_plot`], which training redraws) and the comparison of
//! many runs ([`crate::compare`], `tinylm plot`) share: a [`Figure`] written by its
//! path's extension, the palette, the font.
//!
//! Text is drawn with DejaVu Sans, embedded in the binary and registered with
//! plotters before any drawing, so no system font is needed. The format follows the
//! output's extension (`.svg` or `.png`); the file is written to a temporary file
//! and renamed.

mod bitmap;
mod figure;
mod font;

pub use figure::{write_figure, DrawResult, Figure, PALETTE};
pub use font::FONT;
