//! NCCL, loaded at run time: the communicator and the three collectives context-parallel decode
//! uses (all-gather, all-reduce, reduce-scatter), enqueued on the caller's stream.
//!
//! Types come from cudarc's `nccl` bindings (`cudarc::nccl::sys`). The library itself is opened
//! here rather than by cudarc's loader, for one reason: cudarc looks only for `libnccl.so` and
//! `libnccl.so.<cuda major>` and panics when none loads, while NCCL's soname is `libnccl.so.2`
//! and the copy on the GPU machines is the one PyTorch ships (`nvidia-nccl-cu13`, in
//! `site-packages/nvidia/nccl/lib/libnccl.so.2`), on no loader path. Where ferrattn looks, in
//! order (the first that opens wins; [`library`] reports every place tried when none does):
//!
//! 1. `$FERRATTN_NCCL_LIB`: the library file, or a directory holding `libnccl.so.2`;
//! 2. the dynamic loader by name: `libnccl.so.2`, then cudarc's names (`libnccl.so`, ...). In a
//!    process that imported torch, `libnccl.so.2` is already loaded and found this way;
//! 3. PyTorch's wheel: `nvidia/nccl/lib/libnccl.so.2` under every `sys.path` entry of
//!    `$FERRATTN_PYTHON` (default `python3`), asked once.
//!
//! A missing library is [`CudaError::Unavailable`], never a panic. Every symbol is resolved once,
//! when the library is opened. NVLink multicast (NVLS) is left to the environment: on the shared
//! GPU machines `NCCL_NVLS_ENABLE=0` must stay set, and nothing here changes it.

use crate::device::Gpu;
use crate::error::{CudaError, Result};
use cudarc::nccl::sys::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// Environment variable naming the NCCL library (a file, or a directory holding `libnccl.so.2`).
pub const NCCL_LIB_ENV: &str = "FERRATTN_NCCL_LIB";
/// Environment variable naming the Python whose `sys.path` is searched for PyTorch's NCCL.
pub const PYTHON_ENV: &str = "FERRATTN_PYTHON";
/// NCCL's soname.
pub const SONAME: &str = "libnccl.so.2";

type Raw = std::os::raw::c_int;

/// The NCCL entry points ferrattn calls, resolved once.
#[derive(Debug)]
pub struct Nccl {
    /// Where the library was opened from (a path or a loader name).
    pub source: String,
    /// `ncclGetVersion`, e.g. 22703 for 2.27.3.
    pub version: i32,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t,
    comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, Raw, ncclUniqueId, Raw) -> ncclResult_t,
    comm_init_all: unsafe extern "C" fn(*mut ncclComm_t, Raw, *const Raw) -> ncclResult_t,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    group_start: unsafe extern "C" fn() -> ncclResult_t,
    group_end: unsafe extern "C" fn() -> ncclResult_t,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    error_string: unsafe extern "C" fn(ncclResult_t) -> *const std::ffi::c_char,
    _lib: libloading::Library,
}

