//! The CUDA rows: Lean decode (stream-K, with the fixed-split variant of the same kernel as our
//! baseline), TurboAttention prefill and decode (with the Lean kernel over the uncompressed cache
//! as our exact baseline), and the ceilings the Rust side measures (copy bandwidth, the launch
//! floor of a graph node).
//!
//! Every row goes through the device path an engine uses: inputs filled on the device, the plan
//! prepared once (`CudaBackend::prepare`, `turbo_prepare_*`), then launches replayed from a CUDA
//! graph. PyTorch SDPA jobs for the same shapes are collected here and run after the Rust rows
//! (`baseline.rs`), when this process holds no large buffers.
//!
//! TurboQuant (issue 10): [`turboquant_decode_rows`] times the fused decode over the compressed
//! cache beside our Lean over the same fp16 K/V and SDPA, and one row per configuration times the
//! compression of the whole context.

use crate::bench::baseline::{JobKind, SdpaJob};
use crate::bench::check::{
    buffer_seed, check_device, check_turbo_device, tolerance, Filled, Probe, TurboCall,
};
use crate::bench::report::{Baseline, Ceilings, Check, Row};
use crate::bench::shapes::Shape;
use crate::bench::timing::{measure, rotation_sets, Clock, ClockKind, Method, Timing};
use ferrattn_core::turbo::{KvBits, TurboConfig};
use ferrattn_core::{
    lean, plan, Algorithm, AttentionPlan, AttentionProblem, PlanDetail, Provenance,
};
use ferrattn_cuda::turbo::plan_decode;
use ferrattn_cuda::{
    CudaBackend, CudaError, DecodeSchedule, DeviceBuffer, DeviceInputs, DeviceOutputs, Event, Gpu,
    Graph,
};
use std::sync::Arc;

type R<T> = std::result::Result<T, CudaError>;

/// Batches timed on the GPU's stream: replayed from a CUDA graph when the calls can be captured,
/// else enqueued back to back (the clock then reports [`ClockKind::DeviceEvents`]).
pub struct GpuClock {
    gpu: Arc<Gpu>,
    graph: bool,
}

impl GpuClock {
    /// Graph replay (`graph`) or eager launches between events.
    pub fn new(gpu: &Arc<Gpu>, graph: bool) -> GpuClock {
        GpuClock {
            gpu: gpu.clone(),
            graph,
        }
    }

    fn eager(
        &self,
        per_batch: usize,
        batches: usize,
        f: &mut dyn FnMut(usize) -> R<()>,
    ) -> R<Vec<f64>> {
        let mut out = Vec::with_capacity(batches);
        let mut k = 0;
        for _ in 0..batches {
            let s = Event::record(&self.gpu)?;
            for _ in 0..per_batch {
                f(k)?;
                k += 1;
            }
            let e = Event::record(&self.gpu)?;
            out.push(s.elapsed_ms(&e)? as f64);
        }
        Ok(out)
    }
}

impl Clock for GpuClock {
    type Error = CudaError;

    fn kind(&self) -> ClockKind {
        if self.graph {
            ClockKind::GraphReplay
        } else {
            ClockKind::DeviceEvents
        }
    }

    fn once(&mut self, f: &mut dyn FnMut(usize) -> R<()>) -> R<f64> {
        let s = Event::record(&self.gpu)?;
        f(0)?;
        let e = Event::record(&self.gpu)?;
        Ok(s.elapsed_ms(&e)? as f64)
    }

    fn batches(
        &mut self,
        per_batch: usize,
        batches: usize,
        f: &mut dyn FnMut(usize) -> R<()>,
    ) -> R<Vec<f64>> {
        if !self.graph {
            return self.eager(per_batch, batches, f);
        }
        let graph = match Graph::capture(&self.gpu, || (0..per_batch).try_for_each(&mut *f)) {
            Ok(g) => g,
            Err(e) => {
                // a call that synchronises or copies from the host cannot be captured
                tracing::info!(error = %e, "graph capture failed; timing eager launches");
                self.graph = false;
                self.gpu.synchronize()?;
                return self.eager(per_batch, batches, f);
            }
        };
        graph.launch()?; // first replay uploads the graph
        let mut out = Vec::with_capacity(batches);
        for _ in 0..batches {
            let s = Event::record(&self.gpu)?;
            graph.launch()?;
            let e = Event::record(&self.gpu)?;
            out.push(s.elapsed_ms(&e)? as f64);
        }
        Ok(out)
    }
}

