//! The TurboQuant compression kernels on the GPU against the copy ceiling of the same run
//! (issue 10: "compression kernels >= 80% of the copy ceiling"). Not a test: `gpu_turboquant`
//! checks what these kernels write.
//!
//! For d 128 and 64, 8 KV heads, prefills of 1 x 32k and 16 x 4k tokens: the key kernel with QJL
//! (`k4q`: 3-bit codebook + signs), the key kernel without (`k4`: 4-bit codebook) and the value
//! kernel (3 bits), each through the exact path and both tensor-core paths (`fast`: one f16 `Π`;
//! `split`: `Π` as f16 hi + lo). Each kernel is launched alone (`enqueue_compress_part`),
//! `iters` launches captured in a CUDA graph, replayed between events, median of 9 replays.
//! Bytes = fp16 rows read + codes, signs and norms written; GB/s and % of the copy ceiling, an
//! eager device-to-device copy of 1 GiB timed the same way (bytes read + written over time).
//! Then the per-step append (one token per sequence, keys and values, batch 16 and 64) in µs.
//!
//! Usage: `turboquant_compress [--iters N] [--only fast,split,exact]`

use ferrattn_core::turboquant::TurboQuantConfig;
use ferrattn_core::{AttentionProblem, DType};
use ferrattn_cuda::turboquant::CompressPath;
use ferrattn_cuda::{CudaBackend, DeviceBuffer, Event, Graph, Result};

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median ms per call of `f` (`iters` calls in one graph, 9 replays after one warm-up replay).
fn time_graph(
    gpu: &std::sync::Arc<ferrattn_cuda::Gpu>,
    iters: usize,
    f: &dyn Fn() -> Result<()>,
) -> Result<f32> {
    f()?;
    gpu.synchronize()?;
    let graph = Graph::capture(gpu, || (0..iters).try_for_each(|_| f()))?;
    graph.launch()?;
    let mut ts = vec![];
    for _ in 0..9 {
        let s = Event::record(gpu)?;
        graph.launch()?;
        let e = Event::record(gpu)?;
        ts.push(s.elapsed_ms(&e)? / iters as f32);
    }
    Ok(median(ts))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let iters: usize = flag("--iters").and_then(|s| s.parse().ok()).unwrap_or(20);
    let only = flag("--only").unwrap_or_else(|| "exact,fast,split".into());
    let b = CudaBackend::new(0);
    let gpu = match b.gpu() {
        Ok(g) => g.clone(),
        Err(e) => {
            eprintln!("turboquant_compress: no GPU ({e}); nothing measured");
            return;
        }
    };
    if let Err(e) = run(&b, &gpu, iters, &only) {
        eprintln!("turboquant_compress: {e}");
        std::process::exit(1);
    }
}

