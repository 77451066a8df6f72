//! `ferrattn bench`: the per-hardware benchmark suite.
//!
//! One command answers "what does ferrattn give me on this machine": every algorithm on every
//! backend present, over the standard shape table ([`shapes`]), each row checked against the f64
//! golden before it is timed ([`check`]), timed by the one method of [`timing`], with the
//! baselines that exist on the machine timed in the same run (our fixed-split and exact variants;
//! PyTorch SDPA through `python3`, [`baseline`]) and the ceilings measured in the same run (copy
//! bandwidth, large GEMMs, the launch floor), so every row shows its floor and % of ceiling.
//! Output ([`report`]): `bench.json`, `report.md` and SVG plots in `--out`; `docs/BENCHMARKS.md`
//! is generated from committed JSON (`--docs`).
//!
//! On a machine without a GPU the suite runs the CPU and simulated rows and lists the CUDA rows as
//! not run, with the reason.

pub mod baseline;
pub mod check;
pub mod cuda;
pub mod host;
pub mod report;
pub mod shapes;
pub mod timing;

use crate::{Algorithm, BackendKind, FerrattnError, Result};
use report::{file_err, BenchReport, Ceilings, DeviceInfo, NotRun, Row};
use shapes::{Family, Suite};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `ferrattn bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// quick (a few rows per algorithm), standard (the documented tables) or full (+ long rows).
    #[arg(long, default_value = "quick", value_parser = parse_suite)]
    pub suite: Suite,
    /// Only these algorithms (comma separated): exact, lean, turbo, amla, turboquant.
    #[arg(long, value_delimiter = ',', value_parser = parse_algo)]
    pub algo: Vec<Algorithm>,
    /// Only these backends (comma separated): cpu, cuda, ascend (the simulated 910).
    #[arg(long, value_delimiter = ',', value_parser = parse_backend)]
    pub backend: Vec<BackendKind>,
    /// Folder for bench.json, report.md and the plots.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Do not run the PyTorch baselines.
    #[arg(long)]
    pub no_torch: bool,
    /// Write the report and plots of this bench.json instead of running.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Rewrite the generated sections of this markdown file from the JSON files its markers name
    /// (paths relative to the current folder), then exit.
    #[arg(long)]
    pub docs: Option<PathBuf>,
}

fn parse_suite(s: &str) -> std::result::Result<Suite, String> {
    Suite::parse(s).ok_or_else(|| format!("unknown suite {s:?}; one of quick, standard, full"))
}

fn parse_algo(s: &str) -> std::result::Result<Algorithm, String> {
    Algorithm::parse(s).ok_or_else(|| {
        format!("unknown algorithm {s:?}; one of exact, turbo, lean, amla, turboquant")
    })
}

fn parse_backend(s: &str) -> std::result::Result<BackendKind, String> {
    match s {
        "cpu" => Ok(BackendKind::Cpu),
        "cuda" => Ok(BackendKind::Cuda),
        "ascend" => Ok(BackendKind::Ascend),
        _ => Err(format!("unknown backend {s:?}; one of cpu, cuda, ascend")),
    }
}

/// Runs `ferrattn bench`. Fails when a row failed its check or could not run.
pub fn main(a: &BenchArgs) -> Result<()> {
    if let Some(doc) = &a.docs {
        let changed = report::update_docs(doc, Path::new("."))?;
        eprintln!(
            "{} {}",
            if changed { "rewrote" } else { "unchanged:" },
            doc.display()
        );
        return Ok(());
    }
    if let Some(json) = &a.from {
        // a report of an earlier run: its failures were that run's verdict
        return write_outputs(&BenchReport::read(json)?, &a.out);
    }
    let rep = run(a);
    write_outputs(&rep, &a.out)?;
    let fails = rep.failures().len();
    let errors = rep
        .not_run
        .iter()
        .filter(|n| n.reason.starts_with("error"))
        .count();
    if fails + errors > 0 {
        return Err(FerrattnError::Bench(format!(
            "{fails} rows failed their correctness check and {errors} could not run; see {}",
            a.out.join("report.md").display()
        )));
    }
    Ok(())
}

/// Writes bench.json, report.md and the plots into `dir`, and prints the report.
pub fn write_outputs(rep: &BenchReport, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let json = dir.join("bench.json");
    std::fs::write(
        &json,
        serde_json::to_string_pretty(rep).expect("reports serialise"),
    )
    .map_err(|e| file_err(&json, e))?;
    let md = report::markdown(rep);
    let md_path = dir.join("report.md");
    std::fs::write(&md_path, &md).map_err(|e| file_err(&md_path, e))?;
    let plots = report::plots(rep, dir)?;
    println!("{md}");
    eprintln!(
        "wrote {}, {} and {} plots",
        json.display(),
        md_path.display(),
        plots.len()
    );
    Ok(())
}

/// Today's UTC date (civil-from-days, H. Hinnant's algorithm), without a date crate.
pub fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn cpu_name() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    format!("{model} ({} threads)", rayon::current_num_threads())
}

fn nvidia_driver() -> Option<String> {
    let o = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=driver_version", "--format=csv,noheader"])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()?
        .trim()
        .to_string();
    (o.status.success() && !s.is_empty()).then_some(s)
}

fn not_run(family: Family, algorithm: &str, backend: &str, reason: impl Into<String>) -> NotRun {
    NotRun {
        family,
        algorithm: algorithm.into(),
        backend: backend.into(),
        reason: reason.into(),
    }
}

/// Runs the suite.
pub fn run(a: &BenchArgs) -> BenchReport {
    let t0 = Instant::now();
    let algo = |x: Algorithm| a.algo.is_empty() || a.algo.contains(&x);
    let backend = |k: BackendKind| a.backend.is_empty() || a.backend.contains(&k);
    let mut rows: Vec<Row> = vec![];
    let mut missing = vec![];
    let mut device = DeviceInfo {
        cpu: cpu_name(),
        ..DeviceInfo::default()
    };
    let mut ceilings = Ceilings::default();
    let progress = |r: &Row| {
        eprintln!(
            "{:18} {:10} {:5} {:12} B={:3} Sq={:5} ctx={:7} {:>10} check {:.2e} {}",
            r.shape.family.name(),
            r.algorithm,
            r.backend,
            r.variant,
            r.shape.batch,
            r.shape.sq,
            r.shape.max_ctx(),
            r.time
                .as_ref()
                .map_or("untimed".into(), |t| format!("{:.4} ms", t.median_ms)),
            r.check.rel_fro,
            if r.check.passed { "" } else { "FAILED" }
        )
    };

    if backend(BackendKind::Cuda) {
        match cuda::open() {
            Ok(c) => {
                device.gpu = Some(c.caps.name.clone());
                device.sms = Some(c.caps.compute_units);
                device.l2_bytes = Some(c.caps.l2_bytes);
                device.compute_capability = c.caps.compute_capability;
                let (api, kernels) = cuda::describe(&c);
                device.driver = Some(format!(
                    "{} (CUDA driver API {api})",
                    nvidia_driver().unwrap_or_else(|| "?".into())
                ));
                device.kernels = Some(kernels);
                match cuda::ceilings(&c) {
                    Ok(x) => ceilings = x,
                    Err(e) => missing.push(not_run(
                        Family::LeanPaper,
                        "ceilings",
                        "cuda",
                        format!("error: {e}"),
                    )),
                }
                let mut jobs = vec![];
                let mut gpu_rows = |family: Family,
                                    name: &str,
                                    shapes: Vec<shapes::Shape>,
                                    rows: &mut Vec<Row>,
                                    missing: &mut Vec<NotRun>| {
                    for s in shapes {
                        let at = rows.len();
                        let got = match family {
                            Family::TurboPrefill => {
                                cuda::turbo_prefill_row(&c, &s, &mut jobs, at).map(|r| vec![r])
                            }
                            Family::TurboDecode => cuda::turbo_decode_rows(&c, &s, &mut jobs, at),
                            Family::TurboQuantDecode => {
                                cuda::turboquant_decode_rows(&c, &s, &mut jobs, at)
                            }
                            _ => cuda::lean_row(&c, &s, &mut jobs, at).map(|r| vec![r]),
                        };
                        match got {
                            Ok(v) => {
                                v.iter().for_each(progress);
                                rows.extend(v);
                            }
                            Err(e) => {
                                eprintln!(
                                    "{} B={} ctx={}: error: {e}",
                                    family.name(),
                                    s.batch,
                                    s.max_ctx()
                                );
                                missing.push(not_run(
                                    s.family,
                                    name,
                                    "cuda",
                                    format!(
                                        "error: B={} Sq={} ctx={}: {e}",
                                        s.batch,
                                        s.sq,
                                        s.max_ctx()
                                    ),
                                ));
                            }
                        }
                    }
                };
                if algo(Algorithm::Lean) {
                    gpu_rows(
                        Family::LeanPaper,
                        "lean",
                        shapes::lean_shapes(a.suite),
                        &mut rows,
                        &mut missing,
                    );
                }
                if algo(Algorithm::Turbo) {
                    gpu_rows(
                        Family::TurboPrefill,
                        "turbo",
                        shapes::turbo_prefill_shapes(a.suite),
                        &mut rows,
                        &mut missing,
                    );
                    gpu_rows(
                        Family::TurboDecode,
                        "turbo",
                        shapes::turbo_decode_shapes(a.suite),
                        &mut rows,
                        &mut missing,
                    );
                }
                if algo(Algorithm::TurboQuant) {
                    gpu_rows(
                        Family::TurboQuantDecode,
                        "turboquant",
                        shapes::turboquant_decode_shapes(a.suite, true),
                        &mut rows,
                        &mut missing,
                    );
                }
                c.gpu.synchronize().ok();
                if a.no_torch || jobs.is_empty() {
                    fill_sdpa(&mut rows, None, "not asked for (--no-torch)");
                } else {
                    match baseline::run(&jobs) {
                        Ok(b) => {
                            device.torch = Some(b.torch.clone());
                            ceilings.copy_gbs_torch = b.ceilings.copy_gbs_torch;
                            ceilings.gemm_bf16_tflops = b.ceilings.gemm_bf16_tflops;
                            ceilings.gemm_int8_tops = b.ceilings.gemm_int8_tops;
                            ceilings.launch_floor_us = b.ceilings.launch_floor_us;
                            fill_sdpa(&mut rows, Some(&b), "");
                        }
                        Err(why) => fill_sdpa(&mut rows, None, &why),
                    }
                }
                for r in rows.iter_mut().filter(|r| r.backend == "cuda") {
                    if let Some((ms, bound)) = ceilings.floor(
                        r.bytes,
                        r.flops,
                        cuda::int8_rows(&r.algorithm, r.shape.family),
                    ) {
                        r.floor_ms = Some(ms);
                        r.floor_bound = Some(bound.into());
                    }
                }
            }
            Err(reason) => {
                device.cuda_unavailable = Some(reason.clone());
                for (f, n) in [
                    (Family::LeanPaper, "lean"),
                    (Family::Llama3Decode, "lean"),
                    (Family::Ragged, "lean"),
                    (Family::TurboPrefill, "turbo"),
                    (Family::TurboDecode, "turbo"),
                ] {
                    if algo(Algorithm::parse(n).expect("known name")) {
                        missing.push(not_run(f, n, "cuda", format!("CUDA unavailable: {reason}")));
                    }
                }
            }
        }
    }

    if backend(BackendKind::Cpu) {
        let mut host_shapes = shapes::host_shapes(a.suite);
        host_shapes.extend(shapes::turboquant_decode_shapes(a.suite, false));
        for s in host_shapes {
            let mut algos: Vec<Algorithm> = host::cpu_algorithms(&s)
                .into_iter()
                .filter(|&x| algo(x))
                .collect();
            if algos.is_empty() && a.algo.contains(&Algorithm::Exact) {
                // exact is every CPU row's baseline; asked for alone, it gets rows of its own
                algos = vec![Algorithm::Exact];
            }
            if algos.is_empty() {
                continue;
            }
            match host::cpu_rows(&s, &algos) {
                Ok(v) => {
                    v.iter().for_each(progress);
                    rows.extend(v);
                }
                Err(e) => missing.push(not_run(
                    s.family,
                    "cpu rows",
                    "cpu",
                    format!("error: B={} Sq={} ctx={}: {e}", s.batch, s.sq, s.max_ctx()),
                )),
            }
        }
    }

    if backend(BackendKind::Ascend) && algo(Algorithm::Amla) {
        for s in shapes::mla_shapes(a.suite) {
            match host::mla_row(&s) {
                Ok(r) => {
                    progress(&r);
                    rows.push(r);
                }
                Err(e) => missing.push(not_run(
                    Family::Mla910,
                    "amla",
                    "ascend",
                    format!("error: Sq={} Sk={}: {e}", s.sq, s.max_ctx()),
                )),
            }
        }
    }

    BenchReport {
        schema: 1,
        suite: a.suite,
        commit: crate::GIT_COMMIT.to_string(),
        date: utc_date(),
        device,
        method: timing::Method::DEVICE,
        host_method: timing::Method::HOST,
        ceilings,
        rows,
        not_run: missing,
        wall_s: t0.elapsed().as_secs_f64(),
    }
}

/// Puts the SDPA results (or why there are none) into the rows' SDPA baselines.
fn fill_sdpa(rows: &mut [Row], b: Option<&baseline::Baselines>, why: &str) {
    for (i, r) in rows.iter_mut().enumerate() {
        let res = b.and_then(|b| b.by_row.get(&i));
        for base in r
            .baselines
            .iter_mut()
            .filter(|x| x.name.starts_with("sdpa-"))
        {
            match (res, base.name.as_str()) {
                (Some(x), "sdpa-cudnn") => {
                    base.time = x.cudnn.clone();
                    base.error = x.cudnn_error.clone();
                }
                (Some(x), _) => {
                    base.time = x.flash.clone();
                    base.error = x.flash_error.clone();
                }
                (None, _) => {
                    base.error = Some(if why.is_empty() {
                        "no result".into()
                    } else {
                        why.into()
                    })
                }
            }
        }
    }
}
