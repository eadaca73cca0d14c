//! A figure drawn once for any output: SVG, or PNG through the bitmap backend; the
//! format follows the file's extension, the file written to a temporary file and
//! renamed. And the line colors every plot shares.

use super::bitmap::Bitmap;
use super::font::register_fonts;
use crate::files::write_bytes;
use crate::{Error, Result};
use image::ImageEncoder;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Line colors, one per run: matplotlib's tab10, then ten more. Every pair differs
/// by a CIE76 ΔE of at least 25 (tested), and none is lighter than L* = 75 so that
/// each shows on white.
pub const PALETTE: [RGBColor; 20] = [
    RGBColor(31, 119, 180),  // blue
    RGBColor(255, 127, 14),  // orange
    RGBColor(44, 160, 44),   // green
    RGBColor(214, 39, 40),   // red
    RGBColor(148, 103, 189), // purple
    RGBColor(140, 86, 75),   // brown
    RGBColor(227, 119, 194), // pink
    RGBColor(127, 127, 127), // gray
    RGBColor(188, 189, 34),  // olive
    RGBColor(23, 190, 207),  // cyan
    RGBColor(0, 0, 255),     // pure blue
    RGBColor(255, 0, 255),   // magenta
    RGBColor(0, 0, 128),     // navy
    RGBColor(30, 90, 40),    // forest green
    RGBColor(210, 180, 120), // sand
    RGBColor(160, 0, 80),    // crimson
    RGBColor(200, 80, 220),  // orchid
    RGBColor(128, 0, 0),     // maroon
    RGBColor(60, 60, 60),    // dark gray
    RGBColor(120, 190, 255), // sky blue
];

/// What a figure's drawing returns: plotters' errors boxed, whatever the backend.
pub type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// A picture that can be drawn on any plotters backend (SVG or bitmap).
pub trait Figure {
    /// The picture's size in pixels, (width, height).
    fn size(&self) -> (u32, u32);
    /// Draws the picture on `root`, which is [`Figure::size`] pixels.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static;
}

/// An output format, from a path's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Svg,
    Png,
}

impl Format {
    /// The format `path`'s extension names; an error names the path.
    fn of(path: &Path) -> Result<Format> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext.to_ascii_lowercase().as_str() {
            "svg" => Ok(Format::Svg),
            "png" => Ok(Format::Png),
            _ => Err(Error::Invalid(format!(
                "{}: unknown plot format: the file name must end in .svg or .png",
                path.display()
            ))),
        }
    }
}

/// Draws `figure` as an RGB bitmap: `height · width · 3` bytes, row by row.
fn render_rgb(figure: &impl Figure) -> std::result::Result<Vec<u8>, Box<dyn std::error::Error>> {
    register_fonts();
    let (w, h) = figure.size();
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = Bitmap(BitMapBackend::with_buffer(&mut rgb, (w, h))).into_drawing_area();
        figure.draw(&root)?;
        root.present()?;
    }
    Ok(rgb)
}

/// Draws `figure` as SVG text.
fn render_svg(figure: &impl Figure) -> std::result::Result<String, Box<dyn std::error::Error>> {
    register_fonts();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, figure.size()).into_drawing_area();
        figure.draw(&root)?;
        root.present()?;
    }
    Ok(svg)
}

/// Writes `figure` to `path` as SVG or PNG by its extension, whole or not at all
/// ([`write_bytes`]).
pub fn write_figure(path: &Path, figure: &impl Figure) -> Result<()> {
    let format = Format::of(path)?;
    let cannot = |e: Box<dyn std::error::Error>| {
        Error::Invalid(format!("{}: cannot draw the plot: {e}", path.display()))
    };
    let bytes = match format {
        Format::Svg => render_svg(figure).map_err(cannot)?.into_bytes(),
        Format::Png => {
            let rgb = render_rgb(figure).map_err(cannot)?;
            let (w, h) = figure.size();
            let mut png = Vec::new();
            // Best compression: a figure is mostly flat color, so about 4× smaller.
            use image::codecs::png::{CompressionType, FilterType, PngEncoder};
            PngEncoder::new_with_quality(&mut png, CompressionType::Best, FilterType::Adaptive)
                .write_image(&rgb, w, h, image::ColorType::Rgb8)
                .map_err(|e| cannot(e.into()))?;
            png
        }
    };
    write_bytes(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::font::FONT;

    /// CIE L*a*b* (D65) of an sRGB color.
    fn lab(c: RGBColor) -> [f64; 3] {
        let lin = |v: u8| {
            let v = v as f64 / 255.0;
            match v <= 0.04045 {
                true => v / 12.92,
                false => ((v + 0.055) / 1.055).powf(2.4),
            }
        };
        let (r, g, b) = (lin(c.0), lin(c.1), lin(c.2));
        let x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047;
        let y = 0.2126 * r + 0.7152 * g + 0.0722 * b;
        let z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883;
        let f = |t: f64| match t > 216.0 / 24389.0 {
            true => t.cbrt(),
            false => (24389.0 / 27.0 * t + 16.0) / 116.0,
        };
        let (fx, fy, fz) = (f(x), f(y), f(z));
        [116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)]
    }

    /// Every pair of the 20 colors differs by CIE76 ΔE ≥ 25: about ten times the
    /// just-noticeable difference (2.3), and a little below tab10's own closest pair
    /// (purple and pink, 27.7), which matplotlib users tell apart. None is lighter
    /// than L* = 75, so each shows on the white background.
    #[test]
    fn plot_palette_colors_differ_clearly() {
        for (i, &a) in PALETTE.iter().enumerate() {
            assert!(lab(a)[0] <= 75.0, "color {i} {a:?} is too light");
            for (j, &b) in PALETTE.iter().enumerate().skip(i + 1) {
                let (la, lb) = (lab(a), lab(b));
                let de = la
                    .iter()
                    .zip(lb)
                    .map(|(p, q)| (p - q).powi(2))
                    .sum::<f64>()
                    .sqrt();
                assert!(de >= 25.0, "colors {i} {a:?} and {j} {b:?}: ΔE {de:.1}");
            }
        }
    }

    #[test]
    fn plot_format_follows_the_extension() {
        assert_eq!(Format::of(Path::new("a/loss.svg")).unwrap(), Format::Svg);
        assert_eq!(Format::of(Path::new("loss.PNG")).unwrap(), Format::Png);
        let err = Format::of(Path::new("out/loss.jpg"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("out/loss.jpg") && err.contains(".svg or .png"),
            "{err}"
        );
    }

    /// A caption alone, to count the pixels text covers.
    struct Caption(&'static str);

    impl Figure for Caption {
        fn size(&self) -> (u32, u32) {
            (200, 40)
        }
        fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
        where
            DB::ErrorType: 'static,
        {
            root.fill(&WHITE)?;
            root.draw_text(self.0, &(FONT, 20).into_font().color(&BLACK), (4, 8))?;
            Ok(())
        }
    }

    /// The embedded font renders into bitmaps: a word covers many dark pixels, an
    /// empty caption none.
    #[test]
    fn plot_bitmap_text_is_rendered_with_the_embedded_font() {
        let dark = |rgb: Vec<u8>| rgb.chunks(3).filter(|p| p.iter().all(|&v| v < 128)).count();
        assert_eq!(dark(render_rgb(&Caption("")).unwrap()), 0);
        let word = dark(render_rgb(&Caption("validation")).unwrap());
        assert!(word > 100, "{word} dark pixels for a 20 px word");
    }
}
