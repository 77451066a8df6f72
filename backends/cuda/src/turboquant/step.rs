//! A step planned on the host ([`TurboQuantStepPlan`]: the decode's and the append's tables in
//! one workspace) and the launches prepared from it.

use super::support::check_supported;
use super::{row_split, schedule_tables, ScheduleTables, COMPRESS_TOKENS, ROWS};
#[cfg(doc)] // intra-doc links only
use super::{TurboQuantCuda, MAX_UNIT_WARPS_R8, UNIT_WARPS};
use crate::device::DeviceBuffer;
use crate::error::{CudaError, Result};
use crate::kernels::Function;
use ferrattn_core::turboquant::TurboQuantConfig;
use ferrattn_core::AttentionProblem;
use std::sync::Arc;

/// Alignment of every region of a TurboQuant step's workspace, bytes.
pub const TURBOQUANT_WORKSPACE_ALIGN: usize = 256;

fn ws_align(x: usize) -> usize {
    x.div_ceil(TURBOQUANT_WORKSPACE_ALIGN) * TURBOQUANT_WORKSPACE_ALIGN
}

/// Appends `words` to `image` at an aligned offset and returns the offset.
fn push_table(image: &mut Vec<u8>, words: &[i32]) -> usize {
    let at = ws_align(image.len());
    image.resize(at, 0);
    image.extend(words.iter().flat_map(|w| w.to_le_bytes()));
    at
}

fn i32s(x: &[usize]) -> Vec<i32> {
    x.iter().map(|&l| l as i32).collect()
}

/// The decode half of a step, planned on the host ([`TurboQuantCuda::decode_tables`]): the
/// stream-K schedule of `problem` over `units` warps as the kernels' tables, and the sizes of
/// the scratch its launches write (the query fragments, the partials).
#[derive(Clone, Debug, PartialEq)]
pub struct TurboQuantDecodeTables {
    /// The problem (queries, and the caches' lengths when the decode runs as `seqlens_k`).
    pub problem: AttentionProblem,
    /// Units (warps) of the stream-K schedule.
    pub units: usize,
    /// Output tiles (sequence, KV head, 16-row query group).
    pub tiles: usize,
    /// Segments (partials) the units write.
    pub segments: usize,
    /// Merge CTAs per output tile (each takes every `row_split`-th row).
    pub row_split: usize,
    pub(super) qgroups: usize,
    /// 16 MMA rows in use (`decode_r16`) rather than at most 8 (`decode_r8`).
    pub(super) r16: bool,
    pub(super) head_dim: usize,
    pub(super) key_qjl: bool,
    pub(super) segs: Vec<i32>,
    pub(super) unit_segs: Vec<i32>,
    pub(super) tile_segs: Vec<i32>,
}

impl TurboQuantDecodeTables {
    /// The decode of `p`'s queries under `cfg` over caches that will hold `p.seqlens_k` tokens
    /// when it runs, stream-K over `units` warps on a GPU of `compute_units` SMs (pure host;
    /// [`TurboQuantCuda::default_units`] is the usual width).
    pub fn new(
        cfg: &TurboQuantConfig,
        p: &AttentionProblem,
        units: usize,
        compute_units: usize,
    ) -> Result<TurboQuantDecodeTables> {
        check_supported(cfg, p)?;
        if units == 0 || compute_units == 0 {
            return Err(CudaError::Plan(format!(
                "a stream-K decode over {units} units (warps) on {compute_units} SMs; both must \
                 be positive"
            )));
        }
        let ScheduleTables {
            qgroups,
            tiles,
            units,
            segs,
            unit_segs,
            tile_segs,
        } = schedule_tables(p, units);
        Ok(TurboQuantDecodeTables {
            problem: p.clone(),
            units,
            tiles,
            segments: segs.len() / 4,
            row_split: row_split(p, tiles, compute_units),
            qgroups,
            r16: p.group_size() * p.max_seqlen_q > 8,
            head_dim: p.head_dim_qk,
            key_qjl: cfg.key_qjl,
            segs,
            unit_segs,
            tile_segs,
        })
    }

    /// Bytes of the query fragments `Π q` (hi and lo halves) and `S q`: one register quad per
    /// lane, `d/16` k-steps, per tile.
    fn frag_bytes(&self) -> usize {
        self.tiles * 32 * self.head_dim * 2
    }
}

/// The append half of a step, planned on the host ([`TurboQuantAppendTables::new`]): where
/// each sequence's new tokens go.
#[derive(Clone, Debug, PartialEq)]
pub struct TurboQuantAppendTables {
    pub(super) before: Vec<usize>,
    pub(super) after: Vec<usize>,
    pub(super) src_len: usize,
    /// 16-token destination groups per (sequence, KV head) of the widest sequence.
    pub(super) groups: usize,
}

