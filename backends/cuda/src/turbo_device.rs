//! Launch-only TurboAttention entry points for the device path (issue 9): the step plans are
//! pure host values whose tables go into a caller-owned workspace once per step, and the
//! per-layer launches (prefill, append + flush, decode + combine) run on the caller's stream
//! with no allocation, no host synchronisation and no host-device copy, so a decode step can be
//! captured in a CUDA graph.
//!
//! The kernels and their parameter blocks are those of [`super`] (`turbo_prefill.cu`,
//! `turbo_decode.cu`), unchanged: the launches here fill the same `#[repr(C)]` blocks as
//! [`CudaBackend::turbo_prefill`] and [`CudaBackend::turbo_decode_step`] do, with addresses in
//! the workspace where those allocate per call, so the results are the same bits.
//!
//! The cache ([`DeviceTurboCache`]) is allocated once by its owner; its per-sequence token
//! counts stay on the host and advance when an append is enqueued (TurboAttention section 3.3:
//! a full INT8 buffer of 64 tokens is compressed into a block by the flush kernel).
//!
//! Appending the same step twice (an eager step, then its capture into a graph, or a graph
//! replayed) rewrites the step's token at the same slot and re-flushes the same block: the
//! universal scale is only set by a token when it is still 0 (`append_body`), and a flush
//! compresses the buffer as it is, so a replay leaves the cache as one append did.

use super::{
    check, check_supported, code_layout, decode_smem_bytes, plan_decode, AppendParams, CacheParams,
    DecodeParams, DecodePlan, DecodeSchedule, DeviceTurboCache, FlushParams, PrefillParams,
    QuantParams, TurboKernels, DECODE_ROWS, TURBO_BLOCK, TURBO_THREADS, WGF_SHAPE,
};
use crate::device::Gpu;
use crate::error::{CudaError, Result};
use crate::kernels::Function;
use crate::CudaBackend;
use cudarc::driver::sys;
use ferrattn_core::turbo::TurboConfig;
use ferrattn_core::DType;
use std::sync::Arc;

/// Alignment of every region of a step's workspace, bytes.
pub const TURBO_WORKSPACE_ALIGN: usize = 256;

fn align(x: usize) -> usize {
    x.div_ceil(TURBO_WORKSPACE_ALIGN) * TURBO_WORKSPACE_ALIGN
}

/// Appends `words` to `image` at an aligned offset and returns the offset.
fn push_region(image: &mut Vec<u8>, words: &[u32]) -> usize {
    let at = align(image.len());
    image.resize(at, 0);
    image.extend(words.iter().flat_map(|w| w.to_le_bytes()));
    at
}

fn u32s(x: &[usize]) -> Vec<u32> {
    x.iter().map(|&l| l as u32).collect()
}

/// One prefill step of a batch, planned on the host: the sequence lengths (queries and keys
/// alike: the prompt attends to itself) as the kernels' tables, and the workspace regions of
/// the INT8 K/V tiles BPQ stage 1 writes (Alg. 1 lines 1-4).
#[derive(Clone, Debug, PartialEq)]
pub struct TurboPrefillStepPlan {
    problem: ferrattn_core::AttentionProblem,
    cfg: TurboConfig,
    /// KV blocks of 64 tokens per (sequence, KV head) in the tiles: `ceil(max_seqlen / 64)`.
    nblk: usize,
    /// Bytes 0.. of the workspace: `seqlens` (i32) at 0.
    image: Vec<u8>,
    /// Offsets of the INT8 K tiles, the INT8 V^T tiles, their scales (f32 each).
    kq: usize,
    vt: usize,
    ks: usize,
    vs: usize,
    /// Offsets of the INT8 Q tiles and their scales (`turbo_quant_q_*`; used when the step
    /// kernels are the fast `turbo_prefill_wgf_*`, reserved always: the plan does not know).
    qq: usize,
    qs: usize,
    bytes: usize,
}

