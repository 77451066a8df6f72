//! TurboAttention prefill on the GPU, the warpgroup-MMA kernels side by side: `wg`
//! (`turbo_prefill_wg_*`, the emulation's numerics up to P codes at rounding boundaries) and
//! `fast` (`turbo_prefill_wgf_*`, `Options::fast_turbo_prefill`: P as u8 codes with s_P = 1/255
//! against the running row maximum). Llama-3-8B heads (32 query, 8 KV, d 128), bf16, inputs
//! filled on the device and rotated over enough sets to exceed 4x L2; per shape and kernel the
//! whole prefill (K/V quantization pre-pass + attention) and the attention launch alone, each as
//! a CUDA graph of `--iters`-sized batches (about 20 ms each) replayed between events after a
//! warm-up of about 200 ms; the median of 9 replays. Not the suite: `ferrattn bench --algo
//! turbo` gives the documented rows, checked and beside SDPA; `scripts/bench_sdpa.py` times
//! SDPA on the same shapes (docs/TURBO_CUDA.md says how they were run together).
//!
//! Usage: `turbo_prefill BATCH LEN [BATCH LEN ...] [--only wg|fast] [--causal both|yes|no]
//! [--inputs uniform|llm|both] [--paths] [--trace DIR] [--nvrtc]`. Prints one line per shape, causal flag,
//! inputs and kernel: ms total / attention only and TFLOP/s (4 B H N^2 D, halved when causal,
//! over the total). Inputs: `uniform` (the default; filled on the device, uniform in [-2, 2),
//! rotated over enough sets to exceed 4x L2) or `llm` (lines tagged `llm`): shaped as
//! `ferrattn_core::turbo::llm_like_inputs` (the GPU tests' generator: Gaussian Q, K, V; in every
//! other KV head 4 key channels of 10-50x around a mean of +-1; a log-normal(0, 0.5) spread of
//! the V channels per KV head), drawn on the host on every core (so not its exact values), one
//! set (a set is larger than L2 at every shape timed here), made once per shape and uploaded.
//! `--paths` times nothing and needs no GPU: it prints how the query blocks of the LLM-shaped
//! inputs divide between the fast contract's INT32 path and its chunks (the twin's rule). With
//! `FERRATTN_WGF_TRACE` set, `--trace DIR` writes the fast kernel's per-CTA trace of the last
//! attention launch (`ferrattn_cuda::turbo::TRACE_WORDS` little-endian u64 per CTA) to
//! `DIR/trace_BATCHxLEN_c{0,1}.bin` (the traced run's timings include the trace's stores).
//! A build whose turbo_prefill.cu was compiled with `-DFERRATTN_WGF_TIMELINE=1` writes the
//! per-warpgroup timeline into the trace (turbo_prefill.cu, `kTraceWords`; the nvcc wrapper
//! `docs/results/turbo-prefill11-h200-2026-11-26/nvcc_timeline.sh` builds one). `--nvrtc` loads
//! the fast backend's kernels through NVRTC (`Options::force_nvrtc`, so that
//! `FERRATTN_NVRTC_DEFINES=-DFERRATTN_WGF_TIMELINE=1` instruments them without a rebuild); it
//! compiles the decode module too and did not finish within 45 s on an H200 machine (round 11).

use ferrattn_core::turbo::{KvBits, TurboConfig};
use ferrattn_core::{AttentionInputs, AttentionProblem, DType, Tensor};
use ferrattn_cuda::{CudaBackend, DeviceInputs, Event, Graph, Options};
use rand::{rngs::StdRng, Rng, SeedableRng};

const HQ: usize = 32;
const HK: usize = 8;
const D: usize = 128;

fn time_graph(
    gpu: &std::sync::Arc<ferrattn_cuda::Gpu>,
    mut f: impl FnMut(usize) -> ferrattn_cuda::Result<()>,
    sets: usize,
) -> ferrattn_cuda::Result<f32> {
    // warm-up and a size estimate
    for i in 0..sets.max(2) {
        f(i % sets)?;
    }
    gpu.synchronize()?;
    let s = Event::record(gpu)?;
    f(0)?;
    let e = Event::record(gpu)?;
    let est = s.elapsed_ms(&e)?.max(0.002);
    let warm = ((200.0 / est) as usize).clamp(1, 2000);
    for i in 0..warm {
        f(i % sets)?;
    }
    let iters = ((20.0 / est) as usize).clamp(2, 200);
    let graph = Graph::capture(gpu, || (0..iters).try_for_each(|i| f(i % sets)))?;
    graph.launch()?;
    let mut ts = vec![];
    for _ in 0..9 {
        let s = Event::record(gpu)?;
        graph.launch()?;
        let e = Event::record(gpu)?;
        ts.push(s.elapsed_ms(&e)? / iters as f32);
    }
    ts.sort_by(|a, b| a.total_cmp(b));
    Ok(ts[ts.len() / 2])
}

fn problem(batch: usize, len: usize, causal: bool) -> AttentionProblem {
    let mut p = AttentionProblem::uniform(batch, len, len, HQ, HK, D, D, DType::BF16);
    p.causal = causal;
    p
}

