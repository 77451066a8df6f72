//! The facade's error type: wraps each crate's error with `From`.

use thiserror::Error;

/// Errors of the public ferrattn API.
#[derive(Debug, Error)]
pub enum FerrattnError {
    /// Validation, planning or an emulation in the core.
    #[error(transparent)]
    Core(#[from] ferrattn_core::CoreError),
    /// The CPU backend.
    #[error("cpu backend: {0}")]
    Cpu(#[from] ferrattn_cpu::CpuError),
    /// The CUDA backend.
    #[error("cuda backend: {0}")]
    Cuda(#[from] ferrattn_cuda::CudaError),
    /// The Ascend backend (real or simulated).
    #[error("ascend backend: {0}")]
    Ascend(#[from] ferrattn_ascend::AscendError),
    /// A backend that cannot run here, and why.
    #[error("backend {backend} is unavailable: {reason}")]
    Unavailable {
        /// The backend asked for.
        backend: String,
        /// Why it cannot run.
        reason: String,
    },
    /// An (algorithm, backend) pair outside the support matrix.
    #[error("{algorithm} does not run on the {backend} backend; it runs on: {supported}")]
    NotSupported {
        /// The algorithm.
        algorithm: String,
        /// The backend.
        backend: String,
        /// Backends that run it.
        supported: String,
    },
    /// A tensor view or argument rejected at the device-path boundary (nothing was launched).
    #[error("invalid argument: {0}")]
    View(crate::device_api::ViewError),
    /// A plan made for another problem or backend.
    #[error("plan mismatch: {0}")]
    PlanMismatch(String),
    /// `ferrattn bench`: rows failed their correctness check or could not run.
    #[error("bench: {0}")]
    Bench(String),
    /// Reading or writing a file.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// Result alias of the facade.
pub type Result<T, E = FerrattnError> = std::result::Result<T, E>;
