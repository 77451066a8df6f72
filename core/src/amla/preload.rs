//! AMLA Preload Pipeline (section 4.1, Theorem 4.1, Appendix B).
//!
//! A FlashAttention iteration over one KV block is a chain of `n` Cube/Vector stage pairs,
//! `[C1] -> [V1] -> [C2] -> [V2] -> ... -> [Cn] -> [Vn]`; Cube stages run on the Cube core and
//! Vector stages on its Vector cores, which exchange data only through global memory. The Preload
//! Pipeline runs a *steady cycle* that holds every stage once, each for a different block: in
//! cycle `c` the stage `s` works on block `c - lag(s)`. A dependency whose two ends share a lag is
//! *internal* (resolved inside the cycle); one whose consumer lags one cycle more is *external*
//! (resolved by the previous cycle). The lag of `[Vn]` is the Preload count: the number of `[C1]`
//! stages issued before the first full cycle (Lemma B.1: `(2n - 1) - internal chains`).
//!
//! Theorem 4.1: a Preload count below `n` cannot be stall-free for every choice of stage
//! durations, and a count of `n` always can. [`PreloadPipeline::construct`] builds the count-`n`
//! cycle of Appendix B.4: with `a_i = [V_i] - [C_{i+1}]` (cyclic) and `F(l) = a_1 + ... + a_l`,
//! pick `k` minimising `F`; the Cube core issues `C_{k+2}, ..., C_{k+1}` (cyclically), the Vector
//! core `V_{k+1}, ..., V_k`, and every `[C_j] -> [V_j]` except `j = k + 1` is internal. Appendix
//! B.3 lists the internal chains as `[C_j] -> [V_j]` (Fig. 11); Theorem 4.1 calls them `[V] -> [C]`,
//! which we read as loose wording, since an internal `[V_j] -> [C_{j+1}]` would make the Cube core
//! wait for a Vector stage inside its own cycle. The same `k` serves the Vector-dominated case
//! (`sum [V] >= sum [C]`); the proof of B.4 goes through with the roles of the two cores swapped.
//!
//! [`PreloadPipeline::check`] replays a cycle order with as-soon-as-possible list scheduling of
//! both cores and measures the steady period, so any schedule (including one with a Preload count
//! below `n`) is judged by what it does rather than by a formula. It replays either the paper's
//! model ([`CycleModel::Barrier`]: a cycle is a closed window, in which Theorem 4.1 holds) or pure
//! dataflow ([`CycleModel::Dataflow`]: what cross-core flags enforce; a Vector stage may straddle
//! two cycles, and then fewer preloads can suffice, see the tests).
//!
//! AMLA itself is `n = 2` with `[V2] = 0` (section 4.1.3): `k = 2`, so the cycle holds
//! `C2(t-2), C1(t)` on the Cube core and `V1(t-1)` on the Vector core, the Preload phase issues
//! `C1(0), V1(0), C1(1)` and the drain `C2(N-2), V1(N-1), C2(N-1)`, followed by the final
//! normalisation ("Last [V]"). The paper draws the cycle as `[C1], [C2], [V1]`; with `[V2] = 0`
//! the two Cube orders are equivalent (neither Cube stage waits inside the cycle).

use crate::{CoreError, Result};
use serde::{Deserialize, Serialize};

/// Which core a stage runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// The Cube core (matrix multiplications, `[C_j]`).
    Cube,
    /// The Vector cores paired with it (`[V_j]`).
    Vector,
}

/// One stage's place in the steady cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSlot {
    /// Stage number `j` (1-based): `[C_j]` in a Cube order, `[V_j]` in a Vector order.
    pub stage: usize,
    /// Cycles by which this stage trails the `[C1]` of the same block (cycle `c` runs block `c - lag`).
    pub lag: usize,
}

/// Durations of the `n` Cube and `n` Vector stages of one block (any one time unit, e.g. ns).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageDurations {
    /// `[C_1] .. [C_n]`.
    pub cube: Vec<f64>,
    /// `[V_1] .. [V_n]` (`[V_n] = 0` when the chain ends on a Cube stage, as in AMLA).
    pub vector: Vec<f64>,
}