impl TurboQuantAppendTables {
    /// The append of `counts[b]` tokens (of `src_len` per sequence in the source) onto caches
    /// holding `lens_before[b]` tokens of at most `capacity` (pure host).
    pub fn new(
        lens_before: &[usize],
        counts: &[usize],
        src_len: usize,
        capacity: usize,
    ) -> Result<TurboQuantAppendTables> {
        let b_ = lens_before.len();
        if counts.len() != b_ {
            return Err(CudaError::Plan(format!(
                "{} token counts for a cache of {b_} sequences",
                counts.len()
            )));
        }
        for (b, (&c, &l)) in counts.iter().zip(lens_before).enumerate() {
            if c > src_len || l.saturating_add(c) > capacity {
                return Err(CudaError::Plan(format!(
                    "sequence {b}: {c} new tokens (source holds {src_len}) onto {l} cached exceed the capacity of {capacity}"
                )));
            }
        }
        let groups = counts
            .iter()
            .zip(lens_before)
            .map(|(&c, &l)| (l % COMPRESS_TOKENS + c).div_ceil(COMPRESS_TOKENS))
            .max()
            .unwrap_or(0);
        Ok(TurboQuantAppendTables {
            before: lens_before.to_vec(),
            after: lens_before.iter().zip(counts).map(|(l, c)| l + c).collect(),
            src_len,
            groups,
        })
    }

    /// Tokens per sequence before the append.
    pub fn lens_before(&self) -> &[usize] {
        &self.before
    }
    /// Tokens per sequence after it.
    pub fn lens_after(&self) -> &[usize] {
        &self.after
    }
    /// Tokens per sequence of the source tensors.
    pub fn src_len(&self) -> usize {
        self.src_len
    }
}

/// Offsets of the decode's regions in a step's workspace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct DecodeRegions {
    pub(super) segs: usize,
    pub(super) unit_segs: usize,
    pub(super) tile_segs: usize,
    pub(super) seqlens_q: usize,
    pub(super) seqlens_k: usize,
    /// `[tiles]` i32 segment counters of the fused merge: zeros in the image, so every upload
    /// of the step's tables zeroes them; the kernel sets a tile's back to zero once merged.
    pub(super) counts: usize,
    pub(super) qf: usize,
    pub(super) qf_lo: usize,
    pub(super) pf: usize,
    pub(super) part_o: usize,
    pub(super) part_ml: usize,
}

/// Offsets of the append's regions in a step's workspace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AppendRegions {
    pub(super) dst0: usize,
    pub(super) count: usize,
}

/// One TurboQuant step planned on the host: an append, a decode or both, laid out in one
/// workspace. Its tables are one image at the workspace's start, copied by one stream-ordered
/// copy ([`TurboQuantCuda::upload_step`]); after them come the decode's scratch regions (query
/// fragments, partials), which every layer's launches reuse in stream order. Every region is
/// [`TURBOQUANT_WORKSPACE_ALIGN`]-byte aligned.
#[derive(Clone, Debug, PartialEq)]
pub struct TurboQuantStepPlan {
    pub(super) decode: Option<TurboQuantDecodeTables>,
    pub(super) append: Option<TurboQuantAppendTables>,
    pub(super) image: Vec<u8>,
    pub(super) dec: Option<DecodeRegions>,
    pub(super) app: Option<AppendRegions>,
    bytes: usize,
}

impl TurboQuantStepPlan {
    /// Lays out a step's tables and scratch (host only).
    pub fn new(
        decode: Option<TurboQuantDecodeTables>,
        append: Option<TurboQuantAppendTables>,
    ) -> TurboQuantStepPlan {
        let mut image = Vec::new();
        let app = append.as_ref().map(|a| AppendRegions {
            dst0: push_table(&mut image, &i32s(&a.before)),
            count: push_table(
                &mut image,
                &a.after
                    .iter()
                    .zip(&a.before)
                    .map(|(&x, &b)| (x - b) as i32)
                    .collect::<Vec<_>>(),
            ),
        });
        let mut bytes = ws_align(image.len());
        let dec = decode.as_ref().map(|t| {
            let p = &t.problem;
            let segs = push_table(&mut image, &t.segs);
            let unit_segs = push_table(&mut image, &t.unit_segs);
            let tile_segs = push_table(&mut image, &t.tile_segs);
            let seqlens_q = push_table(&mut image, &i32s(&p.seqlens_q));
            let seqlens_k = push_table(&mut image, &i32s(&p.seqlens_k));
            let counts = push_table(&mut image, &vec![0; t.tiles]);
            let mut at = ws_align(image.len());
            let mut region = |n: usize| {
                let r = at;
                at = ws_align(at + n);
                r
            };
            let frag = t.frag_bytes();
            let r = DecodeRegions {
                segs,
                unit_segs,
                tile_segs,
                seqlens_q,
                seqlens_k,
                counts,
                qf: region(frag),
                qf_lo: region(frag),
                // without QJL the kernels take the address and never read it
                pf: region(if t.key_qjl { frag } else { 4 }),
                part_o: region(t.segments * ROWS * t.head_dim * 4),
                part_ml: region(t.segments * ROWS * 2 * 4),
            };
            bytes = at;
            r
        });
        TurboQuantStepPlan {
            decode,
            append,
            image,
            dec,
            app,
            bytes,
        }
    }

