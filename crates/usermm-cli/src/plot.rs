//! SVG plots of the experiments' results.

use std::path::Path;

use plotters::prelude::*;

/// One line of a plot: a label and (x index, y) points.
pub struct Series {
    pub label: String,
    pub points: Vec<(usize, f64)>,
    pub dashed: bool,
}

/// A line plot over categorical x positions (`x_labels`, described by
/// `x_desc`), y described by `y_label`.
pub fn change_plot(
    path: &Path,
    title: &str,
    x_labels: &[String],
    (x_desc, y_label): (&str, &str),
    series: &[Series],
) -> anyhow::Result<()> {
    // A value that is not finite (a rate over no time) cannot be placed:
    // it would make the axis infinite.
    if let Some(s) = series
        .iter()
        .find(|s| s.points.iter().any(|&(_, y)| !y.is_finite()))
    {
        anyhow::bail!(
            "plot {title}: series {} has a value that is not finite",
            s.label
        );
    }
    let (mut lo, mut hi) = (0f64, 0f64);
    for s in series {
        for &(_, y) in &s.points {
            lo = lo.min(y);
            hi = hi.max(y);
        }
    }
    let pad = ((hi - lo) * 0.1).max(5.0);
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = x_labels.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (lo - pad)..(hi + pad))?;
    let labels = x_labels.to_vec();
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&move |x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .x_desc(x_desc)
        .y_desc(y_label)
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (i, s) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x as f64, y)).collect();
        let style = ShapeStyle::from(&color).stroke_width(2);
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?
                .label(&s.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))?
                .label(&s.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One set of bars of a grouped bar plot: a label and a value per group
/// (None: no bar).
pub struct Bars {
    pub label: String,
    pub values: Vec<Option<f64>>,
}

/// Grouped bars over categorical groups (`groups`), y on a log scale (the
/// values span orders of magnitude).
pub fn bar_plot(
    path: &Path,
    title: &str,
    groups: &[String],
    y_label: &str,
    bars: &[Bars],
) -> anyhow::Result<()> {
    let hi = bars
        .iter()
        .flat_map(|b| b.values.iter().flatten())
        .fold(1.0f64, |a, &v| a.max(v));
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = groups.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (1.0f64..hi * 4.0).log_scale())?;
    let labels = groups.to_vec();
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&move |x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc(y_label)
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let width = 0.8 / bars.len().max(1) as f64;
    for (i, b) in bars.iter().enumerate() {
        let color = colors[i % colors.len()];
        let rects = b.values.iter().enumerate().filter_map(|(g, v)| {
            let x0 = g as f64 - 0.4 + i as f64 * width;
            v.map(|v| Rectangle::new([(x0, 1.0), (x0 + width * 0.9, v.max(1.0))], color.filled()))
        });
        chart
            .draw_series(rects)?
            .label(&b.label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
