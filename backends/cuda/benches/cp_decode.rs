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
//! Contexts 128k, 512k and 1M tokens, batch 1 and 8, bf16, contiguous K/V filled on the device.
//! Method: warm-up, then batches of back-to-back launches between CUDA events on each rank's
//! stream (eager: NCCL calls and the cooperative Lean launch both capture, but eager keeps the
//! phases separately timeable), all ranks released together by a barrier; the median over
//! batches of the time per step; for CP the slowest rank's median. Phases timed alone: local
//! Lean, the exchange (NCCL, with the scaling pass for reduce-scatter), the merge. The copy
//! ceiling is an eager 2 GiB device-to-device copy on GPU 0 (bytes read plus written); the
//! floor of a run over `R` GPUs is the KV bytes over `R` times that bandwidth.
//!
//! Usage: `cp_decode [--quick] [--out FILE]`

use ferrattn_core::cp::{self, CpRequest, CpShape, Exchange, OutputPlacement};
use ferrattn_core::{lean, AttentionProblem, DType};
use ferrattn_cuda::cp::{CpRank, CpTensors};
use ferrattn_cuda::nccl::{self, Communicator};
use ferrattn_cuda::{CudaBackend, DeviceBuffer, Event, KvStorage};
use std::fmt::Write as _;
use std::sync::{Arc, Barrier};

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

