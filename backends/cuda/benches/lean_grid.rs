//! GPU benchmark of the Lean stream-K grid size on the rows of the Lean table that are latency
//! bound: the planner's grid against every grid of `k * tiles` CTAs (`k` a power of two) up to the
//! co-resident slots, in the same run on the same data. The planner's small-problem rule
//! (`ferrattn_core::lean::plan`) is read off these numbers; this is not a test.
//!
//! Method (as `ferrattn bench`, docs/GPU.md "Timing method"): K/V filled on the device, input sets
//! rotated so that together they hold at least 4x L2 (a decode reads its cache from DRAM, not
//! from L2), batches of launches captured in a CUDA graph and replayed between CUDA events, the
//! variants interleaved batch by batch, the median over batches of the time per launch.
//!
//! Usage: `lean_grid [--out FILE] [--only SHAPE,B,CTX] [--names lean,pair] [--grids G1,G2,..]
//! [--eager N] [--nvrtc]`. `--grids` adds stream-K grids of those CTA counts (each at most the co-resident
//! slots) to every row; a 0 in the list adds the fixed split of two chunks per tile.
//! `--eager N` launches the planner's grid of the selected rows N times without graphs or timing
//! (for `ncu`).

use ferrattn_core::{lean, AttentionProblem, DType, Device};
use ferrattn_cuda::{
    CudaBackend, DeviceInputs, Event, Graph, KvStorage, LeanInstance, LeanStepPlan, LeanTensors,
};
use std::fmt::Write as _;