impl StageDurations {
    fn validate(&self) -> Result<usize> {
        let n = self.cube.len();
        if n == 0 || self.vector.len() != n {
            return Err(CoreError::InvalidPlan(format!(
                "preload pipeline needs n >= 1 Cube and n Vector stage durations; got {} Cube and {} Vector",
                self.cube.len(),
                self.vector.len()
            )));
        }
        for (what, d) in [("Cube", &self.cube), ("Vector", &self.vector)] {
            if let Some((i, x)) = d
                .iter()
                .enumerate()
                .find(|(_, x)| !x.is_finite() || **x < 0.0)
            {
                return Err(CoreError::InvalidPlan(format!(
                    "{what} stage {} has duration {x}; durations must be finite and >= 0",
                    i + 1
                )));
            }
        }
        Ok(n)
    }
}

/// A Preload Pipeline schedule: the order of stages inside one steady cycle and their lags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreloadPipeline {
    /// `n`: Cube/Vector stage pairs per block (2 for AMLA: `[C1] [V1] [C2] [V2]`, `[V2] = 0`).
    pub pairs: usize,
    /// Cycles from a block's `[C1]` to its `[Vn]` = `[C1]` stages issued in the Preload phase.
    pub preload_count: usize,
    /// The index `k` of Appendix B.4 (1-based) that chose the cyclic rotation; 0 if hand-built.
    pub rotation: usize,
    /// Cube stages of one steady cycle, in issue order.
    pub cube_order: Vec<StageSlot>,
    /// Vector stages of one steady cycle, in issue order.
    pub vector_order: Vec<StageSlot>,
}

/// Which part of the pipeline a cycle belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Warm-up: stages whose blocks are not started yet are skipped.
    Preload,
    /// Every stage of the cycle runs.
    Steady,
    /// Tail: stages of blocks past the last are skipped.
    Drain,
}

/// One stage execution: stage `stage` of `unit` on KV block `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageOp {
    /// Cube or Vector.
    pub unit: Unit,
    /// Stage number `j` (1-based).
    pub stage: usize,
    /// KV block index (0-based).
    pub block: usize,
}

/// The stages one cycle issues, per core, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cycle {
    /// Cycle number (0-based, counting the Preload cycles).
    pub index: usize,
    /// Preload, steady or drain.
    pub phase: Phase,
    /// Cube stages in issue order.
    pub cube: Vec<StageOp>,
    /// Vector stages in issue order.
    pub vector: Vec<StageOp>,
}

/// How cycles may overlap when a schedule is replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CycleModel {
    /// Appendix B's model: a cycle is a closed window; no stage of cycle `c + 1` starts before
    /// every stage of cycle `c` has finished ("all Vector stages must be overlapped by the
    /// cumulative Cube execution", B.2). Theorem 4.1 holds in this model.
    Barrier,
    /// Only data dependencies order stages (what cross-core flags enforce on the hardware); a
    /// Vector stage may run past the end of its cycle. Looser than the paper's model: a count
    /// below `n` can then be stall-free where the barrier model stalls.
    Dataflow,
}

/// What replaying a schedule with given durations showed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineCheck {
    /// Steady-state time per cycle (units of the durations).
    pub period: f64,
    /// `max(sum [C], sum [V])`: the period of a stall-free cycle.
    pub bound: f64,
    /// `period - bound` (0 when stall-free).
    pub stall_per_cycle: f64,
    /// Whether the steady loop stalls (`period > bound`).
    pub stalls: bool,
}

impl PreloadPipeline {
    /// AMLA's own case (section 4.1.3): `n = 2`, `[V2] = 0`, Preload count 2.
    ///
    /// With `[V2] = 0`, `F(2) - F(1) = -[C1] < 0` for any Cube duration, so the construction
    /// picks `k = 2` whatever the durations; nominal ones (Cube time proportional to the K extent
    /// of each matmul, 576 and 512, Vector time below their sum) are used to build it.
    pub fn amla_default() -> PreloadPipeline {
        PreloadPipeline::construct(&StageDurations {
            cube: vec![576.0, 512.0],
            vector: vec![512.0, 0.0],
        })
        .expect("AMLA's nominal durations are valid")
    }

