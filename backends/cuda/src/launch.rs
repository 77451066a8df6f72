//! Launching the Lean decode.
//!
//! The device path, as serving engines call attention (FlashInfer's `plan`/`run` split):
//! [`LeanStepPlan`] is made on the host once per decode step (pure, serialisable) and says how
//! many workspace bytes the step needs; the caller allocates the workspace once;
//! [`LeanKernels::upload`] copies the step's tables into it on the caller's stream; then
//! [`LeanKernels::run`] per layer (and [`LeanKernels::append`] for the step's new tokens)
//! only launches: no allocation, no host synchronisation, no host-device copy, so a whole
//! decode step can be captured in one CUDA graph. These entry points take raw device addresses
//! and are `unsafe`; the facade crate's views validate them first.
//!
//! [`PreparedLean`] (device-resident inputs from [`DeviceInputs`], an owned workspace) is the
//! convenience path on top, used by the host-tensor `run` and the benchmarks.

use crate::device::{DeviceBuffer, Gpu};
use crate::error::{check, CudaError, Result};
use crate::kernels::{self, Function, LeanEntry, LeanInstance, LEAN_THREADS};
use cudarc::driver::sys;
use ferrattn_core::lean::{KernelTables, LeanPlan, Schedule, TileSpace};
use ferrattn_core::{
    AttentionInputs, AttentionOutput, AttentionPlan, AttentionProblem, DType, PlanDetail,
    Provenance, Tensor,
};
use half::{bf16, f16};
use std::sync::Arc;

/// Kernel parameters, mirrored by `struct LeanParams` in `cuda-kernels/lean_decode.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeanParams {
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    lse: u64,
    seqlens_q: u64,
    seqlens_k: u64,
    seq_start: u64,
    cta_bounds: u64,
    cta_info: u64,
    part_o: u64,
    part_ml: u64,
    flags: u64,
    tile_per_cta: u32,
    num_ctas: i32,
    batch: i32,
    max_sq: i32,
    max_sk: i32,
    heads_q: i32,
    heads_kv: i32,
    group: i32,
    tile_m: i32,
    query_groups: i32,
    tile_k: i32,
    causal: i32,
    merge_in_kernel: i32,
    scale_log2: f32,
    page_table: u64,
    max_pages: i32,
    page_shift: i32,
    cta_words: u64,
}

/// Q, K, V and sequence lengths on the device, as 16-bit values.
#[derive(Debug)]
pub struct DeviceInputs {
    pub(crate) problem: AttentionProblem,
    pub(crate) q: DeviceBuffer,
    pub(crate) k: DeviceBuffer,
    pub(crate) v: DeviceBuffer,
    pub(crate) seqlens_q: DeviceBuffer,
    pub(crate) seqlens_k: DeviceBuffer,
}

/// O `[B, Sq, Hq, D]` (16-bit) and LSE `f32 [B, Hq, Sq]` on the device.
#[derive(Debug)]
pub struct DeviceOutputs {
    pub(crate) o: DeviceBuffer,
    pub(crate) lse: DeviceBuffer,
}

/// A Lean plan made ready to launch on the backend's own stream: kernels resolved, the step's
/// tables uploaded once into an owned workspace.
#[derive(Debug)]
pub struct PreparedLean {
    step: LeanStepPlan,
    kernels: Arc<LeanKernels>,
    workspace: DeviceBuffer,
}

fn to_bits(dtype: DType, data: &[f32]) -> Result<Vec<u16>> {
    match dtype {
        DType::F16 => Ok(data.iter().map(|&x| f16::from_f32(x).to_bits()).collect()),
        DType::BF16 => Ok(data.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()),
        other => Err(CudaError::Unsupported {
            what: format!("{other} tensors on CUDA"),
            supported: "f16, bf16".into(),
        }),
    }
}

fn from_bits(dtype: DType, data: &[u16]) -> Vec<f32> {
    match dtype {
        DType::F16 => data.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
        _ => data.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
    }
}

impl DeviceInputs {
    /// Uploads host inputs of a validated problem.
    pub fn upload(
        gpu: &Arc<Gpu>,
        p: &AttentionProblem,
        x: &AttentionInputs,
    ) -> Result<DeviceInputs> {
        let v = x.v.as_ref().ok_or_else(|| CudaError::Unsupported {
            what: "MLA latent inputs for lean decode".into(),
            supported: "separate K and V".into(),
        })?;
        let lens = |l: &[usize]| l.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        Ok(DeviceInputs {
            problem: p.clone(),
            q: DeviceBuffer::from_slice(gpu, &to_bits(p.dtype, &x.q.data)?)?,
            k: DeviceBuffer::from_slice(gpu, &to_bits(p.dtype, &x.k.data)?)?,
            v: DeviceBuffer::from_slice(gpu, &to_bits(p.dtype, &v.data)?)?,
            seqlens_q: DeviceBuffer::from_slice(gpu, &lens(&p.seqlens_q))?,
            seqlens_k: DeviceBuffer::from_slice(gpu, &lens(&p.seqlens_k))?,
        })
    }

    /// Inputs filled on the device with uniform values in `[-scale, scale)` (no host copy; for
    /// inputs of many gigabytes).
    pub fn random(
        gpu: &Arc<Gpu>,
        fill: &Function,
        p: &AttentionProblem,
        seed: u32,
        scale: f32,
    ) -> Result<DeviceInputs> {
        let e = p.dtype.size_bytes();
        let nq = p.batch * p.max_seqlen_q * p.heads_q * p.head_dim_qk;
        let nk = p.batch * p.max_seqlen_k * p.heads_kv * p.head_dim_qk;
        let nv = p.batch * p.max_seqlen_k * p.heads_kv * p.head_dim_v;
        let lens = |l: &[usize]| l.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        let x = DeviceInputs {
            problem: p.clone(),
            q: DeviceBuffer::alloc(gpu, nq * e)?,
            k: DeviceBuffer::alloc(gpu, nk * e)?,
            v: DeviceBuffer::alloc(gpu, nv * e)?,
            seqlens_q: DeviceBuffer::from_slice(gpu, &lens(&p.seqlens_q))?,
            seqlens_k: DeviceBuffer::from_slice(gpu, &lens(&p.seqlens_k))?,
        };
        for (i, (buf, n)) in [(&x.q, nq), (&x.k, nk), (&x.v, nv)].into_iter().enumerate() {
            let mut ptr = buf.ptr();
            let mut n = n as u64;
            let mut s = seed.wrapping_mul(3).wrapping_add(i as u32 * 0x5bd1e995);
            let mut sc = scale;
            let mut args = [
                &mut ptr as *mut u64 as *mut std::ffi::c_void,
                &mut n as *mut u64 as *mut std::ffi::c_void,
                &mut s as *mut u32 as *mut std::ffi::c_void,
                &mut sc as *mut f32 as *mut std::ffi::c_void,
            ];
            launch_raw(gpu, fill, (132 * 16, 256), 0, &mut args)?;
        }
        Ok(x)
    }

    /// Copies the inputs back as host tensors (to compute references for device-filled inputs).
    pub fn download(&self) -> Result<AttentionInputs> {
        let p = &self.problem;
        let t = |b: &DeviceBuffer, shape: [usize; 4]| -> Result<Tensor> {
            Ok(Tensor {
                shape: shape.to_vec(),
                dtype: p.dtype,
                data: from_bits(p.dtype, &b.to_vec::<u16>()?),
            })
        };
        let q = t(&self.q, [p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk])?;
        let k = t(
            &self.k,
            [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_qk],
        )?;
        let v = t(&self.v, [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_v])?;
        Ok(AttentionInputs {
            seqlens_q: Some(p.seqlens_q.iter().map(|&x| x as i64).collect()),
            seqlens_k: Some(p.seqlens_k.iter().map(|&x| x as i64).collect()),
            ..AttentionInputs::new(q, k, v)
        })
    }

    /// The problem these tensors describe.
    pub fn problem(&self) -> &AttentionProblem {
        &self.problem
    }

    /// Q `[batch, max_seqlen_q, heads_q, head_dim]` on the device.
    pub fn q(&self) -> &DeviceBuffer {
        &self.q
    }

    /// K `[batch, max_seqlen_k, heads_kv, head_dim]` on the device.
    pub fn k(&self) -> &DeviceBuffer {
        &self.k
    }

    /// V, as K.
    pub fn v(&self) -> &DeviceBuffer {
        &self.v
    }

