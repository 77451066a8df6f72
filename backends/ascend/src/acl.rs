//! The subset of AscendCL this backend calls, declared by hand with the documented signatures
//! (CANN `acl/acl.h`, `acl/acl_rt.h`). Functions are not linked: [`crate::device::AclLibrary`]
//! resolves them from `libascendcl.so` at run time with `libloading`.
//!
//! When the crate is built with feature `bindgen` on a machine with the CANN headers, `build.rs`
//! generates bindings from `acl/acl.h` and [`signature_check`] makes the compiler compare every
//! type below with the generated one.

#![allow(non_camel_case_types)] // AscendCL's own type names

use std::ffi::{c_char, c_int, c_void};

/// `aclError`: 0 is `ACL_SUCCESS`.
pub type aclError = c_int;
/// `ACL_SUCCESS`.
pub const ACL_SUCCESS: aclError = 0;
/// `aclrtStream` (opaque).
pub type aclrtStream = *mut c_void;
/// `aclrtBinHandle` (opaque).
pub type aclrtBinHandle = *mut c_void;
/// `aclrtFuncHandle` (opaque).
pub type aclrtFuncHandle = *mut c_void;
/// `aclrtArgsHandle` (opaque).
pub type aclrtArgsHandle = *mut c_void;
/// `aclrtParamHandle` (opaque).
pub type aclrtParamHandle = *mut c_void;
/// `aclrtMemMallocPolicy`.
pub type aclrtMemMallocPolicy = c_int;
/// `ACL_MEM_MALLOC_HUGE_FIRST`.
pub const ACL_MEM_MALLOC_HUGE_FIRST: aclrtMemMallocPolicy = 0;
/// `aclrtMemcpyKind`.
pub type aclrtMemcpyKind = c_int;
/// `ACL_MEMCPY_HOST_TO_DEVICE`.
pub const ACL_MEMCPY_HOST_TO_DEVICE: aclrtMemcpyKind = 1;
/// `ACL_MEMCPY_DEVICE_TO_HOST`.
pub const ACL_MEMCPY_DEVICE_TO_HOST: aclrtMemcpyKind = 2;

/// `aclrtBinaryLoadOptions { aclrtBinaryLoadOption *options; size_t numOpt; }`; we pass none.
#[repr(C)]
pub struct aclrtBinaryLoadOptions {
    /// Option array (unused: null).
    pub options: *mut c_void,
    /// Number of options (0).
    pub num_opt: usize,
}

