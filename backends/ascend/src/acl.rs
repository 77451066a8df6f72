//! The subset of AscendCL this backend calls, declared by hand with the documented signatures
//! (CANN `acl/acl.h`, `acl/acl_rt.h`). Functions are not linked: [`crate::device::AclLibrary`]
//! resolves them from `libascendcl.so` at run time with `libloading`.
//!
//! When the crate is built with feature `bindgen` against the real headers (a CANN toolkit, or
//! only the headers: `FERRATTN_ACL_INCLUDE`, as CI does with the `torch-npu` 2.14.0 wheel's
//! `torch_npu/include/third_party/acl/inc`), `build.rs` generates bindings from `acl/acl.h`; the
//! test `checked_in_module_matches_bindgen` then makes the compiler compare the type of every
//! entry point [`crate::device::AclLibrary`] resolves with the generated declaration, and compares
//! the enum constants by value. The two parameter structs are then the generated ones.

#![allow(non_camel_case_types, non_snake_case)] // AscendCL's own type and field names

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
/// `aclrtMemMallocPolicy`, a C enum: `unsigned int` in the Linux ABI (bindgen's `u32`).
pub type aclrtMemMallocPolicy = u32;
/// `ACL_MEM_MALLOC_HUGE_FIRST`.
pub const ACL_MEM_MALLOC_HUGE_FIRST: aclrtMemMallocPolicy = 0;
/// `aclrtMemcpyKind`, a C enum (`u32`).
pub type aclrtMemcpyKind = u32;
/// `ACL_MEMCPY_HOST_TO_DEVICE`.
pub const ACL_MEMCPY_HOST_TO_DEVICE: aclrtMemcpyKind = 1;
/// `ACL_MEMCPY_DEVICE_TO_HOST`.
pub const ACL_MEMCPY_DEVICE_TO_HOST: aclrtMemcpyKind = 2;

/// `aclrtBinaryLoadOptions { aclrtBinaryLoadOption *options; size_t numOpt; }`; we pass none.
#[cfg(not(ferrattn_acl_bindgen))]
#[repr(C)]
pub struct aclrtBinaryLoadOptions {
    /// Option array (unused: null).
    pub options: *mut c_void,
    /// Number of options (0).
    pub numOpt: usize,
}
/// The generated struct when the real headers were read.
#[cfg(ferrattn_acl_bindgen)]
pub use generated::aclrtBinaryLoadOptions;

/// `aclrtLaunchKernelCfg { aclrtLaunchKernelAttr *attrs; size_t numAttrs; }`; we pass none.
#[cfg(not(ferrattn_acl_bindgen))]
#[repr(C)]
pub struct aclrtLaunchKernelCfg {
    /// Attribute array (unused).
    pub attrs: *mut c_void,
    /// Number of attributes.
    pub numAttrs: usize,
}
/// The generated struct when the real headers were read.
#[cfg(ferrattn_acl_bindgen)]
pub use generated::aclrtLaunchKernelCfg;

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
    cfg: *mut aclrtLaunchKernelCfg,
    args_handle: aclrtArgsHandle,
    reserve: *mut c_void,
) -> aclError;
/// `aclrtDevAttr`, a C enum (`u32`).
pub type aclrtDevAttr = u32;
/// `ACL_DEV_ATTR_AICORE_CORE_NUM`: number of AI Cores (each one cube core and its vector cores).
pub const ACL_DEV_ATTR_AICORE_CORE_NUM: aclrtDevAttr = 101;
/// `aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value)`.
pub type AclrtGetDeviceInfo =
    unsafe extern "C" fn(device_id: u32, attr: aclrtDevAttr, value: *mut i64) -> aclError;
/// `aclError aclrtGetHardwareSyncAddr(void **addr)`: the sync base a mixed (cube + vector)
/// kernel gets as its hidden first argument (`ffts_addr`).
pub type AclrtGetHardwareSyncAddr = unsafe extern "C" fn(addr: *mut *mut c_void) -> aclError;