    /// Bytes of K and V that attention must read (valid tokens only).
    pub fn kv_bytes_read(&self) -> usize {
        let p = &self.problem;
        p.total_kv_tokens() * p.heads_kv * (p.head_dim_qk + p.head_dim_v) * p.dtype.size_bytes()
    }
}

impl DeviceOutputs {
    /// Uninitialised outputs for `p`.
    pub fn alloc(gpu: &Arc<Gpu>, p: &AttentionProblem) -> Result<DeviceOutputs> {
        let no = p.batch * p.max_seqlen_q * p.heads_q * p.head_dim_v;
        let nl = p.batch * p.heads_q * p.max_seqlen_q;
        Ok(DeviceOutputs {
            o: DeviceBuffer::alloc(gpu, no * 2)?,
            lse: DeviceBuffer::alloc(gpu, nl * 4)?,
        })
    }

    /// Fills O and LSE with NaN so that an element the kernel does not write shows up.
    pub fn poison(&mut self) -> Result<()> {
        self.o.fill_u16(0xffff)?; // NaN in f16 and bf16
        self.lse.fill_u32(0xffff_ffff) // NaN
    }

    /// Copies the outputs to host tensors.
    pub fn download(
        &self,
        p: &AttentionProblem,
        provenance: Provenance,
    ) -> Result<AttentionOutput> {
        let o = Tensor {
            shape: vec![p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v],
            dtype: p.dtype,
            data: from_bits(p.dtype, &self.o.to_vec::<u16>()?),
        };
        let lse = Tensor {
            shape: vec![p.batch, p.heads_q, p.max_seqlen_q],
            dtype: DType::F32,
            data: self.lse.to_vec::<f32>()?,
        };
        Ok(AttentionOutput { o, lse, provenance })
    }

    /// O on the device.
    pub fn o(&self) -> &DeviceBuffer {
        &self.o
    }

    /// LSE on the device.
    pub fn lse(&self) -> &DeviceBuffer {
        &self.lse
    }

    /// Raw 16-bit O bits (for bitwise comparisons).
    pub fn o_bits(&self) -> Result<Vec<u16>> {
        self.o.to_vec()
    }
}

pub(crate) fn launch_raw(
    gpu: &Arc<Gpu>,
    f: &Function,
    (grid, block): (u32, u32),
    smem: u32,
    args: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    // SAFETY: the caller passes args that match the kernel's parameters; the stream is ours.
    unsafe { launch_on(gpu, f, (grid, block), smem, gpu.stream, false, args) }
}

/// Enqueues `f` on `stream`; `cooperative` asks the driver to guarantee that every CTA of the
/// grid is co-resident (it refuses the launch otherwise, rather than letting a CTA wait forever).
///
/// Raw driver calls rather than cudarc's safe launch: the stream and every buffer belong to the
/// caller (an engine's allocator and stream), which cudarc's ownership types cannot express.
///
/// # Safety
/// `args` point at live values matching the kernel's parameter list; `stream` is a stream of
/// this GPU's context (or null, the legacy default stream).
pub(crate) unsafe fn launch_on(
    gpu: &Arc<Gpu>,
    f: &Function,
    (grid, block): (u32, u32),
    smem: u32,
    stream: sys::CUstream,
    cooperative: bool,
    args: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    let _bound = gpu.bind()?;
    if cooperative {
        check("cuLaunchCooperativeKernel", unsafe {
            sys::cuLaunchCooperativeKernel(
                f.f,
                grid,
                1,
                1,
                block,
                1,
                1,
                smem,
                stream,
                args.as_mut_ptr(),
            )
        })
    } else {
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f.f,
                grid,
                1,
                1,
                block,
                1,
                1,
                smem,
                stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

/// Enqueues `f` on `stream` under programmatic stream serialization (compute capability 9.0 or
/// newer): `f` may be scheduled once every CTA of the kernel before it on `stream` has started and
/// signalled (`griddepcontrol.launch_dependents`), its launch overlapping that kernel's tail, and
/// waits on the device (`griddepcontrol.wait`) before reading that kernel's output. Inside a
/// stream capture the driver records a programmatic graph edge.
///
/// # Safety
/// As [`launch_on`]; `f` calls `griddepcontrol.wait` before its first read of anything the kernel
/// before it on `stream` writes, and writes nothing that kernel reads.
pub(crate) unsafe fn launch_programmatic(
    gpu: &Arc<Gpu>,
    f: &Function,
    grid: [u32; 3],
    block: u32,
    smem: u32,
    stream: sys::CUstream,
    args: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    let _bound = gpu.bind()?;
    // Raw cuLaunchKernelEx: cudarc's safe layer has no launch attributes.
    // SAFETY: an all-zero launch attribute is a valid value of the C union (IGNORE), then
    // filled as the driver documents it.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `cfg` and `attr` outlive the call; args as in this function's contract.
    check("cuLaunchKernelEx", unsafe {
        sys::cuLaunchKernelEx(&cfg, f.f, args.as_mut_ptr(), std::ptr::null_mut())
    })
}

/// Where K and V live.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum KvStorage {
    /// One `[batch, max_seqlen_k, heads_kv, head_dim]` buffer each for K and V.
    Contiguous,
    /// A page pool `[num_pages, page_size, heads_kv, head_dim]` each for K and V (NHD, as vLLM
    /// and FlashInfer lay it out) and a page table.
    Paged(Paging),
}

/// A page table into a K/V page pool. Deserialised values are checked again when a
/// [`LeanStepPlan`] is made from them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Paging {
    page_size: usize,
    num_pages: usize,
    max_pages: usize,
    table: Vec<i32>,
}

/// Page sizes the paged kernels take (a power of two; 16 is vLLM's default, 64 FlashMLA's).
pub const PAGE_SIZES: [usize; 2] = [16, 64];

/// Token rows (`num_pages * page_size`) a page pool may hold: the paged decode carries a key's
/// pool row in 32 bits with `u32::MAX` meaning "no key" (`lean_decode.cu`, `rows_s`). A pool of
/// this many rows is far beyond any GPU's memory (at least 128 bytes per row for K alone).
pub const MAX_POOL_ROWS: usize = u32::MAX as usize - 1;

