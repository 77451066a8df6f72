//! The core's error type. Every message carries the offending values.

use thiserror::Error;

/// Errors raised by validation, planning and the emulations of `ferrattn-core`.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CoreError {
    /// A tensor has the wrong rank or extent.
    #[error("{tensor} has shape {actual:?} but {expected}")]
    Shape {
        /// Which tensor (`q`, `k`, `v`, `kv`, `seqlens_k`, ...).
        tensor: &'static str,
        /// Its actual shape.
        actual: Vec<usize>,
        /// What was expected, in words with numbers.
        expected: String,
    },
    /// Two inputs disagree on element type.
    #[error(
        "{tensor} is {actual} but {expected_from} is {expected}; all inputs must share one dtype"
    )]
    DTypeMismatch {
        /// The tensor with the odd dtype.
        tensor: &'static str,
        /// Its dtype.
        actual: crate::DType,
        /// The tensor the dtype was taken from.
        expected_from: &'static str,
        /// The dtype it should have had.
        expected: crate::DType,
    },
    /// Query heads are not a multiple of key/value heads.
    #[error("k has {heads_kv} heads but q has {heads_q}; q heads must be a positive multiple of k heads")]
    HeadRatio {
        /// Query heads.
        heads_q: usize,
        /// Key/value heads.
        heads_kv: usize,
    },
    /// A dimension or length is zero or negative where that is not allowed.
    #[error("{what} is {value}; it must be {requirement}")]
    BadLength {
        /// The dimension or length, e.g. `seqlens_k[3]`.
        what: String,
        /// The value given.
        value: i64,
        /// The constraint, e.g. `between 0 and 4096 (the k tensor's seq extent)`.
        requirement: String,
    },
    /// A real-valued setting is NaN, infinite or out of its range.
    #[error("{what} is {value}; it must be {requirement}")]
    BadValue {
        /// The setting, e.g. `softmax_scale`.
        what: String,
        /// The value given, as printed (`NaN`, `inf`, `-0.5`).
        value: String,
        /// The constraint.
        requirement: String,
    },
    /// Buffers larger than the target can hold: refused before anything is allocated.
    #[error("{what} needs {bytes_needed} bytes but {available}")]
    TooLarge {
        /// What would have been allocated, with its shape.
        what: String,
        /// Bytes it needs (saturating at `u128::MAX` only for shapes whose element count overflows).
        bytes_needed: u128,
        /// What the target offers, in words with numbers.
        available: String,
    },
    /// An input contains NaN or infinity.
    #[error(
        "{tensor} holds a non-finite value ({value}) at flat index {index}; inputs must be finite"
    )]
    NonFinite {
        /// Which tensor.
        tensor: &'static str,
        /// Flat row-major index of the first offending element.
        index: usize,
        /// The value found.
        value: f32,
    },
    /// A configuration no implementation covers.
    #[error("unsupported {what}; supported: {supported}")]
    Unsupported {
        /// What was asked for, with its value.
        what: String,
        /// The closed list that is supported.
        supported: String,
    },
    /// A plan does not fit the target or contradicts itself.
    #[error("plan rejected: {0}")]
    InvalidPlan(String),
    /// A file or serialisation problem.
    #[error("{0}")]
    Io(String),
}

/// Result alias of the core.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;