fn run(
    b: &CudaBackend,
    gpu: &std::sync::Arc<ferrattn_cuda::Gpu>,
    iters: usize,
    only: &str,
) -> Result<()> {
    // copy ceiling: 1 GiB device to device, bytes read + written
    let gib = 1usize << 30;
    let src = DeviceBuffer::alloc(gpu, gib)?;
    let mut dst = DeviceBuffer::alloc(gpu, gib)?;
    dst.copy_from(&src)?;
    gpu.synchronize()?;
    let mut ts = vec![];
    for _ in 0..9 {
        let s = Event::record(gpu)?;
        dst.copy_from(&src)?;
        let e = Event::record(gpu)?;
        ts.push(s.elapsed_ms(&e)?);
    }
    let copy_ms = median(ts);
    let copy_gbs = 2.0 * gib as f64 / (copy_ms as f64 * 1e-3) / 1e9;
    drop((src, dst));
    println!(
        "device {} | copy ceiling {copy_gbs:.0} GB/s (1 GiB device-to-device, {copy_ms:.3} ms, read + written)",
        gpu.caps.name
    );
    println!("| d | shape | kernel | path | ms | GB/s | % of copy | MB moved |");
    println!("|---|---|---|---|---|---|---|---|");
    let paths: Vec<(CompressPath, &str)> = [
        (CompressPath::Exact, "exact"),
        (CompressPath::Fast, "fast"),
        (CompressPath::Split, "split"),
    ]
    .into_iter()
    .filter(|(_, n)| only.split(',').any(|o| o == *n))
    .collect();
    for d in [128usize, 64] {
        for (batch, ctx) in [(1usize, 32768usize), (16, 4096)] {
            let hk = 8;
            let p = AttentionProblem::uniform(batch, 1, ctx, 32, hk, d, d, DType::F16);
            let x = b.random_inputs(&p, 7, 2.0)?;
            let rows = batch * ctx * hk;
            for (kernel, key_qjl, key_bits, keys) in [
                ("keys k4q (QJL)", true, 4u8, true),
                ("keys k4 (MSE)", false, 4, true),
                ("values v3", true, 4, false),
            ] {
                let cfg = TurboQuantConfig {
                    key_bits,
                    key_qjl,
                    value_bits: 3,
                    ..TurboQuantConfig::paper_default(&p)
                };
                let written = if keys {
                    d / 2 + if key_qjl { d / 8 } else { 0 } + 4
                } else {
                    d / 2 + 2
                };
                let bytes = (rows * (2 * d + written)) as f64;
                for &(path, pname) in &paths {
                    let tq = b.turboquant(&cfg, &p)?.with_compress_path(path);
                    let cache = tq.alloc_cache(batch, hk, ctx)?;
                    let prep = tq.prepare_append(&vec![0; batch], &vec![ctx; batch], ctx, ctx)?;
                    let src = if keys { x.k().ptr() } else { x.v().ptr() };
                    let n = if path == CompressPath::Exact {
                        iters.div_ceil(10)
                    } else {
                        iters
                    };
                    // SAFETY: `src` holds [batch, ctx, hk, d] f16 of `x`; the backend's stream.
                    let f = || unsafe {
                        tq.enqueue_compress_part(&prep, &cache, src, keys, gpu.raw_stream())
                    };
                    let ms = time_graph(gpu, n, &f)?;
                    let gbs = bytes / (ms as f64 * 1e-3) / 1e9;
                    println!(
                        "| {d} | {batch} x {ctx} | {kernel} | {pname} | {ms:.4} | {gbs:.0} | {:.1}% | {:.1} |",
                        100.0 * gbs / copy_gbs,
                        bytes / 1e6
                    );
                }
            }
        }
    }
    // the per-step append: one token per sequence, keys (QJL) then values
    println!();
    println!("| d | append | path | µs (keys + values launches) |");
    println!("|---|---|---|---|");
    for d in [128usize, 64] {
        for batch in [16usize, 64] {
            let hk = 8;
            let p = AttentionProblem::uniform(batch, 1, 1, 32, hk, d, d, DType::F16);
            let x = b.random_inputs(&p, 9, 2.0)?;
            let cfg = TurboQuantConfig {
                key_bits: 4,
                key_qjl: true,
                value_bits: 3,
                ..TurboQuantConfig::paper_default(&p)
            };
            for &(path, pname) in &paths {
                let tq = b.turboquant(&cfg, &p)?.with_compress_path(path);
                let cache = tq.alloc_cache(batch, hk, 4096)?;
                // the 4096th token of every sequence
                let prep = tq.prepare_append(&vec![4095; batch], &vec![1; batch], 1, 4096)?;
                let (k, v) = (x.k().ptr(), x.v().ptr());
                // SAFETY: k and v hold [batch, 1, hk, d] f16; the backend's stream.
                let f = || unsafe {
                    tq.enqueue_compress_part(&prep, &cache, k, true, gpu.raw_stream())?;
                    tq.enqueue_compress_part(&prep, &cache, v, false, gpu.raw_stream())
                };
                let ms = time_graph(gpu, iters, &f)?;
                println!("| {d} | {batch} x 1 token | {pname} | {:.2} |", ms * 1e3);
            }
        }
    }
    Ok(())
}
