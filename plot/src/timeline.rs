//! Memory over the run: requested, allocated and reserved bytes of several replays on
//! one chart, with the capacity, out-of-memory points, and mark and annotation ticks.

use plotters::coord::Shift;
use plotters::prelude::*;
use units::format_size_human;
use workloads::{Event, Trace};

use crate::draw::{render, shorten, text, Picture, ALARM, FAMILY, PALETTE};
use crate::series::{x_of, OomPoint, Series};
use crate::{ImageFormat, PlotError};

/// What the x axis counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XAxis {
    /// Events, from 0.
    Events,
    /// Seconds since the trace's first event (traces that record times).
    Seconds,
}

/// A labelled moment of the trace: a `mark` event, or an annotation of the source.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    /// Where on the x axis.
    pub x: f64,
    /// Its text.
    pub label: String,
}

impl Tick {
    /// A tick at each `mark` event of `trace`, on `axis`.
    pub fn marks(trace: &Trace, axis: XAxis) -> Vec<Tick> {
        let times: &[u64] = match axis {
            XAxis::Events => &[],
            XAxis::Seconds => &trace.times_us,
        };
        trace
            .events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Event::Mark { label } => Some(Tick {
                    x: x_of(times, i),
                    label: label.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// A tick at event `index` of `trace`, on `axis`.
    pub fn at(trace: &Trace, axis: XAxis, index: usize, label: impl Into<String>) -> Tick {
        let times: &[u64] = match axis {
            XAxis::Events => &[],
            XAxis::Seconds => &trace.times_us,
        };
        Tick {
            x: x_of(times, index),
            label: label.into(),
        }
    }
}

/// One replay on the chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// How the legend names it (the policy, and the trace when there are several).
    pub label: String,
    /// Requested bytes, drawn once per trace (the same under every policy): `Some` for
    /// one replay of each trace, with the legend's name for it.
    pub requested: Option<(String, Series)>,
    /// Allocated bytes (after the policy's rounding).
    pub allocated: Series,
    /// Reserved bytes (held from the device).
    pub reserved: Series,
    /// The first out-of-memory, if any.
    pub oom: Option<OomPoint>,
}

/// A chart of memory over the run.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineChart {
    /// The title.
    pub title: String,
    /// What x counts.
    pub x_axis: XAxis,
    /// The replays.
    pub runs: Vec<Run>,
    /// The bytes the simulated device can hand out, and how to name them.
    pub capacity: Option<(u64, String)>,
    /// Marks and annotations.
    pub ticks: Vec<Tick>,
}

/// Ticks beyond this many are drawn without their labels (they would overlap).
const LABELLED_TICKS: usize = 40;
/// Pixels between two tick labels at least (a label closer to the one before is left
/// out: the tick's line is still drawn).
const TICK_LABEL_GAP: i32 = 16;

/// The chart as `format` bytes, `width` × `height` pixels.
///
/// # Errors
/// A size out of range, a chart with no replay, a drawing failure.
pub fn render_timeline(
    chart: &TimelineChart,
    format: ImageFormat,
    width: u32,
    height: u32,
) -> Result<Vec<u8>, PlotError> {
    if chart.runs.is_empty() {
        return Err(PlotError::Empty("no replay".into()));
    }
    render(chart, format, width, height)
}

impl TimelineChart {
    /// The largest x of any series.
    fn x_max(&self) -> f64 {
        self.runs
            .iter()
            .flat_map(|r| {
                r.reserved
                    .points
                    .last()
                    .into_iter()
                    .chain(r.requested.as_ref().and_then(|(_, s)| s.points.last()))
            })
            .map(|p| p.x)
            .fold(0.0, f64::max)
            .max(self.ticks.iter().map(|t| t.x).fold(0.0, f64::max))
    }

    /// The largest value of any series.
    fn y_data_max(&self) -> u64 {
        self.runs
            .iter()
            .map(|r| {
                r.reserved
                    .max()
                    .max(r.allocated.max())
                    .max(r.requested.as_ref().map_or(0, |(_, s)| s.max()))
            })
            .max()
            .unwrap_or(0)
    }
}

/// Width of the legend column, in pixels.
const LEGEND_WIDTH: u32 = 420;

/// A unit for the y axis: the largest binary unit the data reaches.
pub(crate) fn unit(max_bytes: u64) -> (f64, &'static str) {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, name) in UNITS {
        if max_bytes >= 1u64 << shift {
            return ((1u64 << shift) as f64, name);
        }
    }
    (1.0, "B")
}

