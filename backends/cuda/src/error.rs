//! The error type of `ferrattn-cuda`: vendor errors keep the call that failed and its code.

use ferrattn_core::CoreError;
use thiserror::Error;

/// Errors of the CUDA backend.
#[derive(Debug, Error)]
pub enum CudaError {
    /// No usable CUDA driver or device; nothing was run.
    #[error("CUDA unavailable because {reason}")]
    Unavailable {
        /// Why, e.g. "libcuda.so was not found by the dynamic loader".
        reason: String,
    },
    /// A driver API call failed.
    #[error("{api} failed with CUresult {code} ({name})")]
    Driver {
        /// The driver entry point, e.g. `cuMemAlloc_v2`.
        api: &'static str,
        /// The numeric `CUresult`.
        code: u32,
        /// `cuGetErrorName` of the code.
        name: String,
    },
    /// An NCCL call failed.
    #[error("{api} failed with ncclResult_t {code} ({message})")]
    Nccl {
        /// The NCCL entry point, e.g. `ncclAllGather`.
        api: &'static str,
        /// The numeric `ncclResult_t`.
        code: u32,
        /// `ncclGetErrorString` of the code.
        message: String,
    },
    /// NVRTC could not compile an embedded kernel source.
    #[error("NVRTC failed to compile {image} for {arch}: {log}")]
    Nvrtc {
        /// Which embedded image.
        image: &'static str,
        /// Target architecture, e.g. `compute_90a`.
        arch: String,
        /// The compiler's log or error.
        log: String,
    },
    /// A configuration no kernel covers.
    #[error("unsupported {what}; supported: {supported}")]
    Unsupported {
        /// What was asked for, with its value.
        what: String,
        /// The closed list that is supported.
        supported: String,
    },
    /// A plan that does not fit the inputs or this device.
    #[error("plan rejected by the CUDA backend: {0}")]
    Plan(String),
    /// Validation or planning in the core.
    #[error(transparent)]
    Core(#[from] CoreError),
}

/// Result alias of this crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Maps a driver return code to `Ok` or [`CudaError::Driver`] naming `api`.
pub(crate) fn check(api: &'static str, r: cudarc::driver::sys::CUresult) -> Result<()> {
    use cudarc::driver::sys::CUresult;
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let name = cudarc::driver::result::DriverError(r)
        .error_name()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    Err(CudaError::Driver {
        api,
        code: r as u32,
        name,
    })
}