/// `aclError aclInit(const char *configPath)`.
pub type AclInit = unsafe extern "C" fn(config_path: *const c_char) -> aclError;
/// `aclError aclFinalize(void)`.
pub type AclFinalize = unsafe extern "C" fn() -> aclError;
/// `const char *aclGetRecentErrMsg(void)`.
pub type AclGetRecentErrMsg = unsafe extern "C" fn() -> *const c_char;
/// `aclError aclrtGetDeviceCount(uint32_t *count)`.
pub type AclrtGetDeviceCount = unsafe extern "C" fn(count: *mut u32) -> aclError;
/// `aclError aclrtSetDevice(int32_t deviceId)`.
pub type AclrtSetDevice = unsafe extern "C" fn(device_id: i32) -> aclError;
/// `aclError aclrtResetDevice(int32_t deviceId)`.
pub type AclrtResetDevice = unsafe extern "C" fn(device_id: i32) -> aclError;
/// `aclError aclrtCreateStream(aclrtStream *stream)`.
pub type AclrtCreateStream = unsafe extern "C" fn(stream: *mut aclrtStream) -> aclError;
/// `aclError aclrtDestroyStream(aclrtStream stream)`.
pub type AclrtDestroyStream = unsafe extern "C" fn(stream: aclrtStream) -> aclError;
/// `aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)`.
pub type AclrtMalloc = unsafe extern "C" fn(
    dev_ptr: *mut *mut c_void,
    size: usize,
    policy: aclrtMemMallocPolicy,
) -> aclError;
/// `aclError aclrtFree(void *devPtr)`.
pub type AclrtFree = unsafe extern "C" fn(dev_ptr: *mut c_void) -> aclError;
/// `aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)`.
pub type AclrtMemcpy = unsafe extern "C" fn(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
) -> aclError;
/// `aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)`.
pub type AclrtMemset = unsafe extern "C" fn(
    dev_ptr: *mut c_void,
    max_count: usize,
    value: i32,
    count: usize,
) -> aclError;
/// `aclError aclrtSynchronizeStream(aclrtStream stream)`.
pub type AclrtSynchronizeStream = unsafe extern "C" fn(stream: aclrtStream) -> aclError;
/// `aclError aclrtBinaryLoadFromData(const void *data, size_t length, const aclrtBinaryLoadOptions *options, aclrtBinHandle *binHandle)`.
pub type AclrtBinaryLoadFromData = unsafe extern "C" fn(
    data: *const c_void,
    length: usize,
    options: *const aclrtBinaryLoadOptions,
    bin_handle: *mut aclrtBinHandle,
) -> aclError;
/// `aclError aclrtBinaryUnLoad(aclrtBinHandle binHandle)`.
pub type AclrtBinaryUnLoad = unsafe extern "C" fn(bin_handle: aclrtBinHandle) -> aclError;
/// `aclError aclrtBinaryGetFunction(const aclrtBinHandle binHandle, const char *kernelName, aclrtFuncHandle *funcHandle)`.
pub type AclrtBinaryGetFunction = unsafe extern "C" fn(
    bin_handle: aclrtBinHandle,
    kernel_name: *const c_char,
    func_handle: *mut aclrtFuncHandle,
) -> aclError;
/// `aclError aclrtKernelArgsInit(aclrtFuncHandle funcHandle, aclrtArgsHandle *argsHandle)`.
pub type AclrtKernelArgsInit = unsafe extern "C" fn(
    func_handle: aclrtFuncHandle,
    args_handle: *mut aclrtArgsHandle,
) -> aclError;
/// `aclError aclrtKernelArgsAppend(aclrtArgsHandle argsHandle, void *param, size_t paramSize, aclrtParamHandle *paramHandle)`.
pub type AclrtKernelArgsAppend = unsafe extern "C" fn(
    args_handle: aclrtArgsHandle,
    param: *mut c_void,
    param_size: usize,
    param_handle: *mut aclrtParamHandle,
) -> aclError;
/// `aclError aclrtKernelArgsFinalize(aclrtArgsHandle argsHandle)`.
pub type AclrtKernelArgsFinalize = unsafe extern "C" fn(args_handle: aclrtArgsHandle) -> aclError;
/// `aclError aclrtLaunchKernelWithConfig(aclrtFuncHandle funcHandle, uint32_t blockDim, aclrtStream stream, aclrtLaunchKernelCfg *cfg, aclrtArgsHandle argsHandle, void *reserve)`.
pub type AclrtLaunchKernelWithConfig = unsafe extern "C" fn(
    func_handle: aclrtFuncHandle,
    block_dim: u32,
    stream: aclrtStream,
    cfg: *mut c_void,
    args_handle: aclrtArgsHandle,
    reserve: *mut c_void,
) -> aclError;

#[cfg(ferrattn_acl_bindgen)]
#[allow(non_upper_case_globals, non_snake_case, dead_code, clippy::all)] // generated code
mod generated {
    include!(concat!(env!("OUT_DIR"), "/acl_bindings.rs"));
}

/// Compile-time comparison of the hand-written signatures with bindgen's (never called).
#[cfg(ferrattn_acl_bindgen)]
#[allow(dead_code)] // exists for its type checks
fn signature_check() {
    let _: AclInit = generated::aclInit;
    let _: AclFinalize = generated::aclFinalize;
    let _: AclrtGetDeviceCount = generated::aclrtGetDeviceCount;
    let _: AclrtSetDevice = generated::aclrtSetDevice;
    let _: AclrtMalloc = generated::aclrtMalloc;
    let _: AclrtFree = generated::aclrtFree;
    let _: AclrtSynchronizeStream = generated::aclrtSynchronizeStream;
}
