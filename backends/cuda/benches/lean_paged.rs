//! GPU benchmark of the Lean device path: paged K/V (pages of 16 and 64, NHD) against contiguous
//! K/V, and the cooperative stream-K launch against a plain launch, in the same run on the same
//! data. Pages are laid out two ways: shuffled at random over the pool (the worst case for DRAM
//! and TLB locality) and in allocation order (page `k` of sequence `b` is pool page
//! `k * batch + b`, what an allocator handing out free pages in order gives when every sequence
//! grows by one page in turn, as vLLM's does for a running batch). Not a test; prints one line
//! per configuration and, with `--out`, JSON records. Each storage runs at its planner's grid
//! (`lean::plan`, `lean::plan_paged`); with `--same-plan` the paged storages run at `lean::plan`'s
//! grid too, the contiguous one's.
//!
//! Method (see /work/.library/device/METHOD.md): K/V filled on the device and copied into the
//! page pool by the append kernel; warm-up; batches of launches captured in a CUDA graph and
//! replayed between CUDA events, the variants interleaved batch by batch so that clock drift
//! hits them alike; the median over batches of the time per launch.
//! The launches of a batch cycle over `sets` copies of the K/V (contiguous buffers and page
//! pools), as an engine's layers do, so that the K/V read by a batch is at least 4x the L2
//! (`--sets N` overrides; `--sets 1`, every launch on the same K/V, was the method before
//! 2026-11-26 and leaves small rows L2-resident). Every layer of a variant shares one workspace,
//! so one page table, as one decode step's layers share the step's table.
//!
//! Usage: `lean_paged [--quick] [--same-plan | --paged-plan | --ctas N | --paged-ctas N] [--sets N]
//! [--window-bytes N] [--ahead always|never] [--paged auto|regs|deep|grid|inplace|ahead]
//! [--only SHAPE:B:CTX] [--contig-on-pool] [--out FILE]` (`--paged-plan`: the contiguous storage at
//! `lean::plan_paged`'s grid too, so that both run one grid; `--ctas N`: every storage at a
//! stream-K grid of N CTAs, `lean::plan_with_ctas`; `--paged-ctas N`: the paged storages alone at
//! N CTAs, contiguous at its planner's grid; `--only` runs one
//! configuration of the full list, e.g. `llama:1:8192`, for a profiler; `--window-bytes N` shuffles
//! each sequence's pages only within windows of N bytes of its K, a probe of how much of the
//! shuffled layouts' cost is address locality; `--paged` picks the paged instance
//! (`ferrattn_cuda::PagedRead`; default `auto`, the library's default),
//! `--ahead always|never` is the older spelling of `--paged ahead|inplace`;
//! `--contig-on-pool`: at batch 1, where the in-order pool of pages of 16 holds the contiguous
//! cache's bytes at the contiguous cache's offsets, the contiguous storage reads that pool's
//! buffers, so that contiguous and in-order paged read the same memory: their ratio is then the
//! kernel's own cost, with no difference of allocation or physical placement in it).
//! `--stamps N` (kernels built with `FERRATTN_LEAN_STAMPS=1` only, a diagnostic build: see
//! `cuda-kernels/lean_decode.cu`): after the timing, each storage runs N more launches one at a
//! time and the per-CTA stamps of each are read back; prints per-step medians over CTAs and
//! launches (cycles of the SM clock, start skew and launch span in ns of %globaltimer) and, with
//! `--stamps-out FILE`, every CTA's raw stamps.

use ferrattn_core::{lean, AttentionProblem, DType, Device};
use ferrattn_cuda::{
    CudaBackend, DeviceBuffer, Event, Graph, KvStorage, LeanInstance, LeanStepPlan, LeanTensors,
    PagedRead, Paging,
};
use rand::{seq::SliceRandom, SeedableRng};
use std::fmt::Write as _;