impl TurboPrefillStepPlan {
    /// Plans the prefill of `p` (`seqlens_q == seqlens_k`, separate K/V) under `cfg`.
    pub fn new(cfg: &TurboConfig, p: &ferrattn_core::AttentionProblem) -> Result<Self> {
        p.validate()?;
        super::check_problem(cfg, p)?;
        if p.seqlens_q != p.seqlens_k || p.max_seqlen_q != p.max_seqlen_k {
            return Err(CudaError::Plan(format!(
                "a device-path prefill attends a prompt to itself: query lengths {:?} and key \
                 lengths {:?} must agree",
                p.seqlens_q, p.seqlens_k
            )));
        }
        let d = p.head_dim_qk;
        let nblk = p.max_seqlen_k.div_ceil(TURBO_BLOCK).max(1);
        let tiles = p.batch * p.heads_kv * nblk;
        let mut image = Vec::new();
        push_region(&mut image, &u32s(&p.seqlens_k));
        let kq = align(image.len());
        let vt = align(kq + tiles * TURBO_BLOCK * d);
        let ks = align(vt + tiles * TURBO_BLOCK * d);
        let vs = align(ks + tiles * 4);
        let (q_codes, q_scales) = super::q_tile_bytes(p);
        let qq = align(vs + tiles * 4);
        let qs = align(qq + q_codes);
        let bytes = align(qs + q_scales);
        Ok(TurboPrefillStepPlan {
            problem: p.clone(),
            cfg: cfg.clone(),
            nblk,
            image,
            kq,
            vt,
            ks,
            vs,
            qq,
            qs,
            bytes,
        })
    }

    /// Workspace bytes of the step (tables and INT8 tiles).
    pub fn workspace_bytes(&self) -> usize {
        self.bytes
    }

    /// The problem.
    pub fn problem(&self) -> &ferrattn_core::AttentionProblem {
        &self.problem
    }

    /// The configuration.
    pub fn cfg(&self) -> &TurboConfig {
        &self.cfg
    }
}

/// One decode step of a batch, planned on the host: the lengths before and after the step's
/// append (one token per sequence, or none), the flushes the append causes, and the decode
/// schedule ([`plan_decode`]) with its partial slots, all as offsets into one workspace.
#[derive(Clone, Debug, PartialEq)]
pub struct TurboDecodeStepPlan {
    heads_q: usize,
    heads_kv: usize,
    head_dim: usize,
    dtype: DType,
    before: Vec<usize>,
    after: Vec<usize>,
    append: bool,
    /// `(sequence, block)` of each buffer the append fills, in sequence order.
    flushes: Vec<(usize, usize)>,
    decode: DecodePlan,
    /// Tables, copied into the workspace by [`TurboStepKernels::upload`]: `[src_tok, lens]`
    /// of the append, `[seqs, blocks]` of the flush, the six decode tables.
    image: Vec<u8>,
    append_at: usize,
    flush_at: usize,
    decode_at: [usize; 6],
    part_o: usize,
    part_ml: usize,
    bytes: usize,
}

impl TurboDecodeStepPlan {
    /// Plans a decode step over caches holding `before[b]` tokens of sequence `b`; with
    /// `append` each sequence takes one new token first, which its query then sees
    /// ([`ferrattn_core::turbo::decode_step`]).
    pub fn new(
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        dtype: DType,
        before: &[usize],
        append: bool,
        schedule: DecodeSchedule,
    ) -> Result<Self> {
        Self::build(
            heads_q, heads_kv, head_dim, dtype, before, append, schedule, false,
        )
    }

    /// A decode (no append) over one rank's slice of every sequence in context-parallel
    /// decode (`crate::cp::CpRank::attend_turbo`): a sequence may hold no token on this rank;
    /// its rows come out empty (O 0, LSE `-inf`: the kernel's buffer tile sees no key), which
    /// the merge skips.
    pub fn slice(
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        dtype: DType,
        lens: &[usize],
        schedule: DecodeSchedule,
    ) -> Result<Self> {
        Self::build(
            heads_q, heads_kv, head_dim, dtype, lens, false, schedule, true,
        )
    }

