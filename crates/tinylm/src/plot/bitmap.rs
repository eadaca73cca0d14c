//! The PNG backend: plotters' bitmap, with text drawn glyph by glyph at each glyph's
//! left side bearing. (plotters 0.3.7 draws every ab_glyph glyph at the left edge of
//! its advance, so narrow glyphs such as `1` and `.` sit apart from what follows.)

use super::font::font_bytes;
use ab_glyph::{point, Font, FontRef, ScaleFont};
use plotters::prelude::*;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};
use std::sync::OnceLock;

/// An RGB buffer drawn through plotters' [`BitMapBackend`], but for text.
pub(super) struct Bitmap<'a>(pub BitMapBackend<'a>);

/// The embedded font, parsed once.
fn font() -> &'static FontRef<'static> {
    static FONT: OnceLock<FontRef<'static>> = OnceLock::new();
    FONT.get_or_init(|| FontRef::try_from_slice(font_bytes()).expect("DejaVu Sans parses"))
}

/// The pixels `text` covers at `size` pixels: (x, y, coverage 0..1), with the text's
/// left edge at x = 0 and its baseline where plotters puts it (size / 2 below y = 0).
fn rasterize(text: &str, size: f32) -> Vec<(i32, i32, f32)> {
    let font = font().as_scaled(size);
    let mut pixels = Vec::new();
    let (mut caret, mut previous) = (0.0f32, None);
    for c in text.chars() {
        let id = font.glyph_id(c);
        if let Some(previous) = previous {
            caret += font.kern(previous, id);
        }
        let glyph = id.with_scale_and_position(size, point(caret, 0.0));
        if let Some(outline) = font.outline_glyph(glyph) {
            let bounds = outline.px_bounds();
            let (x0, y0) = (bounds.min.x as i32, (size / 2.0 + bounds.min.y) as i32);
            outline.draw(|x, y, coverage| pixels.push((x0 + x as i32, y0 + y as i32, coverage)));
        }
        caret += font.h_advance(id);
        previous = Some(id);
    }
    pixels
}

impl DrawingBackend for Bitmap<'_> {
    type ErrorType = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.blit_bitmap(pos, size, src)
    }

    /// plotters' own text drawing (anchor and rotation within the layout box that
    /// plotters measured), with the glyphs from [`rasterize`].
    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        let ((min_x, min_y), (max_x, max_y)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let transform = style.transform();
        let (w, h) = self.get_size();
        for (x, y, coverage) in rasterize(text, style.size() as f32) {
            let (x, y) = transform.transform(x + dx - min_x, y + dy - min_y);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if x >= 0 && x < w as i32 && y >= 0 && y < h as i32 {
                self.draw_pixel((x, y), color.mix(coverage as f64))?;
            }
        }
        Ok(())
    }
}
