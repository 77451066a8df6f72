//! [`TurboQuantCuda`]: the kernels of one layer configuration and their launches.

use super::cache::DeviceTurboQuantCache;
use super::contract::{CodeLut, CompressPath, FastDiv};
use super::layout;
use super::params::{
    centroid_tables, codebook_arrays, f16_friendly_scale, CombineParams, CompressParams,
    DecodeParams, FastCompressParams, PrepareParams,
};
use super::step::{
    PreparedTurboQuantAppend, PreparedTurboQuantDecode, PreparedTurboQuantStep,
    TurboQuantAppendTables, TurboQuantDecodeTables, TurboQuantStepPlan, TURBOQUANT_WORKSPACE_ALIGN,
};
use super::support::{check_supported, code_crumbs, kernel_names, KernelNames};
use super::{
    cache_capacity, compress_smem_bytes, decode_smem_bytes, default_units,
    fast_compress_smem_bytes, fast_matrices, merge_warps, seven_warp_smem_bytes, small_decode,
    small_work_smem_bytes, FAST_ROWS, FAST_THREADS, FAST_TILE, MAX_UNIT_WARPS_R8, UNIT_WARPS,
};
use crate::device::{DeviceBuffer, Gpu};
use crate::error::{check, CudaError, Result};
use crate::kernels::{self, Function};
use crate::launch::{launch_on, launch_programmatic, DeviceOutputs};
use crate::CudaBackend;
use cudarc::driver::sys;
use ferrattn_core::turboquant::{TurboQuantCodec, TurboQuantConfig};
use ferrattn_core::{AttentionInputs, AttentionOutput, AttentionProblem, Provenance};
use half::f16;
use std::sync::Arc;

/// The prepare kernel of a step (`Π q` and `S q` into the decode's A fragments): both compute
/// every output element with the same FMAs in the same order, so their outputs are
/// bit-identical; they differ in how the work is spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepareKernel {
    /// `Spread` up to [`PREPARE_SPREAD_MAX_TILES`] output tiles, `V1` above.
    Auto,
    /// `turboquant_prepare_q_v1_d*`: one CTA per (tile, 32 output columns), each thread both
    /// matrices and up to 16 rows (D / 32 CTAs per tile).
    V1,
    /// `turboquant_prepare_q_d*` (issue 10's prepare pass): one CTA per (tile, 8 output
    /// columns), each thread one matrix and up to 8 rows (D / 8 CTAs per tile).
    Spread,
}

/// [`PrepareKernel::Auto`] launches the spread prepare up to this many output tiles (128 CTAs at
/// D = 128, one per SM on an H100 / H200), v1 above. Measured on an H200 (2026-11-26,
/// docs/TURBOQUANT_CUDA.md "the prepare kernel"): spread 2.1 µs a step faster at 8 tiles (batch
/// 1, 8 KV heads), 7% and 25% a step slower at 128 and 512 tiles (16 x 16k, 64 x 4k). Nothing
/// between 8 and 128 tiles was measured, so the bound is the measured win's.
pub const PREPARE_SPREAD_MAX_TILES: usize = 8;

fn arg<T>(x: &mut T) -> *mut std::ffi::c_void {
    x as *mut T as *mut std::ffi::c_void
}

/// [`launch_on`] (plain, not cooperative) or, with `programmatic`, [`launch_programmatic`] (the
/// decode and the merge signal `griddepcontrol.launch_dependents` first thing, the query
/// preparation right after its own wait, the fast compression kernels after their prologue).
///
/// # Safety
/// As [`launch_on`]; `f` calls `griddepcontrol.wait` before its first read of anything the
/// kernel before it on `stream` writes, and writes nothing that kernel reads.
unsafe fn launch_step_kernel(
    gpu: &Arc<Gpu>,
    f: &Function,
    (grid, block): (u32, u32),
    smem: u32,
    stream: sys::CUstream,
    programmatic: bool,
    args: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        if programmatic {
            launch_programmatic(gpu, f, [grid, 1, 1], block, smem, stream, args)
        } else {
            launch_on(gpu, f, (grid, block), smem, stream, false, args)
        }
    }
}

fn set_smem(f: &Function, bytes: usize) -> Result<()> {
    let _bound = f.bind()?;
    // SAFETY: valid function handle; the size is within the device's opt-in limit (checked by
    // the launch, which fails with a driver error otherwise).
    check("cuFuncSetAttribute", unsafe {
        sys::cuFuncSetAttribute(
            f.f,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    })
}

fn occupancy(f: &Function, threads: usize, smem: usize) -> Result<usize> {
    let _bound = f.bind()?;
    let mut occ = 0i32;
    // SAFETY: out-parameter query on a valid function.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut occ, f.f, threads as i32, smem)
    })?;
    Ok(occ.max(1) as usize)
}