    #[allow(clippy::too_many_arguments)] // the two constructors' settings
    fn build(
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        dtype: DType,
        before: &[usize],
        append: bool,
        schedule: DecodeSchedule,
        allow_empty: bool,
    ) -> Result<Self> {
        if heads_kv == 0 || heads_q == 0 || !heads_q.is_multiple_of(heads_kv) {
            return Err(CudaError::Plan(format!(
                "{heads_q} query heads over {heads_kv} KV heads; the query heads must be a \
                 positive multiple"
            )));
        }
        if before.is_empty() {
            return Err(CudaError::Plan("a decode step of no sequences".into()));
        }
        crate::kernels::turbo_kernel_names(dtype, head_dim)?;
        let after: Vec<usize> = before.iter().map(|&l| l + append as usize).collect();
        if let Some(b) = after.iter().position(|&l| l == 0 && !allow_empty) {
            return Err(CudaError::Plan(format!(
                "sequence {b} holds no token to attend to (decode needs at least one)"
            )));
        }
        let flushes: Vec<(usize, usize)> = if append {
            after
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_multiple_of(TURBO_BLOCK))
                .map(|(b, &l)| (b, l / TURBO_BLOCK - 1))
                .collect()
        } else {
            Vec::new()
        };
        let decode = plan_decode(&after, &vec![0; after.len()], heads_q, heads_kv, schedule)?;
        let mut image = Vec::new();
        let mut append_tab = vec![0u32; before.len()]; // source token 0 of `[B, 1, Hk, D]`
        append_tab.extend(u32s(before));
        let append_at = push_region(&mut image, &append_tab);
        let mut flush_tab: Vec<u32> = flushes.iter().map(|&(b, _)| b as u32).collect();
        flush_tab.extend(flushes.iter().map(|&(_, j)| j as u32));
        let flush_at = push_region(&mut image, &flush_tab);
        let parts: [Vec<u32>; 6] = [
            u32s(&decode.lens),
            decode.q_tok.iter().map(|&t| t as u32).collect(),
            decode.space.seq_start.iter().map(|&s| s as u32).collect(),
            decode.cta_bounds.iter().map(|&s| s as u32).collect(),
            decode.cta_slot.clone(),
            decode.tile_slot.clone(),
        ];
        let mut decode_at = [0usize; 6];
        for (at, part) in decode_at.iter_mut().zip(&parts) {
            *at = push_region(&mut image, part);
        }
        let slots = decode.slots().max(1);
        let part_o = align(image.len());
        let part_ml = align(part_o + slots * DECODE_ROWS * head_dim * 4);
        let bytes = align(part_ml + slots * DECODE_ROWS * 2 * 4);
        Ok(TurboDecodeStepPlan {
            heads_q,
            heads_kv,
            head_dim,
            dtype,
            before: before.to_vec(),
            after,
            append,
            flushes,
            decode,
            image,
            append_at,
            flush_at,
            decode_at,
            part_o,
            part_ml,
            bytes,
        })
    }

    /// Workspace bytes of the step (tables and partials).
    pub fn workspace_bytes(&self) -> usize {
        self.bytes
    }
    /// Tokens per sequence before the step.
    pub fn lens_before(&self) -> &[usize] {
        &self.before
    }
    /// Tokens per sequence after the step's append (what the decode attends to).
    pub fn lens_after(&self) -> &[usize] {
        &self.after
    }
    /// Whether the step appends a token per sequence.
    pub fn appends(&self) -> bool {
        self.append
    }
    /// Buffers the append compresses into blocks: `(sequence, block)`.
    pub fn flushes(&self) -> &[(usize, usize)] {
        &self.flushes
    }
    /// The decode schedule.
    pub fn decode(&self) -> &DecodePlan {
        &self.decode
    }
    /// Query heads.
    pub fn heads_q(&self) -> usize {
        self.heads_q
    }
    /// KV heads.
    pub fn heads_kv(&self) -> usize {
        self.heads_kv
    }
    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// Element type of Q, K, V and O.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether a graph captured from this plan's launches may run with `other`'s tables in
    /// the workspace: the same grids (decode units, output tiles, flush count), partial
    /// offsets and shapes, so every size the graph holds is the one `other` needs.
    pub fn same_launch(&self, other: &TurboDecodeStepPlan) -> bool {
        (
            self.heads_q,
            self.heads_kv,
            self.head_dim,
            self.dtype,
            self.append,
        ) == (
            other.heads_q,
            other.heads_kv,
            other.head_dim,
            other.dtype,
            other.append,
        ) && self.before.len() == other.before.len()
            && self.flushes.len() == other.flushes.len()
            && self.decode.num_ctas() == other.decode.num_ctas()
            && self.decode.num_tiles() == other.decode.num_tiles()
            && (
                self.append_at,
                self.flush_at,
                self.decode_at,
                self.part_o,
                self.part_ml,
            ) == (
                other.append_at,
                other.flush_at,
                other.decode_at,
                other.part_o,
                other.part_ml,
            )
    }
}

