//! The plots' font: DejaVu Sans, embedded in the binary and registered with
//! plotters before any drawing, so that no system font is needed.

use plotters::style::{register_font, FontStyle};
use std::sync::Once;

/// The font family every plot's text uses (plotters' default family).
pub const FONT: &str = "sans-serif";

/// The TrueType file of [`FONT`]: DejaVu Sans, embedded.
pub fn font_bytes() -> &'static [u8] {
    dejavu::sans::regular()
}

/// Registers the embedded DejaVu Sans as [`FONT`] (once per process).
pub fn register_fonts() {
    static FONTS: Once = Once::new();
    FONTS.call_once(|| {
        if register_font(FONT, FontStyle::Normal, font_bytes()).is_err() {
            unreachable!("DejaVu Sans is a valid TrueType font");
        }
    });
}
