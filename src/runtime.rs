//! The API edge: pick a backend, explain the choice, plan and run.
//!
//! One thin enum ([`Runtime`]) over the backend crates; each arm calls the backend's capability
//! trait statically. The (algorithm, backend) support matrix is data ([`supported_on`]), so the
//! CLI, the docs and the dispatch cannot disagree.

use crate::{FerrattnError, Result};
use ferrattn_ascend::AscendBackend;
use ferrattn_core::backend::{
    AmlaDecode, Availability, Device, ExactAttention, LeanDecode, TurboAttention, TurboQuantDecode,
};
use ferrattn_core::{
    Algorithm, AttentionInputs, AttentionOutput, AttentionPlan, AttentionProblem, BackendKind,
    DeviceCaps,
};
use ferrattn_cpu::CpuBackend;
use ferrattn_cuda::CudaBackend;

/// Which backend a caller asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The best available backend for the algorithm.
    Auto,
    /// A named backend.
    Exactly(BackendKind),
}

impl BackendChoice {
    /// Parses `auto`, `cpu`, `cuda`, `ascend`.
    pub fn parse(s: &str) -> Option<BackendChoice> {
        Some(match s {
            "auto" => BackendChoice::Auto,
            "cpu" => BackendChoice::Exactly(BackendKind::Cpu),
            "cuda" => BackendChoice::Exactly(BackendKind::Cuda),
            "ascend" => BackendChoice::Exactly(BackendKind::Ascend),
            _ => return None,
        })
    }
}

/// Backends that run `algorithm`, fastest first. The CPU runs every algorithm's emulation.
pub fn supported_on(algorithm: Algorithm) -> &'static [BackendKind] {
    match algorithm {
        Algorithm::Exact => &[BackendKind::Cpu],
        Algorithm::Lean => &[BackendKind::Cuda, BackendKind::Cpu],
        Algorithm::Amla => &[BackendKind::Ascend, BackendKind::Cpu],
        Algorithm::Turbo => &[BackendKind::Cuda, BackendKind::Cpu],
        Algorithm::TurboQuant => &[BackendKind::Cuda, BackendKind::Cpu],
    }
}

/// A backend ready to plan and run.
pub enum Runtime {
    /// The host CPU.
    Cpu(CpuBackend),
    /// An NVIDIA GPU.
    Cuda(Box<CudaBackend>),
    /// An Ascend NPU, or its simulated schedule on the CPU (every result says which).
    Ascend(Box<AscendBackend>),
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Runtime({}, {:?})", self.kind(), self.availability())
    }
}

/// The outcome of [`Runtime::select`]: the runtime and why the others were not picked.
#[derive(Debug)]
pub struct Selection {
    /// The chosen backend.
    pub runtime: Runtime,
    /// One line per backend considered and passed over.
    pub passed_over: Vec<String>,
}

/// One line of `ferrattn devices`.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    /// Backend family.
    pub backend: BackendKind,
    /// Whether it runs, and why not.
    pub availability: Availability,
    /// Its capabilities when available.
    pub caps: Option<DeviceCaps>,
}

/// Every backend this build knows, with its availability.
pub fn devices() -> Vec<DeviceReport> {
    let cpu = CpuBackend::new();
    vec![
        DeviceReport {
            backend: BackendKind::Cpu,
            availability: cpu.availability(),
            caps: cpu.caps(),
        },
        {
            let gpu = CudaBackend::new(0);
            DeviceReport {
                backend: BackendKind::Cuda,
                availability: gpu.availability(),
                caps: gpu.caps(),
            }
        },
        {
            let ascend = AscendBackend::new();
            DeviceReport {
                backend: BackendKind::Ascend,
                availability: ascend.availability(),
                caps: ascend.caps(),
            }
        },
    ]
}

/// Opens a backend. `allow_simulated` accepts a backend that can only simulate (an explicit
/// `--backend ascend` does; `auto` passes such a backend over for one that really runs).
fn open(kind: BackendKind, allow_simulated: bool) -> Result<Runtime> {
    let rt = match kind {
        BackendKind::Cpu => Runtime::Cpu(CpuBackend::new()),
        BackendKind::Ascend => Runtime::Ascend(Box::new(AscendBackend::new())),
        BackendKind::Cuda => Runtime::Cuda(Box::new(CudaBackend::new(0))),
    };
    match rt.availability() {
        Availability::Ready => Ok(rt),
        Availability::Simulated { .. } if allow_simulated => Ok(rt),
        Availability::Simulated { reason } => Err(FerrattnError::Unavailable {
            backend: kind.to_string(),
            reason: format!(
                "simulated only ({reason}); ask for --backend {kind} to run the simulation"
            ),
        }),
        Availability::Unavailable { reason } => Err(FerrattnError::Unavailable {
            backend: kind.to_string(),
            reason,
        }),
    }
}

