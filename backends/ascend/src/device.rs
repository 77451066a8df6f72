//! Finding and opening AscendCL at run time, and the backend value the facade holds.
//!
//! `libascendcl.so` is opened with `libloading` from, in order: `FERRATTN_ASCENDCL_LIB` (a full
//! path), `$ASCEND_TOOLKIT_HOME/lib64`, `$ASCEND_HOME_PATH/lib64`,
//! `/usr/local/Ascend/ascend-toolkit/latest/lib64`, then the bare name (the dynamic loader's
//! `LD_LIBRARY_PATH` search). Every entry point is resolved up front, so a library that lacks one
//! is reported as [`AscendError::MissingSymbol`] before any call is made.

use crate::acl::*;
use crate::kernels::KernelBinary;
use crate::{AscendError, Result};
use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};

/// Resolved AscendCL entry points. Holding the `Library` keeps the pointers valid.
pub struct AclLibrary {
    /// Where it was loaded from.
    pub path: String,
    _lib: libloading::Library,
    pub(crate) init: AclInit,
    pub(crate) finalize: AclFinalize,
    pub(crate) recent_err: AclGetRecentErrMsg,
    pub(crate) device_count: AclrtGetDeviceCount,
    pub(crate) set_device: AclrtSetDevice,
    pub(crate) reset_device: AclrtResetDevice,
    pub(crate) create_stream: AclrtCreateStream,
    pub(crate) destroy_stream: AclrtDestroyStream,
    pub(crate) malloc: AclrtMalloc,
    pub(crate) free: AclrtFree,
    pub(crate) memcpy: AclrtMemcpy,
    pub(crate) memset: AclrtMemset,
    pub(crate) sync_stream: AclrtSynchronizeStream,
    pub(crate) binary_load: AclrtBinaryLoadFromData,
    pub(crate) binary_unload: AclrtBinaryUnLoad,
    pub(crate) get_function: AclrtBinaryGetFunction,
    pub(crate) args_init: AclrtKernelArgsInit,
    pub(crate) args_append: AclrtKernelArgsAppend,
    pub(crate) args_finalize: AclrtKernelArgsFinalize,
    pub(crate) launch: AclrtLaunchKernelWithConfig,
    pub(crate) sync_addr: AclrtGetHardwareSyncAddr,
    pub(crate) device_info: AclrtGetDeviceInfo,
    /// The symbols resolved, in order (the same list as [`crate::acl::ENTRY_POINTS`]).
    pub resolved: Vec<&'static str>,
}

/// Candidate locations of `libascendcl.so`, most specific first.
pub fn library_candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os("FERRATTN_ASCENDCL_LIB") {
        v.push(PathBuf::from(p));
    }
    for var in ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            v.push(PathBuf::from(p).join("lib64/libascendcl.so"));
        }
    }
    v.push(PathBuf::from(
        "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so",
    ));
    v.push(PathBuf::from("libascendcl.so"));
    v
}

impl AclLibrary {
    /// Opens the first candidate that loads.
    pub fn open_default() -> Result<AclLibrary> {
        AclLibrary::open_first(&library_candidates())
    }

    /// Opens the first of `candidates` that loads; a library missing a symbol is an error, not
    /// a reason to try the next one (it is the library the system would use).
    pub fn open_first(candidates: &[PathBuf]) -> Result<AclLibrary> {
        let mut last = String::from("no candidates");
        for c in candidates {
            // a bare name goes to the dynamic loader's search; a path must exist
            if c.components().count() > 1 && !c.exists() {
                last = format!("{} does not exist", c.display());
                continue;
            }
            match AclLibrary::open(c) {
                Err(AscendError::LibraryNotFound { reason, .. }) => last = reason,
                other => return other,
            }
        }
        Err(AscendError::LibraryNotFound {
            tried: candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            reason: last,
        })
    }

