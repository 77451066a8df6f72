//! `ferrattn-cuda`: the CUDA backend of ferrattn.
//!
//! Runs LeanAttention's stream-K decode (Lean appendix E, Alg. 2; kernel in
//! `cuda-kernels/lean_decode.cu`) and, from the same kernel, the fixed-split FlashDecoding
//! baseline. Exact attention is served for decode shapes by the same kernel with one split per
//! tile. The schedule is planned on the host by `ferrattn_core::lean` and uploaded as two small
//! tables; see that module for the math and the CPU twin every GPU result is tested against.
//!
//! TurboAttention (INT8 tensor-core prefill and decode over a compressed KV cache, with SAS;
//! kernels in `cuda-kernels/turbo_*.cu`) is in [`turbo`]: bit-identical to the CPU emulation
//! `ferrattn_core::turbo`, measured in `docs/TURBO_CUDA.md`.
//!
//! The driver and NVRTC are loaded at run time: the crate builds and its host tests run on
//! machines without CUDA, where [`CudaBackend::availability`] says why nothing can run.
//! Kernels are embedded at build time (see `build.rs`): a fatbin when nvcc was found, else the
//! sources for NVRTC.
//!
//! ```no_run
//! use ferrattn_core::{backend::LeanDecode, Device};
//! let gpu = ferrattn_cuda::CudaBackend::new(0);
//! println!("{:?}", gpu.availability());
//! ```

pub mod cp;
pub mod device;
pub mod error;
pub mod kernels;
pub mod launch;
pub mod nccl;
pub mod turbo;
pub mod turboquant;

pub use device::{DeviceBuffer, Event, Gpu, Graph};
pub use error::{CudaError, Result};
pub use kernels::{LeanEntry, LeanInstance};
pub use kernels::{ModuleOrigin, BUILD_NOTE};
pub use launch::{
    DeviceInputs, DeviceOutputs, KvStorage, LeanKernels, LeanStepPlan, LeanTensors, PagedRead,
    Paging, PreparedLean, WorkspaceLayout, MAX_POOL_ROWS, PAGE_SIZES, WORKSPACE_ALIGN,
};
pub use turbo::device::{
    turbo_cache_bytes, turbo_reset_cache, TurboDecodeStepPlan, TurboPrefillStepPlan,
    TurboPrefillTensors, TurboStepKernels, TURBO_WORKSPACE_ALIGN,
};
pub use turbo::{DecodeSchedule, DeviceTurboCache};

use ferrattn_core::backend::{Availability, Device, ExactAttention, LeanDecode, TurboAttention};
use ferrattn_core::{
    lean, Algorithm, AttentionInputs, AttentionOutput, AttentionPlan, BackendKind, DeviceCaps,
    PlanDetail, Provenance,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// How the backend obtains its kernels and treats outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Compile the embedded sources with NVRTC even when a fatbin is embedded.
    pub force_nvrtc: bool,
    /// Fill outputs with NaN before each run (tests: unwritten elements show).
    pub poison_outputs: bool,
    /// TurboAttention prefill on the mma.sync kernel, whose O equals the CPU emulation bit for
    /// bit, even on sm_90 where the faster warpgroup-MMA kernel (O within 1e-3) is the default.
    pub exact_turbo_prefill: bool,
    /// TurboAttention prefill on sm_90 under the fast contract (`turbo_prefill_wgf_*`, issue 11):
    /// P quantized to u8 with the fixed scale 1/255 against the running row maximum, exp2
    /// instead of SAS; follows `ferrattn_core::turbo::prefill_fixed_p`, no less accurate than
    /// the emulation against the f64 golden (docs/TURBO_CUDA.md). Ignored with
    /// `exact_turbo_prefill` and off sm_90.
    pub fast_turbo_prefill: bool,
    /// TurboAttention decode always on the full-row instance (`turbo_decode_*`), also for GQA
    /// groups of at most 4 query heads, where `turbo_decode_g4_*` is the default. Both give the
    /// same bits; benchmarks and tests compare them.
    pub turbo_decode_full_rows: bool,
    /// TurboAttention decode on the fast-contract instances (`turbo_decode_fast_*`,
    /// `turbo_decode_g4_fast_*`) also off sm_90, where the bit-exact instances are the default.
    /// The fast contract: e^x on the MUFU instead of SAS (the threshold n_r kept) and P
    /// quantized against the tile's largest logit (no per-tile division or second maximum).
    /// Not bit-exact: O within 2e-2 relative (Frobenius) and LSE within 1e-2 of the emulation,
    /// O's error against the exact result no larger than the bit-exact kernel's (within 10%) on
    /// the GPU tests (`docs/TURBO_CUDA.md`). On sm_90 (compute capability 9.0) the fast
    /// instances are the default; `exact_turbo_decode` overrides this option.
    pub fast_turbo_decode: bool,
    /// TurboAttention decode on the bit-exact instances (`turbo_decode_*`,
    /// `turbo_decode_g4_*`), whose O equals the CPU emulation bit for bit (one unit per tile)
    /// or its stream-K twin, even on sm_90 where the fast-contract instances are the default
    /// (as `exact_turbo_prefill` is for the prefill). Takes precedence over `fast_turbo_decode`.
    pub exact_turbo_decode: bool,
    /// Where the fast g4 instance runs, `turbo_decode_g4_fast_mixed_*` (the tile's format as
    /// branches; the same bits) in place of `turbo_decode_g4_fast_*`: `None` as
    /// `turbo::decode_branches_policy` chooses per decode launch (a cache with a 2-bit head on
    /// a grid that fills the GPU, on a chip with more than 30 GB/s of DRAM bandwidth per SM such
    /// as the H200), `Some(true)` / `Some(false)` always / never (tests and
    /// benchmarks compare the two).
    pub turbo_decode_branches: Option<bool>,
}

