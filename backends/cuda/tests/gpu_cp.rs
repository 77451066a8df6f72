//! GPU tests of context-parallel decode (`ferrattn_cuda::cp`, NCCL): one thread and one GPU per
//! rank, over every GPU the machine has (or `FERRATTN_CP_RANKS` of them). With one GPU a
//! one-rank communicator runs the whole path (Lean, NCCL all-gather / all-reduce /
//! reduce-scatter, merge); with more, the same cases split the keys over all of them.
//!
//! Each case checks, per rank:
//! - the merge kernel against the CPU twin (`ferrattn_core::cp::merge_partials`) over the very
//!   partials the ranks produced: within one rounding of the dtype;
//! - the result against single-GPU Lean over the whole cache on GPU 0: within the rounding of
//!   the partials to the dtype plus the output's own (see `docs/CONTEXT_PARALLEL.md`);
//! - the result against the f64 golden reference (small cases) with the dtype's tolerance;
//! - replicated outputs: every rank's O and LSE are the same bits (same merge order);
//! - the whole step (attend, exchange, merge) captured in a CUDA graph on every rank and replayed
//!   100 times: the eager step's bits.
//!
//! Without a GPU or without libnccl every test prints `SKIPPED <test>: <reason>` and passes
//! (`scripts/gpu-run.sh` fails a GPU run on that line).

use ferrattn_core::backend::LeanDecode;
use ferrattn_core::cp::{self, CpRequest, CpShape, Exchange, OutputPlacement};
use ferrattn_core::{
    golden, Algorithm, AttentionInputs, AttentionProblem, Comparison, DType, Tensor, Tolerance,
};
use ferrattn_cuda::cp::{CpRank, CpTensors};
use ferrattn_cuda::nccl::{self, Communicator};
use ferrattn_cuda::{CudaBackend, DeviceBuffer, Graph, KvStorage, Paging};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};

/// Every GPU (up to `FERRATTN_CP_RANKS`), or `None` after printing why the test is skipped.
fn gpus(test: &str) -> Option<Vec<CudaBackend>> {
    let want: usize = std::env::var("FERRATTN_CP_RANKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let mut out = Vec::new();
    for i in 0..want {
        let b = CudaBackend::new(i);
        if b.gpu().is_err() {
            break;
        }
        out.push(b);
    }
    if out.is_empty() {
        eprintln!("SKIPPED {test}: {}", CudaBackend::new(0).gpu().unwrap_err());
        return None;
    }
    if let Err(e) = nccl::library() {
        eprintln!("SKIPPED {test}: {e}");
        return None;
    }
    Some(out)
}

fn to_bits(dtype: DType, x: &[f32]) -> Vec<u16> {
    match dtype {
        DType::F16 => x.iter().map(|&v| f16::from_f32(v).to_bits()).collect(),
        _ => x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect(),
    }
}

fn from_bits(dtype: DType, x: &[u16]) -> Vec<f32> {
    match dtype {
        DType::F16 => x.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
        _ => x.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
    }
}

/// `err <= bound`, false for NaN (a NaN output fails every check).
fn within(err: f32, bound: f32) -> bool {
    err <= bound
}

/// Unit roundoff of the dtype (half an ulp, relative).
fn unit_roundoff(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 2f32.powi(-11),
        _ => 2f32.powi(-8),
    }
}

#[derive(Clone, Debug)]
struct Case {
    name: &'static str,
    totals: Vec<usize>,
    sq: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    output: OutputPlacement,
    exchange: Option<Exchange>,
    /// Pages of this many tokens (shuffled pool), or contiguous K/V.
    page: Option<usize>,
    /// The last rank holds no key at all (when there are at least two ranks).
    empty_rank: bool,
}

/// Ragged cuts of each sequence over `ranks` (random proportions, one sequence wholly on the
/// last rank, one with nothing on rank 0), or the empty-rank layout.
fn split(c: &Case, ranks: usize, rng: &mut impl Rng) -> Vec<Vec<usize>> {
    let mut kv = vec![vec![0usize; c.totals.len()]; ranks];
    let holders = if c.empty_rank && ranks > 1 {
        ranks - 1
    } else {
        ranks
    };
    for (b, &t) in c.totals.iter().enumerate() {
        let mut cuts: Vec<usize> = (0..holders - 1).map(|_| rng.gen_range(0..=t)).collect();
        if b == 0 && !c.empty_rank {
            cuts = vec![0; holders - 1]; // wholly on the last holder
        }
        if b == 1 && holders > 1 && !c.empty_rank {
            cuts[0] = 0; // nothing of this sequence on rank 0
        }
        cuts.push(0);
        cuts.push(t);
        cuts.sort();
        for r in 0..holders {
            kv[r][b] = cuts[r + 1] - cuts[r];
        }
    }
    kv
}

struct RankResult {
    o: Vec<f32>,
    lse: Vec<f32>,
    /// This rank's own partial (O, LSE) as it entered the exchange.
    part_o: Vec<f32>,
    part_lse: Vec<f32>,
}

/// Replays of the captured context-parallel step that must give the eager step's bits.
const GRAPH_REPLAYS: usize = 100;

