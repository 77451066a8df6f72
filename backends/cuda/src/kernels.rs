//! Embedded kernel images, module loading, and the closed list of kernels.
//!
//! `build.rs` embeds each `cuda-kernels/*.cu` as an [`EmbeddedImage`]: always its source (with
//! `common.cuh` inlined), plus a fatbin when nvcc was found at build time. Loading tries the
//! fatbin first; when there is none, or it has no code for the GPU, the source is compiled with
//! NVRTC for the GPU's architecture and the PTX is cached in memory and on disk
//! (`$FERRATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/ferrattn`, else `~/.cache/ferrattn`).

use crate::device::Gpu;
use crate::error::{check, CudaError, Result};
use cudarc::driver::sys;
use ferrattn_core::DType;
use std::sync::Arc;

/// One kernel file as built into this crate.
#[derive(Debug)]
pub struct EmbeddedImage {
    /// File stem, e.g. `lean_decode`.
    pub name: &'static str,
    /// nvcc fatbin (sm_90a SASS + compute_80 PTX), when nvcc was found at build time.
    pub fatbin: Option<&'static [u8]>,
    /// The CUDA source with `common.cuh` inlined, for NVRTC.
    pub source: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// CTAs per SM the Lean kernel is built for (`cfg::kMinCtasPerSm` in `cuda-kernels/common.cuh`).
pub const LEAN_CTAS_PER_SM: usize = 2;
/// Threads per CTA (`cfg::kThreads`).
pub const LEAN_THREADS: u32 = 128;

/// Keys per shared-memory pipeline stage for head dim `d` (`cfg::stage_keys<D>()`: 8 keys for
/// each of `4 warps * 256 / d` key groups). A plan's `tile_k` must be a multiple of it.
pub fn lean_stage_keys(d: usize) -> usize {
    8 * 4 * 256 / d
}

/// The embedded image called `name`.
pub fn image(name: &str) -> Option<&'static EmbeddedImage> {
    IMAGES.iter().find(|i| i.name == name)
}

/// How a module was obtained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleOrigin {
    /// The build-time fatbin.
    Fatbin,
    /// NVRTC at run time for `arch`; `from_disk_cache` when the PTX was read back from the cache.
    Nvrtc {
        /// Target, e.g. `compute_90a`.
        arch: String,
        /// Read from the on-disk cache rather than compiled now.
        from_disk_cache: bool,
    },
}

/// A loaded module.
#[derive(Debug)]
pub struct Module {
    module: sys::CUmodule,
    /// Where the code came from.
    pub origin: ModuleOrigin,
    gpu: Arc<Gpu>,
}

// SAFETY: module handles are context-wide; calls bind the context first.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: module loaded in this GPU's context.
        unsafe {
            let _bound = self.gpu.bind();
            let _ = sys::cuModuleUnload(self.module);
        }
    }
}

/// A kernel entry point of a loaded module (keeps the module alive).
#[derive(Clone, Debug)]
pub struct Function {
    pub(crate) f: sys::CUfunction,
    /// The `extern "C"` name.
    pub name: String,
    module: Arc<Module>,
}

// SAFETY: function handles are context-wide.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// Makes the context of the function's GPU current until the guard drops (attribute and
    /// occupancy queries need it).
    pub(crate) fn bind(&self) -> Result<crate::device::Bound> {
        self.module.gpu.bind()
    }

    /// The module the function lives in.
    pub(crate) fn module(&self) -> &Arc<Module> {
        &self.module
    }
}