impl Paging {
    /// `table` is `[batch, max_pages]` row-major: entry `(b, i)` is the pool page holding tokens
    /// `i * page_size ..` of sequence `b`. Checks what the kernels rely on: the page size is one
    /// of [`PAGE_SIZES`], the table is `batch * max_pages` long and every page a sequence of
    /// `seqlens_k` uses is in `0..num_pages`. (The facade reports these as typed errors first.)
    pub fn new(
        page_size: usize,
        num_pages: usize,
        max_pages: usize,
        table: Vec<i32>,
        seqlens_k: &[usize],
    ) -> Result<Paging> {
        let bad = |m: String| Err(CudaError::Plan(m));
        if !PAGE_SIZES.contains(&page_size) {
            return bad(format!("page size {page_size}; supported: {PAGE_SIZES:?}"));
        }
        if num_pages.saturating_mul(page_size) > MAX_POOL_ROWS {
            return bad(format!(
                "a pool of {num_pages} pages of {page_size} tokens; the paged kernels address \
                 at most {MAX_POOL_ROWS} token rows"
            ));
        }
        if max_pages == 0 || table.len() != seqlens_k.len() * max_pages {
            return bad(format!(
                "page table of {} entries for {} sequences of {max_pages} pages",
                table.len(),
                seqlens_k.len()
            ));
        }
        for (b, &len) in seqlens_k.iter().enumerate() {
            let used = len.div_ceil(page_size);
            if used > max_pages {
                return bad(format!(
                    "sequence {b} has {len} tokens, more than {max_pages} pages of {page_size}"
                ));
            }
            let row = &table[b * max_pages..b * max_pages + used];
            if let Some(i) = row
                .iter()
                .position(|&pg| pg < 0 || pg as usize >= num_pages)
            {
                return bad(format!(
                    "page table entry ({b}, {i}) = {} outside the pool of {num_pages} pages",
                    row[i]
                ));
            }
        }
        Ok(Paging {
            page_size,
            num_pages,
            max_pages,
            table,
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages in the pool.
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Entries per page-table row.
    pub fn max_pages(&self) -> usize {
        self.max_pages
    }

    /// The table, `[batch, max_pages]` row-major.
    pub fn table(&self) -> &[i32] {
        &self.table
    }
}

/// Byte offsets of a step's tables and scratch in the caller's workspace. The first
/// `header_bytes` are uploaded once per step ([`LeanKernels::upload`]); the partials after them
/// are scratch the kernels write and read within a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkspaceLayout {
    seqlens_q: usize,
    seqlens_k: usize,
    append_start: usize,
    seq_start: usize,
    cta_bounds: usize,
    cta_info: usize,
    page_table: usize,
    cta_words: usize,
    flags: usize,
    header_bytes: usize,
    part_o: usize,
    part_ml: usize,
    total: usize,
}

/// Words of a CTA's record in the workspace (`cta_info` in `cuda-kernels/lean_decode.cu`): its
/// iteration range, first tile, the last CTA its host tile waits for, and that first tile's range
/// and sequence lengths, so that a CTA finds where to load its first K/V stage with one 32-byte
/// read instead of two dependent rounds of table reads.
pub const CTA_INFO_WORDS: usize = 8;

/// K/V stages of a CTA whose page words its record holds (paged caches under a stream-K table;
/// `kFirstUnits` in `cuda-kernels/lean_decode.cu`): the kernel's first copies then wait for one
/// round of reads (the records), not for `cta_info` and then the page table.
pub const LEAN_FIRST_UNITS: usize = 3;

/// Page words of one K/V stage (pages of 16) for head dim `d`: 8, 4, 2 for 64, 128, 256.
pub fn lean_stage_words(d: usize) -> usize {
    kernels::lean_stage_keys(d) / 16
}

/// Most words of a CTA's page-word record, any head dim (`WorkspaceLayout`).
pub const CTA_WORDS_MAX: usize = LEAN_FIRST_UNITS * 8;

/// Alignment of every region of the workspace (the workspace itself must be 256-aligned, as
/// `cudaMalloc` returns it).
pub const WORKSPACE_ALIGN: usize = 256;

impl WorkspaceLayout {
    fn new(batch: usize, num_ctas: usize, rows: usize, head_dim: usize, pages: usize) -> Self {
        let mut at = 0usize;
        let mut region = |bytes: usize| {
            let off = at;
            at = (at + bytes).next_multiple_of(WORKSPACE_ALIGN);
            (off, at)
        };
        let (seqlens_q, _) = region(4 * batch);
        let (seqlens_k, _) = region(4 * batch);
        let (append_start, _) = region(4 * batch);
        let (seq_start, _) = region(4 * (batch + 1));
        let (cta_bounds, _) = region(4 * (num_ctas + 1));
        let (cta_info, _) = region(4 * CTA_INFO_WORDS * num_ctas);
        let (page_table, _) = region(4 * pages);
        // paged caches: the page words of each CTA's first stages ([`LEAN_FIRST_UNITS`])
        let words = if pages > 0 {
            LEAN_FIRST_UNITS * lean_stage_words(head_dim) * num_ctas
        } else {
            0
        };
        let (cta_words, _) = region(4 * words);
        let (flags, header_bytes) = region(4 * num_ctas);
        let (part_o, _) = region(4 * num_ctas * rows * head_dim);
        let (part_ml, total) = region(4 * num_ctas * rows * 2);
        WorkspaceLayout {
            seqlens_q,
            seqlens_k,
            append_start,
            seq_start,
            cta_bounds,
            cta_info,
            page_table,
            cta_words,
            flags,
            header_bytes,
            part_o,
            part_ml,
            total,
        }
    }

    /// Bytes the caller must provide.
    pub fn total_bytes(&self) -> usize {
        self.total
    }

    /// Bytes of a workspace that serves any step of `batch` sequences with at most `num_ctas`
    /// CTAs, tiles of `rows` query rows, head dim `head_dim` and `table_entries` page-table
    /// entries (allocate once, e.g. before capturing a graph).
    pub fn bound(
        batch: usize,
        num_ctas: usize,
        rows: usize,
        head_dim: usize,
        table_entries: usize,
    ) -> usize {
        WorkspaceLayout::new(batch, num_ctas, rows, head_dim, table_entries).total
    }
}

/// One decode step's launch plan: the Lean schedule for the step's lengths, the kernel instance,
/// where K/V live and the workspace layout. Pure host data; fields are private so that nothing
/// that feeds a grid size or an offset changes after [`LeanStepPlan::new`] checked it. JSON
/// carries everything for inspection; reading it back keeps only the inputs of
/// [`LeanStepPlan::new`] and runs it again, so a plan from a file is checked like a new one.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "StepInputs")]
pub struct LeanStepPlan {
    problem: AttentionProblem,
    plan: LeanPlan,
    instance: LeanInstance,
    kv: KvStorage,
    new_tokens: usize,
    tables: KernelTables,
    layout: WorkspaceLayout,
    num_tiles: usize,
    /// K/V pipeline stages of the whole grid (LeanTile iterations times stages per iteration).
    #[serde(default)]
    stage_units: u64,
    #[serde(skip)]
    header: Vec<u8>,
}

/// Checks that `plan` is what the planner makes for `p` from its own parameters: row tiling,
/// and a schedule equal to the one rebuilt from its CTA count (stream-K) or split count (fixed
/// split) over `p`'s iteration space. The kernel trusts these tables for every offset it takes,
/// so a plan edited by hand or read from a file for another problem is refused here.
fn check_schedule(plan: &LeanPlan, p: &AttentionProblem, space: &TileSpace) -> Result<()> {
    let rows = p.group_size() * p.max_seqlen_q;
    let tile_m = rows.min(ferrattn_core::lean::MAX_TILE_M);
    if plan.tile_m != tile_m || plan.query_groups != rows.div_ceil(tile_m) {
        return Err(CudaError::Plan(format!(
            "plan tiles {} query rows in {} groups; the problem has {rows} rows per KV head (tiles of {tile_m})",
            plan.tile_m, plan.query_groups
        )));
    }
    let rebuilt = match &plan.schedule {
        Schedule::StreamK { .. } => Schedule::stream_k(space, plan.schedule.num_ctas()),
        Schedule::FixedSplit { splits, .. } => Schedule::fixed_split(space, *splits),
    };
    if rebuilt != plan.schedule || plan.num_ctas != plan.schedule.num_ctas() {
        return Err(CudaError::Plan(format!(
            "the plan's schedule ({} CTAs) is not the one its parameters give for this problem's {} iterations",
            plan.num_ctas,
            space.total_iters()
        )));
    }
    Ok(())
}

/// What [`LeanStepPlan`] is made from (its deserialised form).
#[derive(serde::Deserialize)]
struct StepInputs {
    problem: AttentionProblem,
    plan: LeanPlan,
    kv: KvStorage,
    new_tokens: usize,
}

impl TryFrom<StepInputs> for LeanStepPlan {
    type Error = CudaError;
    fn try_from(x: StepInputs) -> Result<LeanStepPlan> {
        x.problem.validate()?;
        LeanStepPlan::new(&x.problem, &x.plan, x.kv, x.new_tokens)
    }
}

impl LeanStepPlan {
    /// The launch plan of `plan` (a Lean plan of `problem`) with K/V in `kv`. The last
    /// `new_tokens` positions of each sequence (`seqlens_k` counts them) are what
    /// [`LeanKernels::append`] writes.
    pub fn new(
        problem: &AttentionProblem,
        plan: &LeanPlan,
        kv: KvStorage,
        new_tokens: usize,
    ) -> Result<LeanStepPlan> {
        let p = problem;
        let d = p.head_dim_qk;
        if p.head_dim_v != d {
            return Err(CudaError::Unsupported {
                what: format!("head dims qk={d} v={}", p.head_dim_v),
                supported: "qk = v".into(),
            });
        }
        let sk = kernels::lean_stage_keys(d);
        if !plan.tile_k.is_multiple_of(sk) {
            return Err(CudaError::Plan(format!(
                "tile_k {} is not a multiple of the kernel's {sk}-key stage for head dim {d} (plan made for another device?)",
                plan.tile_k
            )));
        }
        let instance = LeanInstance::new(p.dtype, d, plan.tile_m)?;
        if let KvStorage::Paged(pg) = &kv {
            // a Paging checked itself against lengths; these must be the same lengths
            Paging::new(
                pg.page_size,
                pg.num_pages,
                pg.max_pages,
                pg.table.clone(),
                &p.seqlens_k,
            )?;
        }
        let space = plan.tile_space(p);
        check_schedule(plan, p, &space)?;
        let tables = plan
            .schedule
            .kernel_tables(&space)
            .ok_or_else(|| CudaError::Unsupported {
                what: format!("{} LeanTile iterations", space.total_iters()),
                supported: "fewer than 2^32".into(),
            })?;
        // one CTA per tile derives its range from its index: no per-CTA table, flag or partial
        // (so a grid of more CTAs than slots fits the workspace a stream-K grid bounds)
        let g = if plan.schedule.one_cta_per_tile(&space) {
            0
        } else {
            tables.cta_bounds.len() - 1
        };
        let pages = match &kv {
            KvStorage::Contiguous => 0,
            KvStorage::Paged(pg) => pg.table.len(),
        };
        let layout = WorkspaceLayout::new(p.batch, g, instance.rows(), d, pages);
        let mut step = LeanStepPlan {
            problem: p.clone(),
            plan: plan.clone(),
            instance,
            kv,
            new_tokens,
            tables,
            layout,
            num_tiles: space.num_tiles(),
            stage_units: space.total_iters() * (plan.tile_k / sk) as u64,
            header: Vec::new(),
        };
        step.header = step.header_image();
        Ok(step)
    }

    /// Whether CTA `g` computes exactly tile `g` (a fixed split of one chunk per tile): the
    /// kernel then reads no per-CTA table and the workspace holds none.
    fn tile_per_cta(&self) -> bool {
        matches!(self.plan.schedule, Schedule::FixedSplit { .. })
            && self.num_ctas() == self.num_tiles
    }

    /// Per CTA: `[begin, end, first tile, last CTA waited for, first tile's start and end,
    /// its sequence's key and query lengths]` (see [`CTA_INFO_WORDS`]).
    fn cta_info(&self) -> Vec<u32> {
        let t = &self.tables;
        let p = &self.problem;
        let space = self.plan.tile_space(p);
        let g = t.cta_bounds.len() - 1;
        let mut info = Vec::with_capacity(CTA_INFO_WORDS * g);
        for c in 0..g {
            let tile = t.cta_tiles[2 * c] as usize;
            let (start, end) = space.tile_range(tile);
            let b = space.tile_coords(tile).0;
            info.extend_from_slice(&[
                t.cta_bounds[c],
                t.cta_bounds[c + 1],
                t.cta_tiles[2 * c],
                t.cta_tiles[2 * c + 1],
                start as u32,
                end as u32,
                p.seqlens_k[b] as u32,
                p.seqlens_q[b] as u32,
            ]);
        }
        info
    }

    /// The host image of the workspace's table region (flags zeroed).
    fn header_image(&self) -> Vec<u8> {
        let l = &self.layout;
        let mut img = vec![0u8; l.header_bytes];
        let mut put = |off: usize, words: &[u32]| {
            for (i, w) in words.iter().enumerate() {
                img[off + 4 * i..off + 4 * i + 4].copy_from_slice(&w.to_ne_bytes());
            }
        };
        let p = &self.problem;
        let lens = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
        put(l.seqlens_q, &lens(&p.seqlens_q));
        put(l.seqlens_k, &lens(&p.seqlens_k));
        let starts: Vec<u32> = p
            .seqlens_k
            .iter()
            .map(|&x| x.saturating_sub(self.new_tokens) as u32)
            .collect();
        put(l.append_start, &starts);
        put(l.seq_start, &self.tables.seq_start);
        if !self.tile_per_cta() {
            put(l.cta_bounds, &self.tables.cta_bounds);
            put(l.cta_info, &self.cta_info());
        }
        if let KvStorage::Paged(pg) = &self.kv {
            let t: Vec<u32> = pg.table.iter().map(|&x| x as u32).collect();
            put(l.page_table, &t);
            if !self.tile_per_cta() {
                put(l.cta_words, &self.cta_words(pg));
            }
        }
        img
    }

    /// Per CTA, the page words of its first [`LEAN_FIRST_UNITS`] K/V stages
    /// (`[num_ctas, LEAN_FIRST_UNITS, lean_stage_words(d)]`, the words `fetch_words` in
    /// `lean_decode.cu` reads from the page table for later stages: those of the pages the stage's
    /// keys lie in, in order, 0 for a page with no key in the sequence or past the CTA's range).
    fn cta_words(&self, pg: &Paging) -> Vec<u32> {
        let t = &self.tables;
        let p = &self.problem;
        let space = self.plan.tile_space(p);
        let g = t.cta_bounds.len() - 1;
        let d = p.head_dim_qk;
        let (sk, nw) = (kernels::lean_stage_keys(d), lean_stage_words(d));
        let sub = self.plan.tile_k / sk;
        let per_stage = (sk / pg.page_size).max(1);
        let mut words = vec![0u32; g * LEAN_FIRST_UNITS * nw];
        for c in 0..g {
            let (cs, ce) = (t.cta_bounds[c] as usize, t.cta_bounds[c + 1] as usize);
            let mut tile = t.cta_tiles[2 * c] as usize;
            for s in 0..LEAN_FIRST_UNITS.min((ce - cs) * sub) {
                let it = cs + s / sub;
                // the producer's cursor: a CTA's range runs on into the next tiles
                while it >= space.tile_range(tile).1 as usize {
                    tile += 1;
                }
                let start = space.tile_range(tile).0 as usize;
                let b = space.tile_coords(tile).0;
                let key0 = (it - start) * self.plan.tile_k + (s % sub) * sk;
                for w in 0..per_stage {
                    let page = key0 / pg.page_size + w;
                    if page * pg.page_size < p.seqlens_k[b] {
                        words[(c * LEAN_FIRST_UNITS + s) * nw + w] =
                            pg.table[b * pg.max_pages + page] as u32;
                    }
                }
            }
        }
        words
    }

    /// Workspace bytes a step of this plan needs (allocate once, 256-byte aligned, for the
    /// largest step; a larger workspace serves a smaller step).
    pub fn workspace_bytes(&self) -> usize {
        self.layout.total
    }

    /// The workspace layout.
    pub fn layout(&self) -> &WorkspaceLayout {
        &self.layout
    }

    /// The problem (shapes and lengths) of this step.
    pub fn problem(&self) -> &AttentionProblem {
        &self.problem
    }

    /// The Lean schedule.
    pub fn lean_plan(&self) -> &LeanPlan {
        &self.plan
    }

    /// The kernel instance it launches.
    pub fn instance(&self) -> LeanInstance {
        self.instance
    }

    /// Where K and V live.
    pub fn kv(&self) -> &KvStorage {
        &self.kv
    }

    /// New tokens per sequence that [`LeanKernels::append`] writes.
    pub fn new_tokens(&self) -> usize {
        self.new_tokens
    }

    /// CTAs of the decode launch.
    pub fn num_ctas(&self) -> usize {
        self.tables.cta_bounds.len() - 1
    }

    fn params(&self, t: &LeanTensors, workspace: u64) -> LeanParams {
        let p = &self.problem;
        let l = &self.layout;
        let at = |off: usize| workspace + off as u64;
        let (page_table, max_pages, page_shift, cta_words) = match &self.kv {
            KvStorage::Contiguous => (0, 0, 0, 0),
            KvStorage::Paged(pg) => (
                at(l.page_table),
                pg.max_pages as i32,
                pg.page_size.trailing_zeros() as i32,
                if self.tile_per_cta() {
                    0
                } else {
                    at(l.cta_words)
                },
            ),
        };
        LeanParams {
            q: t.q,
            k: t.k,
            v: t.v,
            o: t.o,
            lse: t.lse,
            seqlens_q: at(l.seqlens_q),
            seqlens_k: at(l.seqlens_k),
            seq_start: at(l.seq_start),
            cta_bounds: at(l.cta_bounds),
            cta_info: at(l.cta_info),
            part_o: at(l.part_o),
            part_ml: at(l.part_ml),
            flags: at(l.flags),
            tile_per_cta: self.tile_per_cta() as u32,
            num_ctas: self.num_ctas() as i32,
            batch: p.batch as i32,
            max_sq: p.max_seqlen_q as i32,
            max_sk: p.max_seqlen_k as i32,
            heads_q: p.heads_q as i32,
            heads_kv: p.heads_kv as i32,
            group: p.group_size() as i32,
            tile_m: self.plan.tile_m as i32,
            query_groups: self.plan.query_groups as i32,
            tile_k: self.plan.tile_k as i32,
            causal: p.causal as i32,
            merge_in_kernel: self.plan.schedule.merges_in_kernel() as i32,
            scale_log2: p.softmax_scale * std::f32::consts::LOG2_E,
            page_table,
            max_pages,
            page_shift,
            cta_words,
        }
    }
}

/// Whether a paged decode runs the instance that reads the next unit's pool rows a stage ahead
/// (`lean_decode_paged_ahead_*`, `AHEAD` in `lean_decode.cu`) instead of the one that reads them
/// where the copies are issued. Measured on an H200 (2026-11-23,
/// `benches/lean_paged.rs`, both kernels in one run): ahead removes the page-table round trip that
/// each stage waited for where nothing else hides it, one CTA per SM (Llama B=1 ctx 8k at 128 CTAs:
/// 1.12-1.14x contiguous -> 1.02-1.03x with pages of 64, 1.13 -> 1.05-1.06x with pages of 16), and
/// is as fast or faster with pages of 64 everywhere; with pages of 16 and two CTAs per SM it was
/// 5-9% slower (Llama B=64 ctx 8k 1.05-1.08x -> 1.12x, Lean-paper B=4 ctx 16k 1.06 -> 1.13-1.15x).
fn paged_rows_ahead(page_size: usize, num_ctas: usize, sms: usize) -> bool {
    page_size >= 64 || num_ctas <= sms
}

/// Whether the default paged decode takes the instance with the page words in registers
/// ([`PagedRead::Regs`]) for a grid whose CTAs hold `stage_units` K/V stages between them.
/// Measured on an H200 (2026-11-26, `benches/lean_paged.rs`, main's kernels interleaved in the
/// same calls, docs/DEVICE_PATH.md "Lean paged, fourteenth session"): with 8 or more stages per
/// CTA it was as fast or faster on every row of the list (Lean-paper B=1 ctx 64k, 256 per CTA:
/// 1.03-1.08x contiguous -> 0.99-1.03x), with one stage per CTA (Llama B=1 ctx 1k) 0.3-0.4 us
/// slower (1.01x -> 1.04-1.06x), so such grids keep the earlier rule. 2 to 7 stages per CTA were
/// not measured; the line is set at 4 (one turn of the three-stage ring past the prologue).
/// With the first stages' words copied from the CTA's record (fifteenth session, same method)
/// REGS at Llama B=1 ctx 1k took 1.024-1.037x against the earlier rule's 1.010-1.016x: still behind.
fn paged_regs(stage_units: u64, num_ctas: usize) -> bool {
    stage_units >= 4 * num_ctas as u64
}

/// Whether a grid of `num_ctas` CTAs that takes the REGS instance ([`paged_regs`]) runs its
/// four-stage twin ([`PagedRead::Deep`]): at head dim 64, where the grid is one CTA per SM of
/// `sms`, so that the SM's shared memory the second CTA would have used holds a fourth stage (a
/// third 32 KB K/V stage in flight). Measured on an H200 (2026-11-26, `benches/lean_paged.rs`, main's
/// binary interleaved, docs/DEVICE_PATH.md "Lean paged, sixteenth session"): Lean-paper B=1 ctx
/// 64k (d64, one row, 112 CTAs) with shuffled pages of 16 1.029-1.035x contiguous ->
/// 0.993-0.996x over two calls; Llama's d128 rows at 128 CTAs lost 1-2 points in most layouts
/// (B=1 ctx 8k 1.023-1.051x -> 1.041-1.068x), so they keep three stages. On an H100 SXM (25 GB/s
/// of DRAM bandwidth per SM; same bench, main's binary interleaved, 2026-11-27,
/// `docs/results/lean-paged16-h200-2026-11-26/lead-calls3-4/call7-*`) the same row lost 6-10
/// points with it in every layout (shuffled pages of 16 1.022-1.025x -> 1.086-1.091x, in order
/// 1.001-1.003x -> 1.081-1.087x), so the four-stage ring runs only where the chip's DRAM bandwidth
/// per SM exceeds [`PAGED_DEEP_MIN_DRAM_PER_UNIT`] (the H200's 36 GB/s), and never where it is
/// unknown.
fn paged_deep(num_ctas: usize, sms: usize, head_dim: usize, dram_per_unit: Option<u64>) -> bool {
    num_ctas <= sms
        && head_dim <= kernels::LEAN_DEEP_MAX_HEAD_DIM
        && dram_per_unit.is_some_and(|b| b > PAGED_DEEP_MIN_DRAM_PER_UNIT)
}

/// DRAM bandwidth per SM (bytes per second) above which [`paged_deep`] takes the four-stage ring:
/// between the H100 SXM's 25 GB/s (where it lost) and the H200's 36 GB/s (where it won).
const PAGED_DEEP_MIN_DRAM_PER_UNIT: u64 = 30_000_000_000;

/// Which paged decode instance [`LeanKernels::run`] launches. Every one gives the same bits (the
/// same arithmetic in the same order; they differ only in how the copies find their pool rows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PagedRead {
    /// [`PagedRead::Regs`] where the grid gives each CTA several stages ([`paged_regs`]),
    /// [`PagedRead::Grid`] otherwise.
    #[default]
    Auto,
    /// The page words in registers, loaded a stage before the copies that use them
    /// (`lean_decode_paged_regs_*`, `REGS` in `lean_decode.cu`): after each stage's barrier the
    /// copies start from registers, as the contiguous kernel's do.
    Regs,
    /// [`PagedRead::Regs`] with a four-stage ring (`lean_decode_paged_deep_*`, one CTA per SM)
    /// where the grid's CTAs are all co-resident with it and the head dim has one (64:
    /// [`kernels::LEAN_DEEP_MAX_HEAD_DIM`]), [`PagedRead::Regs`] otherwise (the same bits).
    Deep,
    /// The earlier rule: the page table read a stage ahead or in place as the grid decides
    /// ([`paged_rows_ahead`]).
    Grid,
    /// The page table read where the copies are issued (`lean_decode_paged_*`).
    InPlace,
    /// The pool rows read a stage ahead through shared memory (`lean_decode_paged_ahead_*`).
    Ahead,
}

/// Device addresses of one layer's tensors, all contiguous: Q and O `[batch, max_seqlen_q,
/// heads_q, head_dim]`, K and V as [`KvStorage`] says, LSE `f32 [batch, heads_q, max_seqlen_q]`
/// (natural log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeanTensors {
    /// Q.
    pub q: u64,
    /// K (or its page pool).
    pub k: u64,
    /// V (or its page pool).
    pub v: u64,
    /// O.
    pub o: u64,
    /// LSE.
    pub lse: u64,
}

