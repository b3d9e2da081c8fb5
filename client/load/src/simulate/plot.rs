//! The simulation's plot: hit ratio against gateways, one line per policy
//! (and capacity model), with the upper bound, as SVG.

use std::path::Path;

use plotters::prelude::*;

use super::{Policy, SimResult};

/// How one series is drawn.
struct Style {
    color: RGBColor,
    /// Dashed (capacity models other than the right one, and the oracle,
    /// which the precise line may hide).
    dashed: bool,
    /// Hollow markers, larger than the filled ones.
    hollow: bool,
}

fn style(r: &SimResult) -> Style {
    let wrong_model = r.capacity_model.is_some_and(|m| m != 1.0);
    let color = match (r.policy, r.capacity_model) {
        (Policy::Random, _) => RED,
        (Policy::LeastLoaded, _) => RGBColor(230, 140, 0),
        (Policy::PrefixShared, Some(m)) if m < 1.0 => RGBColor(120, 160, 255),
        (Policy::PrefixShared, Some(m)) if m > 1.0 => RGBColor(0, 0, 130),
        (Policy::PrefixShared, _) => BLUE,
        (Policy::PrefixLocal, Some(m)) if m < 1.0 => RGBColor(120, 210, 120),
        (Policy::PrefixLocal, Some(m)) if m > 1.0 => RGBColor(0, 90, 0),
        (Policy::PrefixLocal, _) => RGBColor(0, 160, 0),
        (Policy::Precise, _) => MAGENTA,
        (Policy::Oracle, _) => RGBColor(90, 90, 90),
    };
    Style {
        color,
        dashed: wrong_model || r.policy == Policy::Oracle,
        hollow: r.policy == Policy::Oracle,
    }
}