impl Picture for TimelineChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let data_max = self.y_data_max();
        // The capacity is drawn when it is within reach of the data; far above it, it
        // would flatten every line, so the legend names it instead.
        let capacity_on_chart = self
            .capacity
            .as_ref()
            .filter(|(c, _)| data_max > 0 && (*c as f64) <= data_max as f64 * 1.6);
        let top = data_max.max(capacity_on_chart.map_or(0, |(c, _)| *c));
        let (per, unit_name) = unit(top);
        let y_top = if top == 0 {
            1.0
        } else {
            top as f64 * 1.06 / per
        };
        let x_top = match self.x_max() {
            x if x > 0.0 => x,
            _ => 1.0,
        };
        let (w, _) = root.dim_in_pixel();
        let (plot_area, legend_area) = root.split_horizontally(w.saturating_sub(LEGEND_WIDTH));
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(shorten(&self.title, 100), (FAMILY, 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..x_top, 0f64..y_top)
            .map_err(text)?;
        let x_desc = match self.x_axis {
            XAxis::Events => "event",
            XAxis::Seconds => "seconds since the first event",
        };
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(unit_name)
            .y_label_formatter(&|v| trim_number(*v))
            .x_label_formatter(&|v| match self.x_axis {
                XAxis::Events => format!("{}", *v as u64),
                XAxis::Seconds => trim_number(*v),
            })
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 14))
            .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
            .bold_line_style(RGBColor(0xdc, 0xdc, 0xdc))
            .draw()
            .map_err(text)?;

        // Ticks first, under the lines.
        let tick_style = RGBColor(0xb8, 0xb8, 0xb8).stroke_width(1);
        chart
            .draw_series(
                self.ticks
                    .iter()
                    .map(|t| PathElement::new(vec![(t.x, 0.0), (t.x, y_top)], tick_style)),
            )
            .map_err(text)?;
        if self.ticks.len() <= LABELLED_TICKS {
            let font = (FAMILY, 12)
                .into_font()
                .transform(FontTransform::Rotate90)
                .color(&RGBColor(0x55, 0x55, 0x55));
            // Left to right, a label only where it does not cover the one before (a
            // rotated label is one line of text wide).
            let mut order: Vec<&Tick> = self.ticks.iter().collect();
            order.sort_by(|a, b| a.x.total_cmp(&b.x));
            let mut last: Option<i32> = None;
            for t in order {
                let (px, py) = chart.backend_coord(&(t.x, y_top));
                if last.is_some_and(|l| px - l < TICK_LABEL_GAP) {
                    continue;
                }
                last = Some(px);
                plot_area
                    .draw(&Text::new(
                        shorten(&t.label, 28),
                        (px + 3, py + 4),
                        font.clone(),
                    ))
                    .map_err(text)?;
            }
        }
        // A value holds from its event to the next: steps, not slopes.
        let pts = |series: &Series| -> Vec<(f64, f64)> {
            let mut out: Vec<(f64, f64)> = Vec::with_capacity(series.points.len() * 2);
            for p in &series.points {
                let y = p.bytes as f64 / per;
                if let Some(&(_, last)) = out.last() {
                    out.push((p.x, last));
                }
                out.push((p.x, y));
            }
            out
        };
        for (i, run) in self.runs.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(DashedLineSeries::new(
                    pts(&run.allocated),
                    6,
                    3,
                    color.stroke_width(1),
                ))
                .map_err(text)?;
            chart
                .draw_series(LineSeries::new(pts(&run.reserved), color.stroke_width(2)))
                .map_err(text)?;
        }
        // Requested bytes on top: they are what every policy's lines sit above.
        for run in &self.runs {
            if let Some((_, requested)) = &run.requested {
                chart
                    .draw_series(LineSeries::new(pts(requested), INK.stroke_width(1)))
                    .map_err(text)?;
            }
        }
        if let Some((bytes, _)) = capacity_on_chart {
            let y = *bytes as f64 / per;
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(0.0, y), (x_top, y)],
                    8,
                    5,
                    ALARM.stroke_width(2),
                ))
                .map_err(text)?;
        }
        for (i, run) in self.runs.iter().enumerate() {
            let Some(oom) = run.oom else { continue };
            let color = PALETTE[i % PALETTE.len()];
            let y = oom.reserved_bytes as f64 / per;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(oom.x, 0.0), (oom.x, y_top)],
                    ALARM.mix(0.5).stroke_width(1),
                )))
                .map_err(text)?;
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((oom.x, y)) + Circle::new((0, 0), 9, ALARM.stroke_width(2)),
                ))
                .map_err(text)?;
            chart
                .draw_series(std::iter::once(Cross::new(
                    (oom.x, y),
                    5,
                    color.stroke_width(3),
                )))
                .map_err(text)?;
        }
        self.legend(&legend_area, capacity_on_chart.is_some())
    }
}