    /// Builds the Preload-count-`n` cycle of Theorem B.1 for these stage durations (Appendix B.4).
    pub fn construct(d: &StageDurations) -> Result<PreloadPipeline> {
        let n = d.validate()?;
        // a_i = [V_i] - [C_{i+1}], cyclic; F(l) = a_1 + ... + a_l; k = argmin F (first minimum).
        let mut f = 0.0;
        let (mut k, mut best) = (n, f64::INFINITY);
        for i in 1..=n {
            f += d.vector[i - 1] - d.cube[i % n];
            if f < best {
                best = f;
                k = i;
            }
        }
        let wrap = |j: usize| (j - 1) % n + 1; // 1-based cyclic index
        let broken = wrap(k + 1); // the only external [C_j] -> [V_j] link
        let mut cube_lag = vec![0usize; n + 1];
        let mut vec_lag = vec![0usize; n + 1];
        let mut lag = 0;
        for j in 1..=n {
            if j > 1 {
                lag += 1; // [V_{j-1}] -> [C_j] is always external
            }
            cube_lag[j] = lag;
            if j == broken {
                lag += 1;
            }
            vec_lag[j] = lag;
        }
        let cube_order = (0..n)
            .map(|i| wrap(k + 2 + i))
            .map(|j| StageSlot {
                stage: j,
                lag: cube_lag[j],
            })
            .collect();
        let vector_order = (0..n)
            .map(|i| wrap(k + 1 + i))
            .map(|j| StageSlot {
                stage: j,
                lag: vec_lag[j],
            })
            .collect();
        let p = PreloadPipeline::from_orders(n, cube_order, vector_order)?;
        Ok(PreloadPipeline { rotation: k, ..p })
    }

    /// A hand-built schedule; checks its structure and derives the Preload count.
    ///
    /// Each stage must appear once; `[C1]` has lag 0; along the chain a consumer never lags its
    /// producer by less than 0 cycles (it would run before its input exists).
    pub fn from_orders(
        pairs: usize,
        cube_order: Vec<StageSlot>,
        vector_order: Vec<StageSlot>,
    ) -> Result<PreloadPipeline> {
        let bad = |m: String| Err(CoreError::InvalidPlan(format!("preload pipeline: {m}")));
        if pairs == 0 {
            return bad("needs at least one Cube/Vector pair".into());
        }
        let mut lags = [vec![None; pairs + 1], vec![None; pairs + 1]];
        for (u, order) in [(0, &cube_order), (1, &vector_order)] {
            if order.len() != pairs {
                return bad(format!(
                    "{} stages in one cycle order, expected {pairs}",
                    order.len()
                ));
            }
            for s in order {
                if s.stage == 0 || s.stage > pairs || lags[u][s.stage].is_some() {
                    return bad(format!(
                        "stage {} missing, repeated or out of 1..={pairs}",
                        s.stage
                    ));
                }
                lags[u][s.stage] = Some(s.lag);
            }
        }
        let lag = |u: usize, j: usize| lags[u][j].expect("every stage checked present");
        if lag(0, 1) != 0 {
            return bad(format!(
                "[C1] has lag {}; lags are counted from [C1]",
                lag(0, 1)
            ));
        }
        for j in 1..=pairs {
            if lag(1, j) < lag(0, j) {
                return bad(format!(
                    "[V{j}] lags {} but its input [C{j}] lags {}",
                    lag(1, j),
                    lag(0, j)
                ));
            }
            if j < pairs && lag(0, j + 1) < lag(1, j) {
                return bad(format!(
                    "[C{}] lags {} but its input [V{j}] lags {}",
                    j + 1,
                    lag(0, j + 1),
                    lag(1, j)
                ));
            }
        }
        Ok(PreloadPipeline {
            pairs,
            preload_count: lag(1, pairs),
            rotation: 0,
            cube_order,
            vector_order,
        })
    }

    /// Internal dependency chains of the cycle (`s` of Lemma B.1): `preload = (2n - 1) - s`.
    pub fn internal_chains(&self) -> usize {
        (2 * self.pairs - 1) - self.preload_count
    }

