//! GPU benchmark of TurboQuant on CUDA (issue 10): the fused decode over the compressed cache
//! against our Lean decode over fp16 in the same process, and the compression kernels. Not a
//! test: prints a table and writes JSON that `benches/turboquant_sdpa.py` reads to time PyTorch
//! SDPA (cuDNN and flash) on the same shapes in the same command.
//!
//! Method (/work/.library/device/METHOD.md): inputs filled on the device (uniform in [-2, 2)),
//! warm-up, then batches of back-to-back launches between CUDA events, median over batches of the
//! time per call. The decode is timed as its three launches (prepare q, fused decode, merge) over
//! a prepared plan; when one cache is smaller than 4x L2, the launches rotate over several copies
//! so that every launch reads from DRAM. Compression is timed as one append of the whole context
//! (keys and values launches). The copy ceiling is a 2 GiB device-to-device copy (read + write).
//!
//! Usage: `turboquant [--quick] [--out FILE]`

use ferrattn_core::turboquant::TurboQuantConfig;
use ferrattn_core::{plan, Algorithm, AttentionProblem, DType, Device};
use ferrattn_cuda::{CudaBackend, DeviceBuffer, Event};
use std::fmt::Write as _;

fn median(mut x: Vec<f32>) -> f32 {
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

fn time_ms(gpu: &std::sync::Arc<ferrattn_cuda::Gpu>, mut f: impl FnMut(usize)) -> f32 {
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
    median(t)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out_path = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let b = CudaBackend::new(0);
    let gpu = match b.gpu() {
        Ok(g) => g.clone(),
        Err(e) => {
            eprintln!("turboquant bench: {e}");
            std::process::exit(2);
        }
    };
    let caps = b.caps().unwrap();
    let copy_bytes = 2usize << 30;
    let src = DeviceBuffer::alloc(&gpu, copy_bytes).unwrap();
    let mut dst = DeviceBuffer::alloc(&gpu, copy_bytes).unwrap();
    let copy_ms = time_ms(&gpu, |_| dst.copy_from(&src).unwrap());
    let copy_gbs = 2.0 * copy_bytes as f64 / (copy_ms as f64 * 1e-3) / 1e9;
    drop((src, dst));
    eprintln!("device copy: {copy_gbs:.0} GB/s (read + write, 2 GiB)");
    let commit = std::env::var("FERRATTN_COMMIT").unwrap_or_else(|_| "unknown".into());
    let mut json = String::new();
    write!(
        json,
        "{{\"device\":{:?},\"sms\":{},\"l2_bytes\":{},\"copy_gbs\":{copy_gbs:.1},\"commit\":{:?},\"decode\":[",
        caps.name, caps.compute_units, caps.l2_bytes, commit
    )
    .unwrap();

    // (batch, context, query heads, KV heads, d): Llama-3-8B decode shapes from 1 GB of fp16 KV
    // up, batch 1 at 32k and 128k, two smaller ones, and d = 64
    let shapes: Vec<(usize, usize, usize, usize, usize)> = if quick {
        vec![(1, 32768, 32, 8, 128), (16, 16384, 32, 8, 128)]
    } else {
        vec![
            (1, 32768, 32, 8, 128),
            (1, 131072, 32, 8, 128),
            (4, 16384, 32, 8, 128),
            (64, 4096, 32, 8, 128),
            (16, 16384, 32, 8, 128),
            (8, 32768, 32, 8, 128),
            (2, 131072, 32, 8, 128),
            (32, 32768, 32, 8, 128),
            (16, 32768, 32, 8, 64),
        ]
    };
    // (label, key bits, QJL, value bits): the paper's 4-bit keys (3 + QJL) / 3-bit values, 3-bit
    // keys, keys without QJL, and 2/2
    let configs = [
        ("k4q-v3", 4u8, true, 3u8),
        ("k3q-v3", 3, true, 3),
        ("k4-v3", 4, false, 3),
        ("k2q-v2", 2, true, 2),
    ];
    let mut first = true;
    let mut compress_rows = Vec::new();
    println!("| B x ctx | d | config | turboquant ms | cache MB | GB/s | % copy | lean fp16 ms | fp16 MB | vs lean |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &(batch, ctx, hq, hk, d) in &shapes {
        let p = AttentionProblem::uniform(batch, 1, ctx, hq, hk, d, d, DType::F16);
        let x = b.random_inputs(&p, 7, 2.0).unwrap();
        let fp16_bytes = x.kv_bytes_read();
        // our Lean decode over the same fp16 K/V
        let lean_ms = match plan(Algorithm::Lean, &p, &caps) {
            Ok(lp) => {
                let prep = b.prepare(&lp).unwrap();
                let mut out = b.alloc_outputs(&p).unwrap();
                Some(time_ms(&gpu, |_| b.launch(&prep, &x, &mut out).unwrap()))
            }
            Err(e) => {
                eprintln!("lean {batch} x {ctx}: {e}");
                None
            }
        };
        for &(label, kb, qjl, vb) in &configs {
            let cfg = TurboQuantConfig {
                key_bits: kb,
                key_qjl: qjl,
                value_bits: vb,
                ..TurboQuantConfig::paper_default(&p)
            };
            let t = b.turboquant(&cfg, &p).unwrap();
            let mut cache = t.alloc_cache(batch, hk, ctx).unwrap();
            let s = Event::record(&gpu).unwrap();
            t.compress_inputs(&mut cache, &x).unwrap();
            let e = Event::record(&gpu).unwrap();
            let compress_ms = s.elapsed_ms(&e).unwrap();
            let cache_bytes = cache.bytes_read();
            // copies of the cache so that each launch reads from DRAM
            let sets = (4 * caps.l2_bytes).div_ceil(cache_bytes).clamp(1, 8);
            let mut caches = vec![cache];
            for _ in 1..sets {
                let mut c = t.alloc_cache(batch, hk, ctx).unwrap();
                t.compress_inputs(&mut c, &x).unwrap();
                caches.push(c);
            }
            let prep = t.prepare_decode(&p, &caches[0], None).unwrap();
            let mut out = t.alloc_outputs(&p).unwrap();
            let ms = time_ms(&gpu, |i| {
                t.launch_decode_inputs(&prep, &x, &caches[i % sets], &mut out)
                    .unwrap()
            });
            let gbs = cache_bytes as f64 / (ms as f64 * 1e-3) / 1e9;
            let lean = lean_ms.map_or("n/a".into(), |l| format!("{l:.4}"));
            let vs = lean_ms.map_or("n/a".into(), |l| format!("{:.2}x", l / ms));
            println!(
                "| {batch} x {ctx} | {d} | {label} | {ms:.4} | {:.1} | {gbs:.0} | {:.0}% | {lean} | {:.1} | {vs} |",
                cache_bytes as f64 / 1e6,
                100.0 * gbs / copy_gbs,
                fp16_bytes as f64 / 1e6
            );
            if !first {
                json.push(',');
            }
            first = false;
            write!(
                json,
                "{{\"batch\":{batch},\"ctx\":{ctx},\"hq\":{hq},\"hk\":{hk},\"d\":{d},\"config\":\"{label}\",\"ms\":{ms:.5},\"units\":{},\"sets\":{sets},\"cache_bytes\":{cache_bytes},\"fp16_bytes\":{fp16_bytes},\"lean_ms\":{}}}",
                prep.units,
                lean_ms.map_or("null".into(), |l| format!("{l:.5}"))
            )
            .unwrap();
            // compression: fp16 bytes read (K and V) and compressed bytes written, per second
            compress_rows.push(format!(
                "{{\"batch\":{batch},\"ctx\":{ctx},\"d\":{d},\"config\":\"{label}\",\"ms\":{compress_ms:.4},\"fp16_bytes\":{fp16_bytes},\"cache_bytes\":{cache_bytes}}}"
            ));
            eprintln!(
                "compress {batch} x {ctx} d {d} {label}: {compress_ms:.3} ms, {:.0} GB/s of fp16 K/V read",
                fp16_bytes as f64 / (compress_ms as f64 * 1e-3) / 1e9
            );
        }
    }
    write!(json, "],\"compress\":[{}]}}", compress_rows.join(",")).unwrap();
    match out_path {
        Some(p) => std::fs::write(&p, &json).unwrap(),
        None => println!("{json}"),
    }
}
