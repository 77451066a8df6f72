//! `ferrattn-ascend`: AMLA MLA decode (Liao et al.) on Huawei Ascend NPUs.
//!
//! Two paths, and every result says which one produced it:
//!
//! * **Real**: `libascendcl.so` opened at run time ([`device`]), the AscendC kernel of
//!   `ascend-kernels/amla/` loaded with `aclrtBinaryLoadFromData` ([`kernels`]) and launched
//!   ([`launch`]) with the ABI `ascendc_library` generates for a mixed kernel. Needs CANN, the
//!   compiled kernel and an NPU; none exists where this crate is developed, so this path has not
//!   run. The kernel source itself is type-checked against the real AscendC headers
//!   (`scripts/ascend-check-headers.sh`) and executed on a CPU model of the AscendC API (test
//!   `kernel_cpu`), where it matches [`sim::numerics`] bit for bit.
//! * **Simulated** ([`sim`]): when any of those is missing, [`AscendBackend`] reports
//!   `Availability::Simulated { reason }`, executes the kernel's numerics on the CPU in the
//!   kernel's order ([`sim::numerics`]) and marks every output's `provenance.simulated`. A
//!   discrete-event model of an Ascend 910 ([`sim::timing`]) gives durations, FLOPS utilisation,
//!   pipe occupancy and the critical path of AMLA and of the four-stage "Base".
//!
//! Layout follows the other backends: `lib.rs` (the backend), `device.rs`, `kernels.rs`,
//! `launch.rs`, `acl.rs` (bindings), `config.rs` (hardware constants), `error.rs`.

pub mod acl;
pub mod config;
pub mod device;
pub mod error;
pub mod kernels;
pub mod launch;
pub mod sim;

pub use error::{AscendError, Result};
pub use sim::repro::{repro_performance, Repro};
pub use sim::timing::{SimReport, Variant};

use device::{AclLibrary, NpuContext};
use ferrattn_core::amla::AmlaPlan;
use ferrattn_core::backend::{AmlaDecode, Availability, Device};
use ferrattn_core::{
    AttentionInputs, AttentionOutput, AttentionPlan, BackendKind, DeviceCaps, PlanDetail,
    Provenance,
};
#[cfg(feature = "svg")]
use std::path::Path;
use std::path::PathBuf;
use std::sync::Mutex;

/// Where to look for AscendCL and the kernel; `None` means the default search.
#[derive(Clone, Debug, Default)]
pub struct BackendConfig {
    /// `libascendcl.so` to open instead of the default candidates.
    pub library: Option<PathBuf>,
    /// Kernel binary instead of [`kernels::default_kernel_path`].
    pub kernel: Option<PathBuf>,
    /// NPU index.
    pub device_id: i32,
}

/// The Ascend backend: a real NPU context, or the simulation with the reason recorded.
pub struct AscendBackend {
    npu: Option<Mutex<NpuContext>>,
    /// Why the real path is not used (`None` when it is).
    reason: Option<String>,
    /// The typed error behind `reason`.
    error: Option<AscendError>,
}

impl AscendBackend {
    /// Tries the real path with the default search; falls back to simulation, recording why.
    pub fn new() -> AscendBackend {
        AscendBackend::with_config(&BackendConfig::default())
    }

    /// Like [`AscendBackend::new`] with explicit paths (tests use fixture libraries).
    pub fn with_config(cfg: &BackendConfig) -> AscendBackend {
        match AscendBackend::open_npu(cfg) {
            Ok(ctx) => AscendBackend {
                npu: Some(Mutex::new(ctx)),
                reason: None,
                error: None,
            },
            Err(e) => {
                tracing::info!(reason = %e, "Ascend backend runs the simulated schedule");
                AscendBackend {
                    npu: None,
                    reason: Some(e.to_string()),
                    error: Some(e),
                }
            }
        }
    }

    /// The simulated backend without probing for hardware.
    pub fn simulated(reason: &str) -> AscendBackend {
        AscendBackend {
            npu: None,
            reason: Some(reason.to_string()),
            error: None,
        }
    }

    fn open_npu(cfg: &BackendConfig) -> Result<NpuContext> {
        let acl = match &cfg.library {
            Some(p) => AclLibrary::open_first(std::slice::from_ref(p))?,
            None => AclLibrary::open_default()?,
        };
        let kpath = cfg
            .kernel
            .clone()
            .unwrap_or_else(kernels::default_kernel_path);
        let kernel = kernels::KernelBinary::read(&kpath)?;
        NpuContext::open(acl, cfg.device_id, &kernel)
    }

    /// The typed error that sent the backend to simulation, if any.
    pub fn fallback_error(&self) -> Option<&AscendError> {
        self.error.as_ref()
    }

    /// Whether results come from the simulation.
    pub fn is_simulated(&self) -> bool {
        self.npu.is_none()
    }

    /// Simulated timing of the AMLA or Base kernel (see [`sim::timing`]). SIMULATED.
    pub fn simulate(batch: usize, sq: usize, sk: usize, variant: Variant) -> SimReport {
        sim::timing::simulate(&config::Ascend910::paper(), batch, sq, sk, variant)
    }