impl Module {
    /// Loads `img` on `gpu`: the fatbin, or NVRTC when `force_nvrtc`, when there is no fatbin, or
    /// when the fatbin has no code for this GPU.
    pub fn load(
        gpu: &Arc<Gpu>,
        img: &'static EmbeddedImage,
        force_nvrtc: bool,
    ) -> Result<Arc<Module>> {
        let _bound = gpu.bind()?;
        if let (Some(fb), false) = (img.fatbin, force_nvrtc) {
            let mut m = std::ptr::null_mut();
            // SAFETY: fb is a complete fatbin image embedded at build time.
            let r =
                unsafe { sys::cuModuleLoadData(&mut m, fb.as_ptr() as *const std::ffi::c_void) };
            if r == sys::CUresult::CUDA_SUCCESS {
                return Ok(Arc::new(Module {
                    module: m,
                    origin: ModuleOrigin::Fatbin,
                    gpu: gpu.clone(),
                }));
            }
            if r != sys::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU
                && r != sys::CUresult::CUDA_ERROR_INVALID_PTX
                && r != sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            {
                check("cuModuleLoadData", r)?;
            }
            tracing::info!(
                image = img.name,
                code = r as u32,
                "fatbin has no code for this GPU; using NVRTC"
            );
        }
        let arch = nvrtc_arch(gpu.caps.compute_capability.unwrap_or((8, 0)));
        let (ptx, from_disk_cache) = nvrtc_ptx(img, arch)?;
        let mut m = std::ptr::null_mut();
        let c = std::ffi::CString::new(ptx).expect("PTX has no NUL bytes");
        // SAFETY: NUL-terminated PTX text.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut m, c.as_ptr() as *const std::ffi::c_void)
        })?;
        Ok(Arc::new(Module {
            module: m,
            origin: ModuleOrigin::Nvrtc {
                arch: arch.to_string(),
                from_disk_cache,
            },
            gpu: gpu.clone(),
        }))
    }

    /// Device address and size in bytes of the module's global variable `name`, or `None` where
    /// the module has none (diagnostic builds define some, e.g. the Lean kernels'
    /// `ferrattn_lean_stamps`).
    pub fn global(&self, name: &str) -> Result<Option<(u64, usize)>> {
        let _bound = self.gpu.bind()?;
        let c = std::ffi::CString::new(name).expect("global names have no NUL bytes");
        let (mut ptr, mut bytes) = (0u64, 0usize);
        // SAFETY: valid module, NUL-terminated name, out-parameters.
        let r = unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut bytes, self.module, c.as_ptr()) };
        if r == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Ok(None);
        }
        check("cuModuleGetGlobal", r)?;
        Ok(Some((ptr, bytes)))
    }

    /// The entry point `name`.
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function> {
        let _bound = self.gpu.bind()?;
        let c = std::ffi::CString::new(name).expect("kernel names have no NUL bytes");
        let mut f = std::ptr::null_mut();
        // SAFETY: valid module, NUL-terminated name.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, self.module, c.as_ptr())
        })?;
        Ok(Function {
            f,
            name: name.to_string(),
            module: self.clone(),
        })
    }
}

/// NVRTC target for a compute capability (the `a` variant on Hopper).
pub fn nvrtc_arch(cc: (u32, u32)) -> &'static str {
    match cc {
        (9, 0) => "compute_90a",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        // a newer GPU JITs the newest PTX we know to name
        (m, _) if m > 12 => "compute_120",
        _ => "compute_80",
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Directory of the NVRTC PTX cache.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    if let Some(d) = std::env::var_os("FERRATTN_CACHE_DIR") {
        return Some(d.into());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(std::path::PathBuf::from(d).join("ferrattn"));
    }
    std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/ferrattn"))
}

/// Extra `-D` options of every NVRTC compile, from `FERRATTN_NVRTC_DEFINES` (space separated,
/// e.g. `-DFERRATTN_TURBO_DECODE_G4_BLOCKS=5`): a tuning hook for the kernels' compile-time
/// constants (launch bounds), so that one GPU session can time several values through
/// `Options::force_nvrtc` without rebuilding. Only `-D` options are taken; read per compile.
pub fn nvrtc_defines() -> Vec<String> {
    std::env::var("FERRATTN_NVRTC_DEFINES")
        .unwrap_or_default()
        .split_whitespace()
        .filter(|o| o.starts_with("-D"))
        .map(str::to_string)
        .collect()
}