    /// The cycles that process `blocks` KV blocks: Preload, steady loop, drain.
    pub fn cycles(&self, blocks: usize) -> Vec<Cycle> {
        if blocks == 0 {
            return Vec::new();
        }
        let total = blocks + self.preload_count;
        (0..total)
            .map(|c| {
                let pick = |unit: Unit, order: &[StageSlot]| -> Vec<StageOp> {
                    order
                        .iter()
                        .filter(|s| c >= s.lag && c - s.lag < blocks)
                        .map(|s| StageOp {
                            unit,
                            stage: s.stage,
                            block: c - s.lag,
                        })
                        .collect()
                };
                let cube = pick(Unit::Cube, &self.cube_order);
                let vector = pick(Unit::Vector, &self.vector_order);
                let phase = if c < self.preload_count {
                    Phase::Preload
                } else if c < blocks {
                    Phase::Steady
                } else {
                    Phase::Drain
                };
                Cycle {
                    index: c,
                    phase,
                    cube,
                    vector,
                }
            })
            .collect()
    }

    /// Replays the schedule for many blocks with these durations (as-soon-as-possible on each
    /// core, in cycle order) and compares the steady period with `max(sum [C], sum [V])`.
    ///
    /// Fails when the durations do not match `pairs` or the cycle order deadlocks (an internal
    /// chain whose consumer is issued before its producer on the same core).
    pub fn check(&self, d: &StageDurations, model: CycleModel) -> Result<PipelineCheck> {
        let n = d.validate()?;
        if n != self.pairs {
            return Err(CoreError::InvalidPlan(format!(
                "{} stage durations for a pipeline of {} pairs",
                n, self.pairs
            )));
        }
        let blocks = 64 * n + 256;
        let sum_c: f64 = d.cube.iter().sum();
        let sum_v: f64 = d.vector.iter().sum();
        let bound = sum_c.max(sum_v);
        let starts = self.replay(d, blocks, model)?;
        // steady cycles are preload_count..blocks; skip the first half as transient
        let (c1, c2) = (blocks / 2, blocks - 1);
        let period = (starts[c2] - starts[c1]) / (c2 - c1) as f64;
        let stall = (period - bound).max(0.0);
        let stalls = stall > 1e-9 * bound.max(1e-300);
        Ok(PipelineCheck {
            period,
            bound,
            stall_per_cycle: if stalls { stall } else { 0.0 },
            stalls,
        })
    }

    /// Start time of each cycle's first op (Cube or Vector) under ASAP list scheduling.
    fn replay(&self, d: &StageDurations, blocks: usize, model: CycleModel) -> Result<Vec<f64>> {
        let n = self.pairs;
        let cycles = self.cycles(blocks);
        // finish[unit][stage][block]
        let mut fin_c = vec![vec![f64::NAN; blocks]; n + 1];
        let mut fin_v = vec![vec![f64::NAN; blocks]; n + 1];
        let seq = |u: Unit| -> Vec<(usize, StageOp)> {
            cycles
                .iter()
                .flat_map(|c| {
                    let ops = if u == Unit::Cube { &c.cube } else { &c.vector };
                    ops.iter().map(move |op| (c.index, *op))
                })
                .collect()
        };
        let (cs, vs) = (seq(Unit::Cube), seq(Unit::Vector));
        let (mut ic, mut iv) = (0usize, 0usize);
        let (mut free_c, mut free_v) = (0.0f64, 0.0f64);
        let mut cycle_start = vec![f64::INFINITY; cycles.len()];
        // barrier model: ops left unscheduled per cycle and the latest finish of each cycle
        let mut left: Vec<usize> = cycles
            .iter()
            .map(|c| c.cube.len() + c.vector.len())
            .collect();
        let mut cycle_end = vec![0.0f64; cycles.len()];
        let barrier = |cy: usize, left: &[usize], cycle_end: &[f64]| -> Option<f64> {
            match model {
                CycleModel::Dataflow => Some(0.0),
                CycleModel::Barrier if cy == 0 => Some(0.0),
                CycleModel::Barrier => (left[cy - 1] == 0).then(|| cycle_end[cy - 1]),
            }
        };
        while ic < cs.len() || iv < vs.len() {
            let mut progressed = false;
            if ic < cs.len() {
                let (cy, op) = cs[ic];
                let dep = if op.stage == 1 {
                    0.0
                } else {
                    fin_v[op.stage - 1][op.block]
                };
                if let (false, Some(gate)) = (dep.is_nan(), barrier(cy, &left, &cycle_end)) {
                    let start = free_c.max(dep).max(gate);
                    free_c = start + d.cube[op.stage - 1];
                    fin_c[op.stage][op.block] = free_c;
                    cycle_start[cy] = cycle_start[cy].min(start);
                    cycle_end[cy] = cycle_end[cy].max(free_c);
                    left[cy] -= 1;
                    ic += 1;
                    progressed = true;
                }
            }
            if iv < vs.len() {
                let (cy, op) = vs[iv];
                let dep = fin_c[op.stage][op.block];
                if let (false, Some(gate)) = (dep.is_nan(), barrier(cy, &left, &cycle_end)) {
                    let start = free_v.max(dep).max(gate);
                    free_v = start + d.vector[op.stage - 1];
                    fin_v[op.stage][op.block] = free_v;
                    cycle_start[cy] = cycle_start[cy].min(start);
                    cycle_end[cy] = cycle_end[cy].max(free_v);
                    left[cy] -= 1;
                    iv += 1;
                    progressed = true;
                }
            }
            if !progressed {
                let (_, c) = cs[ic.min(cs.len() - 1)];
                let (_, v) = vs[iv.min(vs.len() - 1)];
                return Err(CoreError::InvalidPlan(format!(
                    "preload pipeline deadlocks: Cube waits at [C{}] of block {}, Vector at [V{}] of block {}",
                    c.stage, c.block, v.stage, v.block
                )));
            }
        }
        Ok(cycle_start)
    }