/// Parameters of `lean_append` (mirrors `struct AppendParams` in `lean_decode.cu`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AppendParams {
    k_new: u64,
    v_new: u64,
    k: u64,
    v: u64,
    seqlens_k: u64,
    append_start: u64,
    page_table: u64,
    batch: i32,
    n_new: i32,
    heads_kv: i32,
    head_dim: i32,
    max_sk: i32,
    max_pages: i32,
    page_shift: i32,
    reserved: i32,
}

/// The kernels of one [`LeanInstance`] on one GPU, resolved once (no name lookup per step), with
/// their shared-memory size and occupancy.
#[derive(Debug)]
pub struct LeanKernels {
    gpu: Arc<Gpu>,
    instance: LeanInstance,
    decode: Function,
    decode_paged: Function,
    /// The paged decode that reads the page table a stage ahead (`paged_rows_ahead`).
    decode_paged_ahead: Function,
    /// The paged decode with the page words in registers ([`PagedRead::Regs`]).
    decode_paged_regs: Function,
    /// Its four-stage twin ([`PagedRead::Deep`]); `None` above head dim 64, where none is built
    /// ([`kernels::LEAN_DEEP_MAX_HEAD_DIM`]).
    decode_paged_deep: Option<Function>,
    combine: Function,
    append: Function,
    append_paged: Function,
    smem_bytes: u32,
    /// Dynamic shared memory of `decode_paged_ahead` (its next-unit rows on top).
    smem_bytes_ahead: u32,
    /// Dynamic shared memory of `decode_paged_regs` (its ring of page words on top).
    smem_bytes_regs: u32,
    /// Dynamic shared memory of `decode_paged_deep`.
    smem_bytes_deep: u32,
    /// Co-resident CTAs per SM of `decode_paged_deep` (1; unused where none is built; not part
    /// of `ctas_per_sm`, which bounds the grids the planners make: the deep instance runs only on
    /// grids it fits).
    ctas_per_sm_deep: u32,
    stages: u32,
    ctas_per_sm: [u32; 2],
    cooperative: std::sync::atomic::AtomicBool,
    /// The [`PagedRead`] in force, as its index in [`PagedRead::ALL`].
    paged_read: std::sync::atomic::AtomicU8,
}