fn median(mut x: Vec<f32>) -> f32 {
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out_path = arg(&args, "--out");
    let only = arg(&args, "--only");
    let eager: Option<usize> = arg(&args, "--eager").and_then(|n| n.parse().ok());
    // --nvrtc: the kernels compiled at run time (with FERRATTN_NVRTC_DEFINES), for knob sweeps
    let b = CudaBackend::with_options(
        0,
        ferrattn_cuda::Options {
            force_nvrtc: args.iter().any(|a| a == "--nvrtc"),
            ..Default::default()
        },
    );
    let gpu = match b.gpu() {
        Ok(g) => g.clone(),
        Err(e) => {
            eprintln!("lean_grid: no GPU ({e}); nothing measured");
            return;
        }
    };
    let caps = b.caps().unwrap();
    let slots = caps.compute_units * caps.ctas_per_unit;
    // (shape, batch, heads_q, heads_kv, head_dim, dtype, context): the Lean table's rows at the
    // small end of each shape, and one large row (4 x 65536) for the profiler
    let configs = [
        ("lean", 1, 56, 56, 64, DType::F16, 1024),
        ("lean", 1, 56, 56, 64, DType::F16, 4096),
        ("lean", 1, 56, 56, 64, DType::F16, 16384),
        ("lean", 4, 56, 56, 64, DType::F16, 1024),
        ("lean", 4, 56, 56, 64, DType::F16, 4096),
        ("lean", 16, 56, 56, 64, DType::F16, 1024),
        ("lean", 64, 56, 56, 64, DType::F16, 1024),
        ("lean", 4, 56, 56, 64, DType::F16, 65536),
        ("llama", 1, 32, 8, 128, DType::BF16, 1024),
        ("llama", 1, 32, 8, 128, DType::BF16, 8192),
        ("llama", 1, 32, 8, 128, DType::BF16, 32768),
        ("llama", 8, 32, 8, 128, DType::BF16, 1024),
        ("llama", 8, 32, 8, 128, DType::BF16, 8192),
        ("llama", 32, 32, 8, 128, DType::BF16, 1024),
        ("llama", 64, 32, 8, 128, DType::BF16, 1024),
        ("llama", 128, 32, 8, 128, DType::BF16, 1024),
        // heavy rows the bandwidth rule of the planner changes (fewer tiles than slots)
        ("llama", 8, 32, 8, 128, DType::BF16, 32768),
        ("llama", 32, 32, 8, 128, DType::BF16, 8192),
        ("lean", 4, 56, 56, 64, DType::F16, 262144),
        // the Lean-paper rows below 0.95x on the H200 (d8e3115), and the same bytes read as
        // "pairs": two d64 heads side by side as one d128 KV head of a GQA group of 2 (56 query
        // heads over 28 KV heads), so a CTA reads 256 contiguous bytes per token instead of 128
        ("lean", 1, 56, 56, 64, DType::F16, 65536),
        ("lean", 4, 56, 56, 64, DType::F16, 16384),
        ("pair", 1, 56, 28, 128, DType::F16, 1024),
        ("pair", 1, 56, 28, 128, DType::F16, 4096),
        ("pair", 1, 56, 28, 128, DType::F16, 16384),
        ("pair", 1, 56, 28, 128, DType::F16, 65536),
        ("pair", 4, 56, 28, 128, DType::F16, 1024),
        ("pair", 4, 56, 28, 128, DType::F16, 4096),
        ("pair", 4, 56, 28, 128, DType::F16, 16384),
        ("pair", 4, 56, 28, 128, DType::F16, 65536),
        ("pair", 16, 56, 28, 128, DType::F16, 1024),
    ];
    let names: Option<Vec<String>> =
        arg(&args, "--names").map(|s| s.split(',').map(str::to_string).collect());
    let extra_grids: Vec<usize> = arg(&args, "--grids")
        .map(|s| s.split(',').filter_map(|g| g.parse().ok()).collect())
        .unwrap_or_default();
    let mut json = String::from("[\n");
    for (name, batch, hq, hk, d, dtype, ctx) in configs {
        if names.as_ref().is_some_and(|n| !n.iter().any(|x| x == name)) {
            continue;
        }
        if let Some(o) = &only {
            if *o != format!("{name},{batch},{ctx}") {
                continue;
            }
        }
        let p = AttentionProblem::uniform(batch, 1, ctx, hq, hk, d, d, dtype);
        let planned = lean::plan(&p, &caps).unwrap();
        let space = planned.tile_space(&p);
        let tiles = space.num_tiles();
        let iters = space.total_iters() as usize;
        // (label, plan): the planner's, stream-K over k * tiles CTAs, one per SM and one per slot,
        // and where the tiles outnumber the SMs, one CTA per tile (a fixed split of one chunk)
        let mut variants: Vec<(String, lean::LeanPlan)> = vec![("plan".into(), planned.clone())];
        let mut grids = Vec::new();
        let mut k = 1;
        while k * tiles <= slots.min(iters) {
            grids.push(k * tiles);
            k *= 2;
        }
        grids.push(caps.compute_units.min(iters));
        grids.push(slots.min(iters));
        grids.extend(
            extra_grids
                .iter()
                .copied()
                .filter(|&g| g >= 1 && g <= slots.min(iters)),
        );
        grids.sort_unstable();
        grids.dedup();
        for g in grids {
            variants.push((
                format!("sk{g}"),
                lean::plan_with_ctas(&p, &caps, g).unwrap(),
            ));
        }
        if tiles >= caps.compute_units {
            variants.push((
                format!("fx1({tiles})"),
                lean::plan_fixed_split(&p, &caps, Some(1)).unwrap(),
            ));
        }
        // two chunks per tile, merged by the combine kernel (grids past the co-resident slots)
        if extra_grids.contains(&0) && iters >= 2 * tiles {
            variants.push((
                format!("fx2({})", 2 * tiles),
                lean::plan_fixed_split(&p, &caps, Some(2)).unwrap(),
            ));
        }
        let kern = b
            .lean_kernels(LeanInstance::new(p.dtype, d, planned.tile_m).unwrap())
            .unwrap();
        let kv_bytes: usize = 2 * batch * ctx * hk * d * 2;
        let sets = (4 * caps.l2_bytes).div_ceil(kv_bytes).clamp(1, 64);
        let inputs: Vec<DeviceInputs> = (0..sets)
            .map(|i| b.random_inputs(&p, 11 + i as u32, 2.0).unwrap())
            .collect();
        let outs: Vec<_> = (0..sets).map(|_| b.alloc_outputs(&p).unwrap()).collect();
        let s = gpu.raw_stream();
        let steps: Vec<LeanStepPlan> = variants
            .iter()
            .map(|(_, lp)| LeanStepPlan::new(&p, lp, KvStorage::Contiguous, 0).unwrap())
            .collect();
        let workspaces: Vec<_> = steps
            .iter()
            .map(|st| {
                let ws = ferrattn_cuda::DeviceBuffer::alloc(&gpu, st.workspace_bytes()).unwrap();
                // SAFETY: workspace of the step's size, on this GPU's stream.
                unsafe { kern.upload(st, ws.ptr(), s).unwrap() };
                ws
            })
            .collect();
        let tensors = |i: usize| LeanTensors {
            q: inputs[i].q().ptr(),
            k: inputs[i].k().ptr(),
            v: inputs[i].v().ptr(),
            o: outs[i].o().ptr(),
            lse: outs[i].lse().ptr(),
        };
        gpu.synchronize().unwrap();
        if let Some(n) = eager {
            for i in 0..n {
                // SAFETY: buffers allocated above for this problem.
                unsafe {
                    kern.run(&steps[0], &tensors(i % sets), workspaces[0].ptr(), s)
                        .unwrap()
                };
            }
            gpu.synchronize().unwrap();
            println!(
                "{name} B={batch} ctx={ctx}: {n} eager launches of {} CTAs",
                steps[0].num_ctas()
            );
            continue;
        }
        let per_batch = sets.max(20).div_ceil(sets) * sets;
        let graphs: Vec<Graph> = steps
            .iter()
            .zip(&workspaces)
            .map(|(st, ws)| {
                Graph::capture(&gpu, || {
                    for i in 0..per_batch {
                        // SAFETY: as above.
                        unsafe { kern.run(st, &tensors(i % sets), ws.ptr(), s)? };
                    }
                    Ok(())
                })
                .unwrap()
            })
            .collect();
        for g in &graphs {
            g.launch().unwrap();
        }
        let mut times = vec![Vec::new(); graphs.len()];
        for _ in 0..15 {
            for (i, g) in graphs.iter().enumerate() {
                let s0 = Event::record(&gpu).unwrap();
                g.launch().unwrap();
                let e0 = Event::record(&gpu).unwrap();
                times[i].push(s0.elapsed_ms(&e0).unwrap() * 1000.0 / per_batch as f32);
            }
        }
        let t: Vec<f32> = times.into_iter().map(median).collect();
        let best = t.iter().copied().fold(f32::INFINITY, f32::min);
        let mut line = format!(
            "{name:<6} B={batch:<3} ctx={ctx:<6} tiles={tiles:<4} iters={iters:<6} plan={:<4}:",
            planned.num_ctas
        );
        for ((label, lp), us) in variants.iter().zip(&t) {
            let _ = write!(
                line,
                " {label}[{}]={us:.2}{}",
                lp.num_ctas,
                if *us == best { "*" } else { "" }
            );
        }
        println!("{line}");
        let cells: Vec<String> = variants
            .iter()
            .zip(&t)
            .map(|((label, lp), us)| format!("[\"{label}\", {}, {us:.3}]", lp.num_ctas))
            .collect();
        let _ = writeln!(
            json,
            "  {{\"shape\": \"{name}\", \"batch\": {batch}, \"heads_q\": {hq}, \"heads_kv\": {hk}, \"head_dim\": {d}, \"ctx\": {ctx}, \"tiles\": {tiles}, \"iters\": {iters}, \"planned_ctas\": {}, \"sets\": {sets}, \"variants\": [{}]}},",
            planned.num_ctas,
            cells.join(", ")
        );
    }
    if json.ends_with(",\n") {
        json.truncate(json.len() - 2);
        json.push('\n');
    }
    json.push_str("]\n");
    if let Some(path) = out_path {
        std::fs::write(path, json).unwrap();
    }
}
