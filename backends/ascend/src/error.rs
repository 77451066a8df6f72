//! The crate's one error type. AscendCL failures keep the call that failed and its code.

use thiserror::Error;

/// Errors of the Ascend backend.
#[derive(Debug, Error)]
pub enum AscendError {
    /// `libascendcl.so` could not be opened from any candidate path.
    #[error(
        "AscendCL unavailable because libascendcl.so could not be loaded (tried {tried}): {reason}"
    )]
    LibraryNotFound {
        /// The paths and names tried, comma separated.
        tried: String,
        /// The loader's last message.
        reason: String,
    },
    /// The library lacks an entry point this backend needs (an older CANN, or not AscendCL).
    #[error("AscendCL unavailable because {library} has no symbol {symbol}: {reason}")]
    MissingSymbol {
        /// The library that was opened.
        library: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
    /// An AscendCL call returned a non-zero `aclError`.
    #[error("AscendCL call {api} failed with code {code}{}", fmt_msg(.message))]
    Acl {
        /// The function that failed, e.g. `aclrtMalloc`.
        api: &'static str,
        /// Its `aclError` return code.
        code: i32,
        /// `aclGetRecentErrMsg()` right after the failure, when it said anything.
        message: Option<String>,
    },
    /// The runtime loaded but reports no NPU.
    #[error("Ascend NPU unavailable because aclrtGetDeviceCount reports {count} devices")]
    NoDevice {
        /// Devices reported.
        count: u32,
    },
    /// The AMLA kernel binary is missing.
    #[error("AMLA kernel unavailable because its binary {path} could not be read: {reason}")]
    KernelNotFound {
        /// Where it was looked for.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The AMLA kernel binary is not a device binary this backend can load.
    #[error("AMLA kernel unavailable because {path} is not a valid kernel binary: {reason}")]
    BadKernelBinary {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A problem or plan outside the closed list of configurations the kernel covers.
    #[error("unsupported {what}; supported: {supported}")]
    Unsupported {
        /// What was asked for, with its value.
        what: String,
        /// The closed list that is supported.
        supported: String,
    },
    /// A plan not made for this backend or problem.
    #[error("plan mismatch: {0}")]
    PlanMismatch(String),
    /// An error of the core (validation, planning, tiling).
    #[error(transparent)]
    Core(#[from] ferrattn_core::CoreError),
    /// Writing a timeline or report failed.
    #[error("{what}: {reason}")]
    Io {
        /// What was being written.
        what: String,
        /// Why it failed.
        reason: String,
    },
}

fn fmt_msg(m: &Option<String>) -> String {
    match m {
        Some(s) if !s.is_empty() => format!(" ({s})"),
        _ => String::new(),
    }
}

/// Result alias of the crate.
pub type Result<T, E = AscendError> = std::result::Result<T, E>;
