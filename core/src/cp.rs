//! Context-parallel decode: one sequence's KV cache split over several GPUs (ranks).
//!
//! Each rank holds a contiguous slice of every sequence's keys and runs ordinary decode attention
//! over it, which yields a partial softmax state per query row in its finished form, `(O_r,
//! LSE_r)` with `O_r` normalised. `(m = LSE_r, l = 1, acc = O_r)` is the same state as the
//! kernel's `(m, l, acc)` (both give `O_r` and `LSE_r` when finished), so the partials merge with
//! [`SoftmaxState::merge`], the associative rescaling of LeanAttention appendix D, now applied
//! across devices instead of across CTAs. An empty slice has `LSE = -inf` and merges to nothing.
//!
//! [`plan`] is pure and runs on the host: it takes where the keys are (per-rank lengths of every
//! sequence, ragged, a rank may hold nothing) or splits whole lengths by bandwidth
//! ([`split_by_bandwidth`]), and chooses how the partials travel by the bytes each rank receives:
//!
//! - [`Exchange::AllGather`]: every rank receives every other rank's `(O_r, LSE_r)` in the cache
//!   dtype and merges all of them (in [`CpPlan::merge_order`], the same on every rank, so every
//!   rank's result is the same bits). Any output placement.
//! - [`Exchange::ReduceScatterHeads`]: an all-reduce of the running maximum `M = max_r LSE_r`
//!   (small), then each rank scales its partial to `(exp(LSE_r - M) O_r, exp(LSE_r - M))` in f32
//!   and a reduce-scatter (sum) leaves each rank the sums of its own `heads_q / ranks` heads:
//!   `O = num / den`, `LSE = M + ln den`. Head-sharded output only (what a tensor-parallel output
//!   projection consumes); it receives `(R-1)/R` of an f32 partial instead of `R-1` 16-bit ones,
//!   so it wins from three ranks on.
//!
//! [`merge_partials`] is the CPU twin of the GPU merge kernel (`cuda-kernels/cp_merge.cu`).

use crate::{CoreError, DType, Result, SoftmaxState};
use serde::{Deserialize, Serialize};

/// Most ranks a plan takes (the merge kernel folds the ranks of one row in registers).
pub const MAX_RANKS: usize = 64;

/// How the partial states travel between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exchange {
    /// All-gather of every rank's `(O_r, LSE_r)`, merged on every rank.
    AllGather,
    /// All-reduce (max) of LSE, then reduce-scatter (sum) of the rescaled partials by heads.
    ReduceScatterHeads,
}

/// Where the caller wants the final O and LSE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputPlacement {
    /// Every rank gets all heads `[batch, seqlen_q, heads_q, head_dim]`.
    Replicated,
    /// Rank `r` gets heads `r * heads_q / ranks ..` (`[batch, seqlen_q, heads_q / ranks, head_dim]`).
    HeadSharded,
}

/// Shapes shared by every rank of one context-parallel decode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpShape {
    /// Sequences in the batch.
    pub batch: usize,
    /// Query tokens per sequence (decode: 1; speculative decode: up to 8).
    pub seqlen_q: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads.
    pub heads_kv: usize,
    /// Head dimension of Q, K, V and O.
    pub head_dim: usize,
    /// Element type of Q, K, V and the partial O exchanged (LSE is always f32).
    pub dtype: DType,
    /// Bottom-right causal mask (only meaningful, and only accepted, with one query token: a
    /// middle slice would need the mask shifted by its position).
    pub causal: bool,
}

/// What a plan is made from: where each sequence's keys are and how fast each rank reads them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpRequest {
    /// Shapes.
    pub shape: CpShape,
    /// `kv_lens[r][b]`: keys of sequence `b` held by rank `r` (tokens). Rank `r`'s slice of a
    /// sequence follows rank `r - 1`'s in token order.
    pub kv_lens: Vec<Vec<usize>>,
    /// Read bandwidth of each rank's device memory, GB/s (for the predicted times and splits).
    pub bandwidth_gbs: Vec<f64>,
    /// Where the caller wants the output.
    pub output: OutputPlacement,
}

/// One rank's slice of one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// First token of the slice in the whole sequence.
    pub start: usize,
    /// Tokens in the slice (0: the rank holds none of this sequence).
    pub len: usize,
}

/// Bytes one rank receives for one exchange (the larger of send and receive; NCCL's ring and
/// direct algorithms move these over each link).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExchangeBytes {
    /// [`Exchange::AllGather`]: `(R-1)` partials of `O` (cache dtype) plus LSE (f32).
    pub all_gather: u64,
    /// [`Exchange::ReduceScatterHeads`]: the all-reduce of LSE (`2(R-1)/R` of it, ring) plus
    /// `(R-1)/R` of the f32 numerators and denominators; `None` where it does not apply
    /// (replicated output, or heads not divisible by ranks).
    pub reduce_scatter_heads: Option<u64>,
}

