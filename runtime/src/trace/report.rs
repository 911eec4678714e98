//! The utilization-over-time picture: an SVG with two panels sharing the time axis
//! (seconds since the first event):
//! 1. the utilization counters — machine CPU (`cpu.util`), this process
//!    (`process.cpu`) and each accelerator (`accN.util`), in percent;
//! 2. each track's busy fraction per time bin, in percent (the union of its
//!    slices inside the bin divided by the bin's length).
//!
//! Both y axes run from 0 to 100%, with the legends beside the panels, and a
//! dashed line marks the start of each epoch (the trainer's [`EPOCH_INSTANT`]
//! instants).
//!
//! Drawn with `plotters`' SVG backend without system fonts: text is emitted as SVG
//! `<text>` elements and laid out with plotters' built-in size estimate (its
//! `ttf` feature, which needs fontconfig and system fonts, is off).

use super::model::{top_level_slices, Nanos, Trace, TrackKind};
use super::sampler::{parse_acc_counter, CPU_UTIL, PROCESS_CPU};

#[cfg(feature = "svg")]
pub use svg::{render_utilization_svg, write_utilization_svg};

/// Default number of time bins for the busy fractions.
pub const DEFAULT_BINS: usize = 200;

/// Name of the instant a trainer records as each epoch starts (its `epoch`
/// argument the 0-based epoch); the picture marks them.
pub const EPOCH_INSTANT: &str = "epoch start";

/// One line of the picture.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (seconds since `UtilizationSeries::start`, percent).
    pub points: Vec<(f64, f64)>,
}

/// The data of the picture.
#[derive(Clone, Debug, PartialEq)]
pub struct UtilizationSeries {
    /// Time 0 of the picture: the first slice start or counter sample.
    pub start: Nanos,
    /// The last slice end or counter sample.
    pub end: Nanos,
    /// Bin width.
    pub bin: Nanos,
    /// Utilization counters, percent.
    pub counters: Vec<Series>,
    /// Busy percent per bin, one series per track (points at bin centers).
    pub tracks: Vec<Series>,
    /// Epoch starts: (0-based epoch, seconds since `start`), in time order.
    pub epochs: Vec<(u64, f64)>,
}

fn is_util_counter(name: &str) -> bool {
    name == CPU_UTIL
        || name == PROCESS_CPU
        || parse_acc_counter(name).is_some_and(|(_, k)| k == "util")
}

/// Computes the picture's series with `bins` time bins (at least 1).
pub fn utilization_series(trace: &Trace, bins: usize) -> UtilizationSeries {
    let bins = bins.max(1) as u64;
    let names: Vec<&str> = trace
        .counter_names()
        .into_iter()
        .filter(|n| is_util_counter(n))
        .collect();
    let util = || {
        trace
            .counters
            .iter()
            .filter(|c| names.contains(&c.name.as_ref()))
    };
    let marks = || {
        trace
            .instants
            .iter()
            .filter(|i| i.name == EPOCH_INSTANT)
            .filter_map(|i| Some((i.args.epoch?, i.ts)))
    };
    let span = trace.span();
    // An epoch starts before its first slice: its mark counts for time 0.
    let start = span
        .map(|s| s.0)
        .into_iter()
        .chain(util().map(|c| c.ts))
        .chain(marks().map(|m| m.1))
        .min()
        .unwrap_or(0);
    let end = span
        .map(|s| s.1)
        .into_iter()
        .chain(util().map(|c| c.ts))
        .max()
        .unwrap_or(0);
    let bin = (end - start).div_ceil(bins).max(1);
    let x = |t: Nanos| (t - start) as f64 / 1e9;
    let counters = names
        .iter()
        .map(|&n| Series {
            name: n.to_string(),
            points: trace
                .counter_series(n)
                .map(|c| (x(c.ts), c.value))
                .collect(),
        })
        .collect();
    let tops = top_level_slices(trace);
    let nbins = if end > start { bins } else { 0 };
    let tracks = trace
        .tracks
        .iter()
        .map(|t| {
            let mut busy = vec![0u64; nbins as usize];
            for &(s, e) in tops.intervals.get(&t.id).map_or(&[][..], Vec::as_slice) {
                let (s, e) = (s - start, e - start);
                let mut b = s / bin;
                while b < nbins && b * bin < e {
                    let lo = s.max(b * bin);
                    let hi = e.min((b + 1) * bin);
                    busy[b as usize] += hi.saturating_sub(lo);
                    b += 1;
                }
            }
            let kind = match t.kind {
                TrackKind::Cpu => "cpu",
                TrackKind::Accelerator => "acc",
            };
            // A name that says where it runs stays as it is (`cpu worker 0`,
            // `acc stream compute`, `host backend compute`).
            let label = if t.name.starts_with(kind) || t.name.starts_with("host backend") {
                t.name.clone()
            } else {
                format!("{} ({kind})", t.name)
            };
            Series {
                name: label,
                points: busy
                    .iter()
                    .enumerate()
                    .map(|(b, &ns)| {
                        let center = (b as f64 + 0.5) * bin as f64 / 1e9;
                        (center, 100.0 * ns as f64 / bin as f64)
                    })
                    .collect(),
            }
        })
        .collect();
    let epochs = marks()
        .filter(|m| m.1 <= end)
        .map(|(e, ts)| (e, x(ts)))
        .collect();
    UtilizationSeries {
        start,
        end,
        bin,
        counters,
        tracks,
        epochs,
    }
}