fn main() {
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
    let shapes: Vec<(&str, usize, usize)> = vec![
        ("llama3-8b", 32, 8),
        ("llama3-70b-tp8", 8, 1),
        ("llama3-70b", 64, 8),
    ];
    let contexts: &[usize] = if quick {
        &[131_072]
    } else {
        &[131_072, 524_288, 1_048_576]
    };
    let batches: &[usize] = &[1, 8];
    println!(
        "{:<15} {:>2} {:>8} | {:>9} | {:>9} {:>8} {:>8} {:>8} | {:>6} {:>6} {:>6} | exchange",
        "shape", "B", "ctx", "1 GPU ms", "CP ms", "lean", "nccl", "merge", "eff", "%flr1", "%flrR"
    );
    let mut json = String::from("[\n");
    for &(name, hq, hk) in &shapes {
        for &ctx in contexts {
            for &batch in batches {
                let d = 128;
                let dtype = DType::BF16;
                let kv_bytes = (batch * ctx * hk * d * 2 * dtype.size_bytes()) as f64;
                // single GPU, whole cache
                let t1 = {
                    let b0 = &backends[0];
                    let p = AttentionProblem::uniform(batch, 1, ctx, hq, hk, d, d, dtype);
                    let plan =
                        ferrattn_core::plan(ferrattn_core::Algorithm::Lean, &p, &g0.caps).unwrap();
                    let x = b0.random_inputs(&p, 1, 1.0).unwrap();
                    let prep = b0.prepare(&plan).unwrap();
                    let mut out = b0.alloc_outputs(&p).unwrap();
                    let one = time_ms(g0, None, 1, 3, || b0.launch(&prep, &x, &mut out)).unwrap();
                    time_ms(g0, None, iters_for(one), 7, || {
                        b0.launch(&prep, &x, &mut out)
                    })
                    .unwrap()
                };
                // context parallel over every GPU, keys split evenly (equal bandwidths)
                let shape = CpShape {
                    batch,
                    seqlen_q: 1,
                    heads_q: hq,
                    heads_kv: hk,
                    head_dim: d,
                    dtype,
                    causal: false,
                };
                let bw = vec![copy_gbs / 2.0; ranks];
                let req = CpRequest {
                    shape: shape.clone(),
                    kv_lens: cp::split_by_bandwidth(&vec![ctx; batch], &bw, 64).unwrap(),
                    bandwidth_gbs: bw,
                    output: OutputPlacement::Replicated,
                };
                let plan = cp::plan(&req).unwrap();
                let barrier = Barrier::new(ranks);
                let times: Vec<CpTimes> = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..ranks)
                        .map(|r| {
                            let (be, comm, plan, shape, barrier) =
                                (&backends[r], comms[r].clone(), &plan, &shape, &barrier);
                            s.spawn(move || -> ferrattn_cuda::Result<CpTimes> {
                                let gpu = be.gpu()?.clone();
                                let rank = CpRank::new(be, comm, shape)?;
                                let lens = plan.local_lens(r);
                                let max_local = lens.iter().copied().max().unwrap_or(0).max(1);
                                let mut lp = AttentionProblem::uniform(
                                    batch, 1, max_local, hq, hk, d, d, dtype,
                                );
                                lp.seqlens_k = lens;
                                let x = be.random_inputs(&lp, 1, 1.0)?;
                                let step =
                                    rank.plan_step(plan, KvStorage::Contiguous, max_local)?;
                                let (_, nh) = step.output_heads();
                                let o = DeviceBuffer::alloc(&gpu, batch * nh * d * 2)?;
                                let l = DeviceBuffer::alloc(&gpu, batch * nh * 4)?;
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
                                // SAFETY: buffers allocated above for this step on this GPU.
                                unsafe { rank.upload(&step, w, st)? };
                                let run = || unsafe { rank.run(&step, &t, w, st) };
                                for _ in 0..3 {
                                    run()?;
                                }
                                let one = time_ms(&gpu, Some(barrier), 1, 3, run)?;
                                let n = iters_for(one);
                                let step_ms = time_ms(&gpu, Some(barrier), n, 7, run)?;
                                let attend = time_ms(&gpu, Some(barrier), n, 5, || unsafe {
                                    rank.attend(&step, &t, w, st)
                                })?;
                                let exchange = time_ms(&gpu, Some(barrier), n, 5, || unsafe {
                                    rank.exchange(&step, w, st)
                                })?;
                                let merge = time_ms(&gpu, Some(barrier), n, 5, || unsafe {
                                    rank.merge(&step, &t, w, st)
                                })?;
                                Ok(CpTimes {
                                    step: step_ms,
                                    attend,
                                    exchange,
                                    merge,
                                })
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("rank thread").expect("rank run"))
                        .collect()
                });
                let slowest = |f: fn(&CpTimes) -> f32| times.iter().map(f).fold(0f32, f32::max);
                let tr = CpTimes {
                    step: slowest(|t| t.step),
                    attend: slowest(|t| t.attend),
                    exchange: slowest(|t| t.exchange),
                    merge: slowest(|t| t.merge),
                };
                let floor1_ms = kv_bytes / (copy_gbs * 1e6);
                let floor_r_ms = floor1_ms / ranks as f64;
                let eff = t1 as f64 / (ranks as f64 * tr.step as f64);
                println!(
                    "{name:<15} {batch:>2} {ctx:>8} | {t1:>9.3} | {:>9.3} {:>8.3} {:>8.3} {:>8.3} | {:>6.2} {:>6.1} {:>6.1} | {:?}",
                    tr.step,
                    tr.attend,
                    tr.exchange,
                    tr.merge,
                    eff,
                    100.0 * floor1_ms / t1 as f64,
                    100.0 * floor_r_ms / tr.step as f64,
                    plan.exchange
                );
                let _ = writeln!(
                    json,
                    "  {{\"shape\": \"{name}\", \"heads_q\": {hq}, \"heads_kv\": {hk}, \"head_dim\": {d}, \"dtype\": \"bf16\", \"batch\": {batch}, \"context\": {ctx}, \"ranks\": {ranks}, \"kv_bytes\": {kv_bytes}, \"single_gpu_ms\": {t1}, \"cp_step_ms\": {}, \"cp_lean_ms\": {}, \"cp_exchange_ms\": {}, \"cp_merge_ms\": {}, \"per_rank_step_ms\": {:?}, \"scaling_efficiency\": {eff}, \"floor_1gpu_ms\": {floor1_ms}, \"floor_ranks_ms\": {floor_r_ms}, \"copy_gbs\": {copy_gbs}, \"exchange\": \"{:?}\", \"exchange_bytes_per_rank\": {}, \"lean_plan_ctas\": {}}},",
                    tr.step,
                    tr.attend,
                    tr.exchange,
                    tr.merge,
                    times.iter().map(|t| t.step).collect::<Vec<_>>(),
                    plan.exchange,
                    match plan.exchange {
                        Exchange::AllGather => plan.bytes.all_gather,
                        Exchange::ReduceScatterHeads => plan.bytes.reduce_scatter_heads.unwrap_or(0),
                    },
                    lean::plan(
                        &{
                            let mut p = AttentionProblem::uniform(batch, 1, ctx, hq, hk, d, d, dtype);
                            p.seqlens_k = vec![ctx; batch];
                            p
                        },
                        &g0.caps
                    )
                    .map(|l| l.num_ctas)
                    .unwrap_or(0)
                );
            }
        }
    }
    if json.ends_with(",\n") {
        json.truncate(json.len() - 2);
        json.push('\n');
    }
    json.push_str("]\n");
    if let Some(p) = out_path {
        std::fs::write(&p, json).expect("write --out");
        println!("wrote {p}");
    }
}