    /// Simulated timing of a plan: its problem's heads, query tokens and KV lengths, and its
    /// AMLA tiling (block size, singleK/baseK, buffer counts, Vector rows). SIMULATED.
    pub fn simulate_plan(plan: &AttentionPlan, variant: Variant) -> Result<SimReport> {
        let PlanDetail::Amla(a) = &plan.detail else {
            return Err(AscendError::PlanMismatch(format!(
                "simulated Ascend timing needs an AMLA plan, got {:?}",
                plan.algorithm
            )));
        };
        check_plan(a)?;
        let p = &plan.problem;
        if !(1..=2).contains(&p.max_seqlen_q) {
            return Err(AscendError::PlanMismatch(format!(
                "AMLA decode covers 1 or 2 query tokens, the plan has {}",
                p.max_seqlen_q
            )));
        }
        Ok(sim::timing::simulate_plan(
            &config::Ascend910::paper(),
            &a.tiling,
            p.heads_q,
            p.max_seqlen_q,
            &p.seqlens_k,
            variant,
        ))
    }

    /// Writes a Gantt chart of one core pair's pipes over its first `blocks` KV blocks.
    #[cfg(feature = "svg")]
    pub fn timeline_svg(report: &SimReport, blocks: usize, path: &Path) -> Result<()> {
        sim::timeline::timeline_svg(report, blocks, path)
    }
}

impl Default for AscendBackend {
    fn default() -> Self {
        AscendBackend::new()
    }
}

/// Simulated timing of `variant` on the paper's Ascend 910 (same as [`AscendBackend::simulate`]).
pub fn simulate(batch: usize, sq: usize, sk: usize, variant: Variant) -> SimReport {
    AscendBackend::simulate(batch, sq, sk, variant)
}

/// Gantt chart of a report (same as [`AscendBackend::timeline_svg`]).
#[cfg(feature = "svg")]
pub fn timeline_svg(report: &SimReport, blocks: usize, path: &Path) -> Result<()> {
    AscendBackend::timeline_svg(report, blocks, path)
}

impl Device for AscendBackend {
    type Error = AscendError;

    fn kind(&self) -> BackendKind {
        BackendKind::Ascend
    }

    fn availability(&self) -> Availability {
        match &self.reason {
            None => Availability::Ready,
            Some(r) => Availability::Simulated {
                reason: format!("{r}; running the simulated Ascend 910 schedule on the CPU"),
            },
        }
    }

    fn caps(&self) -> Option<DeviceCaps> {
        Some(DeviceCaps::ascend910_reference())
    }
}

impl AmlaDecode for AscendBackend {
    fn run_amla(&self, plan: &AttentionPlan, x: &AttentionInputs) -> Result<AttentionOutput> {
        let PlanDetail::Amla(amla) = &plan.detail else {
            return Err(AscendError::PlanMismatch(format!(
                "run_amla needs an AMLA plan, got {:?}",
                plan.algorithm
            )));
        };
        let p = &plan.problem;
        if x.q.shape != [p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk] || x.v.is_some() {
            return Err(AscendError::PlanMismatch(format!(
                "inputs q {:?} / kv {:?} do not match the plan's MLA problem",
                x.q.shape, x.k.shape
            )));
        }
        check_plan(amla)?;
        match &self.npu {
            Some(ctx) => {
                kernels::check_supported(p)?;
                let ctx = ctx
                    .lock()
                    .expect("a panicked launch leaves no shared state behind");
                let (o, lse) = launch::run(&ctx, amla, p, x)?;
                Ok(AttentionOutput {
                    o,
                    lse,
                    provenance: Provenance {
                        backend: "ascend".into(),
                        device: ctx.name.clone(),
                        simulated: None,
                    },
                })
            }
            None => {
                let settings = sim::numerics::KernelSettings {
                    block_k: amla.block_k,
                    compensation: amla.compensation,
                    preload: amla.preload.clone(),
                    arithmetic: sim::numerics::Arithmetic::CoreEmulation,
                };
                let out = sim::numerics::run(p, x, &settings);
                let (o, lse) = sim::numerics::to_tensors(p, out);
                Ok(AttentionOutput {
                    o,
                    lse,
                    provenance: Provenance {
                        backend: "ascend".into(),
                        device: "simulated Ascend 910".into(),
                        simulated: Some(format!(
                            "CPU execution of the AMLA kernel's schedule (no NPU ran it): {}",
                            self.reason.as_deref().unwrap_or("simulation requested")
                        )),
                    },
                })
            }
        }
    }
}

/// The plan's own consistency: a block size, a Preload Pipeline of AMLA's 2-pair chain, and a
/// tiling that fits the Ascend 910's buffers (Table 1).
fn check_plan(a: &AmlaPlan) -> Result<()> {
    a.tiling
        .validate(&ferrattn_core::amla::tiling::CubeTarget::ascend910())?;
    if a.block_k == 0 {
        return Err(AscendError::PlanMismatch("AMLA block_k is 0".into()));
    }
    if a.preload.pairs != 2 {
        return Err(AscendError::PlanMismatch(format!(
            "AMLA's chain has 2 Cube/Vector pairs; the plan's pipeline has {}",
            a.preload.pairs
        )));
    }
    Ok(())
}