/// `rows` rows of `width` standard normal values (Box-Muller), rounded to bf16, then `shape`
/// applied per row as `f(row, values)`; on every core, one seed per block of rows.
fn gaussian_rows(
    rows: usize,
    width: usize,
    seed: u64,
    shape: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let mut data = vec![0.0f32; rows * width];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = rows.div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for (ci, chunk) in data.chunks_mut(per * width).enumerate() {
            let shape = &shape;
            sc.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9) + ci as u64);
                for (r, row) in chunk.chunks_mut(width).enumerate() {
                    for x in row.iter_mut() {
                        let (u1, u2): (f32, f32) = (rng.gen_range(1e-7f32..1.0), rng.gen());
                        *x = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
                    }
                    shape(ci * per + r, row);
                    for x in row.iter_mut() {
                        *x = DType::BF16.round(*x);
                    }
                }
            });
        }
    });
    data
}

/// LLM-shaped inputs for `p` (see the module docs).
fn llm_inputs(p: &AttentionProblem, seed: u64) -> AttentionInputs {
    let (b, s) = (p.batch, p.max_seqlen_q);
    let mut rng = StdRng::seed_from_u64(seed);
    // per KV head: the V channel spread and (every other head) 4 outlier key channels
    let v_spread: Vec<Vec<f32>> = (0..HK)
        .map(|_| {
            (0..D)
                .map(|_| {
                    let (u1, u2): (f32, f32) = (rng.gen_range(1e-7f32..1.0), rng.gen());
                    let z = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
                    (0.5 * z).exp()
                })
                .collect()
        })
        .collect();
    let outliers: Vec<Vec<(usize, f32, f32)>> = (0..HK)
        .map(|h| {
            let mut chans: Vec<(usize, f32, f32)> = Vec::new();
            while h % 2 == 0 && chans.len() < 4 {
                let c = rng.gen_range(0..D);
                if chans.iter().all(|&(x, _, _)| x != c) {
                    let sign = if rng.gen::<bool>() { 1.0 } else { -1.0 };
                    chans.push((c, rng.gen_range(10.0f32..50.0), sign));
                }
            }
            chans
        })
        .collect();
    let rows_kv = b * s * HK;
    let q = gaussian_rows(b * s * HQ, D, seed + 1, |_, _| {});
    let k = gaussian_rows(rows_kv, D, seed + 2, |r, row| {
        for &(c, f, sign) in &outliers[r % HK] {
            row[c] = f * (sign + 0.3 * row[c]);
        }
    });
    let v = gaussian_rows(rows_kv, D, seed + 3, |r, row| {
        for (x, s) in row.iter_mut().zip(&v_spread[r % HK]) {
            *x *= s;
        }
    });
    let t = |h: usize, data: Vec<f32>| Tensor {
        shape: vec![b, s, h, D],
        dtype: DType::BF16,
        data,
    };
    let mut x = AttentionInputs::new(t(HQ, q), t(HK, k), t(HK, v));
    x.seqlens_q = Some(p.seqlens_q.iter().map(|&l| l as i64).collect());
    x.seqlens_k = Some(p.seqlens_k.iter().map(|&l| l as i64).collect());
    x
}

