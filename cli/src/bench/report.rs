//! What `ferrattn bench` writes: the JSON record of a run, the markdown report and SVG plots
//! made from it, and the generated sections of `docs/BENCHMARKS.md`.
//!
//! The docs hold one section per committed result file between the markers
//! `<!-- ferrattn-bench:begin PATH -->` and `<!-- ferrattn-bench:end -->`; [`update_docs`]
//! rewrites each from its JSON, and a test checks that the committed docs equal that rewrite, so
//! the tables cannot drift from the data.

use crate::bench::shapes::{Family, Shape, Suite};
use crate::bench::timing::{Method, Timing};
use crate::{FerrattnError, Result};
use ferrattn_core::{Comparison, Tolerance};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// The outcome of the correctness check of one row.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Check {
    /// What was compared.
    pub reference: String,
    /// Relative Frobenius error of O.
    pub rel_fro: f64,
    /// Largest absolute error of O.
    pub max_abs: f64,
    /// Cosine similarity of O.
    pub cosine: f64,
    /// Largest absolute error of LSE, when compared.
    pub lse_max_abs: Option<f64>,
    /// The bound on the relative Frobenius error of O.
    pub tol_rel_fro: f64,
    /// The bound on the largest absolute error of O.
    pub tol_max_abs: f64,
    /// Within the bounds, NaN/Inf in the same places.
    pub passed: bool,
    /// Why it failed, when it did.
    pub failure: Option<String>,
}

impl Check {
    /// From comparisons of O (and LSE) against `tol` (LSE against [`Tolerance::lse`]).
    pub fn from(
        what: &str,
        reference: String,
        o: Comparison,
        lse: Option<Comparison>,
        tol: Tolerance,
    ) -> Check {
        let mut failure = o.check(&format!("{what}: O"), &tol).err();
        if let (None, Some(l)) = (&failure, &lse) {
            failure = l.check(&format!("{what}: LSE"), &Tolerance::lse()).err();
        }
        Check {
            reference,
            rel_fro: o.rel_fro,
            max_abs: o.max_abs,
            cosine: o.cosine,
            lse_max_abs: lse.map(|l| l.max_abs),
            tol_rel_fro: tol.rel_fro,
            tol_max_abs: tol.max_abs,
            passed: failure.is_none(),
            failure,
        }
    }
}

/// A comparison timed in the same run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Baseline {
    /// `sdpa-cudnn`, `sdpa-flash`, `fixed-split`, `lean-exact`, `exact-cpu`, `base-simulated`.
    pub name: String,
    /// Its time, when it ran.
    pub time: Option<Timing>,
    /// What it computes differently (e.g. "padded to the longest sequence").
    pub note: Option<String>,
    /// Why it did not run.
    pub error: Option<String>,
}

/// One measured (or, for the simulated 910, modelled) configuration.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// The problem.
    pub shape: Shape,
    /// Algorithm name (`lean`, `turbo`, ...).
    pub algorithm: String,
    /// Variant (`stream-K`, `int4`, `mixed`, `emulation`, ...).
    pub variant: String,
    /// Backend name (`cuda`, `cpu`, `ascend`).
    pub backend: String,
    /// Timing from a model, not a measurement: never shown in hardware tables.
    pub simulated: bool,
    /// The schedule in a few words (CTAs, splits, units).
    pub plan: String,
    /// Fewest bytes the call must move through device memory.
    pub bytes: f64,
    /// Floating-point (or integer) operations of the call.
    pub flops: f64,
    /// What is inside one timed call.
    pub timed: String,
    /// The correctness check made before timing.
    pub check: Check,
    /// Time per call (absent when the check failed).
    pub time: Option<Timing>,
    /// Comparisons timed in the same run.
    pub baselines: Vec<Baseline>,
    /// Time the row cannot beat: the largest of bytes / copy bandwidth, operations / GEMM rate
    /// and the launch floor, milliseconds.
    pub floor_ms: Option<f64>,
    /// Which term set the floor: `memory`, `compute`, `latency`.
    pub floor_bound: Option<String>,
}

impl Row {
    /// floor / time, percent.
    pub fn pct_of_ceiling(&self) -> Option<f64> {
        Some(100.0 * self.floor_ms? / self.time.as_ref()?.median_ms)
    }

