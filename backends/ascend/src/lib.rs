//! `ferrattn-ascend`: AMLA MLA decode on Huawei Ascend NPUs.
pub mod config;
pub mod error;
pub mod sim;
pub use error::{AscendError, Result};
