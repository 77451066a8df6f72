//! A discrete-event timing model of the AMLA decode kernel (and of "Base") on an Ascend 910.
//!
//! SIMULATED: every number this module produces comes from a model, not from hardware.
//!
//! The model follows the kernel op by op. Each Cube core runs four in-order pipes (MTE2 GM -> L1,
//! MTE1 L1 -> L0A/L0B, MMAD, FixP L0C -> GM; Eq. 10) and each of its two Vector cores three
//! (MTE2 GM -> UB, VEC compute, MTE3 UB -> GM incl. atomics). An op starts when its pipe is free
//! and its inputs exist; inputs made on the other core type add a cross-core flag latency.
//! Buffer counts become dependencies: a load into an L1 ring slot, an L0 ping-pong buffer, an
//! L0C buffer or a UB buffer waits for the last reader of its previous occupant (section 4.2:
//! 4 Q/P buffers + a 3-buffer K/V ring of 72 KB, double-buffered L0A/L0B/L0C and UB).
//!
//! Stage order comes from the plan's Preload Pipeline ([`PreloadPipeline::cycles`]). AMLA's
//! `[V1]` ends with the `AtomicAdd<INT32>` rescale of O, which must see the previous block's
//! `[C2]` result in GM: the model makes that add wait for the previous `[C2]`'s FixP of the same
//! rows. (This dependency is not in the paper's chain; the constructed cycle issues `[C2]` first
//! on the Cube core, so it costs nothing in the steady loop.)
//!
//! "Base" (Algorithm 1): four stages, `[C2]` writes `T = P V` to GM and `[V2]` loads O and T into
//! UB, computes `O exp(m_{i-1} - m_i) + T` and stores O; its Preload Pipeline is constructed
//! (Theorem B.1) from the model's own stage-duration estimates.
//!
//! Work split: sequence `b` runs on core pair `b mod 48` (whole sequences, no split-KV), so batch
//! 96 gives every pair two sequences. HBM and L2 bandwidth are shared statically: each active core
//! pair gets `1 / (active pairs on its die)` of its die's bandwidth. Core pairs with the same
//! sequence lengths are simulated once.

use crate::config::Ascend910;
use ferrattn_core::amla::preload::{PreloadPipeline, StageDurations, Unit};
use ferrattn_core::amla::tiling::HierarchicalTiling;
use serde::Serialize;
use std::collections::HashMap;

/// Query heads of the paper's configuration (DeepSeek-V3 MLA without tensor parallelism), used
/// by [`simulate`] and [`simulate_lengths`]; [`simulate_plan`] takes any head count.
pub const HEADS: usize = 128;
/// Q/K head dimension (512 latent + 64 RoPE).
pub const DK: usize = 576;
/// V head dimension.
pub const DV: usize = 512;

/// The section 4.2 tiling as the model reads it, from a plan's [`HierarchicalTiling`].
#[derive(Clone, Debug)]
struct Tiles {
    /// KV tokens per block.
    block: usize,
    /// Rows of a Q/P stripe (singleM = baseM).
    base_m: usize,
    /// Output columns per L0C tile (baseN).
    base_n: usize,
    /// `[C1]` singleK and baseK.
    c1_single_k: usize,
    c1_base_k: usize,
    /// `[C2]` singleK and baseK.
    c2_single_k: usize,
    c2_base_k: usize,
    /// Rows of S per UB pass of a Vector core.
    vrows: usize,
    /// Buffer counts: Q/P in L1, the K/V ring, L0A/L0B, L0C, `[V1]`'s UB ring.
    qp_bufs: usize,
    kv_bufs: usize,
    l0_bufs: usize,
    l0c_bufs: usize,
    ub_bufs: usize,
}

impl Tiles {
    fn from_plan(t: &HierarchicalTiling) -> Tiles {
        let u = |x: u32| (x as usize).max(1);
        Tiles {
            block: u(t.block_k),
            base_m: u(t.c1.base_m),
            base_n: u(t.c1.base_n),
            c1_single_k: u(t.c1.single_k),
            c1_base_k: u(t.c1.base_k),
            c2_single_k: u(t.c2.single_k),
            c2_base_k: u(t.c2.base_k),
            vrows: u(t.vector_rows),
            qp_bufs: u(t.l1_qp_buffers),
            kv_bufs: u(t.l1_kv_buffers),
            l0_bufs: u(t.l0ab_buffers),
            l0c_bufs: u(t.l0c_buffers),
            ub_bufs: u(t.ub_buffers),
        }
    }
}