/// A stamp-derived quantity of one CTA: (label, f(the CTA's 16 words, the launch's first entry
/// in ns)); `None` where the CTA has no such step. Slots as `ferrattn::StampSlot`.
type StampCol = (&'static str, fn(&[u64], u64) -> Option<f64>);
const STAMP_COLS: &[StampCol] = &[
    ("start skew (ns, globaltimer)", |r, g0| {
        Some((r[0] - g0) as f64)
    }),
    ("end after first start (ns)", |r, g0| {
        Some((r[13] - g0) as f64)
    }),
    ("cycles per ns", |r, _| {
        Some((r[12] - r[2]) as f64 / (r[13] - r[0]).max(1) as f64)
    }),
    ("entry -> record in hand (cyc)", |r, _| {
        Some(r[3].wrapping_sub(r[2]) as f64)
    }),
    ("record -> page words in hand", |r, _| {
        (r[4] > r[3] && r[4] < r[5]).then(|| (r[4] - r[3]) as f64)
    }),
    ("entry -> first copy issued", |r, _| {
        Some(r[5].wrapping_sub(r[2]) as f64)
    }),
    ("entry -> prologue issued", |r, _| {
        Some(r[6].wrapping_sub(r[2]) as f64)
    }),
    ("first copy -> stage 0 landed", |r, _| {
        Some(r[7].wrapping_sub(r[5]) as f64)
    }),
    ("entry -> stage 0 landed", |r, _| {
        Some(r[7].wrapping_sub(r[2]) as f64)
    }),
    ("stage 0 -> last stage landed", |r, _| {
        Some(r[8].wrapping_sub(r[7]) as f64)
    }),
    ("  per later stage", |r, _| {
        let u = r[1] >> 32;
        (u > 1).then(|| r[8].wrapping_sub(r[7]) as f64 / (u - 1) as f64)
    }),
    ("waits+barriers, all stages", |r, _| Some(r[14] as f64)),
    ("last stage landed -> computed", |r, _| {
        Some(r[9].wrapping_sub(r[8]) as f64)
    }),
    ("computed -> warps reduced", |r, _| {
        Some(r[10].wrapping_sub(r[9]) as f64)
    }),
    ("reduced -> flags acquired", |r, _| {
        Some(r[11].wrapping_sub(r[10]) as f64)
    }),
    ("flags -> end (partial / merge+out)", |r, _| {
        Some(r[12].wrapping_sub(r[11]) as f64)
    }),
    ("entry -> end (cyc)", |r, _| {
        Some(r[12].wrapping_sub(r[2]) as f64)
    }),
];

fn median(mut x: Vec<f32>) -> f32 {
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let same_plan = args.iter().any(|a| a == "--same-plan");
    let paged_plan = args.iter().any(|a| a == "--paged-plan");
    let contig_on_pool = args.iter().any(|a| a == "--contig-on-pool");
    // the word after `flag`, if any
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let positive = |flag: &str| {
        value(flag)
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n > 0)
    };
    let only = value("--only");
    let stamps_n = positive("--stamps");
    let stamps_out = value("--stamps-out");
    let mut stamps_raw = String::new();
    let out_path = value("--out");
    let sets_arg = positive("--sets");
    let ctas_arg = positive("--ctas");
    let paged_ctas_arg = positive("--paged-ctas");
    // shuffled layouts: permute the pages only within windows of this many bytes of one
    // sequence's K (a locality probe)
    let window_bytes = positive("--window-bytes");
    // `--paged auto|regs|deep|grid|inplace|ahead` (or `--ahead always|never`): the paged instance
    let paged_read = match (value("--paged").as_deref(), value("--ahead").as_deref()) {
        (Some("regs"), _) => PagedRead::Regs,
        (Some("deep"), _) => PagedRead::Deep,
        (Some("grid"), _) => PagedRead::Grid,
        (Some("inplace"), _) | (None, Some("never")) => PagedRead::InPlace,
        (Some("ahead"), _) | (None, Some("always")) => PagedRead::Ahead,
        _ => PagedRead::Auto,
    };
    println!("paged instance: {paged_read:?}");
    let b = CudaBackend::new(0);
    let gpu = match b.gpu() {
        Ok(g) => g.clone(),
        Err(e) => {
            eprintln!("lean_paged: no GPU ({e}); nothing measured");
            return;
        }
    };
    let caps = b.caps().unwrap();
    // (name, batch, heads_q, heads_kv, head_dim, context)
    let mut configs = vec![
        ("llama", 1, 32, 8, 128, 1024),
        ("llama", 1, 32, 8, 128, 8192),
        ("llama", 8, 32, 8, 128, 8192),
        ("llama", 64, 32, 8, 128, 1024),
        ("lean", 1, 56, 56, 64, 65536),
    ];
    if !quick || only.is_some() {
        configs.extend([
            ("llama", 1, 32, 8, 128, 32768),
            ("llama", 64, 32, 8, 128, 8192),
            ("lean", 4, 56, 56, 64, 16384),
        ]);
    }
    let mut json = String::from("[\n");
    println!(
        "{:<6} {:>3} {:>6} {:>4} | {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7} {:>7} {:>7} {:>7}",
        "shape",
        "B",
        "ctx",
        "sets",
        "contig us",
        "page16 us",
        "page64 us",
        "p16 ord",
        "p64 ord",
        "plain us",
        "p16/c",
        "p64/c",
        "p16o/c",
        "p64o/c",
        "coop/pl"
    );
    if let Some(o) = &only {
        configs.retain(|c| format!("{}:{}:{}", c.0, c.1, c.5) == *o);
    }
    for (name, batch, hq, hk, d, ctx) in configs {
        let mut p = AttentionProblem::uniform(batch, 1, ctx, hq, hk, d, d, DType::F16);
        p.seqlens_k = vec![ctx; batch];
        // each storage at its planner's grid (a paged cache keeps the slot-filling grids)
        let mut lp = lean::plan(&p, &caps).unwrap();
        let mut lp_paged = if same_plan {
            lp.clone()
        } else {
            lean::plan_paged(&p, &caps).unwrap()
        };
        if let Some(n) = ctas_arg {
            lp = lean::plan_with_ctas(&p, &caps, n).unwrap();
            lp_paged = lp.clone();
        } else if let Some(n) = paged_ctas_arg {
            lp_paged = lean::plan_with_ctas(&p, &caps, n).unwrap();
        } else if paged_plan {
            lp = lp_paged.clone();
        }
        let kern = b
            .lean_kernels(LeanInstance::new(p.dtype, d, lp.tile_m).unwrap())
            .unwrap();
        kern.set_paged_read(paged_read);
        let row = hk * d * 2;
        // K/V copies (layers) so that a batch of launches reads at least 4x the L2
        let kv_bytes = 2 * batch * ctx * row;
        let sets = sets_arg.unwrap_or_else(|| (4 * caps.l2_bytes).div_ceil(kv_bytes).clamp(1, 64));
        let xs: Vec<_> = (0..sets)
            .map(|i| b.random_inputs(&p, 7 + i as u32, 2.0).unwrap())
            .collect();
        let x = &xs[0];
        let s = gpu.raw_stream();
        // per page layout: the step (one table, shared by every set) and each set's (K, V) pool
        let mut pools = Vec::new();
        for (page, shuffled) in [(16usize, true), (64, true), (16, false), (64, false)] {
            let max_pages = ctx.div_ceil(page);
            let num_pages = batch * max_pages;
            // row b of the table: logical page k of sequence b
            let mut ids: Vec<i32> = (0..num_pages)
                .map(|i| ((i % max_pages) * batch + i / max_pages) as i32)
                .collect();
            if shuffled {
                let mut rng = rand::rngs::StdRng::seed_from_u64(page as u64);
                match window_bytes {
                    None => ids.shuffle(&mut rng),
                    Some(w) => {
                        let pages = (w / (page * row)).max(1);
                        for seq in ids.chunks_mut(max_pages) {
                            for win in seq.chunks_mut(pages) {
                                win.shuffle(&mut rng);
                            }
                        }
                    }
                }
            }
            let paging = Paging::new(page, num_pages, max_pages, ids, &p.seqlens_k).unwrap();
            let fill =
                LeanStepPlan::new(&p, &lp_paged, KvStorage::Paged(paging.clone()), ctx).unwrap();
            let ws = DeviceBuffer::alloc(&gpu, fill.workspace_bytes()).unwrap();
            // SAFETY: a workspace of the fill's size.
            unsafe { kern.upload(&fill, ws.ptr(), s).unwrap() };
            let mut set_pools = Vec::new();
            for xi in &xs {
                let kb = DeviceBuffer::alloc(&gpu, num_pages * page * row).unwrap();
                let vb = DeviceBuffer::alloc(&gpu, num_pages * page * row).unwrap();
                // SAFETY: buffers allocated above for these shapes.
                unsafe {
                    kern.append(
                        &fill,
                        (xi.k().ptr(), xi.v().ptr()),
                        (kb.ptr(), vb.ptr()),
                        ws.ptr(),
                        s,
                    )
                    .unwrap();
                }
                set_pools.push((kb, vb));
            }
            gpu.synchronize().unwrap();
            let step = LeanStepPlan::new(&p, &lp_paged, KvStorage::Paged(paging), 0).unwrap();
            pools.push((step, set_pools));
        }
        let contig = LeanStepPlan::new(&p, &lp, KvStorage::Contiguous, 0).unwrap();
        // pools[2] is the in-order pool of pages of 16: at batch 1 page k is pool page k, the
        // contiguous layout byte for byte
        let contig_kv: Vec<(u64, u64)> = if contig_on_pool && batch == 1 {
            pools[2].1.iter().map(|(k, v)| (k.ptr(), v.ptr())).collect()
        } else {
            xs.iter().map(|xi| (xi.k().ptr(), xi.v().ptr())).collect()
        };
        let o = DeviceBuffer::alloc(&gpu, batch * hq * d * 2).unwrap();
        let lse = DeviceBuffer::alloc(&gpu, batch * hq * 4).unwrap();
        // every variant's workspace holds the largest step's (the contiguous grid may have more
        // CTAs, so more partials, than the paged one under `--paged-ctas`)
        let ws_bytes = pools
            .iter()
            .map(|p| p.0.workspace_bytes())
            .chain([contig.workspace_bytes()])
            .max()
            .unwrap();
        // one workspace per variant, tables uploaded once: (step, each set's (K, V), workspace,
        // cooperative launch)
        type Variant = (LeanStepPlan, Vec<(u64, u64)>, DeviceBuffer, bool);
        let mut variants: Vec<Variant> = Vec::new();
        for (step, set_pools) in &pools {
            variants.push((
                step.clone(),
                set_pools.iter().map(|(k, v)| (k.ptr(), v.ptr())).collect(),
                DeviceBuffer::alloc(&gpu, ws_bytes).unwrap(),
                true,
            ));
        }
        variants.insert(
            0,
            (
                contig.clone(),
                contig_kv.clone(),
                DeviceBuffer::alloc(&gpu, ws_bytes).unwrap(),
                true,
            ),
        );
        variants.push((
            contig,
            contig_kv,
            DeviceBuffer::alloc(&gpu, ws_bytes).unwrap(),
            false,
        ));
        for v in &variants {
            // SAFETY: workspace of at least the step's size.
            unsafe { kern.upload(&v.0, v.2.ptr(), s).unwrap() };
        }
        gpu.synchronize().unwrap();
        // at least 20 launches a batch, whole rounds over the sets
        let per_batch = 20usize.div_ceil(sets) * sets;
        let graphs: Vec<Graph> = variants
            .iter()
            .map(|v| {
                kern.set_cooperative(v.3);
                let g = Graph::capture(&gpu, || {
                    for i in 0..per_batch {
                        let (k, vv) = v.1[i % sets];
                        let t = LeanTensors {
                            q: x.q().ptr(),
                            k,
                            v: vv,
                            o: o.ptr(),
                            lse: lse.ptr(),
                        };
                        // SAFETY: as above.
                        unsafe { kern.run(&v.0, &t, v.2.ptr(), s)? };
                    }
                    Ok(())
                })
                .unwrap();
                kern.set_cooperative(true);
                g
            })
            .collect();
        let mut times = vec![Vec::new(); graphs.len()];
        for g in &graphs {
            g.launch().unwrap();
        }
        for _ in 0..15 {
            for (i, g) in graphs.iter().enumerate() {
                let s0 = Event::record(&gpu).unwrap();
                g.launch().unwrap();
                let e0 = Event::record(&gpu).unwrap();
                times[i].push(s0.elapsed_ms(&e0).unwrap() * 1000.0 / per_batch as f32);
            }
        }
        let t: Vec<f32> = times.into_iter().map(median).collect();
        if let Some(n) = stamps_n {
            let names = ["contig", "p16", "p64", "p16 ord", "p64 ord"];
            for (vi, v) in variants.iter().take(5).enumerate() {
                let ctas = v.0.num_ctas();
                let mut per: Vec<Vec<f64>> = vec![Vec::new(); STAMP_COLS.len()];
                let mut spans = Vec::new();
                for i in 0..n {
                    let (k, vv) = v.1[i % sets];
                    let tt = LeanTensors {
                        q: x.q().ptr(),
                        k,
                        v: vv,
                        o: o.ptr(),
                        lse: lse.ptr(),
                    };
                    // SAFETY: as above.
                    unsafe { kern.run(&v.0, &tt, v.2.ptr(), s).unwrap() };
                    let Some(w) = kern.read_stamps().unwrap() else {
                        println!("--stamps: these kernels were built without FERRATTN_LEAN_STAMPS");
                        return;
                    };
                    let cta = |c: usize| &w[16 * c..16 * c + 16];
                    let g0 = (0..ctas.min(1024)).map(|c| cta(c)[0]).min().unwrap();
                    let g1 = (0..ctas.min(1024)).map(|c| cta(c)[13]).max().unwrap();
                    spans.push(g1.saturating_sub(g0) as f64);
                    for c in 0..ctas.min(1024) {
                        let r = cta(c);
                        let _ = writeln!(
                            stamps_raw,
                            "{name} {batch} {ctx} {} {i} {c} {}",
                            names[vi],
                            r.iter()
                                .map(|x| x.to_string())
                                .collect::<Vec<_>>()
                                .join(" ")
                        );
                        for (j, col) in STAMP_COLS.iter().enumerate() {
                            if let Some(x) = col.1(r, g0) {
                                per[j].push(x);
                            }
                        }
                    }
                }
                let med = |mut x: Vec<f64>, q: f64| {
                    if x.is_empty() {
                        return f64::NAN;
                    }
                    x.sort_by(|a, b| a.total_cmp(b));
                    x[((x.len() - 1) as f64 * q).round() as usize]
                };
                println!(
                    "stamps {name} B={batch} ctx={ctx} {:<7} ({ctas} CTAs, {n} launches): span median {:.0} ns",
                    names[vi],
                    med(spans, 0.5)
                );
                for (j, col) in STAMP_COLS.iter().enumerate() {
                    let x = std::mem::take(&mut per[j]);
                    println!(
                        "  {:<34} p10 {:>9.1}  median {:>9.1}  p90 {:>9.1}  max {:>9.1}",
                        col.0,
                        med(x.clone(), 0.1),
                        med(x.clone(), 0.5),
                        med(x.clone(), 0.9),
                        med(x, 1.0)
                    );
                }
            }
        }
        println!(
            "{name:<6} {batch:>3} {ctx:>6} {sets:>4} | {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} | {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3}",
            t[0], t[1], t[2], t[3], t[4], t[5], t[1] / t[0], t[2] / t[0], t[3] / t[0], t[4] / t[0], t[0] / t[5]
        );
        let _ = writeln!(
            json,
            "  {{\"shape\": \"{name}\", \"batch\": {batch}, \"heads_q\": {hq}, \"heads_kv\": {hk}, \"head_dim\": {d}, \"ctx\": {ctx}, \"sets\": {sets}, \"ctas\": {}, \"paged_ctas\": {}, \"contiguous_us\": {:.3}, \"paged16_us\": {:.3}, \"paged64_us\": {:.3}, \"paged16_ordered_us\": {:.3}, \"paged64_ordered_us\": {:.3}, \"plain_launch_us\": {:.3}}},",
            lp.num_ctas, lp_paged.num_ctas, t[0], t[1], t[2], t[3], t[4], t[5]
        );
    }
    if json.ends_with(",\n") {
        json.truncate(json.len() - 2);
        json.push('\n');
    }
    json.push_str("]\n");
    if let Some(path) = stamps_out {
        std::fs::write(path, stamps_raw).unwrap();
    }
    if let Some(path) = out_path {
        std::fs::write(path, json).unwrap();
    }
}
