//! GPU benchmark of the Lean stream-K decode against the fixed-split (FlashDecoding) variant of
//! the same kernel, on the configurations of the Lean paper (56 heads, d = 64) and Llama-3-8B
//! decode (32 query / 8 KV heads, d = 128), uniform and ragged. Not a test: it prints JSON
//! records that `scripts/gpu-report.py` joins with PyTorch SDPA timings taken in the same run.
//!
//! Method (see /work/.library/device/METHOD.md): inputs filled on the device, several input sets
//! rotated when one set is smaller than 4x L2, warm-up launches, then batches of launches captured
//! in a CUDA graph and replayed between CUDA events; the median over batches of the time per
//! launch. Also measures a device-to-device copy (bytes read + written) as the bandwidth ceiling.
//!
//! Usage: `lean_decode [--quick] [--tables lean,llama,ragged] [--out FILE]`

use ferrattn_core::{
    lean, plan, Algorithm, AttentionPlan, AttentionProblem, DType, Device, PlanDetail,
};
use ferrattn_cuda::{CudaBackend, DeviceBuffer, DeviceInputs, Event, Graph};
use rand::{Rng, SeedableRng};
use std::fmt::Write as _;

struct Config {
    table: &'static str,
    batch: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    lens: Vec<usize>,
}

fn ragged_lens(b: usize, max: usize, pct: usize, seed: u64) -> Vec<usize> {
    // one sequence at the maximum; the others uniform in [1, 2 * m - 1] with the mean m that
    // makes the batch mean pct% of the maximum
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let m = ((max * pct / 100) * b - max) / (b - 1).max(1);
    (0..b)
        .map(|i| {
            if i == 0 {
                max
            } else {
                rng.gen_range(1..=(2 * m).clamp(2, max))
            }
        })
        .collect()
}

fn configs(tables: &[String], quick: bool) -> Vec<Config> {
    let mut v = Vec::new();
    let want = |t: &str| tables.iter().any(|x| x == t || x == "all");
    if want("lean") {
        // Lean paper: 56 heads, head dim 64, batch 1..64, context 1k..256k (<= 1M tokens: 15 GB)
        for &b in &[1usize, 4, 16, 64] {
            for &ctx in &[1024usize, 4096, 16384, 65536, 262144] {
                if b * ctx > 1 << 20 || (quick && (b > 4 || ctx > 16384)) {
                    continue;
                }
                v.push(Config {
                    table: "lean",
                    batch: b,
                    hq: 56,
                    hk: 56,
                    d: 64,
                    dtype: DType::F16,
                    lens: vec![ctx; b],
                });
            }
        }
    }
    if want("llama") {
        // Llama-3-8B decode: 32 query heads, 8 KV heads, head dim 128 (<= 4M tokens: 16 GB)
        for &b in &[1usize, 8, 32, 64, 128] {
            for &ctx in &[1024usize, 8192, 32768, 131072] {
                if b * ctx > 1 << 22 || (quick && (b > 8 || ctx > 8192)) {
                    continue;
                }
                v.push(Config {
                    table: "llama",
                    batch: b,
                    hq: 32,
                    hk: 8,
                    d: 128,
                    dtype: DType::BF16,
                    lens: vec![ctx; b],
                });
            }
        }
    }
    if want("ragged") {
        for (i, &(b, max, hq, hk, d, dtype)) in [
            (16usize, 32768usize, 32usize, 8usize, 128usize, DType::BF16),
            (64, 32768, 32, 8, 128, DType::BF16),
            (16, 65536, 56, 56, 64, DType::F16),
        ]
        .iter()
        .enumerate()
        {
            for &pct in &[10usize, 25, 50, 100] {
                if quick && (b > 16 || pct == 50) {
                    continue;
                }
                let lens = if pct == 100 {
                    vec![max; b]
                } else {
                    ragged_lens(b, max, pct, 17 + i as u64)
                };
                v.push(Config {
                    table: "ragged",
                    batch: b,
                    hq,
                    hk,
                    d,
                    dtype,
                    lens,
                });
            }
        }
    }
    v
}