/// Which kernel the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// AMLA: three stages, O rescaled by `AtomicAdd<INT32>` in GM (Algorithm 2).
    Amla,
    /// Base: four stages, `[V2]` moves O between GM and UB every block (Algorithm 1).
    Base,
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Variant::Amla => "AMLA",
            Variant::Base => "Base",
        })
    }
}

/// The executing unit of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Core {
    /// The Cube core.
    Cube,
    /// Vector core 0 or 1 of the pair.
    Vector(u8),
}

/// A pipe of a core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Pipe {
    /// GM -> L1 (Cube) or GM -> UB (Vector).
    Mte2,
    /// L1 -> L0A/L0B.
    Mte1,
    /// Matrix multiply-accumulate.
    Mmad,
    /// L0C -> GM.
    Fixp,
    /// Vector compute.
    Vec,
    /// UB -> GM, including atomic adds.
    Mte3,
}

impl Pipe {
    /// Display name.
    pub fn name(self) -> &'static str {
        match self {
            Pipe::Mte2 => "MTE2",
            Pipe::Mte1 => "MTE1",
            Pipe::Mmad => "MMAD",
            Pipe::Fixp => "FixP",
            Pipe::Vec => "VEC",
            Pipe::Mte3 => "MTE3",
        }
    }
}

/// Which algorithm stage an op belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Stage {
    /// `S = Q K^T`.
    C1,
    /// Online softmax (+ AMLA's INT32 rescale).
    V1,
    /// `P V`.
    C2,
    /// Base's O rescale through UB.
    V2,
    /// Final normalisation.
    Last,
}

/// One simulated op.
#[derive(Clone, Debug, Serialize)]
pub struct Op {
    /// Executing core.
    pub core: Core,
    /// Pipe.
    pub pipe: Pipe,
    /// Stage.
    pub stage: Stage,
    /// KV block (0-based) within its sequence.
    pub block: usize,
    /// Sequence index on this core pair.
    pub seq: usize,
    /// Start, seconds.
    pub start: f64,
    /// End, seconds (start + pipe occupancy + memory latency).
    pub end: f64,
    /// Time the op holds its pipe, seconds (`end - start` less the latency).
    pub occupy: f64,
    #[serde(skip)]
    pred: Option<usize>,
}

/// Busy fraction of one pipe (averaged over the core pairs that ran work).
#[derive(Clone, Debug, Serialize)]
pub struct PipeBusy {
    /// `cube` or `vector`.
    pub core: &'static str,
    /// Pipe name.
    pub pipe: &'static str,
    /// Busy time / kernel duration, percent.
    pub busy_pct: f64,
}

/// Share of the critical path spent in one pipe and stage.
#[derive(Clone, Debug, Serialize)]
pub struct PathShare {
    /// `cube`, `vector` or `wait` (flag latency / idle gaps).
    pub core: &'static str,
    /// Pipe name (or `flag`).
    pub pipe: &'static str,
    /// Stage name.
    pub stage: String,
    /// Percent of the kernel duration.
    pub pct: f64,
}

/// Result of one simulated run. SIMULATED: not a hardware measurement.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    /// Always starts with "simulated": what produced these numbers.
    pub provenance: String,
    /// AMLA or Base.
    pub variant: Variant,
    /// Sequences.
    pub batch: usize,
    /// Query tokens per sequence.
    pub sq: usize,
    /// KV tokens per sequence.
    pub sk: usize,
    /// Query heads (128).
    pub heads: usize,
    /// Preload count of the pipeline used.
    pub preload_count: usize,
    /// Core pairs that received work.
    pub core_pairs_used: usize,
    /// Kernel duration, microseconds.
    pub duration_us: f64,
    /// Achieved TFLOP/s, counting `2 Hq Sq Sk (Dk + Dv)` per sequence (section 2.4).
    pub tflops: f64,
    /// FLOPS utilisation: achieved / peak (707.8 TFLOP/s), percent.
    pub fu_pct: f64,
    /// Mean busy percent of the Cube cores' MMAD pipes.
    pub cube_busy_pct: f64,
    /// Mean busy percent of the Vector cores' VEC pipes.
    pub vector_busy_pct: f64,
    /// Busy percent of every pipe.
    pub pipes: Vec<PipeBusy>,
    /// Critical-path composition, largest first.
    pub critical_path: Vec<PathShare>,
    /// Ops of core pair 0, for the timeline.
    #[serde(skip)]
    pub trace: Vec<Op>,
}

