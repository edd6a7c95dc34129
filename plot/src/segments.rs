//! The segment map: a policy's segments at one moment, one bar per segment in address
//! order, grouped by stream, each block coloured by what its bytes are doing.

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use policies::{BlockState, SegmentSnapshot};
use units::format_size_human;

use crate::draw::{render, shorten, text, Picture, FAMILY};
use crate::series::Snapshot;
use crate::{ImageFormat, PlotError};

/// Bytes handed to the program (a block's requested bytes).
const USED: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
/// Bytes an allocated block holds beyond its request (the policy's rounding).
const WASTE: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
/// Freed by the program, waiting for other streams.
const PENDING: RGBColor = RGBColor(0x94, 0x67, 0xbd);
/// Free and cached by the policy.
const FREE: RGBColor = RGBColor(0xdd, 0xdd, 0xdd);

/// Segment rows drawn per panel at most (the largest; the rest are counted).
const MAX_ROWS: usize = 48;
/// Pixels per row.
const ROW: u32 = 22;
/// Pixels of a panel's title and axis.
const PANEL_EXTRA: u32 = 104;
/// Pixels of the legend at the top.
const LEGEND: u32 = 64;

/// One policy's segments at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentPanel {
    /// The panel's title (the policy, the moment).
    pub title: String,
    /// The segments.
    pub snapshot: Snapshot,
}

/// Segment maps of one or more replays at the same moment, one panel each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentMap {
    /// The title.
    pub title: String,
    /// The panels, top to bottom.
    pub panels: Vec<SegmentPanel>,
    /// The bytes the device can hand out, named in each panel's totals.
    pub capacity_bytes: Option<u64>,
}

/// Bytes of a set of segments by what they are doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    used: u64,
    waste: u64,
    pending: u64,
    free: u64,
}

impl Totals {
    fn of(segments: &[SegmentSnapshot]) -> Totals {
        let mut t = Totals::default();
        for b in segments.iter().flat_map(|s| &s.blocks) {
            match b.state {
                BlockState::Allocated => {
                    let used = b.requested_bytes.min(b.size_bytes);
                    t.used += used;
                    t.waste += b.size_bytes - used;
                }
                BlockState::PendingFree => t.pending += b.size_bytes,
                BlockState::Free => t.free += b.size_bytes,
            }
        }
        t
    }
}

/// A row of a panel: a stream's heading, a segment, or the count of those not drawn.
enum Row<'a> {
    Stream(String),
    Segment(&'a SegmentSnapshot),
    Omitted(String),
}

/// The rows of a panel: segments grouped by stream, in address order, the largest
/// [`MAX_ROWS`] of them.
fn rows(segments: &[SegmentSnapshot]) -> Vec<Row<'_>> {
    // Each stream's heading counts all its segments, drawn or not.
    let mut all: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
    for s in segments {
        let e = all.entry(s.stream.0).or_default();
        e.0 += 1;
        e.1 += s.size_bytes;
    }
    let mut keep: Vec<&SegmentSnapshot> = segments.iter().collect();
    let mut omitted = (0usize, 0u64);
    if keep.len() > MAX_ROWS {
        keep.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then(a.addr.cmp(&b.addr)));
        for s in keep.drain(MAX_ROWS..) {
            omitted.0 += 1;
            omitted.1 += s.size_bytes;
        }
    }
    let mut by_stream: BTreeMap<u64, Vec<&SegmentSnapshot>> = BTreeMap::new();
    for s in keep {
        by_stream.entry(s.stream.0).or_default().push(s);
    }
    let mut out = Vec::new();
    for (stream, mut list) in by_stream {
        list.sort_by_key(|s| s.addr);
        let (count, bytes) = all[&stream];
        let name = if stream == 0 {
            "stream 0 (default)".to_string()
        } else {
            format!("stream 0x{stream:x}")
        };
        let drawn = if list.len() < count {
            format!(" ({} largest drawn)", list.len())
        } else {
            String::new()
        };
        out.push(Row::Stream(format!(
            "{name}: {count} segment{}, {}{drawn}",
            if count == 1 { "" } else { "s" },
            format_size_human(bytes)
        )));
        out.extend(list.into_iter().map(Row::Segment));
    }
    if omitted.0 > 0 {
        out.push(Row::Omitted(format!(
            "{} smaller segment{} ({}) not drawn",
            omitted.0,
            if omitted.0 == 1 { "" } else { "s" },
            format_size_human(omitted.1)
        )));
    }
    out
}

/// The map as `format` bytes, `width` pixels wide; the height follows from the number
/// of segments (each panel draws its 48 largest segments and counts the rest).
///
/// # Errors
/// A width out of range, a map with no panel, a drawing failure.
pub fn render_segments(
    map: &SegmentMap,
    format: ImageFormat,
    width: u32,
) -> Result<Vec<u8>, PlotError> {
    if map.panels.is_empty() {
        return Err(PlotError::Empty("no segments to draw".into()));
    }
    let height = (LEGEND + map.panels.iter().map(panel_height).sum::<u32>()).clamp(300, 10_000);
    render(map, format, width, height)
}