    /// The fastest baseline that ran, by `filter`.
    pub fn best_baseline(&self, filter: impl Fn(&Baseline) -> bool) -> Option<(&Baseline, f64)> {
        self.baselines
            .iter()
            .filter(|b| filter(b))
            .filter_map(|b| Some((b, b.time.as_ref()?.median_ms)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// baseline time / our time for a named baseline.
    pub fn ratio(&self, name: &str) -> Option<f64> {
        let b = self.baselines.iter().find(|b| b.name == name)?;
        Some(b.time.as_ref()?.median_ms / self.time.as_ref()?.median_ms)
    }

    /// Faster SDPA backend's time / our time.
    pub fn vs_best_sdpa(&self) -> Option<f64> {
        let (_, ms) = self.best_baseline(|b| b.name.starts_with("sdpa"))?;
        Some(ms / self.time.as_ref()?.median_ms)
    }
}

/// Ceilings measured in the same run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Ceilings {
    /// Eager 2 GiB device-to-device copy, bytes read + written per second / 1e9.
    pub copy_gbs: Option<f64>,
    /// The same through torch (1 GiB), as a cross-check.
    pub copy_gbs_torch: Option<f64>,
    /// Large bf16 GEMM through torch, TFLOP/s.
    pub gemm_bf16_tflops: Option<f64>,
    /// Large INT8 GEMM through torch (`torch._int_mm`), TOP/s.
    pub gemm_int8_tops: Option<f64>,
    /// A one-element kernel replayed from a CUDA graph (torch), microseconds per launch.
    pub launch_floor_us: Option<f64>,
    /// A two-byte memset node replayed from a CUDA graph (no torch needed), microseconds.
    pub memset_node_us: Option<f64>,
}

impl Ceilings {
    /// The launch floor: the one-element kernel where torch ran, else the memset node.
    pub fn latency_us(&self) -> Option<f64> {
        self.launch_floor_us.or(self.memset_node_us)
    }

    /// The floor of a call moving `bytes` and doing `flops` (`int8`: on INT8 tensor cores).
    pub fn floor(&self, bytes: f64, flops: f64, int8: bool) -> Option<(f64, &'static str)> {
        let mem = self.copy_gbs.map(|g| bytes / (g * 1e9) * 1e3);
        // INT8 rows: the faster of the two measured rates. The hardware's INT8 rate is at least
        // its bf16 rate; torch._int_mm reached only 128 TOP/s on an H200 (bf16: 715 TFLOP/s),
        // a library limit that would make a floor no kernel is held to.
        let rate = match (int8, self.gemm_int8_tops, self.gemm_bf16_tflops) {
            (true, Some(i), Some(b)) => Some(i.max(b)),
            (true, i, b) => i.or(b),
            (false, _, b) => b,
        };
        let comp = rate.map(|t| flops / (t * 1e12) * 1e3);
        let lat = self.latency_us().map(|u| u * 1e-3);
        [(mem, "memory"), (comp, "compute"), (lat, "latency")]
            .into_iter()
            .filter_map(|(t, n)| Some((t?, n)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }
}

/// The machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceInfo {
    /// GPU name, when one ran.
    pub gpu: Option<String>,
    /// Streaming multiprocessors.
    pub sms: Option<usize>,
    /// L2 bytes.
    pub l2_bytes: Option<usize>,
    /// Compute capability.
    pub compute_capability: Option<(u32, u32)>,
    /// NVIDIA driver version (`nvidia-smi`).
    pub driver: Option<String>,
    /// How the kernels were built.
    pub kernels: Option<String>,
    /// PyTorch version of the baselines.
    pub torch: Option<String>,
    /// The host CPU.
    pub cpu: String,
    /// Why the CUDA backend did not run, when it did not.
    pub cuda_unavailable: Option<String>,
}

/// A (family, algorithm, backend) the suite did not run, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NotRun {
    /// The table.
    pub family: Family,
    /// Algorithm.
    pub algorithm: String,
    /// Backend.
    pub backend: String,
    /// Why.
    pub reason: String,
}

/// Everything one `ferrattn bench` run measured.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BenchReport {
    /// Layout version of this file.
    pub schema: u32,
    /// The suite.
    pub suite: Suite,
    /// The commit of the binary.
    pub commit: String,
    /// UTC date of the run, YYYY-MM-DD.
    pub date: String,
    /// The machine.
    pub device: DeviceInfo,
    /// Timing constants on the device.
    pub method: Method,
    /// Timing constants on the host.
    pub host_method: Method,
    /// Ceilings measured in this run.
    pub ceilings: Ceilings,
    /// Every row.
    pub rows: Vec<Row>,
    /// What was not run, and why.
    pub not_run: Vec<NotRun>,
    /// Wall-clock seconds of the whole run.
    pub wall_s: f64,
}

impl BenchReport {
    /// Rows whose check failed.
    pub fn failures(&self) -> Vec<&Row> {
        self.rows.iter().filter(|r| !r.check.passed).collect()
    }

