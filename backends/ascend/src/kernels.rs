//! The AMLA kernel binary and the closed list of configurations it covers.
//!
//! The kernel (`ascend-kernels/amla/amla_decode.cpp`) is one function,
//! `amla_decode_bf16_576_512`: BF16, Dk 576, Dv 512, one latent KV head, Sq 1 or 2, at most 256
//! query rows (heads x Sq) per sequence, per-sequence KV lengths. Anything else is `Unsupported`.
//!
//! `ascendc_library` (CANN's CMake) does not export that function as written: for a mixed
//! (cube + vector) kernel on dav-c220 it generates the entry `auto_gen_<name>_kernel` with a
//! hidden first argument `ffts_addr` (the hardware sync address, which the wrapper passes to
//! `set_ffts_base_addr` so the cross-core flags work) and a trailing `overflow_status` (8 bytes
//! of device memory), around the 8 arguments of the source (asc-devkit
//! `cmake/asc/legacy_modules/util/extract_host_stub.py`). [`AMLA_ENTRY`] and [`launch`] follow
//! that ABI.
//!
//! [`launch`]: crate::launch

use crate::acl::*;
use crate::device::AclLibrary;
use crate::{AscendError, Result};
use ferrattn_core::{AttentionProblem, DType, KvLayout};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The kernel function in the source.
pub const AMLA_KERNEL: &str = "amla_decode_bf16_576_512";
/// Its entry point in the binary `ascendc_library` builds (mixed kernel wrapper).
pub const AMLA_ENTRY: &str = "auto_gen_amla_decode_bf16_576_512_kernel";
/// Arguments of [`AMLA_ENTRY`]: `ffts_addr`, the 8 of the source, `overflow_status`.
pub const AMLA_ENTRY_ARGS: usize = 10;
/// Bytes of the `overflow_status` buffer the generated host stub allocates.
pub const OVERFLOW_STATUS_BYTES: usize = 8;
/// GM workspace per AI Core (`kWsBytesPerCore` in `amla_config.h`): `kWsDepth` (3) blocks of S
/// (FP32) and of P (BF16), each `kMaxRows` (256) x `kBlockK` (512).
pub const WORKSPACE_BYTES_PER_CORE: usize = 3 * 256 * 512 * (4 + 2);

/// What the facade may ask the real kernel for.
pub const SUPPORTED: &str = "bf16, MLA latent kv with 1 head, head_dim_qk 576, head_dim_v 512, \
                             seq_q 1 or 2, heads_q x seq_q <= 256, non-causal or causal";

/// Checks a problem against the kernel's closed list.
pub fn check_supported(p: &AttentionProblem) -> Result<()> {
    let ok = p.dtype == DType::BF16
        && p.kv_layout == KvLayout::MlaLatent
        && p.heads_kv == 1
        && p.head_dim_qk == 576
        && p.head_dim_v == 512
        && (1..=2).contains(&p.max_seqlen_q)
        && p.heads_q * p.max_seqlen_q <= 256;
    if ok {
        Ok(())
    } else {
        Err(AscendError::Unsupported {
            what: format!(
                "AMLA kernel for {} {:?} heads_q {} heads_kv {} dk {} dv {} seq_q {}",
                p.dtype,
                p.kv_layout,
                p.heads_q,
                p.heads_kv,
                p.head_dim_qk,
                p.head_dim_v,
                p.max_seqlen_q
            ),
            supported: SUPPORTED.into(),
        })
    }
}

/// Kernel parameters, laid out as `AmlaParams` in `ascend-kernels/amla/amla_config.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KernelParams {
    /// Sequences.
    pub batch: u32,
    /// Padded query tokens per sequence (1 or 2).
    pub seq_q: u32,
    /// Query heads.
    pub heads: u32,
    /// Padded KV extent of the kv tensor.
    pub max_seq_k: u32,
    /// KV tokens per block (512).
    pub block_k: u32,
    /// 1: Appendix A compensation on.
    pub compensation: u32,
    /// 1: bottom-right causal mask.
    pub causal: u32,
    /// Padding to 8 bytes.
    pub reserved: u32,
    /// Softmax scale.
    pub scale: f32,
    /// Padding.
    pub reserved2: u32,
}

/// A kernel binary read from disk and checked to be an ELF object.
#[derive(Clone, Debug)]
pub struct KernelBinary {
    /// The file.
    pub path: PathBuf,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// Where the kernel binary is looked for: `FERRATTN_AMLA_KERNEL`, else the CMake build of
/// `build.rs` (`$OUT_DIR/amla-kernel/amla_decode.o`), else `ascend-kernels/build/amla_decode.o`.
pub fn default_kernel_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRATTN_AMLA_KERNEL") {
        return PathBuf::from(p);
    }
    if let Some(dir) = option_env!("FERRATTN_AMLA_KERNEL_BUILD") {
        return Path::new(dir).join("amla_decode.o");
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ascend-kernels/build/amla_decode.o")
}

impl KernelBinary {
    /// Reads and checks a kernel binary.
    pub fn read(path: &Path) -> Result<KernelBinary> {
        let bytes = std::fs::read(path).map_err(|e| AscendError::KernelNotFound {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let bad = |reason: String| AscendError::BadKernelBinary {
            path: path.display().to_string(),
            reason,
        };
        if bytes.len() < 64 {
            return Err(bad(format!(
                "{} bytes, shorter than an ELF header",
                bytes.len()
            )));
        }
        if &bytes[..4] != b"\x7fELF" {
            return Err(bad(format!(
                "starts with {:02x?}, not the ELF magic 7f 45 4c 46",
                &bytes[..4]
            )));
        }
        if bytes[4] != 2 {
            return Err(bad(format!("ELF class {} (expected 2, 64-bit)", bytes[4])));
        }
        Ok(KernelBinary {
            path: path.to_path_buf(),
            bytes,
        })
    }
}

/// The binary loaded on the device and its entry point.
pub struct LoadedKernel {
    pub(crate) bin: aclrtBinHandle,
    pub(crate) func: aclrtFuncHandle,
}

impl LoadedKernel {
    /// `aclrtBinaryLoadFromData` + `aclrtBinaryGetFunction`.
    pub fn load(acl: &AclLibrary, k: &KernelBinary) -> Result<LoadedKernel> {
        let opts = aclrtBinaryLoadOptions {
            options: std::ptr::null_mut(),
            numOpt: 0,
        };
        let mut bin: aclrtBinHandle = std::ptr::null_mut();
        // SAFETY: data/len describe a live host buffer; out-pointer valid.
        unsafe {
            acl.check(
                "aclrtBinaryLoadFromData",
                (acl.binary_load)(k.bytes.as_ptr().cast(), k.bytes.len(), &opts, &mut bin),
            )?;
        }
        let name = CString::new(AMLA_ENTRY).expect("no NUL in the kernel name");
        let mut func: aclrtFuncHandle = std::ptr::null_mut();
        // SAFETY: bin from the successful load above; name NUL-terminated.
        let r = unsafe {
            acl.check(
                "aclrtBinaryGetFunction",
                (acl.get_function)(bin, name.as_ptr(), &mut func),
            )
        };
        if let Err(e) = r {
            // SAFETY: bin is a loaded handle.
            unsafe { (acl.binary_unload)(bin) };
            return Err(e);
        }
        Ok(LoadedKernel { bin, func })
    }
}
