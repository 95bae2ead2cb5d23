//! `plot.png`: loss and accuracy against time, and the staleness histogram.

use std::path::Path;

use plotters::prelude::*;

use super::summary::{History, Summary};

const FONT_PATHS: &[&str] =
    &["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf"];

/// Registers a system font for the labels (plotters' ab_glyph backend has none built in).
fn register_font() -> Result<(), String> {
    static REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let path = FONT_PATHS.iter().find(|p| Path::new(p).exists()).ok_or_else(|| {
                format!("no DejaVu Sans font found (looked in {FONT_PATHS:?}); install fonts-dejavu-core")
            })?;
            let bytes: &'static [u8] =
                Box::leak(std::fs::read(path).map_err(|e| e.to_string())?.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{path} is not a usable font"))
        })
        .clone()
}

pub fn draw(path: &Path, history: &History, summary: &Summary) -> Result<(), String> {
    register_font()?;
    let root = BitMapBackend::new(path, (1500, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let title = format!(
        "{}: {} workers, {}, accuracy {}",
        summary.job,
        summary.workers,
        summary.algorithm,
        summary.accuracy.map_or("-".into(), |a| format!("{:.1}%", a * 100.0))
    );
    let root = root.titled(&title, ("sans-serif", 22)).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((1, 3));
    let t_max = summary.seconds.max(1.0);

    // Loss against time, one series per worker.
    let loss_max = history.loss.iter().map(|l| l.2).fold(0.1, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("training loss", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..t_max, 0.0..loss_max)
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("seconds").draw().map_err(|e| e.to_string())?;
    let workers = summary.workers as usize;
    for w in 0..workers {
        let pts: Vec<(f64, f64)> = history.loss.iter().filter(|l| l.1 == w).map(|l| (l.0, l.2)).collect();
        chart
            .draw_series(LineSeries::new(pts, Palette99::pick(w).stroke_width(2)))
            .map_err(|e| e.to_string())?;
    }

    // Held-out accuracy after each epoch.
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("held-out accuracy", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..t_max, 0.0..1.0)
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("seconds").draw().map_err(|e| e.to_string())?;
    for w in 0..workers {
        let pts: Vec<(f64, f64)> = history.accuracy.iter().filter(|a| a.1 == w).map(|a| (a.0, a.2)).collect();
        let color = Palette99::pick(w);
        chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2))).map_err(|e| e.to_string())?;
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(|e| e.to_string())?;
    }

    // Staleness histogram: per-bucket counts from the cumulative Prometheus buckets.
    let mut bars = Vec::new();
    let mut prev = 0;
    for (le, cum) in &summary.staleness_histogram {
        bars.push((le.clone(), cum.saturating_sub(prev)));
        prev = *cum;
    }
    while bars.len() > 1 && bars.last().is_some_and(|b| b.1 == 0) {
        bars.pop();
    }
    let y_max = bars.iter().map(|b| b.1).max().unwrap_or(1).max(1) as f64 * 1.1;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(&panels[2])
        .caption("gradient staleness τ", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..bars.len().max(1) as f64, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len().max(1))
        .x_label_formatter(&|x| labels.get(*x as usize).map_or(String::new(), |l| format!("≤{l}")))
        .x_desc("τ bucket")
        .y_desc("gradients")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, b.1 as f64)], BLUE.mix(0.6).filled())
        }))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
