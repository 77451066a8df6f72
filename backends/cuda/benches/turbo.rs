//! GPU benchmark of TurboAttention on CUDA: prefill (Alg. 1, INT8 tensor cores + SAS) at head
//! dim 128, causal and not, batch x length 4x1k, 4x4k, 1x16k, 1x32k; decode (Alg. 2) over 4-bit and
//! mixed 2/4-bit caches. Not a test: prints a table and writes JSON that
//! `benches/turbo_sdpa.py` reads to time PyTorch SDPA (cuDNN and flash backends) on the same
//! shapes in the same command.
//!
//! Method (/work/.library/device/METHOD.md): inputs filled on the device (uniform in [-2, 2)),
//! warm-up launches, then batches of back-to-back launches between CUDA events; the median over
//! batches of the time per call. Prefill is timed whole (K/V quantization pre-pass + attention)
//! and attention alone, and once more writing the compressed cache. Decode is timed for the
//! decode + combine launches over a prepared plan (the step's append is not included).
//! Also measured: a device-to-device copy (bytes read + written), the bandwidth ceiling.
//!
//! Decode shapes: 1 GB of fp16-equivalent KV and beyond (batch 1-64, context 4k-128k) plus two
//! small ones; each with a 4-bit and a mixed 2/4-bit cache, under the automatic schedule
//! (stream-K over every resident decode unit).
//!
//! Usage: `turbo [--quick] [--prefill-only | --decode-only] [--shape B,CTX] [--bits int4|mixed]
//! [--out FILE]`

use ferrattn_core::turbo::{KvBits, TurboConfig};
use ferrattn_core::{AttentionProblem, DType, Device};
use ferrattn_cuda::turbo::{plan_decode, DecodeSchedule};
use ferrattn_cuda::{CudaBackend, DeviceBuffer, Event};
use std::fmt::Write as _;