impl std::fmt::Display for SimReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} (SIMULATED timing model, not a measurement)",
            self.provenance
        )?;
        writeln!(
            f,
            "{} decode  batch {}  Sq {}  Sk {}  heads {}  preload count {}  core pairs {}",
            self.variant,
            self.batch,
            self.sq,
            self.sk,
            self.heads,
            self.preload_count,
            self.core_pairs_used
        )?;
        writeln!(f, "  duration      {:>10.1} us", self.duration_us)?;
        writeln!(f, "  throughput    {:>10.1} TFLOP/s", self.tflops)?;
        writeln!(f, "  FLOPS util.   {:>10.1} %", self.fu_pct)?;
        writeln!(f, "  Cube MMAD     {:>10.1} % busy", self.cube_busy_pct)?;
        writeln!(f, "  Vector VEC    {:>10.1} % busy", self.vector_busy_pct)?;
        writeln!(f, "  pipe            busy %")?;
        for p in &self.pipes {
            writeln!(f, "  {:<6} {:<6} {:>8.1}", p.core, p.pipe, p.busy_pct)?;
        }
        writeln!(f, "  critical path (share of duration)")?;
        for c in self.critical_path.iter().take(8) {
            writeln!(
                f,
                "  {:<6} {:<6} {:<5} {:>8.1} %",
                c.core, c.pipe, c.stage, c.pct
            )?;
        }
        Ok(())
    }
}

/// FLOPs of one decode step with the paper's 128 heads: `2 Hq Sq Sk (Dk + Dv)` per sequence
/// (section 2.4).
pub fn flops(batch: usize, sq: usize, sk: usize) -> f64 {
    flops_heads(HEADS, batch, sq, sk)
}

/// [`flops`] for `heads` query heads.
pub fn flops_heads(heads: usize, batch: usize, sq: usize, sk: usize) -> f64 {
    2.0 * (heads * sq * sk * (DK + DV) * batch) as f64
}

/// Simulates the kernel for `batch` sequences of `sq` query tokens and `sk` KV tokens, with the
/// paper's configuration (128 heads, [`HierarchicalTiling::ascend910`]).
pub fn simulate(hw: &Ascend910, batch: usize, sq: usize, sk: usize, variant: Variant) -> SimReport {
    simulate_lengths(hw, sq, &vec![sk; batch], variant)
}

/// Like [`simulate`] with one KV length per sequence.
pub fn simulate_lengths(
    hw: &Ascend910,
    sq: usize,
    seqlens_k: &[usize],
    variant: Variant,
) -> SimReport {
    simulate_plan(
        hw,
        &HierarchicalTiling::ascend910(),
        HEADS,
        sq,
        seqlens_k,
        variant,
    )
}

/// Simulates the kernel with a plan's tiling (block size, singleK/baseK of both Cube stages,
/// baseM/baseN, the buffer counts, the Vector rows per UB pass) and `heads` query heads.
pub fn simulate_plan(
    hw: &Ascend910,
    tiling: &HierarchicalTiling,
    heads: usize,
    sq: usize,
    seqlens_k: &[usize],
    variant: Variant,
) -> SimReport {
    assert!((1..=2).contains(&sq), "AMLA decode covers Sq = 1 or 2");
    let tiles = Tiles::from_plan(tiling);
    let pairs = hw.cube_cores();
    let mut work: Vec<Vec<usize>> = vec![Vec::new(); pairs];
    for (b, &sk) in seqlens_k.iter().enumerate() {
        work[b % pairs].push(sk);
    }
    let used = work.iter().filter(|w| !w.is_empty()).count().max(1);
    let mut per_die = vec![0usize; hw.dies];
    for (c, w) in work.iter().enumerate() {
        if !w.is_empty() {
            per_die[c / hw.cube_per_die] += 1;
        }
    }
    let mut memo: HashMap<(Vec<usize>, usize), PairResult> = HashMap::new();
    let mut duration: f64 = 0.0;
    let mut busy: HashMap<(Core, Pipe), f64> = HashMap::new();
    let mut slowest: Option<PairResult> = None;
    let mut trace = Vec::new();
    let mut preload_count = 0;
    for (c, w) in work.iter().enumerate() {
        if w.is_empty() {
            continue;
        }
        let sharing = per_die[c / hw.cube_per_die];
        let r = memo
            .entry((w.clone(), sharing))
            .or_insert_with(|| simulate_pair(hw, &tiles, heads, sq, w, sharing, variant))
            .clone();
        for (k, v) in &r.busy {
            *busy.entry(*k).or_default() += v;
        }
        if trace.is_empty() {
            trace = r.ops.clone();
        }
        preload_count = r.preload_count;
        if r.duration > duration {
            duration = r.duration;
            slowest = Some(r);
        }
    }
    let total_flops: f64 = seqlens_k
        .iter()
        .map(|&sk| flops_heads(heads, 1, sq, sk))
        .sum();
    let tflops = total_flops / duration / 1e12;
    let denom = duration * used as f64;
    let pct =
        |core: Core, pipe: Pipe| busy.get(&(core, pipe)).copied().unwrap_or(0.0) / denom * 100.0;
    let mut pipes = Vec::new();
    for pipe in [Pipe::Mte2, Pipe::Mte1, Pipe::Mmad, Pipe::Fixp] {
        pipes.push(PipeBusy {
            core: "cube",
            pipe: pipe.name(),
            busy_pct: pct(Core::Cube, pipe),
        });
    }
    for pipe in [Pipe::Mte2, Pipe::Vec, Pipe::Mte3] {
        let v = (pct(Core::Vector(0), pipe) + pct(Core::Vector(1), pipe)) / 2.0;
        pipes.push(PipeBusy {
            core: "vector",
            pipe: pipe.name(),
            busy_pct: v,
        });
    }
    let cube_busy_pct = pct(Core::Cube, Pipe::Mmad);
    let vector_busy_pct = (pct(Core::Vector(0), Pipe::Vec) + pct(Core::Vector(1), Pipe::Vec)) / 2.0;
    let critical_path = slowest
        .map(|r| critical_path(&r.ops, r.duration))
        .unwrap_or_default();
    SimReport {
        provenance:
            "simulated Ascend 910 (discrete-event model of ferrattn-ascend; constants in config.rs)"
                .into(),
        variant,
        batch: seqlens_k.len(),
        sq,
        sk: seqlens_k.iter().copied().max().unwrap_or(0),
        heads,
        preload_count,
        core_pairs_used: used,
        duration_us: duration * 1e6,
        tflops,
        fu_pct: total_flops / duration / hw.peak_flops() * 100.0,
        cube_busy_pct,
        vector_busy_pct,
        pipes,
        critical_path,
        trace,
    }
}