/// The TurboQuant kernels of one layer configuration, with `Π`, `S` and the codebooks on the
/// device.
#[derive(Debug)]
pub struct TurboQuantCuda {
    gpu: Arc<Gpu>,
    /// The configuration.
    pub cfg: TurboQuantConfig,
    /// The CPU codec of the same configuration (the contract).
    pub codec: TurboQuantCodec,
    head_dim: usize,
    poison: bool,
    provenance: Provenance,
    names: KernelNames,
    compress_keys: Function,
    compress_values: Function,
    fast_keys: Function,
    fast_values: Function,
    split_keys: Function,
    split_values: Function,
    path: CompressPath,
    prepare_q: Function,
    /// The prepare kernel before issue 10's prepare pass (`turboquant_prepare_q_v1_d*`: D / 32
    /// CTAs per tile instead of D / 8, bit-identical outputs); see [`PrepareKernel`].
    prepare_q_v1: Function,
    /// Which of the two prepare kernels steps launch.
    prepare_kernel: PrepareKernel,
    decode_r8: Function,
    /// `decode_r8` with the merge fused in (opt-in, [`Self::fused_merge_for`]).
    decode_r8f: Function,
    decode_r16: Function,
    /// The merge kernels of 8 and 16 warps a CTA (see [`merge_warps`]).
    combine: Function,
    combine_w16: Function,
    /// `FERRATTN_TQ_MERGE_WARPS` (8 or 16): every step's merge with that many warps.
    merge_forced: Option<usize>,
    /// `FERRATTN_TQ_ROW_SPLIT` (1, 2, 4, 8 or 16): every step's merge with that many CTAs per
    /// output tile instead of the plan's [`super::row_split`] (diagnostic).
    row_split_forced: Option<usize>,
    pi: DeviceBuffer,
    pit: DeviceBuffer,
    s: DeviceBuffer,
    st: DeviceBuffer,
    /// f16 bits of `Π` (hi), `Π - hi` (lo) and `S Πᵀ`, row-major, for the fast kernels.
    pi_hi: DeviceBuffer,
    pi_lo: DeviceBuffer,
    m_hi: DeviceBuffer,
    /// Code lookups of the fast kernels (keys, values) and their device copies.
    key_lut: (CodeLut, DeviceBuffer),
    value_lut: (CodeLut, DeviceBuffer),
    key_cb: (i32, [f32; 15], [f32; 16]),
    value_cb: (i32, [f32; 15], [f32; 16]),
    ktab: [u32; 8],
    vtab: [u32; 8],
    /// Scale of the key table ([`f16_friendly_scale`]), divided out of the query scale.
    sigma_k: f32,
    /// Scale of the value table, divided out in the merge.
    sigma_v: f32,
    smem_keys: usize,
    smem_values: usize,
    /// Shared memory of the fast (`[0]`) and the split (`[1]`) key and value kernels.
    smem_fast_keys: [usize; 2],
    smem_fast_values: [usize; 2],
    /// Resident CTAs per SM of the fast and the split kernels (keys, values), queried at load.
    fast_per_sm: [[usize; 2]; 2],
    /// Warps of the decode kernels (`decode_r8`, `decode_r16`) resident on the whole GPU
    /// (queried once, at load: planning a step makes no driver call).
    resident: [usize; 2],
    /// Resident CTAs per SM of the key and the value compression kernels.
    compress_per_sm: [usize; 2],
    /// The decode, the merge and the fast / split compression kernels are launched with
    /// programmatic stream serialization ([`launch_programmatic`]; compute capability 9.0 or
    /// newer).
    programmatic: bool,
    /// The decode issues its first segment's ring after its wait on the prepare
    /// (`FERRATTN_TQ_EARLY=0`; by default before it, see turboquant_decode.cu).
    late_ring: bool,
    /// The <= 8-row decode loads the query fragments per warp and segment
    /// (`FERRATTN_TQ_SHARE_Q=0`; by default once per CTA and tile, see turboquant_decode.cu).
    private_q: bool,
    /// The <= 8-row decode writes its partials as scalar stores (`FERRATTN_TQ_RING_O=0`; by
    /// default as 16-byte rows through the warp's ring, see turboquant_decode.cu).
    scalar_o: bool,
    /// The prepare is launched with programmatic serialization too (with `programmatic`; after
    /// the kernel before it, whichever it is). `FERRATTN_TQ_PREPARE_PDL=0`: plain stream order.
    prepare_pdl: bool,
    /// `FERRATTN_TQ_UNIT_WARPS` (4 to [`MAX_UNIT_WARPS_R8`]): the CTA size of every 8-row
    /// decode, whatever its size (see [`Self::unit_warps_for`]).
    unit_warps_forced: Option<usize>,
    /// A 7-warp CTA's shared memory fits this device (opt-in maximum per block): the
    /// small-work schedule is available ([`small_decode`]; 111 KiB at d = 128, so not on GPUs
    /// with about 100 KiB).
    seven_fit: bool,
    /// The fused merge's CTA ([`small_work_smem_bytes`]) fits this device.
    fused_fit: bool,
    /// 7-warp 8-row launches run the merge inside the decode (`decode_r8f`): off by default
    /// (measured 2.5x slower at batch 1, see [`Self::fused_merge_for`]); `FERRATTN_TQ_FUSED=1`
    /// or [`Self::set_fused_merge`] turns it on.
    fused_on: bool,
    /// Two 7-warp CTAs of the 8-row kernel fit one SM by registers and threads (its
    /// occupancy at [`decode_smem_bytes`], queried at load: the kernels at <= 128 registers,
    /// 4 warps per SM sub-partition), so its 7-warp launches take [`small_work_smem_bytes`],
    /// which holds them to one CTA per SM as the small-work schedule assumes (see
    /// [`super::seven_warp_smem_bytes`]). `FERRATTN_TQ_ONE_PER_SM=0`: never (diagnostic).
    pad_seven: bool,
}

fn transpose(m: &[f32], d: usize) -> Vec<f32> {
    let mut t = vec![0f32; d * d];
    for i in 0..d {
        for j in 0..d {
            t[j * d + i] = m[i * d + j];
        }
    }
    t
}