    /// Every schedule of `pairs` pairs whose Preload count is `preload_count`: each chain link
    /// internal or external (lag step 0 or 1), each core's stages in any order. Small `pairs` only
    /// (the count grows as `2^(2n-1) (n!)^2`); used to show Theorem 4.1's first claim.
    pub fn all_with_preload_count(pairs: usize, preload_count: usize) -> Vec<PreloadPipeline> {
        assert!((1..=4).contains(&pairs), "enumeration is for 1..=4 pairs");
        let links = 2 * pairs - 1;
        let perms = permutations(pairs);
        let mut out = Vec::new();
        for mask in 0u32..(1 << links) {
            if mask.count_ones() as usize != preload_count {
                continue;
            }
            // lag of chain position p: C_j at 2(j-1), V_j at 2(j-1)+1
            let mut lag = vec![0usize; 2 * pairs];
            for p in 1..2 * pairs {
                lag[p] = lag[p - 1] + ((mask >> (p - 1)) & 1) as usize;
            }
            for pc in &perms {
                for pv in &perms {
                    let cube = pc
                        .iter()
                        .map(|&j| StageSlot {
                            stage: j,
                            lag: lag[2 * (j - 1)],
                        })
                        .collect();
                    let vec = pv
                        .iter()
                        .map(|&j| StageSlot {
                            stage: j,
                            lag: lag[2 * (j - 1) + 1],
                        })
                        .collect();
                    if let Ok(p) = PreloadPipeline::from_orders(pairs, cube, vec) {
                        out.push(p);
                    }
                }
            }
        }
        out
    }