#[derive(Clone)]
struct PairResult {
    duration: f64,
    busy: HashMap<(Core, Pipe), f64>,
    ops: Vec<Op>,
    preload_count: usize,
}

/// Where a transfer's bytes come from or go to.
#[derive(Clone, Copy)]
enum Mem {
    Hbm,
    L2,
    L2Atomic,
    Local,
}

struct Model<'a> {
    hw: &'a Ascend910,
    clock: f64,
    hbm_share: f64,
    l2_share: f64,
    free: HashMap<(Core, Pipe), f64>,
    last: HashMap<(Core, Pipe), usize>,
    ops: Vec<Op>,
    seq: usize,
    tiles: &'a Tiles,
    // ring / ping-pong buffers: last reader of each slot
    qp_slot: Vec<Option<usize>>,
    kv_slot: Vec<Option<usize>>,
    kv_next: usize,
    l0_slot: Vec<Option<usize>>,
    l0_next: usize,
    l0c_slot: Vec<Option<usize>>,
    l0c_next: usize,
    // per Vector core: ring 0 = V1's buffers (ub_buffers), ring 1 = the single buffer UB has
    // left (AMLA's INT32 tile, Base's O + T chunk, the final normalisation)
    ub_slot: [[Vec<Option<usize>>; 2]; 2],
    ub_next: [[usize; 2]; 2],
}

/// UB ring of a Vector pass.
#[derive(Clone, Copy)]
enum Ring {
    /// `[V1]`'s S/P chunks (tiling `ub_buffers`, 2 in the paper).
    Softmax,
    /// The one buffer left beside them.
    Aux,
}

impl<'a> Model<'a> {
    /// `(pipe occupancy, latency)` of a transfer: a DMA pipe streams back to back, so the GM
    /// latency delays the op's completion but not the next transfer on the pipe.
    fn transfer(&self, bytes: f64, pipe_bytes_per_clock: f64, mem: Mem) -> (f64, f64) {
        let pipe_bw = pipe_bytes_per_clock * self.clock;
        let (bw, lat) = match mem {
            Mem::Hbm => (pipe_bw.min(self.hbm_share), self.hw.gm_latency_clocks),
            Mem::L2 => (pipe_bw.min(self.l2_share), self.hw.gm_latency_clocks),
            Mem::L2Atomic => (
                pipe_bw.min(self.l2_share / self.hw.atomic_l2_factor),
                self.hw.gm_latency_clocks,
            ),
            Mem::Local => (pipe_bw, 0.0),
        };
        (bytes / bw, lat / self.clock)
    }