/// The CUDA backend for one GPU. Construction never fails: an unusable GPU is reported by
/// [`Device::availability`] and by [`CudaError::Unavailable`] from every run.
#[derive(Debug)]
pub struct CudaBackend {
    gpu: std::result::Result<Arc<Gpu>, String>,
    options: Options,
    module: OnceLock<std::result::Result<Arc<kernels::Module>, String>>,
    turbo: OnceLock<std::result::Result<Arc<turbo::TurboModules>, String>>,
    lean_kernels: Mutex<HashMap<LeanInstance, Arc<LeanKernels>>>,
}

impl CudaBackend {
    /// GPU `ordinal` with default options.
    pub fn new(ordinal: usize) -> CudaBackend {
        CudaBackend::with_options(ordinal, Options::default())
    }

    /// GPU `ordinal` with `options`.
    pub fn with_options(ordinal: usize, options: Options) -> CudaBackend {
        let gpu = Gpu::open(ordinal).map(Arc::new).map_err(|e| match e {
            CudaError::Unavailable { reason } => reason,
            other => other.to_string(),
        });
        if let Err(reason) = &gpu {
            tracing::debug!(%reason, "CUDA backend unavailable");
        }
        CudaBackend {
            gpu,
            options,
            module: OnceLock::new(),
            turbo: OnceLock::new(),
            lean_kernels: Mutex::new(HashMap::new()),
        }
    }

    /// The opened GPU, or why there is none.
    pub fn gpu(&self) -> Result<&Arc<Gpu>> {
        self.gpu
            .as_ref()
            .map_err(|r| CudaError::Unavailable { reason: r.clone() })
    }

    /// The options this backend was made with.
    pub fn options(&self) -> Options {
        self.options
    }