    /// Reads a JSON report.
    pub fn read(path: &Path) -> Result<BenchReport> {
        let text = std::fs::read_to_string(path).map_err(|e| file_err(path, e))?;
        serde_json::from_str(&text).map_err(|e| file_err(path, e))
    }
}

pub(crate) fn file_err(path: &Path, e: impl std::fmt::Display) -> FerrattnError {
    FerrattnError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

fn ms(t: Option<&Timing>) -> String {
    match t {
        Some(t) if t.median_ms < 1.0 => format!("{:.1} us", t.median_ms * 1e3),
        Some(t) => format!("{:.3} ms", t.median_ms),
        None => "n/a".into(),
    }
}

fn ratio(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |r| format!("{r:.2}x"))
}

fn pct(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |r| format!("{r:.0}%"))
}

fn base_cell(r: &Row, name: &str) -> String {
    match r.baselines.iter().find(|b| b.name == name) {
        None => "-".into(),
        Some(b) => match (&b.time, &b.error) {
            (Some(t), _) => {
                let note = if b.note.as_deref().is_some_and(|n| n.contains("padded")) {
                    " (padded)"
                } else {
                    ""
                };
                format!("{}{note}", ms(Some(t)))
            }
            (None, Some(_)) => "refused".into(),
            (None, None) => "n/a".into(),
        },
    }
}

fn shape_cell(s: &Shape) -> String {
    let ctx = if s.is_ragged() {
        format!("{} (mean {:.0})", s.max_ctx(), s.mean_ctx())
    } else {
        s.max_ctx().to_string()
    };
    format!(
        "{} x {} | {}/{} d{} {}",
        s.batch, ctx, s.hq, s.hk, s.d, s.dtype
    )
}

/// Each device row's floor from the report's ceilings (so a report made from older JSON uses the
/// current definition of the floor).
fn refloor(rep: &BenchReport) -> BenchReport {
    let mut rep = rep.clone();
    for r in rep.rows.iter_mut().filter(|r| r.backend == "cuda") {
        let int8 = crate::bench::cuda::int8_rows(&r.algorithm, r.shape.family);
        let f = rep.ceilings.floor(r.bytes, r.flops, int8);
        r.floor_ms = f.map(|x| x.0);
        r.floor_bound = f.map(|x| x.1.to_string());
    }
    rep
}

