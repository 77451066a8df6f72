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
//! [--trace DIR]`. Prints one line per shape, causal flag and kernel: ms total / attention only
//! and TFLOP/s (4 B H N^2 D, halved when causal, over the total). With `FERRATTN_WGF_TRACE` set,
//! `--trace DIR` writes the fast kernel's per-CTA trace of the last attention launch
//! (`ferrattn_cuda::turbo::TRACE_WORDS` little-endian u64 per CTA) to
//! `DIR/trace_BATCHxLEN_c{0,1}.bin` (the traced run's timings include the trace's stores).

use ferrattn_core::turbo::{KvBits, TurboConfig};
use ferrattn_core::{AttentionProblem, DType};
use ferrattn_cuda::{CudaBackend, Event, Graph, Options};

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

fn time_one(
    b: &CudaBackend,
    batch: usize,
    len: usize,
    causal: bool,
    trace: Option<&str>,
) -> ferrattn_cuda::Result<(f32, f32)> {
    let gpu = b.gpu()?.clone();
    let mut p = AttentionProblem::uniform(batch, len, len, HQ, HK, D, D, DType::BF16);
    p.causal = causal;
    let set_bytes = batch * len * (HQ * D + 2 * HK * D) * 2;
    let sets = (4 * gpu.caps.l2_bytes).div_ceil(set_bytes).clamp(1, 8);
    let inputs = (0..sets)
        .map(|i| b.random_inputs(&p, 7 + i as u32, 2.0))
        .collect::<ferrattn_cuda::Result<Vec<_>>>()?;
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
        eprintln!("usage: turbo_prefill BATCH LEN [BATCH LEN ...] [--only wg|fast] [--causal both|yes|no] [--trace DIR]");
        std::process::exit(2);
    }
    let only = flag("--only");
    let trace = flag("--trace");
    let causals: &[bool] = match flag("--causal").as_deref() {
        Some("yes") => &[true],
        Some("no") => &[false],
        _ => &[false, true],
    };
    let wg = CudaBackend::with_options(0, Options::default());
    if let Err(e) = wg.gpu() {
        eprintln!("turbo_prefill: no GPU ({e}); nothing measured");
        return;
    }
    let fast = CudaBackend::with_options(
        0,
        Options {
            fast_turbo_prefill: true,
            ..Options::default()
        },
    );
    for s in pos.chunks(2) {
        let (batch, len) = (s[0], s[1]);
        for &causal in causals {
            let flops = 4.0 * (batch * HQ) as f64 * (len as f64).powi(2) * D as f64
                / if causal { 2.0 } else { 1.0 };
            for (name, b) in [("wg", &wg), ("fast", &fast)] {
                if only.as_deref().is_some_and(|o| o != name) {
                    continue;
                }
                match time_one(b, batch, len, causal, trace.as_deref()) {
                    Ok((t, a)) => println!(
                        "turbo prefill {batch} x {len} causal {causal} {name}: {t:.3} ms total, {a:.3} ms attention, {:.1} TFLOP/s total ({:.1} attention)",
                        flops / (t as f64 * 1e-3) / 1e12,
                        flops / (a as f64 * 1e-3) / 1e12
                    ),
                    Err(e) => println!("turbo prefill {batch} x {len} causal {causal} {name}: error: {e}"),
                }
            }
        }
    }
}