impl Nccl {
    /// Maps an NCCL return code to `Ok` or [`CudaError::Nccl`] naming `api`.
    fn check(&self, api: &'static str, r: ncclResult_t) -> Result<()> {
        if r == ncclResult_t::ncclSuccess {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let message = unsafe {
            let s = (self.error_string)(r);
            if s.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        Err(CudaError::Nccl {
            api,
            code: r as u32,
            message,
        })
    }

    fn open(lib: libloading::Library, source: String) -> std::result::Result<Nccl, String> {
        // SAFETY: each symbol is NCCL's public C API with the signature of nccl.h (2.18+), as
        // cudarc's bindings declare it.
        unsafe {
            macro_rules! sym {
                ($name:literal) => {
                    *lib.get($name)
                        .map_err(|e| format!("{source} has no {}: {e}", stringify!($name)))?
                };
            }
            let get_version: unsafe extern "C" fn(*mut Raw) -> ncclResult_t =
                sym!(b"ncclGetVersion\0");
            let mut version = 0;
            if get_version(&mut version) != ncclResult_t::ncclSuccess {
                return Err(format!("ncclGetVersion failed in {source}"));
            }
            Ok(Nccl {
                version,
                get_unique_id: sym!(b"ncclGetUniqueId\0"),
                comm_init_rank: sym!(b"ncclCommInitRank\0"),
                comm_init_all: sym!(b"ncclCommInitAll\0"),
                comm_destroy: sym!(b"ncclCommDestroy\0"),
                group_start: sym!(b"ncclGroupStart\0"),
                group_end: sym!(b"ncclGroupEnd\0"),
                all_gather: sym!(b"ncclAllGather\0"),
                all_reduce: sym!(b"ncclAllReduce\0"),
                reduce_scatter: sym!(b"ncclReduceScatter\0"),
                error_string: sym!(b"ncclGetErrorString\0"),
                source,
                _lib: lib,
            })
        }
    }
}

/// Candidate locations in search order: `(what, path or loader name)`; PyTorch's wheel only
/// when `with_python` (it asks a Python interpreter, the slow step).
pub fn search_order(with_python: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(v) = std::env::var_os(NCCL_LIB_ENV) {
        let p = PathBuf::from(&v);
        let file = if p.is_dir() { p.join(SONAME) } else { p };
        out.push((format!("${NCCL_LIB_ENV}"), file.display().to_string()));
    }
    out.push(("the dynamic loader".into(), SONAME.into()));
    for name in cudarc::get_lib_name_candidates("nccl") {
        out.push(("the dynamic loader (cudarc's names)".into(), name));
    }
    if with_python {
        for dir in python_sys_path() {
            let f = dir.join("nvidia/nccl/lib").join(SONAME);
            if f.is_file() {
                out.push((
                    "PyTorch's nvidia-nccl wheel".into(),
                    f.display().to_string(),
                ));
            }
        }
    }
    out
}

/// `sys.path` of `$FERRATTN_PYTHON` (default `python3`); empty when there is no such Python.
fn python_sys_path() -> Vec<PathBuf> {
    let py = std::env::var(PYTHON_ENV).unwrap_or_else(|_| "python3".into());
    let Ok(out) = std::process::Command::new(&py)
        .args(["-c", "import sys; print('\\n'.join(sys.path))"])
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The NCCL library, opened at first use (see the module docs for where it is looked for), or
/// why there is none.
pub fn library() -> Result<&'static Nccl> {
    static LIB: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let mut tried = Vec::new();
        // the environment variable and the loader first; Python is asked only when they fail
        let cheap = search_order(false);
        let n_cheap = cheap.len();
        let python = || search_order(true).into_iter().skip(n_cheap);
        for (what, at) in cheap
            .into_iter()
            .chain(std::iter::once(()).flat_map(|()| python()))
        {
            // SAFETY: loading NCCL runs its (trusted, vendor) initialisers only.
            match unsafe { libloading::Library::new(&at) } {
                Ok(lib) => {
                    let nccl = Nccl::open(lib, at)?;
                    tracing::debug!(source = %nccl.source, version = nccl.version, "NCCL loaded");
                    return Ok(nccl);
                }
                Err(e) => tried.push(format!("{at} ({what}): {e}")),
            }
        }
        Err(format!(
            "libnccl was not found; tried {}. Set {NCCL_LIB_ENV} to libnccl.so.2 (PyTorch ships it in site-packages/nvidia/nccl/lib)",
            tried.join("; ")
        ))
    })
    .as_ref()
    .map_err(|reason| CudaError::Unavailable {
        reason: reason.clone(),
    })
}

/// NCCL's unique id: made by one rank, handed to every other (any transport: a file, a socket,
/// torch.distributed's broadcast) before [`Communicator::init_rank`].
#[derive(Clone, Copy)]
pub struct UniqueId(ncclUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({} bytes)", self.0.internal.len())
    }
}

impl UniqueId {
    /// Bytes of an id.
    pub const BYTES: usize = 128;

    /// A new id (rank 0 makes it).
    pub fn new() -> Result<UniqueId> {
        let n = library()?;
        let mut id = ncclUniqueId {
            internal: [0; Self::BYTES],
        };
        // SAFETY: out-parameter of the right type.
        n.check("ncclGetUniqueId", unsafe { (n.get_unique_id)(&mut id) })?;
        Ok(UniqueId(id))
    }

    /// The id as bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        self.0.internal.map(|c| c as u8)
    }

    /// An id received from rank 0.
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        let arr: [u8; Self::BYTES] = b.try_into().map_err(|_| {
            CudaError::Plan(format!(
                "an NCCL unique id has {} bytes, not {}",
                Self::BYTES,
                b.len()
            ))
        })?;
        Ok(UniqueId(ncclUniqueId {
            internal: arr.map(|x| x as std::ffi::c_char),
        }))
    }
}

/// Element types the collectives move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// Raw bytes (all-gather of 16-bit O and f32 LSE in one block).
    Byte,
    /// f32 (sums and maxima of softmax statistics).
    F32,
}

impl Element {
    fn nccl(self) -> ncclDataType_t {
        match self {
            Element::Byte => ncclDataType_t::ncclUint8,
            Element::F32 => ncclDataType_t::ncclFloat32,
        }
    }
}

/// Reductions the collectives apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
}