/// Every entry point [`crate::device::AclLibrary`] resolves, in its order.
pub const ENTRY_POINTS: [&str; 22] = [
    "aclInit",
    "aclFinalize",
    "aclGetRecentErrMsg",
    "aclrtGetDeviceCount",
    "aclrtSetDevice",
    "aclrtResetDevice",
    "aclrtCreateStream",
    "aclrtDestroyStream",
    "aclrtMalloc",
    "aclrtFree",
    "aclrtMemcpy",
    "aclrtMemset",
    "aclrtSynchronizeStream",
    "aclrtBinaryLoadFromData",
    "aclrtBinaryUnLoad",
    "aclrtBinaryGetFunction",
    "aclrtKernelArgsInit",
    "aclrtKernelArgsAppend",
    "aclrtKernelArgsFinalize",
    "aclrtLaunchKernelWithConfig",
    "aclrtGetHardwareSyncAddr",
    "aclrtGetDeviceInfo",
];

#[cfg(ferrattn_acl_bindgen)]
#[allow(non_upper_case_globals, non_snake_case, dead_code, clippy::all)] // generated code
mod generated {
    include!(concat!(env!("OUT_DIR"), "/acl_bindings.rs"));
}

#[cfg(all(test, ferrattn_acl_bindgen))]
mod tests {
    use super::*;

    /// Each checked-in entry-point type must equal the generated declaration's (a mismatch,
    /// such as `i32` for a C enum parameter, does not compile); evaluated at compile time only,
    /// so the test links without `libascendcl.so`.
    macro_rules! same_signature {
        ($($name:ident: $ty:ty),* $(,)?) => {
            $(const _: $ty = generated::$name;)*
            const COMPARED: &[&str] = &[$(stringify!($name)),*];
        };
    }
    same_signature!(
        aclInit: AclInit,
        aclFinalize: AclFinalize,
        aclGetRecentErrMsg: AclGetRecentErrMsg,
        aclrtGetDeviceCount: AclrtGetDeviceCount,
        aclrtSetDevice: AclrtSetDevice,
        aclrtResetDevice: AclrtResetDevice,
        aclrtCreateStream: AclrtCreateStream,
        aclrtDestroyStream: AclrtDestroyStream,
        aclrtMalloc: AclrtMalloc,
        aclrtFree: AclrtFree,
        aclrtMemcpy: AclrtMemcpy,
        aclrtMemset: AclrtMemset,
        aclrtSynchronizeStream: AclrtSynchronizeStream,
        aclrtBinaryLoadFromData: AclrtBinaryLoadFromData,
        aclrtBinaryUnLoad: AclrtBinaryUnLoad,
        aclrtBinaryGetFunction: AclrtBinaryGetFunction,
        aclrtKernelArgsInit: AclrtKernelArgsInit,
        aclrtKernelArgsAppend: AclrtKernelArgsAppend,
        aclrtKernelArgsFinalize: AclrtKernelArgsFinalize,
        aclrtLaunchKernelWithConfig: AclrtLaunchKernelWithConfig,
        aclrtGetHardwareSyncAddr: AclrtGetHardwareSyncAddr,
        aclrtGetDeviceInfo: AclrtGetDeviceInfo,
    );

    #[test]
    fn checked_in_module_matches_bindgen() {
        assert_eq!(
            COMPARED, ENTRY_POINTS,
            "every entry point the loader resolves is compared"
        );
        assert_eq!(
            ACL_MEM_MALLOC_HUGE_FIRST,
            generated::aclrtMemMallocPolicy_ACL_MEM_MALLOC_HUGE_FIRST
        );
        assert_eq!(
            ACL_MEMCPY_HOST_TO_DEVICE,
            generated::aclrtMemcpyKind_ACL_MEMCPY_HOST_TO_DEVICE
        );
        assert_eq!(
            ACL_MEMCPY_DEVICE_TO_HOST,
            generated::aclrtMemcpyKind_ACL_MEMCPY_DEVICE_TO_HOST
        );
        assert_eq!(
            ACL_DEV_ATTR_AICORE_CORE_NUM,
            generated::aclrtDevAttr_ACL_DEV_ATTR_AICORE_CORE_NUM
        );
    }
}
