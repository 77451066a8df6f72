//! The CUDA device: driver loading, the primary context, one stream, memory and events.
//!
//! Everything goes through the driver API loaded at run time (`cudarc` with `dynamic-loading`),
//! so this crate builds and its host tests run on machines with no NVIDIA driver; there,
//! [`Gpu::open`] returns [`CudaError::Unavailable`] before any driver symbol is touched.

use crate::error::{check, CudaError, Result};
use cudarc::driver::sys;
use ferrattn_core::{BackendKind, DeviceCaps};
use std::sync::Arc;

/// Oldest compute capability the kernels run on (cp.async, `cvt.rn.bf16.f32`).
pub const MIN_COMPUTE_CAPABILITY: (u32, u32) = (8, 0);

/// An opened GPU: primary context and a non-blocking stream. Handles are usable from any thread
/// while the context is bound ([`Gpu::bind`]); every public entry point binds it for its own
/// duration and then gives the calling thread back the context it had, so a framework sharing
/// the thread (torch, jax) never finds its current device moved.
#[derive(Debug)]
pub struct Gpu {
    pub(crate) ordinal: usize,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    pub(crate) stream: sys::CUstream,
    /// Planner view of the device, read from the driver.
    pub caps: DeviceCaps,
    /// `cuDriverGetVersion`, e.g. 13000.
    pub driver_version: i32,
}

// SAFETY: CUDA driver handles are process-wide; the context is bound per call on whatever thread.
unsafe impl Send for Gpu {}
// SAFETY: as above; mutation of device state goes through the stream in call order.
unsafe impl Sync for Gpu {}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0i32;
    // SAFETY: plain out-parameter query on a valid device handle.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, a, dev)
    })?;
    Ok(v)
}

/// Peak DRAM bandwidth from the memory clock (kHz) and bus width (bits), double data rate;
/// `None` when the driver does not report them (the attributes are legacy; the planner then keeps
/// its default grid rules).
fn dram_bandwidth(dev: sys::CUdevice) -> Option<u64> {
    use sys::CUdevice_attribute as A;
    let khz = attr(dev, A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).ok()?;
    let bits = attr(dev, A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).ok()?;
    (khz > 0 && bits > 0).then(|| 2 * khz as u64 * 1000 * (bits as u64 / 8))
}

impl Gpu {
    /// Opens GPU `ordinal`, or says why it cannot.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::Unavailable {
                reason:
                    "libcuda.so (the NVIDIA driver library) was not found by the dynamic loader"
                        .into(),
            });
        }
        let unavailable = |e: CudaError| match e {
            CudaError::Driver { api, name, code } => CudaError::Unavailable {
                reason: format!("{api} returned {name} ({code})"),
            },
            other => other,
        };
        // SAFETY: driver calls with valid out-parameters, in the documented order.
        unsafe {
            check("cuInit", sys::cuInit(0)).map_err(unavailable)?;
            let mut driver_version = 0;
            check(
                "cuDriverGetVersion",
                sys::cuDriverGetVersion(&mut driver_version),
            )?;
            let mut count = 0;
            check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count)).map_err(unavailable)?;
            if ordinal >= count as usize {
                return Err(CudaError::Unavailable {
                    reason: format!("GPU {ordinal} was asked for but the driver sees {count}"),
                });
            }
            let mut dev = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal as i32))?;
            let mut name = [0 as std::ffi::c_char; 256];
            check(
                "cuDeviceGetName",
                sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev),
            )?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned();
            use sys::CUdevice_attribute as A;
            let cc = (
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            );
            if cc < MIN_COMPUTE_CAPABILITY {
                return Err(CudaError::Unavailable {
                    reason: format!(
                        "{name} has compute capability {}.{}; the kernels need 8.0 or newer (cp.async, bf16)",
                        cc.0, cc.1
                    ),
                });
            }
            let caps = DeviceCaps {
                backend: BackendKind::Cuda,
                name: name.clone(),
                compute_units: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize,
                // the occupancy the Lean kernel is built for (cfg::kMinCtasPerSm in common.cuh);
                // every launch re-checks it with cuOccupancyMaxActiveBlocksPerMultiprocessor
                ctas_per_unit: crate::kernels::LEAN_CTAS_PER_SM,
                shared_mem_per_block: attr(
                    dev,
                    A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                )? as usize,
                l2_bytes: attr(dev, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
                compute_capability: Some(cc),
                dram_bytes_per_s: dram_bandwidth(dev),
            };
            let mut ctx = std::ptr::null_mut();
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
            let _bound = Bound::make_current(ctx)?;
            let mut stream = std::ptr::null_mut();
            check(
                "cuStreamCreate",
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                ),
            )?;
            Ok(Gpu {
                ordinal,
                dev,
                ctx,
                stream,
                caps,
                driver_version,
            })
        }
    }

    /// Makes this GPU's context current on the calling thread until the returned guard drops,
    /// which restores the thread's previous context (none, or another device's).
    pub fn bind(&self) -> Result<Bound> {
        Bound::make_current(self.ctx)
    }

    /// The backend's own non-blocking stream, for callers that enqueue work beside the
    /// backend's (tests, graph capture through the device path).
    pub fn raw_stream(&self) -> sys::CUstream {
        self.stream
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: valid stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }

    /// Waits for all work of the context, on every stream (the backend's and the caller's).
    pub fn synchronize_context(&self) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: no arguments; the context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let _bound = self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-parameters.
        check("cuMemGetInfo_v2", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free, total))
    }
}