/// The markdown tables of a report: one per family (hardware rows), the simulated rows apart.
pub fn markdown(rep: &BenchReport) -> String {
    let rep = &refloor(rep);
    let mut s = String::new();
    let d = &rep.device;
    let _ = writeln!(
        s,
        "`ferrattn bench --suite {}` on **{}**{}, driver {}, commit **{}**, {}; PyTorch {}; wall {:.0} s.\n",
        rep.suite.name(),
        d.gpu.as_deref().unwrap_or("no GPU"),
        d.sms.map_or(String::new(), |n| format!(" ({n} SMs, L2 {} MiB)", d.l2_bytes.unwrap_or(0) >> 20)),
        d.driver.as_deref().unwrap_or("n/a"),
        rep.commit,
        rep.date,
        d.torch.as_deref().unwrap_or("absent"),
        rep.wall_s
    );
    let c = &rep.ceilings;
    let f = |x: Option<f64>, unit: &str| x.map_or("n/a".into(), |v| format!("{v:.0} {unit}"));
    let _ = writeln!(
        s,
        "Ceilings measured in the same run: copy {} (read + write; torch {}), bf16 GEMM {}, INT8 GEMM {}, launch floor {} (graph-replayed one-element kernel; memset node {}).\n",
        f(c.copy_gbs, "GB/s"),
        f(c.copy_gbs_torch, "GB/s"),
        f(c.gemm_bf16_tflops, "TFLOP/s"),
        f(c.gemm_int8_tops, "TOP/s"),
        c.launch_floor_us.map_or("n/a".into(), |v| format!("{v:.2} us")),
        c.memset_node_us.map_or("n/a".into(), |v| format!("{v:.2} us")),
    );
    let _ = writeln!(
        s,
        "Every row was checked before it was timed (`check` = relative Frobenius error of O against its reference: the f64 golden for exact kernels and CPU emulations, the CPU emulation of the same slice for the TurboAttention kernels, which must also be no worse than it against the golden; the JSON says which). Times are medians per call (CUDA graph replay between events after warm-up, input sets rotated over >= 4x L2; host rows: wall clock); `spread` = (p90 - p10) / median; `floor` = the largest of bytes / copy bandwidth, operations / GEMM rate and the launch floor; `% ceil` = floor / time; ratios = baseline time / our time (> 1: we are faster).\n",
            );
    for fam in Family::ALL {
        let rows: Vec<&Row> = rep.rows.iter().filter(|r| r.shape.family == fam).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "### {}{}\n",
            fam.name(),
            if fam == Family::Mla910 {
                " (SIMULATED: timing model, not a measurement)"
            } else {
                ""
            }
        );
        match fam {
            Family::LeanPaper | Family::Llama3Decode | Family::Ragged => {
                s.push_str("| B x ctx | heads, d | KV MB | lean (plan) | spread | check | GB/s | % ceil | fixed split | SDPA cuDNN | SDPA flash | vs best SDPA | vs fixed |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
                for r in rows {
                    let gbs = r.time.as_ref().map_or("n/a".into(), |t| {
                        format!("{:.0}", r.bytes / (t.median_ms * 1e-3) / 1e9)
                    });
                    let _ = writeln!(
                        s,
                        "| {} | {:.1} | {} ({}) | {:.1}% | {:.1e} | {} | {} | {} | {} | {} | {} | {} |",
                        shape_cell(&r.shape),
                        r.bytes / 1e6,
                        ms(r.time.as_ref()),
                        r.plan,
                        r.time.as_ref().map_or(0.0, Timing::spread_pct),
                        r.check.rel_fro,
                        gbs,
                        pct(r.pct_of_ceiling()),
                        base_cell(r, "fixed-split"),
                        base_cell(r, "sdpa-cudnn"),
                        base_cell(r, "sdpa-flash"),
                        ratio(r.vs_best_sdpa()),
                        ratio(r.ratio("fixed-split")),
                    );
                }
            }
            Family::TurboPrefill => {
                s.push_str("| B x S | heads, d | causal | turbo | spread | check | TFLOP/s | % ceil | SDPA cuDNN | SDPA flash | vs cuDNN | vs flash |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
                for r in rows {
                    let tf = r.time.as_ref().map_or("n/a".into(), |t| {
                        format!("{:.0}", r.flops / (t.median_ms * 1e-3) / 1e12)
                    });
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {:.1}% | {:.1e} | {} | {} | {} | {} | {} | {} |",
                        shape_cell(&r.shape).replacen(
                            &format!(" x {}", r.shape.max_ctx()),
                            &format!(" x {}", r.shape.sq),
                            1
                        ),
                        r.shape.causal,
                        ms(r.time.as_ref()),
                        r.time.as_ref().map_or(0.0, Timing::spread_pct),
                        r.check.rel_fro,
                        tf,
                        pct(r.pct_of_ceiling()),
                        base_cell(r, "sdpa-cudnn"),
                        base_cell(r, "sdpa-flash"),
                        ratio(r.ratio("sdpa-cudnn")),
                        ratio(r.ratio("sdpa-flash")),
                    );
                }
            }
            Family::TurboDecode | Family::TurboQuantDecode => {
                s.push_str("| B x ctx | heads, d | backend | variant (plan) | time | spread | check | cache MB | % ceil | our exact (lean) | SDPA cuDNN fp16 | SDPA flash fp16 | vs best SDPA | vs exact |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
                for r in rows {
                    let exact = if r.backend == "cpu" {
                        "exact-cpu"
                    } else {
                        "lean-exact"
                    };
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} ({}) | {} | {:.1}% | {:.2e} | {:.1} | {} | {} | {} | {} | {} | {} |",
                        shape_cell(&r.shape),
                        r.backend,
                        r.variant,
                        r.plan,
                        ms(r.time.as_ref()),
                        r.time.as_ref().map_or(0.0, Timing::spread_pct),
                        r.check.rel_fro,
                        r.bytes / 1e6,
                        pct(r.pct_of_ceiling()),
                        base_cell(r, exact),
                        base_cell(r, "sdpa-cudnn"),
                        base_cell(r, "sdpa-flash"),
                        ratio(r.vs_best_sdpa()),
                        ratio(r.ratio(exact)),
                    );
                }
            }
            Family::Host => {
                s.push_str("| B x ctx | heads, d | Sq | causal | algorithm | time (host) | spread | check | exact on CPU | vs exact |\n|---|---|---|---|---|---|---|---|---|---|\n");
                for r in rows {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} ({}) | {} | {:.1}% | {:.2e} | {} | {} |",
                        shape_cell(&r.shape),
                        r.shape.sq,
                        r.shape.causal,
                        r.algorithm,
                        r.variant,
                        ms(r.time.as_ref()),
                        r.time.as_ref().map_or(0.0, Timing::spread_pct),
                        r.check.rel_fro,
                        base_cell(r, "exact-cpu"),
                        ratio(r.ratio("exact-cpu")),
                    );
                }
            }
            Family::Mla910 => {
                s.push_str("| B x Sk | Sq | AMLA (model) | FU % | Base (model) | AMLA vs Base | numerics check (batch 1) |\n|---|---|---|---|---|---|---|\n");
                for r in rows {
                    let _ = writeln!(
                        s,
                        "| {} x {} | {} | {} | {} | {} | {} | {} {:.2e} |",
                        r.shape.batch,
                        r.shape.max_ctx(),
                        r.shape.sq,
                        ms(r.time.as_ref()),
                        pct(r.pct_of_ceiling()),
                        base_cell(r, "base-simulated"),
                        ratio(r.ratio("base-simulated")),
                        if r.check.passed { "passed" } else { "FAILED" },
                        r.check.rel_fro,
                    );
                }
            }
        }
        s.push('\n');
    }
    let fails = rep.failures();
    if !fails.is_empty() {
        let _ = writeln!(
            s,
            "**{} rows FAILED their correctness check and were not timed:**\n",
            fails.len()
        );
        for r in fails {
            let _ = writeln!(
                s,
                "- {} {} {}: {}",
                r.algorithm,
                r.backend,
                shape_cell(&r.shape),
                r.check.failure.as_deref().unwrap_or("?")
            );
        }
        s.push('\n');
    }
    if !rep.not_run.is_empty() {
        s.push_str("Not run:\n\n");
        for n in &rep.not_run {
            let _ = writeln!(
                s,
                "- {} {} on {}: {}",
                n.family.name(),
                n.algorithm,
                n.backend,
                n.reason
            );
        }
        s.push('\n');
    }
    s
}