impl PagedRead {
    /// Every way, in the order of the index [`LeanKernels`] stores.
    pub const ALL: [PagedRead; 6] = [
        PagedRead::Auto,
        PagedRead::Regs,
        PagedRead::Deep,
        PagedRead::Grid,
        PagedRead::InPlace,
        PagedRead::Ahead,
    ];
}

impl LeanKernels {
    /// Resolves the entry points of `instance` in `module` and configures their shared memory.
    pub fn new(
        gpu: &Arc<Gpu>,
        module: &Arc<kernels::Module>,
        instance: LeanInstance,
    ) -> Result<LeanKernels> {
        let f = |e: LeanEntry| module.function(&instance.name(e));
        let decode = f(LeanEntry::Decode)?;
        let decode_paged = f(LeanEntry::DecodePaged)?;
        let decode_paged_ahead = f(LeanEntry::DecodePagedAhead)?;
        let decode_paged_regs = f(LeanEntry::DecodePagedRegs)?;
        let decode_paged_deep = if instance.has(LeanEntry::DecodePagedDeep) {
            Some(f(LeanEntry::DecodePagedDeep)?)
        } else {
            None
        };
        // the kernel reports its own shared-memory sizes (in place, ahead, regs, deep) and stage
        // count
        let smem_q = f(LeanEntry::SmemQuery)?;
        let out = DeviceBuffer::alloc(gpu, 20)?;
        let mut ptr = out.ptr();
        launch_raw(
            gpu,
            &smem_q,
            (1, 1),
            0,
            &mut [&mut ptr as *mut u64 as *mut std::ffi::c_void],
        )?;
        let info: Vec<i32> = out.to_vec()?;
        let (smem_bytes, stages, smem_bytes_ahead, smem_bytes_regs, smem_bytes_deep) = (
            info[0] as u32,
            info[1] as u32,
            info[2] as u32,
            info[3] as u32,
            info[4] as u32,
        );
        let _bound = gpu.bind()?;
        // [contiguous, paged, deep]
        let mut ctas_per_sm = [u32::MAX; 3];
        for (i, k, smem_bytes) in [
            (0, Some(&decode), smem_bytes),
            (1, Some(&decode_paged), smem_bytes),
            (1, Some(&decode_paged_ahead), smem_bytes_ahead),
            (1, Some(&decode_paged_regs), smem_bytes_regs),
            (2, decode_paged_deep.as_ref(), smem_bytes_deep),
        ] {
            let Some(k) = k else { continue };
            // SAFETY: valid function handle; attribute value in range.
            check("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(
                    k.f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem_bytes as i32,
                )
            })?;
            let mut occ = 0i32;
            // SAFETY: out-parameter query.
            check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut occ,
                    k.f,
                    LEAN_THREADS as i32,
                    smem_bytes as usize,
                )
            })?;
            ctas_per_sm[i] = ctas_per_sm[i].min(occ as u32);
        }
        Ok(LeanKernels {
            gpu: gpu.clone(),
            instance,
            decode,
            decode_paged,
            decode_paged_ahead,
            decode_paged_regs,
            decode_paged_deep,
            combine: f(LeanEntry::Combine)?,
            append: f(LeanEntry::Append)?,
            append_paged: f(LeanEntry::AppendPaged)?,
            smem_bytes,
            smem_bytes_ahead,
            smem_bytes_regs,
            smem_bytes_deep,
            ctas_per_sm_deep: ctas_per_sm[2],
            stages,
            ctas_per_sm: [ctas_per_sm[0], ctas_per_sm[1]],
            cooperative: std::sync::atomic::AtomicBool::new(true),
            paged_read: std::sync::atomic::AtomicU8::new(0),
        })
    }

    /// Launches stream-K cooperatively (the default) or, when `on` is false, plainly, guarded
    /// only by the occupancy check of [`LeanKernels::check`] against an idle GPU. For measuring
    /// what the cooperative launch costs (`benches/lean_paged.rs`); serving keeps the default.
    pub fn set_cooperative(&self, on: bool) {
        self.cooperative
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Which paged decode instance runs ([`PagedRead`]; every one gives the same bits). For tests
    /// and `benches/lean_paged.rs`; serving keeps the default.
    pub fn set_paged_read(&self, mode: PagedRead) {
        let m = PagedRead::ALL.iter().position(|&x| x == mode).unwrap_or(0) as u8;
        self.paged_read
            .store(m, std::sync::atomic::Ordering::Relaxed);
    }

    /// The [`PagedRead`] in force.
    pub fn paged_read(&self) -> PagedRead {
        PagedRead::ALL[self.paged_read.load(std::sync::atomic::Ordering::Relaxed) as usize]
    }

    /// The per-CTA stamps of the last decode launch, 16 words a CTA for CTAs 0..1023
    /// (`ferrattn::StampSlot` in `cuda-kernels/lean_decode.cu`), or `None` for kernels built
    /// without `FERRATTN_LEAN_STAMPS` (every shipped build). A diagnostic for
    /// `benches/lean_paged.rs --stamps`; synchronises the context.
    pub fn read_stamps(&self) -> Result<Option<Vec<u64>>> {
        let Some((ptr, bytes)) = self.decode.module().global("ferrattn_lean_stamps")? else {
            return Ok(None);
        };
        let _bound = self.gpu.bind()?;
        self.gpu.synchronize()?;
        let mut words = vec![0u64; bytes / 8];
        // SAFETY: the global holds `bytes` bytes; the host buffer as many.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(words.as_mut_ptr() as *mut std::ffi::c_void, ptr, bytes)
        })?;
        Ok(Some(words))
    }

    /// The instance these kernels serve.
    pub fn instance(&self) -> LeanInstance {
        self.instance
    }

    /// Dynamic shared memory of the decode kernel, bytes.
    pub fn smem_bytes(&self) -> u32 {
        self.smem_bytes
    }

    /// K/V pipeline stages of the decode kernel.
    pub fn stages(&self) -> u32 {
        self.stages
    }

    /// Co-resident CTAs per SM the driver reports for the decode kernel (contiguous, paged).
    pub fn ctas_per_sm(&self, paged: bool) -> u32 {
        self.ctas_per_sm[paged as usize]
    }

    /// Checks that `step` was planned for these kernels and, for stream-K, that its grid can be
    /// co-resident (the cooperative launch would refuse it; this says why, in numbers).
    pub fn check(&self, step: &LeanStepPlan) -> Result<()> {
        if step.instance != self.instance {
            return Err(CudaError::Plan(format!(
                "a step planned for {:?} was given the kernels of {:?}",
                step.instance, self.instance
            )));
        }
        let paged = matches!(step.kv, KvStorage::Paged(_));
        let occ = self.ctas_per_sm(paged) as usize;
        let resident = occ * self.gpu.caps.compute_units;
        if step.plan.schedule.merges_in_kernel() && step.num_ctas() > resident {
            return Err(CudaError::Plan(format!(
                "stream-K grid of {} CTAs exceeds the {resident} that can be co-resident ({occ} per SM x {} SMs for {} with {} bytes of shared memory)",
                step.num_ctas(),
                self.gpu.caps.compute_units,
                self.instance.name(if paged { LeanEntry::DecodePaged } else { LeanEntry::Decode }),
                self.smem_bytes
            )));
        }
        Ok(())
    }

    /// Copies `step`'s tables into the workspace on `stream` (once per step, before the layers'
    /// [`LeanKernels::run`]; FlashInfer's `plan` does the same). The copy is from pageable host
    /// memory: the driver stages it before returning, so `step` may be dropped at once.
    ///
    /// # Safety
    /// `workspace` is device memory of this GPU holding at least `step.workspace_bytes()` bytes,
    /// 256-byte aligned, not in use by a launch still running; `stream` belongs to this GPU's
    /// context (null: the legacy default stream).
    pub unsafe fn upload(
        &self,
        step: &LeanStepPlan,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check(step)?;
        let _bound = self.gpu.bind()?;
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                workspace,
                step.header.as_ptr() as *const std::ffi::c_void,
                step.header.len(),
                stream,
            )
        })
    }

    /// Enqueues one layer's decode on `stream`: the stream-K kernel as a cooperative launch, or
    /// the fixed split's two passes. No allocation, synchronisation or copy: capturable.
    ///
    /// # Safety
    /// [`LeanKernels::upload`] of this `step` into `workspace` was enqueued before on `stream`
    /// (or an ordered stream); `t` holds device addresses of this GPU, 16-byte aligned, of
    /// contiguous tensors of the shapes [`LeanTensors`] names for `step.problem()` (K/V as
    /// `step.kv()` says, the pool holding `num_pages` pages); `stream` as for `upload`.
    pub unsafe fn run(
        &self,
        step: &LeanStepPlan,
        t: &LeanTensors,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let mut prm = step.params(t, workspace);
        let mut args = [&mut prm as *mut LeanParams as *mut std::ffi::c_void];
        let (decode, smem) = match &step.kv {
            KvStorage::Contiguous => (&self.decode, self.smem_bytes),
            KvStorage::Paged(pg) => {
                let grid =
                    || paged_rows_ahead(pg.page_size, step.num_ctas(), self.gpu.caps.compute_units);
                // (ahead, regs, deep) -> the instance; deep only where every CTA of the grid is
                // co-resident with it
                let sms = self.gpu.caps.compute_units;
                let fits_deep = step.num_ctas() <= self.ctas_per_sm_deep as usize * sms;
                let regs = paged_regs(step.stage_units, step.num_ctas());
                let (ahead, regs, deep) = match self.paged_read() {
                    PagedRead::Auto if regs => (
                        false,
                        true,
                        paged_deep(
                            step.num_ctas(),
                            sms,
                            self.instance.head_dim(),
                            self.gpu.caps.dram_bytes_per_unit(),
                        ),
                    ),
                    PagedRead::Auto | PagedRead::Grid => (grid(), false, false),
                    PagedRead::Regs => (false, true, false),
                    PagedRead::Deep => (false, true, true),
                    PagedRead::InPlace => (false, false, false),
                    PagedRead::Ahead => (true, false, false),
                };
                let deep = self
                    .decode_paged_deep
                    .as_ref()
                    .filter(|_| deep && fits_deep);
                match (ahead, regs, deep) {
                    (_, true, Some(k)) => (k, self.smem_bytes_deep),
                    (_, true, None) => (&self.decode_paged_regs, self.smem_bytes_regs),
                    (true, false, _) => (&self.decode_paged_ahead, self.smem_bytes_ahead),
                    (false, false, _) => (&self.decode_paged, self.smem_bytes),
                }
            }
        };
        let stream_k = step.plan.schedule.merges_in_kernel();
        let cooperative = stream_k && self.cooperative.load(std::sync::atomic::Ordering::Relaxed);
        // stream-K host CTAs wait for the CTAs after them: only a cooperative launch guarantees
        // they are all resident (Lean appendix E assumes a persistent grid)
        unsafe {
            launch_on(
                &self.gpu,
                decode,
                (step.num_ctas() as u32, LEAN_THREADS),
                smem,
                stream,
                cooperative,
                &mut args,
            )?;
        }
        // a fixed split whose every chunk is a whole tile left nothing to merge; whole tiles never do
        let combine = matches!(step.plan.schedule, Schedule::FixedSplit { .. })
            && step.num_ctas() != step.num_tiles;
        if combine {
            let smem = (self.instance.rows() * (step.problem.head_dim_v + 2) * 4) as u32;
            unsafe {
                launch_on(
                    &self.gpu,
                    &self.combine,
                    (step.num_tiles as u32, LEAN_THREADS),
                    smem,
                    stream,
                    false,
                    &mut args,
                )?;
            }
        }
        Ok(())
    }

    /// Enqueues the copy of one layer's new tokens into its K/V cache on `stream`: token `i` of
    /// sequence `b` in `k_new`/`v_new` (`[batch, new_tokens, heads_kv, head_dim]`, contiguous)
    /// goes to position `seqlens_k[b] - new_tokens + i` (through the page table when paged).
    ///
    /// # Safety
    /// As for [`LeanKernels::run`]; `k_new` and `v_new` hold `batch * new_tokens * heads_kv *
    /// head_dim` elements, 16-byte aligned.
    pub unsafe fn append(
        &self,
        step: &LeanStepPlan,
        (k_new, v_new): (u64, u64),
        (k, v): (u64, u64),
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let p = &step.problem;
        let l = &step.layout;
        let (f, page_table, max_pages, page_shift) = match &step.kv {
            KvStorage::Contiguous => (&self.append, 0, 0, 0),
            KvStorage::Paged(pg) => (
                &self.append_paged,
                workspace + l.page_table as u64,
                pg.max_pages as i32,
                pg.page_size.trailing_zeros() as i32,
            ),
        };
        let mut prm = AppendParams {
            k_new,
            v_new,
            k,
            v,
            seqlens_k: workspace + l.seqlens_k as u64,
            append_start: workspace + l.append_start as u64,
            page_table,
            batch: p.batch as i32,
            n_new: step.new_tokens as i32,
            heads_kv: p.heads_kv as i32,
            head_dim: p.head_dim_qk as i32,
            max_sk: p.max_seqlen_k as i32,
            max_pages,
            page_shift,
            reserved: 0,
        };
        let vecs = p.batch * step.new_tokens * p.heads_kv * p.head_dim_qk / 8;
        if vecs == 0 {
            return Ok(());
        }
        let grid = vecs.div_ceil(LEAN_THREADS as usize).min(4096) as u32;
        let mut args = [&mut prm as *mut AppendParams as *mut std::ffi::c_void];
        unsafe {
            launch_on(
                &self.gpu,
                f,
                (grid, LEAN_THREADS),
                0,
                stream,
                false,
                &mut args,
            )
        }
    }
}