/// The opened GPU and what the rows need of it.
pub struct Cuda {
    /// The backend.
    pub b: CudaBackend,
    /// Its GPU.
    pub gpu: Arc<Gpu>,
    /// Its capabilities.
    pub caps: ferrattn_core::DeviceCaps,
}

fn time(gpu: &Arc<Gpu>, sets: usize, f: impl FnMut(usize) -> R<()>) -> R<Timing> {
    measure(&Method::DEVICE, &mut GpuClock::new(gpu, true), sets, f)
}

/// Copy bandwidth (eager 2 GiB device-to-device copy: a memcpy node in a graph runs on a copy
/// engine at about 2.8 TB/s on an H200, an eager copy at about 4.3) and the replay cost of a
/// two-byte memset node.
pub fn ceilings(c: &Cuda) -> R<Ceilings> {
    let bytes = 2usize << 30;
    let src = DeviceBuffer::alloc(&c.gpu, bytes)?;
    let mut dst = DeviceBuffer::alloc(&c.gpu, bytes)?;
    let t = measure(
        &Method::DEVICE,
        &mut GpuClock::new(&c.gpu, false),
        1,
        |_| dst.copy_from(&src),
    )?;
    drop((src, dst));
    let mut tiny = DeviceBuffer::alloc(&c.gpu, 2)?;
    let node = time(&c.gpu, 1, |_| tiny.fill_u16(0x3c00))?;
    Ok(Ceilings {
        copy_gbs: Some(2.0 * bytes as f64 / (t.median_ms * 1e-3) / 1e9),
        memset_node_us: Some(node.median_ms * 1e3),
        ..Ceilings::default()
    })
}

fn filled(seed: u32, p: &AttentionProblem) -> [Filled; 3] {
    let mk = |buffer, h, d, s| Filled {
        seed: buffer_seed(seed, buffer),
        scale: 2.0,
        dtype: p.dtype,
        dims: [p.batch, s, h, d],
    };
    [
        mk(0, p.heads_q, p.head_dim_qk, p.max_seqlen_q),
        mk(1, p.heads_kv, p.head_dim_qk, p.max_seqlen_k),
        mk(2, p.heads_kv, p.head_dim_v, p.max_seqlen_k),
    ]
}

/// Probes of a decode check: the first sequence, and the shortest one of a ragged batch.
fn probes(p: &AttentionProblem, rows: usize) -> Vec<Probe> {
    let mut v = vec![Probe::of(p, 0, rows)];
    let shortest = (0..p.batch).min_by_key(|&b| p.seqlens_k[b]).unwrap_or(0);
    if p.seqlens_k[shortest] != p.seqlens_k[0] {
        v.push(Probe::of(p, shortest, rows));
    }
    v
}

