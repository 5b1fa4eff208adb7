//! SVG figures like the papers': completion time per job under both policies, CPU share per job
//! over time (worker 1), and jobs per worker over time. Drawn with `plotters` (SVG backend only).

use std::path::Path;

use plotters::prelude::*;

use crate::engine::Run;
use crate::error::{Error, Result};

const SIZE: (u32, u32) = (900, 420);
/// Most points kept per line (keeps the SVGs small).
const MAX_POINTS: usize = 600;

fn plot_err(path: &Path, e: impl std::fmt::Debug) -> Error {
    Error::Plot {
        path: path.into(),
        message: format!("{e:?}"),
    }
}

fn thin(points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if points.len() <= MAX_POINTS {
        return points;
    }
    let step = points.len().div_ceil(MAX_POINTS);
    let last = *points.last().expect("non-empty");
    let mut v: Vec<(f64, f64)> = points.into_iter().step_by(step).collect();
    v.push(last);
    v
}

/// Completion time per job: policy and baseline side by side.
pub fn completion_times(policy: &Run, baseline: &Run, title: &str, path: &Path) -> Result<()> {
    let n = policy.jobs.len();
    let ymax = policy
        .jobs
        .iter()
        .chain(&baseline.jobs)
        .map(|j| j.jct)
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..n as f64, 0.0..ymax)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .disable_x_mesh()
        .x_desc("job")
        .y_desc("completion time (s)")
        .x_labels(n.min(30))
        .x_label_formatter(&|x| format!("{}", x.floor() as usize + 1))
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for (k, (run, color)) in [(policy, BLUE), (baseline, RED)].into_iter().enumerate() {
        let off = 0.1 + 0.4 * k as f64;
        chart
            .draw_series(run.jobs.iter().enumerate().map(|(i, j)| {
                let x = i as f64 + off;
                Rectangle::new([(x, 0.0), (x + 0.38, j.jct)], color.mix(0.8).filled())
            }))
            .map_err(|e| plot_err(path, e))?
            .label(run.policy.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// CPU share per job on worker 1 over time (the papers' CPU-usage figures).
pub fn cpu_shares(run: &Run, title: &str, path: &Path) -> Result<()> {
    let trace = run
        .trace
        .as_ref()
        .ok_or_else(|| plot_err(path, "no trace recorded"))?;
    let mut jobs: Vec<usize> = trace
        .cpu
        .iter()
        .flat_map(|(_, v)| v.iter().map(|&(j, _)| j))
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    let tmax = run.jobs.iter().map(|j| j.finish).fold(1.0, f64::max);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..tmax, 0.0..1.05)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc("time (s)")
        .y_desc("CPU share of worker 1")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for (k, &j) in jobs.iter().enumerate() {
        let mut pts = Vec::new();
        let mut last = 0.0;
        for (t, shares) in &trace.cpu {
            let s = shares.iter().find(|(x, _)| *x == j).map_or(0.0, |s| s.1);
            pts.push((*t, last));
            pts.push((*t, s));
            last = s;
        }
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(thin(pts), color.stroke_width(2)))
            .map_err(|e| plot_err(path, e))?
            .label(run.jobs[j].id.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color));
    }
    if jobs.len() <= 12 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| plot_err(path, e))?;
    }
    root.present().map_err(|e| plot_err(path, e))
}

/// Jobs on each worker over time.
pub fn jobs_per_worker(run: &Run, workers: usize, title: &str, path: &Path) -> Result<()> {
    let trace = run
        .trace
        .as_ref()
        .ok_or_else(|| plot_err(path, "no trace recorded"))?;
    let tmax = run.jobs.iter().map(|j| j.finish).fold(1.0, f64::max);
    let ymax = trace.per_worker.iter().map(|p| p.2).max().unwrap_or(1) as f64 + 1.0;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..tmax, 0.0..ymax)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc("time (s)")
        .y_desc("jobs on worker")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for w in 0..workers {
        let mut pts = vec![(0.0, 0.0)];
        let mut last = 0.0;
        for &(t, _, n) in trace.per_worker.iter().filter(|p| p.1 == w) {
            pts.push((t, last));
            pts.push((t, n as f64));
            last = n as f64;
        }
        let color = Palette99::pick(w).to_rgba();
        chart
            .draw_series(LineSeries::new(thin(pts), color.stroke_width(2)))
            .map_err(|e| plot_err(path, e))?
            .label(format!("worker-{}", w + 1))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Grouped bars (the value-based allocation paper's Fig. 3): one group per row label, one bar
/// per series, `values[group][series]`.
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[String],
    values: &[Vec<f64>],
) -> Result<()> {
    let ymax = values.iter().flatten().copied().fold(1.0, f64::max) * 1.1;
    let n = groups.len().max(1);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..ymax)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .disable_x_mesh()
        .y_desc(y_desc)
        .x_labels(2 * n + 1)
        .x_label_formatter(&|x| {
            // Groups are centred on integers; other ticks stay blank.
            if (x - x.round()).abs() > 1e-6 || x.round() < 0.0 {
                return String::new();
            }
            groups.get(x.round() as usize).cloned().unwrap_or_default()
        })
        .draw()
        .map_err(|e| plot_err(path, e))?;
    let width = 0.8 / series.len().max(1) as f64;
    for (s, label) in series.iter().enumerate() {
        let color = Palette99::pick(s).to_rgba();
        chart
            .draw_series(values.iter().enumerate().map(|(g, row)| {
                let x = g as f64 - 0.4 + width * s as f64;
                let v = row.get(s).copied().unwrap_or(0.0);
                Rectangle::new([(x, 0.0), (x + width * 0.9, v)], color.filled())
            }))
            .map_err(|e| plot_err(path, e))?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Lines over a numeric x axis (the paper's Fig. 4): `values[x][series]`.
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    xs: &[f64],
    series: &[String],
    values: &[Vec<f64>],
) -> Result<()> {
    let xmin = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let xmax = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (xmin, xmax) = if xmin < xmax {
        (xmin, xmax)
    } else {
        (xmin - 1.0, xmin + 1.0)
    };
    let ymax = values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        * 1.1;
    let ymax = if ymax > 0.0 { ymax } else { 1.0 };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(xmin..xmax, 0.0..ymax)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for (s, label) in series.iter().enumerate() {
        let color = Palette99::pick(s).to_rgba();
        let pts: Vec<(f64, f64)> = xs
            .iter()
            .zip(values)
            .filter_map(|(&x, row)| {
                row.get(s)
                    .copied()
                    .filter(|v| v.is_finite())
                    .map(|v| (x, v))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| plot_err(path, e))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(|e| plot_err(path, e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}
