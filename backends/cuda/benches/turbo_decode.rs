//! TurboAttention decode shapes on the GPU, for quick looks and profilers (`ncu`): a cache of
//! `CONTEXT - 37` tokens per sequence (full blocks plus a partly filled INT8 buffer, as the
//! suite's rows) compressed from device-filled K/V, then the decode launch and its combine under
//! the automatic schedule, `--iters` per CUDA graph, replayed between events over enough caches
//! to exceed 4x L2; the median of 9 replays. Both decode instances for groups of at most 4 query
//! heads, bit-exact (`Options::exact_turbo_decode`; `g4`: `turbo_decode_g4_*`; `full`:
//! `turbo_decode_*`, with `Options::turbo_decode_full_rows`), their fast-contract twins
//! (`g4fast`, `fullfast`: `Options::fast_turbo_decode`), and `default` (the backend's default:
//! `g4fast` on sm_90, `g4` elsewhere; on sm_90 with a 2-bit head and a grid that fills the GPU
//! `turbo_decode_g4_fast_mixed_*`, `ferrattn_cuda::turbo::decode_branches_policy`), and
//! `g4fastswitch` / `g4fastbranches`: the fast g4 instance with
//! `Options::turbo_decode_branches` forced off / on (the two kernels of the default's choice,
//! timed in one binary). Each line names the decode kernel that ran. Not a test and not the suite: `ferrattn bench --algo turbo`
//! gives the documented rows, checked and beside SDPA.
//!
//! Usage: `turbo_decode BATCH CONTEXT [BATCH CONTEXT ...] [--bits int4,mixed] [--iters N]
//! [--nvrtc] [--only default,g4,full,g4fast,fullfast,g4fastswitch,g4fastbranches] [--units auto,N,bal,bal:N,...] [--costs B:S,...]` (`--units`: the automatic schedule and/or
//! stream-K over N warps, to sweep the schedule; `bal` / `bal:N`: `DecodeSchedule::Balanced` over the
//! automatic unit count / N, once for each `--costs` entry (buffer tile and segment in sixteenths of a
//! cache tile; default `DECODE_COSTS`)) (Llama-3-8B heads: 32 query, 8 KV, d 128, bf16). Prints one line
//! per shape, cache and instance. `--nvrtc` compiles the kernels at run time, where
//! `FERRATTN_NVRTC_DEFINES` can change compile-time constants (e.g.
//! `-DFERRATTN_TURBO_DECODE_G4_BLOCKS=5`) between runs.

use ferrattn_core::turbo::{KvBits, TurboConfig};
use ferrattn_core::{AttentionProblem, DType};
use ferrattn_cuda::turbo::{plan_decode, DecodeCosts, DecodeSchedule, DECODE_COSTS};
use ferrattn_cuda::{CudaBackend, Event, Graph, Options};

const TAIL: usize = 37;
const HQ: usize = 32;
const HK: usize = 8;
const D: usize = 128;

/// A schedule to time: the automatic one, a given one, or [`DecodeSchedule::Balanced`] over the
/// automatic schedule's unit count (`None`) or a given one.
#[derive(Clone, Copy)]
enum Sched {
    Auto,
    Fixed(DecodeSchedule),
    Balanced(Option<usize>, DecodeCosts),
}

struct Timed {
    /// Units (warps) the plan launched.
    used: usize,
    ms: f32,
    bytes: usize,
    schedule: DecodeSchedule,
    /// The decode kernel's name.
    kernel: String,
}