fn panel_height(p: &SegmentPanel) -> u32 {
    let rows = rows(&p.snapshot.segments).len().max(1) as u32;
    PANEL_EXTRA + rows * ROW
}

impl Picture for SegmentMap {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let (width, _) = root.dim_in_pixel();
        let (head, body) = root.split_vertically(LEGEND);
        head.draw(&Text::new(
            shorten(&self.title, 120),
            (14, 10),
            (FAMILY, 19).into_font(),
        ))
        .map_err(text)?;
        let mut x = 14i32;
        for (color, name) in [
            (USED, "used (requested bytes)"),
            (WASTE, "rounding waste (block beyond the request)"),
            (PENDING, "pending free (waiting for other streams)"),
            (FREE, "cached free"),
        ] {
            head.draw(&Rectangle::new([(x, 38), (x + 14, 52)], color.filled()))
                .map_err(text)?;
            head.draw(&Rectangle::new(
                [(x, 38), (x + 14, 52)],
                RGBColor(0x66, 0x66, 0x66).stroke_width(1),
            ))
            .map_err(text)?;
            head.draw(&Text::new(name, (x + 19, 39), (FAMILY, 13).into_font()))
                .map_err(text)?;
            x += 24 + (name.chars().count() as i32) * 7;
        }
        let heights: Vec<u32> = self.panels.iter().map(panel_height).collect();
        let mut area = body;
        for (panel, h) in self.panels.iter().zip(heights) {
            let (this, rest) = area.split_vertically(h);
            draw_panel(&this, panel, width, self.capacity_bytes)?;
            area = rest;
        }
        Ok(())
    }
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &SegmentPanel,
    width: u32,
    capacity_bytes: Option<u64>,
) -> Result<(), String> {
    let segments = &panel.snapshot.segments;
    let t = Totals::of(segments);
    let reserved: u64 = segments.iter().map(|s| s.size_bytes).sum();
    area.draw(&Text::new(
        shorten(&panel.title, 150),
        (14, 6),
        (FAMILY, 15).into_font(),
    ))
    .map_err(text)?;
    let of_capacity = capacity_bytes.map_or(String::new(), |c| {
        format!(" of {} usable", format_size_human(c))
    });
    let totals = format!(
        "reserved {}{of_capacity} in {} segment{}: used {}, rounding waste {}, pending free {}, \
         cached free {}",
        format_size_human(reserved),
        segments.len(),
        if segments.len() == 1 { "" } else { "s" },
        format_size_human(t.used),
        format_size_human(t.waste),
        format_size_human(t.pending),
        format_size_human(t.free),
    );
    area.draw(&Text::new(
        shorten(&totals, 170),
        (14, 26),
        (FAMILY, 13).into_font().color(&RGBColor(0x44, 0x44, 0x44)),
    ))
    .map_err(text)?;
    if segments.is_empty() {
        area.draw(&Text::new(
            "no segments: the policy holds no device memory at this moment",
            (14, 56),
            (FAMILY, 13).into_font().color(&BLACK),
        ))
        .map_err(text)?;
        return Ok(());
    }
    let rows = rows(segments);
    let n = rows.len().max(1) as f64;
    let largest = segments
        .iter()
        .map(|s| s.size_bytes)
        .max()
        .unwrap_or(1)
        .max(1);
    let (per, unit_name) = crate::timeline::unit(largest);
    let x_max = largest as f64 / per;
    let label_width = 250.min(width / 3);
    let mut chart = ChartBuilder::on(area)
        .margin_top(46)
        .margin_right(20)
        .margin_left(label_width + 10)
        .x_label_area_size(34)
        .build_cartesian_2d(0f64..x_max, 0f64..n)
        .map_err(text)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc(format!("{unit_name} from the segment's start"))
        .x_label_formatter(&|v| crate::timeline::trim_number(*v))
        .label_style((FAMILY, 12))
        .axis_desc_style((FAMILY, 12))
        .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
        .bold_line_style(RGBColor(0xe0, 0xe0, 0xe0))
        .draw()
        .map_err(text)?;
    // Chart coordinates map to the whole picture; labels are drawn in the panel.
    let (base_x, base_y) = area.get_base_pixel();
    for (i, row) in rows.iter().enumerate() {
        // Row 0 at the top.
        let y_top = n - i as f64 - 0.15;
        let y_bottom = n - i as f64 - 0.85;
        let (_, py) = chart.backend_coord(&(0.0, n - i as f64 - 0.5));
        let label_pos = (8 - base_x.min(0), py - base_y);
        let style = |size: u32| {
            (FAMILY, size)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center))
        };
        match row {
            Row::Stream(name) | Row::Omitted(name) => {
                area.draw(&Text::new(shorten(name, 90), label_pos, style(13)))
                    .map_err(text)?;
            }
            Row::Segment(s) => {
                let label = format!(
                    "  {:#x}  {}  {}",
                    s.addr.0,
                    format_size_human(s.size_bytes),
                    s.pool
                );
                area.draw(&Text::new(label, label_pos, style(12)))
                    .map_err(text)?;
                let mut rects = Vec::new();
                for b in &s.blocks {
                    let start = (b.addr.0 - s.addr.0) as f64 / per;
                    let end = start + b.size_bytes as f64 / per;
                    match b.state {
                        BlockState::Allocated => {
                            let used = start + b.requested_bytes.min(b.size_bytes) as f64 / per;
                            rects.push((start, used, USED));
                            rects.push((used, end, WASTE));
                        }
                        BlockState::PendingFree => rects.push((start, end, PENDING)),
                        BlockState::Free => rects.push((start, end, FREE)),
                    }
                }
                chart
                    .draw_series(rects.into_iter().filter(|(a, b, _)| b > a).map(
                        |(a, b, color)| Rectangle::new([(a, y_bottom), (b, y_top)], color.filled()),
                    ))
                    .map_err(text)?;
                // Block boundaries, then the segment's outline.
                chart
                    .draw_series(s.blocks.iter().skip(1).map(|b| {
                        let x = (b.addr.0 - s.addr.0) as f64 / per;
                        PathElement::new(vec![(x, y_bottom), (x, y_top)], WHITE.stroke_width(1))
                    }))
                    .map_err(text)?;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y_bottom), (s.size_bytes as f64 / per, y_top)],
                        RGBColor(0x55, 0x55, 0x55).stroke_width(1),
                    )))
                    .map_err(text)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use policies::{BlockSnapshot, DeviceAddr, StreamId};

    fn seg(addr: u64, stream: u64, blocks: &[(u64, u64, BlockState)]) -> SegmentSnapshot {
        let mut at = addr;
        let blocks: Vec<BlockSnapshot> = blocks
            .iter()
            .map(|&(size_bytes, requested_bytes, state)| {
                let b = BlockSnapshot {
                    addr: DeviceAddr(at),
                    size_bytes,
                    requested_bytes,
                    state,
                };
                at += size_bytes;
                b
            })
            .collect();
        SegmentSnapshot {
            addr: DeviceAddr(addr),
            size_bytes: at - addr,
            stream: StreamId(stream),
            pool: "large",
            blocks,
        }
    }

    /// Totals split allocated blocks into requested and rounding waste, and count
    /// pending and cached free bytes; rows group segments by stream in address order.
    #[test]
    fn totals_and_rows() {
        let segs = vec![
            seg(
                0x3000,
                7,
                &[
                    (512, 500, BlockState::Allocated),
                    (512, 0, BlockState::Free),
                ],
            ),
            seg(0x1000, 0, &[(1024, 1000, BlockState::PendingFree)]),
            seg(0x2000, 0, &[(2048, 2048, BlockState::Allocated)]),
        ];
        assert_eq!(
            Totals::of(&segs),
            Totals {
                used: 2548,
                waste: 12,
                pending: 1024,
                free: 512
            }
        );
        let labels: Vec<String> = rows(&segs)
            .iter()
            .map(|r| match r {
                Row::Stream(s) | Row::Omitted(s) => s.clone(),
                Row::Segment(s) => format!("{:#x}", s.addr.0),
            })
            .collect();
        assert_eq!(
            labels,
            [
                "stream 0 (default): 2 segments, 3.00 KiB",
                "0x1000",
                "0x2000",
                "stream 0x7: 1 segment, 1.00 KiB",
                "0x3000"
            ]
        );
    }

    /// Past the row limit the largest segments are drawn and the others counted; the
    /// stream's heading counts all of them.
    #[test]
    fn many_segments_are_counted() {
        let segs: Vec<SegmentSnapshot> = (0..MAX_ROWS as u64 + 5)
            .map(|i| seg(i << 20, 0, &[(4096 + i, 0, BlockState::Free)]))
            .collect();
        let r = rows(&segs);
        assert_eq!(r.len(), MAX_ROWS + 2);
        match r.first() {
            Some(Row::Stream(s)) => assert!(
                s.starts_with(&format!("stream 0 (default): {} segments", MAX_ROWS + 5))
                    && s.ends_with(&format!("({MAX_ROWS} largest drawn)")),
                "{s}"
            ),
            _ => panic!("no stream heading"),
        }
        match r.last() {
            Some(Row::Omitted(s)) => assert!(s.starts_with("5 smaller segments"), "{s}"),
            _ => panic!("no count of the segments left out"),
        }
    }
}