/// A context-parallel decode plan: pure host data, serialisable, checked when made or read.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpPlan {
    /// What it was made from.
    pub request: CpRequest,
    /// Ranks (communicator size).
    pub ranks: usize,
    /// `shards[r][b]`: rank `r`'s slice of sequence `b`.
    pub shards: Vec<Vec<Shard>>,
    /// How partials travel (chosen by [`ExchangeBytes`]).
    pub exchange: Exchange,
    /// Ranks in the order the merge folds them (token order: the order a single-GPU split of
    /// the whole sequence merges in).
    pub merge_order: Vec<usize>,
    /// Bytes each rank receives, per option.
    pub bytes: ExchangeBytes,
    /// Keys each rank reads, bytes (K and V, valid tokens only).
    pub kv_bytes: Vec<u64>,
    /// Predicted attention time of each rank, microseconds (`kv_bytes / bandwidth`).
    pub attention_us: Vec<f64>,
    /// The slowest rank's predicted attention time over the perfectly balanced one (1.0: the
    /// split matches the bandwidths).
    pub imbalance: f64,
}

impl<'de> Deserialize<'de> for CpPlan {
    /// A plan read from a file keeps only its request and is planned again, so it is checked
    /// like a new one (and a hand-edited exchange or shard is replaced by the planner's).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<CpPlan, D::Error> {
        #[derive(Deserialize)]
        struct Stored {
            request: CpRequest,
        }
        let s = Stored::deserialize(d)?;
        plan(&s.request).map_err(serde::de::Error::custom)
    }
}

fn bad_len(what: String, value: usize, requirement: String) -> CoreError {
    CoreError::BadLength {
        what,
        value: value as i64,
        requirement,
    }
}

impl CpShape {
    fn check(&self) -> Result<()> {
        for (what, v) in [
            ("batch", self.batch),
            ("seqlen_q", self.seqlen_q),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(bad_len(format!("cp {what}"), 0, "positive".into()));
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(CoreError::HeadRatio {
                heads_q: self.heads_q,
                heads_kv: self.heads_kv,
            });
        }
        if self.causal && self.seqlen_q > 1 {
            return Err(bad_len(
                "cp seqlen_q with a causal mask".into(),
                self.seqlen_q,
                "1 (each rank's slice would need the mask shifted by its position)".into(),
            ));
        }
        Ok(())
    }

    /// Query rows `batch * seqlen_q * heads_q`.
    pub fn rows(&self) -> usize {
        self.batch * self.seqlen_q * self.heads_q
    }

    /// Bytes of one rank's partial: O in the cache dtype plus LSE in f32.
    pub fn partial_bytes(&self) -> u64 {
        (self.rows() * (self.head_dim * self.dtype.size_bytes() + 4)) as u64
    }
}

/// The bytes one rank receives for each exchange (see [`ExchangeBytes`]).
pub fn exchange_bytes(shape: &CpShape, ranks: usize, output: OutputPlacement) -> ExchangeBytes {
    // 0 ranks exchange nothing, as 1 does (and must not underflow `r - 1` or divide by 0)
    let ranks = ranks.max(1);
    let r = ranks as u64;
    let rows = shape.rows() as u64;
    let lse = rows * 4;
    let all_gather = (r - 1) * shape.partial_bytes();
    let rs = (output == OutputPlacement::HeadSharded && shape.heads_q.is_multiple_of(ranks)).then(
        || {
            let scaled = rows * (shape.head_dim as u64 + 1) * 4;
            2 * (r - 1) * lse / r + (r - 1) * scaled / r
        },
    );
    ExchangeBytes {
        all_gather,
        reduce_scatter_heads: rs,
    }
}

/// Splits each sequence's `total_lens[b]` keys over ranks in proportion to `bandwidth_gbs`, in
/// token order, each boundary a multiple of `align` tokens (a page or a tile) except the end;
/// the rounding remainder goes to the last rank. Returns `kv_lens[rank][seq]` for
/// [`CpRequest::kv_lens`].
pub fn split_by_bandwidth(
    total_lens: &[usize],
    bandwidth_gbs: &[f64],
    align: usize,
) -> Result<Vec<Vec<usize>>> {
    check_bandwidths(bandwidth_gbs)?;
    if align == 0 {
        return Err(bad_len("cp split alignment".into(), 0, "positive".into()));
    }
    let sum: f64 = bandwidth_gbs.iter().sum();
    let ranks = bandwidth_gbs.len();
    let mut out = vec![vec![0usize; total_lens.len()]; ranks];
    for (b, &total) in total_lens.iter().enumerate() {
        let mut cum_bw = 0.0;
        let mut start = 0usize;
        for (r, &bw) in bandwidth_gbs.iter().enumerate() {
            cum_bw += bw;
            let end = if r + 1 == ranks {
                total
            } else {
                let ideal = total as f64 * cum_bw / sum;
                ((ideal / align as f64).round() as usize * align).clamp(start, total)
            };
            out[r][b] = end - start;
            start = end;
        }
    }
    Ok(out)
}