/// Draws hit ratio against gateways, one line per policy and capacity
/// model, with the upper bound, as SVG: ticks at the simulated gateway
/// counts, and the legend in a column right of the chart, where no line
/// goes.
pub fn plot(results: &[SimResult], bound: f64, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    let mut counts: Vec<usize> = results.iter().map(|r| r.gateways).collect();
    counts.sort_unstable();
    counts.dedup();
    let max_g = counts.last().copied().unwrap_or(8) as f64;
    let highest = results.iter().map(|r| r.hit_ratio).fold(bound, f64::max);
    let top = (highest * 1.15).max(0.05);
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "Block hit ratio vs gateway replicas (Mooncake trace)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0.5f64..max_g + 0.5, 0f64..top)?;
    // The x axis gets its ticks and labels below, at the simulated counts
    // only: plotters would place them at round fractions.
    chart
        .configure_mesh()
        .x_desc("gateway replicas")
        .y_desc("block hit ratio")
        .x_labels(0)
        .disable_x_mesh()
        .draw()?;
    let font = ("sans-serif", 13).into_font().color(&BLACK);
    for &g in &counts {
        let (px, py) = chart.backend_coord(&(g as f64, 0.0));
        root.draw(&PathElement::new(vec![(px, py), (px, py + 5)], BLACK))?;
        let label = g.to_string();
        let (w, _) = root.estimate_text_size(&label, &font)?;
        root.draw(&Text::new(label, (px - w as i32 / 2, py + 8), font.clone()))?;
    }
    chart.draw_series(LineSeries::new(
        [(0.5, bound), (max_g + 0.5, bound)],
        BLACK.stroke_width(1),
    ))?;
    // One series per label, in the order the results come.
    let mut labels: Vec<(String, Style)> = Vec::new();
    for r in results {
        if !labels.iter().any(|(l, _)| *l == r.label()) {
            labels.push((r.label(), style(r)));
        }
    }
    for (label, s) in &labels {
        let pts: Vec<(f64, f64)> = results
            .iter()
            .filter(|r| r.label() == *label)
            .map(|r| (r.gateways as f64, r.hit_ratio))
            .collect();
        let line = s.color.stroke_width(2);
        if s.dashed {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, line))?;
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), line))?;
        }
        if s.hollow {
            chart.draw_series(
                pts.into_iter()
                    .map(|p| Circle::new(p, 5, s.color.stroke_width(2))),
            )?;
        } else {
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, s.color.filled())))?;
        }
    }
    // The legend: the bound, then every series.
    let row = 20;
    let (x0, y0) = (4, 48);
    let (w, _) = right.dim_in_pixel();
    let height = row * (labels.len() as i32 + 1) + 10;
    right.draw(&Rectangle::new(
        [(x0, y0), (w as i32 - 6, y0 + height)],
        WHITE.filled(),
    ))?;
    right.draw(&Rectangle::new(
        [(x0, y0), (w as i32 - 6, y0 + height)],
        BLACK.stroke_width(1),
    ))?;
    let entry = |i: i32| (x0 + 10, y0 + 15 + row * i);
    let (sx, sy) = entry(0);
    right.draw(&PathElement::new(vec![(sx, sy), (sx + 24, sy)], BLACK))?;
    right.draw(&Text::new(
        "upper bound (one unbounded cache)",
        (sx + 32, sy - 7),
        font.clone(),
    ))?;
    for (i, (label, s)) in labels.iter().enumerate() {
        let (sx, sy) = entry(i as i32 + 1);
        let line = s.color.stroke_width(2);
        if s.dashed {
            // Dashes either side of the marker.
            right.draw(&PathElement::new(vec![(sx, sy), (sx + 5, sy)], line))?;
            right.draw(&PathElement::new(vec![(sx + 19, sy), (sx + 24, sy)], line))?;
        } else {
            right.draw(&PathElement::new(vec![(sx, sy), (sx + 24, sy)], line))?;
        }
        if s.hollow {
            right.draw(&Circle::new((sx + 12, sy), 5, line))?;
        } else {
            right.draw(&Circle::new((sx + 12, sy), 3, s.color.filled()))?;
        }
        right.draw(&Text::new(label.clone(), (sx + 32, sy - 7), font.clone()))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plot's x axis is labelled at the simulated gateway counts only,
    /// it has a legend entry per policy and capacity model, and its legend
    /// box covers no line.
    #[test]
    fn the_plot_has_integer_ticks_and_a_legend_clear_of_the_lines() {
        let bound = 0.366;
        let results: Vec<SimResult> = [1usize, 2, 4, 8]
            .iter()
            .flat_map(|&gateways| {
                let models = [None, Some(1.0), Some(0.5), Some(2.0)];
                Policy::ALL
                    .iter()
                    .flat_map(move |&p| {
                        models
                            .into_iter()
                            .filter(move |m| m.is_some() == p.models_capacity())
                            .map(move |m| (p, m))
                    })
                    .enumerate()
                    .map(move |(i, (policy, capacity_model))| SimResult {
                        gateways,
                        policy,
                        capacity_model,
                        hit_ratio: bound * (1.0 - 0.08 * i as f64) / (1.0 + 0.01 * gateways as f64),
                        imbalance: 1.0,
                        accuracy: None,
                        recall: None,
                        receipts: None,
                        silenced: None,
                    })
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.svg");
        plot(&results, bound, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split('>').nth(1)?.split('<').next()?.trim()))
            .collect();
        for tick in ["1", "2", "4", "8"] {
            assert!(texts.contains(&tick), "no tick {tick} in {texts:?}");
        }
        for t in &texts {
            assert!(
                !matches!(*t, "1.0" | "1.5" | "2.5" | "3" | "5" | "6" | "7"),
                "tick {t}"
            );
        }
        for label in [
            "precise",
            "oracle",
            "prefix-shared",
            "prefix-shared (capacity model 0.5x)",
            "prefix-local (capacity model 2x)",
        ] {
            assert!(
                texts.contains(&label),
                "no legend entry {label} in {texts:?}"
            );
        }
        // The legend box: the one rectangle with a black border.
        let legend = svg
            .split("<rect")
            .skip(1)
            .find(|r| r.contains("stroke=\"#000000\""))
            .expect("a legend box");
        let attr = |name: &str| -> f64 {
            legend
                .split(&format!(" {name}=\""))
                .nth(1)
                .and_then(|v| v.split('"').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} of {legend}"))
        };
        let (x0, y0) = (attr("x"), attr("y"));
        let (x1, y1) = (x0 + attr("width"), y0 + attr("height"));
        // Every drawn line's points lie outside the box (the legend's own
        // sample strokes are inside it, so only the data lines are checked:
        // polylines with more than two points, and the bound's line).
        for line in svg.split("<polyline").skip(1) {
            let points = line
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let pts: Vec<(f64, f64)> = points
                .split_whitespace()
                .filter_map(|p| {
                    let (x, y) = p.split_once(',')?;
                    Some((x.parse().ok()?, y.parse().ok()?))
                })
                .collect();
            let inside_legend = pts
                .iter()
                .all(|&(x, y)| x >= x0 && x <= x1 && y >= y0 && y <= y1);
            if inside_legend {
                continue; // a legend sample
            }
            for w in pts.windows(2) {
                let (ya, yb) = (w[0].1.min(w[1].1), w[0].1.max(w[1].1));
                let (xa, xb) = (w[0].0.min(w[1].0), w[0].0.max(w[1].0));
                let crosses = xa <= x1 && xb >= x0 && ya <= y1 && yb >= y0;
                assert!(
                    !crosses,
                    "a line {w:?} runs through the legend {x0},{y0}..{x1},{y1}"
                );
            }
        }
    }
}
