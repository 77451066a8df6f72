//! GPU benchmark of context-parallel decode: Lean over each rank's slice, the NCCL exchange and
//! the merge, on every GPU of the machine (one thread and one GPU per rank), against single-GPU
//! Lean over the whole cache on GPU 0, in the same run. Not a test.
//!
//! Shapes (one attention layer of a decode step; a step of the model is `layers` of these):
//! - `llama3-8b`: 32 query / 8 KV heads, d 128 (the whole model on one GPU, tensor parallel 1,
//!   as engines serve it: context parallelism is the only split);
//! - `llama3-70b-tp8`: 8 / 1 heads per GPU, d 128 (70B's 64 / 8 heads under the tensor
//!   parallelism of 8 that engines serve it with; context parallelism splits each of those
//!   head groups' sequences further);
//! - `llama3-70b`: 64 / 8 heads, d 128 (no tensor parallelism: the largest per-GPU KV stream).
//!
//! Contexts 128k, 1M and 512k tokens (in that order), batch 1 and 8, bf16, contiguous K/V filled
//! on the device once per GPU (each configuration reads a prefix of it).
//! Method: warm-up, then batches of back-to-back launches between CUDA events on each rank's
//! stream (eager: NCCL calls and the cooperative Lean launch both capture, but eager keeps the
//! phases separately timeable), all ranks released together by a barrier; the median over
//! batches of the time per step; for CP the slowest rank's median. Phases timed alone: local
//! Lean, the exchange (NCCL, with the scaling pass for reduce-scatter), the merge. The copy
//! ceiling is an eager 2 GiB device-to-device copy on GPU 0 (bytes read plus written); the
//! floor of a run over `R` GPUs is the KV bytes over `R` times that bandwidth.
//!
//! Usage: `cp_decode [--quick] [--out FILE]`

use ferrattn_core::cp::{self, CpPlan, CpRequest, CpShape, Exchange, OutputPlacement};
use ferrattn_core::{lean, AttentionProblem, DType};
use ferrattn_cuda::cp::{CpRank, CpTensors};
use ferrattn_cuda::nccl::{self, Communicator};
use ferrattn_cuda::{
    CudaBackend, DeviceBuffer, Event, KvStorage, LeanInstance, LeanStepPlan, LeanTensors,
};
use std::sync::{mpsc, Arc, Barrier};
use std::time::Instant;