fn check_bandwidths(bw: &[f64]) -> Result<()> {
    if bw.is_empty() || bw.len() > MAX_RANKS {
        return Err(bad_len(
            "cp ranks (bandwidth entries)".into(),
            bw.len(),
            format!("between 1 and {MAX_RANKS}"),
        ));
    }
    if let Some((r, x)) = bw
        .iter()
        .enumerate()
        .find(|(_, x)| !x.is_finite() || **x <= 0.0)
    {
        return Err(CoreError::BadValue {
            what: format!("cp bandwidth_gbs[{r}]"),
            value: x.to_string(),
            requirement: "finite and positive (GB/s)".into(),
        });
    }
    Ok(())
}

/// Plans a context-parallel decode (pure; every input is checked and errors carry the values).
pub fn plan(req: &CpRequest) -> Result<CpPlan> {
    let s = &req.shape;
    s.check()?;
    check_bandwidths(&req.bandwidth_gbs)?;
    let ranks = req.bandwidth_gbs.len();
    if req.kv_lens.len() != ranks {
        return Err(bad_len(
            "cp kv_lens (ranks)".into(),
            req.kv_lens.len(),
            format!("{ranks}, one row per rank as bandwidth_gbs has"),
        ));
    }
    if let Some((r, row)) = req
        .kv_lens
        .iter()
        .enumerate()
        .find(|(_, row)| row.len() != s.batch)
    {
        return Err(bad_len(
            format!("cp kv_lens[{r}] (sequences)"),
            row.len(),
            format!("{} (the batch)", s.batch),
        ));
    }
    if req.output == OutputPlacement::HeadSharded && !s.heads_q.is_multiple_of(ranks) {
        return Err(bad_len(
            "cp heads_q for head-sharded output".into(),
            s.heads_q,
            format!("a multiple of the {ranks} ranks"),
        ));
    }
    let mut shards = vec![Vec::with_capacity(s.batch); ranks];
    for b in 0..s.batch {
        let mut start = 0usize;
        for (r, row) in req.kv_lens.iter().enumerate() {
            shards[r].push(Shard { start, len: row[b] });
            start = start
                .checked_add(row[b])
                .filter(|&x| x <= i32::MAX as usize)
                .ok_or_else(|| {
                    bad_len(
                        format!("cp total keys of sequence {b}"),
                        start.saturating_add(row[b]),
                        format!("at most {} (32-bit positions)", i32::MAX),
                    )
                })?;
        }
    }
    let per_token = (2 * s.heads_kv * s.head_dim * s.dtype.size_bytes()) as u64;
    let kv_bytes: Vec<u64> = req
        .kv_lens
        .iter()
        .map(|row| row.iter().map(|&l| l as u64).sum::<u64>() * per_token)
        .collect();
    let attention_us: Vec<f64> = kv_bytes
        .iter()
        .zip(&req.bandwidth_gbs)
        .map(|(&by, &bw)| by as f64 / (bw * 1e3))
        .collect();
    let total_bw: f64 = req.bandwidth_gbs.iter().sum();
    let balanced = kv_bytes.iter().sum::<u64>() as f64 / (total_bw * 1e3);
    let slowest = attention_us.iter().cloned().fold(0.0, f64::max);
    let imbalance = if balanced > 0.0 {
        slowest / balanced
    } else {
        1.0
    };
    let bytes = exchange_bytes(s, ranks, req.output);
    // ties go to the all-gather: one collective instead of two plus a scaling pass
    let exchange = match bytes.reduce_scatter_heads {
        Some(rs) if rs < bytes.all_gather => Exchange::ReduceScatterHeads,
        _ => Exchange::AllGather,
    };
    Ok(CpPlan {
        request: req.clone(),
        ranks,
        shards,
        exchange,
        merge_order: (0..ranks).collect(),
        bytes,
        kv_bytes,
        attention_us,
        imbalance,
    })
}