    fn issue(
        &mut self,
        core: Core,
        pipe: Pipe,
        dur: (f64, f64),
        deps: &[Option<usize>],
        stage: Stage,
        block: usize,
    ) -> usize {
        let (occupy, latency) = dur;
        let mut ready = 0.0f64;
        let mut pred = self.last.get(&(core, pipe)).copied();
        let free = self.free.get(&(core, pipe)).copied().unwrap_or(0.0);
        let mut best = free;
        for d in deps.iter().flatten() {
            let o = &self.ops[*d];
            let cross = (o.core == Core::Cube) != (core == Core::Cube);
            let t = o.end
                + if cross {
                    self.hw.flag_latency_clocks / self.clock
                } else {
                    0.0
                };
            ready = ready.max(t);
            if t > best {
                best = t;
                pred = Some(*d);
            }
        }
        let start = free.max(ready);
        let id = self.ops.len();
        self.ops.push(Op {
            core,
            pipe,
            stage,
            block,
            seq: self.seq,
            start,
            end: start + occupy + latency,
            occupy,
            pred,
        });
        self.free.insert((core, pipe), start + occupy);
        self.last.insert((core, pipe), id);
        id
    }

    fn mmad(&self, m: usize, n: usize, k: usize) -> (f64, f64) {
        let pad = |x: usize| x.div_ceil(16) * 16;
        let flops = 2.0 * (pad(m) * pad(n) * pad(k)) as f64;
        (
            flops / (self.hw.target.cube_flops_per_clock * self.hw.mmad_efficiency) / self.clock,
            0.0,
        )
    }

    /// One Cube stage: `out[rows, n_total] = A[rows, k_total] B^T` with the paper's tiling.
    /// Returns the last FixP op of each 128-row stripe.
    #[allow(clippy::too_many_arguments)] // the stage's shape and its memory sources
    fn cube_stage(
        &mut self,
        stage: Stage,
        block: usize,
        rows: usize,
        n_total: usize,
        k_total: usize,
        single_k: usize,
        base_k: usize,
        a_mem: Mem,
        a_ready: &[Vec<usize>],
        b_mem: Mem,
        out_mem: Mem,
        out_ready_wait: &[usize],
    ) -> Vec<usize> {
        let (base_m, base_n) = (self.tiles.base_m, self.tiles.base_n);
        let (qp_bufs, kv_bufs) = (self.tiles.qp_bufs, self.tiles.kv_bufs);
        let (l0_bufs, l0c_bufs) = (self.tiles.l0_bufs, self.tiles.l0c_bufs);
        let stripes = rows.div_ceil(base_m);
        let kcs = k_total.div_ceil(single_k);
        // A stripes go into the Q/P buffers at their first use (inside the first N tile), so
        // the in-order MTE2 queue is never blocked behind a stripe whose slot is still busy.
        let mut a_load: Vec<Vec<Option<usize>>> = vec![vec![None; kcs]; stripes];
        let mut last_fixp = vec![0usize; stripes];
        let mut a_last_read = vec![vec![None; kcs]; stripes];
        for n in 0..n_total.div_ceil(base_n) {
            let nw = (n_total - n * base_n).min(base_n);
            let mut b_load = Vec::with_capacity(kcs);
            for kc in 0..kcs {
                let kw = (k_total - kc * single_k).min(single_k);
                let slot = self.kv_next % kv_bufs;
                self.kv_next += 1;
                let dur = self.transfer((nw * kw * 2) as f64, self.hw.mte2_bytes_per_clock, b_mem);
                let id = self.issue(
                    Core::Cube,
                    Pipe::Mte2,
                    dur,
                    &[self.kv_slot[slot]],
                    stage,
                    block,
                );
                b_load.push((id, slot));
            }
            let mut b_last_read = vec![None; kcs];
            for m in 0..stripes {
                let mr = (rows - m * base_m).min(base_m);
                #[allow(clippy::needless_range_loop)] // kc also picks the slot and the K range
                for kc in 0..kcs {
                    if a_load[m][kc].is_none() {
                        let kw = (k_total - kc * single_k).min(single_k);
                        let slot = (m * kcs + kc) % qp_bufs;
                        let dur = self.transfer(
                            (mr * kw * 2) as f64,
                            self.hw.mte2_bytes_per_clock,
                            a_mem,
                        );
                        let mut deps = vec![self.qp_slot[slot]];
                        deps.extend(a_ready.get(m).into_iter().flatten().map(|&d| Some(d)));
                        a_load[m][kc] =
                            Some(self.issue(Core::Cube, Pipe::Mte2, dur, &deps, stage, block));
                    }
                }
                let c_slot = self.l0c_next % l0c_bufs;
                self.l0c_next += 1;
                let mut first = true;
                let mut last_mmad = 0;
                for kc in 0..kcs {
                    let kw = (k_total - kc * single_k).min(single_k);
                    for ks in 0..kw.div_ceil(base_k) {
                        let bk = (kw - ks * base_k).min(base_k);
                        let l0 = self.l0_next % l0_bufs;
                        self.l0_next += 1;
                        let dur = self.transfer(
                            ((mr + nw) * bk * 2) as f64,
                            self.hw.mte1_bytes_per_clock,
                            Mem::Local,
                        );
                        let ld = self.issue(
                            Core::Cube,
                            Pipe::Mte1,
                            dur,
                            &[a_load[m][kc], Some(b_load[kc].0), self.l0_slot[l0]],
                            stage,
                            block,
                        );
                        let c_dep = if first { self.l0c_slot[c_slot] } else { None };
                        first = false;
                        let mm = self.mmad(mr, nw, bk);
                        last_mmad = self.issue(
                            Core::Cube,
                            Pipe::Mmad,
                            mm,
                            &[Some(ld), c_dep],
                            stage,
                            block,
                        );
                        self.l0_slot[l0] = Some(last_mmad);
                        a_last_read[m][kc] = Some(ld);
                        b_last_read[kc] = Some(ld);
                    }
                }
                let dur =
                    self.transfer((mr * nw * 4) as f64, self.hw.fixp_bytes_per_clock, out_mem);
                let mut deps = vec![Some(last_mmad)];
                deps.extend(out_ready_wait.iter().map(|&d| Some(d)));
                let fx = self.issue(Core::Cube, Pipe::Fixp, dur, &deps, stage, block);
                self.l0c_slot[c_slot] = Some(fx);
                last_fixp[m] = fx;
            }
            for (kc, (_, slot)) in b_load.iter().enumerate() {
                self.kv_slot[*slot] = b_last_read[kc];
            }
        }
        for (m, reads) in a_last_read.iter().enumerate() {
            for (kc, &read) in reads.iter().enumerate() {
                self.qp_slot[(m * kcs + kc) % qp_bufs] = read;
            }
        }
        last_fixp
    }