    /// Whether any schedule with this Preload count runs these durations without stalling.
    pub fn stall_free_exists(
        preload_count: usize,
        d: &StageDurations,
        model: CycleModel,
    ) -> Result<bool> {
        let n = d.validate()?;
        for p in PreloadPipeline::all_with_preload_count(n, preload_count) {
            match p.check(d, model) {
                Ok(c) if !c.stalls => return Ok(true),
                _ => {}
            }
        }
        Ok(false)
    }
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    fn go(rest: &mut Vec<usize>, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if rest.is_empty() {
            out.push(cur.clone());
            return;
        }
        for i in 0..rest.len() {
            let x = rest.remove(i);
            cur.push(x);
            go(rest, cur, out);
            cur.pop();
            rest.insert(i, x);
        }
    }
    let mut out = Vec::new();
    go(&mut (1..=n).collect(), &mut Vec::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn d(cube: &[f64], vector: &[f64]) -> StageDurations {
        StageDurations {
            cube: cube.to_vec(),
            vector: vector.to_vec(),
        }
    }

    #[test]
    fn amla_default_is_the_papers_cycle() {
        let p = PreloadPipeline::amla_default();
        assert_eq!((p.pairs, p.preload_count, p.rotation), (2, 2, 2));
        assert_eq!(p.internal_chains(), 1, "Lemma B.1: 3 links - 2 preloaded");
        let cycles = p.cycles(5);
        let ops = |c: &Cycle| -> Vec<(Unit, usize, usize)> {
            c.cube
                .iter()
                .chain(&c.vector)
                .map(|o| (o.unit, o.stage, o.block))
                .collect()
        };
        // Preload: C1(0); then C1(1) with V1(0)  (section 4.1.3)
        assert_eq!(ops(&cycles[0]), vec![(Unit::Cube, 1, 0)]);
        assert_eq!(
            ops(&cycles[1]),
            vec![(Unit::Cube, 1, 1), (Unit::Vector, 1, 0)]
        );
        assert_eq!(cycles[1].phase, Phase::Preload);
        // steady: C2(t), C1(t+2), V1(t+1), V2(t) (zero length)
        assert_eq!(cycles[2].phase, Phase::Steady);
        assert_eq!(
            ops(&cycles[2]),
            vec![
                (Unit::Cube, 2, 0),
                (Unit::Cube, 1, 2),
                (Unit::Vector, 1, 1),
                (Unit::Vector, 2, 0)
            ]
        );
        // drain: [C2],[C2],[V1] over the last two cycles
        let drain: Vec<_> = cycles
            .iter()
            .filter(|c| c.phase == Phase::Drain)
            .flat_map(ops)
            .collect();
        assert_eq!(
            drain,
            vec![
                (Unit::Cube, 2, 3),
                (Unit::Vector, 1, 4),
                (Unit::Vector, 2, 3),
                (Unit::Cube, 2, 4),
                (Unit::Vector, 2, 4)
            ]
        );
    }

    #[test]
    fn every_stage_of_every_block_runs_once() {
        let p = PreloadPipeline::construct(&d(&[3.0, 1.0, 2.0], &[1.0, 2.0, 2.5])).unwrap();
        let mut seen = std::collections::HashSet::new();
        for c in p.cycles(7) {
            for op in c.cube.iter().chain(&c.vector) {
                assert!(seen.insert((op.unit, op.stage, op.block)), "{op:?} twice");
            }
        }
        assert_eq!(seen.len(), 2 * 3 * 7);
    }

    #[test]
    fn constructed_pipeline_never_stalls_theorem_b1() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(41);
        for trial in 0..300 {
            let n = 1 + trial % 4;
            let mut cube: Vec<f64> = (0..n).map(|_| rng.gen_range(0.05..3.0)).collect();
            let vector: Vec<f64> = (0..n).map(|_| rng.gen_range(0.0..3.0)).collect();
            if trial % 7 == 0 {
                cube[0] = 0.0; // a free Cube stage must not break it either
            }
            let dur = d(&cube, &vector);
            let p = PreloadPipeline::construct(&dur).unwrap();
            assert_eq!(p.preload_count, n, "Theorem 4.1: count n");
            for model in [CycleModel::Barrier, CycleModel::Dataflow] {
                let c = p.check(&dur, model).unwrap();
                assert!(
                    !c.stalls,
                    "{model:?} n={n} {dur:?}: period {} > bound {} ({p:?})",
                    c.period, c.bound
                );
            }
        }
    }

    #[test]
    fn amla_cycle_is_cube_bound_with_a_heavy_vector_stage() {
        // V1 longer than either Cube stage (Eq. 16's adversary) but not than both together
        let dur = d(&[1.0, 1.0], &[1.8, 0.0]);
        let c = PreloadPipeline::amla_default()
            .check(&dur, CycleModel::Barrier)
            .unwrap();
        assert!(!c.stalls);
        assert!((c.period - 2.0).abs() < 1e-9, "period {}", c.period);
    }