/// Worst of several checks (the first that failed, else the largest error).
fn worst(checks: Vec<Check>) -> Check {
    checks
        .into_iter()
        .max_by(|a, b| {
            (!a.passed, a.rel_fro)
                .partial_cmp(&(!b.passed, b.rel_fro))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .expect("at least one probe")
}

#[allow(clippy::too_many_arguments)] // what the check needs of the run
fn check_outputs(
    what: &str,
    p: &AttentionProblem,
    seed: u32,
    q_override: Option<Filled>,
    out: &DeviceOutputs,
    rows: usize,
    algo: Algorithm,
    with_lse: bool,
) -> R<Check> {
    let got = out.download(p, Provenance::cpu())?;
    let [q, k, v] = filled(seed, p);
    let q = q_override.unwrap_or(q);
    let lse = with_lse.then_some(&got.lse);
    Ok(worst(
        probes(p, rows)
            .iter()
            .map(|pr| check_device(what, p, q, k, v, pr, &got.o, lse, tolerance(algo, p.dtype)))
            .collect(),
    ))
}

/// A TurboAttention output against the CPU emulation over `rows` (whole query blocks) of the
/// first sequence (and the shortest of a ragged batch); `timed`, when given, is the output of the
/// timed schedule, judged against the f64 golden.
#[allow(clippy::too_many_arguments)] // inputs' seed, both outputs, the call and the slice
fn check_turbo(
    p: &AttentionProblem,
    seed: u32,
    q_override: Option<Filled>,
    out: &DeviceOutputs,
    timed: Option<&DeviceOutputs>,
    cfg: &TurboConfig,
    call: &TurboCall,
    rows: usize,
) -> R<Check> {
    let got = out.download(p, Provenance::cpu())?;
    let got_timed = match timed {
        Some(t) => Some(t.download(p, Provenance::cpu())?),
        None => None,
    };
    let [q, k, v] = filled(seed, p);
    let q = q_override.unwrap_or(q);
    let what = match call {
        TurboCall::Prefill => "turbo prefill",
        TurboCall::Decode { .. } => "turbo decode",
    };
    Ok(worst(
        probes(p, rows)
            .iter()
            .map(|pr| {
                let timed_o = got_timed.as_ref().map(|t| &t.o);
                check_turbo_device(what, p, q, k, v, pr, &got.o, timed_o, cfg, call)
            })
            .collect(),
    ))
}

fn sdpa_baselines(note: Option<&str>) -> Vec<Baseline> {
    ["sdpa-cudnn", "sdpa-flash"]
        .into_iter()
        .map(|n| Baseline {
            name: n.into(),
            time: None,
            note: note.map(String::from),
            error: Some("not run".into()),
        })
        .collect()
}

fn untimed(row: Row) -> Row {
    Row {
        baselines: vec![],
        ..row
    }
}

/// One Lean decode row: stream-K timed, fixed split timed as our baseline, SDPA queued.
pub fn lean_row(c: &Cuda, s: &Shape, jobs: &mut Vec<SdpaJob>, row_index: usize) -> R<Row> {
    let p = s.problem();
    let sk = plan(Algorithm::Lean, &p, &c.caps).map_err(|e| CudaError::Plan(e.to_string()))?;
    let PlanDetail::Lean(lp) = &sk.detail else {
        return Err(CudaError::Plan("lean planner returned another plan".into()));
    };
    let fx_lp =
        lean::plan_fixed_split(&p, &c.caps, None).map_err(|e| CudaError::Plan(e.to_string()))?;
    let splits = match fx_lp.schedule {
        lean::Schedule::FixedSplit { splits, .. } => splits,
        _ => 0,
    };
    let fx = AttentionPlan {
        detail: PlanDetail::Lean(fx_lp),
        ..sk.clone()
    };
    let e = p.dtype.size_bytes();
    let alloc_bytes = p.batch * p.max_seqlen_k * p.heads_kv * (p.head_dim_qk + p.head_dim_v) * e;
    let sets = rotation_sets(alloc_bytes, c.caps.l2_bytes);
    let inputs: Vec<DeviceInputs> = (0..sets)
        .map(|i| c.b.random_inputs(&p, 100 + i as u32, 2.0))
        .collect::<R<_>>()?;
    let mut out = c.b.alloc_outputs(&p)?;
    let prep_sk = c.b.prepare(&sk)?;
    let prep_fx = c.b.prepare(&fx)?;
    let mut checks = vec![];
    for (name, prep) in [("lean stream-K", &prep_sk), ("lean fixed split", &prep_fx)] {
        out.poison()?;
        prep.launch(&c.gpu, &inputs[0], &mut out)?;
        c.gpu.synchronize()?;
        checks.push(check_outputs(
            name,
            &p,
            100,
            None,
            &out,
            1,
            Algorithm::Lean,
            true,
        )?);
    }
    let check = worst(checks);
    let bytes = inputs[0].kv_bytes_read() as f64;
    let padded = s
        .is_ragged()
        .then_some("padded to the longest sequence (SDPA has no variable-length decode)");
    let row = Row {
        shape: s.clone(),
        algorithm: "lean".into(),
        variant: "stream-K".into(),
        backend: "cuda".into(),
        simulated: false,
        plan: if lp.schedule.one_cta_per_tile(&lp.tile_space(&p)) {
            format!("{} CTAs, one per tile", lp.num_ctas)
        } else {
            format!("{} CTAs", lp.num_ctas)
        },
        bytes,
        flops: s.flops(),
        timed: "one decode launch (+ the combine launch when the plan needs it)".into(),
        check,
        time: None,
        baselines: vec![],
        floor_ms: None,
        floor_bound: None,
    };
    if !row.check.passed {
        return Ok(untimed(row));
    }
    let t_sk = time(&c.gpu, sets, |i| {
        prep_sk.launch(&c.gpu, &inputs[i], &mut out)
    })?;
    let t_fx = time(&c.gpu, sets, |i| {
        prep_fx.launch(&c.gpu, &inputs[i], &mut out)
    })?;
    c.gpu.synchronize()?;
    let mut baselines = vec![Baseline {
        name: "fixed-split".into(),
        time: Some(t_fx),
        note: Some(format!(
            "the same kernel, FlashDecoding split {splits} + combine pass"
        )),
        error: None,
    }];
    baselines.extend(sdpa_baselines(padded));
    jobs.push(SdpaJob::new(
        row_index,
        JobKind::Decode,
        s,
        s.max_ctx(),
        sets,
    ));
    Ok(Row {
        time: Some(t_sk),
        baselines,
        ..row
    })
}

fn turbo_cfg() -> TurboConfig {
    TurboConfig {
        kv_bits: KvBits::Int4,
        ..TurboConfig::default()
    }
}

/// One TurboAttention prefill row (K/V quantisation pre-pass + INT8 attention, Alg. 1).
pub fn turbo_prefill_row(c: &Cuda, s: &Shape, jobs: &mut Vec<SdpaJob>, row_index: usize) -> R<Row> {
    let p = s.problem();
    let e = p.dtype.size_bytes();
    let set_bytes = p.batch
        * p.max_seqlen_k
        * (p.heads_q * p.head_dim_qk + p.heads_kv * (p.head_dim_qk + p.head_dim_v))
        * e;
    let sets = rotation_sets(set_bytes, c.caps.l2_bytes);
    let inputs: Vec<DeviceInputs> = (0..sets)
        .map(|i| c.b.random_inputs(&p, 7 + i as u32, 2.0))
        .collect::<R<_>>()?;
    let cfg = turbo_cfg();
    let prep = c.b.turbo_prepare_prefill(&cfg, &p)?;
    let mut out = c.b.alloc_outputs(&p)?;
    out.poison()?;
    c.b.turbo_launch_prefill(&prep, &inputs[0], &mut out, None)?;
    c.gpu.synchronize()?;
    let check = check_turbo(
        &p,
        7,
        None,
        &out,
        None,
        &cfg,
        &TurboCall::Prefill,
        cfg.block_q,
    )?;
    let row = Row {
        shape: s.clone(),
        algorithm: "turbo".into(),
        variant: "int4 cache config".into(),
        backend: "cuda".into(),
        simulated: false,
        plan: if c.b.turbo_prefill_uses_wgmma(&prep) {
            "wgmma".into()
        } else {
            "mma.sync".into()
        },
        bytes: (set_bytes + p.batch * p.max_seqlen_q * p.heads_q * p.head_dim_v * e) as f64,
        flops: s.flops(),
        timed: "K/V quantisation pre-pass + INT8 attention launch".into(),
        check,
        time: None,
        baselines: vec![],
        floor_ms: None,
        floor_bound: None,
    };
    if !row.check.passed {
        return Ok(untimed(row));
    }
    let t = time(&c.gpu, sets, |i| {
        c.b.turbo_launch_prefill(&prep, &inputs[i], &mut out, None)
    })?;
    c.gpu.synchronize()?;
    jobs.push(SdpaJob::new(
        row_index,
        JobKind::Prefill,
        s,
        s.max_ctx(),
        sets,
    ));
    Ok(Row {
        time: Some(t),
        baselines: sdpa_baselines(Some("bf16, GQA K/V expanded to every query head")),
        ..row
    })
}

/// Tokens the decode rows leave out of the cache: full blocks plus a partly filled INT8 buffer.
const DECODE_TAIL: usize = 37;

/// TurboAttention decode rows of one shape: a 4-bit and a mixed 2/4-bit cache, each against our
/// Lean kernel over the uncompressed bf16 cache and SDPA over an fp16 cache of the same length.
pub fn turbo_decode_rows(
    c: &Cuda,
    s: &Shape,
    jobs: &mut Vec<SdpaJob>,
    first_row: usize,
) -> R<Vec<Row>> {
    let (b, ctx, hq, hk, d, dtype) = (s.batch, s.max_ctx(), s.hq, s.hk, s.d, s.dtype);
    let len = ctx - DECODE_TAIL;
    // K/V of `len` valid tokens in buffers of `ctx` rows: the Lean baseline reads the same tokens
    let mut pk = AttentionProblem::uniform(b, 1, ctx, hq, hk, d, d, dtype);
    pk.seqlens_k = vec![len; b];
    let x = c.b.random_inputs(&pk, 11, 2.0)?;
    let pq = AttentionProblem::uniform(b, 1, 1, hq, hk, d, d, dtype);
    let qx = c.b.random_inputs(&pq, 13, 2.0)?;
    let q_fill = filled(13, &pq)[0];
    let mut out = c.b.alloc_outputs(&pq)?;
    let cfg = turbo_cfg();
    let prep = c.b.turbo_prepare_prefill(&cfg, &pk)?;
    let lens = vec![len; b];
    let shape = Shape {
        lens: lens.clone(),
        ..s.clone()
    };

    // our exact baseline: the Lean kernel over the same bf16 K/V
    let lean_base = lean_baseline(c, &pk, &x, 11, 11, "bf16")?;
    let job = SdpaJob::new(first_row, JobKind::Decode, &shape, ctx, 1);
    let mut rows = vec![];
    for (label, bits) in [
        ("int4", vec![4u8; hk]),
        (
            "mixed 2/4",
            (0..hk)
                .map(|h| if h % 2 == 0 { 4 } else { 2 })
                .collect::<Vec<u8>>(),
        ),
    ] {
        let mut caches = vec![c.b.turbo_alloc_cache(b, hk, d, bits.clone(), ctx + 64)?];
        c.b.turbo_compress(&prep, &x, &lens, &mut caches[0])?;
        let mem = caches[0].memory();
        let cache_bytes = mem.compressed_bytes + mem.buffer_bytes;
        let sets = rotation_sets(cache_bytes, c.caps.l2_bytes);
        for _ in 1..sets {
            let mut cache = c.b.turbo_alloc_cache(b, hk, d, bits.clone(), ctx + 64)?;
            c.b.turbo_compress(&prep, &x, &lens, &mut cache)?;
            caches.push(cache);
        }
        let sched =
            c.b.turbo_auto_schedule_for(caches[0].lens(), hq, hk, dtype, d)?;
        let preps = caches
            .iter()
            .map(|cache| {
                let pl = plan_decode(cache.lens(), &vec![0; b], hq, hk, sched)?;
                c.b.turbo_prepare_decode(pl, dtype, cache)
            })
            .collect::<R<Vec<_>>>()?;
        let units = match sched {
            DecodeSchedule::PerTile => "one unit per tile".to_string(),
            DecodeSchedule::StreamK(n) => format!("stream-K over {n} warps"),
            DecodeSchedule::Balanced { units, .. } => {
                format!("stream-K over at most {units} warps, cut by cost")
            }
        };
        // the emulation's order (one unit per output tile) against the emulation, then the timed
        // schedule against the f64 golden (see check::TURBO_VS_EMULATION)
        let per_tile = plan_decode(
            caches[0].lens(),
            &vec![0; b],
            hq,
            hk,
            DecodeSchedule::PerTile,
        )?;
        let prep_tile = c.b.turbo_prepare_decode(per_tile, dtype, &caches[0])?;
        let mut tile_out = c.b.alloc_outputs(&pq)?;
        tile_out.poison()?;
        c.b.turbo_launch_decode(
            &prep_tile,
            &cfg,
            &caches[0],
            &qx,
            &mut tile_out,
            pq.softmax_scale,
        )?;
        out.poison()?;
        c.b.turbo_launch_decode(&preps[0], &cfg, &caches[0], &qx, &mut out, pq.softmax_scale)?;
        c.gpu.synchronize()?;
        let mut pchk = pk.clone();
        pchk.seqlens_q = vec![1; b];
        let call = TurboCall::Decode {
            bits: bits.clone(),
            fast: c.b.turbo_decode_is_fast(),
        };
        let check = check_turbo(
            &pchk,
            11,
            Some(q_fill),
            &tile_out,
            Some(&out),
            &cfg,
            &call,
            1,
        )?;
        drop((prep_tile, tile_out));
        let mut row = Row {
            shape: shape.clone(),
            algorithm: "turbo".into(),
            variant: label.into(),
            backend: "cuda".into(),
            simulated: false,
            plan: units,
            bytes: cache_bytes as f64,
            flops: shape.flops(),
            timed: "decode launch + combine over the compressed cache (the append of the new token not included)".into(),
            check,
            time: None,
            baselines: vec![],
            floor_ms: None,
            floor_bound: None,
        };
        if row.check.passed {
            row.time = Some(time(&c.gpu, sets, |i| {
                c.b.turbo_launch_decode(
                    &preps[i],
                    &cfg,
                    &caches[i],
                    &qx,
                    &mut out,
                    pq.softmax_scale,
                )
            })?);
            c.gpu.synchronize()?;
            row.baselines = vec![lean_base.clone()];
            row.baselines
                .extend(sdpa_baselines(Some("fp16 cache of the same length")));
            jobs.push(SdpaJob {
                row: first_row + rows.len(),
                ..job.clone()
            });
        }
        rows.push(row);
    }
    Ok(rows)
}

/// TurboQuant configurations the decode rows time: (label, key bits, QJL keys, value bits). Only
/// those within `check::tolerance(TurboQuant)` of the f64 golden on the suite's uniform inputs:
/// fewer key bits (k3q-v3: rel. Frobenius 0.58-0.65, k2q-v2: 1.0-1.13 on the H200 run of
/// 6e416a6) would fail a check that was never derived for them, and their decode runs the same
/// kernel on the same bytes (`turboquant_decode --config k3q-v3,k2q-v2` times them).
fn turboquant_configs() -> Vec<(&'static str, u8, bool, u8)> {
    vec![("k4q-v3", 4, true, 3), ("k4-v3", 4, false, 3)]
}

/// TurboQuant decode rows of one shape (issue 10): for each configuration the fused decode over
/// the compressed cache (prepare + decode + merge launches), checked against the f64 golden with
/// TurboQuant's tolerance, then the compression of the whole context (keys + values launches, one
/// `append`) as its own row. Baselines: our Lean over the same fp16 K/V and SDPA over fp16.
pub fn turboquant_decode_rows(
    c: &Cuda,
    s: &Shape,
    jobs: &mut Vec<SdpaJob>,
    first_row: usize,
) -> R<Vec<Row>> {
    use ferrattn_core::turboquant::TurboQuantConfig;
    let p = s.problem();
    let seed = 17;
    let x = c.b.random_inputs(&p, seed, 2.0)?;
    let lean_base = lean_baseline(c, &p, &x, seed, seed + 100, "fp16")?;
    let mut rows = vec![];
    for (label, key_bits, key_qjl, value_bits) in turboquant_configs() {
        let cfg = TurboQuantConfig {
            key_bits,
            key_qjl,
            value_bits,
            ..TurboQuantConfig::paper_default(&p)
        };
        let tq = c.b.turboquant(&cfg, &p)?;
        let mut caches = vec![tq.alloc_cache(p.batch, p.heads_kv, p.max_seqlen_k)?];
        tq.compress_inputs(&mut caches[0], &x)?;
        let cache_bytes = caches[0].bytes_read();
        let sets = rotation_sets(cache_bytes, c.caps.l2_bytes);
        for _ in 1..sets {
            let mut cache = tq.alloc_cache(p.batch, p.heads_kv, p.max_seqlen_k)?;
            tq.compress_inputs(&mut cache, &x)?;
            caches.push(cache);
        }
        let preps = caches
            .iter()
            .map(|cache| tq.prepare_decode(&p, cache, None))
            .collect::<R<Vec<_>>>()?;
        let mut out = tq.alloc_outputs(&p)?;
        out.poison()?;
        tq.launch_decode_inputs(&preps[0], &x, &caches[0], &mut out)?;
        c.gpu.synchronize()?;
        let check = check_outputs(
            "turboquant decode",
            &p,
            seed,
            None,
            &out,
            1,
            Algorithm::TurboQuant,
            false,
        )?;
        let mut row = Row {
            shape: s.clone(),
            algorithm: "turboquant".into(),
            variant: label.into(),
            backend: "cuda".into(),
            simulated: false,
            plan: format!(
                "stream-K over {} warps, {} segments",
                preps[0].units, preps[0].segments
            ),
            bytes: cache_bytes as f64,
            flops: s.flops(),
            timed: "query preparation + fused decode + merge launches over the compressed cache"
                .into(),
            check,
            time: None,
            baselines: vec![],
            floor_ms: None,
            floor_bound: None,
        };
        if row.check.passed {
            row.time = Some(time(&c.gpu, sets, |i| {
                tq.launch_decode_inputs(&preps[i], &x, &caches[i], &mut out)
            })?);
            c.gpu.synchronize()?;
            row.baselines = vec![lean_base.clone()];
            row.baselines
                .extend(sdpa_baselines(Some("fp16 cache of the same length")));
            jobs.push(SdpaJob::new(
                first_row + rows.len(),
                JobKind::Decode,
                s,
                s.max_ctx(),
                1,
            ));
        }
        rows.push(row);
        drop((preps, out));
        // compression of the whole context: fp16 K/V read, the compressed cache written
        let mut cache = caches.swap_remove(0);
        drop(caches);
        let compress_bytes = (x.kv_bytes_read() + cache_bytes) as f64;
        let t = measure(
            &Method::DEVICE,
            &mut GpuClock::new(&c.gpu, false),
            1,
            |_| {
                cache.clear();
                tq.compress_inputs(&mut cache, &x)
            },
        )?;
        let compress_check = cache_check(&cache, &p);
        rows.push(Row {
            shape: s.clone(),
            algorithm: "turboquant".into(),
            variant: format!("{label} compress"),
            backend: "cuda".into(),
            simulated: false,
            plan: tq.names().compress_keys.clone(),
            bytes: compress_bytes,
            flops: 0.0,
            timed: "compression of the whole context (keys + values launches, one append; bytes: fp16 K/V read + cache written)".into(),
            time: compress_check.passed.then_some(t),
            check: compress_check,
            baselines: vec![],
            floor_ms: None,
            floor_bound: None,
        });
    }
    Ok(rows)
}

/// The compressed cache after a timed compression: every sequence holds its whole context and
/// the key norms of each (sequence, KV head)'s first token are finite and positive (the bit-exact
/// checks against the emulation are `gpu_turboquant`'s).
fn cache_check(
    cache: &ferrattn_cuda::turboquant::DeviceTurboQuantCache,
    p: &AttentionProblem,
) -> Check {
    let lens_ok = cache.lens() == p.seqlens_k.as_slice();
    let norms = cache.first_key_norms();
    let norms_ok = matches!(&norms, Ok(n) if n.iter().all(|v| v.is_finite() && *v > 0.0));
    let failure = (!lens_ok || !norms_ok).then(|| {
        format!(
            "cache lengths {:?} (want {:?}), first-token key norms {:?}",
            cache.lens(),
            p.seqlens_k,
            norms.map(|n| n.into_iter().take(8).collect::<Vec<_>>())
        )
    });
    Check {
        reference: "cache lengths and key norms (bit-exactness: gpu_turboquant)".into(),
        rel_fro: 0.0,
        max_abs: 0.0,
        cosine: 1.0,
        lse_max_abs: None,
        tol_rel_fro: 0.0,
        tol_max_abs: 0.0,
        passed: failure.is_none(),
        failure,
    }
}

/// The GPU, or why there is none.
pub fn open() -> std::result::Result<Cuda, String> {
    let b = CudaBackend::new(0);
    let gpu = b.gpu().map_err(|e| e.to_string())?.clone();
    let caps = gpu.caps.clone();
    // load the modules now, so a GPU whose kernels cannot load reports it here
    b.lean_module().map_err(|e| e.to_string())?;
    Ok(Cuda { b, gpu, caps })
}

/// `cuDriverGetVersion` and how the kernels were built.
/// Our exact baseline for a compressed-cache decode row: the Lean kernel over the same
/// uncompressed K/V `x` (inputs of `p` drawn with `seed`), checked against the golden, then timed
/// over input sets rotated past L2 (extra sets drawn with seeds `extra_seed + 1, ..`).
fn lean_baseline(
    c: &Cuda,
    p: &AttentionProblem,
    x: &DeviceInputs,
    seed: u32,
    extra_seed: u32,
    kv_dtype: &str,
) -> R<Baseline> {
    let lean_plan =
        plan(Algorithm::Lean, p, &c.caps).map_err(|e| CudaError::Plan(e.to_string()))?;
    let lean_prep = c.b.prepare(&lean_plan)?;
    let mut lean_out = c.b.alloc_outputs(p)?;
    lean_out.poison()?;
    lean_prep.launch(&c.gpu, x, &mut lean_out)?;
    c.gpu.synchronize()?;
    let lean_check = check_outputs(
        "lean baseline",
        p,
        seed,
        None,
        &lean_out,
        1,
        Algorithm::Lean,
        true,
    )?;
    let lean_sets = rotation_sets(x.kv_bytes_read(), c.caps.l2_bytes);
    let extra: Vec<DeviceInputs> = (1..lean_sets)
        .map(|i| c.b.random_inputs(p, extra_seed + i as u32, 2.0))
        .collect::<R<_>>()?;
    let lean_t = if lean_check.passed {
        Some(time(&c.gpu, lean_sets, |i| {
            lean_prep.launch(
                &c.gpu,
                if i == 0 { x } else { &extra[i - 1] },
                &mut lean_out,
            )
        })?)
    } else {
        None
    };
    Ok(Baseline {
        name: "lean-exact".into(),
        time: lean_t,
        note: Some(format!(
            "exact attention, Lean stream-K over the same {kv_dtype} K/V"
        )),
        error: (!lean_check.passed)
            .then(|| format!("check failed: {}", lean_check.failure.unwrap_or_default())),
    })
}

pub fn describe(c: &Cuda) -> (i32, String) {
    (c.gpu.driver_version, ferrattn_cuda::BUILD_NOTE.to_string())
}

/// The row floors and the dtype flag the INT8 rows use.
pub fn int8_rows(algorithm: &str, family: crate::bench::shapes::Family) -> bool {
    algorithm == "turbo" && family == crate::bench::shapes::Family::TurboPrefill
}