/// PTX of `img` for `arch`: from the in-process cache, the disk cache, or NVRTC.
pub fn nvrtc_ptx(img: &'static EmbeddedImage, arch: &'static str) -> Result<(String, bool)> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static MEMO: Mutex<Option<HashMap<(&'static str, &'static str), String>>> = Mutex::new(None);
    let key = (img.name, arch);
    if let Some(p) = MEMO
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return Ok((p.clone(), true));
    }
    let file = cache_dir().map(|d| {
        d.join(format!(
            "{}-{arch}-{:016x}.ptx",
            img.name,
            match nvrtc_defines().join(" ") {
                d if d.is_empty() => fnv1a(img.source),
                d => fnv1a(img.source) ^ fnv1a(&d).rotate_left(1),
            }
        ))
    });
    if let Some(Ok(ptx)) = file.as_ref().map(std::fs::read_to_string) {
        MEMO.lock()
            .unwrap()
            .get_or_insert_with(HashMap::new)
            .insert(key, ptx.clone());
        return Ok((ptx, true));
    }
    let ptx = nvrtc_compile(img, arch)?;
    if let Some(f) = &file {
        // the cache is an optimisation: a read-only home directory must not fail the run
        if let Some(d) = f.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &ptx).is_ok() {
            let _ = std::fs::rename(&tmp, f);
        }
    }
    MEMO.lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(key, ptx.clone());
    Ok((ptx, false))
}

/// Compiles an embedded source with NVRTC (needs libnvrtc, not a GPU).
pub fn nvrtc_compile(img: &'static EmbeddedImage, arch: &'static str) -> Result<String> {
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Unavailable {
            reason: format!(
                "the kernels were built without nvcc and libnvrtc.so was not found to compile {} at run time ({})",
                img.name, BUILD_NOTE
            ),
        });
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: ["-std=c++17".to_string(), "-default-device".into()]
            .into_iter()
            .chain(nvrtc_defines())
            .collect(),
        name: Some(format!("{}.cu", img.name)),
        ..Default::default()
    };
    let t = std::time::Instant::now();
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(img.source, opts).map_err(|e| CudaError::Nvrtc {
            image: img.name,
            arch: arch.into(),
            log: match e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    log.to_string_lossy().into_owned()
                }
                other => format!("{other:?}"),
            },
        })?;
    tracing::info!(
        image = img.name,
        arch,
        secs = t.elapsed().as_secs_f32(),
        "NVRTC compiled"
    );
    Ok(ptx.to_src())
}

/// Rows per tile a Lean kernel instance holds (next power of two of the plan's `tile_m`).
pub fn lean_rows(tile_m: usize) -> Result<usize> {
    match tile_m {
        1 => Ok(1),
        2 => Ok(2),
        3..=4 => Ok(4),
        5..=8 => Ok(8),
        9..=16 => Ok(16),
        _ => Err(CudaError::Unsupported {
            what: format!("lean tile of {tile_m} query rows"),
            supported: "1..=16".into(),
        }),
    }
}

/// Names of the Lean decode, combine and shared-memory-query kernels for a configuration: the
/// closed list of instances in `lean_decode.cu`.
pub fn lean_kernel_names(dtype: DType, head_dim: usize, tile_m: usize) -> Result<[String; 3]> {
    let dt = match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => {
            return Err(CudaError::Unsupported {
                what: format!("lean kernel for {other}"),
                supported: "f16, bf16".into(),
            })
        }
    };
    let d = match head_dim {
        64 | 128 | 256 => head_dim,
        _ => {
            return Err(CudaError::Unsupported {
                what: format!("lean kernel for head dim {head_dim}"),
                supported: "64, 128, 256".into(),
            })
        }
    };
    let r = lean_rows(tile_m)?;
    Ok([
        format!("lean_decode_{dt}_d{d}_r{r}"),
        format!("lean_combine_{dt}_d{d}_r{r}"),
        format!("lean_smem_{dt}_d{d}_r{r}"),
    ])
}

/// One instance of the closed list in `lean_decode.cu`: (dtype, head dim, rows per tile). Only
/// [`LeanInstance::new`] makes one, so every value names kernels that exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LeanInstance {
    dtype: DType,
    head_dim: usize,
    rows: usize,
}

/// The entry points of one [`LeanInstance`] (plus the dtype-free append kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeanEntry {
    /// Stream-K / fixed-split decode over contiguous K/V.
    Decode,
    /// The same over a paged K/V pool.
    DecodePaged,
    /// The same, reading the page table a stage ahead (chosen by the grid, `launch.rs`).
    DecodePagedAhead,
    /// The same, with each unit's page words in registers a stage before its copies.
    DecodePagedRegs,
    /// [`LeanEntry::DecodePagedRegs`] with a four-stage ring, for grids of one CTA per SM; built
    /// for head dims up to [`LEAN_DEEP_MAX_HEAD_DIM`] only ([`LeanInstance::entries`]).
    DecodePagedDeep,
    /// Second pass of the fixed split.
    Combine,
    /// Reports the decode kernel's shared memory and stage count.
    SmemQuery,
    /// Writes new tokens into contiguous K/V.
    Append,
    /// Writes new tokens into a paged pool.
    AppendPaged,
}

