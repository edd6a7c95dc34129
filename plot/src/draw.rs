//! Rendering a picture into SVG or PNG bytes with one drawing routine for both.

use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{check_size, ImageFormat, PlotError};

/// DejaVu Sans (Bitstream Vera license, `fonts/LICENSE-DejaVu.txt`): the text of PNG
/// pictures, and what SVG text is measured with for layout.
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// The family name the pictures use.
pub(crate) const FAMILY: &str = "sans-serif";

static REGISTER: Once = Once::new();

/// A picture that can draw itself on any backend.
pub(crate) trait Picture {
    /// Draws on `root` (already filled white).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// `picture` as `format` bytes, `width` × `height` pixels.
pub(crate) fn render<P: Picture>(
    picture: &P,
    format: ImageFormat,
    width: u32,
    height: u32,
) -> Result<Vec<u8>, PlotError> {
    check_size(width, height)?;
    let mut registered = Ok(());
    REGISTER.call_once(|| {
        registered = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
            .map_err(|_| PlotError::Draw("the embedded font could not be loaded".into()));
    });
    registered?;
    match format {
        ImageFormat::Svg => {
            let mut text = String::new();
            {
                let root = SVGBackend::with_string(&mut text, (width, height)).into_drawing_area();
                root.fill(&WHITE).map_err(draw_error)?;
                picture.draw(&root).map_err(PlotError::Draw)?;
                root.present().map_err(draw_error)?;
            }
            Ok(text.into_bytes())
        }
        ImageFormat::Png => {
            let mut rgb = vec![0u8; width as usize * height as usize * 3];
            {
                let root =
                    BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
                root.fill(&WHITE).map_err(draw_error)?;
                picture.draw(&root).map_err(PlotError::Draw)?;
                root.present().map_err(draw_error)?;
            }
            encode_png(&rgb, width, height)
        }
    }
}

fn draw_error<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
}

/// RGB pixels as a PNG file.
fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, PlotError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Best);
    let mut writer = encoder.write_header().map_err(draw_error)?;
    writer.write_image_data(rgb).map_err(draw_error)?;
    writer.finish().map_err(draw_error)?;
    Ok(out)
}

/// A drawing error as text (the backend's error type differs per backend).
pub(crate) fn text<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

/// Colours of the replays, in order (Tableau 10 without its red, which marks the
/// capacity and out-of-memory).
pub(crate) const PALETTE: [RGBColor; 9] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// The capacity line and out-of-memory markers.
pub(crate) const ALARM: RGBColor = RGBColor(0xd6, 0x27, 0x28);

/// `text` cut to `max` characters, with an ellipsis.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}