    /// Workspace bytes of the step: its tables, then the decode's scratch.
    pub fn workspace_bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the tables [`TurboQuantCuda::upload_step`] copies (the workspace's start).
    pub fn table_bytes(&self) -> usize {
        self.image.len()
    }

    /// The decode half, if the step decodes.
    pub fn decode(&self) -> Option<&TurboQuantDecodeTables> {
        self.decode.as_ref()
    }

    /// The append half, if the step appends.
    pub fn append(&self) -> Option<&TurboQuantAppendTables> {
        self.append.as_ref()
    }
}

/// A decode made ready to launch: the addresses of its tables and scratch on the device (in a
/// caller's workspace, [`TurboQuantCuda::upload_step`], or in memory it owns,
/// [`TurboQuantCuda::prepare_decode`]).
#[derive(Debug)]
pub struct PreparedTurboQuantDecode {
    /// The problem (queries, and the cache's lengths as `seqlens_k`).
    pub problem: AttentionProblem,
    /// Units (warps) of the stream-K schedule.
    pub units: usize,
    /// Output tiles (sequence, KV head, 16-row query group).
    pub tiles: usize,
    /// Segments (partials) the units write.
    pub segments: usize,
    /// Merge CTAs per output tile (each takes every `row_split`-th row).
    pub row_split: usize,
    pub(super) qgroups: usize,
    pub(super) decode: Function,
    /// Warps per CTA of the decode launch ([`UNIT_WARPS`]).
    pub(super) warps: usize,
    /// Dynamic shared memory of the decode launch, bytes (`TurboQuantCuda::decode_launch_smem`).
    pub(super) smem: usize,
    /// The merge fused into the decode (`decode_r8f`, the small-work schedule): no merge
    /// kernel is launched.
    pub(super) fused: bool,
    pub(super) counts: u64,
    pub(super) segs: u64,
    pub(super) unit_segs: u64,
    pub(super) tile_segs: u64,
    pub(super) qf: u64,
    pub(super) qf_lo: u64,
    pub(super) pf: u64,
    pub(super) part_o: u64,
    pub(super) part_ml: u64,
    pub(super) seqlens_q: u64,
    pub(super) seqlens_k: u64,
    /// The memory the addresses point into, when the prepared decode owns it.
    pub(super) _owned: Option<Arc<DeviceBuffer>>,
}

impl PreparedTurboQuantDecode {
    /// Warps per CTA of the decode launch ([`UNIT_WARPS`], or [`MAX_UNIT_WARPS_R8`] at small
    /// work: [`TurboQuantCuda::unit_warps_for`]).
    pub fn warps_per_cta(&self) -> usize {
        self.warps
    }

    /// Dynamic shared memory of the decode launch in bytes: the CTA's rings and query slots
    /// ([`super::decode_smem_bytes`]), or more where that keeps a 7-warp CTA one per SM
    /// ([`super::seven_warp_smem_bytes`], the fused merge's [`super::small_work_smem_bytes`]).
    pub fn smem_bytes(&self) -> usize {
        self.smem
    }

    /// Whether the merge runs inside the decode kernel (the small-work schedule's one CTA per
    /// SM; [`TurboQuantCuda::fused_merge_for`]) rather than as a kernel of its own.
    pub fn merge_fused(&self) -> bool {
        self.fused
    }
}

/// An append made ready to launch: where each sequence's new tokens go, on the device (in a
/// caller's workspace, [`TurboQuantCuda::upload_step`], or in memory it owns,
/// [`TurboQuantCuda::prepare_append`]).
#[derive(Debug)]
pub struct PreparedTurboQuantAppend {
    pub(super) tables: TurboQuantAppendTables,
    pub(super) dst0: u64,
    pub(super) count: u64,
    /// The memory the addresses point into, when the prepared append owns it.
    pub(super) _owned: Option<Arc<DeviceBuffer>>,
}

impl PreparedTurboQuantAppend {
    /// Tokens per sequence before the append.
    pub fn lens_before(&self) -> &[usize] {
        &self.tables.before
    }
    /// Tokens per sequence after it.
    pub fn lens_after(&self) -> &[usize] {
        &self.tables.after
    }
    /// Tokens per sequence of the source tensors.
    pub fn src_len(&self) -> usize {
        self.tables.src_len
    }
}

/// A step's prepared launches over one workspace ([`TurboQuantCuda::upload_step`]).
#[derive(Debug)]
pub struct PreparedTurboQuantStep {
    /// The decode, if the step decodes.
    pub decode: Option<PreparedTurboQuantDecode>,
    /// The append, if the step appends.
    pub append: Option<PreparedTurboQuantAppend>,
}