    /// Opens one library file and resolves every entry point.
    pub fn open(path: &Path) -> Result<AclLibrary> {
        let name = path.display().to_string();
        // SAFETY: loading a shared library runs its initialisers; libascendcl's are the vendor's.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
            AscendError::LibraryNotFound {
                tried: name.clone(),
                reason: e.to_string(),
            }
        })?;
        let mut resolved = Vec::new();
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                resolved.push($name);
                // SAFETY: the symbol is declared with AscendCL's documented C signature ($ty).
                let s: std::result::Result<libloading::Symbol<$ty>, _> =
                    unsafe { lib.get($name.as_bytes()) };
                match s {
                    Ok(s) => *s,
                    Err(e) => {
                        return Err(AscendError::MissingSymbol {
                            library: name.clone(),
                            symbol: $name,
                            reason: e.to_string(),
                        })
                    }
                }
            }};
        }
        Ok(AclLibrary {
            path: name.clone(),
            init: sym!("aclInit", AclInit),
            finalize: sym!("aclFinalize", AclFinalize),
            recent_err: sym!("aclGetRecentErrMsg", AclGetRecentErrMsg),
            device_count: sym!("aclrtGetDeviceCount", AclrtGetDeviceCount),
            set_device: sym!("aclrtSetDevice", AclrtSetDevice),
            reset_device: sym!("aclrtResetDevice", AclrtResetDevice),
            create_stream: sym!("aclrtCreateStream", AclrtCreateStream),
            destroy_stream: sym!("aclrtDestroyStream", AclrtDestroyStream),
            malloc: sym!("aclrtMalloc", AclrtMalloc),
            free: sym!("aclrtFree", AclrtFree),
            memcpy: sym!("aclrtMemcpy", AclrtMemcpy),
            memset: sym!("aclrtMemset", AclrtMemset),
            sync_stream: sym!("aclrtSynchronizeStream", AclrtSynchronizeStream),
            binary_load: sym!("aclrtBinaryLoadFromData", AclrtBinaryLoadFromData),
            binary_unload: sym!("aclrtBinaryUnLoad", AclrtBinaryUnLoad),
            get_function: sym!("aclrtBinaryGetFunction", AclrtBinaryGetFunction),
            args_init: sym!("aclrtKernelArgsInit", AclrtKernelArgsInit),
            args_append: sym!("aclrtKernelArgsAppend", AclrtKernelArgsAppend),
            args_finalize: sym!("aclrtKernelArgsFinalize", AclrtKernelArgsFinalize),
            launch: sym!("aclrtLaunchKernelWithConfig", AclrtLaunchKernelWithConfig),
            sync_addr: sym!("aclrtGetHardwareSyncAddr", AclrtGetHardwareSyncAddr),
            device_info: sym!("aclrtGetDeviceInfo", AclrtGetDeviceInfo),
            resolved,
            _lib: lib,
        })
    }

    /// Turns an `aclError` into a typed error carrying the API name, code and recent message.
    pub(crate) fn check(&self, api: &'static str, code: aclError) -> Result<()> {
        if code == ACL_SUCCESS {
            return Ok(());
        }
        // SAFETY: aclGetRecentErrMsg returns null or a NUL-terminated thread-local string.
        let msg = unsafe {
            let p = (self.recent_err)();
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        };
        Err(AscendError::Acl {
            api,
            code,
            message: msg,
        })
    }
}

/// An initialised NPU: AscendCL up, device set, one stream, the AMLA kernel loaded.
pub struct NpuContext {
    pub(crate) acl: AclLibrary,
    pub(crate) device_id: i32,
    pub(crate) stream: aclrtStream,
    pub(crate) kernel: crate::kernels::LoadedKernel,
    /// AI Cores of the device (`ACL_DEV_ATTR_AICORE_CORE_NUM`): the kernel's block dim bound.
    pub(crate) ai_cores: usize,
    /// Device name for provenance.
    pub name: String,
}

// SAFETY: the stream and handles are only used behind `&self` calls that AscendCL documents as
// thread-safe per stream; the backend serialises launches with a mutex.
unsafe impl Send for NpuContext {}
unsafe impl Sync for NpuContext {}