fn run_case(test: &str, backends: &[CudaBackend], c: &Case, seed: u64) -> Result<String, String> {
    let ranks = backends.len();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let shape = CpShape {
        batch: c.totals.len(),
        seqlen_q: c.sq,
        heads_q: c.hq,
        heads_kv: c.hk,
        head_dim: c.d,
        dtype: c.dtype,
        causal: false,
    };
    let req = CpRequest {
        shape: shape.clone(),
        kv_lens: split(c, ranks, &mut rng),
        bandwidth_gbs: vec![4000.0; ranks],
        output: c.output,
    };
    let plan = match c.exchange {
        Some(e) => cp::plan_with_exchange(&req, e),
        None => cp::plan(&req),
    }
    .map_err(|e| e.to_string())?;
    let (b, hq, hk, d, sq) = (shape.batch, c.hq, c.hk, c.d, c.sq);
    let maxt = *c.totals.iter().max().unwrap();
    let q = Tensor::randn(&[b, sq, hq, d], c.dtype, 1.0, &mut rng);
    let k = Tensor::randn(&[b, maxt, hk, d], c.dtype, 1.0, &mut rng);
    let v = Tensor::randn(&[b, maxt, hk, d], c.dtype, 1.0, &mut rng);

    // single-GPU Lean over the whole cache (GPU 0), and the f64 golden reference
    let mut whole = AttentionProblem::uniform(b, sq, maxt, hq, hk, d, d, c.dtype);
    whole.seqlens_k = c.totals.clone();
    let x = AttentionInputs {
        seqlens_k: Some(c.totals.iter().map(|&t| t as i64).collect()),
        ..AttentionInputs::new(q.clone(), k.clone(), v.clone())
    };
    let single_plan = ferrattn_core::plan(
        Algorithm::Lean,
        &whole,
        &backends[0].gpu().unwrap().caps.clone(),
    )
    .map_err(|e| e.to_string())?;
    let single = backends[0]
        .run_lean(&single_plan, &x)
        .map_err(|e| format!("single-GPU Lean: {e}"))?;
    // the same keys merged in another order on one GPU (fixed split instead of stream-K): how
    // far f32 reassociation alone moves O here. With cancellation (|O| << the values it
    // averages) that is far more than an ulp of O, so it, not u |O|, scales the comparison.
    let caps = backends[0].gpu().unwrap().caps.clone();
    let alt =
        ferrattn_core::lean::plan_fixed_split(&whole, &caps, None).map_err(|e| e.to_string())?;
    let alt_plan = ferrattn_core::AttentionPlan {
        block_q: alt.tile_m,
        block_k: alt.tile_k,
        detail: ferrattn_core::PlanDetail::Lean(alt),
        ..single_plan.clone()
    };
    let single_alt = backends[0]
        .run_lean(&alt_plan, &x)
        .map_err(|e| format!("single-GPU Lean, fixed split: {e}"))?;
    let reorder = single
        .o
        .data
        .iter()
        .zip(&single_alt.o.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let macs: usize = c.totals.iter().sum::<usize>() * hq * sq * d;
    let gold = (macs < 60_000_000).then(|| golden::exact_attention(&whole, &x));

    let gpus: Vec<_> = backends
        .iter()
        .map(|be| be.gpu().unwrap().clone())
        .collect();
    let comms = Communicator::init_all(&gpus).map_err(|e| e.to_string())?;
    let row = hk * d;
    let results: Vec<Result<RankResult, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(backends)
            .enumerate()
            .map(|(r, (comm, be))| {
                let (plan, shape, q, k, v) = (&plan, &shape, &q, &k, &v);
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 31 + r as u64);
                s.spawn(move || -> Result<RankResult, String> {
                    let e = |e: ferrattn_cuda::CudaError| format!("rank {r}: {e}");
                    let gpu = be.gpu().map_err(e)?.clone();
                    let rank = CpRank::new(be, std::sync::Arc::new(comm), shape).map_err(e)?;
                    let lens = plan.local_lens(r);
                    let starts: Vec<usize> = plan.shards[r].iter().map(|x| x.start).collect();
                    let max_local = lens.iter().copied().max().unwrap_or(0).max(1);
                    // this rank's keys: contiguous [B, max_local, Hk, D] or a shuffled page pool
                    let (kv_storage, kbuf, vbuf) = match c.page {
                        None => {
                            let mut kl = vec![0f32; b * max_local * row];
                            let mut vl = kl.clone();
                            for bi in 0..b {
                                let src = (bi * maxt + starts[bi]) * row;
                                let dst = bi * max_local * row;
                                let n = lens[bi] * row;
                                kl[dst..dst + n].copy_from_slice(&k.data[src..src + n]);
                                vl[dst..dst + n].copy_from_slice(&v.data[src..src + n]);
                            }
                            (KvStorage::Contiguous, kl, vl)
                        }
                        Some(ps) => {
                            let pages: Vec<usize> = lens.iter().map(|l| l.div_ceil(ps)).collect();
                            let max_pages = pages.iter().copied().max().unwrap_or(0).max(1);
                            let num_pages = pages.iter().sum::<usize>() + 3;
                            let mut ids: Vec<usize> = (0..num_pages).collect();
                            for i in (1..ids.len()).rev() {
                                ids.swap(i, rng.gen_range(0..=i));
                            }
                            let mut table = vec![0i32; b * max_pages];
                            let mut kl = vec![0f32; num_pages * ps * row];
                            let mut vl = kl.clone();
                            let mut next = 0;
                            for bi in 0..b {
                                for pg in 0..pages[bi] {
                                    let id = ids[next];
                                    next += 1;
                                    table[bi * max_pages + pg] = id as i32;
                                    let toks = (lens[bi] - pg * ps).min(ps);
                                    let src = (bi * maxt + starts[bi] + pg * ps) * row;
                                    let dst = id * ps * row;
                                    kl[dst..dst + toks * row]
                                        .copy_from_slice(&k.data[src..src + toks * row]);
                                    vl[dst..dst + toks * row]
                                        .copy_from_slice(&v.data[src..src + toks * row]);
                                }
                            }
                            let paging =
                                Paging::new(ps, num_pages, max_pages, table, &lens).map_err(e)?;
                            (KvStorage::Paged(paging), kl, vl)
                        }
                    };
                    let step = rank.plan_step(plan, kv_storage, max_local).map_err(e)?;
                    let (_, nh) = step.output_heads();
                    let qd =
                        DeviceBuffer::from_slice(&gpu, &to_bits(c.dtype, &q.data)).map_err(e)?;
                    let kd = DeviceBuffer::from_slice(&gpu, &to_bits(c.dtype, &kbuf)).map_err(e)?;
                    let vd = DeviceBuffer::from_slice(&gpu, &to_bits(c.dtype, &vbuf)).map_err(e)?;
                    let mut od = DeviceBuffer::alloc(&gpu, b * sq * nh * d * 2).map_err(e)?;
                    let mut ld = DeviceBuffer::alloc(&gpu, b * nh * sq * 4).map_err(e)?;
                    let ws = DeviceBuffer::alloc(&gpu, step.workspace_bytes()).map_err(e)?;
                    od.fill_u16(0xffff).map_err(e)?; // NaN: unwritten outputs show
                    ld.fill_u32(0xffff_ffff).map_err(e)?;
                    let t = CpTensors {
                        q: qd.ptr(),
                        k: kd.ptr(),
                        v: vd.ptr(),
                        o: od.ptr(),
                        lse: ld.ptr(),
                    };
                    let stream = gpu.raw_stream();
                    // the partial is read back between the attention and the exchange
                    let block = rank.partial_block(&step, ws.ptr()) - ws.ptr();
                    let l = *step.layout();
                    let (part_o, part_lse);
                    // SAFETY: buffers allocated above for these shapes on this GPU; one stream.
                    unsafe {
                        rank.upload(&step, ws.ptr(), stream).map_err(e)?;
                        rank.attend(&step, &t, ws.ptr(), stream).map_err(e)?;
                        let bytes: Vec<u8> = ws.to_vec().map_err(e)?;
                        let blk = &bytes[block as usize..block as usize + l.block_bytes];
                        let rows = shape.rows();
                        let ob: Vec<u16> = blk[..rows * d * 2]
                            .chunks_exact(2)
                            .map(|x| u16::from_ne_bytes([x[0], x[1]]))
                            .collect();
                        part_o = from_bits(c.dtype, &ob);
                        part_lse = blk[l.lse_offset..l.lse_offset + rows * 4]
                            .chunks_exact(4)
                            .map(|x| f32::from_ne_bytes([x[0], x[1], x[2], x[3]]))
                            .collect::<Vec<f32>>();
                        rank.exchange(&step, ws.ptr(), stream).map_err(e)?;
                        rank.merge(&step, &t, ws.ptr(), stream).map_err(e)?;
                    }
                    let o_bits = od.to_vec::<u16>().map_err(e)?;
                    let lse_bits = ld.to_vec::<u32>().map_err(e)?;
                    // The whole step (attend, NCCL exchange, merge) captured in one CUDA graph on
                    // every rank and replayed, as an engine replays a decode step: the eager bits.
                    od.fill_u16(0xffff).map_err(e)?;
                    ld.fill_u32(0xffff_ffff).map_err(e)?;
                    // SAFETY: as above (tables uploaded; the graph re-enqueues the same step).
                    let graph = Graph::capture(&gpu, || unsafe {
                        rank.run(&step, &t, ws.ptr(), stream)
                    })
                    .map_err(|x| format!("rank {r}: capture of the step: {x}"))?;
                    for _ in 0..GRAPH_REPLAYS {
                        graph.launch().map_err(e)?;
                    }
                    gpu.synchronize().map_err(e)?;
                    if od.to_vec::<u16>().map_err(e)? != o_bits
                        || ld.to_vec::<u32>().map_err(e)? != lse_bits
                    {
                        return Err(format!(
                            "rank {r}: O or LSE after {GRAPH_REPLAYS} graph replays differ from the eager step"
                        ));
                    }
                    Ok(RankResult {
                        o: from_bits(c.dtype, &o_bits),
                        lse: lse_bits.iter().map(|&x| f32::from_bits(x)).collect(),
                        part_o,
                        part_lse,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("rank thread panicked".into()))
            })
            .collect()
    });
    let results: Vec<RankResult> = results.into_iter().collect::<Result<_, _>>()?;

    let u = unit_roundoff(c.dtype);
    let part_o: Vec<Vec<f32>> = results.iter().map(|r| r.part_o.clone()).collect();
    let part_l: Vec<Vec<f32>> = results.iter().map(|r| r.part_lse.clone()).collect();
    let mut worst_single = 0f32;
    let mut errors = Vec::new();
    for (r, res) in results.iter().enumerate() {
        let (h0, nh) = plan.output_heads(r);
        let what = format!("{test} {} rank {r}/{ranks} {:?}", c.name, plan.exchange);
        // the kernel implements the core's merge: one dtype rounding of the twin
        let (to, tl) = cp::merge_partials(&shape, &part_o, &part_l, &plan.merge_order, (h0, nh))
            .map_err(|e| e.to_string())?;
        for (i, (&a, &t)) in res.o.iter().zip(&to).enumerate() {
            if !within((a - t).abs(), 2.0 * u * t.abs().max(a.abs()) + 1e-6) {
                errors.push(format!("{what}: O[{i}] = {a}, CPU twin {t}"));
                break;
            }
        }
        Comparison::f32(&tl, &res.lse)
            .check(&format!("{what} LSE vs CPU twin"), &Tolerance::lse())
            .map_err(|e| e.to_string())
            .unwrap_or_else(|e| errors.push(e));
        // against single-GPU Lean over the whole cache: each partial O was rounded to the dtype
        // (u |O_r|), the merge is a convex combination of them, both outputs are rounded once
        // more (u |O| each), and the keys are summed in another order than single-GPU Lean's
        // (at most twice what another single-GPU order moves O: `reorder`)
        for bi in 0..b {
            for s in 0..sq {
                for hl in 0..nh {
                    let h = h0 + hl;
                    let lo = ((bi * sq + s) * nh + hl) * d;
                    let so = ((bi * sq + s) * hq + h) * d;
                    for col in 0..d {
                        let a = res.o[lo + col];
                        let sref = single.o.data[so + col];
                        let pmax = part_o
                            .iter()
                            .map(|p| p[so + col].abs())
                            .fold(0f32, f32::max);
                        let bound =
                            u * pmax + 2.0 * u * sref.abs().max(a.abs()) + 2.0 * reorder + 2e-6;
                        let err = (a - sref).abs();
                        worst_single = worst_single.max(err);
                        if !within(err, bound) {
                            errors.push(format!(
                                "{what}: O(b={bi}, s={s}, h={h}, c={col}) = {a}, single-GPU Lean {sref} (bound {bound})"
                            ));
                        }
                    }
                    let a = res.lse[(bi * nh + hl) * sq + s];
                    let sref = single.lse.data[(bi * hq + h) * sq + s];
                    if !((a - sref).abs() <= 1e-5 * (1.0 + sref.abs()) || a == sref) {
                        errors.push(format!(
                            "{what}: LSE(b={bi}, s={s}, h={h}) = {a}, single-GPU Lean {sref}"
                        ));
                    }
                }
            }
        }
        if let Some(g) = &gold {
            let pick = |o: &[f32]| -> Vec<f32> {
                (0..b * sq)
                    .flat_map(|bs| (h0..h0 + nh).map(move |h| (bs, h)))
                    .flat_map(|(bs, h)| o[(bs * hq + h) * d..(bs * hq + h + 1) * d].to_vec())
                    .collect()
            };
            Comparison::f32(&pick(&g.o.data), &res.o)
                .check(&format!("{what} O vs golden"), &Tolerance::output(c.dtype))
                .unwrap_or_else(|e| errors.push(e));
        }
        if c.output == OutputPlacement::Replicated
            && (res
                .o
                .iter()
                .zip(&results[0].o)
                .any(|(a, b)| a.to_bits() != b.to_bits())
                || res
                    .lse
                    .iter()
                    .zip(&results[0].lse)
                    .any(|(a, b)| a.to_bits() != b.to_bits()))
        {
            errors.push(format!("{what}: replicated output differs from rank 0's"));
        }
    }
    errors.truncate(8);
    if errors.is_empty() {
        Ok(format!(
            "{} on {ranks} rank(s), {:?}, max |O - single-GPU Lean| = {worst_single:e} (single-GPU stream-K vs fixed split: {reorder:e})",
            c.name, plan.exchange
        ))
    } else {
        Err(errors.join("\n"))
    }
}

fn cases() -> Vec<Case> {
    let base = Case {
        name: "ragged f16 d128 32/8 contiguous, replicated",
        totals: vec![4097, 577, 37, 1000],
        sq: 1,
        hq: 32,
        hk: 8,
        d: 128,
        dtype: DType::F16,
        output: OutputPlacement::Replicated,
        exchange: None,
        page: None,
        empty_rank: false,
    };
    vec![
        base.clone(),
        Case {
            name: "empty last rank, bf16 d64 8/1 paged 16, head-sharded",
            totals: vec![300, 65],
            hq: 8,
            hk: 1,
            d: 64,
            dtype: DType::BF16,
            output: OutputPlacement::HeadSharded,
            page: Some(16),
            empty_rank: true,
            ..base.clone()
        },
        Case {
            name: "reduce-scatter by heads, f16 d128 16/4 paged 64",
            totals: vec![2049, 130, 7],
            hq: 16,
            hk: 4,
            output: OutputPlacement::HeadSharded,
            exchange: Some(Exchange::ReduceScatterHeads),
            page: Some(64),
            ..base.clone()
        },
        Case {
            name: "two query tokens, bf16 d256 8/2",
            totals: vec![700, 33],
            sq: 2,
            hq: 8,
            hk: 2,
            d: 256,
            dtype: DType::BF16,
            ..base.clone()
        },
        Case {
            name: "long: 100k keys, f16 d128 32/8",
            totals: vec![100_003],
            ..base
        },
    ]
}

#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
#[test]
fn gpu_cp_equals_single_gpu_lean_on_every_rank_count() {
    let test = "gpu_cp_equals_single_gpu_lean_on_every_rank_count";
    let Some(backends) = gpus(test) else {
        return;
    };
    let mut failures = Vec::new();
    for (i, c) in cases().iter().enumerate() {
        match run_case(test, &backends, c, 1400 + i as u64) {
            Ok(line) => eprintln!("ok: {line}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The small case for compute-sanitizer (memcheck of the merge kernels): all-gather and
/// reduce-scatter, an empty rank where there are two.
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
#[test]
fn gpu_cp_sanitizer_small() {
    let test = "gpu_cp_sanitizer_small";
    let Some(backends) = gpus(test) else {
        return;
    };
    let all = cases();
    for c in [&all[1], &all[2]] {
        let c = Case {
            totals: vec![130, 17],
            ..c.clone()
        };
        if let Err(e) = run_case(test, &backends, &c, 7) {
            panic!("{e}");
        }
    }
}

/// What one rank of the TurboAttention case returns: merged O, merged LSE, its partial LSE.
type TurboRankResult = (Vec<f32>, Vec<f32>, Vec<f32>);

/// Rank `r`'s keys and values of `plan` copied out of the whole `k`, `v` (`[B, maxt, Hk, D]`)
/// as `[B, max_local, Hk, D]`: (local lengths, max_local, K, V).
fn local_kv(
    plan: &cp::CpPlan,
    r: usize,
    k: &Tensor,
    v: &Tensor,
) -> (Vec<usize>, usize, Vec<f32>, Vec<f32>) {
    let lens = plan.local_lens(r);
    let starts: Vec<usize> = plan.shards[r].iter().map(|x| x.start).collect();
    let max_local = lens.iter().copied().max().unwrap_or(0).max(1);
    let (b, maxt) = (k.shape[0], k.shape[1]);
    let row = k.shape[2] * k.shape[3];
    let mut kl = vec![0f32; b * max_local * row];
    let mut vl = kl.clone();
    for bi in 0..b {
        let (src, dst, n) = (
            (bi * maxt + starts[bi]) * row,
            bi * max_local * row,
            lens[bi] * row,
        );
        kl[dst..dst + n].copy_from_slice(&k.data[src..src + n]);
        vl[dst..dst + n].copy_from_slice(&v.data[src..src + n]);
    }
    (lens, max_local, kl, vl)
}

/// The `n` f32 of the partial LSE in this rank's block of `ws` (downloaded).
fn partial_lse(
    ws: &DeviceBuffer,
    block: usize,
    lse_offset: usize,
    n: usize,
) -> Result<Vec<f32>, String> {
    let bytes: Vec<u8> = ws.to_vec().map_err(|e| e.to_string())?;
    Ok(bytes[block + lse_offset..][..n * 4]
        .chunks_exact(4)
        .map(|x| f32::from_ne_bytes([x[0], x[1], x[2], x[3]]))
        .collect())
}

/// Rank `r`'s partial LSE is `-inf` on the rows of sequences it holds no key of, finite on the
/// others.
fn check_partial_lse(plan: &cp::CpPlan, r: usize, part_lse: &[f32], hq: usize) {
    for (bi, &n) in plan.local_lens(r).iter().enumerate() {
        let rows = &part_lse[bi * hq..(bi + 1) * hq];
        if n == 0 {
            assert!(
                rows.iter().all(|&x| x == f32::NEG_INFINITY),
                "rank {r}: sequence {bi} has no key here but its partial LSE is {rows:?}"
            );
        } else {
            assert!(rows.iter().all(|x| x.is_finite()), "rank {r}: {rows:?}");
        }
    }
}

/// Runs `f` for every rank on its own thread (one GPU and communicator each); a panicking rank
/// is an error.
fn on_every_rank<T: Send>(
    backends: &[CudaBackend],
    comms: Vec<Communicator>,
    f: impl Fn(&CudaBackend, Communicator) -> Result<T, String> + Sync,
) -> Vec<Result<T, String>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(backends)
            .map(|(comm, be)| {
                let f = &f;
                s.spawn(move || f(be, comm))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("rank thread panicked".into()))
            })
            .collect()
    })
}

/// One rank's TurboAttention decode over its slice, through [`CpRank::attend_turbo`], then the
/// exchange and merge.
#[allow(clippy::too_many_arguments)] // one rank's share of the case
fn turbo_rank(
    be: &CudaBackend,
    comm: Communicator,
    plan: &cp::CpPlan,
    shape: &CpShape,
    cfg: &ferrattn_core::turbo::TurboConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<TurboRankResult, String> {
    use ferrattn_cuda::{DecodeSchedule, TurboDecodeStepPlan};
    let r = comm.rank();
    let e = |e: ferrattn_cuda::CudaError| format!("rank {r}: {e}");
    let gpu = be.gpu().map_err(e)?.clone();
    let (b, hq, hk, d, dtype) = (
        shape.batch,
        shape.heads_q,
        shape.heads_kv,
        shape.head_dim,
        shape.dtype,
    );
    let rank = CpRank::new(be, std::sync::Arc::new(comm), shape).map_err(e)?;
    // this rank's keys and values, prefilled into its own compressed cache (the prompt's
    // queries are zeros: the prefill's output is not used, only the cache it writes)
    let (lens, max_local, kl, vl) = local_kv(plan, r, k, v);
    let ql = vec![0f32; b * max_local * hq * d];
    let tensor = |data: Vec<f32>, h: usize| Tensor {
        shape: vec![b, max_local, h, d],
        dtype,
        data,
    };
    let mut pp = AttentionProblem::uniform(b, max_local, max_local, hq, hk, d, d, dtype);
    pp.seqlens_q = lens.clone();
    pp.seqlens_k = lens.clone();
    let mut px = AttentionInputs::new(tensor(ql, hq), tensor(kl, hk), tensor(vl, hk));
    px.seqlens_q = Some(lens.iter().map(|&l| l as i64).collect());
    px.seqlens_k = px.seqlens_q.clone();
    let cache = if lens.iter().any(|&l| l > 0) {
        Some(be.turbo_prefill(cfg, &pp, &px, 0).map_err(e)?.1)
    } else {
        None
    };
    let kernels = be.turbo_step_kernels(dtype, d).map_err(e)?;
    let tplan =
        TurboDecodeStepPlan::slice(hq, hk, d, dtype, &lens, DecodeSchedule::PerTile).map_err(e)?;
    let step = rank
        .plan_step(plan, KvStorage::Contiguous, max_local)
        .map_err(e)?;
    let qd = DeviceBuffer::from_slice(&gpu, &to_bits(dtype, &q.data)).map_err(e)?;
    let mut od = DeviceBuffer::alloc(&gpu, b * hq * d * 2).map_err(e)?;
    let mut ld = DeviceBuffer::alloc(&gpu, b * hq * 4).map_err(e)?;
    od.fill_u16(0xffff).map_err(e)?;
    ld.fill_u32(0xffff_ffff).map_err(e)?;
    let ws = DeviceBuffer::alloc(&gpu, step.workspace_bytes()).map_err(e)?;
    let tws = DeviceBuffer::alloc(&gpu, tplan.workspace_bytes()).map_err(e)?;
    let t = CpTensors {
        q: qd.ptr(),
        k: 0,
        v: 0,
        o: od.ptr(),
        lse: ld.ptr(),
    };
    let stream = gpu.raw_stream();
    let l = *step.layout();
    let block = (rank.partial_block(&step, ws.ptr()) - ws.ptr()) as usize;
    let scale = 1.0 / (d as f32).sqrt();
    let part_lse;
    // SAFETY: buffers allocated above for these shapes on this GPU; one stream.
    unsafe {
        match &cache {
            Some(c) => {
                kernels
                    .upload_decode(&tplan, tws.ptr(), stream)
                    .map_err(e)?;
                rank.attend_turbo(
                    &step,
                    &kernels,
                    &tplan,
                    cfg,
                    qd.ptr(),
                    scale,
                    c,
                    ws.ptr(),
                    tws.ptr(),
                    stream,
                )
                .map_err(e)?;
            }
            // no key of any sequence here: attend writes the empty partial
            None => rank.attend(&step, &t, ws.ptr(), stream).map_err(e)?,
        }
        part_lse =
            partial_lse(&ws, block, l.lse_offset, b * hq).map_err(|m| format!("rank {r}: {m}"))?;
        rank.exchange(&step, ws.ptr(), stream).map_err(e)?;
        rank.merge(&step, &t, ws.ptr(), stream).map_err(e)?;
    }
    let o = from_bits(dtype, &od.to_vec::<u16>().map_err(e)?);
    let lse = ld.to_vec::<f32>().map_err(e)?;
    Ok((o, lse, part_lse))
}

/// TurboAttention's compressed cache over context parallelism: every rank prefills its own
/// slice (64-token block boundaries, one sequence with no key on rank 0 where there are two
/// ranks or more) into its own INT4 cache, decodes it through `CpRank::attend_turbo` into its
/// partial block, and the partials are exchanged and merged as Lean's are. Checks: a sequence
/// with no key on a rank gives that rank an LSE of `-inf`; with one rank the result is
/// single-GPU TurboAttention over the whole cache bit for bit; with more, its error against
/// exact attention (f64 golden) is within 10% of the whole-cache decode's (TurboAttention
/// quantises P per slice, so context parallelism keeps its accuracy, not its bits:
/// `docs/CONTEXT_PARALLEL.md`); every rank holds the same bits.
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
#[test]
fn gpu_cp_turbo_slices_merge_like_the_whole_cache() {
    use ferrattn_core::turbo::{KvBits, TurboConfig};
    use ferrattn_cuda::{DecodeSchedule, TurboDecodeStepPlan};
    let test = "gpu_cp_turbo_slices_merge_like_the_whole_cache";
    let Some(backends) = gpus(test) else {
        return;
    };
    let ranks = backends.len();
    let (hq, hk, d, dtype) = (8usize, 2usize, 128usize, DType::BF16);
    let totals = [320usize, 64 * ranks.max(2), 200];
    let b = totals.len();
    let shape = CpShape {
        batch: b,
        seqlen_q: 1,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        dtype,
        causal: false,
    };
    // whole 64-token blocks per rank, the last rank the rest; sequence 1 has nothing on rank 0
    let mut kv_lens = vec![vec![0usize; b]; ranks];
    for (bi, &t) in totals.iter().enumerate() {
        let holders: Vec<usize> = if bi == 1 && ranks > 1 {
            (1..ranks).collect()
        } else {
            (0..ranks).collect()
        };
        let share = (t / 64 / holders.len()) * 64;
        for (i, &r) in holders.iter().enumerate() {
            kv_lens[r][bi] = if i + 1 == holders.len() {
                t - share * i
            } else {
                share
            };
        }
    }
    let req = CpRequest {
        shape: shape.clone(),
        kv_lens,
        bandwidth_gbs: vec![4000.0; ranks],
        output: OutputPlacement::Replicated,
    };
    let plan = cp::plan_with_exchange(&req, Exchange::AllGather).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    let maxt = *totals.iter().max().unwrap();
    let q = Tensor::randn(&[b, 1, hq, d], dtype, 1.0, &mut rng);
    let k = Tensor::randn(&[b, maxt, hk, d], dtype, 1.0, &mut rng);
    let v = Tensor::randn(&[b, maxt, hk, d], dtype, 1.0, &mut rng);
    let cfg = TurboConfig {
        kv_bits: KvBits::Int4,
        ..TurboConfig::default()
    };

    // single-GPU TurboAttention over the whole cache (GPU 0), the same kernels, and the golden
    let be = &backends[0];
    let gpu = be.gpu().unwrap().clone();
    let mut pw = AttentionProblem::uniform(b, maxt, maxt, hq, hk, d, d, dtype);
    pw.seqlens_q = totals.to_vec();
    pw.seqlens_k = totals.to_vec();
    let qw = vec![0f32; b * maxt * hq * d];
    let mut xw = AttentionInputs::new(
        Tensor {
            shape: vec![b, maxt, hq, d],
            dtype,
            data: qw,
        },
        k.clone(),
        v.clone(),
    );
    xw.seqlens_q = Some(totals.iter().map(|&l| l as i64).collect());
    xw.seqlens_k = xw.seqlens_q.clone();
    let (_, whole_cache) = be.turbo_prefill(&cfg, &pw, &xw, 0).unwrap();
    let kernels = be.turbo_step_kernels(dtype, d).unwrap();
    let wplan = TurboDecodeStepPlan::new(hq, hk, d, dtype, &totals, false, DecodeSchedule::PerTile)
        .unwrap();
    let qd = DeviceBuffer::from_slice(&gpu, &to_bits(dtype, &q.data)).unwrap();
    let od = DeviceBuffer::alloc(&gpu, b * hq * d * 2).unwrap();
    let ld = DeviceBuffer::alloc(&gpu, b * hq * 4).unwrap();
    let tws = DeviceBuffer::alloc(&gpu, wplan.workspace_bytes()).unwrap();
    // SAFETY: buffers of these shapes on GPU 0; the backend's stream.
    unsafe {
        let s = gpu.raw_stream();
        kernels.upload_decode(&wplan, tws.ptr(), s).unwrap();
        let scale = 1.0 / (d as f32).sqrt();
        kernels
            .decode(
                &wplan,
                &cfg,
                qd.ptr(),
                od.ptr(),
                ld.ptr(),
                scale,
                &whole_cache,
                tws.ptr(),
                s,
            )
            .unwrap();
    }
    let whole_o = from_bits(dtype, &od.to_vec::<u16>().unwrap());
    let whole_lse: Vec<f32> = ld.to_vec().unwrap();
    let mut gp = AttentionProblem::uniform(b, 1, maxt, hq, hk, d, d, dtype);
    gp.seqlens_k = totals.to_vec();
    let gx = AttentionInputs {
        seqlens_k: Some(totals.iter().map(|&t| t as i64).collect()),
        ..AttentionInputs::new(q.clone(), k.clone(), v.clone())
    };
    let gold = golden::exact_attention(&gp, &gx);

    let gpus: Vec<_> = backends.iter().map(|x| x.gpu().unwrap().clone()).collect();
    let comms = Communicator::init_all(&gpus).unwrap();
    let results = on_every_rank(&backends, comms, |be, comm| {
        turbo_rank(be, comm, &plan, &shape, &cfg, &q, &k, &v)
    });
    let rms = |a: &[f32], b: &[f32]| {
        (a.iter()
            .zip(b)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum::<f64>()
            / a.len().max(1) as f64)
            .sqrt()
    };
    let whole_err = rms(&gold.o.data, &whole_o);
    let whole_lse_err = rms(&gold.lse.data, &whole_lse);
    let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
    for (r, res) in results.into_iter().enumerate() {
        let (o, lse, part_lse) = res.unwrap();
        check_partial_lse(&plan, r, &part_lse, hq);
        if ranks == 1 {
            assert!(
                o == whole_o && lse == whole_lse,
                "one rank: O or LSE differ from the whole-cache decode"
            );
        }
        let (err, lse_err) = (rms(&gold.o.data, &o), rms(&gold.lse.data, &lse));
        eprintln!(
            "{test}: rank {r}/{ranks}: O rms error vs golden {err:.3e} (whole cache {whole_err:.3e}), \
             LSE {lse_err:.3e} (whole cache {whole_lse_err:.3e})"
        );
        assert!(
            err <= 1.1 * whole_err,
            "rank {r}: O error {err:.3e} vs {whole_err:.3e}"
        );
        assert!(
            lse_err <= 1.1 * whole_lse_err + 1e-6,
            "rank {r}: LSE error {lse_err:.3e} vs {whole_lse_err:.3e}"
        );
        match &first {
            None => first = Some((o, lse)),
            Some((fo, fl)) => assert!(
                *fo == o && *fl == lse,
                "rank {r}: replicated outputs differ from rank 0's"
            ),
        }
    }
}

/// One rank's TurboQuant decode over its slice, through [`CpRank::attend_turboquant`], then the
/// exchange and merge.
#[allow(clippy::too_many_arguments)] // one rank's share of the case
fn turboquant_rank(
    be: &CudaBackend,
    comm: Communicator,
    plan: &cp::CpPlan,
    shape: &CpShape,
    cfg: &ferrattn_core::turboquant::TurboQuantConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<TurboRankResult, String> {
    let r = comm.rank();
    let e = |e: ferrattn_cuda::CudaError| format!("rank {r}: {e}");
    let gpu = be.gpu().map_err(e)?.clone();
    let (b, hq, hk, d) = (shape.batch, shape.heads_q, shape.heads_kv, shape.head_dim);
    let rank = CpRank::new(be, std::sync::Arc::new(comm), shape).map_err(e)?;
    // this rank's keys and values, compressed into its own cache
    let (lens, max_local, kl, vl) = local_kv(plan, r, k, v);
    let mut pl = AttentionProblem::uniform(b, 1, max_local, hq, hk, d, d, DType::F16);
    pl.seqlens_k = lens.clone();
    let tq = be.turboquant(cfg, &pl).map_err(e)?;
    let mut cache = tq.alloc_cache(b, hk, max_local).map_err(e)?;
    let (kd, vd) = (
        tq.upload_f16(&kl).map_err(e)?,
        tq.upload_f16(&vl).map_err(e)?,
    );
    tq.append(&mut cache, &kd, &vd, max_local, &lens)
        .map_err(e)?;
    let prep = tq.prepare_decode(&pl, &cache, None).map_err(e)?;
    let step = rank
        .plan_step(plan, KvStorage::Contiguous, max_local)
        .map_err(e)?;
    let qd = tq.upload_f16(&q.data).map_err(e)?;
    let mut od = DeviceBuffer::alloc(&gpu, b * hq * d * 2).map_err(e)?;
    let mut ld = DeviceBuffer::alloc(&gpu, b * hq * 4).map_err(e)?;
    od.fill_u16(0xffff).map_err(e)?;
    ld.fill_u32(0xffff_ffff).map_err(e)?;
    let mut ws = DeviceBuffer::alloc(&gpu, step.workspace_bytes()).map_err(e)?;
    ws.fill_u32(0xffff_ffff).map_err(e)?; // poison: the partial block must be written
    let t = CpTensors {
        q: qd.ptr(),
        k: 0,
        v: 0,
        o: od.ptr(),
        lse: ld.ptr(),
    };
    let stream = gpu.raw_stream();
    let l = *step.layout();
    let block = (rank.partial_block(&step, ws.ptr()) - ws.ptr()) as usize;
    let part_lse;
    // SAFETY: buffers allocated above for these shapes on this GPU; one stream.
    unsafe {
        rank.attend_turboquant(&step, &tq, &prep, qd.ptr(), &cache, ws.ptr(), stream)
            .map_err(e)?;
        part_lse =
            partial_lse(&ws, block, l.lse_offset, b * hq).map_err(|m| format!("rank {r}: {m}"))?;
        rank.exchange(&step, ws.ptr(), stream).map_err(e)?;
        rank.merge(&step, &t, ws.ptr(), stream).map_err(e)?;
    }
    let o = from_bits(DType::F16, &od.to_vec::<u16>().map_err(e)?);
    let lse = ld.to_vec::<f32>().map_err(e)?;
    Ok((o, lse, part_lse))
}

/// TurboQuant's compressed cache over context parallelism: every rank compresses its own slice
/// (any split: TurboQuant compresses each token alone; here uneven shares and, with two ranks
/// or more, a sequence with no key on rank 0), decodes it through `CpRank::attend_turboquant`
/// into its partial block, and the partials are exchanged and merged as Lean's are. Checks: a
/// sequence with no key on a rank gives that rank an LSE of `-inf`; with one rank the result is
/// single-GPU TurboQuant over the whole cache bit for bit; with more, every element is within
/// the rounding the merge adds (the f16 partials and outputs: 4 units of f16 roundoff of
/// `max(|O|, 1)`; LSE within 1e-4 of `max(|LSE|, 1)`) of the whole-cache decode; every rank
/// holds the same bits.
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
#[test]
fn gpu_cp_turboquant_slices_merge_like_the_whole_cache() {
    use ferrattn_core::turboquant::TurboQuantConfig;
    let test = "gpu_cp_turboquant_slices_merge_like_the_whole_cache";
    let Some(backends) = gpus(test) else {
        return;
    };
    let ranks = backends.len();
    let (hq, hk, d) = (8usize, 2usize, 128usize);
    let totals = [333usize, 97 * ranks.max(2), 1];
    let b = totals.len();
    let shape = CpShape {
        batch: b,
        seqlen_q: 1,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        dtype: DType::F16,
        causal: false,
    };
    // uneven shares; sequence 1 has nothing on rank 0, sequence 2 (one token) lives on one rank
    let mut kv_lens = vec![vec![0usize; b]; ranks];
    for (bi, &t) in totals.iter().enumerate() {
        let holders: Vec<usize> = if bi == 1 && ranks > 1 {
            (1..ranks).collect()
        } else if bi == 2 {
            vec![ranks - 1]
        } else {
            (0..ranks).collect()
        };
        let share = t / holders.len() + 3;
        let mut left = t;
        for (i, &r) in holders.iter().enumerate() {
            let n = if i + 1 == holders.len() {
                left
            } else {
                share.min(left)
            };
            kv_lens[r][bi] = n;
            left -= n;
        }
    }
    let req = CpRequest {
        shape: shape.clone(),
        kv_lens,
        bandwidth_gbs: vec![4000.0; ranks],
        output: OutputPlacement::Replicated,
    };
    let plan = cp::plan_with_exchange(&req, Exchange::AllGather).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2027);
    let maxt = *totals.iter().max().unwrap();
    let q = Tensor::randn(&[b, 1, hq, d], DType::F16, 1.0, &mut rng);
    let k = Tensor::randn(&[b, maxt, hk, d], DType::F16, 1.0, &mut rng);
    let v = Tensor::randn(&[b, maxt, hk, d], DType::F16, 1.0, &mut rng);

    // single-GPU TurboQuant over the whole cache (GPU 0)
    let be = &backends[0];
    let mut pw = AttentionProblem::uniform(b, 1, maxt, hq, hk, d, d, DType::F16);
    pw.seqlens_k = totals.to_vec();
    let cfg = TurboQuantConfig::paper_default(&pw);
    let tq = be.turboquant(&cfg, &pw).unwrap();
    let mut cache = tq.alloc_cache(b, hk, maxt).unwrap();
    let (kd, vd) = (
        tq.upload_f16(&k.data).unwrap(),
        tq.upload_f16(&v.data).unwrap(),
    );
    tq.append(&mut cache, &kd, &vd, maxt, &totals).unwrap();
    let prep = tq.prepare_decode(&pw, &cache, None).unwrap();
    let mut out = tq.alloc_outputs(&pw).unwrap();
    tq.launch_decode(&prep, &tq.upload_f16(&q.data).unwrap(), &cache, &mut out)
        .unwrap();
    let whole = tq.download(&out, &pw).unwrap();

    let gpus: Vec<_> = backends.iter().map(|x| x.gpu().unwrap().clone()).collect();
    let comms = Communicator::init_all(&gpus).unwrap();
    let results = on_every_rank(&backends, comms, |be, comm| {
        turboquant_rank(be, comm, &plan, &shape, &cfg, &q, &k, &v)
    });
    let u = 2f32.powi(-11);
    let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
    for (r, res) in results.into_iter().enumerate() {
        let (o, lse, part_lse) = res.unwrap();
        check_partial_lse(&plan, r, &part_lse, hq);
        if ranks == 1 {
            assert!(
                o == whole.o.data && lse == whole.lse.data,
                "one rank: O or LSE differ from the whole-cache decode"
            );
        }
        let (mut worst_o, mut worst_l) = (0f32, 0f32);
        for (i, (&x, &w)) in o.iter().zip(&whole.o.data).enumerate() {
            let bound = 4.0 * u * w.abs().max(1.0);
            assert!(
                (x - w).abs() <= bound,
                "rank {r}: O[{i}] = {x} against the whole cache's {w} (bound {bound:.2e})"
            );
            worst_o = worst_o.max((x - w).abs());
        }
        for (i, (&x, &w)) in lse.iter().zip(&whole.lse.data).enumerate() {
            let bound = 1e-4 * w.abs().max(1.0);
            assert!(
                (x - w).abs() <= bound,
                "rank {r}: LSE[{i}] = {x} against the whole cache's {w} (bound {bound:.2e})"
            );
            worst_l = worst_l.max((x - w).abs());
        }
        eprintln!(
            "{test}: rank {r}/{ranks}: largest difference from the whole-cache decode: O {worst_o:.3e}, LSE {worst_l:.3e}"
        );
        match &first {
            None => first = Some((o, lse)),
            Some((fo, fl)) => assert!(
                *fo == o && *fl == lse,
                "rank {r}: replicated outputs differ from rank 0's"
            ),
        }
    }
}