    #[test]
    fn preload_count_below_n_stalls_on_the_adversary() {
        // Eq. 16: [V_k] + [C_j] > sum [C] for every j, with sum [V] <= sum [C]
        let adversary = d(&[1.0, 1.0], &[1.5, 0.0]);
        let b = CycleModel::Barrier;
        assert!(PreloadPipeline::stall_free_exists(2, &adversary, b).unwrap());
        let below = PreloadPipeline::all_with_preload_count(2, 1);
        assert_eq!(below.len(), 3 * 4, "3 lag patterns x 2 x 2 orders");
        for p in below {
            if let Ok(c) = p.check(&adversary, b) {
                assert!(c.stalls, "count-1 schedule {p:?} did not stall");
                assert!(
                    c.stall_per_cycle >= 0.5 - 1e-9,
                    "stall {}",
                    c.stall_per_cycle
                );
            }
        }
        assert!(!PreloadPipeline::stall_free_exists(1, &adversary, b).unwrap());
        assert!(!PreloadPipeline::stall_free_exists(0, &adversary, b).unwrap());
        // n = 3: [V2] = 2.5 > sum [C] - min [C]
        let adv3 = d(&[1.0, 1.0, 1.0], &[0.2, 2.5, 0.2]);
        assert!(!PreloadPipeline::stall_free_exists(2, &adv3, b).unwrap());
        assert!(
            !PreloadPipeline::construct(&adv3)
                .unwrap()
                .check(&adv3, b)
                .unwrap()
                .stalls
        );
    }

    #[test]
    fn dataflow_replay_is_looser_than_the_papers_model() {
        // Without cycle barriers [V1] may run past its cycle: AMLA's chain then needs only one
        // preloaded [C1] in the steady loop (C1(t) -> V1(t) internal, V1 straddling into the next
        // cycle). The kernel keeps the paper's count 2; this records why the model matters.
        let adversary = d(&[1.0, 1.0], &[1.5, 0.0]);
        assert!(PreloadPipeline::stall_free_exists(1, &adversary, CycleModel::Dataflow).unwrap());
        // count 0 (everything inside one cycle) stalls in either model
        assert!(!PreloadPipeline::stall_free_exists(0, &adversary, CycleModel::Dataflow).unwrap());
    }

    #[test]
    fn preload_count_below_n_can_work_for_benign_durations() {
        // Theorem 4.1 says "not always"; with a light Vector stage count 1 suffices for n = 2
        let benign = d(&[1.0, 1.0], &[0.5, 0.0]);
        assert!(PreloadPipeline::stall_free_exists(1, &benign, CycleModel::Barrier).unwrap());
    }

    #[test]
    fn malformed_orders_are_rejected() {
        let s = |stage, lag| StageSlot { stage, lag };
        let e = PreloadPipeline::from_orders(2, vec![s(1, 0), s(1, 1)], vec![s(1, 1), s(2, 2)])
            .unwrap_err();
        assert!(e.to_string().contains("repeated"), "{e}");
        let e = PreloadPipeline::from_orders(2, vec![s(1, 0), s(2, 0)], vec![s(1, 1), s(2, 1)])
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("[C2] lags 0 but its input [V1] lags 1"),
            "{e}"
        );
        // internal chain [V1] -> [C2] with [C2] issued first on the Cube while [V1] waits for [C1]
        let p = PreloadPipeline::from_orders(2, vec![s(2, 0), s(1, 0)], vec![s(1, 0), s(2, 0)])
            .unwrap();
        let e = p
            .check(&d(&[1.0, 1.0], &[1.0, 1.0]), CycleModel::Dataflow)
            .unwrap_err();
        assert!(e.to_string().contains("deadlock"), "{e}");
    }

    #[test]
    fn base_four_stage_chain_needs_two_preloads() {
        // Base (Alg. 1): [V2] moves O through GM and is as long as a Cube stage
        let base = d(&[1.0, 0.9], &[0.8, 1.1]);
        let p = PreloadPipeline::construct(&base).unwrap();
        assert_eq!(p.preload_count, 2);
        let c = p.check(&base, CycleModel::Barrier).unwrap();
        assert!(!c.stalls);
        assert!((c.period - 1.9).abs() < 1e-9);
    }
}