fn median(mut x: Vec<f32>) -> f32 {
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

/// Milliseconds per call of `f`, the median of `batches` batches of `iters` calls.
fn time_ms(
    gpu: &Arc<ferrattn_cuda::Gpu>,
    barrier: Option<&Barrier>,
    iters: usize,
    batches: usize,
    mut f: impl FnMut() -> ferrattn_cuda::Result<()>,
) -> ferrattn_cuda::Result<f32> {
    let mut per = Vec::new();
    for _ in 0..batches {
        if let Some(b) = barrier {
            gpu.synchronize()?;
            b.wait();
        }
        let e0 = Event::record(gpu)?;
        for _ in 0..iters {
            f()?;
        }
        let e1 = Event::record(gpu)?;
        per.push(e0.elapsed_ms(&e1)? / iters as f32);
    }
    Ok(median(per))
}

/// Iterations that make a batch of about 20 ms.
fn iters_for(ms: f32) -> usize {
    ((20.0 / ms.max(1e-3)) as usize).clamp(3, 200)
}

#[derive(Clone, Copy, Default, Debug)]
struct CpTimes {
    step: f32,
    attend: f32,
    exchange: f32,
    merge: f32,
}

/// One configuration: shape name, query heads, KV heads, context, batch.
type Config = (&'static str, usize, usize, usize, usize);

const D: usize = 128;
const DTYPE: DType = DType::BF16;

fn plan_of(c: &Config, ranks: usize, copy_gbs: f64) -> CpPlan {
    let &(_, hq, hk, ctx, batch) = c;
    let shape = CpShape {
        batch,
        seqlen_q: 1,
        heads_q: hq,
        heads_kv: hk,
        head_dim: D,
        dtype: DTYPE,
        causal: false,
    };
    // equal GPUs: the keys split evenly, on 64-token boundaries
    let bw = vec![copy_gbs / 2.0; ranks];
    let req = CpRequest {
        shape,
        kv_lens: cp::split_by_bandwidth(&vec![ctx; batch], &bw, 64).expect("split"),
        bandwidth_gbs: bw,
        output: OutputPlacement::Replicated,
    };
    cp::plan(&req).expect("cp plan")
}

/// Single-GPU Lean over `[batch, ctx]` keys read from the prefix of `x`'s K/V (rank 0 only).
fn single_gpu_ms(
    be: &CudaBackend,
    x: &ferrattn_cuda::DeviceInputs,
    c: &Config,
) -> ferrattn_cuda::Result<f32> {
    let &(_, hq, hk, ctx, batch) = c;
    let gpu = be.gpu()?.clone();
    let p = AttentionProblem::uniform(batch, 1, ctx, hq, hk, D, D, DTYPE);
    let lp = lean::plan(&p, &gpu.caps)?;
    let lk = be.lean_kernels(LeanInstance::new(DTYPE, D, lp.tile_m)?)?;
    let step = LeanStepPlan::new(&p, &lp, KvStorage::Contiguous, 0)?;
    let ws = DeviceBuffer::alloc(&gpu, step.workspace_bytes())?;
    let o = DeviceBuffer::alloc(&gpu, batch * hq * D * 2)?;
    let l = DeviceBuffer::alloc(&gpu, batch * hq * 4)?;
    let t = LeanTensors {
        q: x.q().ptr(),
        k: x.k().ptr(),
        v: x.v().ptr(),
        o: o.ptr(),
        lse: l.ptr(),
    };
    let st = gpu.raw_stream();
    // SAFETY: the prefix of x's K/V holds [batch, ctx, hk, D]; buffers allocated above.
    unsafe { lk.upload(&step, ws.ptr(), st)? };
    let run = || unsafe { lk.run(&step, &t, ws.ptr(), st) };
    run()?;
    let one = time_ms(&gpu, None, 1, 3, run)?;
    time_ms(&gpu, None, iters_for(one), 7, run)
}

/// Rank `r`'s times for `c` (every rank calls it for the same configuration).
fn cp_times(
    be: &CudaBackend,
    comm: &Arc<Communicator>,
    x: &ferrattn_cuda::DeviceInputs,
    plan: &CpPlan,
    r: usize,
    barrier: &Barrier,
) -> ferrattn_cuda::Result<CpTimes> {
    let gpu = be.gpu()?.clone();
    let shape = &plan.request.shape;
    let rank = CpRank::new(be, comm.clone(), shape)?;
    let max_local = plan.local_lens(r).into_iter().max().unwrap_or(0).max(1);
    let step = rank.plan_step(plan, KvStorage::Contiguous, max_local)?;
    let (_, nh) = step.output_heads();
    let o = DeviceBuffer::alloc(&gpu, shape.batch * nh * D * 2)?;
    let l = DeviceBuffer::alloc(&gpu, shape.batch * nh * 4)?;
    let ws = DeviceBuffer::alloc(&gpu, step.workspace_bytes())?;
    let t = CpTensors {
        q: x.q().ptr(),
        k: x.k().ptr(),
        v: x.v().ptr(),
        o: o.ptr(),
        lse: l.ptr(),
    };
    let st = gpu.raw_stream();
    let w = ws.ptr();
    // SAFETY: the prefix of x's K/V holds [batch, max_local, hk, D]; buffers allocated above.
    unsafe { rank.upload(&step, w, st)? };
    let run = || unsafe { rank.run(&step, &t, w, st) };
    for _ in 0..3 {
        run()?;
    }
    // every rank must enqueue the same number of collectives: the count comes from the plan
    // (the slowest rank's predicted attention time plus the exchange and merge, about 20 us),
    // never from a rank's own measurement (2026-11-23: per-rank counts differed on one shape,
    // the surplus all-gathers of one rank waited for collectives the other never issued)
    let predicted_ms = plan.attention_us.iter().cloned().fold(0.0, f64::max) / 1e3 + 0.02;
    let n = iters_for(predicted_ms as f32);
    Ok(CpTimes {
        step: time_ms(&gpu, Some(barrier), n, 7, run)?,
        attend: time_ms(&gpu, Some(barrier), n, 5, || unsafe {
            rank.attend(&step, &t, w, st)
        })?,
        exchange: time_ms(&gpu, Some(barrier), n, 5, || unsafe {
            rank.exchange(&step, w, st)
        })?,
        merge: time_ms(&gpu, Some(barrier), n, 5, || unsafe {
            rank.merge(&step, &t, w, st)
        })?,
    })
}

fn main() {
    let start = Instant::now();
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out_path = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let mut backends = Vec::new();
    for i in 0..64 {
        let b = CudaBackend::new(i);
        if b.gpu().is_err() {
            break;
        }
        backends.push(b);
    }
    if backends.is_empty() {
        eprintln!(
            "cp_decode: no GPU ({}); nothing measured",
            CudaBackend::new(0).gpu().unwrap_err()
        );
        return;
    }
    let nccl = match nccl::library() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("cp_decode: {e}; nothing measured");
            return;
        }
    };
    let ranks = backends.len();
    let gpus: Vec<_> = backends.iter().map(|b| b.gpu().unwrap().clone()).collect();
    let g0 = &gpus[0];
    // copy ceiling on GPU 0
    let copy_gbs = {
        let n = 2usize << 30;
        let src = DeviceBuffer::alloc(g0, n).unwrap();
        let mut dst = DeviceBuffer::alloc(g0, n).unwrap();
        dst.copy_from(&src).unwrap();
        let ms = time_ms(g0, None, 5, 5, || dst.copy_from(&src)).unwrap();
        2.0 * n as f64 / (ms as f64 * 1e6)
    };
    let comms: Vec<Arc<Communicator>> = Communicator::init_all(&gpus)
        .expect("NCCL communicator")
        .into_iter()
        .map(Arc::new)
        .collect();
    println!(
        "cp_decode: {ranks} x {}, NCCL {} ({}), copy ceiling {copy_gbs:.0} GB/s per GPU",
        g0.caps.name, nccl.version, nccl.source
    );
    eprintln!(
        "[{:.1} s] communicator ready",
        start.elapsed().as_secs_f32()
    );
    let shapes: [(&str, usize, usize); 3] = [
        ("llama3-8b", 32, 8),
        ("llama3-70b-tp8", 8, 1),
        ("llama3-70b", 64, 8),
    ];
    let contexts: &[usize] = if quick {
        &[131_072]
    } else {
        &[131_072, 1_048_576, 524_288]
    };
    let mut configs: Vec<Config> = Vec::new();
    for &ctx in contexts {
        for &(name, hq, hk) in &shapes {
            for batch in [1, 8] {
                configs.push((name, hq, hk, ctx, batch));
            }
        }
    }
    let plans: Vec<CpPlan> = configs
        .iter()
        .map(|c| plan_of(c, ranks, copy_gbs))
        .collect();
    // K/V of every GPU filled once, each configuration reads a prefix: [8, max, 8, 128]
    let max_heads = (8, 64, 8);
    let max_ctx = *contexts.iter().max().unwrap();
    let max_local = plans
        .iter()
        .flat_map(|p| (0..ranks).map(move |r| p.local_lens(r).into_iter().max().unwrap_or(0)))
        .max()
        .unwrap_or(1)
        .max(1);
    println!(
        "{:<15} {:>2} {:>8} | {:>9} | {:>9} {:>8} {:>8} {:>8} | {:>6} {:>6} {:>6} | exchange",
        "shape", "B", "ctx", "1 GPU ms", "CP ms", "lean", "nccl", "merge", "eff", "%flr1", "%flrR"
    );
    let barrier = Barrier::new(ranks);
    let (tx, rx) = mpsc::channel::<(usize, usize, CpTimes, Option<f32>)>();
    let mut rows = Vec::new();
    std::thread::scope(|s| {
        for r in 0..ranks {
            let (be, comm, plans, configs, barrier, tx) = (
                &backends[r],
                &comms[r],
                &plans,
                &configs,
                &barrier,
                tx.clone(),
            );
            s.spawn(move || {
                let (b, hq, hk) = max_heads;
                let local = AttentionProblem::uniform(b, 1, max_local, hq, hk, D, D, DTYPE);
                let x = be.random_inputs(&local, 1, 1.0).expect("local K/V");
                let whole = (r == 0).then(|| {
                    let p = AttentionProblem::uniform(b, 1, max_ctx, hq, hk, D, D, DTYPE);
                    be.random_inputs(&p, 2, 1.0).expect("whole K/V")
                });
                if r == 0 {
                    eprintln!("[{:.1} s] K/V filled", start.elapsed().as_secs_f32());
                }
                for (i, (c, plan)) in configs.iter().zip(plans).enumerate() {
                    let t1 = whole
                        .as_ref()
                        .map(|w| single_gpu_ms(be, w, c).expect("single-GPU Lean"));
                    barrier.wait();
                    let t = cp_times(be, comm, &x, plan, r, barrier).expect("cp step");
                    tx.send((i, r, t, t1)).expect("report");
                }
            });
        }
        drop(tx);
        let mut got: Vec<Vec<(usize, CpTimes)>> = vec![Vec::new(); configs.len()];
        let mut single: Vec<f32> = vec![0.0; configs.len()];
        for (i, r, t, t1) in rx {
            if let Some(t1) = t1 {
                single[i] = t1;
            }
            got[i].push((r, t));
            if got[i].len() < ranks {
                continue;
            }
            let &(name, hq, hk, ctx, batch) = &configs[i];
            let plan = &plans[i];
            let times: Vec<CpTimes> = {
                let mut v = got[i].clone();
                v.sort_by_key(|x| x.0);
                v.into_iter().map(|x| x.1).collect()
            };
            let slowest = |f: fn(&CpTimes) -> f32| times.iter().map(f).fold(0f32, f32::max);
            let tr = CpTimes {
                step: slowest(|t| t.step),
                attend: slowest(|t| t.attend),
                exchange: slowest(|t| t.exchange),
                merge: slowest(|t| t.merge),
            };
            let t1 = single[i];
            let kv_bytes = (batch * ctx * hk * D * 2 * DTYPE.size_bytes()) as f64;
            let floor1_ms = kv_bytes / (copy_gbs * 1e6);
            let floor_r_ms = floor1_ms / ranks as f64;
            let eff = t1 as f64 / (ranks as f64 * tr.step as f64);
            println!(
                "{name:<15} {batch:>2} {ctx:>8} | {t1:>9.3} | {:>9.3} {:>8.3} {:>8.3} {:>8.3} | {:>6.2} {:>6.1} {:>6.1} | {:?}",
                tr.step, tr.attend, tr.exchange, tr.merge, eff,
                100.0 * floor1_ms / t1 as f64,
                100.0 * floor_r_ms / tr.step as f64,
                plan.exchange
            );
            eprintln!("[{:.1} s] row {i} done", start.elapsed().as_secs_f32());
            rows.push(format!(
                "  {{\"shape\": \"{name}\", \"heads_q\": {hq}, \"heads_kv\": {hk}, \"head_dim\": {D}, \"dtype\": \"bf16\", \"batch\": {batch}, \"context\": {ctx}, \"ranks\": {ranks}, \"kv_bytes\": {kv_bytes}, \"single_gpu_ms\": {t1}, \"cp_step_ms\": {}, \"cp_lean_ms\": {}, \"cp_exchange_ms\": {}, \"cp_merge_ms\": {}, \"per_rank_step_ms\": {:?}, \"scaling_efficiency\": {eff}, \"floor_1gpu_ms\": {floor1_ms}, \"floor_ranks_ms\": {floor_r_ms}, \"copy_gbs\": {copy_gbs}, \"exchange\": \"{:?}\", \"exchange_bytes_per_rank\": {}}}",
                tr.step, tr.attend, tr.exchange, tr.merge,
                times.iter().map(|t| t.step).collect::<Vec<_>>(),
                plan.exchange,
                match plan.exchange {
                    Exchange::AllGather => plan.bytes.all_gather,
                    Exchange::ReduceScatterHeads => plan.bytes.reduce_scatter_heads.unwrap_or(0),
                }
            ));
            // rewritten after every row: a run stopped by its time limit keeps what it measured
            if let Some(p) = &out_path {
                std::fs::write(p, format!("[\n{}\n]\n", rows.join(",\n"))).expect("write --out");
            }
        }
    });
    if let Some(p) = out_path {
        println!("wrote {p} ({} rows)", rows.len());
    }
}