/// The SVG itself (cargo feature `svg`, on with the default `cli`).
#[cfg(feature = "svg")]
mod svg {
    use std::io::Write;
    use std::path::Path;

    use plotters::prelude::*;

    use super::{utilization_series, Series, Trace, DEFAULT_BINS};
    use crate::atomic::write_file_atomically;
    use crate::error::{Error, Result};

    type DrawResult<T> = std::result::Result<T, String>;

    /// Line colors (Tableau 10: distinguishable, readable on white).
    const PALETTE: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];

    /// Width of the legend column beside each panel, in pixels.
    const LEGEND_WIDTH: u32 = 270;

    /// One panel: the chart (0–100%) with the epoch markers, and its legend
    /// in a column to the right of it.
    fn draw_panel<DB: DrawingBackend>(
        area: &DrawingArea<DB, plotters::coord::Shift>,
        title: &str,
        x_end: f64,
        series: &[Series],
        color_offset: usize,
        epochs: &[(u64, f64)],
    ) -> DrawResult<()> {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let caption = if series.is_empty() {
            format!("{title}: none recorded")
        } else {
            title.to_string()
        };
        let (width, _) = area.dim_in_pixel();
        let (plot, legend) = area.split_horizontally(width.saturating_sub(LEGEND_WIDTH));
        let mut chart = ChartBuilder::on(&plot)
            .caption(caption, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..x_end, 0f64..100f64)
            .map_err(e)?;
        chart
            .configure_mesh()
            .y_labels(6)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .x_desc("seconds")
            .y_desc("%")
            .draw()
            .map_err(e)?;
        // Epoch starts: a dashed line each, labelled (every k-th when crowded).
        let every = epochs.len().div_ceil(20).max(1);
        let grey = RGBColor(90, 90, 90);
        for (n, &(epoch, t)) in epochs.iter().enumerate() {
            chart
                .draw_series(DashedLineSeries::new(
                    [(t, 0.0), (t, 100.0)],
                    4,
                    3,
                    grey.stroke_width(1),
                ))
                .map_err(e)?;
            if n % every == 0 {
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("epoch {epoch}"),
                        (t, 99.0),
                        ("sans-serif", 11).into_font().color(&grey),
                    )))
                    .map_err(e)?;
            }
        }
        for (i, s) in series.iter().enumerate() {
            let (r, g, b) = PALETTE[(i + color_offset) % PALETTE.len()];
            let color = RGBColor(r, g, b).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(e)?;
            // The legend column: a line of the series' color and its name.
            let y = 44 + 18 * i as i32;
            legend
                .draw(&PathElement::new(
                    vec![(8, y), (32, y)],
                    color.stroke_width(2),
                ))
                .map_err(e)?;
            legend
                .draw(&Text::new(
                    s.name.clone(),
                    (38, y - 6),
                    ("sans-serif", 13).into_font(),
                ))
                .map_err(e)?;
        }
        Ok(())
    }

    /// Renders the picture of `trace` as SVG text.
    pub fn render_utilization_svg(trace: &Trace, bins: usize) -> DrawResult<String> {
        let data = utilization_series(trace, bins);
        let x_end = ((data.end - data.start) as f64 / 1e9).max(1e-3);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (1100, 720)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let (top, bottom) = root.split_vertically(330);
            let counters = &data.counters;
            draw_panel(&top, "utilization (%)", x_end, counters, 0, &data.epochs)?;
            let title = format!("busy per track (%), {:.1} ms bins", data.bin as f64 / 1e6);
            let offset = data.counters.len();
            draw_panel(&bottom, &title, x_end, &data.tracks, offset, &data.epochs)?;
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }

    /// Writes the picture of `trace` to `path` (SVG), atomically.
    pub fn write_utilization_svg(path: &Path, trace: &Trace) -> Result<()> {
        let svg = render_utilization_svg(trace, DEFAULT_BINS).map_err(|what| {
            Error::io(
                path,
                std::io::Error::other(format!("drawing the utilization picture: {what}")),
            )
        })?;
        write_file_atomically(path, |w| {
            w.write_all(svg.as_bytes()).map_err(|e| Error::io(path, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::model::{Args, Counter, Slice, Track, TrackId};

    fn trace() -> Trace {
        let ms = 1_000_000u64;
        let mut t = Trace {
            tracks: vec![
                Track {
                    id: TrackId(0),
                    name: "cpu worker 0".into(),
                    kind: TrackKind::Cpu,
                },
                Track {
                    id: TrackId(1),
                    name: "compute".into(),
                    kind: TrackKind::Accelerator,
                },
            ],
            ..Trace::default()
        };
        for (track, s, e) in [(0, 10, 25), (0, 30, 40), (0, 32, 35), (1, 0, 40)] {
            t.slices.push(Slice {
                track: TrackId(track),
                name: "w".into(),
                start: s * ms,
                end: e * ms,
                args: Args::default(),
            });
        }
        for (ts, v) in [(0, 10.0), (20, 50.0), (40, 80.0)] {
            t.counters.push(Counter {
                name: CPU_UTIL.into(),
                ts: ts * ms,
                value: v,
            });
            t.counters.push(Counter {
                name: "process.rss_mib".into(),
                ts: ts * ms,
                value: 100.0,
            });
        }
        t.sort();
        t.validate().unwrap();
        t
    }

    #[test]
    fn epoch_starts_are_marked_in_time_order() {
        let mut t = trace();
        // Epoch 0 starts before the first slice (at 0 ms): time 0 moves to it.
        for (epoch, ts) in [(0u64, 0), (1, 30)] {
            t.instants.push(crate::trace::model::InstantEvent {
                track: TrackId(0),
                name: EPOCH_INSTANT.into(),
                ts: ts * 1_000_000,
                args: Args {
                    epoch: Some(epoch),
                    ..Args::default()
                },
            });
        }
        t.sort();
        t.slices.retain(|s| s.start >= 10_000_000);
        t.counters.clear();
        let u = utilization_series(&t, 4);
        assert_eq!(u.start, 0);
        assert_eq!(u.epochs, [(0, 0.0), (1, 0.03)]);
        #[cfg(feature = "svg")]
        {
            let svg = render_utilization_svg(&t, 4).unwrap();
            assert!(svg.contains("epoch 0") && svg.contains("epoch 1"));
        }
    }

    #[test]
    fn busy_fractions_per_bin_are_exact() {
        let u = utilization_series(&trace(), 4);
        assert_eq!((u.start, u.end, u.bin), (0, 40_000_000, 10_000_000));
        // Only utilization counters are drawn (not memory).
        assert_eq!(u.counters.len(), 1);
        assert_eq!(
            u.counters[0].points,
            [(0.0, 10.0), (0.02, 50.0), (0.04, 80.0)]
        );
        let cpu: Vec<f64> = u.tracks[0].points.iter().map(|p| p.1).collect();
        // Bins of 10 ms: [10,20) full; [20,30) 5 ms; [30,40) full (nested slice once).
        assert_eq!(cpu, [0.0, 100.0, 50.0, 100.0]);
        assert_eq!(u.tracks[0].points[1].0, 0.015);
        assert_eq!(u.tracks[1].name, "compute (acc)");
        assert!(u.tracks[1].points.iter().all(|p| p.1 == 100.0));
    }

    #[cfg(feature = "svg")]
    #[test]
    fn svg_renders_with_text_and_lines() {
        let svg = render_utilization_svg(&trace(), 50).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.contains("utilization (%)"));
        assert!(svg.contains("cpu worker 0"));
        assert!(svg.contains("cpu.util"));
        assert!(svg.contains("<polyline"));
        // The y axes end at 100, with no empty band above: in the top panel
        // (330 px), the y labels (right-aligned texts) run from 0 at the bottom
        // of the plot to 100 at its top, most of the panel's height apart.
        let labels: Vec<(f64, f64)> = svg
            .split("<text")
            .skip(1)
            .filter(|t| t.contains("text-anchor=\"end\""))
            .filter_map(|t| {
                let y = t.split("y=\"").nth(1)?.split('"').next()?.parse().ok()?;
                let body = &t[t.find('>')? + 1..t.find("</text>")?];
                Some((y, body.trim().parse().ok()?))
            })
            .filter(|&(y, _)| y < 330.0)
            .collect();
        let at = |v: f64| labels.iter().find(|l| l.1 == v).map(|l| l.0);
        let (Some(y0), Some(y100)) = (at(0.0), at(100.0)) else {
            panic!("labels 0 and 100: {labels:?}");
        };
        assert!(labels.iter().all(|&(_, v)| v <= 100.0), "{labels:?}");
        assert!((y0 - y100) / 330.0 > 0.7, "{labels:?}");
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[cfg(feature = "svg")]
    #[test]
    fn an_empty_trace_still_draws() {
        let svg = render_utilization_svg(&Trace::default(), 10).unwrap();
        assert!(svg.contains("none recorded"));
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("u.svg");
        write_utilization_svg(&p, &trace()).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().contains("</svg>"));
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
