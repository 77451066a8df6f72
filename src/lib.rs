//! ferrattn: one Rust API for four published attention algorithms on CPU, CUDA and Ascend.
//!
//! **The device path** ([`device_api`]): attention on device memory and a stream the caller
//! owns, planned once per decode step and launched per layer with no allocation, copy or host
//! synchronisation (CUDA-graph capturable). Lean decode over a paged fp16 KV cache:
//!
//! ```no_run
//! use ferrattn::device_api::{
//!     contiguous_strides, DecodePlan, DecodeShape, DecodeViews, KvCache, LeanDecoder,
//!     LeanSchedule, Stream, TensorView, Workspace,
//! };
//! use ferrattn::DType;
//! use cudarc::driver::{CudaContext, CudaSlice, DevicePtr};
//! // device memory from the engine's allocator: here cudarc (cudaMalloc, torch's caching
//! // allocator, ... work the same); the buffers live as long as `buffers`
//! let cu = CudaContext::new(0)?.default_stream();
//! let mut buffers: Vec<CudaSlice<u8>> = Vec::new();
//! let mut device_alloc = |bytes: usize| -> Result<u64, Box<dyn std::error::Error>> {
//!     let buf = cu.alloc_zeros::<u8>(bytes)?;
//!     let addr = buf.device_ptr(&cu).0;
//!     buffers.push(buf);
//!     Ok(addr)
//! };
//! let (batch, heads_q, heads_kv, d, page, pages) = (4, 32, 8, 128, 16, 4096);
//! let gpu = LeanDecoder::new(0)?;
//! let shape = DecodeShape {
//!     batch, query_len: 1, heads_q, heads_kv, head_dim: d,
//!     dtype: DType::F16, causal: false, softmax_scale: None,
//! };
//! // this step's lengths (counting the new token) and page table, on the host
//! let lens = [1000, 37, 4097, 577];
//! let max_pages = 512;
//! let table: Vec<i32> = (0..(batch * max_pages) as i32).map(|i| i % pages as i32).collect();
//! let kv = KvCache::Paged { page_size: page, num_pages: pages, max_pages, page_table: &table };
//! let plan = DecodePlan::new(&shape, &gpu.caps()?, &lens, kv, 1, LeanSchedule::StreamK)?;
//! let mut view = |shape: &[usize], dtype: DType| -> Result<TensorView, Box<dyn std::error::Error>> {
//!     let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
//!     let addr = device_alloc(bytes)?;
//!     // SAFETY: `bytes` bytes of device 0 memory that outlive the work enqueued on them
//!     Ok(unsafe { TensorView::cuda(addr, bytes, 0, dtype, shape, &contiguous_strides(shape)) }?)
//! };
//! let q = view(&[batch, 1, heads_q, d], DType::F16)?;
//! let (k_new, v_new) = (view(&[batch, 1, heads_kv, d], DType::F16)?, view(&[batch, 1, heads_kv, d], DType::F16)?);
//! let (k, v) = (view(&[pages, page, heads_kv, d], DType::F16)?, view(&[pages, page, heads_kv, d], DType::F16)?);
//! let o = view(&[batch, 1, heads_q, d], DType::F16)?;
//! let lse = view(&[batch, heads_q, 1], DType::F32)?;
//! // SAFETY: the allocation holds `workspace_bytes()` bytes of device 0
//! let ws_addr = device_alloc(plan.workspace_bytes())?;
//! let mut ws = unsafe { Workspace::cuda(ws_addr, plan.workspace_bytes(), 0) };
//! let stream = Stream::LEGACY_DEFAULT; // or the engine's stream: unsafe { Stream::from_raw(..) }
//! let step = gpu.begin_step(&plan, &mut ws, stream)?; // one small table upload per step
//! for _layer in 0..32 {
//!     step.append(&k_new, &v_new, &k, &v, stream)?; // the step's new token into the cache
//!     step.run(&DecodeViews { q: &q, k: &k, v: &v, o: &o, lse: &lse }, stream)?;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **The host path**: [`Runtime`] on host tensors, for every algorithm and backend.
//!
//! ```no_run
//! use ferrattn::{Algorithm, AttentionInputs, AttentionOptions, BackendChoice, DType, Runtime, Tensor};
//! let mut rng = rand::thread_rng();
//! let q = Tensor::randn(&[1, 1, 8, 64], DType::F16, 1.0, &mut rng);
//! let k = Tensor::randn(&[1, 1000, 2, 64], DType::F16, 1.0, &mut rng);
//! let v = Tensor::randn(&[1, 1000, 2, 64], DType::F16, 1.0, &mut rng);
//! let x = AttentionInputs::new(q, k, v);
//! let problem = x.problem(AttentionOptions::default(), None)?;
//! let sel = Runtime::select(BackendChoice::Auto, Algorithm::Lean)?;
//! let plan = sel.runtime.plan(Algorithm::Lean, &problem)?;
//! let out = sel.runtime.run(&plan, &x)?;
//! # Ok::<(), ferrattn::FerrattnError>(())
//! ```
//!
//! The work is split as FlashInfer splits it: [`Runtime::plan`] is pure and host-side and
//! returns a serialisable [`AttentionPlan`]; [`Runtime::run`] executes it.

pub mod device_api;
pub mod error;
pub mod runtime;

pub use error::{FerrattnError, Result};
pub use ferrattn_core::*;
pub use runtime::{devices, BackendChoice, DeviceReport, Runtime, Selection};

/// The git commit this binary was built from (`unknown` outside a git checkout).
pub const GIT_COMMIT: &str = env!("FERRATTN_GIT_COMMIT");