impl LeanEntry {
    /// Every entry, in the order [`LeanInstance::names`] returns them.
    pub const ALL: [LeanEntry; 9] = [
        LeanEntry::Decode,
        LeanEntry::DecodePaged,
        LeanEntry::DecodePagedAhead,
        LeanEntry::DecodePagedRegs,
        LeanEntry::DecodePagedDeep,
        LeanEntry::Combine,
        LeanEntry::SmemQuery,
        LeanEntry::Append,
        LeanEntry::AppendPaged,
    ];
}

/// Largest head dim with a [`LeanEntry::DecodePagedDeep`] kernel (`kDeepMaxHeadDim` in
/// `lean_decode.cu`): the four-stage ring lost 1-2 points on Llama's d128 rows, so no d128 or
/// d256 instance is built (docs/DEVICE_PATH.md, "Lean paged, sixteenth session").
pub const LEAN_DEEP_MAX_HEAD_DIM: usize = 64;

impl LeanInstance {
    /// Whether the module holds `entry` for this instance (every entry but
    /// [`LeanEntry::DecodePagedDeep`] above [`LEAN_DEEP_MAX_HEAD_DIM`]).
    pub fn has(&self, entry: LeanEntry) -> bool {
        entry != LeanEntry::DecodePagedDeep || self.head_dim <= LEAN_DEEP_MAX_HEAD_DIM
    }

    /// The entries the module holds for this instance, in [`LeanEntry::ALL`]'s order.
    pub fn entries(&self) -> impl Iterator<Item = LeanEntry> + '_ {
        LeanEntry::ALL.into_iter().filter(|&e| self.has(e))
    }

    /// The instance serving `dtype`, `head_dim` and tiles of `tile_m` query rows, or
    /// `Unsupported` naming the closed list.
    pub fn new(dtype: DType, head_dim: usize, tile_m: usize) -> Result<LeanInstance> {
        lean_kernel_names(dtype, head_dim, tile_m)?;
        Ok(LeanInstance {
            dtype,
            head_dim,
            rows: lean_rows(tile_m)?,
        })
    }

    /// Element type of Q, K, V and O.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Query rows the instance holds per tile.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The `extern "C"` name of `entry`.
    pub fn name(&self, entry: LeanEntry) -> String {
        let dt = if self.dtype == DType::F16 {
            "f16"
        } else {
            "bf16"
        };
        let (d, r) = (self.head_dim, self.rows);
        match entry {
            LeanEntry::Decode => format!("lean_decode_{dt}_d{d}_r{r}"),
            LeanEntry::DecodePaged => format!("lean_decode_paged_{dt}_d{d}_r{r}"),
            LeanEntry::DecodePagedAhead => format!("lean_decode_paged_ahead_{dt}_d{d}_r{r}"),
            LeanEntry::DecodePagedRegs => format!("lean_decode_paged_regs_{dt}_d{d}_r{r}"),
            LeanEntry::DecodePagedDeep => format!("lean_decode_paged_deep_{dt}_d{d}_r{r}"),
            LeanEntry::Combine => format!("lean_combine_{dt}_d{d}_r{r}"),
            LeanEntry::SmemQuery => format!("lean_smem_{dt}_d{d}_r{r}"),
            LeanEntry::Append => "lean_append".into(),
            LeanEntry::AppendPaged => "lean_append_paged".into(),
        }
    }
}

/// Name of the device-side random fill for `dtype`.
pub fn fill_kernel_name(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F16 => Ok("fill_uniform_f16"),
        DType::BF16 => Ok("fill_uniform_bf16"),
        other => Err(CudaError::Unsupported {
            what: format!("device fill of {other}"),
            supported: "f16, bf16".into(),
        }),
    }
}