impl Runtime {
    /// Picks a backend for `algorithm`. `Auto` takes the first backend of
    /// [`supported_on`] that is ready and records why each earlier one was passed over.
    pub fn select(choice: BackendChoice, algorithm: Algorithm) -> Result<Selection> {
        let supported = supported_on(algorithm);
        match choice {
            BackendChoice::Exactly(kind) => {
                if !supported.contains(&kind) {
                    return Err(FerrattnError::NotSupported {
                        algorithm: algorithm.to_string(),
                        backend: kind.to_string(),
                        supported: supported
                            .iter()
                            .map(|b| b.to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
                Ok(Selection {
                    runtime: open(kind, true)?,
                    passed_over: vec![],
                })
            }
            BackendChoice::Auto => {
                let mut passed_over = vec![];
                for &kind in supported {
                    match open(kind, false) {
                        Ok(runtime) => {
                            tracing::info!(backend = %kind, %algorithm, "auto-selected backend");
                            return Ok(Selection {
                                runtime,
                                passed_over,
                            });
                        }
                        Err(e) => passed_over.push(format!("{kind}: {e}")),
                    }
                }
                Err(FerrattnError::Unavailable {
                    backend: "auto".into(),
                    reason: passed_over.join("; "),
                })
            }
        }
    }

    /// The backend family.
    pub fn kind(&self) -> BackendKind {
        match self {
            Runtime::Cpu(d) => d.kind(),
            Runtime::Cuda(d) => d.kind(),
            Runtime::Ascend(d) => d.kind(),
        }
    }

    /// Whether it runs, simulates, or cannot run.
    pub fn availability(&self) -> Availability {
        match self {
            Runtime::Cpu(d) => d.availability(),
            Runtime::Cuda(d) => d.availability(),
            Runtime::Ascend(d) => d.availability(),
        }
    }

    /// Capabilities the planner uses. A runtime from [`Runtime::select`] always has them; one
    /// built by hand over a backend that cannot run here (`Runtime::Cuda` without a GPU) is
    /// refused with the backend's reason.
    pub fn caps(&self) -> Result<DeviceCaps> {
        let caps = match self {
            Runtime::Cpu(d) => d.caps(),
            Runtime::Cuda(d) => d.caps(),
            Runtime::Ascend(d) => d.caps(),
        };
        caps.ok_or_else(|| FerrattnError::Unavailable {
            backend: self.kind().to_string(),
            reason: match self.availability() {
                Availability::Unavailable { reason } => reason,
                other => format!("it reports no capabilities ({other:?})"),
            },
        })
    }

    /// Plans `algorithm` for `problem` on this backend (pure, host-side).
    pub fn plan(&self, algorithm: Algorithm, problem: &AttentionProblem) -> Result<AttentionPlan> {
        let plan = ferrattn_core::plan(algorithm, problem, &self.caps()?)?;
        // the TurboQuant kernels' closed list (f16, d 64/128, 2-4 bits) is narrower than the
        // emulation's: refuse at plan time what the CUDA backend would refuse at run time
        if let (Runtime::Cuda(_), ferrattn_core::PlanDetail::TurboQuant(cfg)) = (self, &plan.detail)
        {
            ferrattn_cuda::turboquant::check_supported(cfg, problem)?;
        }
        Ok(plan)
    }

    /// Runs a plan. Refuses a plan made for another problem shape or backend.
    pub fn run(&self, plan: &AttentionPlan, x: &AttentionInputs) -> Result<AttentionOutput> {
        if plan.backend != self.kind() {
            return Err(FerrattnError::PlanMismatch(format!(
                "plan was made for the {} backend, this runtime is {}",
                plan.backend,
                self.kind()
            )));
        }
        // a plan may come from a file: every field is checked against its problem and this device
        plan.validate(&self.caps()?)?;
        let problem = x.problem(
            ferrattn_core::AttentionOptions {
                causal: plan.problem.causal,
                softmax_scale: Some(plan.problem.softmax_scale),
            },
            Some(plan.problem.head_dim_v),
        )?;
        if problem != plan.problem {
            return Err(FerrattnError::PlanMismatch(format!(
                "plan is for {} but the inputs are {}",
                describe(&plan.problem),
                describe(&problem)
            )));
        }
        // values every backend's arithmetic can hold, or the supported range in the error
        ferrattn_core::range::check(plan.algorithm, self.kind(), &problem, x)?;
        match self {
            Runtime::Cpu(d) => Ok(match plan.algorithm {
                Algorithm::Exact => d.run_exact(plan, x)?,
                Algorithm::Lean => d.run_lean(plan, x)?,
                Algorithm::Amla => d.run_amla(plan, x)?,
                Algorithm::Turbo => d.run_turbo(plan, x)?,
                Algorithm::TurboQuant => d.run_turboquant(plan, x)?,
            }),
            Runtime::Cuda(d) => match plan.algorithm {
                Algorithm::Lean => Ok(d.run_lean(plan, x)?),
                Algorithm::Turbo => Ok(d.run_turbo(plan, x)?),
                Algorithm::TurboQuant => Ok(d.run_turboquant(plan, x)?),
                other => Err(FerrattnError::NotSupported {
                    algorithm: other.to_string(),
                    backend: "cuda".into(),
                    supported: supported_on(other)
                        .iter()
                        .map(|b| b.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
            },
            Runtime::Ascend(d) => match plan.algorithm {
                Algorithm::Amla => Ok(d.run_amla(plan, x)?),
                other => Err(FerrattnError::NotSupported {
                    algorithm: other.to_string(),
                    backend: "ascend".into(),
                    supported: "cpu".into(),
                }),
            },
        }
    }
}

/// A one-line description of a problem's shape for messages.
pub fn describe(p: &AttentionProblem) -> String {
    format!(
        "B={} Sq={} Sk={} Hq={} Hk={} D={} Dv={} {} {:?}{}",
        p.batch,
        p.max_seqlen_q,
        p.max_seqlen_k,
        p.heads_q,
        p.heads_kv,
        p.head_dim_qk,
        p.head_dim_v,
        p.dtype,
        p.kv_layout,
        if p.causal { " causal" } else { "" }
    )
}