    /// The Lean module, loaded (or NVRTC-compiled) at first use.
    pub fn lean_module(&self) -> Result<&Arc<kernels::Module>> {
        let gpu = self.gpu()?;
        self.module
            .get_or_init(|| {
                let img =
                    kernels::image("lean_decode").expect("lean_decode is embedded by build.rs");
                kernels::Module::load(gpu, img, self.options.force_nvrtc).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| CudaError::Unavailable {
                reason: format!("the lean kernels could not be loaded: {e}"),
            })
    }

    /// Where the loaded kernels came from (loads them if needed).
    pub fn module_origin(&self) -> Result<ModuleOrigin> {
        Ok(self.lean_module()?.origin.clone())
    }

    /// Uploads host inputs.
    pub fn upload(&self, x: &AttentionInputs, plan: &AttentionPlan) -> Result<DeviceInputs> {
        DeviceInputs::upload(self.gpu()?, &plan.problem, x)
    }

    /// Inputs filled on the device with uniform values in `[-scale, scale)`.
    pub fn random_inputs(
        &self,
        p: &ferrattn_core::AttentionProblem,
        seed: u32,
        scale: f32,
    ) -> Result<DeviceInputs> {
        let f = self
            .lean_module()?
            .function(kernels::fill_kernel_name(p.dtype)?)?;
        DeviceInputs::random(self.gpu()?, &f, p, seed, scale)
    }

    /// Outputs for `p` (poisoned with NaN when [`Options::poison_outputs`]).
    pub fn alloc_outputs(&self, p: &ferrattn_core::AttentionProblem) -> Result<DeviceOutputs> {
        let mut o = DeviceOutputs::alloc(self.gpu()?, p)?;
        if self.options.poison_outputs {
            o.poison()?;
        }
        Ok(o)
    }

    /// The kernels of one Lean instance, resolved at first use and cached: a decode step looks
    /// nothing up by name.
    pub fn lean_kernels(&self, instance: LeanInstance) -> Result<Arc<LeanKernels>> {
        let mut cache = self
            .lean_kernels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(k) = cache.get(&instance) {
            return Ok(k.clone());
        }
        let k = Arc::new(LeanKernels::new(
            self.gpu()?,
            self.lean_module()?,
            instance,
        )?);
        cache.insert(instance, k.clone());
        Ok(k)
    }

    /// Prepares a Lean plan (stream-K or fixed split) for repeated launches.
    pub fn prepare(&self, plan: &AttentionPlan) -> Result<PreparedLean> {
        let PlanDetail::Lean(lp) = &plan.detail else {
            return Err(CudaError::Plan(format!(
                "a {} plan was given to the lean kernel",
                plan.algorithm
            )));
        };
        let p = &plan.problem;
        let instance = LeanInstance::new(p.dtype, p.head_dim_qk, lp.tile_m)?;
        PreparedLean::new(self.lean_kernels(instance)?, plan)
    }

    /// Enqueues one run (asynchronous; poisons the outputs first when asked to).
    pub fn launch(
        &self,
        prep: &PreparedLean,
        x: &DeviceInputs,
        out: &mut DeviceOutputs,
    ) -> Result<()> {
        if self.options.poison_outputs {
            out.poison()?;
        }
        prep.launch(self.gpu()?, x, out)
    }

    /// Downloads outputs (waits for the stream).
    pub fn download(
        &self,
        out: &DeviceOutputs,
        p: &ferrattn_core::AttentionProblem,
    ) -> Result<AttentionOutput> {
        out.download(p, self.provenance()?)
    }

    fn provenance(&self) -> Result<Provenance> {
        Ok(Provenance {
            backend: "cuda".into(),
            device: self.gpu()?.caps.name.clone(),
            simulated: None,
        })
    }

    /// Upload, prepare, launch, download.
    fn run_prepared_plan(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput> {
        let prep = self.prepare(plan)?;
        let dx = self.upload(x, plan)?;
        let mut out = self.alloc_outputs(&plan.problem)?;
        self.launch(&prep, &dx, &mut out)?;
        self.download(&out, &plan.problem)
    }
}

impl Device for CudaBackend {
    type Error = CudaError;

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn availability(&self) -> Availability {
        match &self.gpu {
            Ok(_) => Availability::Ready,
            Err(reason) => Availability::Unavailable {
                reason: reason.clone(),
            },
        }
    }

    fn caps(&self) -> Option<DeviceCaps> {
        self.gpu.as_ref().ok().map(|g| g.caps.clone())
    }
}

impl LeanDecode for CudaBackend {
    fn run_lean(&self, plan: &AttentionPlan, x: &AttentionInputs) -> Result<AttentionOutput> {
        if plan.algorithm != Algorithm::Lean {
            return Err(CudaError::Plan(format!(
                "run_lean was given a {} plan",
                plan.algorithm
            )));
        }
        self.run_prepared_plan(plan, x)
    }
}

impl ExactAttention for CudaBackend {
    /// Exact decode through the Lean kernel with one split per tile (no partials, no merge):
    /// only shapes the Lean kernel covers; anything else is `Unsupported`.
    fn run_exact(&self, plan: &AttentionPlan, x: &AttentionInputs) -> Result<AttentionOutput> {
        let caps = self.gpu()?.caps.clone();
        let lp = lean::plan_fixed_split(&plan.problem, &caps, Some(1)).map_err(|e| CudaError::Unsupported {
            what: format!("exact attention on CUDA for this problem ({e})"),
            supported: "decode shapes of the lean kernel (1..=8 query tokens, head dim 64/128/256, GQA <= 16, f16/bf16)".into(),
        })?;
        let routed = AttentionPlan {
            algorithm: Algorithm::Lean,
            block_q: lp.tile_m,
            block_k: lp.tile_k,
            detail: ferrattn_core::PlanDetail::Lean(lp),
            ..plan.clone()
        };
        self.run_prepared_plan(&routed, x)
    }
}

impl TurboAttention for CudaBackend {
    /// [`ferrattn_core::turbo::emulate`]'s semantics on INT8 tensor cores (see [`turbo`]):
    /// prefill where `Sq >= Sk`, context compression then token-by-token decode where `Sq < Sk`,
    /// decoded with one CTA per tile so that O equals the emulation's bit for bit (stream-K
    /// decode is [`CudaBackend::turbo_decode`]'s).
    fn run_turbo(&self, plan: &AttentionPlan, x: &AttentionInputs) -> Result<AttentionOutput> {
        let ferrattn_core::PlanDetail::Turbo(cfg) = &plan.detail else {
            return Err(CudaError::Plan(format!(
                "run_turbo was given a {} plan",
                plan.algorithm
            )));
        };
        self.turbo_run(cfg, &plan.problem, x, Some(DecodeSchedule::PerTile))
    }
}

/// One line for `ferrattn devices`: availability, device, how kernels are embedded.
pub fn describe(backend: &CudaBackend) -> String {
    match &backend.gpu {
        Ok(g) => {
            let c = &g.caps;
            let (ma, mi) = c.compute_capability.unwrap_or((0, 0));
            format!(
                "cuda:{} ready: {} (cc {ma}.{mi}, {} SMs, {} KiB smem/block, {} MiB L2, driver {}); kernels: {}",
                g.ordinal,
                c.name,
                c.compute_units,
                c.shared_mem_per_block / 1024,
                c.l2_bytes >> 20,
                g.driver_version,
                BUILD_NOTE
            )
        }
        Err(reason) => format!("cuda unavailable because {reason}; kernels: {BUILD_NOTE}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_every_entry_point_says_why() {
        let b = CudaBackend::new(0);
        if b.gpu().is_ok() {
            eprintln!("skipped: a GPU is present; this test covers the no-GPU path");
            return;
        }
        let Availability::Unavailable { reason } = b.availability() else {
            panic!("expected Unavailable")
        };
        assert!(!reason.is_empty());
        assert!(b.caps().is_none());
        let p = ferrattn_core::AttentionProblem::uniform(
            1,
            1,
            8,
            2,
            2,
            64,
            64,
            ferrattn_core::DType::F16,
        );
        let plan =
            ferrattn_core::plan(Algorithm::Lean, &p, &DeviceCaps::hopper_reference()).unwrap();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
        let mut t = |s: &[usize]| ferrattn_core::Tensor::randn(s, p.dtype, 1.0, &mut rng);
        let x = AttentionInputs::new(t(&[1, 1, 2, 64]), t(&[1, 8, 2, 64]), t(&[1, 8, 2, 64]));
        match b.run_lean(&plan, &x) {
            Err(CudaError::Unavailable { reason: r }) => assert_eq!(r, reason),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(
            describe(&b).starts_with("cuda unavailable because"),
            "{}",
            describe(&b)
        );
    }

    #[test]
    fn params_struct_matches_the_kernel_layout() {
        // 13 pointers, reserved, num_ctas, 11 ints, one float, the page table pointer, two
        // ints and the CTA page-word pointer (see struct LeanParams in lean_decode.cu)
        assert_eq!(
            std::mem::size_of::<launch::LeanParams>(),
            13 * 8 + 2 * 4 + 11 * 4 + 4 + 8 + 2 * 4 + 8
        );
        // 7 pointers, 8 ints (struct AppendParams)
        assert_eq!(std::mem::size_of::<launch::AppendParams>(), 7 * 8 + 8 * 4);
    }
}
