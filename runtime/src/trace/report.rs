//! The utilization-over-time picture: an SVG with two panels sharing the time axis
//! (seconds since the first event):
//! 1. the utilization counters — machine CPU (`cpu.util`), this process
//!    (`process.cpu`) and each accelerator (`accN.util`), in percent;
//! 2. each track's busy fraction per time bin, in percent (the union of its
//!    slices inside the bin divided by the bin's length).
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
    let span = trace.span();
    let start = span
        .map(|s| s.0)
        .into_iter()
        .chain(util().map(|c| c.ts))
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
            let label = if t.name.starts_with(kind) {
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
    UtilizationSeries {
        start,
        end,
        bin,
        counters,
        tracks,
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

    fn draw_panel<DB: DrawingBackend>(
        area: &DrawingArea<DB, plotters::coord::Shift>,
        title: &str,
        x_end: f64,
        series: &[Series],
        color_offset: usize,
    ) -> DrawResult<()> {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let caption = if series.is_empty() {
            format!("{title}: none recorded")
        } else {
            title.to_string()
        };
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(48)
            // Head room above 100% for the legend.
            .build_cartesian_2d(0f64..x_end, 0f64..135f64)
            .map_err(e)?;
        chart
            .configure_mesh()
            .y_labels(8)
            .y_label_formatter(&|v| {
                if *v <= 100.0 {
                    format!("{v:.0}")
                } else {
                    String::new()
                }
            })
            .x_desc("seconds")
            .y_desc("%")
            .draw()
            .map_err(e)?;
        for (i, s) in series.iter().enumerate() {
            let (r, g, b) = PALETTE[(i + color_offset) % PALETTE.len()];
            let color = RGBColor(r, g, b).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(e)?
                .label(s.name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
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
            draw_panel(&top, "utilization (%)", x_end, &data.counters, 0)?;
            let title = format!("busy per track (%), {:.1} ms bins", data.bin as f64 / 1e6);
            draw_panel(&bottom, &title, x_end, &data.tracks, data.counters.len())?;
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