/// As [`plan`] with the exchange forced (tests and benchmarks time both); refused where it cannot
/// deliver the requested output.
pub fn plan_with_exchange(req: &CpRequest, exchange: Exchange) -> Result<CpPlan> {
    let mut p = plan(req)?;
    if exchange == Exchange::ReduceScatterHeads && p.bytes.reduce_scatter_heads.is_none() {
        return Err(CoreError::InvalidPlan(format!(
            "cp: reduce-scatter by heads delivers head-sharded output with heads_q a multiple of the ranks; asked for {:?} output of {} heads over {} ranks",
            req.output, req.shape.heads_q, p.ranks
        )));
    }
    p.exchange = exchange;
    Ok(p)
}

/// Checks a plan from outside (its fields are public for inspection): it must be exactly what
/// [`plan_with_exchange`] makes from its own request and exchange, so shards, merge order and
/// sizes that feed device offsets cannot disagree with the request.
pub fn check(p: &CpPlan) -> Result<()> {
    let rebuilt = plan_with_exchange(&p.request, p.exchange)?;
    if rebuilt != *p {
        return Err(CoreError::InvalidPlan(
            "cp: the plan is not the one its request gives (edited shards, merge order or sizes?)"
                .into(),
        ));
    }
    Ok(())
}

impl CpPlan {
    /// Keys of every sequence rank `rank` holds (its local `seqlens_k`).
    pub fn local_lens(&self, rank: usize) -> Vec<usize> {
        self.shards[rank].iter().map(|s| s.len).collect()
    }

    /// Whole length of each sequence.
    pub fn total_lens(&self) -> Vec<usize> {
        (0..self.request.shape.batch)
            .map(|b| self.shards.iter().map(|row| row[b].len).sum())
            .collect()
    }

    /// Heads of the output rank `rank` receives: `(first, count)`.
    pub fn output_heads(&self, rank: usize) -> (usize, usize) {
        let h = self.request.shape.heads_q;
        match self.request.output {
            OutputPlacement::Replicated => (0, h),
            OutputPlacement::HeadSharded => {
                let n = h / self.ranks;
                (rank * n, n)
            }
        }
    }
}