impl PreparedLean {
    /// Plans the step of `plan` over contiguous K/V, resolves its kernels and uploads its tables
    /// into an owned workspace.
    pub fn new(kernels: Arc<LeanKernels>, plan: &AttentionPlan) -> Result<PreparedLean> {
        let PlanDetail::Lean(lp) = &plan.detail else {
            return Err(CudaError::Plan(format!(
                "a {} plan was given to the lean kernel",
                plan.algorithm
            )));
        };
        let step = LeanStepPlan::new(&plan.problem, lp, KvStorage::Contiguous, 0)?;
        kernels.check(&step)?;
        let workspace = DeviceBuffer::alloc(&kernels.gpu, step.workspace_bytes())?;
        // SAFETY: the workspace was just allocated with the bytes the step needs, on our stream.
        unsafe { kernels.upload(&step, workspace.ptr(), kernels.gpu.stream)? };
        Ok(PreparedLean {
            step,
            kernels,
            workspace,
        })
    }

    /// The Lean plan.
    pub fn plan(&self) -> &LeanPlan {
        &self.step.plan
    }

    /// The problem it was made for.
    pub fn problem(&self) -> &AttentionProblem {
        &self.step.problem
    }

    /// The step plan (tables, workspace layout).
    pub fn step(&self) -> &LeanStepPlan {
        &self.step
    }

