//! Pictures of replays, drawn with `plotters` into SVG or PNG bytes; no browser,
//! Python or system font needed (PNG text uses the DejaVu Sans font embedded here).
//!
//! Two kinds:
//!
//! - **Memory over the run** ([`TimelineChart`], [`render_timeline`]): requested,
//!   allocated and reserved bytes over events (or over time when the trace records
//!   when each event happened) for each replay on one chart, with the device's capacity,
//!   each replay's out-of-memory point and ticks at the trace's marks and annotations.
//!   A replay is recorded by [`SeriesRecorder`], an observer of the engine that keeps
//!   for each of [`SeriesRecorder::BUCKETS`] columns the first, last, lowest and
//!   highest value of each series (M4 downsampling: the drawn line is the one every
//!   event would give, at a cost independent of the trace's length).
//! - **Segment map** ([`SegmentMap`], [`render_segments`]): the policy's segments at
//!   one moment (peak reserved, the out-of-memory, or after any event; captured by
//!   [`Capture`]), one bar per segment in address order, grouped by stream, each
//!   block coloured as used, rounding waste (bytes the block holds beyond the
//!   request), pending free (freed, waiting for other streams) or cached free.
//!
//! Output is deterministic: the same data gives the same bytes.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod draw;
mod segments;
mod series;
mod timeline;

use std::path::Path;

pub use segments::{render_segments, SegmentMap, SegmentPanel};
pub use series::{Capture, Moment, OomPoint, Point, Series, SeriesRecorder, Snapshot};
pub use timeline::{render_timeline, Run, Tick, TimelineChart, XAxis};

/// An image format allocsim draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    /// Scalable vector graphics (text as text).
    Svg,
    /// A PNG bitmap.
    Png,
}

impl ImageFormat {
    /// The format `path`'s extension names (`.svg`, `.png`, any case).
    ///
    /// # Errors
    /// [`PlotError::Extension`] for any other extension.
    pub fn from_path(path: &Path) -> Result<ImageFormat, PlotError> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("svg") => Ok(ImageFormat::Svg),
            Some("png") => Ok(ImageFormat::Png),
            _ => Err(PlotError::Extension {
                path: path.display().to_string(),
            }),
        }
    }
}

/// A picture that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// An output whose extension names no image format.
    #[error("{path}: a picture is written as .svg or .png (the extension says which)")]
    Extension {
        /// The path.
        path: String,
    },
    /// A size out of range.
    #[error("picture size {width}x{height}: each side must be within 200 to 10000 pixels")]
    Size {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
    },
    /// Nothing to draw.
    #[error("nothing to draw: {0}")]
    Empty(String),
    /// The drawing library failed (a bug, or the font could not be loaded).
    #[error("drawing failed: {0}")]
    Draw(String),
}

/// Checks a picture size.
fn check_size(width: u32, height: u32) -> Result<(), PlotError> {
    let ok = |v: u32| (200..=10_000).contains(&v);
    if ok(width) && ok(height) {
        Ok(())
    } else {
        Err(PlotError::Size { width, height })
    }
}