/// SVG plots: speedup against the faster SDPA backend over context length, one line per batch
/// size, for each GPU decode family; prefill speedup over length per causal mode.
/// Returns the files written.
pub fn plots(rep: &BenchReport, dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    use plotters::prelude::*;
    let mut written = vec![];
    let hw: Vec<&Row> = rep
        .rows
        .iter()
        .filter(|r| !r.simulated && r.backend == "cuda")
        .collect();
    for fam in [
        Family::LeanPaper,
        Family::Llama3Decode,
        Family::TurboDecode,
        Family::TurboPrefill,
    ] {
        // series: (label, points (x = context or length, y = speedup))
        let mut series: Vec<(String, Vec<(f64, f64)>)> = vec![];
        for r in hw.iter().filter(|r| r.shape.family == fam) {
            let Some(y) = r.vs_best_sdpa() else { continue };
            let (label, x) = match fam {
                Family::TurboPrefill => (
                    format!("B={} causal={}", r.shape.batch, r.shape.causal),
                    r.shape.sq,
                ),
                Family::TurboDecode => (
                    format!("B={} {}", r.shape.batch, r.variant),
                    r.shape.max_ctx(),
                ),
                _ => (format!("B={}", r.shape.batch), r.shape.max_ctx()),
            };
            match series.iter_mut().find(|(l, _)| *l == label) {
                Some((_, pts)) => pts.push(((x as f64).log2(), y)),
                None => series.push((label, vec![((x as f64).log2(), y)])),
            }
        }
        if series.is_empty() {
            continue;
        }
        let path = dir.join(format!("{}.svg", fam.name()));
        let err = |e: String| file_err(&path, e);
        let (x0, x1) = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.0))
            .fold((f64::MAX, f64::MIN), |a, x| (a.0.min(x), a.1.max(x)));
        let y1 = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .fold(1.2f64, f64::max)
            * 1.1;
        {
            let root = SVGBackend::new(&path, (900, 520)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
            let caption = format!(
                "{}: faster SDPA time / ferrattn time, {} ({}, {})",
                fam.name(),
                rep.device.gpu.as_deref().unwrap_or("?"),
                rep.commit,
                rep.date
            );
            let mut chart = ChartBuilder::on(&root)
                .caption(caption, ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(50)
                .build_cartesian_2d((x0 - 0.3)..(x1 + 0.3), 0.0..y1)
                .map_err(|e| err(e.to_string()))?;
            chart
                .configure_mesh()
                .x_desc(if fam == Family::TurboPrefill {
                    "log2 sequence length"
                } else {
                    "log2 context length"
                })
                .y_desc("speedup vs faster SDPA")
                .draw()
                .map_err(|e| err(e.to_string()))?;
            chart
                .draw_series(LineSeries::new(
                    [(x0 - 0.3, 1.0), (x1 + 0.3, 1.0)],
                    BLACK.mix(0.4),
                ))
                .map_err(|e| err(e.to_string()))?;
            for (i, (label, mut pts)) in series.into_iter().enumerate() {
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let color = Palette99::pick(i).to_rgba();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|e| err(e.to_string()))?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| err(e.to_string()))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(e.to_string()))?;
            root.present().map_err(|e| err(e.to_string()))?;
        }
        written.push(path);
    }
    Ok(written)
}