    /// A Vector op on chunk `rows` of core `v`: load, compute, store, double-buffered in UB.
    #[allow(clippy::too_many_arguments)] // one UB pass: its three transfers and their sources
    fn vector_pass(
        &mut self,
        v: u8,
        ring: Ring,
        stage: Stage,
        block: usize,
        load: &[(f64, Mem)],
        compute_elems: f64,
        store: &[(f64, Mem)],
        deps: &[Option<usize>],
    ) -> usize {
        let core = Core::Vector(v);
        let (r, slots) = match ring {
            Ring::Softmax => (0, self.tiles.ub_bufs),
            Ring::Aux => (1, 1),
        };
        let slot = self.ub_next[v as usize][r] % slots;
        self.ub_next[v as usize][r] += 1;
        let mut d = deps.to_vec();
        d.push(self.ub_slot[v as usize][r][slot]);
        let mut prev = None;
        for &(bytes, mem) in load {
            let dur = self.transfer(bytes, self.hw.vec_gm_bytes_per_clock, mem);
            let mut dd = d.clone();
            dd.push(prev);
            prev = Some(self.issue(core, Pipe::Mte2, dur, &dd, stage, block));
        }
        let dur = (compute_elems / self.hw.vec_fp32_lanes / self.clock, 0.0);
        let mut dd = d.clone();
        dd.push(prev);
        let mut last = self.issue(core, Pipe::Vec, dur, &dd, stage, block);
        for &(bytes, mem) in store {
            let dur = self.transfer(bytes, self.hw.vec_gm_bytes_per_clock, mem);
            last = self.issue(core, Pipe::Mte3, dur, &[Some(last)], stage, block);
        }
        self.ub_slot[v as usize][r][slot] = Some(last);
        last
    }
}