/// CPU twin of the merge kernel: merges per-rank partials `(o[r], lse[r])` (O `[batch, seqlen_q,
/// heads_q, head_dim]` normalised, LSE `[batch, heads_q, seqlen_q]` natural log, `-inf` for an
/// empty slice) folding ranks in `order`, and returns the rows of heads `heads.0 ..
/// heads.0 + heads.1` as O `[batch, seqlen_q, heads.1, head_dim]` and LSE `[batch, heads.1,
/// seqlen_q]` (zeros and `-inf` where no rank saw a key).
pub fn merge_partials(
    shape: &CpShape,
    o: &[Vec<f32>],
    lse: &[Vec<f32>],
    order: &[usize],
    heads: (usize, usize),
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (bsz, sq, hq, d) = (shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
    let (h0, nh) = heads;
    if o.len() != lse.len() || o.is_empty() {
        return Err(bad_len(
            "cp partial LSE tensors".into(),
            lse.len(),
            format!("{} (one per O partial, at least one)", o.len()),
        ));
    }
    // the shape is caller data: element counts that overflow cannot match any partial
    let rows = bsz.checked_mul(sq).and_then(|n| n.checked_mul(hq));
    let Some((rows, elems)) = rows.and_then(|n| Some((n, n.checked_mul(d)?))) else {
        return Err(CoreError::TooLarge {
            what: format!(
                "cp partials of batch {bsz} x seqlen_q {sq} x heads_q {hq} x head_dim {d}"
            ),
            bytes_needed: 4 * bsz as u128 * sq as u128 * hq as u128 * d as u128,
            available: "element counts must fit a usize".into(),
        });
    };
    for (r, (or, lr)) in o.iter().zip(lse).enumerate() {
        if or.len() != elems || lr.len() != rows {
            return Err(CoreError::Shape {
                tensor: "cp partial",
                actual: vec![or.len(), lr.len()],
                expected: format!("rank {r}'s O to hold {elems} and its LSE {rows} elements"),
            });
        }
    }
    let mut seen = vec![false; o.len()];
    for &r in order {
        if r >= o.len() || std::mem::replace(&mut seen[r], true) {
            return Err(bad_len(
                "cp merge order entry".into(),
                r,
                format!("a permutation of 0..{}", o.len()),
            ));
        }
    }
    if order.len() != o.len() || h0.checked_add(nh).is_none_or(|end| end > hq) {
        return Err(bad_len(
            "cp merge order length / output heads".into(),
            order.len(),
            format!("{} ranks and heads within 0..{hq}", o.len()),
        ));
    }
    let mut out_o = vec![0f32; bsz * sq * nh * d];
    let mut out_l = vec![f32::NEG_INFINITY; bsz * nh * sq];
    for b in 0..bsz {
        for s in 0..sq {
            for h in h0..h0 + nh {
                let row = (b * sq + s) * hq + h;
                let li = (b * hq + h) * sq + s;
                let mut st = SoftmaxState::empty(d);
                for &r in order {
                    st.merge(&SoftmaxState {
                        m: lse[r][li],
                        l: 1.0,
                        acc: o[r][row * d..(row + 1) * d].to_vec(),
                    });
                }
                let (ro, rl) = st.finish();
                let orow = (b * sq + s) * nh + (h - h0);
                out_o[orow * d..(orow + 1) * d].copy_from_slice(&ro);
                out_l[(b * nh + (h - h0)) * sq + s] = rl;
            }
        }
    }
    Ok((out_o, out_l))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden;

    // issue 9: caller values that used to underflow, divide by zero or overflow are typed errors
    // (or, for a byte count, the count for one rank)
    #[test]
    fn bad_cp_arguments_are_typed_errors_not_panics() {
        let s = shape(2, 8);
        let zero = exchange_bytes(&s, 0, OutputPlacement::HeadSharded);
        assert_eq!(zero.all_gather, 0);
        let mut hz = shape(2, 8);
        hz.heads_q = 0;
        assert_eq!(
            exchange_bytes(&hz, 0, OutputPlacement::HeadSharded).all_gather,
            0
        );
        let (o, l) = (vec![vec![0f32; s.rows() * 64]], vec![vec![0f32; s.rows()]]);
        let e = merge_partials(&s, &o, &l, &[0], (usize::MAX, 2)).unwrap_err();
        assert!(matches!(e, CoreError::BadLength { .. }), "{e}");
        let mut big = shape(usize::MAX / 2, 8);
        big.head_dim = 64;
        let e = merge_partials(&big, &o, &l, &[0], (0, 8)).unwrap_err();
        assert!(matches!(e, CoreError::TooLarge { .. }), "{e}");
        assert!(merge_partials(&s, &o, &l, &[0], (0, 8)).is_ok());
    }
    use crate::{AttentionInputs, AttentionProblem, Tensor};
    use rand::{Rng, SeedableRng};

    fn shape(batch: usize, hq: usize) -> CpShape {
        CpShape {
            batch,
            seqlen_q: 1,
            heads_q: hq,
            heads_kv: 2,
            head_dim: 64,
            dtype: DType::F16,
            causal: false,
        }
    }

    fn request(kv_lens: Vec<Vec<usize>>, hq: usize, output: OutputPlacement) -> CpRequest {
        let ranks = kv_lens.len();
        CpRequest {
            shape: shape(kv_lens[0].len(), hq),
            kv_lens,
            bandwidth_gbs: vec![4000.0; ranks],
            output,
        }
    }

    #[test]
    fn split_follows_bandwidth_and_alignment_and_covers_every_key() {
        let lens = [1_000_000, 37, 0, 4097];
        let kv = split_by_bandwidth(&lens, &[4000.0, 4000.0, 2000.0], 64).unwrap();
        for (b, &total) in lens.iter().enumerate() {
            assert_eq!(kv.iter().map(|r| r[b]).sum::<usize>(), total);
            // every boundary but the end is a multiple of 64
            assert_eq!(kv[0][b] % 64, 0);
            assert_eq!((kv[0][b] + kv[1][b]) % 64, 0);
        }
        // 2:2:1 of a million, to the nearest 64
        assert_eq!(kv[0][0], 400_000);
        assert_eq!(kv[1][0], 400_000);
        assert_eq!(kv[2][0], 200_000);
        let p = plan(&CpRequest {
            shape: shape(4, 8),
            kv_lens: kv,
            bandwidth_gbs: vec![4000.0, 4000.0, 2000.0],
            output: OutputPlacement::Replicated,
        })
        .unwrap();
        assert!((p.imbalance - 1.0).abs() < 1e-3, "{}", p.imbalance);
        assert_eq!(p.total_lens(), lens);
        assert_eq!(
            p.shards[1][0],
            Shard {
                start: 400_000,
                len: 400_000
            }
        );
    }

    #[test]
    fn the_exchange_is_chosen_by_bytes() {
        // two ranks: all-gather receives one f16 partial (2 B/element), reduce-scatter half an
        // f32 one (2 B/element) plus the LSE all-reduce: the all-gather wins
        let p = plan(&request(
            vec![vec![100]; 2],
            8,
            OutputPlacement::HeadSharded,
        ))
        .unwrap();
        assert_eq!(p.exchange, Exchange::AllGather);
        let rs = p.bytes.reduce_scatter_heads.unwrap();
        assert!(rs > p.bytes.all_gather, "{rs} vs {}", p.bytes.all_gather);
        // four ranks: 3 f16 partials against 3/4 of an f32 one
        let p = plan(&request(
            vec![vec![100]; 4],
            8,
            OutputPlacement::HeadSharded,
        ))
        .unwrap();
        assert_eq!(p.exchange, Exchange::ReduceScatterHeads);
        assert!(p.bytes.reduce_scatter_heads.unwrap() < p.bytes.all_gather);
        assert_eq!(p.output_heads(3), (6, 2));
        // replicated output: only the all-gather delivers it
        let p = plan(&request(vec![vec![100]; 4], 8, OutputPlacement::Replicated)).unwrap();
        assert_eq!(p.exchange, Exchange::AllGather);
        assert_eq!(p.bytes.reduce_scatter_heads, None);
        // forcing: allowed where it applies, refused where it cannot deliver the output
        let req = request(vec![vec![100]; 2], 8, OutputPlacement::HeadSharded);
        let f = plan_with_exchange(&req, Exchange::ReduceScatterHeads).unwrap();
        assert_eq!(f.exchange, Exchange::ReduceScatterHeads);
        check(&f).unwrap();
        let mut edited = f.clone();
        edited.merge_order = vec![0, 0];
        assert!(check(&edited).is_err());
        let req = request(vec![vec![100]; 2], 8, OutputPlacement::Replicated);
        assert!(plan_with_exchange(&req, Exchange::ReduceScatterHeads).is_err());
        // one rank moves nothing
        let p = plan(&request(vec![vec![100]], 8, OutputPlacement::Replicated)).unwrap();
        assert_eq!(p.bytes.all_gather, 0);
    }

    #[test]
    fn bad_requests_are_typed_errors_with_the_values() {
        let e = |r: CpRequest| plan(&r).unwrap_err().to_string();
        let mut r = request(vec![vec![10, 20], vec![5]], 8, OutputPlacement::Replicated);
        assert!(e(r.clone()).contains("kv_lens[1]"), "{}", e(r.clone()));
        r.kv_lens = vec![vec![1, 2]];
        assert!(
            e(r.clone()).contains("one row per rank"),
            "{}",
            e(r.clone())
        );
        let mut r = request(vec![vec![1]; 3], 8, OutputPlacement::HeadSharded);
        assert!(e(r.clone()).contains("multiple of the 3 ranks"));
        r.output = OutputPlacement::Replicated;
        r.bandwidth_gbs[1] = f64::NAN;
        assert!(
            e(r.clone()).contains("bandwidth_gbs[1]"),
            "{}",
            e(r.clone())
        );
        r.bandwidth_gbs = vec![];
        r.kv_lens = vec![];
        assert!(e(r.clone()).contains("between 1 and 64"));
        let mut r = request(vec![vec![1]; 2], 8, OutputPlacement::Replicated);
        r.shape.causal = true;
        r.shape.seqlen_q = 2;
        assert!(e(r.clone()).contains("shifted by its position"));
        r.shape.seqlen_q = 1;
        r.shape.heads_q = 7;
        assert!(e(r.clone()).contains("7"));
        let r = request(
            vec![vec![i32::MAX as usize], vec![1]],
            8,
            OutputPlacement::Replicated,
        );
        assert!(e(r).contains("32-bit positions"));
        assert!(split_by_bandwidth(&[5], &[1.0], 0).is_err());
    }

    #[test]
    fn a_plan_reads_back_from_json_and_is_planned_again() {
        let p = plan(&request(
            vec![vec![0, 300], vec![77, 0], vec![5, 9], vec![0, 0]],
            8,
            OutputPlacement::HeadSharded,
        ))
        .unwrap();
        let json = serde_json::to_string(&p).unwrap();
        let back: CpPlan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        // an edited exchange is replaced by the planner's choice
        let edited = json.replace(
            "\"exchange\":\"reduce_scatter_heads\"",
            "\"exchange\":\"all_gather\"",
        );
        assert_ne!(edited, json);
        assert_eq!(serde_json::from_str::<CpPlan>(&edited).unwrap(), p);
        // a bad request inside the file is refused
        let bad = json.replacen("\"heads_q\":8", "\"heads_q\":6", 1);
        assert!(serde_json::from_str::<CpPlan>(&bad).is_err());
    }

    /// Splitting the keys over ranks (ragged, an empty rank, an empty sequence on a rank),
    /// attending per slice with the golden reference and merging gives attention over the whole
    /// sequence within f32 rounding; all-gather and head-sharded merges agree.
    /// Issue 14: the compressed caches' partials merge the same way. Each rank compresses and
    /// attends over its own slice of the keys through the CPU emulations, and the core's merge
    /// combines the partials.
    ///
    /// - TurboQuant compresses token by token, so the slices' codes are the whole cache's and the
    ///   merged partials equal the emulation over the whole cache up to the rounding of the f16
    ///   partials and the f16 result (O: two units of f16 roundoff, 2 x 2^-11, the merge being a
    ///   convex combination of rounded partials rounded once more) and the f32 merge order (LSE).
    /// - TurboAttention (4-bit, slices of whole 64-token blocks, so the same quantised blocks)
    ///   quantises P to INT8 against each slice's own running maximum, so its partials are not the
    ///   whole cache's bits (measured: 7.7e-2 apart on this case); what holds is accuracy: the
    ///   merged result is as close to exact attention as the whole-cache emulation (measured:
    ///   0.1681 against 0.1694), asserted within 5%.
    #[test]
    fn compressed_cache_partials_merge_like_the_whole_cache() {
        let (b, hq, hk, d) = (2, 8, 2, 64);
        // three ranks, slices on 64-token boundaries, sequence lengths multiples of 64 so that
        // TurboAttention's cache holds whole blocks only (no INT8 buffer in any slice)
        let slices = [(0usize, 128usize), (128, 192), (320, 64)];
        let total: usize = slices.iter().map(|s| s.1).sum();
        let mut rng = rand::rngs::StdRng::seed_from_u64(41);
        let whole = AttentionProblem::uniform(b, 1, total, hq, hk, d, d, DType::F16);
        let rnd = |shape: &[usize], rng: &mut rand::rngs::StdRng| {
            Tensor::randn(shape, DType::F16, 1.0, rng)
        };
        let q = rnd(&[b, 1, hq, d], &mut rng);
        let k = rnd(&[b, total, hk, d], &mut rng);
        let v = rnd(&[b, total, hk, d], &mut rng);
        let x = AttentionInputs::new(q.clone(), k.clone(), v.clone());
        let shape = CpShape {
            batch: b,
            seqlen_q: 1,
            heads_q: hq,
            heads_kv: hk,
            head_dim: d,
            dtype: DType::F16,
            causal: false,
        };
        let order: Vec<usize> = (0..slices.len()).collect();
        type Emulate<'a> =
            Box<dyn Fn(&AttentionProblem, &AttentionInputs) -> (Vec<f32>, Vec<f32>) + 'a>;
        let exact = golden::exact_attention(&whole, &x);
        let tq = crate::turboquant::TurboQuantConfig::paper_default(&whole);
        let turbo = crate::turbo::TurboConfig {
            kv_bits: crate::turbo::KvBits::Int4,
            ..crate::turbo::TurboConfig::default()
        };
        let o_tol = 2.0 * (-11f64).exp2();
        // (name, emulation, whether the partials carry the whole cache's bits)
        let algorithms: [(&str, Emulate, bool); 2] = [
            (
                "turboquant",
                Box::new(|p: &AttentionProblem, x: &AttentionInputs| {
                    let o = crate::turboquant::emulate(&tq, p, x).unwrap();
                    (o.o.data, o.lse.data)
                }),
                true,
            ),
            (
                "turbo int4",
                Box::new(|p: &AttentionProblem, x: &AttentionInputs| {
                    let o = crate::turbo::emulate(&turbo, p, x).unwrap();
                    (o.o.data, o.lse.data)
                }),
                false,
            ),
        ];
        for (name, emulate, same_bits) in algorithms {
            let (whole_o, whole_l) = emulate(&whole, &x);
            let (mut po, mut pl) = (vec![], vec![]);
            for &(start, len) in &slices {
                let p = AttentionProblem::uniform(b, 1, len, hq, hk, d, d, DType::F16);
                let xs = AttentionInputs::new(
                    q.clone(),
                    k.seq_range(start, len),
                    v.seq_range(start, len),
                );
                let (o, l) = emulate(&p, &xs);
                po.push(o);
                pl.push(l);
            }
            let (mo, ml) = merge_partials(&shape, &po, &pl, &order, (0, hq)).unwrap();
            if same_bits {
                let c = crate::Comparison::f32(&whole_o, &mo);
                assert!(c.rel_fro < o_tol, "{name}: O rel. error {:.3e}", c.rel_fro);
                for (a, w) in ml.iter().zip(&whole_l) {
                    assert!(
                        (a - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{name}: LSE {a} vs {w}"
                    );
                }
            } else {
                let whole_err = crate::Comparison::f32(&exact.o.data, &whole_o).rel_fro;
                let merged_err = crate::Comparison::f32(&exact.o.data, &mo).rel_fro;
                assert!(
                    merged_err <= 1.05 * whole_err,
                    "{name}: merged {merged_err:.4} vs whole {whole_err:.4} against exact"
                );
            }
        }
    }

    #[test]
    fn merged_shards_equal_attention_over_the_whole_sequence() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        let kv = vec![
            vec![37, 0, 200],
            vec![0, 0, 65],
            vec![63, 1, 0],
            vec![1, 577, 130],
        ];
        let p = plan(&request(kv, 8, OutputPlacement::Replicated)).unwrap();
        let s = &p.request.shape;
        let (hq, hk, d) = (s.heads_q, s.heads_kv, s.head_dim);
        let total = p.total_lens();
        let maxk = *total.iter().max().unwrap();
        let mut t = |shape: &[usize]| {
            let data = (0..shape.iter().product::<usize>())
                .map(|_| rng.gen_range(-2.0f32..2.0))
                .collect();
            Tensor {
                shape: shape.to_vec(),
                dtype: DType::F32,
                data,
            }
        };
        let q = t(&[s.batch, 1, hq, d]);
        let k = t(&[s.batch, maxk, hk, d]);
        let v = t(&[s.batch, maxk, hk, d]);
        let attend = |lens: &[usize], starts: &[usize]| {
            let mut prob = AttentionProblem::uniform(s.batch, 1, maxk, hq, hk, d, d, DType::F32);
            prob.seqlens_k = lens.to_vec();
            // each slice moved to the front of its sequence's rows
            let mut ks = Tensor::zeros(&[s.batch, maxk, hk, d], DType::F32);
            let mut vs = ks.clone();
            let row = hk * d;
            for b in 0..s.batch {
                let src = (b * maxk + starts[b]) * row;
                let dst = b * maxk * row;
                let n = lens[b] * row;
                ks.data[dst..dst + n].copy_from_slice(&k.data[src..src + n]);
                vs.data[dst..dst + n].copy_from_slice(&v.data[src..src + n]);
            }
            let x = AttentionInputs {
                seqlens_k: Some(lens.iter().map(|&x| x as i64).collect()),
                ..AttentionInputs::new(q.clone(), ks, vs)
            };
            let (o, l) = golden::exact_attention_f64(&prob, &x);
            let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
            (f(o), f(l))
        };
        let (whole_o, whole_l) = attend(&total, &vec![0; s.batch]);
        let (mut po, mut pl) = (vec![], vec![]);
        for r in 0..p.ranks {
            let starts: Vec<usize> = p.shards[r].iter().map(|x| x.start).collect();
            let (o, l) = attend(&p.local_lens(r), &starts);
            po.push(o);
            pl.push(l);
        }
        // rank 1 holds nothing of sequence 0 and 1: LSE -inf there
        assert_eq!(pl[1][0], f32::NEG_INFINITY);
        let (mo, ml) = merge_partials(s, &po, &pl, &p.merge_order, (0, hq)).unwrap();
        for (a, b) in mo.iter().zip(&whole_o) {
            assert!((a - b).abs() < 2e-6, "{a} vs {b}");
        }
        for (a, b) in ml.iter().zip(&whole_l) {
            assert!((a - b).abs() < 2e-6 * (1.0 + b.abs()), "{a} vs {b}");
        }
        // the other order and a head slice give the same within rounding
        let rev: Vec<usize> = (0..p.ranks).rev().collect();
        let (so, sl) = merge_partials(s, &po, &pl, &rev, (4, 4)).unwrap();
        for b in 0..s.batch {
            for h in 0..4 {
                assert!(
                    (sl[b * 4 + h] - ml[b * hq + 4 + h]).abs()
                        < 2e-6 * (1.0 + ml[b * hq + 4 + h].abs())
                );
                for c in 0..d {
                    let x = so[(b * 4 + h) * d + c];
                    let y = mo[(b * hq + 4 + h) * d + c];
                    assert!((x - y).abs() < 2e-6, "{x} vs {y}");
                }
            }
        }
        assert!(merge_partials(s, &po, &pl, &[0, 0, 1, 2], (0, hq)).is_err());
        assert!(merge_partials(s, &po[..2], &pl, &[0, 1], (0, hq)).is_err());
    }

    #[test]
    fn a_sequence_no_rank_holds_merges_to_zeros_and_neg_inf() {
        let s = shape(1, 2);
        let o = vec![vec![0.0; 2 * 64]; 2];
        let l = vec![vec![f32::NEG_INFINITY; 2]; 2];
        let (mo, ml) = merge_partials(&s, &o, &l, &[0, 1], (0, 2)).unwrap();
        assert!(mo.iter().all(|&x| x == 0.0));
        assert!(ml.iter().all(|&x| x == f32::NEG_INFINITY));
    }
}