/// Entry points of one TurboAttention configuration: the closed list of instances in
/// `turbo_prefill.cu` and `turbo_decode.cu` (see `crate::turbo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurboKernelNames {
    /// BPQ stage 1 of K and V per block (and stage 2 into the cache).
    pub quant_kv: String,
    /// BPQ stage 1 of the query blocks for `prefill_wgf` (INT8 Q tiles and block scales, the
    /// codes of the wg kernels' on-chip prologue).
    pub quant_q: String,
    /// Universal scale and INT8 buffer of the tokens after the last full block.
    pub buffer_tail: String,
    /// Alg. 1 attention (mma.sync; bit-exact with the emulation).
    pub prefill: String,
    /// Alg. 1 attention on warpgroup MMA (sm_90a only).
    pub prefill_wg: String,
    /// The same under the fast contract (P as u8 codes with s_P = 1/255; sm_90a only).
    pub prefill_wgf: String,
    /// Alg. 2 over the compressed cache, one partial per segment (any GQA group; the full-row
    /// layout, for groups of more than 4 query heads).
    pub decode: String,
    /// The same for GQA groups of at most 4 query heads (the half-row layout fixed at compile
    /// time: half of O's registers, fewer spills under the same 168-register cap).
    pub decode_g4: String,
    /// `decode` under the fast numerical contract (`Options::fast_turbo_decode`).
    pub decode_fast: String,
    /// `decode_g4` under the fast numerical contract (`Options::fast_turbo_decode`).
    pub decode_g4_fast: String,
    /// `decode_g4_fast` with the tile's format tested as branches (the same results bit for
    /// bit), for caches with 2-bit heads (`ferrattn_cuda::turbo::decode_branches_policy`).
    pub decode_g4_fast_mixed: String,
    /// Merge of a decode tile's partials.
    pub combine: String,
    /// One token into the INT8 buffer.
    pub append: String,
    /// A full buffer into a compressed block.
    pub flush: String,
}