fn simulate_pair(
    hw: &Ascend910,
    tl: &Tiles,
    heads: usize,
    sq: usize,
    seqs: &[usize],
    sharing: usize,
    variant: Variant,
) -> PairResult {
    let clock = hw.clock();
    let mut md = Model {
        hw,
        clock,
        hbm_share: hw.hbm_bytes_per_s_per_die / sharing as f64,
        l2_share: hw.l2_bytes_per_s_per_die / sharing as f64,
        free: HashMap::new(),
        last: HashMap::new(),
        ops: Vec::new(),
        seq: 0,
        tiles: tl,
        qp_slot: vec![None; tl.qp_bufs],
        kv_slot: vec![None; tl.kv_bufs],
        kv_next: 0,
        l0_slot: vec![None; tl.l0_bufs],
        l0_next: 0,
        l0c_slot: vec![None; tl.l0c_bufs],
        l0c_next: 0,
        ub_slot: std::array::from_fn(|_| [vec![None; tl.ub_bufs], vec![None; 1]]),
        ub_next: [[0; 2]; 2],
    };
    let rows = sq * heads;
    let (block, base_m, vrows) = (tl.block, tl.base_m, tl.vrows);
    let pipeline = match variant {
        Variant::Amla => PreloadPipeline::amla_default(),
        Variant::Base => PreloadPipeline::construct(&base_stage_estimates_block(hw, rows, block))
            .expect("stage estimates are finite and non-negative"),
    };
    let v_rows = [0..rows.div_ceil(2), rows.div_ceil(2)..rows];
    let v1_passes = 6.0 + hw.vec_exp_cost; // muls, max, sub, exp, sum, muls S16, cast
    for (si, &sk) in seqs.iter().enumerate() {
        md.seq = si;
        let blocks = sk.div_ceil(block);
        let width = |t: usize| (sk - t * block).min(block);
        let stripe_of = |r: usize| r / base_m;
        let mut c1_done: Vec<Vec<usize>> = vec![Vec::new(); blocks];
        let mut v1_done: Vec<Vec<Vec<usize>>> =
            vec![vec![Vec::new(); rows.div_ceil(base_m)]; blocks];
        let mut c2_done: Vec<Vec<usize>> = vec![Vec::new(); blocks];
        let mut v2_done: Vec<Vec<usize>> = vec![Vec::new(); blocks];
        for cycle in pipeline.cycles(blocks) {
            for op in cycle.cube.iter().chain(&cycle.vector) {
                let t = op.block;
                let w = width(t);
                match (op.unit, op.stage) {
                    (Unit::Cube, 1) => {
                        // Q from HBM on a sequence's first block, from L2 after (section 4.2)
                        let q_mem = if t == 0 { Mem::Hbm } else { Mem::L2 };
                        c1_done[t] = md.cube_stage(
                            Stage::C1,
                            t,
                            rows,
                            w,
                            DK,
                            tl.c1_single_k,
                            tl.c1_base_k,
                            q_mem,
                            &[],
                            Mem::Hbm,
                            Mem::L2,
                            &[],
                        );
                    }
                    (Unit::Vector, 1) => {
                        for (v, range) in v_rows.iter().enumerate() {
                            let mut r = range.start;
                            while r < range.end {
                                let n = (range.end - r).min(vrows);
                                let dep = Some(c1_done[t][stripe_of(r)]);
                                let p_store = [((n * w * 2) as f64, Mem::L2)];
                                let last = md.vector_pass(
                                    v as u8,
                                    Ring::Softmax,
                                    Stage::V1,
                                    t,
                                    &[((n * w * 4) as f64, Mem::L2)],
                                    (n * w) as f64 * v1_passes,
                                    &p_store,
                                    &[dep],
                                );
                                let last = if variant == Variant::Amla && t > 0 {
                                    // AtomicAdd<INT32> of N on the rows of O: after [C2](t-1)
                                    let prev_c2 = Some(c2_done[t - 1][stripe_of(r)]);
                                    md.vector_pass(
                                        v as u8,
                                        Ring::Aux,
                                        Stage::V1,
                                        t,
                                        &[],
                                        (n * DV) as f64,
                                        &[((n * DV * 4) as f64, Mem::L2Atomic)],
                                        &[prev_c2],
                                    )
                                    .max(last)
                                } else {
                                    last
                                };
                                v1_done[t][stripe_of(r)].push(last);
                                r += n;
                            }
                        }
                    }
                    (Unit::Cube, 2) => {
                        let out = if variant == Variant::Amla {
                            Mem::L2Atomic
                        } else {
                            Mem::L2
                        };
                        // Base reuses its T workspace: wait until [V2] of the previous block read it
                        let wait = if variant == Variant::Base && t > 0 {
                            v2_done[t - 1].clone()
                        } else {
                            vec![]
                        };
                        c2_done[t] = md.cube_stage(
                            Stage::C2,
                            t,
                            rows,
                            DV,
                            w,
                            tl.c2_single_k,
                            tl.c2_base_k,
                            Mem::L2,
                            &v1_done[t],
                            Mem::L2,
                            out,
                            &wait,
                        );
                    }
                    (Unit::Vector, 2) if variant == Variant::Base => {
                        let mut last = Vec::new();
                        for (v, range) in v_rows.iter().enumerate() {
                            let mut r = range.start;
                            while r < range.end {
                                let n = (range.end - r).min(vrows);
                                let bytes = (n * DV * 4) as f64;
                                let load: Vec<(f64, Mem)> = if t == 0 {
                                    vec![(bytes, Mem::L2)]
                                } else {
                                    vec![(bytes, Mem::L2), (bytes, Mem::L2)]
                                };
                                let id = md.vector_pass(
                                    v as u8,
                                    Ring::Aux,
                                    Stage::V2,
                                    t,
                                    &load,
                                    (n * DV) as f64 * 2.0,
                                    &[(bytes, Mem::L2)],
                                    &[Some(c2_done[t][stripe_of(r)])],
                                );
                                last.push(id);
                                r += n;
                            }
                        }
                        v2_done[t] = last;
                    }
                    _ => {}
                }
            }
        }
        // Last [V]: O / (l S16) (AMLA) or O / l (Base), cast to BF16, store O and LSE
        for (v, range) in v_rows.iter().enumerate() {
            let mut r = range.start;
            while r < range.end {
                let n = (range.end - r).min(vrows);
                let deps: Vec<Option<usize>> = match (variant, blocks.checked_sub(1)) {
                    (_, None) => vec![],
                    (Variant::Amla, Some(t)) => vec![Some(c2_done[t][stripe_of(r)])],
                    (Variant::Base, Some(t)) => v2_done[t].iter().map(|&d| Some(d)).collect(),
                };
                md.vector_pass(
                    v as u8,
                    Ring::Aux,
                    Stage::Last,
                    blocks.saturating_sub(1),
                    &[((n * DV * 4) as f64, Mem::L2)],
                    (n * DV) as f64 * 2.0,
                    &[((n * DV * 2 + n * 4) as f64, Mem::Hbm)],
                    &deps,
                );
                r += n;
            }
        }
    }
    let duration = md.ops.iter().map(|o| o.end).fold(0.0, f64::max);
    let mut busy: HashMap<(Core, Pipe), f64> = HashMap::new();
    for o in &md.ops {
        *busy.entry((o.core, o.pipe)).or_default() += o.occupy;
    }
    PairResult {
        duration,
        busy,
        ops: md.ops,
        preload_count: pipeline.preload_count,
    }
}