/// The kernels of one (dtype, head dim) configuration, resolved once, with their shared-memory
/// attributes set: what the device path launches per layer.
#[derive(Clone, Debug)]
pub struct TurboStepKernels {
    gpu: Arc<Gpu>,
    kernels: TurboKernels,
    dtype: DType,
    head_dim: usize,
    /// Prefill attention on `turbo_prefill_wg_*` (sm_90, not `exact_turbo_prefill`), as
    /// [`CudaBackend::turbo_prepare_prefill`] decides.
    wgmma: bool,
}

impl CudaBackend {
    /// The TurboAttention kernels of `dtype` and `head_dim` for launch-only steps.
    pub fn turbo_step_kernels(&self, dtype: DType, head_dim: usize) -> Result<TurboStepKernels> {
        let gpu = self.gpu()?.clone();
        let kernels = self.turbo_decode_kernels(dtype, head_dim)?;
        let wgmma = match (&kernels.prefill_wg, self.options.exact_turbo_prefill) {
            (Some((f, shape)), false) => {
                let _bound = gpu.bind()?;
                // SAFETY: a valid function handle; the size (at head dim 128: 89 KiB for wg, 153
                // KiB for wgf) is within the 227 KiB an sm_90 block may opt into.
                check("cuFuncSetAttribute", unsafe {
                    sys::cuFuncSetAttribute(
                        f.f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        shape.smem_bytes(head_dim) as i32,
                    )
                })?;
                true
            }
            _ => false,
        };
        Ok(TurboStepKernels {
            gpu,
            kernels,
            dtype,
            head_dim,
            wgmma,
        })
    }

    /// The schedule [`CudaBackend::turbo_decode`] would pick for caches of `lens` tokens.
    pub fn turbo_step_schedule(
        &self,
        lens: &[usize],
        heads_q: usize,
        heads_kv: usize,
        dtype: DType,
        head_dim: usize,
    ) -> Result<DecodeSchedule> {
        self.turbo_auto_schedule_for(lens, heads_q, heads_kv, dtype, head_dim)
    }

    /// An empty cache (room for `capacity_tokens` tokens per sequence) on this backend's device.
    /// Zeroing the universal scales is the one synchronous step: the cache is made once.
    pub fn turbo_step_cache(
        &self,
        batch: usize,
        heads_kv: usize,
        head_dim: usize,
        bits: Vec<u8>,
        capacity_tokens: usize,
    ) -> Result<DeviceTurboCache> {
        let c = self.turbo_alloc_cache(batch, heads_kv, head_dim, bits, capacity_tokens)?;
        self.gpu()?.synchronize()?;
        Ok(c)
    }
}

/// The device tensors of one layer's prefill: `q`, `k`, `v` `[B, S, H, D]`, `o` as `q`, `lse`
/// `f32 [B, Hq, S]`.
#[derive(Clone, Copy, Debug)]
pub struct TurboPrefillTensors {
    /// Queries.
    pub q: u64,
    /// Keys.
    pub k: u64,
    /// Values.
    pub v: u64,
    /// Output.
    pub o: u64,
    /// Log-sum-exp (natural log).
    pub lse: u64,
}