impl NpuContext {
    /// Brings up AscendCL on `device_id` and loads the kernel binary.
    pub fn open(acl: AclLibrary, device_id: i32, kernel: &KernelBinary) -> Result<NpuContext> {
        // SAFETY: documented AscendCL calls with valid out-pointers.
        unsafe {
            acl.check("aclInit", (acl.init)(std::ptr::null()))?;
            let mut count = 0u32;
            if let Err(e) = acl.check("aclrtGetDeviceCount", (acl.device_count)(&mut count)) {
                (acl.finalize)();
                return Err(e);
            }
            if count == 0 || device_id < 0 || device_id as u32 >= count {
                (acl.finalize)();
                return Err(AscendError::NoDevice { count });
            }
            let fail = |acl: &AclLibrary, e: AscendError, device: bool| {
                if device {
                    (acl.reset_device)(device_id);
                }
                (acl.finalize)();
                e
            };
            if let Err(e) = acl.check("aclrtSetDevice", (acl.set_device)(device_id)) {
                return Err(fail(&acl, e, false));
            }
            let mut stream: aclrtStream = std::ptr::null_mut();
            if let Err(e) = acl.check("aclrtCreateStream", (acl.create_stream)(&mut stream)) {
                return Err(fail(&acl, e, true));
            }
            let mut ai_cores = 0i64;
            if let Err(e) = acl.check(
                "aclrtGetDeviceInfo",
                (acl.device_info)(
                    device_id as u32,
                    ACL_DEV_ATTR_AICORE_CORE_NUM,
                    &mut ai_cores,
                ),
            ) {
                (acl.destroy_stream)(stream);
                return Err(fail(&acl, e, true));
            }
            let loaded = match crate::kernels::LoadedKernel::load(&acl, kernel) {
                Ok(k) => k,
                Err(e) => {
                    (acl.destroy_stream)(stream);
                    return Err(fail(&acl, e, true));
                }
            };
            Ok(NpuContext {
                acl,
                device_id,
                stream,
                kernel: loaded,
                ai_cores: ai_cores.max(1) as usize,
                name: format!("Ascend NPU {device_id}"),
            })
        }
    }

    pub(crate) fn malloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; size > 0 enforced below.
        unsafe {
            self.acl.check(
                "aclrtMalloc",
                (self.acl.malloc)(&mut p, bytes.max(32), ACL_MEM_MALLOC_HUGE_FIRST),
            )?
        };
        Ok(DeviceBuffer {
            ctx: self,
            ptr: p,
            bytes: bytes.max(32),
        })
    }
}

impl Drop for NpuContext {
    fn drop(&mut self) {
        // SAFETY: handles created in `open`; errors at teardown have nowhere to go.
        unsafe {
            (self.acl.binary_unload)(self.kernel.bin);
            (self.acl.destroy_stream)(self.stream);
            (self.acl.reset_device)(self.device_id);
            (self.acl.finalize)();
        }
    }
}

/// A device allocation freed on drop.
pub(crate) struct DeviceBuffer<'a> {
    ctx: &'a NpuContext,
    pub(crate) ptr: *mut c_void,
    pub(crate) bytes: usize,
}

impl DeviceBuffer<'_> {
    pub(crate) fn upload(&self, data: &[u8]) -> Result<()> {
        // SAFETY: `data.len() <= self.bytes` is checked by AscendCL through destMax.
        unsafe {
            self.ctx.acl.check(
                "aclrtMemcpy",
                (self.ctx.acl.memcpy)(
                    self.ptr,
                    self.bytes,
                    data.as_ptr().cast(),
                    data.len(),
                    ACL_MEMCPY_HOST_TO_DEVICE,
                ),
            )
        }
    }

    pub(crate) fn zero(&self) -> Result<()> {
        // SAFETY: the whole allocation.
        unsafe {
            self.ctx.acl.check(
                "aclrtMemset",
                (self.ctx.acl.memset)(self.ptr, self.bytes, 0, self.bytes),
            )
        }
    }

    pub(crate) fn download(&self, out: &mut [u8]) -> Result<()> {
        // SAFETY: `out` is a host buffer of `out.len()` bytes, at most the allocation.
        unsafe {
            self.ctx.acl.check(
                "aclrtMemcpy",
                (self.ctx.acl.memcpy)(
                    out.as_mut_ptr().cast(),
                    out.len(),
                    self.ptr,
                    out.len(),
                    ACL_MEMCPY_DEVICE_TO_HOST,
                ),
            )
        }
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by aclrtMalloc in `NpuContext::malloc`.
        unsafe {
            (self.ctx.acl.free)(self.ptr);
        }
    }
}
