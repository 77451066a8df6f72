//! The binding's errors and the Python exception classes they become.
//!
//! Every class derives from `ferrattn.Error` and from the builtin a Python caller would catch for
//! that mistake (`ValueError` for shapes, layouts, devices and page tables, `TypeError` for
//! dtypes, `RuntimeError` for a backend that cannot run), and carries the Rust message with the
//! offending values.

use ferrattn::device_api::ViewError;
use ferrattn::FerrattnError;
use ferrattn_core::CoreError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyType};
use thiserror::Error;

/// A mistake found at the Python boundary, before any kernel or emulation runs.
#[derive(Debug, Error)]
pub enum BoundaryError {
    /// The argument is not a DLPack capsule.
    #[error("{name} is not a DLPack tensor: got {got}")]
    NotDlpack { name: &'static str, got: String },
    /// A dtype outside the supported list.
    #[error("{name} has dtype {got}; expected {expected}")]
    DType {
        name: &'static str,
        got: String,
        expected: String,
    },
    /// Device type or ordinal.
    #[error("{name} {message}")]
    Device { name: &'static str, message: String },
    /// Rank or extents.
    #[error("{name} {message}")]
    Shape { name: &'static str, message: String },
    /// Strides, buffer length, read-only or overlapping outputs.
    #[error("{name} {message}")]
    Layout { name: &'static str, message: String },
    /// A data pointer not aligned to what its reader needs.
    #[error("{name} starts at address {ptr:#x}, which is not a multiple of {align} bytes ({why})")]
    Misaligned {
        name: &'static str,
        ptr: usize,
        align: usize,
        why: &'static str,
    },
    /// A page table that points outside the pool or does not cover a sequence.
    #[error("{0}")]
    PageTable(String),
    /// A configuration no backend covers, or a call in the wrong order.
    #[error("{0}")]
    Unsupported(String),
    /// An error of the Rust library.
    #[error(transparent)]
    Library(#[from] FerrattnError),
}

impl From<ViewError> for BoundaryError {
    fn from(e: ViewError) -> BoundaryError {
        BoundaryError::Library(FerrattnError::View(e))
    }
}

impl From<CoreError> for BoundaryError {
    fn from(e: CoreError) -> BoundaryError {
        BoundaryError::Library(FerrattnError::Core(e))
    }
}

/// The exception classes, made once at import as `type(name, (Error, builtin), {})`.
pub const CLASSES: [(&str, &str, &str); 8] = [
    (
        "ShapeError",
        "ValueError",
        "A tensor's rank or extents disagree with the others or with the call.",
    ),
    (
        "LayoutError",
        "ValueError",
        "Strides, alignment, buffer length or writability a kernel cannot take.",
    ),
    (
        "DTypeError",
        "TypeError",
        "A dtype outside the supported list, or tensors of one call with different dtypes.",
    ),
    (
        "DeviceError",
        "ValueError",
        "A tensor on an unsupported device, or tensors of one call on different devices.",
    ),
    (
        "PageTableError",
        "ValueError",
        "A page index outside the pool, or a sequence longer than the pages it was given.",
    ),
    (
        "InvalidValueError",
        "ValueError",
        "A non-finite input or an out-of-range scalar argument.",
    ),
    (
        "UnsupportedError",
        "ValueError",
        "A configuration (algorithm, backend, head dim, ...) outside the support matrix.",
    ),
    (
        "BackendError",
        "RuntimeError",
        "A backend that cannot run here, or that failed while running.",
    ),
];

/// Creates `Error` and its subclasses in `m`.
pub fn register(py: Python<'_>, m: &Bound<'_, PyModule>) -> PyResult<()> {
    let builtins = py.import("builtins")?;
    let type_ = builtins.getattr("type")?;
    let make = |name: &str, bases: Bound<'_, PyTuple>, doc: &str| -> PyResult<Py<PyAny>> {
        let dict = PyDict::new(py);
        dict.set_item("__doc__", doc)?;
        dict.set_item("__module__", "ferrattn")?;
        Ok(type_.call1((name, bases, dict))?.unbind())
    };
    let base = make(
        "Error",
        PyTuple::new(py, [builtins.getattr("Exception")?])?,
        "Base class of every error ferrattn raises.",
    )?
    .into_bound(py);
    m.add("Error", &base)?;
    for (name, builtin, doc) in CLASSES {
        let cls = make(
            name,
            PyTuple::new(py, [base.clone(), builtins.getattr(builtin)?])?,
            doc,
        )?;
        m.add(name, cls)?;
    }
    Ok(())
}

fn class_of(e: &BoundaryError) -> &'static str {
    match e {
        BoundaryError::NotDlpack { .. } => "DTypeError",
        BoundaryError::DType { .. } => "DTypeError",
        BoundaryError::Device { .. } => "DeviceError",
        BoundaryError::Shape { .. } => "ShapeError",
        BoundaryError::Layout { .. } | BoundaryError::Misaligned { .. } => "LayoutError",
        BoundaryError::PageTable(_) => "PageTableError",
        BoundaryError::Unsupported(_) => "UnsupportedError",
        BoundaryError::Library(l) => library_class(l),
    }
}

fn core_class(e: &CoreError) -> &'static str {
    match e {
        CoreError::Shape { .. } | CoreError::HeadRatio { .. } | CoreError::BadLength { .. } => {
            "ShapeError"
        }
        CoreError::DTypeMismatch { .. } => "DTypeError",
        CoreError::NonFinite { .. } | CoreError::BadValue { .. } => "InvalidValueError",
        CoreError::TooLarge { .. } => "UnsupportedError",
        CoreError::Unsupported { .. } | CoreError::InvalidPlan(_) => "UnsupportedError",
        CoreError::Io(_) => "BackendError",
    }
}

fn library_class(e: &FerrattnError) -> &'static str {
    match e {
        FerrattnError::Core(c) => core_class(c),
        FerrattnError::Cpu(ferrattn_cpu::CpuError::Core(c)) => core_class(c),
        FerrattnError::NotSupported { .. } => "UnsupportedError",
        FerrattnError::View(v) => view_class(v),
        FerrattnError::PlanMismatch(_) => "ShapeError",
        FerrattnError::Cuda(ferrattn_cuda::CudaError::Unsupported { .. }) => "UnsupportedError",
        _ => "BackendError",
    }
}

fn view_class(e: &ViewError) -> &'static str {
    match e {
        ViewError::StridesRank { .. }
        | ViewError::Rank { .. }
        | ViewError::Shape { .. }
        | ViewError::Length { .. } => "ShapeError",
        ViewError::ShortBuffer { .. }
        | ViewError::NotContiguous { .. }
        | ViewError::Misaligned { .. }
        | ViewError::Workspace { .. } => "LayoutError",
        ViewError::DType { .. } => "DTypeError",
        ViewError::Device { .. } => "DeviceError",
        ViewError::PageOutOfPool { .. }
        | ViewError::SequenceLongerThanPages { .. }
        | ViewError::SequenceLongerThanCache { .. }
        | ViewError::PageTableLength { .. }
        | ViewError::PageSize { .. } => "PageTableError",
    }
}

impl From<BoundaryError> for PyErr {
    fn from(e: BoundaryError) -> PyErr {
        let name = class_of(&e);
        let msg = e.to_string();
        Python::attach(|py| {
            let cls = py
                .import("ferrattn._ferrattn")
                .and_then(|m| m.getattr(name))
                .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
            match cls {
                Ok(cls) => PyErr::from_type(cls, msg),
                Err(_) => pyo3::exceptions::PyValueError::new_err(msg),
            }
        })
    }
}

/// Result alias of the binding.
pub type Result<T, E = BoundaryError> = std::result::Result<T, E>;