fn median(mut x: Vec<f32>) -> f32 {
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

/// Milliseconds per call of `f` (one launch per call, input set `i % sets`): a batch of calls is
/// captured in a CUDA graph and replayed between two events (as serving engines replay decode
/// steps, and as the SDPA side is timed), so launch gaps are not counted; median over batches.
fn time_ms(gpu: &std::sync::Arc<ferrattn_cuda::Gpu>, f: impl FnMut(usize)) -> f32 {
    time_ms_mode(gpu, true, f)
}

/// As [`time_ms`]; `graph = false` enqueues the calls eagerly, back to back (used for the copy
/// ceiling: a memcpy node in a graph runs on a copy engine at about 2.8 TB/s on an H200, while an
/// eager device-to-device copy reaches about 4.3 TB/s).
fn time_ms_mode(
    gpu: &std::sync::Arc<ferrattn_cuda::Gpu>,
    graph: bool,
    mut f: impl FnMut(usize),
) -> f32 {
    for i in 0..3 {
        f(i);
    }
    let s = Event::record(gpu).unwrap();
    f(0);
    let e = Event::record(gpu).unwrap();
    let est = s.elapsed_ms(&e).unwrap().max(0.002);
    let per_batch = ((2.0 / est) as usize).clamp(3, 200);
    let batches = ((200.0 / (est * per_batch as f32)) as usize).clamp(5, 25);
    let mut t = Vec::with_capacity(batches);
    if graph {
        let graph = Graph::capture(gpu, || {
            for k in 0..per_batch {
                f(k);
            }
            Ok(())
        })
        .unwrap();
        graph.launch().unwrap();
        for _ in 0..batches {
            let s = Event::record(gpu).unwrap();
            graph.launch().unwrap();
            let e = Event::record(gpu).unwrap();
            t.push(s.elapsed_ms(&e).unwrap() / per_batch as f32);
        }
    } else {
        let mut k = 0;
        for _ in 0..batches {
            let s = Event::record(gpu).unwrap();
            for _ in 0..per_batch {
                f(k);
                k += 1;
            }
            let e = Event::record(gpu).unwrap();
            t.push(s.elapsed_ms(&e).unwrap() / per_batch as f32);
        }
    }
    median(t)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let tables: Vec<String> = get("--tables")
        .unwrap_or_else(|| "all".into())
        .split(',')
        .map(String::from)
        .collect();
    let out_path = get("--out");
    if args.iter().any(|a| a == "--bench") && args.len() == 2 {
        // `cargo bench` passes --bench; fall through with defaults
    }
    let b = CudaBackend::new(0);
    let gpu = match b.gpu() {
        Ok(g) => g.clone(),
        Err(e) => {
            println!("SKIPPED lean_decode bench: {e}");
            return;
        }
    };
    let caps = b.caps().unwrap();
    eprintln!("{}", ferrattn_cuda::describe(&b));

    // bandwidth ceiling: 2 GiB device-to-device copy, bytes read + written
    let copy_bytes = 2usize << 30;
    let src = DeviceBuffer::alloc(&gpu, copy_bytes).unwrap();
    let mut dst = DeviceBuffer::alloc(&gpu, copy_bytes).unwrap();
    let copy_ms = time_ms_mode(&gpu, false, |_| dst.copy_from(&src).unwrap());
    let copy_gbs = 2.0 * copy_bytes as f64 / (copy_ms as f64 * 1e-3) / 1e9;
    drop((src, dst));
    eprintln!("device copy: {copy_gbs:.0} GB/s (read + write, 2 GiB, median {copy_ms:.3} ms)");

    if args.iter().any(|a| a == "--probe") {
        probe(&b, &gpu, &caps);
        return;
    }
    let mut json = String::from("{");
    let _ = write!(
        json,
        "\"device\":{:?},\"sms\":{},\"l2_bytes\":{},\"copy_gbs\":{copy_gbs:.1},\"commit\":{:?},\"kernels\":{:?},\"records\":[",
        caps.name,
        caps.compute_units,
        caps.l2_bytes,
        std::env::var("FERRATTN_COMMIT").unwrap_or_default(),
        ferrattn_cuda::BUILD_NOTE
    );
    let mut first = true;
    for c in configs(&tables, quick) {
        let max = *c.lens.iter().max().unwrap();
        let mut p = AttentionProblem::uniform(c.batch, 1, max, c.hq, c.hk, c.d, c.d, c.dtype);
        p.seqlens_k = c.lens.clone();
        let sk = plan(Algorithm::Lean, &p, &caps).unwrap();
        let PlanDetail::Lean(lp) = &sk.detail else {
            unreachable!()
        };
        let fx_lp = lean::plan_fixed_split(&p, &caps, None).unwrap();
        let splits = match fx_lp.schedule {
            lean::Schedule::FixedSplit { splits, .. } => splits,
            _ => unreachable!(),
        };
        let fx = AttentionPlan {
            detail: PlanDetail::Lean(fx_lp),
            ..sk.clone()
        };
        // the same schedule with one CTA per slot however little work there is (MIN_ITERS_PER_CTA = 1)
        let full = AttentionPlan {
            detail: PlanDetail::Lean(
                lean::plan_with_ctas(&p, &caps, caps.compute_units * caps.ctas_per_unit).unwrap(),
            ),
            ..sk.clone()
        };
        let padded_bytes = c.batch * max * c.hk * 2 * c.d * c.dtype.size_bytes();
        let sets = if padded_bytes >= 4 * caps.l2_bytes {
            1
        } else {
            (4 * caps.l2_bytes).div_ceil(padded_bytes).min(32)
        };
        let inputs: Vec<DeviceInputs> = (0..sets)
            .map(|s| b.random_inputs(&p, 100 + s as u32, 2.0).unwrap())
            .collect();
        let kv_bytes = inputs[0].kv_bytes_read();
        let mut out = b.alloc_outputs(&p).unwrap();
        let prep_sk = b.prepare(&sk).unwrap();
        let prep_fx = b.prepare(&fx).unwrap();
        let prep_full = b.prepare(&full).unwrap();
        let lean_ms = time_ms(&gpu, |i| {
            prep_sk.launch(&gpu, &inputs[i % sets], &mut out).unwrap()
        });
        let fixed_ms = time_ms(&gpu, |i| {
            prep_fx.launch(&gpu, &inputs[i % sets], &mut out).unwrap()
        });
        let full_ms = if prep_full.plan().num_ctas == lp.num_ctas {
            lean_ms
        } else {
            time_ms(&gpu, |i| {
                prep_full.launch(&gpu, &inputs[i % sets], &mut out).unwrap()
            })
        };
        gpu.synchronize().unwrap();
        let mean = c.lens.iter().sum::<usize>() as f64 / c.batch as f64;
        let rec = format!(
            "{{\"table\":{:?},\"batch\":{},\"hq\":{},\"hk\":{},\"d\":{},\"dtype\":\"{}\",\"max_ctx\":{max},\"mean_ctx\":{mean:.1},\"kv_bytes\":{kv_bytes},\"sets\":{sets},\"lean_ms\":{lean_ms:.5},\"fixed_ms\":{fixed_ms:.5},\"full_grid_ms\":{full_ms:.5},\"lean_ctas\":{},\"fixed_ctas\":{},\"fixed_splits\":{splits},\"tile_k\":{},\"stages\":{},\"lens\":{:?}}}",
            c.table,
            c.batch,
            c.hq,
            c.hk,
            c.d,
            c.dtype,
            lp.num_ctas,
            prep_fx.plan().num_ctas,
            lp.tile_k,
            prep_sk.stages(),
            c.lens
        );
        eprintln!(
            "{:6} B={:3} ctx={:6} (mean {:8.0}) lean {:8.4} ms {:6.0} GB/s | full grid {:8.4} ms | fixed {:8.4} ms ({} splits)",
            c.table,
            c.batch,
            max,
            mean,
            lean_ms,
            kv_bytes as f64 / (lean_ms as f64 * 1e-3) / 1e9,
            full_ms,
            fixed_ms,
            splits
        );
        if !first {
            json.push(',');
        }
        first = false;
        json.push_str(&rec);
    }
    json.push_str("]}");
    match out_path {
        Some(p) => std::fs::write(&p, &json).unwrap(),
        None => println!("{json}"),
    }
}

/// Where the fixed cost of a small decode goes: the same small Llama problem under several
/// schedules, and a one-key problem (the floor of one launch).
fn probe(
    b: &CudaBackend,
    gpu: &std::sync::Arc<ferrattn_cuda::Gpu>,
    caps: &ferrattn_core::DeviceCaps,
) {
    for (ctx, batch) in [(1usize, 1usize), (64, 1), (1024, 1), (1024, 8)] {
        let p = AttentionProblem::uniform(batch, 1, ctx, 32, 8, 128, 128, DType::BF16);
        let base = plan(Algorithm::Lean, &p, caps).unwrap();
        let inputs: Vec<DeviceInputs> = (0..8)
            .map(|s| b.random_inputs(&p, s, 2.0).unwrap())
            .collect();
        let mut out = b.alloc_outputs(&p).unwrap();
        let variants: Vec<(String, lean::LeanPlan)> = vec![
            (
                "stream-K default".into(),
                match &base.detail {
                    PlanDetail::Lean(l) => l.clone(),
                    _ => unreachable!(),
                },
            ),
            (
                "stream-K full grid".into(),
                lean::plan_with_ctas(&p, caps, caps.compute_units * caps.ctas_per_unit).unwrap(),
            ),
            (
                "one CTA per tile (no merge)".into(),
                lean::plan_fixed_split(&p, caps, Some(1)).unwrap(),
            ),
            (
                "fixed split 4 (+combine)".into(),
                lean::plan_fixed_split(&p, caps, Some(4)).unwrap(),
            ),
            (
                "fixed split 16 (+combine)".into(),
                lean::plan_fixed_split(&p, caps, Some(16)).unwrap(),
            ),
        ];
        for (name, lp) in variants {
            let ctas = lp.num_ctas;
            let pl = AttentionPlan {
                detail: PlanDetail::Lean(lp),
                ..base.clone()
            };
            let prep = b.prepare(&pl).unwrap();
            let t = time_ms(gpu, |i| prep.launch(gpu, &inputs[i % 8], &mut out).unwrap());
            println!(
                "probe B={batch} ctx={ctx:5} {name:30} {ctas:4} CTAs {:8.2} us",
                t * 1000.0
            );
        }
    }
}