fn median(mut x: Vec<f32>) -> f32 {
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

/// Milliseconds per call of `f`, calls enqueued back to back between two events; median over
/// batches (the Lean benchmark's method).
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
    let decode_only = args.iter().any(|a| a == "--decode-only");
    let prefill_only = args.iter().any(|a| a == "--prefill-only");
    // `--shape B,CTX` and `--bits int4|mixed`: one decode case (for a profiler)
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let only_shape: Option<(usize, usize)> = arg("--shape").map(|v| {
        let (b, c) = v.split_once(',').expect("--shape B,CTX");
        (b.parse().unwrap(), c.parse().unwrap())
    });
    let only_bits = arg("--bits");
    let out_path = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let b = CudaBackend::new(0);
    let gpu = match b.gpu() {
        Ok(g) => g.clone(),
        Err(e) => {
            println!("SKIPPED turbo bench: {e}");
            return;
        }
    };
    let caps = b.caps().unwrap();
    eprintln!("{}", ferrattn_cuda::describe(&b));
    let copy_bytes = 2usize << 30;
    let src = DeviceBuffer::alloc(&gpu, copy_bytes).unwrap();
    let mut dst = DeviceBuffer::alloc(&gpu, copy_bytes).unwrap();
    let copy_ms = time_ms(&gpu, |_| dst.copy_from(&src).unwrap());
    let copy_gbs = 2.0 * copy_bytes as f64 / (copy_ms as f64 * 1e-3) / 1e9;
    drop((src, dst));
    eprintln!("device copy: {copy_gbs:.0} GB/s (read + write, 2 GiB)");

    let mut json = String::new();
    let _ = write!(
        json,
        "{{\"device\":{:?},\"sms\":{},\"copy_gbs\":{copy_gbs:.1},\"commit\":{:?},\"kernels\":{:?},\"prefill\":[",
        caps.name,
        caps.compute_units,
        std::env::var("FERRATTN_COMMIT").unwrap_or_default(),
        ferrattn_cuda::BUILD_NOTE
    );
    // ---- prefill: Llama-3-8B heads (32 query, 8 KV), head dim 128, bf16 ----
    let (hq, hk, d, dtype) = (32usize, 8usize, 128usize, DType::BF16);
    let shapes: &[(usize, usize)] = if decode_only {
        &[]
    } else if quick {
        &[(4, 1024)]
    } else {
        &[(4, 1024), (4, 4096), (1, 16384), (1, 32768)]
    };
    let cfg = TurboConfig {
        kv_bits: KvBits::Int4,
        ..TurboConfig::default()
    };
    let mut first = true;
    eprintln!("prefill (hq {hq}, hk {hk}, d {d}, {dtype}): batch x len, causal, ms total / attention only / with cache, TFLOP/s (total)");
    for &(batch, len) in shapes {
        for causal in [false, true] {
            let mut p = AttentionProblem::uniform(batch, len, len, hq, hk, d, d, dtype);
            p.causal = causal;
            let x = b.random_inputs(&p, 7, 2.0).unwrap();
            let prep = b.turbo_prepare_prefill(&cfg, &p).unwrap();
            let mut out = b.alloc_outputs(&p).unwrap();
            let total = time_ms(&gpu, |_| {
                b.turbo_launch_prefill(&prep, &x, &mut out, None).unwrap()
            });
            // attention alone: the pre-pass once, then the attention launches
            b.turbo_launch_prefill(&prep, &x, &mut out, None).unwrap();
            let attn = time_ms(&gpu, |_| {
                b.turbo_prefill_attention_only(&prep, &x, &mut out).unwrap()
            });
            let mut cache = b.turbo_alloc_cache(batch, hk, d, vec![4; hk], len).unwrap();
            let with_cache = time_ms(&gpu, |_| {
                cache.reset().unwrap();
                b.turbo_launch_prefill(&prep, &x, &mut out, Some(&mut cache))
                    .unwrap()
            });
            gpu.synchronize().unwrap();
            let flops = 4.0 * (batch * hq * len * len * d) as f64 * if causal { 0.5 } else { 1.0 };
            let tf = |ms: f32| flops / (ms as f64 * 1e-3) / 1e12;
            eprintln!(
                "  {batch} x {len:5} causal {causal:5}: {total:8.3} / {attn:8.3} / {with_cache:8.3} ms, {:6.1} TFLOP/s ({:6.1} attention only)",
                tf(total),
                tf(attn)
            );
            if !first {
                json.push(',');
            }
            first = false;
            let _ = write!(
                json,
                "{{\"batch\":{batch},\"len\":{len},\"hq\":{hq},\"hk\":{hk},\"d\":{d},\"dtype\":\"{dtype}\",\"causal\":{causal},\"total_ms\":{total:.5},\"attention_ms\":{attn:.5},\"with_cache_ms\":{with_cache:.5},\"flops\":{flops:.0}}}"
            );
        }
    }
    json.push_str("],\"decode\":[");
    // ---- decode: one query token per sequence over a compressed cache ----
    let decode_shapes: &[(usize, usize)] = if prefill_only {
        &[]
    } else if quick {
        &[(4, 4096)]
    } else {
        &[
            (1, 16384),
            (4, 16384),
            (64, 4096),
            (16, 16384),
            (8, 32768),
            (2, 131072),
            (32, 32768),
            (8, 131072),
        ]
    };
    first = true;
    eprintln!(
        "decode (hq {hq}, hk {hk}, d {d}, {dtype}): batch x ctx, bits, schedule (units = warps), ms, cache GB/s"
    );
    let decode_shapes: Vec<(usize, usize)> = match only_shape {
        Some(sh) => vec![sh],
        None => decode_shapes.to_vec(),
    };
    for &(batch, ctx) in &decode_shapes {
        let pctx = AttentionProblem::uniform(batch, 1, ctx, hq, hk, d, d, dtype);
        let x = b.random_inputs(&pctx, 11, 2.0).unwrap();
        let pq = AttentionProblem::uniform(batch, 1, 1, hq, hk, d, d, dtype);
        let qx = b.random_inputs(&pq, 13, 2.0).unwrap();
        let mut out = b.alloc_outputs(&pq).unwrap();
        let prep = b.turbo_prepare_prefill(&cfg, &pctx).unwrap();
        for (label, bits) in [
            ("int4", vec![4u8; hk]),
            (
                "mixed",
                (0..hk).map(|h| if h % 2 == 0 { 4 } else { 2 }).collect(),
            ),
        ] {
            if only_bits.as_deref().is_some_and(|o| o != label) {
                continue;
            }
            let mut cache = b.turbo_alloc_cache(batch, hk, d, bits, ctx + 64).unwrap();
            // ctx - 37 tokens: full blocks and a partly filled INT8 buffer
            let lens = vec![ctx - 37; batch];
            b.turbo_compress(&prep, &x, &lens, &mut cache).unwrap();
            let mem = cache.memory();
            {
                let sched = b
                    .turbo_auto_schedule_for(cache.lens(), hq, hk, dtype, d)
                    .unwrap();
                let plan = plan_decode(cache.lens(), &vec![0; batch], hq, hk, sched).unwrap();
                let ctas = plan.num_ctas();
                let prep_d = b.turbo_prepare_decode(plan, dtype, &cache).unwrap();
                let ms = time_ms(&gpu, |_| {
                    b.turbo_launch_decode(&prep_d, &cfg, &cache, &qx, &mut out, pq.softmax_scale)
                        .unwrap()
                });
                gpu.synchronize().unwrap();
                let bytes = mem.compressed_bytes + mem.buffer_bytes;
                let gbs = bytes as f64 / (ms as f64 * 1e-3) / 1e9;
                let sname = match sched {
                    DecodeSchedule::PerTile => "per-tile".to_string(),
                    DecodeSchedule::StreamK(n) => format!("stream-k {n}"),
                };
                eprintln!(
                    "  {batch:2} x {ctx:6} {label:5} {sname:24} ({ctas:4} units): {ms:8.4} ms, {gbs:6.0} GB/s of {:.1} MB cache ({:.2}x smaller than fp16)",
                    bytes as f64 / 1e6,
                    mem.compression_ratio
                );
                if !first {
                    json.push(',');
                }
                first = false;
                let _ = write!(
                    json,
                    "{{\"batch\":{batch},\"ctx\":{},\"hq\":{hq},\"hk\":{hk},\"d\":{d},\"dtype\":\"{dtype}\",\"bits\":\"{label}\",\"schedule\":\"{sname}\",\"ctas\":{ctas},\"ms\":{ms:.5},\"cache_bytes\":{bytes},\"fp16_bytes\":{}}}",
                    ctx - 37,
                    mem.fp16_bytes
                );
            }
        }
    }
    json.push_str("]}");
    match out_path {
        Some(p) => std::fs::write(&p, &json).unwrap(),
        None => println!("{json}"),
    }
}