impl TurboStepKernels {
    /// Element type of the kernels.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Head dimension of the kernels.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn launch<P>(
        &self,
        f: &Function,
        grid: (usize, usize, usize),
        threads: u32,
        smem: u32,
        stream: sys::CUstream,
        params: &mut P,
    ) -> Result<()> {
        super::launch_on_stream(&self.gpu, f, grid, threads, smem, stream, false, params)
    }

    fn upload_image(&self, image: &[u8], workspace: u64, stream: sys::CUstream) -> Result<()> {
        let _bound = self.gpu.bind()?;
        // SAFETY: the caller vouched for `workspace` (device memory of this GPU, at least the
        // plan's bytes); `image` lives in the plan, which outlives the step. A pageable source
        // is staged by the driver before the call returns.
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                workspace,
                image.as_ptr() as *const std::ffi::c_void,
                image.len(),
                stream,
            )
        })
    }

    fn check_cache(&self, cache: &DeviceTurboCache, batch: usize, heads_kv: usize) -> Result<()> {
        super::check_cache_fits(cache, batch, heads_kv, self.head_dim)
    }

    /// Enqueues the copy of a prefill step's tables into `workspace` on `stream` (once per
    /// step, outside a graph capture).
    ///
    /// # Safety
    /// `workspace` is device memory of this GPU, 256-byte aligned, of at least
    /// `plan.workspace_bytes()` bytes, used by nothing else while the step's launches run;
    /// `stream` is null or a live stream of this device's primary context.
    pub unsafe fn upload_prefill(
        &self,
        plan: &TurboPrefillStepPlan,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.upload_image(&plan.image, workspace, stream)
    }

    /// Enqueues one layer's prefill on `stream`: BPQ of K and V into the workspace's INT8
    /// tiles and into the empty `cache` (full blocks compressed, the tails into the INT8
    /// buffer), then the attention (Alg. 1) into `t.o`, `t.lse`. The cache then holds the
    /// plan's lengths.
    ///
    /// # Safety
    /// [`TurboStepKernels::upload_prefill`] of `plan` into `workspace` was enqueued before on
    /// `stream` (or an ordered stream); `t` holds device addresses of this GPU, 16-byte aligned,
    /// of contiguous tensors of the plan's shapes and dtype (LSE f32).
    pub unsafe fn prefill(
        &self,
        plan: &TurboPrefillStepPlan,
        t: &TurboPrefillTensors,
        cache: &mut DeviceTurboCache,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let p = &plan.problem;
        self.check_cache(cache, p.batch, p.heads_kv)?;
        if (p.dtype, p.head_dim_qk) != (self.dtype, self.head_dim) {
            return Err(CudaError::Plan(format!(
                "a {:?} d{} prefill on the {:?} d{} kernels",
                p.dtype, p.head_dim_qk, self.dtype, self.head_dim
            )));
        }
        if cache.lens.iter().any(|&l| l != 0) {
            return Err(CudaError::Plan(format!(
                "prefill needs an empty cache; it holds {:?} tokens",
                cache.lens
            )));
        }
        if let Some(&l) = p.seqlens_k.iter().find(|&&l| l > cache.capacity_tokens()) {
            return Err(CudaError::Plan(format!(
                "a sequence of {l} tokens exceeds the cache's {} per sequence",
                cache.capacity_tokens()
            )));
        }
        let lens = workspace;
        let mut qp = QuantParams {
            k: t.k,
            v: t.v,
            lens,
            kq: workspace + plan.kq as u64,
            vt: workspace + plan.vt as u64,
            ks: workspace + plan.ks as u64,
            vs: workspace + plan.vs as u64,
            cache: cache.params(),
            batch: p.batch as i32,
            max_s: p.max_seqlen_k as i32,
            heads_kv: p.heads_kv as i32,
            nblk: plan.nblk as i32,
            image: self.wgmma as i32,
        };
        let k = &self.kernels;
        self.launch(
            &k.quant_kv,
            (2 * plan.nblk, p.heads_kv, p.batch), // K of block j in CTA 2 j, V in 2 j + 1
            TURBO_THREADS,
            0,
            stream,
            &mut qp,
        )?;
        self.launch(
            &k.buffer_tail,
            (p.heads_kv, p.batch, 1),
            TURBO_THREADS,
            0,
            stream,
            &mut qp,
        )?;
        let mut pp = PrefillParams {
            q: t.q,
            o: t.o,
            lse: t.lse,
            seqlens_q: lens,
            seqlens_k: lens,
            kq: qp.kq,
            vt: qp.vt,
            ks: qp.ks,
            vs: qp.vs,
            batch: p.batch as i32,
            max_sq: p.max_seqlen_q as i32,
            heads_q: p.heads_q as i32,
            heads_kv: p.heads_kv as i32,
            group: p.group_size() as i32,
            nblk: plan.nblk as i32,
            causal: p.causal as i32,
            sas: plan.cfg.sas as i32,
            sas_nr: plan.cfg.sas_threshold,
            softmax_scale: p.softmax_scale,
            order: 0,
            trace: 0,
            qq: 0,
            qs: 0,
        };
        let q_blocks = p.max_seqlen_q.div_ceil(TURBO_BLOCK);
        match (&k.prefill_wg, self.wgmma) {
            (Some((f, shape)), true) => {
                if *shape == WGF_SHAPE {
                    let (qq, qs) = (workspace + plan.qq as u64, workspace + plan.qs as u64);
                    let mut qp = QuantParams::for_q(p, t.q, lens, qq, qs);
                    self.launch(
                        &k.quant_q,
                        (q_blocks, p.heads_q, p.batch),
                        TURBO_THREADS,
                        0,
                        stream,
                        &mut qp,
                    )?;
                    pp.qq = qq;
                    pp.qs = qs;
                }
                let (grid, order) =
                    shape.launch_grid(p.causal, p.max_seqlen_q, p.heads_q, p.heads_kv, p.batch);
                pp.order = order;
                self.launch(
                    f,
                    grid,
                    shape.threads,
                    shape.smem_bytes(p.head_dim_qk),
                    stream,
                    &mut pp,
                )?
            }
            _ => self.launch(
                &k.prefill,
                (q_blocks, p.heads_q, p.batch),
                TURBO_THREADS,
                0,
                stream,
                &mut pp,
            )?,
        }
        cache.lens = p.seqlens_k.clone();
        Ok(())
    }

    /// Enqueues the copy of a decode step's tables into `workspace` on `stream` (once per
    /// step, outside a graph capture).
    ///
    /// # Safety
    /// As [`TurboStepKernels::upload_prefill`], for `plan`.
    pub unsafe fn upload_decode(
        &self,
        plan: &TurboDecodeStepPlan,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.upload_image(&plan.image, workspace, stream)
    }

    fn check_step(&self, plan: &TurboDecodeStepPlan, cache: &DeviceTurboCache) -> Result<()> {
        self.check_cache(cache, plan.before.len(), plan.heads_kv)?;
        if (plan.dtype, plan.head_dim) != (self.dtype, self.head_dim) {
            return Err(CudaError::Plan(format!(
                "a {:?} d{} step on the {:?} d{} kernels",
                plan.dtype, plan.head_dim, self.dtype, self.head_dim
            )));
        }
        Ok(())
    }

    /// Enqueues one layer's append of `k_new`, `v_new` (`[B, 1, Hk, D]`) into `cache` on
    /// `stream` and the flush of every buffer that becomes full. The cache must hold the
    /// plan's lengths before the step (or after it: the same step appended again, see the
    /// module docs); it then holds the lengths after it.
    ///
    /// # Safety
    /// [`TurboStepKernels::upload_decode`] of `plan` into `workspace` was enqueued before on
    /// `stream` (or an ordered stream); `k_new`, `v_new` are device addresses of this GPU,
    /// 16-byte aligned, of contiguous `[B, 1, Hk, D]` tensors of the plan's dtype.
    pub unsafe fn append(
        &self,
        plan: &TurboDecodeStepPlan,
        k_new: u64,
        v_new: u64,
        cache: &mut DeviceTurboCache,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check_step(plan, cache)?;
        if !plan.append {
            return Err(CudaError::Plan(
                "the step was planned without an append".into(),
            ));
        }
        if cache.lens != plan.before && cache.lens != plan.after {
            return Err(CudaError::Plan(format!(
                "the step was planned for caches of {:?} tokens; this one holds {:?}",
                plan.before, cache.lens
            )));
        }
        if let Some(b) = (0..plan.after.len()).find(|&b| plan.after[b] > cache.capacity_tokens()) {
            return Err(CudaError::Plan(format!(
                "sequence {b} would hold {} tokens; the cache holds at most {}",
                plan.after[b],
                cache.capacity_tokens()
            )));
        }
        let batch = plan.before.len();
        let t = workspace + plan.append_at as u64;
        let mut ap = AppendParams {
            k: k_new,
            v: v_new,
            src_tok: t,
            lens: t + 4 * batch as u64,
            cache: cache.params(),
            batch: batch as i32,
            src_len: 1,
            heads_kv: plan.heads_kv as i32,
        };
        self.launch(
            &self.kernels.append,
            (plan.heads_kv, batch, 1),
            TURBO_THREADS,
            0,
            stream,
            &mut ap,
        )?;
        let n = plan.flushes.len();
        let f = workspace + plan.flush_at as u64;
        let mut fp = FlushParams {
            seqs: f,
            blocks: f + 4 * n as u64,
            cache: cache.params(),
            count: n as i32,
            heads_kv: plan.heads_kv as i32,
        };
        self.launch(
            &self.kernels.flush,
            (plan.heads_kv, n, 1),
            TURBO_THREADS,
            0,
            stream,
            &mut fp,
        )?;
        cache.lens = plan.after.clone();
        Ok(())
    }

    /// Enqueues one layer's decode (Alg. 2) of `q` (`[B, 1, Hq, D]`) over `cache` into `o`
    /// (as `q`) and `lse` (`f32 [B, Hq, 1]`), then the merge of the partials, on `stream`.
    /// The cache must hold the plan's lengths after the step.
    ///
    /// # Safety
    /// As [`TurboStepKernels::append`], for `q`, `o` and `lse`.
    #[allow(clippy::too_many_arguments)] // the device addresses of one launch and its settings
    pub unsafe fn decode(
        &self,
        plan: &TurboDecodeStepPlan,
        cfg: &TurboConfig,
        q: u64,
        o: u64,
        lse: u64,
        softmax_scale: f32,
        cache: &DeviceTurboCache,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check_step(plan, cache)?;
        check_supported(cfg, self.dtype, self.head_dim)?;
        if cache.lens != plan.after {
            return Err(CudaError::Plan(format!(
                "decode planned for caches of {:?} tokens; this one holds {:?}",
                plan.after, cache.lens
            )));
        }
        let pl = &plan.decode;
        let at = |i: usize| workspace + plan.decode_at[i] as u64;
        let cache_params: CacheParams = cache.params();
        let mut dp = DecodeParams {
            q,
            o,
            lse,
            lens: at(0),
            q_tok: at(1),
            seq_start: at(2),
            cta_bounds: at(3),
            cta_slot: at(4),
            tile_slot: at(5),
            part_o: workspace + plan.part_o as u64,
            part_ml: workspace + plan.part_ml as u64,
            cache: cache_params,
            batch: pl.lens.len() as i32,
            max_sq: 1,
            heads_q: pl.heads_q as i32,
            heads_kv: pl.heads_kv as i32,
            group: (pl.heads_q / pl.heads_kv) as i32,
            qgroups: pl.qgroups as i32,
            num_ctas: pl.num_ctas() as i32,
            num_tiles: pl.num_tiles() as i32,
            sas: cfg.sas as i32,
            sas_nr: cfg.sas_threshold,
            softmax_scale,
        };
        self.launch(
            self.kernels.decode_instance(
                pl.heads_q / pl.heads_kv,
                &cache.bits,
                pl.grid_ctas(),
                self.gpu.caps.compute_units,
            ),
            (pl.grid_ctas(), 1, 1),
            TURBO_THREADS,
            decode_smem_bytes(self.head_dim) as u32,
            stream,
            &mut dp,
        )?;
        super::launch_on_stream(
            &self.gpu,
            &self.kernels.combine,
            (
                pl.num_tiles(),
                crate::turbo::combine_rows(pl.heads_q, pl.heads_kv),
                1,
            ),
            crate::turbo::TURBO_COMBINE_THREADS,
            0,
            stream,
            self.kernels
                .combine_pdl_for(&cache.bits, pl.grid_ctas(), self.gpu.caps.compute_units),
            &mut dp,
        )
    }
}