    /// The kernels it launches.
    pub fn kernels(&self) -> &Arc<LeanKernels> {
        &self.kernels
    }

    /// Dynamic shared memory of the decode kernel, bytes.
    pub fn smem_bytes(&self) -> u32 {
        self.kernels.smem_bytes
    }

    /// K/V pipeline stages the kernel instance uses.
    pub fn stages(&self) -> u32 {
        self.kernels.stages
    }

    /// Co-resident CTAs per SM the driver reports for the decode kernel.
    pub fn ctas_per_sm(&self) -> u32 {
        self.kernels.ctas_per_sm(false)
    }

    /// Whether this is the stream-K schedule (else fixed split).
    pub fn is_stream_k(&self) -> bool {
        matches!(self.step.plan.schedule, Schedule::StreamK { .. })
    }

    /// Enqueues the decode (and, for fixed split, the combine pass) on the backend's stream.
    pub fn launch(&self, gpu: &Arc<Gpu>, x: &DeviceInputs, out: &mut DeviceOutputs) -> Result<()> {
        if x.problem != self.step.problem {
            return Err(CudaError::Plan(
                "inputs describe another problem than the plan".into(),
            ));
        }
        if !Arc::ptr_eq(gpu, &self.kernels.gpu) {
            return Err(CudaError::Plan(format!(
                "a plan prepared on GPU {} was launched on GPU {}",
                self.kernels.gpu.ordinal, gpu.ordinal
            )));
        }
        let t = LeanTensors {
            q: x.q.ptr(),
            k: x.k.ptr(),
            v: x.v.ptr(),
            o: out.o.ptr(),
            lse: out.lse.ptr(),
        };
        // SAFETY: the tensors were allocated for this problem by DeviceInputs / DeviceOutputs,
        // the workspace by new() with the step's tables uploaded on the same stream.
        unsafe {
            self.kernels
                .run(&self.step, &t, self.workspace.ptr(), gpu.stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrattn_core::{lean, DeviceCaps};

    fn step() -> LeanStepPlan {
        let mut p = AttentionProblem::uniform(2, 1, 100, 8, 2, 128, 128, DType::F16);
        p.seqlens_k = vec![100, 37];
        let lp = lean::plan(&p, &DeviceCaps::hopper_reference()).unwrap();
        let paging = Paging::new(16, 20, 7, (0..14).collect(), &p.seqlens_k).unwrap();
        LeanStepPlan::new(&p, &lp, KvStorage::Paged(paging), 1).unwrap()
    }

    #[test]
    fn stage_units_count_every_tile_and_pick_the_paged_instance() {
        let s = step();
        let sub = (s.plan.tile_k / kernels::lean_stage_keys(128)) as u64;
        // two KV heads per sequence, each tile ceil(len / tile_k) iterations (at least one)
        let iters: u64 = [100u64, 37]
            .iter()
            .map(|&l| 2 * l.div_ceil(s.plan.tile_k as u64).max(1))
            .sum();
        assert_eq!(s.stage_units, iters * sub);
        // the rows measured on the H200: one stage per CTA keeps the earlier rule, eight take REGS
        assert!(!paged_regs(128, 128)); // Llama-3-8B B=1 ctx 1k
        assert!(paged_regs(1024, 128)); // Llama-3-8B B=1 ctx 8k
        assert!(paged_regs(4 * 112, 112) && !paged_regs(4 * 112 - 1, 112));
        // the deep instance: one CTA per SM at head dim 64 (Lean-paper B=1 ctx 64k on 112 of an
        // H200's 132), not the slot-filling grids of two (264) nor Llama's d128 rows (128 CTAs)
        let h200 = Some(4_800_000_000_000 / 132);
        let h100 = Some(3_350_000_000_000 / 132);
        assert!(paged_deep(112, 132, 64, h200) && paged_deep(132, 132, 64, h200));
        assert!(!paged_deep(264, 132, 64, h200) && !paged_deep(128, 132, 128, h200));
        assert!(!paged_deep(112, 132, 64, h100) && !paged_deep(112, 132, 64, None));
    }

    #[test]
    fn a_step_plan_reads_back_from_json_and_is_checked_again() {
        let s = step();
        let json = serde_json::to_string(&s).unwrap();
        let back: LeanStepPlan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.header, s.header);
        // a page outside the pool
        let bad = json.replacen("\"table\":[0,", "\"table\":[20,", 1);
        assert_ne!(bad, json);
        let e = serde_json::from_str::<LeanStepPlan>(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the pool of 20 pages"), "{e}");
        // a schedule that is not the one for this problem
        let Schedule::StreamK { cta_bounds, .. } = &s.plan.schedule else {
            panic!("stream-K expected")
        };
        let mut lp = s.plan.clone();
        let mut b = cta_bounds.clone();
        b[1] += 1;
        lp.schedule = Schedule::StreamK {
            total_iters: *b.last().unwrap(),
            cta_bounds: b,
        };
        let e = LeanStepPlan::new(&s.problem, &lp, s.kv.clone(), 1).unwrap_err();
        assert!(
            e.to_string().contains("not the one its parameters give"),
            "{e}"
        );
    }

    #[test]
    fn every_planner_output_passes_the_schedule_check() {
        let caps = DeviceCaps::hopper_reference();
        for (lens, sq, hq, hk, d) in [
            (vec![1, 37, 63, 65], 1, 8, 2, 128),
            (vec![577, 4097, 0, 130], 1, 32, 8, 128),
            (vec![300, 31], 2, 4, 4, 64),
            (vec![4097, 1000, 17], 1, 16, 1, 256),
            (vec![32767], 1, 32, 8, 128),
            (vec![2000; 16], 4, 8, 2, 128),
            (vec![1024; 64], 1, 32, 8, 128),
        ] {
            let mut p = AttentionProblem::uniform(lens.len(), sq, 32767, hq, hk, d, d, DType::BF16);
            p.seqlens_k = lens;
            let plans = [
                lean::plan(&p, &caps).unwrap(),
                lean::plan_with_ctas(&p, &caps, 1000).unwrap(),
                lean::plan_fixed_split(&p, &caps, None).unwrap(),
                lean::plan_fixed_split(&p, &caps, Some(1)).unwrap(),
                lean::plan_fixed_split(&p, &caps, Some(7)).unwrap(),
            ];
            for lp in plans {
                LeanStepPlan::new(&p, &lp, KvStorage::Contiguous, 0)
                    .unwrap_or_else(|e| panic!("{e} for {lp:?}"));
            }
        }
    }

    #[test]
    fn workspace_regions_are_aligned_and_the_bound_covers_the_step() {
        let s = step();
        let l = s.layout();
        for off in [
            l.seqlens_k,
            l.seq_start,
            l.cta_info,
            l.page_table,
            l.cta_words,
            l.flags,
            l.part_o,
            l.part_ml,
        ] {
            assert!(off.is_multiple_of(WORKSPACE_ALIGN), "{off}");
        }
        assert_eq!(l.header_bytes, s.header.len());
        assert!(WorkspaceLayout::bound(2, 264, 4, 128, 14) >= s.workspace_bytes());
    }

    /// The words of a CTA's first stages, found another way: the CTA's flat iterations mapped to
    /// (tile, key) by a scan of every tile's range, each key's page looked up one key at a time.
    #[test]
    fn cta_words_hold_the_pages_of_each_ctas_first_stages() {
        let caps = DeviceCaps::hopper_reference();
        let mut rng = 7u64;
        for (lens, hq, hk, d, ps, ctas) in [
            (vec![100, 37, 0, 300], 8, 2, 128, 16, 264),
            (vec![100, 37, 0, 300], 8, 2, 128, 64, 5),
            (vec![1000, 65, 129], 4, 4, 64, 16, 40),
            (vec![1000, 65, 129], 4, 4, 64, 64, 3),
            (vec![77, 512], 16, 1, 256, 16, 9),
            (vec![77, 512], 16, 1, 256, 64, 64),
        ] {
            let mut p = AttentionProblem::uniform(lens.len(), 1, 1000, hq, hk, d, d, DType::F16);
            p.seqlens_k = lens.clone();
            let max_pages = 1000usize.div_ceil(ps);
            let num_pages = lens.len() * max_pages + 3;
            // a shuffled table (pages of every sequence distinct; entries past a sequence too)
            let mut table: Vec<i32> = (0..(lens.len() * max_pages) as i32).collect();
            for i in (1..table.len()).rev() {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                table.swap(i, (rng >> 33) as usize % (i + 1));
            }
            let paging =
                Paging::new(ps, num_pages, max_pages, table.clone(), &p.seqlens_k).unwrap();
            let lp = lean::plan_with_ctas(&p, &caps, ctas).unwrap();
            let s = LeanStepPlan::new(&p, &lp, KvStorage::Paged(paging.clone()), 1).unwrap();
            assert!(!s.tile_per_cta());
            let words = s.cta_words(&paging);
            let (sk, nw) = (kernels::lean_stage_keys(d), lean_stage_words(d));
            let sub = lp.tile_k / sk;
            let space = lp.tile_space(&p);
            let g = s.num_ctas();
            assert_eq!(words.len(), g * LEAN_FIRST_UNITS * nw);
            let mut checked = 0;
            for c in 0..g {
                let (cs, ce) = (
                    s.tables.cta_bounds[c] as u64,
                    s.tables.cta_bounds[c + 1] as u64,
                );
                for u in 0..LEAN_FIRST_UNITS {
                    let rec = &words[(c * LEAN_FIRST_UNITS + u) * nw..][..nw];
                    let it = cs + (u / sub) as u64;
                    if it >= ce {
                        assert!(rec.iter().all(|&w| w == 0), "CTA {c} unit {u}: {rec:?}");
                        continue;
                    }
                    let tile = (0..space.num_tiles())
                        .find(|&t| space.tile_range(t).0 <= it && it < space.tile_range(t).1)
                        .unwrap();
                    let b = space.tile_coords(tile).0;
                    let key0 =
                        (it - space.tile_range(tile).0) as usize * lp.tile_k + (u % sub) * sk;
                    let mut want = vec![0u32; nw];
                    for j in key0..(key0 + sk).min(p.seqlens_k[b]) {
                        want[j / ps - key0 / ps] = table[b * max_pages + j / ps] as u32;
                        checked += 1;
                    }
                    assert_eq!(rec, &want[..], "CTA {c} unit {u} (tile {tile}, key {key0})");
                }
            }
            assert!(checked > 0);
        }
    }
}