/// A context made current for a scope. Dropping it gives the thread back the context that was
/// current before (a null one included), so ferrattn never changes which device a framework on
/// the same thread sees as current. Contexts are per thread: the guard is neither `Send` nor
/// `Sync`.
#[must_use = "the context is current only while the guard lives"]
#[derive(Debug)]
pub struct Bound {
    /// The caller's context, `None` when ours was already current (nothing to restore).
    previous: Option<sys::CUcontext>,
    _per_thread: std::marker::PhantomData<*const ()>,
}

impl Bound {
    fn make_current(ctx: sys::CUcontext) -> Result<Bound> {
        let mut previous = std::ptr::null_mut();
        // SAFETY: out-parameter query of the calling thread's current context.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut previous)
        })?;
        let previous = if previous == ctx {
            None
        } else {
            // SAFETY: ctx is a retained primary context.
            check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
            Some(previous)
        };
        Ok(Bound {
            previous,
            _per_thread: std::marker::PhantomData,
        })
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: `previous` was current on this thread when the guard was made (the guard
            // cannot leave the thread); null unbinds. A failure here cannot be reported.
            let _ = unsafe { sys::cuCtxSetCurrent(previous) };
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _bound = Bound::make_current(self.ctx);
        // SAFETY: handles created in open(); errors at teardown are ignored on purpose.
        unsafe {
            let _ = sys::cuStreamDestroy_v2(self.stream);
            let _ = sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// Device memory, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    gpu: Arc<Gpu>,
}

impl DeviceBuffer {
    /// Uninitialised device memory (at least one byte is allocated).
    pub fn alloc(gpu: &Arc<Gpu>, bytes: usize) -> Result<DeviceBuffer> {
        let _bound = gpu.bind()?;
        let mut ptr = 0;
        // SAFETY: out-parameter; size is positive.
        check("cuMemAlloc_v2", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, bytes.max(1))
        })?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            gpu: gpu.clone(),
        })
    }

    /// A copy of `data` (synchronous).
    pub fn from_slice<T: Copy>(gpu: &Arc<Gpu>, data: &[T]) -> Result<DeviceBuffer> {
        let bytes = std::mem::size_of_val(data);
        let b = DeviceBuffer::alloc(gpu, bytes)?;
        if bytes > 0 {
            let _bound = gpu.bind()?;
            // SAFETY: the buffer holds `bytes` bytes; the host slice is valid for reads.
            check("cuMemcpyHtoD_v2", unsafe {
                sys::cuMemcpyHtoD_v2(b.ptr, data.as_ptr() as *const std::ffi::c_void, bytes)
            })?;
            // a pageable copy may return before its DMA lands; kernels on our non-blocking
            // stream do not wait for the legacy stream, so finish it here
            // SAFETY: no arguments.
            check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        }
        Ok(b)
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Copies the whole buffer to the host as `T`s (synchronous with the stream).
    pub fn to_vec<T: Copy + Default>(&self) -> Result<Vec<T>> {
        let n = self.bytes / std::mem::size_of::<T>();
        let mut v = vec![T::default(); n];
        self.gpu.synchronize()?;
        if n > 0 {
            let _bound = self.gpu.bind()?;
            // SAFETY: v holds n * size_of::<T>() <= bytes bytes.
            check("cuMemcpyDtoH_v2", unsafe {
                sys::cuMemcpyDtoH_v2(
                    v.as_mut_ptr() as *mut std::ffi::c_void,
                    self.ptr,
                    n * std::mem::size_of::<T>(),
                )
            })?;
        }
        Ok(v)
    }

    /// Fills with a repeated 16-bit pattern (asynchronous on the stream).
    pub fn fill_u16(&mut self, value: u16) -> Result<()> {
        let _bound = self.gpu.bind()?;
        // SAFETY: bytes / 2 u16 elements lie in the allocation.
        check("cuMemsetD16Async", unsafe {
            sys::cuMemsetD16Async(self.ptr, value, self.bytes / 2, self.gpu.stream)
        })
    }

    /// Fills with a repeated 32-bit pattern (asynchronous on the stream).
    pub fn fill_u32(&mut self, value: u32) -> Result<()> {
        let _bound = self.gpu.bind()?;
        // SAFETY: bytes / 4 u32 elements lie in the allocation.
        check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(self.ptr, value, self.bytes / 4, self.gpu.stream)
        })
    }

    /// Copies `src` into this buffer on the stream; sizes and GPUs must match (a typed error
    /// otherwise).
    pub fn copy_from(&mut self, src: &DeviceBuffer) -> Result<()> {
        if self.bytes != src.bytes || self.gpu.ordinal != src.gpu.ordinal {
            return Err(CudaError::Plan(format!(
                "a device copy needs equal sizes on one GPU: {} bytes on GPU {} into {} bytes on GPU {}",
                src.bytes, src.gpu.ordinal, self.bytes, self.gpu.ordinal
            )));
        }
        let _bound = self.gpu.bind()?;
        // SAFETY: both allocations hold `bytes` bytes.
        check("cuMemcpyDtoDAsync_v2", unsafe {
            sys::cuMemcpyDtoDAsync_v2(self.ptr, src.ptr, self.bytes, self.gpu.stream)
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _bound = self.gpu.bind();
        // SAFETY: ptr came from cuMemAlloc_v2 in this context; a failure here cannot be reported.
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// A timing event on the GPU's stream.
#[derive(Debug)]
pub struct Event {
    ev: sys::CUevent,
    gpu: Arc<Gpu>,
}

impl Event {
    /// Records a new timing event on the stream now.
    pub fn record(gpu: &Arc<Gpu>) -> Result<Event> {
        let _bound = gpu.bind()?;
        let mut ev = std::ptr::null_mut();
        // SAFETY: out-parameter, then record on a valid stream.
        unsafe {
            check(
                "cuEventCreate",
                sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DEFAULT as u32),
            )?;
            check("cuEventRecord", sys::cuEventRecord(ev, gpu.stream))?;
        }
        Ok(Event {
            ev,
            gpu: gpu.clone(),
        })
    }

    /// Milliseconds from `self` to `end` (waits for `end`).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let _bound = self.gpu.bind()?;
        let mut ms = 0f32;
        // SAFETY: both events were recorded on this context's stream.
        unsafe {
            check("cuEventSynchronize", sys::cuEventSynchronize(end.ev))?;
            check(
                "cuEventElapsedTime_v2",
                sys::cuEventElapsedTime_v2(&mut ms, self.ev, end.ev),
            )?;
        }
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _bound = self.gpu.bind();
        // SAFETY: created in record().
        let _ = unsafe { sys::cuEventDestroy_v2(self.ev) };
    }
}

/// A CUDA graph captured from the GPU's stream (decode steps are replayed this way in serving
/// engines; the benchmark times both sides so, hiding launch gaps).
#[derive(Debug)]
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    gpu: Arc<Gpu>,
}

impl Graph {
    /// Captures what `record` enqueues on the stream (nothing runs during capture).
    pub fn capture(gpu: &Arc<Gpu>, record: impl FnOnce() -> Result<()>) -> Result<Graph> {
        let _bound = gpu.bind()?;
        // SAFETY: capture brackets on a valid stream; the graph handles are checked.
        unsafe {
            check(
                "cuStreamBeginCapture_v2",
                sys::cuStreamBeginCapture_v2(
                    gpu.stream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                ),
            )?;
            let recorded = record();
            let mut graph = std::ptr::null_mut();
            let end = check(
                "cuStreamEndCapture",
                sys::cuStreamEndCapture(gpu.stream, &mut graph),
            );
            recorded?;
            end?;
            let mut exec = std::ptr::null_mut();
            check(
                "cuGraphInstantiateWithFlags",
                sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            )?;
            Ok(Graph {
                graph,
                exec,
                gpu: gpu.clone(),
            })
        }
    }

    /// Enqueues one replay on the stream.
    pub fn launch(&self) -> Result<()> {
        let _bound = self.gpu.bind()?;
        // SAFETY: instantiated graph, valid stream.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, self.gpu.stream)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let _bound = self.gpu.bind();
        // SAFETY: handles created in capture().
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}
