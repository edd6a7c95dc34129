//! Pictures of real replays, checked as files: SVG that parses, with its series,
//! legend and labels; PNG that decodes, with the series' colours and text drawn by the
//! embedded font; the same bytes every time.

use plot::{
    render_segments, render_timeline, Capture, ImageFormat, Moment, Run, SegmentMap, SegmentPanel,
    SeriesRecorder, Tick, TimelineChart, XAxis,
};
use policies::PolicyConfig;
use sim::{ReplayOptions, SimDevice, SimDeviceOptions};
use workloads::{AllocId, Event, Trace};

const MIB: u64 = 1 << 20;

/// Two iterations of growing and shrinking allocations on two streams, with marks.
fn trace() -> Trace {
    let mut events = vec![Event::Mark {
        label: "iteration 1".into(),
    }];
    let mut id = 0;
    for it in 0..2u64 {
        if it == 1 {
            events.push(Event::Mark {
                label: "iteration 2".into(),
            });
        }
        for k in 0..12u64 {
            events.push(Event::Alloc {
                id: AllocId(id + k),
                size_bytes: (k + 1) * 3 * MIB + 1000 * k,
                stream: k % 2,
            });
        }
        for k in (0..12u64).step_by(2) {
            events.push(Event::Free {
                id: AllocId(id + k),
            });
        }
        id += 12;
    }
    Trace::new("two_iterations", events)
}

fn device(capacity_bytes: u64) -> SimDevice {
    SimDevice::new(SimDeviceOptions {
        capacity_bytes,
        total_bytes: capacity_bytes,
        ..SimDeviceOptions::default()
    })
}

fn policy(name: &str) -> Box<dyn policies::Policy> {
    PolicyConfig::defaults()
        .into_iter()
        .find(|c| c.kind_name() == name)
        .unwrap()
        .build()
        .unwrap()
}

/// The chart of `trace` under caching and immediate on a device of `capacity_bytes`.
fn chart(capacity_bytes: u64) -> TimelineChart {
    let trace = trace();
    let mut runs = Vec::new();
    for (i, name) in ["caching", "immediate"].into_iter().enumerate() {
        let mut recorder = SeriesRecorder::new(&trace, XAxis::Events);
        sim::replay_with(
            &trace,
            policy(name).as_mut(),
            &mut device(capacity_bytes),
            &ReplayOptions::default(),
            &mut recorder,
        )
        .unwrap();
        let (requested, allocated, reserved, oom) = recorder.finish();
        runs.push(Run {
            label: name.to_string(),
            requested: (i == 0).then(|| (trace.name.clone(), requested)),
            allocated,
            reserved,
            oom,
        });
    }
    TimelineChart {
        title: "two_iterations: memory over the run".into(),
        x_axis: XAxis::Events,
        runs,
        capacity: Some((capacity_bytes, "capacity of the test".into())),
        ticks: Tick::marks(&trace, XAxis::Events),
    }
}

/// The texts of an SVG document (which must parse).
fn svg_texts(bytes: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(bytes).expect("SVG is UTF-8");
    let doc = roxmltree::Document::parse(text).expect("SVG parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect()
}

/// Whether the SVG draws a line or path in `color` (`#RRGGBB`).
fn svg_strokes(bytes: &[u8], color: &str) -> usize {
    let text = std::str::from_utf8(bytes).unwrap();
    let doc = roxmltree::Document::parse(text).unwrap();
    doc.descendants()
        .filter(|n| matches!(n.tag_name().name(), "polyline" | "path" | "line"))
        .filter(|n| n.attribute("stroke") == Some(color))
        .count()
}

/// A decoded PNG: width, height, RGB pixels.
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<[u8; 3]>) {
    let decoder = png::Decoder::new(bytes);
    let mut reader = decoder.read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let pixels = buf[..info.buffer_size()]
        .chunks(3)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (info.width, info.height, pixels)
}

/// An SVG chart holds one reserved line per policy in its colour, the requested line,
/// the capacity line, the mark labels and a legend naming each series with its peak.
#[test]
fn timeline_svg_has_series_and_labels() {
    // Near the data's peak (360 MiB requested), so the capacity is drawn.
    let c = chart(512 * MIB);
    assert!(c.runs.iter().all(|r| r.oom.is_none()));
    let svg = render_timeline(&c, ImageFormat::Svg, 1400, 800).unwrap();
    let texts = svg_texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t.contains(s));
    for want in [
        "two_iterations: memory over the run",
        "requested · two_iterations (peak",
        "reserved · caching (peak",
        "allocated · caching (peak",
        "reserved · immediate (peak",
        "capacity of the test",
        "iteration 1",
        "iteration 2",
        "event",
        "MiB",
    ] {
        assert!(has(want), "no text {want:?} in {texts:?}");
    }
    // Blue (caching) and orange (immediate) lines, the red capacity line.
    assert!(svg_strokes(&svg, "#1F77B4") >= 2, "no caching lines");
    assert!(svg_strokes(&svg, "#FF7F0E") >= 2, "no immediate lines");
    assert!(svg_strokes(&svg, "#D62728") >= 1, "no capacity line");
    // The legend's peak is the replay's peak.
    let peak = c.runs[0].reserved.max();
    assert!(
        has(&format!(
            "reserved · caching (peak {})",
            units::format_size_human(peak)
        )),
        "{texts:?}"
    );
}