/// The requested bytes' colour.
const INK: RGBColor = RGBColor(0x22, 0x22, 0x22);

impl TimelineChart {
    /// The legend, in its own column: one entry per line, the capacity, each
    /// out-of-memory.
    fn legend<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        capacity_on_chart: bool,
    ) -> Result<(), String> {
        let font = (FAMILY, 13).into_font();
        let mut y = 52i32;
        let line = |y: i32, style: ShapeStyle, dashed: bool| -> Vec<PathElement<(i32, i32)>> {
            if dashed {
                (0..3)
                    .map(|k| PathElement::new(vec![(6 + 9 * k, y), (12 + 9 * k, y)], style))
                    .collect()
            } else {
                vec![PathElement::new(vec![(6, y), (30, y)], style)]
            }
        };
        // One entry: an optional line sample (style, dashed) and its text.
        let entry = |y: &mut i32, sample: Option<(ShapeStyle, bool)>, label: String| {
            if let Some((style, dashed)) = sample {
                for s in line(*y, style, dashed) {
                    area.draw(&s).map_err(text)?;
                }
            }
            area.draw(&Text::new(shorten(&label, 58), (38, *y - 8), font.clone()))
                .map_err(text)?;
            *y += 20;
            Ok::<(), String>(())
        };
        for run in &self.runs {
            if let Some((name, requested)) = &run.requested {
                entry(
                    &mut y,
                    Some((INK.stroke_width(1), false)),
                    format!(
                        "requested · {} (peak {})",
                        shorten(name, 22),
                        peak(requested)
                    ),
                )?;
            }
        }
        for (i, run) in self.runs.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            entry(
                &mut y,
                Some((color.stroke_width(2), false)),
                format!(
                    "reserved · {} (peak {})",
                    shorten(&run.label, 22),
                    peak(&run.reserved)
                ),
            )?;
            entry(
                &mut y,
                Some((color.stroke_width(1), true)),
                format!(
                    "allocated · {} (peak {})",
                    shorten(&run.label, 22),
                    peak(&run.allocated)
                ),
            )?;
        }
        if let Some((_, name)) = &self.capacity {
            y += 6;
            if capacity_on_chart {
                entry(&mut y, Some((ALARM.stroke_width(2), true)), name.clone())?;
            } else {
                entry(&mut y, None, name.clone())?;
                entry(&mut y, None, "(far above the chart)".to_string())?;
            }
        }
        for (i, run) in self.runs.iter().enumerate() {
            let Some(oom) = run.oom else { continue };
            let color = PALETTE[i % PALETTE.len()];
            y += 6;
            area.draw(&Circle::new((18, y), 8, ALARM.stroke_width(2)))
                .map_err(text)?;
            area.draw(&Cross::new((18, y), 4, color.stroke_width(3)))
                .map_err(text)?;
            entry(&mut y, None, format!("out of memory · {}", run.label))?;
            entry(
                &mut y,
                None,
                format!(
                    "{} request at event {}",
                    format_size_human(oom.requested_bytes),
                    oom.event_index
                ),
            )?;
        }
        if self.ticks.len() > LABELLED_TICKS {
            y += 6;
            entry(
                &mut y,
                Some((RGBColor(0xb8, 0xb8, 0xb8).stroke_width(1), false)),
                format!("{} marks and annotations", self.ticks.len()),
            )?;
        }
        Ok(())
    }
}

/// A series' highest value, in human units.
fn peak(series: &Series) -> String {
    format_size_human(series.max())
}

/// A number with at most two decimals and no trailing zeros (`1.5`, `2`, `0.25`).
pub(crate) fn trim_number(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}