const BEGIN: &str = "<!-- ferrattn-bench:begin ";
const END: &str = "<!-- ferrattn-bench:end -->";

/// The text of `doc` with every generated section rewritten from the JSON file its begin marker
/// names (relative to `root`).
pub fn regenerate_docs(doc: &str, root: &Path) -> Result<String> {
    let mut out = String::with_capacity(doc.len());
    let mut rest = doc;
    while let Some(b) = rest.find(BEGIN) {
        let line_end =
            rest[b..]
                .find("-->")
                .map(|i| b + i + 3)
                .ok_or_else(|| FerrattnError::File {
                    path: "docs".into(),
                    message: "unterminated ferrattn-bench:begin marker".into(),
                })?;
        let json = rest[b + BEGIN.len()..line_end - 3].trim();
        let e = rest[line_end..]
            .find(END)
            .map(|i| line_end + i)
            .ok_or_else(|| FerrattnError::File {
                path: json.into(),
                message: "ferrattn-bench:begin without ferrattn-bench:end".into(),
            })?;
        let rep = BenchReport::read(&root.join(json))?;
        out.push_str(&rest[..line_end]);
        out.push_str("\n<!-- generated by `ferrattn bench --from ");
        out.push_str(json);
        out.push_str(" --docs ...`: edit the JSON's run, not this text -->\n\n");
        out.push_str(&markdown(&rep));
        out.push_str(END);
        rest = &rest[e + END.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Rewrites the generated sections of `doc_path` in place; returns whether anything changed.
pub fn update_docs(doc_path: &Path, root: &Path) -> Result<bool> {
    let doc = std::fs::read_to_string(doc_path).map_err(|e| file_err(doc_path, e))?;
    let new = regenerate_docs(&doc, root)?;
    if new != doc {
        std::fs::write(doc_path, &new).map_err(|e| file_err(doc_path, e))?;
    }
    Ok(new != doc)
}
