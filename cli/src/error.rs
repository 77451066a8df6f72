//! The command line's error: the facade's errors plus those of reading and running a model file
//! (`crate::model`), which an engine embedding the facade never meets.

use crate::model::ModelError;
use ferrattn::{CoreError, FerrattnError};
use thiserror::Error;

/// Errors of the command line and its library half.
#[derive(Debug, Error)]
pub enum CliError {
    /// An error of the facade: validation, planning, a backend, a file.
    #[error(transparent)]
    Ferrattn(#[from] FerrattnError),
    /// Reading or running a model (`ferrattn_cli::model`).
    #[error("model: {0}")]
    Model(#[from] ModelError),
}

impl From<CoreError> for CliError {
    fn from(e: CoreError) -> CliError {
        CliError::Ferrattn(e.into())
    }
}

/// Result alias of the model runner and the commands that use it.
pub type Result<T, E = CliError> = std::result::Result<T, E>;