/// On a device too small for the trace, each replay's out-of-memory is in the legend
/// with the request that failed and its event.
#[test]
fn timeline_marks_out_of_memory() {
    let c = chart(64 * MIB);
    let oom = c.runs[0].oom.expect("caching runs out of 64 MiB");
    let svg = render_timeline(&c, ImageFormat::Svg, 1400, 800).unwrap();
    let texts = svg_texts(&svg);
    assert!(
        texts.iter().any(|t| t == "out of memory · caching"),
        "{texts:?}"
    );
    let line = format!(
        "{} request at event {}",
        units::format_size_human(oom.requested_bytes),
        oom.event_index
    );
    assert!(texts.contains(&line), "no {line:?} in {texts:?}");
}

/// A PNG chart decodes at the asked size, shows each policy's colour, and has text in
/// its title band (drawn with the embedded font: no system font is needed).
#[test]
fn timeline_png_decodes_with_colours_and_text() {
    let png = render_timeline(&chart(1 << 30), ImageFormat::Png, 1000, 600).unwrap();
    let (w, h, px) = decode_png(&png);
    assert_eq!((w, h), (1000, 600));
    let count = |rgb: [u8; 3]| px.iter().filter(|&&p| p == rgb).count();
    assert!(count([0x1f, 0x77, 0xb4]) > 100, "caching's blue");
    assert!(count([0xff, 0x7f, 0x0e]) > 100, "immediate's orange");
    let title_ink = px[..(w as usize * 30)]
        .iter()
        .filter(|p| p.iter().all(|&c| c < 0x80))
        .count();
    assert!(
        title_ink > 100,
        "no title text drawn ({title_ink} dark pixels)"
    );
}

/// The same chart renders to the same bytes, SVG and PNG.
#[test]
fn rendering_is_deterministic() {
    let a = chart(1 << 30);
    let b = chart(1 << 30);
    for format in [ImageFormat::Svg, ImageFormat::Png] {
        assert_eq!(
            render_timeline(&a, format, 900, 500).unwrap(),
            render_timeline(&b, format, 900, 500).unwrap()
        );
    }
    let m = segment_map(Moment::Event(20));
    assert_eq!(
        render_segments(&m, ImageFormat::Png, 900).unwrap(),
        render_segments(&m, ImageFormat::Png, 900).unwrap()
    );
}

/// The caching policy's segments after event `moment`.
fn segment_map(moment: Moment) -> SegmentMap {
    let trace = trace();
    let at = match moment {
        Moment::Event(i) => Some(i),
        _ => None,
    };
    let mut capture = Capture::new(at);
    sim::replay_with(
        &trace,
        policy("caching").as_mut(),
        &mut device(1 << 30),
        &ReplayOptions::default(),
        &mut capture,
    )
    .unwrap();
    SegmentMap {
        title: "two_iterations: segments".into(),
        panels: vec![SegmentPanel {
            title: "caching after event 20".into(),
            snapshot: capture.snapshot.unwrap(),
        }],
        capacity_bytes: Some(1 << 30),
    }
}

/// A segment map names each stream apart with its segments, labels every segment with
/// its address, and draws used, rounding-waste and cached-free blocks in their colours.
#[test]
fn segment_map_svg_has_streams_segments_and_blocks() {
    let m = segment_map(Moment::Event(20));
    let snap = &m.panels[0].snapshot;
    assert_eq!(snap.event_index, 20);
    let svg = render_segments(&m, ImageFormat::Svg, 1400).unwrap();
    let texts = svg_texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t.contains(s));
    assert!(has("stream 0 (default): "), "{texts:?}");
    assert!(has("stream 0x1: "), "{texts:?}");
    assert!(has("of 1.00 GiB usable"), "{texts:?}");
    for s in &snap.segments {
        assert!(has(&format!("{:#x}", s.addr.0)), "segment {:#x}", s.addr.0);
    }
    let text = String::from_utf8(svg).unwrap();
    for (color, what) in [
        ("#1F77B4", "used"),
        ("#FF7F0E", "rounding waste"),
        ("#DDDDDD", "cached free"),
    ] {
        let fills = text.matches(&format!("fill=\"{color}\"")).count();
        // One swatch in the legend, then the blocks.
        assert!(fills > 1, "no {what} block");
    }
}

/// Sizes out of range and empty pictures are errors, not panics.
#[test]
fn bad_sizes_and_empty_pictures_are_errors() {
    let c = chart(1 << 30);
    assert!(matches!(
        render_timeline(&c, ImageFormat::Png, 10, 800),
        Err(plot::PlotError::Size { .. })
    ));
    let empty = TimelineChart {
        runs: Vec::new(),
        ..c
    };
    assert!(matches!(
        render_timeline(&empty, ImageFormat::Svg, 800, 600),
        Err(plot::PlotError::Empty(_))
    ));
    let no_panels = SegmentMap {
        title: String::new(),
        panels: Vec::new(),
        capacity_bytes: None,
    };
    assert!(render_segments(&no_panels, ImageFormat::Svg, 800).is_err());
    assert!(ImageFormat::from_path(std::path::Path::new("a.jpg")).is_err());
    assert_eq!(
        ImageFormat::from_path(std::path::Path::new("a.PNG")).unwrap(),
        ImageFormat::Png
    );
}