/// Rough per-block stage durations of Base on this model (seconds), for constructing its
/// Preload Pipeline (Theorem B.1 needs only their order of magnitude to pick `k`), with the
/// paper's 512-token blocks.
pub fn base_stage_estimates(hw: &Ascend910, rows: usize) -> StageDurations {
    base_stage_estimates_block(hw, rows, 512)
}

/// [`base_stage_estimates`] for blocks of `block` KV tokens.
pub fn base_stage_estimates_block(hw: &Ascend910, rows: usize, block: usize) -> StageDurations {
    let clock = hw.clock();
    let rate = hw.target.cube_flops_per_clock * hw.mmad_efficiency * clock;
    let c1 = 2.0 * (rows * block * DK) as f64 / rate;
    let c2 = 2.0 * (rows * block * DV) as f64 / rate;
    let vrows = rows.div_ceil(2) as f64;
    let vbw = hw.vec_gm_bytes_per_clock * clock;
    let v1 = vrows * block as f64 * (6.0 + hw.vec_exp_cost) / hw.vec_fp32_lanes / clock
        + vrows * block as f64 * 6.0 / vbw;
    let v2 = vrows * DV as f64 * 2.0 / hw.vec_fp32_lanes / clock + vrows * DV as f64 * 12.0 / vbw;
    StageDurations {
        cube: vec![c1, c2],
        vector: vec![v1, v2],
    }
}

fn critical_path(ops: &[Op], duration: f64) -> Vec<PathShare> {
    let Some(mut cur) = (0..ops.len()).max_by(|&a, &b| ops[a].end.total_cmp(&ops[b].end)) else {
        return Vec::new();
    };
    let mut acc: HashMap<(&'static str, &'static str, String), f64> = HashMap::new();
    loop {
        let o = &ops[cur];
        let core = if o.core == Core::Cube {
            "cube"
        } else {
            "vector"
        };
        *acc.entry((core, o.pipe.name(), format!("{:?}", o.stage)))
            .or_default() += o.occupy;
        if o.end - o.start > o.occupy {
            *acc.entry(("wait", "GM", "latency".into())).or_default() += o.end - o.start - o.occupy;
        }
        match o.pred {
            Some(p) => {
                let gap = o.start - ops[p].end;
                if gap > 0.0 {
                    *acc.entry(("wait", "flag", "-".into())).or_default() += gap;
                }
                cur = p;
            }
            None => {
                if o.start > 0.0 {
                    *acc.entry(("wait", "flag", "-".into())).or_default() += o.start;
                }
                break;
            }
        }
    }
    let mut v: Vec<PathShare> = acc
        .into_iter()
        .map(|((core, pipe, stage), t)| PathShare {
            core,
            pipe,
            stage,
            pct: t / duration * 100.0,
        })
        .collect();
    v.sort_by(|a, b| b.pct.total_cmp(&a.pct));
    v
}
