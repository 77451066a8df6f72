//! One TurboQuant decode shape on the GPU, for profilers (`ncu`) and quick looks: the cache is
//! compressed once from device-filled K/V, then the decode step (query preparation, fused decode,
//! merge) is launched `--iters` times and replayed from a CUDA graph between events. Not a test
//! and not the suite: `ferrattn bench --algo turboquant` gives the documented rows, checked and
//! beside their baselines. Prints one line per configuration.
//!
//! Usage: `turboquant_decode BATCH CONTEXT [--config k4q-v3,k4-v3,...] [--iters N] [--units N]
//! [--sets N] [--no-pdl] [--head-dim D]` (`kBq-vC`: B key bits with QJL, `kB-vC` without; Llama-3-8B
//! heads, d 128 or `--head-dim 64`, f16). `--units`: stream-K width (default: the engine's); `--sets`: caches compressed from the
//! same K/V and rotated over the graph's steps, as layers would be (default 1: one cache, which
//! can sit in L2 when it is smaller); `--no-pdl`: plain stream order instead of programmatic
//! dependent launch. The line ends with the decode's warps per CTA and where the merge ran
//! (`merge fused`: inside the decode, opt-in at small work; `merge kernel`), with the CTA's dynamic shared
//! memory. Diagnostic switches of the
//! engine (environment): `FERRATTN_TQ_UNIT_WARPS=4..7` (the 8-row decode's CTA size at every
//! size), `FERRATTN_TQ_PREPARE_PDL=0` (the prepare in plain stream order), `FERRATTN_TQ_EARLY=0`,
//! `FERRATTN_TQ_PREPARE=v1|spread`, `FERRATTN_TQ_MERGE_WARPS=8|16`, `FERRATTN_TQ_PDL=0`,
//! `FERRATTN_TQ_FUSED=1` (the merge inside the decode for the 7-warp small-work CTAs),
//! `FERRATTN_TQ_ONE_PER_SM=0` (7-warp CTAs not padded to one per SM where two fit),
//! `FERRATTN_TQ_ROW_SPLIT=1|2|4|8|16` (the merge's CTAs per output tile).
//! Under ncu: the first `3 x configs` launches are the warm-up calls, one step per config.

use ferrattn_core::turboquant::TurboQuantConfig;
use ferrattn_core::{AttentionProblem, DType};
use ferrattn_cuda::{CudaBackend, Event, Graph};

fn parse_config(s: &str) -> Option<(u8, bool, u8)> {
    let (k, v) = s.split_once("-v")?;
    let k = k.strip_prefix('k')?;
    let (kb, qjl) = match k.strip_suffix('q') {
        Some(b) => (b, true),
        None => (k, false),
    };
    Some((kb.parse().ok()?, qjl, v.parse().ok()?))
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
    let (batch, ctx) = match pos[..] {
        [b, c] => (b, c),
        _ => {
            eprintln!("usage: turboquant_decode BATCH CONTEXT [--config k4q-v3,...] [--iters N]");
            std::process::exit(2);
        }
    };
    let configs = flag("--config").unwrap_or_else(|| "k4q-v3".into());
    let iters: usize = flag("--iters").and_then(|s| s.parse().ok()).unwrap_or(20);
    let units: Option<usize> = flag("--units").and_then(|s| s.parse().ok());
    let sets: usize = flag("--sets")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let pdl = !args.iter().any(|a| a == "--no-pdl");
    let d: usize = flag("--head-dim")
        .and_then(|s| s.parse().ok())
        .unwrap_or(128);
    let b = CudaBackend::new(0);
    let gpu = match b.gpu() {
        Ok(g) => g.clone(),
        Err(e) => {
            eprintln!("turboquant_decode: no GPU ({e}); nothing measured");
            return;
        }
    };
    let p = AttentionProblem::uniform(batch, 1, ctx, 32, 8, d, d, DType::F16);
    let x = b.random_inputs(&p, 5, 2.0).expect("device inputs");
    for name in configs.split(',') {
        let Some((key_bits, key_qjl, value_bits)) = parse_config(name) else {
            eprintln!("turboquant_decode: bad config {name:?} (e.g. k4q-v3)");
            std::process::exit(2);
        };
        let cfg = TurboQuantConfig {
            key_bits,
            key_qjl,
            value_bits,
            ..TurboQuantConfig::paper_default(&p)
        };
        let run = || -> ferrattn_cuda::Result<(f32, usize, usize, usize, bool, usize)> {
            let mut tq = b.turboquant(&cfg, &p)?;
            tq.set_programmatic_launch(pdl);
            let mut caches = vec![];
            let mut preps = vec![];
            for _ in 0..sets {
                let mut cache = tq.alloc_cache(batch, 8, ctx)?;
                tq.compress_inputs(&mut cache, &x)?;
                preps.push(tq.prepare_decode(&p, &cache, units)?);
                caches.push(cache);
            }
            let mut out = tq.alloc_outputs(&p)?;
            for (prep, cache) in preps.iter().zip(&caches) {
                tq.launch_decode_inputs(prep, &x, cache, &mut out)?;
            }
            gpu.synchronize()?;
            let graph = Graph::capture(&gpu, || {
                (0..iters).try_for_each(|i| {
                    tq.launch_decode_inputs(&preps[i % sets], &x, &caches[i % sets], &mut out)
                })
            })?;
            graph.launch()?;
            let mut ts = vec![];
            for _ in 0..9 {
                let s = Event::record(&gpu)?;
                graph.launch()?;
                let e = Event::record(&gpu)?;
                ts.push(s.elapsed_ms(&e)? / iters as f32);
            }
            ts.sort_by(|a, b| a.total_cmp(b));
            Ok((
                ts[ts.len() / 2],
                caches[0].bytes_read(),
                preps[0].units,
                preps[0].warps_per_cta(),
                preps[0].merge_fused(),
                preps[0].smem_bytes(),
            ))
        };
        match run() {
            Ok((ms, bytes, units, warps, fused, smem)) => println!(
                "turboquant B={batch} ctx={ctx} d={d} {name}: {ms:.4} ms per step, {:.0} GB/s of {:.1} MB compressed, {units} units, {sets} sets, pdl {pdl}, {warps}-warp CTAs of {smem} B, merge {}",
                bytes as f64 / (ms as f64 * 1e-3) / 1e9,
                bytes as f64 / 1e6,
                if fused { "fused" } else { "kernel" }
            ),
            Err(e) => println!("turboquant B={batch} ctx={ctx} {name}: error: {e}"),
        }
    }
}