/// Kernel names of TurboAttention for a dtype and head dim; anything else is `Unsupported`.
pub fn turbo_kernel_names(dtype: DType, head_dim: usize) -> Result<TurboKernelNames> {
    let dt = match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => {
            return Err(CudaError::Unsupported {
                what: format!("turbo kernels for {other}"),
                supported: "f16, bf16".into(),
            })
        }
    };
    let d = match head_dim {
        64 | 128 => head_dim,
        _ => {
            return Err(CudaError::Unsupported {
                what: format!("turbo kernels for head dim {head_dim}"),
                supported: "64, 128".into(),
            })
        }
    };
    Ok(TurboKernelNames {
        quant_kv: format!("turbo_quant_kv_{dt}_d{d}"),
        quant_q: format!("turbo_quant_q_{dt}_d{d}"),
        buffer_tail: format!("turbo_buffer_tail_{dt}_d{d}"),
        prefill: format!("turbo_prefill_{dt}_d{d}"),
        prefill_wg: format!("turbo_prefill_wg_{dt}_d{d}"),
        prefill_wgf: format!("turbo_prefill_wgf_{dt}_d{d}"),
        decode: format!("turbo_decode_{dt}_d{d}"),
        decode_g4: format!("turbo_decode_g4_{dt}_d{d}"),
        decode_fast: format!("turbo_decode_fast_{dt}_d{d}"),
        decode_g4_fast: format!("turbo_decode_g4_fast_{dt}_d{d}"),
        decode_g4_fast_mixed: format!("turbo_decode_g4_fast_mixed_{dt}_d{d}"),
        combine: format!("turbo_combine_{dt}_d{d}"),
        append: format!("turbo_append_{dt}_d{d}"),
        flush: format!("turbo_flush_d{d}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lean_source_is_embedded_with_common_inlined_and_every_instance() {
        let img = image("lean_decode").expect("lean_decode image");
        assert!(
            !img.source.contains("#include \"common.cuh\""),
            "common.cuh must be inlined for NVRTC"
        );
        assert!(
            img.source.contains("namespace cfg"),
            "common.cuh text present"
        );
        // every name the selector can return is instantiated by the macros of the source
        assert!(img.source.contains("FERRATTN_LEAN_DIMS(f16, F16)"));
        assert!(img.source.contains("FERRATTN_LEAN_DIMS(bf16, BF16)"));
        for r in ["1", "2", "4", "8", "16"] {
            assert!(
                img.source
                    .contains(&format!("FERRATTN_LEAN(TN, T, D, {r})")),
                "rows {r}"
            );
        }
        for d in ["64", "128", "256"] {
            assert!(
                img.source
                    .contains(&format!("FERRATTN_LEAN_ROWS(TN, T, {d})")),
                "dim {d}"
            );
        }
    }

    #[test]
    fn fatbin_when_built_with_nvcc_holds_the_kernels() {
        let img = image("lean_decode").unwrap();
        match img.fatbin {
            Some(fb) => {
                // An uncompressed fatbin carries the entry names in its ELF string tables; nvcc
                // compresses a large one (the Lean module since its 180 kernels), and then no name
                // is readable here: the GPU tests load every entry from it instead.
                assert_eq!(
                    fb.get(..4),
                    Some(&0xBA55_ED50u32.to_le_bytes()[..]),
                    "not a fatbin"
                );
                let hay = String::from_utf8_lossy(fb);
                let inst = LeanInstance::new(DType::BF16, 128, 4).unwrap();
                let names: Vec<String> = inst.entries().map(|e| inst.name(e)).collect();
                let seen = names.iter().filter(|n| hay.contains(n.as_str())).count();
                assert!(
                    seen == 0 || seen == names.len(),
                    "{seen} of {} entry names readable: a partial fatbin",
                    names.len()
                );
                assert!(BUILD_NOTE.starts_with("fatbin from"), "{BUILD_NOTE}");
            }
            None => assert!(BUILD_NOTE.starts_with("sources only"), "{BUILD_NOTE}"),
        }
    }

    /// The NVRTC path compiles here whenever libnvrtc can be loaded (no GPU needed); CI gets it
    /// from the nvidia-cuda-nvrtc wheel that scripts/install-nvcc.sh installs.
    #[test]
    fn nvrtc_compiles_the_embedded_source() {
        // SAFETY: only probes whether the library loads.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("SKIPPED nvrtc_compiles_the_embedded_source: libnvrtc.so not found (set LD_LIBRARY_PATH)");
            return;
        }
        let ptx =
            nvrtc_compile(image("lean_decode").unwrap(), "compute_90a").expect("NVRTC compile");
        for dt in [DType::F16, DType::BF16] {
            for d in [64, 128, 256] {
                let inst = LeanInstance::new(dt, d, 16).unwrap();
                for e in LeanEntry::ALL {
                    let n = inst.name(e);
                    assert_eq!(
                        ptx.contains(&format!(".entry {n}(")),
                        inst.has(e),
                        "{n} in the NVRTC PTX against the closed list"
                    );
                }
            }
        }
        assert!(ptx.contains(".target sm_90a"));
    }

    #[test]
    fn kernel_selection_is_a_closed_list() {
        assert_eq!(
            lean_kernel_names(DType::F16, 64, 3).unwrap()[0],
            "lean_decode_f16_d64_r4"
        );
        assert_eq!(
            lean_kernel_names(DType::BF16, 256, 16).unwrap()[1],
            "lean_combine_bf16_d256_r16"
        );
        assert!(matches!(
            lean_kernel_names(DType::F32, 128, 1),
            Err(CudaError::Unsupported { .. })
        ));
        assert!(matches!(
            lean_kernel_names(DType::F16, 96, 1),
            Err(CudaError::Unsupported { .. })
        ));
        assert!(matches!(
            lean_kernel_names(DType::F16, 128, 17),
            Err(CudaError::Unsupported { .. })
        ));
        assert_eq!(lean_stage_keys(128), 64);
        let inst = LeanInstance::new(DType::F16, 128, 3).unwrap();
        assert_eq!(inst.rows(), 4);
        assert_eq!(
            inst.name(LeanEntry::DecodePaged),
            "lean_decode_paged_f16_d128_r4"
        );
        assert!(matches!(
            LeanInstance::new(DType::F32, 128, 1),
            Err(CudaError::Unsupported { .. })
        ));
        assert_eq!(nvrtc_arch((9, 0)), "compute_90a");
        // the deep ring exists at head dim 64 only
        assert!(LeanInstance::new(DType::F16, 64, 4)
            .unwrap()
            .has(LeanEntry::DecodePagedDeep));
        let d128 = LeanInstance::new(DType::BF16, 128, 4).unwrap();
        assert!(!d128.has(LeanEntry::DecodePagedDeep));
        assert_eq!(d128.entries().count(), LeanEntry::ALL.len() - 1);
    }
}