/// One rank of an NCCL communicator on one GPU.
#[derive(Debug)]
pub struct Communicator {
    comm: ncclComm_t,
    rank: usize,
    size: usize,
    gpu: Arc<Gpu>,
    nccl: &'static Nccl,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `&self` calls
// only enqueue work and the communicator is owned by one rank.
unsafe impl Send for Communicator {}
// SAFETY: as above.
unsafe impl Sync for Communicator {}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `size` on `gpu` (every rank calls this, each
    /// from its own thread or process; it returns once all have joined).
    pub fn init_rank(gpu: &Arc<Gpu>, id: &UniqueId, rank: usize, size: usize) -> Result<Self> {
        let n = library()?;
        if rank >= size {
            return Err(CudaError::Plan(format!(
                "rank {rank} of a communicator of {size}"
            )));
        }
        let _bound = gpu.bind()?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: out-parameter; NCCL uses the current (primary) context of `gpu`.
        n.check("ncclCommInitRank", unsafe {
            (n.comm_init_rank)(&mut comm, size as Raw, id.0, rank as Raw)
        })?;
        Ok(Communicator {
            comm,
            rank,
            size,
            gpu: gpu.clone(),
            nccl: n,
        })
    }

    /// One communicator over `gpus` (rank `i` on `gpus[i]`), made from one thread
    /// (`ncclCommInitAll`): for tests and single-process runs with one thread per GPU after.
    pub fn init_all(gpus: &[Arc<Gpu>]) -> Result<Vec<Communicator>> {
        let n = library()?;
        let devs: Vec<Raw> = gpus.iter().map(|g| g.ordinal as Raw).collect();
        let mut comms = vec![std::ptr::null_mut(); gpus.len()];
        // SAFETY: comms holds one out-slot per device.
        n.check("ncclCommInitAll", unsafe {
            (n.comm_init_all)(comms.as_mut_ptr(), devs.len() as Raw, devs.as_ptr())
        })?;
        Ok(comms
            .into_iter()
            .zip(gpus)
            .enumerate()
            .map(|(rank, (comm, gpu))| Communicator {
                comm,
                rank,
                size: gpus.len(),
                gpu: gpu.clone(),
                nccl: n,
            })
            .collect())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The GPU of this rank.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The loaded library.
    pub fn library(&self) -> &'static Nccl {
        self.nccl
    }

    /// Opens an NCCL group: collectives enqueued until [`Communicator::group_end`] launch as one.
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.nccl
            .check("ncclGroupStart", unsafe { (self.nccl.group_start)() })
    }

    /// Closes the group opened by [`Communicator::group_start`].
    pub fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.nccl
            .check("ncclGroupEnd", unsafe { (self.nccl.group_end)() })
    }

    /// Enqueues an all-gather of `count` elements per rank on `stream`: rank `r`'s `send` lands
    /// at `recv + r * count` elements on every rank (in place when `send` is that address).
    ///
    /// # Safety
    /// `send` holds `count` and `recv` `size * count` elements of device memory of this rank's
    /// GPU; `stream` belongs to its context.
    pub unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        e: Element,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        let _bound = self.gpu.bind()?;
        self.nccl.check("ncclAllGather", unsafe {
            (self.nccl.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                e.nccl(),
                self.comm,
                stream as cudaStream_t,
            )
        })
    }

    /// Enqueues an all-reduce of `count` elements on `stream` (in place when `send == recv`).
    ///
    /// # Safety
    /// `send` and `recv` hold `count` elements of device memory of this rank's GPU; `stream`
    /// belongs to its context.
    pub unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        e: Element,
        op: Reduce,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        let _bound = self.gpu.bind()?;
        self.nccl.check("ncclAllReduce", unsafe {
            (self.nccl.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                e.nccl(),
                op.nccl(),
                self.comm,
                stream as cudaStream_t,
            )
        })
    }

    /// Enqueues a reduce-scatter on `stream`: `send` holds `size` blocks of `count` elements;
    /// rank `r` receives the reduction of every rank's block `r` in `recv`.
    ///
    /// # Safety
    /// `send` holds `size * count` and `recv` `count` elements of device memory of this rank's
    /// GPU; `stream` belongs to its context.
    pub unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        e: Element,
        op: Reduce,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        let _bound = self.gpu.bind()?;
        self.nccl.check("ncclReduceScatter", unsafe {
            (self.nccl.reduce_scatter)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                e.nccl(),
                op.nccl(),
                self.comm,
                stream as cudaStream_t,
            )
        })
    }
}

impl Reduce {
    fn nccl(self) -> ncclRedOp_t {
        match self {
            Reduce::Sum => ncclRedOp_t::ncclSum,
            Reduce::Max => ncclRedOp_t::ncclMax,
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // SAFETY: comm was created by init; errors at teardown cannot be reported.
        unsafe {
            let _bound = self.gpu.bind();
            let _ = (self.nccl.comm_destroy)(self.comm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_unavailable_with_every_place_tried() {
        match library() {
            Ok(n) => eprintln!(
                "NCCL {} from {} is present; nothing to check",
                n.version, n.source
            ),
            Err(CudaError::Unavailable { reason }) => {
                assert!(reason.contains(SONAME), "{reason}");
                assert!(reason.contains(NCCL_LIB_ENV), "{reason}");
                assert!(matches!(
                    UniqueId::new(),
                    Err(CudaError::Unavailable { .. })
                ));
            }
            Err(other) => panic!("expected Unavailable, got {other}"),
        }
        assert!(search_order(false).iter().any(|(_, at)| at == SONAME));
    }

    #[test]
    fn unique_ids_round_trip_through_bytes() {
        let bytes: Vec<u8> = (0..128u8).collect();
        let id = UniqueId::from_bytes(&bytes).unwrap();
        assert_eq!(id.to_bytes().to_vec(), bytes);
        let e = UniqueId::from_bytes(&bytes[..5]).unwrap_err().to_string();
        assert!(e.contains("128 bytes, not 5"), "{e}");
    }
}