impl TurboQuantCuda {
    /// Loads the kernels of `cfg` for problems shaped like `p` (head dim, dtype) on `backend`.
    pub fn new(
        backend: &CudaBackend,
        cfg: &TurboQuantConfig,
        p: &AttentionProblem,
    ) -> Result<TurboQuantCuda> {
        let names = kernel_names(cfg, p)?;
        let gpu = backend.gpu()?.clone();
        let caps_smem = gpu.caps.shared_mem_per_block;
        let force = backend.options().force_nvrtc;
        let load = |img: &str| {
            kernels::Module::load(
                &gpu,
                kernels::image(img).expect("turboquant images are embedded by build.rs"),
                force,
            )
        };
        let cm = load("turboquant_compress")?;
        let dm = load("turboquant_decode")?;
        // FERRATTN_TQ_MERGE_WARPS=8 or 16: one merge for every step (a diagnostic switch, so that
        // one build is timed and tested both ways; see merge_warps)
        let merge_forced = match std::env::var("FERRATTN_TQ_MERGE_WARPS").as_deref() {
            Ok("8") => Some(8),
            Ok("16") => Some(16),
            _ => None,
        };
        // FERRATTN_TQ_ROW_SPLIT=1..16: the merge's CTAs per tile for every step (a diagnostic
        // switch, as above; see row_split)
        let row_split_forced = match std::env::var("FERRATTN_TQ_ROW_SPLIT").as_deref() {
            Ok(v @ ("1" | "2" | "4" | "8" | "16")) => v.parse().ok(),
            _ => None,
        };
        let d = p.head_dim_qk;
        let codec = TurboQuantCodec::new(cfg, d, d);
        let pi_h = codec.key_rotation().matrix().to_vec();
        let s_h = codec.sketch().matrix().to_vec();
        let key_cb = codebook_arrays(codec.key.mse().codebook());
        let value_cb = codebook_arrays(codec.value.codebook());
        let kc = codec.key.mse().codebook().centroids_f32();
        let vc = codec.value.codebook().centroids_f32();
        let (sigma_k, sigma_v) = (f16_friendly_scale(kc), f16_friendly_scale(vc));
        let ktab = centroid_tables(&kc.iter().map(|c| c * sigma_k).collect::<Vec<_>>());
        let vtab = centroid_tables(&vc.iter().map(|c| c * sigma_v).collect::<Vec<_>>());
        let (pi_hi, pi_lo, m_hi) = fast_matrices(&pi_h, &s_h, d);
        let lut_of = |cb: &ferrattn_core::turboquant::Codebook| -> Result<(CodeLut, DeviceBuffer)> {
            let l = CodeLut::new(cb.boundaries_f32(), cb.centroids_f32());
            let buf = DeviceBuffer::from_slice(&gpu, &l.entries)?;
            Ok((l, buf))
        };
        let key_lut = lut_of(codec.key.mse().codebook())?;
        let value_lut = lut_of(codec.value.codebook())?;
        let mut t = TurboQuantCuda {
            compress_keys: cm.function(&names.compress_keys)?,
            compress_values: cm.function(&names.compress_values)?,
            fast_keys: cm.function(&names.fast_keys)?,
            fast_values: cm.function(&names.fast_values)?,
            split_keys: cm.function(&names.split_keys)?,
            split_values: cm.function(&names.split_values)?,
            path: CompressPath::Exact,
            key_lut,
            value_lut,
            pi_hi: DeviceBuffer::from_slice(&gpu, &pi_hi)?,
            pi_lo: DeviceBuffer::from_slice(&gpu, &pi_lo)?,
            m_hi: DeviceBuffer::from_slice(&gpu, &m_hi)?,
            smem_fast_keys: [false, true].map(|s| fast_compress_smem_bytes(d, cfg.key_qjl, s)),
            smem_fast_values: [false, true].map(|s| fast_compress_smem_bytes(d, false, s)),
            prepare_q: dm.function(&names.prepare_q)?,
            prepare_q_v1: dm.function(&format!("turboquant_prepare_q_v1_d{d}"))?,
            // FERRATTN_TQ_PREPARE=v1 / spread: one prepare kernel at every batch (diagnostic:
            // one build timed both ways; the outputs are bit-identical)
            prepare_kernel: match std::env::var("FERRATTN_TQ_PREPARE").as_deref() {
                Ok("v1") => PrepareKernel::V1,
                Ok("spread") => PrepareKernel::Spread,
                _ => PrepareKernel::Auto,
            },
            decode_r8: dm.function(&names.decode_r8)?,
            decode_r8f: dm.function(&names.decode_r8f)?,
            decode_r16: dm.function(&names.decode_r16)?,
            combine: dm.function(&names.combine)?,
            combine_w16: dm.function(&names.combine_w16)?,
            merge_forced,
            row_split_forced,
            pi: DeviceBuffer::from_slice(&gpu, &pi_h)?,
            pit: DeviceBuffer::from_slice(&gpu, &transpose(&pi_h, d))?,
            s: DeviceBuffer::from_slice(&gpu, &s_h)?,
            st: DeviceBuffer::from_slice(&gpu, &transpose(&s_h, d))?,
            smem_keys: compress_smem_bytes(d, cfg.key_qjl),
            smem_values: compress_smem_bytes(d, false),
            gpu,
            cfg: cfg.clone(),
            codec,
            head_dim: d,
            poison: backend.options().poison_outputs,
            provenance: Provenance {
                backend: "cuda".into(),
                device: backend.gpu()?.caps.name.clone(),
                simulated: None,
            },
            names,
            key_cb,
            value_cb,
            ktab,
            vtab,
            sigma_k,
            sigma_v,
            resident: [0; 2],
            compress_per_sm: [0; 2],
            fast_per_sm: [[0; 2]; 2],
            programmatic: false,
            // FERRATTN_TQ_EARLY=0: the decode's first ring fill after its wait (diagnostic, as
            // FERRATTN_TQ_PDL: one build timed and tested both ways)
            late_ring: std::env::var("FERRATTN_TQ_EARLY").is_ok_and(|v| v == "0"),
            // FERRATTN_TQ_SHARE_Q=0: every warp loads its query fragments (diagnostic, as above)
            private_q: std::env::var("FERRATTN_TQ_SHARE_Q").is_ok_and(|v| v == "0"),
            // FERRATTN_TQ_RING_O=0: the partials as scalar stores (diagnostic, as above)
            scalar_o: std::env::var("FERRATTN_TQ_RING_O").is_ok_and(|v| v == "0"),
            // FERRATTN_TQ_PREPARE_PDL=0: the prepare in plain stream order (diagnostic, as above)
            prepare_pdl: std::env::var("FERRATTN_TQ_PREPARE_PDL").map_or(true, |v| v != "0"),
            // FERRATTN_TQ_UNIT_WARPS=4..7: the 8-row decode's CTA size (diagnostic, as above)
            unit_warps_forced: std::env::var("FERRATTN_TQ_UNIT_WARPS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&w| {
                    (UNIT_WARPS..=MAX_UNIT_WARPS_R8).contains(&w)
                        && decode_smem_bytes(d, w, false) <= caps_smem
                }),
            seven_fit: decode_smem_bytes(d, MAX_UNIT_WARPS_R8, false) <= caps_smem,
            fused_fit: small_work_smem_bytes(d, caps_smem) <= caps_smem,
            fused_on: std::env::var("FERRATTN_TQ_FUSED").is_ok_and(|v| v == "1"),
            pad_seven: false,
        };
        // FERRATTN_TQ_PDL=0: plain stream order (a diagnostic switch, so that one build can be
        // tested both ways on a GPU)
        t.set_programmatic_launch(std::env::var("FERRATTN_TQ_PDL").map_or(true, |v| v != "0"));
        set_smem(&t.compress_keys, t.smem_keys)?;
        set_smem(&t.compress_values, t.smem_values)?;
        for (i, f) in [&t.fast_keys, &t.split_keys].into_iter().enumerate() {
            set_smem(f, t.smem_fast_keys[i])?;
        }
        for (i, f) in [&t.fast_values, &t.split_values].into_iter().enumerate() {
            set_smem(f, t.smem_fast_values[i])?;
        }
        // the 8-row kernels are launched with 4 to 7 warps per CTA (unit_warps_for)
        let most = if t.seven_fit {
            MAX_UNIT_WARPS_R8
        } else {
            t.unit_warps_forced.unwrap_or(UNIT_WARPS)
        };
        set_smem(&t.decode_r8, decode_smem_bytes(d, most, false))?;
        // FERRATTN_TQ_ONE_PER_SM=0: 7-warp CTAs at their own size even where two fit an SM
        // (diagnostic, as above)
        let seven = decode_smem_bytes(d, MAX_UNIT_WARPS_R8, false);
        t.pad_seven = t.seven_fit
            && t.fused_fit
            && std::env::var("FERRATTN_TQ_ONE_PER_SM").map_or(true, |v| v != "0")
            && occupancy(&t.decode_r8, MAX_UNIT_WARPS_R8 * 32, seven)? >= 2;
        if t.pad_seven {
            set_smem(&t.decode_r8, small_work_smem_bytes(d, caps_smem))?;
        }
        if t.fused_fit {
            set_smem(&t.decode_r8f, small_work_smem_bytes(d, caps_smem))?;
        }
        set_smem(&t.decode_r16, decode_smem_bytes(d, UNIT_WARPS, true))?;
        let sms = t.gpu.caps.compute_units;
        let warps = |f: &Function, w: usize, r16: bool| -> Result<usize> {
            Ok(occupancy(f, w * 32, t.decode_launch_smem(r16, w, false))? * w * sms)
        };
        t.resident = [
            warps(
                &t.decode_r8,
                t.unit_warps_forced.unwrap_or(UNIT_WARPS),
                false,
            )?,
            warps(&t.decode_r16, UNIT_WARPS, true)?,
        ];
        t.compress_per_sm = [
            occupancy(&t.compress_keys, d, t.smem_keys)?,
            occupancy(&t.compress_values, d, t.smem_values)?,
        ];
        t.fast_per_sm = [
            [
                occupancy(&t.fast_keys, FAST_THREADS, t.smem_fast_keys[0])?,
                occupancy(&t.fast_values, FAST_THREADS, t.smem_fast_values[0])?,
            ],
            [
                occupancy(&t.split_keys, FAST_THREADS, t.smem_fast_keys[1])?,
                occupancy(&t.split_values, FAST_THREADS, t.smem_fast_values[1])?,
            ],
        ];
        Ok(t)
    }

    /// The same kernels compressing by `path`: every append enqueued from now on (prepared
    /// appends carry only where tokens go, not which kernels write them).
    pub fn with_compress_path(mut self, path: CompressPath) -> TurboQuantCuda {
        self.path = path;
        self
    }

    /// Selects the compression kernels of the appends enqueued from now on.
    pub fn set_compress_path(&mut self, path: CompressPath) {
        self.path = path;
    }

    /// The compression kernels appends use.
    pub fn compress_path(&self) -> CompressPath {
        self.path
    }

    /// Whether the decode and the merge of a step, and the fast and split compression kernels,
    /// are launched with programmatic stream serialization (programmatic dependent launch: each
    /// may start while the kernel before it runs and waits for it on the device before reading
    /// its output; a compression kernel stages `Π` and its tables before that wait). On by
    /// default where the GPU has it (compute capability 9.0+) unless the environment sets
    /// `FERRATTN_TQ_PDL=0`; `false` gives plain stream order (same results).
    pub fn set_programmatic_launch(&mut self, on: bool) {
        self.programmatic = on
            && self
                .gpu
                .caps
                .compute_capability
                .is_some_and(|cc| cc >= (9, 0));
    }

    /// Picks the prepare kernel of the steps launched from now on (default
    /// [`PrepareKernel::Auto`], or `FERRATTN_TQ_PREPARE=v1` / `spread` in the environment).
    /// Both kernels write bit-identical query fragments; a diagnostic switch and the reference of
    /// the bit-identity test.
    pub fn set_prepare_kernel(&mut self, k: PrepareKernel) {
        self.prepare_kernel = k;
    }

    /// Forces the warps per CTA of the 8-row decode launches prepared from now on (4 to
    /// [`MAX_UNIT_WARPS_R8`], where that CTA's shared memory fits; `None`: the default,
    /// [`Self::unit_warps_for`]), as `FERRATTN_TQ_UNIT_WARPS` does. The schedule (units,
    /// segments) does not depend on it, so with the same `units` the outputs are bit-identical
    /// (tested). The default width ([`Self::default_units`]) keeps the occupancy measured at
    /// load.
    pub fn set_unit_warps(&mut self, warps: Option<usize>) -> Result<()> {
        if let Some(w) = warps {
            let top = if self.seven_fit {
                MAX_UNIT_WARPS_R8
            } else {
                UNIT_WARPS
            };
            if !(UNIT_WARPS..=top).contains(&w) {
                return Err(CudaError::Unsupported {
                    what: format!("{w} warps per decode CTA"),
                    supported: format!("{UNIT_WARPS} to {top} on this device"),
                });
            }
        }
        self.unit_warps_forced = warps;
        Ok(())
    }

    /// Runs the merge inside the decode where [`Self::fused_merge_for`] allows it (`true`;
    /// `FERRATTN_TQ_FUSED=1` sets it at load) or as a kernel of its own (`false`, the default),
    /// for the decodes prepared from now on. Either way O and LSE are bit-identical (tested).
    pub fn set_fused_merge(&mut self, on: bool) {
        self.fused_on = on;
    }

    /// See [`Self::set_programmatic_launch`].
    pub fn programmatic_launch(&self) -> bool {
        self.programmatic
    }

    /// The kernel names in use.
    pub fn names(&self) -> &KernelNames {
        &self.names
    }

    /// The GPU the kernels and their tables live on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// An empty cache for `batch` sequences of up to `capacity` tokens (rounded up to 16).
    /// Its buffers are zeroed on the backend's stream: synchronise it before work on another
    /// stream reads the cache.
    pub fn alloc_cache(
        &self,
        batch: usize,
        heads_kv: usize,
        capacity: usize,
    ) -> Result<DeviceTurboQuantCache> {
        let d = self.head_dim;
        let cap = cache_capacity(capacity);
        let rows = batch * heads_kv * cap;
        let (kcr, vcr) = code_crumbs(&self.cfg);
        let zeroed = |bytes: usize| -> Result<DeviceBuffer> {
            let mut b = DeviceBuffer::alloc(&self.gpu, bytes.div_ceil(4) * 4)?;
            // padding tokens are read (and masked) by the last tile of a sequence: keep them finite
            b.fill_u32(0)?;
            Ok(b)
        };
        Ok(DeviceTurboQuantCache {
            batch,
            heads_kv,
            head_dim: d,
            capacity: cap,
            key_qjl: self.cfg.key_qjl,
            key_crumbs: kcr,
            value_crumbs: vcr,
            lens: vec![0; batch],
            kcodes: zeroed(rows * layout::key_code_bytes(d, kcr))?,
            ksigns: zeroed(rows * d / 8)?,
            knorms: zeroed(rows * 4)?,
            vcodes: zeroed(rows / 2 * layout::value_pair_bytes(d, vcr))?,
            vnorms: zeroed(rows * 2)?,
        })
    }

    /// Compresses `counts[b]` tokens of f16 `k`, `v` (`[batch, src_len, heads_kv, d]` on the
    /// device) into the cache at each sequence's end, on the backend's stream. Allocates the
    /// append's two small tables ([`Self::prepare_append`]) and waits for the launches (the
    /// tables are freed on return); [`Self::enqueue_append`] is the launch-only form.
    pub fn append(
        &self,
        cache: &mut DeviceTurboQuantCache,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        src_len: usize,
        counts: &[usize],
    ) -> Result<()> {
        let (b_, hk, d) = (cache.batch, cache.heads_kv, self.head_dim);
        let need = b_ * src_len * hk * d * 2;
        if k.bytes() < need || v.bytes() < need {
            return Err(CudaError::Plan(format!(
                "k/v buffers of {} / {} bytes, {need} needed for [{b_}, {src_len}, {hk}, {d}] f16",
                k.bytes(),
                v.bytes()
            )));
        }
        let prep = self.prepare_append(&cache.lens, counts, src_len, cache.capacity)?;
        // SAFETY: k and v are live buffers of this GPU holding [batch, src_len, heads_kv, d]
        // f16 (checked above); the backend's own stream.
        unsafe { self.enqueue_append(&prep, cache, k.ptr(), v.ptr(), self.gpu.stream)? };
        // the tables are freed on return: the launches must be done with them
        self.gpu.synchronize()
    }

    /// [`TurboQuantAppendTables::new`] made ready in memory of its own: allocated and copied to the
    /// device here, synchronously (the convenience path: [`Self::append`], tests); the device
    /// path puts the same tables into a caller's workspace ([`Self::upload_step`]).
    pub fn prepare_append(
        &self,
        lens_before: &[usize],
        counts: &[usize],
        src_len: usize,
        capacity: usize,
    ) -> Result<PreparedTurboQuantAppend> {
        let t = TurboQuantAppendTables::new(lens_before, counts, src_len, capacity)?;
        let plan = TurboQuantStepPlan::new(None, Some(t));
        let step = self.prepare_owned(&plan)?;
        Ok(step.append.expect("the plan appends"))
    }

    /// A step's tables in a buffer of its own, copied synchronously (the convenience paths).
    fn prepare_owned(&self, plan: &TurboQuantStepPlan) -> Result<PreparedTurboQuantStep> {
        let buf = DeviceBuffer::alloc(&self.gpu, plan.workspace_bytes())?;
        // SAFETY: a fresh allocation of the plan's bytes on this GPU (cuMemAlloc aligns to at
        // least 256 bytes), used by nothing else; the backend's own stream, synchronised
        // before the tables are read on any other stream.
        let mut step = unsafe { self.upload_step(plan, buf.ptr(), self.gpu.stream)? };
        self.gpu.synchronize()?;
        let buf = Arc::new(buf);
        if let Some(d) = &mut step.decode {
            d._owned = Some(buf.clone());
        }
        if let Some(a) = &mut step.append {
            a._owned = Some(buf);
        }
        Ok(step)
    }

    /// Enqueues the copy of a step's tables into `workspace` on `stream` (one stream-ordered
    /// host-to-device copy, no allocation, no synchronisation; once per step, outside a graph
    /// capture) and returns the step's launches bound to the workspace's regions, for
    /// [`Self::enqueue_append`] and [`Self::enqueue_decode`] on `stream` (or a stream ordered
    /// after it). The copy reads `plan`'s host image; a pageable source is staged by the driver
    /// before the call returns.
    ///
    /// # Safety
    /// `workspace` is device memory of this GPU, [`TURBOQUANT_WORKSPACE_ALIGN`]-byte aligned,
    /// of at least `plan.workspace_bytes()` bytes, used by nothing else while the step's
    /// launches (and replays of graphs captured from them) run; `stream` is null or a live
    /// stream of this GPU's context.
    pub unsafe fn upload_step(
        &self,
        plan: &TurboQuantStepPlan,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<PreparedTurboQuantStep> {
        if workspace == 0 || !workspace.is_multiple_of(TURBOQUANT_WORKSPACE_ALIGN as u64) {
            return Err(CudaError::Plan(format!(
                "a TurboQuant workspace must be non-null and {TURBOQUANT_WORKSPACE_ALIGN}-byte \
                 aligned (got {workspace:#x})"
            )));
        }
        let decode = match (&plan.decode, &plan.dec) {
            (Some(t), Some(r)) => {
                if (t.head_dim, t.key_qjl) != (self.head_dim, self.cfg.key_qjl) {
                    return Err(CudaError::Plan(format!(
                        "a decode of head dim {} (QJL {}) on kernels of head dim {} (QJL {})",
                        t.head_dim, t.key_qjl, self.head_dim, self.cfg.key_qjl
                    )));
                }
                let at = |off: usize| workspace + off as u64;
                let warps = self.unit_warps_for(&t.problem);
                let fused = self.fused_merge_for(t.r16, warps);
                Some(PreparedTurboQuantDecode {
                    problem: t.problem.clone(),
                    units: t.units,
                    tiles: t.tiles,
                    segments: t.segments,
                    row_split: self.row_split_forced.unwrap_or(t.row_split),
                    qgroups: t.qgroups,
                    decode: if t.r16 {
                        self.decode_r16.clone()
                    } else if fused {
                        self.decode_r8f.clone()
                    } else {
                        self.decode_r8.clone()
                    },
                    warps,
                    smem: self.decode_launch_smem(t.r16, warps, fused),
                    fused,
                    counts: at(r.counts),
                    segs: at(r.segs),
                    unit_segs: at(r.unit_segs),
                    tile_segs: at(r.tile_segs),
                    qf: at(r.qf),
                    qf_lo: at(r.qf_lo),
                    pf: at(r.pf),
                    part_o: at(r.part_o),
                    part_ml: at(r.part_ml),
                    seqlens_q: at(r.seqlens_q),
                    seqlens_k: at(r.seqlens_k),
                    _owned: None,
                })
            }
            _ => None,
        };
        let append = match (&plan.append, &plan.app) {
            (Some(t), Some(r)) => Some(PreparedTurboQuantAppend {
                tables: t.clone(),
                dst0: workspace + r.dst0 as u64,
                count: workspace + r.count as u64,
                _owned: None,
            }),
            _ => None,
        };
        if !plan.image.is_empty() {
            let _bound = self.gpu.bind()?;
            // SAFETY: the caller vouched for `workspace` (this GPU's memory of at least the
            // plan's bytes, which cover the image) and the stream; the image is host memory
            // read before the call returns (a pageable source is staged by the driver).
            check("cuMemcpyHtoDAsync_v2", unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    workspace,
                    plan.image.as_ptr() as *const std::ffi::c_void,
                    plan.image.len(),
                    stream,
                )
            })?;
        }
        Ok(PreparedTurboQuantStep { decode, append })
    }

    /// Enqueues the compression of an append prepared by [`Self::prepare_append`] into
    /// `cache` on `stream`: launches only (no allocation, no synchronisation). The cache must
    /// hold the append's lengths before it, or after it (the same append enqueued again, e.g.
    /// an eager run and then its graph capture: the same slots are rewritten); it then holds
    /// the lengths after it.
    ///
    /// # Safety
    /// `k` and `v` are 16-byte aligned device addresses of this GPU holding f16 `[batch,
    /// src_len, heads_kv, d]` of `prep` and the cache; `stream` is a stream of this GPU's
    /// context (or null); the memory `prep`'s tables are in (its own, or the workspace of
    /// [`Self::upload_step`], whose copy is ordered before this launch) outlives the launches.
    pub unsafe fn enqueue_append(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &mut DeviceTurboQuantCache,
        k: u64,
        v: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.enqueue_append_by(prep, cache, k, v, self.path, stream) }
    }

    /// [`Self::enqueue_append`] through the compression kernels of `path` instead of the
    /// engine's [`Self::compress_path`]: for callers that share one engine between caches
    /// compressed by different paths (the device API's `TurboQuantCache` carries its own).
    ///
    /// # Safety
    /// As [`Self::enqueue_append`].
    pub unsafe fn enqueue_append_by(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &mut DeviceTurboQuantCache,
        k: u64,
        v: u64,
        path: CompressPath,
        stream: sys::CUstream,
    ) -> Result<()> {
        let d = self.head_dim;
        if cache.head_dim != d || cache.key_qjl != self.cfg.key_qjl {
            return Err(CudaError::Plan(format!(
                "a cache of head dim {} (QJL {}) on kernels of head dim {d} (QJL {})",
                cache.head_dim, cache.key_qjl, self.cfg.key_qjl
            )));
        }
        let t = &prep.tables;
        if cache.lens != t.before && cache.lens != t.after {
            return Err(CudaError::Plan(format!(
                "the append was prepared for lengths {:?} but the cache holds {:?}",
                t.before, cache.lens
            )));
        }
        if let Some(b) = t.after.iter().position(|&l| l > cache.capacity) {
            return Err(CudaError::Plan(format!(
                "sequence {b} would hold {} tokens; the cache holds {}",
                t.after[b], cache.capacity
            )));
        }
        if t.groups == 0 {
            cache.lens.clone_from(&t.after);
            return Ok(());
        }
        for (keys, src) in [(true, k), (false, v)] {
            // SAFETY: forwarded from this function's contract.
            unsafe { self.launch_part(prep, cache, src, keys, path, stream)? };
        }
        cache.lens.clone_from(&t.after);
        Ok(())
    }

    /// One of the two launches of [`Self::enqueue_append`] (`keys`: the key kernel reading
    /// `src`, else the value kernel), leaving the cache's lengths as they are: for timing each
    /// compression kernel alone (benches, profilers). Checks as [`Self::enqueue_append`].
    ///
    /// # Safety
    /// As [`Self::enqueue_append`], for `src` in the place of `k` or `v`.
    pub unsafe fn enqueue_compress_part(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &DeviceTurboQuantCache,
        src: u64,
        keys: bool,
        stream: sys::CUstream,
    ) -> Result<()> {
        if cache.head_dim != self.head_dim || cache.key_qjl != self.cfg.key_qjl {
            return Err(CudaError::Plan(format!(
                "a cache of head dim {} (QJL {}) on kernels of head dim {} (QJL {})",
                cache.head_dim, cache.key_qjl, self.head_dim, self.cfg.key_qjl
            )));
        }
        if cache.lens.len() != prep.tables.before.len()
            || prep.tables.after.iter().any(|&l| l > cache.capacity)
        {
            return Err(CudaError::Plan(format!(
                "an append to lengths {:?} on a cache of {} sequences of {} tokens",
                prep.tables.after,
                cache.lens.len(),
                cache.capacity
            )));
        }
        if prep.tables.groups == 0 {
            return Ok(());
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.launch_part(prep, cache, src, keys, self.path, stream) }
    }

    /// The key or the value launch of an append (checks done by the callers).
    ///
    /// # Safety
    /// As [`Self::enqueue_append`].
    unsafe fn launch_part(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &DeviceTurboQuantCache,
        src: u64,
        keys: bool,
        path: CompressPath,
        stream: sys::CUstream,
    ) -> Result<()> {
        if path != CompressPath::Exact {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.launch_fast(prep, cache, src, keys, path, stream) };
        }
        let (b_, hk, d) = (cache.batch, cache.heads_kv, self.head_dim);
        let items = b_ * hk * prep.tables.groups;
        let sms = self.gpu.caps.compute_units;
        let (f, smem, cb, per_sm) = if keys {
            (
                &self.compress_keys,
                self.smem_keys,
                self.key_cb,
                self.compress_per_sm[0],
            )
        } else {
            (
                &self.compress_values,
                self.smem_values,
                self.value_cb,
                self.compress_per_sm[1],
            )
        };
        let mut prm = CompressParams {
            src,
            dst0: prep.dst0,
            count: prep.count,
            pi: self.pi.ptr(),
            s: self.s.ptr(),
            codes: cache.codes_of(keys),
            signs: cache.ksigns.ptr(),
            norms: cache.norms_of(keys),
            batch: b_ as i32,
            src_len: prep.tables.src_len as i32,
            heads_kv: hk as i32,
            cap: cache.capacity as i32,
            groups: prep.tables.groups as i32,
            n_bounds: cb.0,
            bounds: cb.1,
            cents: cb.2,
        };
        let grid = items.min(sms * per_sm) as u32;
        // SAFETY: the parameters match the kernel's; addresses vouched for by the caller
        // (k, v, stream) or owned by `prep`, the cache and `self`.
        unsafe {
            launch_on(
                &self.gpu,
                f,
                (grid, d as u32),
                smem as u32,
                stream,
                false,
                &mut [arg(&mut prm)],
            )?;
        }
        Ok(())
    }

    /// The fast kernel's launch of [`Self::launch_part`].
    ///
    /// # Safety
    /// As [`Self::enqueue_append`].
    unsafe fn launch_fast(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &DeviceTurboQuantCache,
        src: u64,
        keys: bool,
        path: CompressPath,
        stream: sys::CUstream,
    ) -> Result<()> {
        let (b_, hk) = (cache.batch, cache.heads_kv);
        // the tables count 16-token groups aligned to 16; twice as many 8-token tiles from the
        // 8-aligned start cover the same tokens (tiles past a sequence's tokens write nothing)
        let groups = 2 * prep.tables.groups;
        let chunks = (b_ * hk * groups).div_ceil(FAST_ROWS / FAST_TILE);
        let sms = self.gpu.caps.compute_units;
        let split = path == CompressPath::Split;
        let per = self.fast_per_sm[split as usize];
        let lut = if keys { &self.key_lut } else { &self.value_lut };
        let (f, smem, cb, per_sm) = match (keys, split) {
            (true, false) => (&self.fast_keys, self.smem_fast_keys[0], self.key_cb, per[0]),
            (true, true) => (
                &self.split_keys,
                self.smem_fast_keys[1],
                self.key_cb,
                per[0],
            ),
            (false, false) => (
                &self.fast_values,
                self.smem_fast_values[0],
                self.value_cb,
                per[1],
            ),
            (false, true) => (
                &self.split_values,
                self.smem_fast_values[1],
                self.value_cb,
                per[1],
            ),
        };
        let mut prm = FastCompressParams {
            src,
            dst0: prep.dst0,
            count: prep.count,
            pi_hi: self.pi_hi.ptr(),
            pi_lo: self.pi_lo.ptr(),
            m: self.m_hi.ptr(),
            lut: lut.1.ptr(),
            codes: cache.codes_of(keys),
            signs: cache.ksigns.ptr(),
            norms: cache.norms_of(keys),
            batch: b_ as i32,
            src_len: prep.tables.src_len as i32,
            heads_kv: hk as i32,
            cap: cache.capacity as i32,
            groups: groups as i32,
            n_bounds: cb.0,
            bounds: cb.1,
            cents: cb.2,
            lut_lo: lut.0.lo,
            lut_hi: lut.0.hi,
            lut_scale: lut.0.scale,
            lut_off: lut.0.off,
            groups_div: FastDiv::new(groups as u32),
            heads_div: FastDiv::new(hk as u32),
        };
        let grid = chunks.min(sms * per_sm) as u32;
        // SAFETY: the parameters match the kernel's; addresses vouched for by the caller
        // (k, v, stream) or owned by `prep`, the cache and `self`. Programmatic: the kernel
        // reads only the engine's constants and `prep`'s tables (host copies) before its
        // `griddepcontrol.wait`, and loads the rows and writes the cache after it.
        unsafe {
            launch_step_kernel(
                &self.gpu,
                f,
                (grid, FAST_THREADS as u32),
                smem as u32,
                stream,
                self.programmatic,
                &mut [arg(&mut prm)],
            )?;
        }
        Ok(())
    }

    /// Plans a decode of `p`'s queries over `cache` (`p.seqlens_k` must equal the cache's
    /// lengths): stream-K over `units` warps (default: every resident warp, at most one per
    /// 16-token iteration).
    pub fn prepare_decode(
        &self,
        p: &AttentionProblem,
        cache: &DeviceTurboQuantCache,
        units: Option<usize>,
    ) -> Result<PreparedTurboQuantDecode> {
        if p.seqlens_k != cache.lens || p.heads_kv != cache.heads_kv || p.batch != cache.batch {
            return Err(CudaError::Plan(format!(
                "the problem's keys (batch {}, {} KV heads, lengths {:?}) are not the cache's (batch {}, {} KV heads, lengths {:?})",
                p.batch, p.heads_kv, p.seqlens_k, cache.batch, cache.heads_kv, cache.lens
            )));
        }
        self.prepare_decode_for(p, units)
    }

    /// The default stream-K width of `p`'s decode ([`default_units`] over the warps of its
    /// decode kernel resident on this GPU; host only).
    pub fn default_units(&self, p: &AttentionProblem) -> usize {
        let r16 = p.group_size() * p.max_seqlen_q > 8;
        let sms = self.gpu.caps.compute_units;
        if !r16 && self.unit_warps_forced.is_none() && self.seven_fit && small_decode(p, sms) {
            return MAX_UNIT_WARPS_R8 * sms;
        }
        default_units(p, self.resident[r16 as usize], sms, self.unit_warps_for(p))
    }

    /// Warps per CTA of `p`'s decode launch: [`UNIT_WARPS`], or [`MAX_UNIT_WARPS_R8`] for the
    /// 8-row kernels at small work ([`small_decode`]), or `FERRATTN_TQ_UNIT_WARPS` (8 rows).
    pub fn unit_warps_for(&self, p: &AttentionProblem) -> usize {
        if p.group_size() * p.max_seqlen_q > 8 {
            return UNIT_WARPS;
        }
        match self.unit_warps_forced {
            Some(w) => w,
            None if self.seven_fit && small_decode(p, self.gpu.caps.compute_units) => {
                MAX_UNIT_WARPS_R8
            }
            None => UNIT_WARPS,
        }
    }

    /// Dynamic shared memory of a decode launch of `warps` warps per CTA (`r16`: the 16-row
    /// kernels; `fused`: the merge inside, whose shared memory also keeps its CTA one per SM):
    /// [`decode_smem_bytes`], or [`super::seven_warp_smem_bytes`] for the unfused 8-row
    /// kernels.
    fn decode_launch_smem(&self, r16: bool, warps: usize, fused: bool) -> usize {
        let (d, opt_in) = (self.head_dim, self.gpu.caps.shared_mem_per_block);
        if fused {
            small_work_smem_bytes(d, opt_in)
        } else if r16 {
            decode_smem_bytes(d, warps, true)
        } else {
            seven_warp_smem_bytes(d, warps, opt_in, self.pad_seven)
        }
    }

    /// Whether a decode launched with `warps` warps per CTA (`r16`: the 16-row kernels) runs
    /// the merge inside the decode kernel (`decode_r8f`): when it is turned on
    /// ([`Self::set_fused_merge`], `FERRATTN_TQ_FUSED=1`), for the 8-row kernels in CTAs of
    /// [`MAX_UNIT_WARPS_R8`] warps (the small-work schedule, or `FERRATTN_TQ_UNIT_WARPS=7`)
    /// where the device has the shared memory ([`small_work_smem_bytes`]). The fused merge keeps
    /// the merge kernel's association: O and LSE are bit-identical either way. Off by default:
    /// on an H200 (issue-10-decode7 call 2) the step at batch 1, 32k took 83.8 µs fused against
    /// 33.7 with the merge kernel: the CTA that completes a tile merges all of its ~115 partials
    /// x 4 rows with 7 warps (~66 partial rows a warp, ~5k dependent instructions) where the
    /// merge kernel spreads them over 64 warps on 4 SMs.
    pub fn fused_merge_for(&self, r16: bool, warps: usize) -> bool {
        self.fused_on && !r16 && warps == MAX_UNIT_WARPS_R8 && self.fused_fit
    }

    /// [`TurboQuantDecodeTables::new`] with this GPU's default width when `units` is `None`
    /// (host only).
    pub fn decode_tables(
        &self,
        p: &AttentionProblem,
        units: Option<usize>,
    ) -> Result<TurboQuantDecodeTables> {
        if p.head_dim_qk != self.head_dim {
            return Err(CudaError::Plan(format!(
                "a decode of head dim {} on kernels of head dim {}",
                p.head_dim_qk, self.head_dim
            )));
        }
        TurboQuantDecodeTables::new(
            &self.cfg,
            p,
            units.unwrap_or_else(|| self.default_units(p)),
            self.gpu.caps.compute_units,
        )
    }

    /// [`Self::prepare_decode`] for caches that will hold `p.seqlens_k` tokens when the decode
    /// runs (a step planned before its append): [`Self::decode_tables`] made ready in memory
    /// of its own, allocated and copied here, synchronously (the convenience path; the device
    /// path puts the same tables into a caller's workspace, [`Self::upload_step`]).
    pub fn prepare_decode_for(
        &self,
        p: &AttentionProblem,
        units: Option<usize>,
    ) -> Result<PreparedTurboQuantDecode> {
        let t = self.decode_tables(p, units)?;
        let plan = TurboQuantStepPlan::new(Some(t), None);
        let step = self.prepare_owned(&plan)?;
        Ok(step.decode.expect("the plan decodes"))
    }

    /// Enqueues one decode: `q` (f16 `[batch, max_sq, heads_q, d]`) over `cache` into `out`.
    /// Allocates nothing and does not synchronise (graph-capturable).
    pub fn launch_decode(
        &self,
        prep: &PreparedTurboQuantDecode,
        q: &DeviceBuffer,
        cache: &DeviceTurboQuantCache,
        out: &mut DeviceOutputs,
    ) -> Result<()> {
        let p = &prep.problem;
        let need = p.batch * p.max_seqlen_q * p.heads_q * self.head_dim * 2;
        if q.bytes() < need || out.o.bytes() < need {
            return Err(CudaError::Plan(format!(
                "q / o buffers of {} / {} bytes, {need} needed",
                q.bytes(),
                out.o.bytes()
            )));
        }
        if self.poison {
            out.poison()?;
        }
        // SAFETY: q, o and lse are live buffers of this GPU of the sizes checked above (lse:
        // DeviceOutputs::alloc sizes it for the problem); the backend's own stream.
        unsafe {
            self.enqueue_decode(
                prep,
                q.ptr(),
                cache,
                out.o.ptr(),
                out.lse.ptr(),
                self.gpu.stream,
            )
        }
    }

    /// [`Self::launch_decode`] on raw device addresses and the caller's stream (context
    /// parallelism writes O and LSE into a rank's partial block): prepare, decode and combine
    /// enqueued on `stream`, nothing allocated, nothing synchronised.
    ///
    /// # Safety
    /// `q` holds f16 `[batch, max_sq, heads_q, d]`, `o` room for f16 `[batch, max_sq, heads_q,
    /// d]` and `lse` for f32 `[batch, heads_q, max_sq]` of `prep`'s problem, all on this GPU,
    /// 16-byte aligned; `stream` is a stream of this GPU's context (or null); the memory
    /// `prep`'s tables and scratch are in (its own, or the workspace of [`Self::upload_step`],
    /// whose copy is ordered before this launch) outlives the launches and is used by no
    /// launch on another stream meanwhile.
    pub unsafe fn enqueue_decode(
        &self,
        prep: &PreparedTurboQuantDecode,
        q: u64,
        cache: &DeviceTurboQuantCache,
        o: u64,
        lse: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let p = &prep.problem;
        if p.seqlens_k != cache.lens {
            return Err(CudaError::Plan(format!(
                "the decode was planned for lengths {:?} but the cache holds {:?}",
                p.seqlens_k, cache.lens
            )));
        }
        if [q, o, lse].iter().any(|&a| a == 0 || a % 16 != 0) {
            return Err(CudaError::Plan(format!(
                "q, o and lse must be non-null and 16-byte aligned (got {q:#x}, {o:#x}, {lse:#x})"
            )));
        }
        let (d, sms) = (self.head_dim, self.gpu.caps.compute_units);
        let log2e = std::f32::consts::LOG2_E;
        let mut pp = PrepareParams {
            q,
            pit: self.pit.ptr(),
            st: self.st.ptr(),
            qf: prep.qf,
            qf_lo: prep.qf_lo,
            pf: prep.pf,
            seqlens_q: prep.seqlens_q,
            heads_kv: p.heads_kv as i32,
            group: p.group_size() as i32,
            max_sq: p.max_seqlen_q as i32,
            qgroups: prep.qgroups as i32,
            heads_q: p.heads_q as i32,
            qjl: self.cfg.key_qjl as i32,
            batch_tiles: prep.tiles as i32,
            qscale: p.softmax_scale * log2e / self.sigma_k,
            pscale: p.softmax_scale * log2e * self.codec.sketch().correction_scale(),
        };
        // v1: one CTA per (tile, 32 output columns); spread: one per (tile, 8 columns)
        let spread = match self.prepare_kernel {
            PrepareKernel::Auto => prep.tiles <= PREPARE_SPREAD_MAX_TILES,
            k => k == PrepareKernel::Spread,
        };
        let (prepare, cols) = if spread {
            (&self.prepare_q, 8)
        } else {
            (&self.prepare_q_v1, 32)
        };
        // SAFETY: the parameter struct mirrors the kernel's and lives across the call; the
        // addresses are the caller's (this function's contract) and the engine's. Under PDL the
        // prepare reads only Πᵀ / Sᵀ before its wait and writes after it (see launch_step_kernel).
        unsafe {
            launch_step_kernel(
                &self.gpu,
                prepare,
                ((prep.tiles * d / cols) as u32, 128),
                0,
                stream,
                self.programmatic && self.prepare_pdl,
                &mut [arg(&mut pp)],
            )
        }?;
        let mut dp = DecodeParams {
            qf: prep.qf,
            qf_lo: prep.qf_lo,
            pf: prep.pf,
            kcodes: cache.kcodes.ptr(),
            ksigns: cache.ksigns.ptr(),
            knorms: cache.knorms.ptr(),
            vcodes: cache.vcodes.ptr(),
            vnorms: cache.vnorms.ptr(),
            segs: prep.segs,
            unit_segs: prep.unit_segs,
            part_o: prep.part_o,
            part_ml: prep.part_ml,
            seqlens_q: prep.seqlens_q,
            seqlens_k: prep.seqlens_k,
            units: prep.units as i32,
            heads_kv: p.heads_kv as i32,
            cap: cache.capacity as i32,
            qgroups: prep.qgroups as i32,
            group: p.group_size() as i32,
            max_sq: p.max_seqlen_q as i32,
            causal: p.causal as i32,
            diag: self.late_ring as i32
                | (self.private_q as i32) << 1
                | (self.scalar_o as i32) << 2,
            ktab: self.ktab,
            vtab: self.vtab,
            tile_segs: prep.tile_segs,
            counts: prep.counts,
            pi: self.pi.ptr(),
            o,
            lse,
            heads_q: p.heads_q as i32,
            merge_warps: merge_warps(prep.row_split, prep.tiles, sms, self.merge_forced) as i32,
            oscale: 1.0 / self.sigma_v,
        };
        let smem = prep.smem;
        // SAFETY (both launches): the parameter structs mirror the kernels' and live across the
        // calls; the addresses are the caller's (this function's contract) and the engine's.
        unsafe {
            launch_step_kernel(
                &self.gpu,
                &prep.decode,
                (
                    prep.units.div_ceil(prep.warps) as u32,
                    (prep.warps * 32) as u32,
                ),
                smem as u32,
                stream,
                self.programmatic,
                &mut [arg(&mut dp)],
            )
        }?;
        if prep.fused {
            return Ok(()); // the decode kernel merged every tile
        }
        let mut cp = CombineParams {
            part_o: prep.part_o,
            part_ml: prep.part_ml,
            tile_segs: prep.tile_segs,
            pi: self.pi.ptr(),
            o,
            lse,
            seqlens_q: prep.seqlens_q,
            heads_kv: p.heads_kv as i32,
            group: p.group_size() as i32,
            max_sq: p.max_seqlen_q as i32,
            qgroups: prep.qgroups as i32,
            heads_q: p.heads_q as i32,
            tiles: prep.tiles as i32,
            row_split: prep.row_split as i32,
            oscale: 1.0 / self.sigma_v,
        };
        let warps = merge_warps(prep.row_split, prep.tiles, sms, self.merge_forced);
        unsafe {
            launch_step_kernel(
                &self.gpu,
                if warps == 16 {
                    &self.combine_w16
                } else {
                    &self.combine
                },
                ((prep.tiles * prep.row_split) as u32, (warps * 32) as u32),
                0,
                stream,
                self.programmatic,
                &mut [arg(&mut cp)],
            )
        }
    }

    /// [`Self::append`] of device inputs' K and V (`x.problem.seqlens_k` tokens per sequence).
    pub fn compress_inputs(
        &self,
        cache: &mut DeviceTurboQuantCache,
        x: &crate::launch::DeviceInputs,
    ) -> Result<()> {
        let p = &x.problem;
        self.append(cache, &x.k, &x.v, p.max_seqlen_k, &p.seqlens_k)
    }

    /// [`Self::launch_decode`] with the queries of device inputs.
    pub fn launch_decode_inputs(
        &self,
        prep: &PreparedTurboQuantDecode,
        x: &crate::launch::DeviceInputs,
        cache: &DeviceTurboQuantCache,
        out: &mut DeviceOutputs,
    ) -> Result<()> {
        self.launch_decode(prep, &x.q, cache, out)
    }

    /// Allocates outputs for `p`.
    pub fn alloc_outputs(&self, p: &AttentionProblem) -> Result<DeviceOutputs> {
        DeviceOutputs::alloc(&self.gpu, p)
    }

    /// Downloads outputs.
    pub fn download(&self, out: &DeviceOutputs, p: &AttentionProblem) -> Result<AttentionOutput> {
        out.download(p, self.provenance.clone())
    }

    /// Uploads host f16 data of `t` (values must be representable; they are rounded).
    pub fn upload_f16(&self, data: &[f32]) -> Result<DeviceBuffer> {
        let bits: Vec<u16> = data.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        DeviceBuffer::from_slice(&self.gpu, &bits)
    }

    /// [`ferrattn_core::turboquant::emulate`]'s semantics: compress K and V into a fresh cache
    /// and attend every query row over it (`units`: stream-K width, default every resident warp).
    pub fn run(
        &self,
        p: &AttentionProblem,
        x: &AttentionInputs,
        units: Option<usize>,
    ) -> Result<(AttentionOutput, DeviceTurboQuantCache)> {
        check_supported(&self.cfg, p)?;
        p.validate()?;
        let v = x.v.as_ref().ok_or_else(|| CudaError::Unsupported {
            what: "TurboQuant without a separate v tensor".into(),
            supported: "separate K and V".into(),
        })?;
        let k_d = self.upload_f16(&x.k.data)?;
        let v_d = self.upload_f16(&v.data)?;
        let q_d = self.upload_f16(&x.q.data)?;
        let mut cache = self.alloc_cache(p.batch, p.heads_kv, p.max_seqlen_k)?;
        self.append(&mut cache, &k_d, &v_d, p.max_seqlen_k, &p.seqlens_k)?;
        let prep = self.prepare_decode(p, &cache, units)?;
        let mut out = self.alloc_outputs(p)?;
        self.launch_decode(&prep, &q_d, &cache, &mut out)?;
        Ok((self.download(&out, p)?, cache))
    }
}

impl CudaBackend {
    /// The TurboQuant kernels of `cfg` for problems shaped like `p` (see [`TurboQuantCuda`]).
    pub fn turboquant(
        &self,
        cfg: &TurboQuantConfig,
        p: &AttentionProblem,
    ) -> Result<TurboQuantCuda> {
        TurboQuantCuda::new(self, cfg, p)
    }
}

impl ferrattn_core::backend::TurboQuantDecode for CudaBackend {
    /// [`ferrattn_core::turboquant::emulate`]'s semantics: K and V compressed by the kernels,
    /// every query row attended by the fused decode over the compressed cache (causal rows
    /// bottom-right), stream-K over every resident warp.
    fn run_turboquant(
        &self,
        plan: &ferrattn_core::AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput> {
        let ferrattn_core::PlanDetail::TurboQuant(cfg) = &plan.detail else {
            return Err(CudaError::Plan(format!(
                "run_turboquant was given a {} plan",
                plan.algorithm
            )));
        };
        let t = TurboQuantCuda::new(self, cfg, &plan.problem)?;
        Ok(t.run(&plan.problem, x, None)?.0)
    }
}
