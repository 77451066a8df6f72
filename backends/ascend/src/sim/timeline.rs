//! Gantt chart of the simulated pipes of one Cube/Vector core pair (plotters, SVG).
//!
//! SIMULATED: the chart draws the timing model's ops, and says so in its caption.

use super::timing::{Core, Op, Pipe, SimReport, Stage};
use crate::{AscendError, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const ROWS: [(Core, Pipe); 10] = [
    (Core::Cube, Pipe::Mte2),
    (Core::Cube, Pipe::Mte1),
    (Core::Cube, Pipe::Mmad),
    (Core::Cube, Pipe::Fixp),
    (Core::Vector(0), Pipe::Mte2),
    (Core::Vector(0), Pipe::Vec),
    (Core::Vector(0), Pipe::Mte3),
    (Core::Vector(1), Pipe::Mte2),
    (Core::Vector(1), Pipe::Vec),
    (Core::Vector(1), Pipe::Mte3),
];

fn row_name(i: usize) -> String {
    let (core, pipe) = ROWS[i];
    match core {
        Core::Cube => format!("Cube {}", pipe.name()),
        Core::Vector(v) => format!("Vec{v} {}", pipe.name()),
    }
}

/// Every stage in drawing order, with its colour and the colour's name for the caption.
const STAGES: [(Stage, &str, RGBColor, &str); 5] = [
    (Stage::C1, "C1", RGBColor(31, 119, 180), "blue"),
    (Stage::V1, "V1", RGBColor(255, 127, 14), "orange"),
    (Stage::C2, "C2", RGBColor(44, 160, 44), "green"),
    (Stage::V2, "V2", RGBColor(214, 39, 40), "red"),
    (Stage::Last, "last V", RGBColor(148, 103, 189), "purple"),
];

fn color(stage: Stage) -> RGBColor {
    STAGES
        .iter()
        .find(|s| s.0 == stage)
        .expect("every stage has a colour")
        .2
}

/// The caption's colour key: only the stages drawn in this window (AMLA has no V2, and the
/// final normalisation falls outside a window of the first blocks), so no colour is named that
/// the chart does not show.
pub fn colour_key(ops: &[&Op]) -> String {
    STAGES
        .iter()
        .filter(|(st, ..)| ops.iter().any(|o| o.stage == *st))
        .map(|(_, name, _, colour)| format!("{name} {colour}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The ops of the first sequence of core pair 0 up to the end of block `blocks - 1`'s `[C2]`.
pub fn window(report: &SimReport, blocks: usize) -> Vec<&Op> {
    let end = report
        .trace
        .iter()
        .filter(|o| o.seq == 0 && o.stage == Stage::C2 && o.block < blocks)
        .map(|o| o.end)
        .fold(0.0, f64::max);
    report.trace.iter().filter(|o| o.start < end).collect()
}

/// Writes an SVG Gantt chart of the pipes of core pair 0 over its first `blocks` KV blocks.
pub fn timeline_svg(report: &SimReport, blocks: usize, path: &Path) -> Result<()> {
    let err = |e: String| AscendError::Io {
        what: format!("timeline {}", path.display()),
        reason: e,
    };
    let ops = window(report, blocks.max(1));
    let t_end = ops.iter().map(|o| o.end).fold(0.0, f64::max) * 1e6;
    let root = SVGBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let caption = format!(
        "SIMULATED {} on Ascend 910 model: batch {}, Sq {}, Sk {} (core pair 0, first {} blocks; {})",
        report.variant,
        report.batch,
        report.sq,
        report.sk,
        blocks,
        colour_key(&ops)
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(110)
        .build_cartesian_2d(0.0..t_end.max(1e-3), 0.0..ROWS.len() as f64)
        .map_err(|e| err(e.to_string()))?;
    // The row names are drawn by hand beside each row's centre: the mesh's y labels sit at
    // whatever "nice" values plotters picks, which are row boundaries, not rows.
    chart
        .configure_mesh()
        .x_desc("time (us, simulated)")
        .y_labels(0)
        .disable_y_mesh()
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for i in 0..ROWS.len() {
        let (x, y) = chart.backend_coord(&(0.0, (ROWS.len() - 1 - i) as f64 + 0.5));
        root.draw(&Text::new(row_name(i), (x - 8, y), style.clone()))
            .map_err(|e| err(e.to_string()))?;
    }
    let rects = ops.iter().filter_map(|o| {
        let i = ROWS.iter().position(|r| *r == (o.core, o.pipe))?;
        let y = (ROWS.len() - 1 - i) as f64;
        Some(Rectangle::new(
            [(o.start * 1e6, y + 0.15), (o.end * 1e6, y + 0.85)],
            color(o.stage).filled(),
        ))
    });
    chart.draw_series(rects).map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}