/// Enqueues the emptying of `cache` on `stream` (every sequence back to 0 tokens, no universal
/// scale), so a new prompt can be prefilled into it.
///
/// # Safety
/// `stream` is null or a live stream of the primary context of the cache's device; nothing
/// enqueued elsewhere uses the cache meanwhile.
pub unsafe fn turbo_reset_cache(
    gpu: &Gpu,
    cache: &mut DeviceTurboCache,
    stream: sys::CUstream,
) -> Result<()> {
    let _bound = gpu.bind()?;
    for t in [&cache.k, &cache.v] {
        // SAFETY: the cache's own allocation of batch * heads_kv f32 scales. Raw
        // `cuMemsetD32Async`: cudarc's safe memset runs on its own stream type.
        check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(t.buf_scale.ptr(), 0, t.buf_scale.bytes() / 4, stream)
        })?;
    }
    cache.lens.iter_mut().for_each(|l| *l = 0);
    Ok(())
}

/// Device bytes a cache of `batch` sequences of up to `capacity_tokens` tokens holds, as
/// [`DeviceTurboCache::allocated_bytes`] counts them, for memory planning before it exists.
pub fn turbo_cache_bytes(
    batch: usize,
    heads_kv: usize,
    head_dim: usize,
    bits: &[u8],
    capacity_tokens: usize,
) -> usize {
    let cap = capacity_tokens / TURBO_BLOCK;
    let (_, seq_code_bytes) = code_layout(head_dim, bits, cap);
    // codes; per block: channel scales and zero points, the INT8 scale, the clamp flag; the
    // INT8 buffer and its universal scale
    let per_tensor = batch * seq_code_bytes as usize
        + batch * heads_kv * cap * (2 * head_dim + 4 + 4)
        + batch * heads_kv * (TURBO_BLOCK * head_dim + 4);
    2 * per_tensor
}