fn time_one(
    b: &CudaBackend,
    batch: usize,
    ctx: usize,
    bits: &[u8],
    iters: usize,
    schedule: Sched,
) -> ferrattn_cuda::Result<Timed> {
    let gpu = b.gpu()?.clone();
    let dtype = DType::BF16;
    let len = ctx - TAIL;
    let mut pk = AttentionProblem::uniform(batch, 1, ctx, HQ, HK, D, D, dtype);
    pk.seqlens_k = vec![len; batch];
    let x = b.random_inputs(&pk, 11, 2.0)?;
    let pq = AttentionProblem::uniform(batch, 1, 1, HQ, HK, D, D, dtype);
    let q = b.random_inputs(&pq, 13, 2.0)?;
    let mut out = b.alloc_outputs(&pq)?;
    let cfg = TurboConfig {
        kv_bits: KvBits::Int4,
        ..TurboConfig::default()
    };
    let prep = b.turbo_prepare_prefill(&cfg, &pk)?;
    let lens = vec![len; batch];
    let mut caches = vec![b.turbo_alloc_cache(batch, HK, D, bits.to_vec(), ctx + 64)?];
    b.turbo_compress(&prep, &x, &lens, &mut caches[0])?;
    let mem = caches[0].memory();
    let bytes = mem.compressed_bytes + mem.buffer_bytes;
    let sets = (4 * gpu.caps.l2_bytes).div_ceil(bytes.max(1)).clamp(1, 16);
    for _ in 1..sets {
        let mut c = b.turbo_alloc_cache(batch, HK, D, bits.to_vec(), ctx + 64)?;
        b.turbo_compress(&prep, &x, &lens, &mut c)?;
        caches.push(c);
    }
    let schedule = match schedule {
        Sched::Fixed(s) => s,
        Sched::Auto => b.turbo_auto_schedule_for(&lens, HQ, HK, dtype, D)?,
        Sched::Balanced(units, costs) => {
            let units = match (units, b.turbo_auto_schedule_for(&lens, HQ, HK, dtype, D)?) {
                (Some(n), _) => n,
                (None, DecodeSchedule::StreamK(n) | DecodeSchedule::Balanced { units: n, .. }) => n,
                (None, DecodeSchedule::PerTile) => batch * HK,
            };
            DecodeSchedule::Balanced { units, costs }
        }
    };
    let (kernel, used) = {
        let pl = plan_decode(caches[0].lens(), &vec![0; batch], HQ, HK, schedule)?;
        let kernel = b.turbo_decode_instance_name(dtype, D, HQ / HK, bits, pl.grid_ctas())?;
        (kernel, pl.num_ctas())
    };
    let preps = caches
        .iter()
        .map(|c| {
            let pl = plan_decode(c.lens(), &vec![0; batch], HQ, HK, schedule)?;
            b.turbo_prepare_decode(pl, dtype, c)
        })
        .collect::<ferrattn_cuda::Result<Vec<_>>>()?;
    let mut launch = |i: usize| {
        b.turbo_launch_decode(&preps[i], &cfg, &caches[i], &q, &mut out, pq.softmax_scale)
    };
    for i in 0..sets {
        launch(i)?;
    }
    gpu.synchronize()?;
    let graph = Graph::capture(&gpu, || (0..iters).try_for_each(|i| launch(i % sets)))?;
    graph.launch()?;
    let mut ts = vec![];
    for _ in 0..9 {
        let s = Event::record(&gpu)?;
        graph.launch()?;
        let e = Event::record(&gpu)?;
        ts.push(s.elapsed_ms(&e)? / iters as f32);
    }
    ts.sort_by(|a, b| a.total_cmp(b));
    Ok(Timed {
        used,
        ms: ts[ts.len() / 2],
        bytes,
        schedule,
        kernel,
    })
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
    if pos.is_empty() || !pos.len().is_multiple_of(2) || pos.chunks(2).any(|s| s[1] <= TAIL) {
        eprintln!(
            "usage: turbo_decode BATCH CONTEXT [BATCH CONTEXT ...] [--bits int4,mixed] [--iters N]"
        );
        std::process::exit(2);
    }
    let bits_list = flag("--bits").unwrap_or_else(|| "int4,mixed".into());
    let iters: usize = flag("--iters").and_then(|s| s.parse().ok()).unwrap_or(20);
    let nvrtc = args.iter().any(|a| a == "--nvrtc");
    let only = flag("--only");
    // --costs B:S,...: DecodeSchedule::Balanced with the buffer tile costing B and a segment S
    // (sixteenths of a cache tile; a cache tile 16), one schedule each for every `bal` entry
    let costs: Vec<DecodeCosts> = match flag("--costs") {
        None => vec![DECODE_COSTS],
        Some(c) => c
            .split(',')
            .map(|e| {
                let v: Vec<u64> = e.split(':').filter_map(|x| x.parse().ok()).collect();
                if v.len() != 2 {
                    eprintln!("turbo_decode: bad --costs entry {e:?} (BUFFER:SEGMENT)");
                    std::process::exit(2);
                }
                DecodeCosts {
                    tile: 16,
                    buffer_tile: v[0],
                    segment: v[1],
                }
            })
            .collect(),
    };
    let schedules: Vec<Sched> = flag("--units")
        .unwrap_or_else(|| "auto".into())
        .split(',')
        .flat_map(|u| {
            let bal = |units: Option<usize>| {
                costs
                    .iter()
                    .map(|&c| Sched::Balanced(units, c))
                    .collect::<Vec<_>>()
            };
            match u {
                "auto" => vec![Sched::Auto],
                "bal" => bal(None),
                n => match n.strip_prefix("bal:").unwrap_or(n).parse::<usize>() {
                    Ok(k) if k > 0 && n.starts_with("bal:") => bal(Some(k)),
                    Ok(k) if k > 0 => vec![Sched::Fixed(DecodeSchedule::StreamK(k))],
                    _ => {
                        eprintln!(
                            "turbo_decode: bad --units entry {n:?} (auto, bal, bal:N or a warp count)"
                        );
                        std::process::exit(2);
                    }
                },
            }
        })
        .collect();
    // g4 / full: the bit-exact instances (exact_turbo_decode; the default on sm_90 is the fast
    // contract), g4fast / fullfast: the fast-contract ones, default: the backend's default
    let g4 = CudaBackend::with_options(
        0,
        Options {
            exact_turbo_decode: true,
            force_nvrtc: nvrtc,
            ..Options::default()
        },
    );
    if let Err(e) = g4.gpu() {
        eprintln!("turbo_decode: no GPU ({e}); nothing measured");
        return;
    }
    let full = CudaBackend::with_options(
        0,
        Options {
            turbo_decode_full_rows: true,
            exact_turbo_decode: true,
            force_nvrtc: nvrtc,
            ..Options::default()
        },
    );
    let g4fast = CudaBackend::with_options(
        0,
        Options {
            fast_turbo_decode: true,
            force_nvrtc: nvrtc,
            ..Options::default()
        },
    );
    let fullfast = CudaBackend::with_options(
        0,
        Options {
            fast_turbo_decode: true,
            turbo_decode_full_rows: true,
            force_nvrtc: nvrtc,
            ..Options::default()
        },
    );
    let default = CudaBackend::with_options(
        0,
        Options {
            force_nvrtc: nvrtc,
            ..Options::default()
        },
    );
    let g4fastswitch = CudaBackend::with_options(
        0,
        Options {
            fast_turbo_decode: true,
            turbo_decode_branches: Some(false),
            force_nvrtc: nvrtc,
            ..Options::default()
        },
    );
    let g4fastbranches = CudaBackend::with_options(
        0,
        Options {
            fast_turbo_decode: true,
            turbo_decode_branches: Some(true),
            force_nvrtc: nvrtc,
            ..Options::default()
        },
    );
    for s in pos.chunks(2) {
        let (batch, ctx) = (s[0], s[1]);
        for name in bits_list.split(',') {
            let bits: Vec<u8> = match name {
                "int4" => vec![4; HK],
                "mixed" => (0..HK).map(|h| if h % 2 == 0 { 4 } else { 2 }).collect(),
                other => {
                    eprintln!("turbo_decode: bad --bits entry {other:?} (int4, mixed)");
                    std::process::exit(2);
                }
            };
            for (inst, b) in [
                ("default", &default),
                ("g4", &g4),
                ("full", &full),
                ("g4fast", &g4fast),
                ("fullfast", &fullfast),
                ("g4fastswitch", &g4fastswitch),
                ("g4fastbranches", &g4fastbranches),
            ] {
                // without --only: the two bit-exact instances, as before the fast ones existed
                let wanted = match only.as_deref() {
                    Some(o) => o.split(',').any(|x| x == inst),
                    None => inst == "g4" || inst == "full",
                };
                if !wanted {
                    continue;
                }
                for &sched in &schedules {
                    match time_one(b, batch, ctx, &bits, iters, sched) {
                    Ok(t) => println!(
                        "turbo decode B={batch} ctx={ctx} {name} {inst}{}: {:.1} us per step, {:.0} GB/s of {:.1} MB, {:?} ({} units), {}",
                        if nvrtc { " (nvrtc)" } else { "" },
                        t.ms * 1e3,
                        t.bytes as f64 / (t.ms as f64 * 1e-3) / 1e9,
                        t.bytes as f64 / 1e6,
                        t.schedule,
                        t.used,
                        t.kernel
                    ),
                    Err(e) => println!("turbo decode B={batch} ctx={ctx} {name} {inst}: error: {e}"),
                }
                }
            }
        }
    }
}