/// `llm`: host inputs made once per shape; `None`: uniform, filled on the device.
fn time_one(
    b: &CudaBackend,
    batch: usize,
    len: usize,
    causal: bool,
    llm: Option<&AttentionInputs>,
    trace: Option<&str>,
) -> ferrattn_cuda::Result<(f32, f32)> {
    let gpu = b.gpu()?.clone();
    let p = problem(batch, len, causal);
    let inputs = match llm {
        Some(x) => vec![DeviceInputs::upload(&gpu, &p, x)?],
        None => {
            let set_bytes = batch * len * (HQ * D + 2 * HK * D) * 2;
            let sets = (4 * gpu.caps.l2_bytes).div_ceil(set_bytes).clamp(1, 8);
            (0..sets)
                .map(|i| b.random_inputs(&p, 7 + i as u32, 2.0))
                .collect::<ferrattn_cuda::Result<Vec<_>>>()?
        }
    };
    let sets = inputs.len();
    let cfg = TurboConfig {
        kv_bits: KvBits::Int4,
        ..TurboConfig::default()
    };
    let prep = b.turbo_prepare_prefill(&cfg, &p)?;
    let mut out = b.alloc_outputs(&p)?;
    let total = time_graph(
        &gpu,
        |i| b.turbo_launch_prefill(&prep, &inputs[i], &mut out, None),
        sets,
    )?;
    // the attention alone over the INT8 tiles the last prefill of set 0 left
    b.turbo_launch_prefill(&prep, &inputs[0], &mut out, None)?;
    let attn = time_graph(
        &gpu,
        |_| b.turbo_prefill_attention_only(&prep, &inputs[0], &mut out),
        1,
    )?;
    if let (Some(dir), Some(words)) = (trace, b.turbo_prefill_trace(&prep)?) {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let path = format!("{dir}/trace_{batch}x{len}_c{}.bin", causal as u8);
        if let Err(e) = std::fs::write(&path, bytes) {
            eprintln!("turbo_prefill: {path}: {e}");
        }
    }
    Ok((total, attn))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let pos: Vec<usize> = args
        .iter()
        .take_while(|a| !a.starts_with("--"))
        .filter_map(|a| a.parse().ok())
        .collect();
    if pos.is_empty() || !pos.len().is_multiple_of(2) {
        eprintln!("usage: turbo_prefill BATCH LEN [BATCH LEN ...] [--only wg|fast] [--causal both|yes|no] [--inputs uniform|llm|both] [--paths] [--trace DIR] [--nvrtc]");
        std::process::exit(2);
    }
    let only = flag("--only");
    let trace = flag("--trace");
    let causals: &[bool] = match flag("--causal").as_deref() {
        Some("yes") => &[true],
        Some("no") => &[false],
        _ => &[false, true],
    };
    if args.iter().any(|a| a == "--paths") {
        for s in pos.chunks(2) {
            for &causal in causals {
                print_paths(s[0], s[1], causal);
            }
        }
        return;
    }
    let wg = CudaBackend::with_options(0, Options::default());
    if let Err(e) = wg.gpu() {
        eprintln!("turbo_prefill: no GPU ({e}); nothing measured");
        return;
    }
    let fast = CudaBackend::with_options(
        0,
        Options {
            fast_turbo_prefill: true,
            force_nvrtc: args.iter().any(|a| a == "--nvrtc"),
            ..Options::default()
        },
    );
    let input_kinds: &[bool] = match flag("--inputs").as_deref() {
        Some("llm") => &[true],
        Some("both") => &[false, true],
        _ => &[false],
    };
    for s in pos.chunks(2) {
        let (batch, len) = (s[0], s[1]);
        for &is_llm in input_kinds {
            let llm = is_llm.then(|| llm_inputs(&problem(batch, len, false), 7));
            let tag = if is_llm { " llm" } else { "" };
            for &causal in causals {
                let flops = 4.0 * (batch * HQ) as f64 * (len as f64).powi(2) * D as f64
                    / if causal { 2.0 } else { 1.0 };
                for (name, b) in [("wg", &wg), ("fast", &fast)] {
                    if only.as_deref().is_some_and(|o| o != name) {
                        continue;
                    }
                    match time_one(b, batch, len, causal, llm.as_ref(), trace.as_deref()) {
                        Ok((t, a)) => println!(
                            "turbo prefill {batch} x {len} causal {causal}{tag} {name}: {t:.3} ms total, {a:.3} ms attention, {:.1} TFLOP/s total ({:.1} attention)",
                            flops / (t as f64 * 1e-3) / 1e12,
                            flops / (a as f64 * 1e-3) / 1e12
                        ),
                        Err(e) => println!(
                            "turbo prefill {batch} x {len} causal {causal}{tag} {name}: error: {e}"
                        ),
                    }
                }
            }
        }
    }
}

/// `--paths` (host only, no GPU): how the query blocks of the LLM-shaped inputs divide between
/// the fast contract's INT32 path and its chunks, by the twin's rule
/// (`ferrattn_core::turbo::attention::fixed_p_int_scale` on the V block scales a query block
/// visits; the default configuration applies no SAS threshold of its own).
fn print_paths(batch: usize, len: usize, causal: bool) {
    let x = llm_inputs(&problem(batch, len, false), 7);
    let v = x.v.as_ref().expect("separate V");
    let (mut int, mut within_2, mut total) = (0usize, 0usize, 0usize);
    for b in 0..batch {
        for h in 0..HK {
            let vs: Vec<f32> = (0..len.div_ceil(64))
                .map(|j| {
                    let rows: Vec<&[f32]> = (64 * j..(64 * j + 64).min(len))
                        .map(|t| v.row4(b, t, h))
                        .collect();
                    ferrattn_core::turbo::quant::int8_scale(rows.iter().flat_map(|r| r.iter()))
                })
                .collect();
            for qb in 0..len.div_ceil(64) {
                let last = (64 * qb + 63).min(len - 1);
                let nt = if causal { last + 1 } else { len }.div_ceil(64);
                total += HQ / HK;
                if ferrattn_core::turbo::attention::fixed_p_int_scale(&vs[..nt], false).is_some() {
                    int += HQ / HK;
                }
                // round 9's rule (main before round 10): at least 4 tiles, the visited V block
                // scales positive and within a factor 2
                let lo = vs[..nt].iter().copied().fold(f32::INFINITY, f32::min);
                let hi = vs[..nt].iter().copied().fold(0.0f32, f32::max);
                if nt >= ferrattn_core::turbo::attention::FIXED_P_INT_MIN_TILES
                    && lo > 0.0
                    && 2.0 * lo >= hi
                {
                    within_2 += HQ / HK;
                }
            }
        }
    }
    println!(
        "paths {batch} x {len} causal {causal} llm: {total} query blocks (per query head), {int} on the INT32 path ({:.0}%), {} on the chunks; round 9's factor-2 rule: {within_2} ({:.0}%)",
        100.0 * int as f64 / total as f64,
        total - int,
        100.0 * within_2 as f64 / total as f64
    );
}
