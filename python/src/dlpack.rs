//! DLPack in and out: the C structs of `dlpack.h` (v1.0), a checked [`View`] over a capsule a
//! framework exported, and [`Exported`], a Rust-owned host tensor that numpy, torch and jax import
//! with their `from_dlpack`.
//!
//! The protocol (Python array API standard, "DLPack"): the producer's `__dlpack__` returns a
//! capsule named `dltensor` (or `dltensor_versioned` for DLPack >= 1.0) holding a
//! `DLManagedTensor[Versioned]*`. A consumer that does not rename the capsule leaves ownership
//! with it, and the capsule's destructor calls the deleter. This module never renames: a
//! [`View`] keeps the capsule alive for exactly the call that reads or writes through it, so no
//! pointer outlives the memory it points into.
//!
//! Nothing here dereferences a tensor's data; [`View::parse`] only reads the struct the producer
//! filled in and checks it (device, dtype, rank, strides, alignment, read-only flag).

use crate::error::BoundaryError;
use ferrattn_core::DType;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::{c_void, CStr};

/// `DLDeviceType` values this binding accepts or names in messages.
pub const DL_CPU: i32 = 1;
/// `kDLCUDA`: memory on an NVIDIA GPU.
pub const DL_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory.
const DL_CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`.
const DL_CUDA_MANAGED: i32 = 13;
/// `DLDataTypeCode` values.
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
/// `DLPACK_FLAG_BITMASK_READ_ONLY` of a versioned tensor.
const FLAG_READ_ONLY: u64 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    /// Element strides; NULL means compact row-major.
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

#[repr(C)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Host memory the CPU reads directly.
    Cpu,
    /// Device memory of CUDA device `ordinal`.
    Cuda(i32),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Element types a view may hold: the attention dtypes and the `int32` of page tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// A floating-point attention dtype.
    Float(DType),
    /// `int32` (page tables, sequence lengths).
    I32,
    /// `uint8`: raw bytes, accepted only where a buffer is untyped (the decode workspace, a
    /// `uint8` tensor as FlashInfer's wrappers take it).
    U8,
}

impl Elem {
    pub fn size_bytes(self) -> usize {
        match self {
            Elem::Float(d) => d.size_bytes(),
            Elem::I32 => 4,
            Elem::U8 => 1,
        }
    }

    fn dl(self) -> DLDataType {
        let (code, bits) = match self {
            Elem::Float(DType::F32) => (DL_FLOAT, 32),
            Elem::Float(DType::F16) => (DL_FLOAT, 16),
            Elem::Float(DType::BF16) => (DL_BFLOAT, 16),
            Elem::I32 => (DL_INT, 32),
            Elem::U8 => (DL_UINT, 8),
        };
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }
}

impl std::fmt::Display for Elem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Elem::Float(d) => write!(f, "{d}"),
            Elem::I32 => write!(f, "int32"),
            Elem::U8 => write!(f, "uint8"),
        }
    }
}

fn dtype_name(t: DLDataType) -> String {
    let kind = match t.code {
        0 => "int",
        1 => "uint",
        2 => "float",
        3 => "opaque",
        4 => "bfloat",
        5 => "complex",
        6 => "bool",
        _ => "code",
    };
    if t.lanes == 1 {
        format!("{kind}{}", t.bits)
    } else {
        format!("{kind}{}x{}", t.bits, t.lanes)
    }
}

/// A checked view of one tensor a framework exported through DLPack. Holds the capsule, so the
/// memory stays alive as long as the view.
pub struct View<'py> {
    _capsule: Bound<'py, PyCapsule>,
    /// Name of the argument, for messages.
    pub name: &'static str,
    /// First element (data + byte_offset).
    pub ptr: usize,
    pub device: Device,
    pub elem: Elem,
    pub shape: Vec<usize>,
    /// Element strides (row-major compact when the producer gave none); never negative.
    pub strides: Vec<usize>,
    pub read_only: bool,
}

impl<'py> View<'py> {
    /// Reads and checks the DLPack struct inside `capsule` (a `dltensor` or `dltensor_versioned`
    /// capsule). Dereferences no tensor data.
    pub fn parse(
        name: &'static str,
        capsule: &Bound<'py, PyAny>,
    ) -> Result<View<'py>, BoundaryError> {
        let capsule = capsule
            .cast::<PyCapsule>()
            .map_err(|_| BoundaryError::NotDlpack {
                name,
                got: capsule
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "?".into()),
            })?
            .clone();
        let cname = capsule.name().ok().flatten();
        // SAFETY: the capsule name is a NUL-terminated string owned by the capsule, which `capsule`
        // keeps alive for this function.
        let cname: Option<&CStr> = cname.map(|n| unsafe { n.as_cstr() });
        let (t, read_only): (*const DLTensor, bool) = match cname {
            Some(n) if n == NAME => {
                let p = capsule
                    .pointer_checked(Some(NAME))
                    .map_err(|_| BoundaryError::NotDlpack {
                        name,
                        got: "an empty dltensor capsule".into(),
                    })?
                    .as_ptr() as *const DLManagedTensor;
                // SAFETY: a `dltensor` capsule holds a valid DLManagedTensor (DLPack contract).
                (unsafe { &(*p).dl_tensor as *const DLTensor }, false)
            }
            Some(n) if n == NAME_VERSIONED => {
                let p = capsule
                    .pointer_checked(Some(NAME_VERSIONED))
                    .map_err(|_| BoundaryError::NotDlpack {
                        name,
                        got: "an empty dltensor_versioned capsule".into(),
                    })?
                    .as_ptr() as *const DLManagedTensorVersioned;
                // SAFETY: a `dltensor_versioned` capsule holds a valid DLManagedTensorVersioned.
                let m = unsafe { &*p };
                if m.version.major != 1 {
                    return Err(BoundaryError::NotDlpack {
                        name,
                        got: format!(
                            "a DLPack {}.{} tensor (this build reads 1.x)",
                            m.version.major, m.version.minor
                        ),
                    });
                }
                (
                    &m.dl_tensor as *const DLTensor,
                    m.flags & FLAG_READ_ONLY != 0,
                )
            }
            other => {
                return Err(BoundaryError::NotDlpack {
                    name,
                    got: format!(
                        "a capsule named {:?} (already consumed, or not DLPack)",
                        other.map(|n| n.to_string_lossy().into_owned())
                    ),
                })
            }
        };
        // SAFETY: `t` points into the managed tensor the capsule keeps alive.
        let t = unsafe { &*t };
        let device = match t.device.device_type {
            DL_CPU => Device::Cpu,
            DL_CUDA => Device::Cuda(t.device.device_id),
            other => {
                let what = match other {
                    DL_CUDA_HOST => "pinned host memory (kDLCUDAHost)".to_string(),
                    DL_CUDA_MANAGED => "CUDA managed memory (kDLCUDAManaged)".to_string(),
                    n => format!("DLPack device type {n}"),
                };
                return Err(BoundaryError::Device {
                    name,
                    message: format!("is in {what}; ferrattn reads cpu and cuda tensors"),
                });
            }
        };
        let elem = match (t.dtype.code, t.dtype.bits, t.dtype.lanes) {
            (DL_FLOAT, 32, 1) => Elem::Float(DType::F32),
            (DL_FLOAT, 16, 1) => Elem::Float(DType::F16),
            (DL_BFLOAT, 16, 1) => Elem::Float(DType::BF16),
            (DL_INT, 32, 1) => Elem::I32,
            (DL_UINT, 8, 1) => Elem::U8,
            _ => return Err(BoundaryError::DType {
                name,
                got: dtype_name(t.dtype),
                expected:
                    "float16, bfloat16 or float32 (int32 for page tables, uint8 for a workspace)"
                        .into(),
            }),
        };
        if t.ndim < 0 || (t.ndim > 0 && t.shape.is_null()) {
            return Err(BoundaryError::NotDlpack {
                name,
                got: format!("a DLTensor with ndim {} and no shape", t.ndim),
            });
        }
        let ndim = t.ndim as usize;
        // SAFETY: `shape` (and `strides` when not NULL) hold `ndim` entries (DLPack contract).
        let raw_shape: &[i64] = if ndim == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(t.shape, ndim) }
        };
        let mut shape = Vec::with_capacity(ndim);
        for (axis, &s) in raw_shape.iter().enumerate() {
            if s < 0 {
                return Err(BoundaryError::Layout {
                    name,
                    message: format!("has extent {s} on axis {axis}"),
                });
            }
            shape.push(s as usize);
        }
        let strides = if t.strides.is_null() {
            compact_strides(&shape)
        } else {
            let raw: &[i64] = if ndim == 0 {
                &[]
            } else {
                unsafe { std::slice::from_raw_parts(t.strides, ndim) }
            };
            let mut out = Vec::with_capacity(ndim);
            for (axis, &s) in raw.iter().enumerate() {
                // an axis of extent 1 may carry any stride (torch reports arbitrary ones there)
                if s < 0 && shape[axis] > 1 {
                    return Err(BoundaryError::Layout {
                        name,
                        message: format!(
                            "has stride {s} on axis {axis} (shape {shape:?}); negative strides are not supported"
                        ),
                    });
                }
                out.push(s.max(0) as usize);
            }
            out
        };
        let ptr = (t.data as usize).wrapping_add(t.byte_offset as usize);
        let view = View {
            _capsule: capsule,
            name,
            ptr,
            device,
            elem,
            shape,
            strides,
            read_only,
        };
        if view.numel() > 0 && !ptr.is_multiple_of(elem.size_bytes()) {
            return Err(BoundaryError::Misaligned {
                name,
                ptr,
                align: elem.size_bytes(),
                why: "its element size",
            });
        }
        Ok(view)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn dtype(&self) -> Option<DType> {
        match self.elem {
            Elem::Float(d) => Some(d),
            Elem::I32 | Elem::U8 => None,
        }
    }

    /// Requires `rank` axes.
    pub fn expect_rank(&self, rank: usize, layout: &str) -> Result<(), BoundaryError> {
        if self.shape.len() != rank {
            return Err(BoundaryError::Shape {
                name: self.name,
                message: format!(
                    "has shape {:?} (rank {}) but must be rank {rank} {layout}",
                    self.shape,
                    self.shape.len()
                ),
            });
        }
        Ok(())
    }

    /// Requires a floating-point attention dtype.
    pub fn float_dtype(&self) -> Result<DType, BoundaryError> {
        self.dtype().ok_or_else(|| BoundaryError::DType {
            name: self.name,
            got: self.elem.to_string(),
            expected: "float16, bfloat16 or float32".into(),
        })
    }

    /// Requires `int32`.
    pub fn expect_i32(&self) -> Result<(), BoundaryError> {
        if self.elem != Elem::I32 {
            return Err(BoundaryError::DType {
                name: self.name,
                got: self.elem.to_string(),
                expected: "int32".into(),
            });
        }
        Ok(())
    }

    /// Kernels and the CPU readers walk the head dimension as one contiguous row (flash-attn
    /// makes the same demand: "Input tensor must have contiguous last dimension").
    pub fn expect_unit_last_stride(&self) -> Result<(), BoundaryError> {
        if let (Some(&s), Some(&n)) = (self.strides.last(), self.shape.last()) {
            if s != 1 && n > 1 {
                return Err(BoundaryError::Layout {
                    name: self.name,
                    message: format!(
                        "has strides {:?} for shape {:?}; the last axis must have stride 1",
                        self.strides, self.shape
                    ),
                });
            }
        }
        Ok(())
    }

    /// An output must be writable and no two of its elements may share an address.
    pub fn expect_writable(&self) -> Result<(), BoundaryError> {
        if self.read_only {
            return Err(BoundaryError::Layout {
                name: self.name,
                message: "is read-only (its DLPack export says so); pass a writable tensor".into(),
            });
        }
        let mut axes: Vec<usize> = (0..self.shape.len())
            .filter(|&a| self.shape[a] > 1)
            .collect();
        axes.sort_by_key(|&a| self.strides[a]);
        let mut span = 1usize;
        for a in axes {
            if self.strides[a] < span {
                return Err(BoundaryError::Layout {
                    name: self.name,
                    message: format!(
                        "has strides {:?} for shape {:?}: its elements overlap, so it cannot be written",
                        self.strides, self.shape
                    ),
                });
            }
            span = self.strides[a] * self.shape[a];
        }
        Ok(())
    }
}

pub fn compact_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Checks that every view lives on one device and returns it.
pub fn same_device(views: &[&View<'_>]) -> Result<Device, BoundaryError> {
    let first = views[0];
    for v in &views[1..] {
        if v.device != first.device {
            return Err(BoundaryError::Device {
                name: v.name,
                message: format!(
                    "is on {} but {} is on {}; all tensors of one call must share a device",
                    v.device, first.name, first.device
                ),
            });
        }
    }
    Ok(first.device)
}

/// Bytes a Rust-owned exported tensor holds, kept alive by the DLPack deleter.
struct Holder {
    data: Vec<u8>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// A host tensor allocated by ferrattn and handed to a framework through DLPack
/// (`numpy.from_dlpack`, `torch.from_dlpack`, `jax.numpy.from_dlpack` import it without a copy).
/// It can be exported once; the importer then owns the bytes.
#[pyclass(module = "ferrattn._ferrattn", name = "HostTensor")]
pub struct Exported {
    holder: Option<Box<Holder>>,
    dtype: DLDataType,
    /// Testing only: the device the capsule claims (the bytes are host memory).
    claimed: DLDevice,
    /// Testing only: bytes added to the data pointer.
    byte_offset: u64,
    read_only: bool,
}

impl Exported {
    /// A host tensor from raw little-endian bytes in row-major order.
    pub fn from_bytes(shape: &[usize], elem: Elem, data: Vec<u8>) -> Exported {
        debug_assert_eq!(
            data.len(),
            shape.iter().product::<usize>() * elem.size_bytes()
        );
        let strides = compact_strides(shape)
            .into_iter()
            .map(|s| s as i64)
            .collect();
        Exported {
            holder: Some(Box::new(Holder {
                data,
                shape: shape.iter().map(|&s| s as i64).collect(),
                strides,
            })),
            dtype: elem.dl(),
            claimed: DLDevice {
                device_type: DL_CPU,
                device_id: 0,
            },
            byte_offset: 0,
            read_only: false,
        }
    }
}

unsafe extern "C" fn delete_unversioned(m: *mut DLManagedTensor) {
    // SAFETY: `m` and its context were made by `Box::into_raw` in `__dlpack__`.
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx as *mut Holder));
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: as above.
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx as *mut Holder));
    }
}

/// Capsule destructor (DLPack contract): frees the tensor only when no consumer took it, i.e.
/// the capsule still has its original name.
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by CPython with the capsule being destroyed; the GIL is held.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = (*p).deleter {
                d(p);
            }
        } else if pyo3::ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr())
                as *mut DLManagedTensorVersioned;
            if let Some(d) = (*p).deleter {
                d(p);
            }
        }
    }
}

#[pymethods]
impl Exported {
    /// DLPack export (array API standard signature).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &mut self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream; // host memory: no stream to order against
        if let Some((t, id)) = dl_device {
            if (t, id) != (self.claimed.device_type, self.claimed.device_id) {
                return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                    "this tensor lives on device ({}, {}); it cannot be exported to ({t}, {id})",
                    self.claimed.device_type, self.claimed.device_id
                )));
            }
        }
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "ferrattn host tensors are exported without a copy (copy=True is not offered)",
            ));
        }
        let mut holder = self.holder.take().ok_or_else(|| {
            pyo3::exceptions::PyBufferError::new_err(
                "this ferrattn tensor was already exported once (DLPack hands ownership over)",
            )
        })?;
        let dl_tensor = DLTensor {
            data: holder.data.as_mut_ptr() as *mut c_void,
            device: self.claimed,
            ndim: holder.shape.len() as i32,
            dtype: self.dtype,
            shape: holder.shape.as_mut_ptr(),
            strides: holder.strides.as_mut_ptr(),
            byte_offset: self.byte_offset,
        };
        let ctx = Box::into_raw(holder) as *mut c_void;
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        // SAFETY: the managed tensor and its context stay alive until the deleter runs; the
        // capsule destructor runs it only if no consumer took ownership.
        let raw = unsafe {
            if versioned {
                let m = Box::into_raw(Box::new(DLManagedTensorVersioned {
                    version: DLPackVersion { major: 1, minor: 0 },
                    manager_ctx: ctx,
                    deleter: Some(delete_versioned),
                    flags: if self.read_only { FLAG_READ_ONLY } else { 0 },
                    dl_tensor,
                }));
                pyo3::ffi::PyCapsule_New(
                    m as *mut c_void,
                    NAME_VERSIONED.as_ptr(),
                    Some(capsule_destructor),
                )
            } else {
                let m = Box::into_raw(Box::new(DLManagedTensor {
                    dl_tensor,
                    manager_ctx: ctx,
                    deleter: Some(delete_unversioned),
                }));
                pyo3::ffi::PyCapsule_New(m as *mut c_void, NAME.as_ptr(), Some(capsule_destructor))
            }
        };
        // SAFETY: PyCapsule_New returns a new reference or NULL with an exception set.
        unsafe { Bound::from_owned_ptr_or_err(py, raw) }
    }

    /// `(device_type, device_id)` as DLPack numbers them.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.claimed.device_type, self.claimed.device_id)
    }
}

/// Testing aid (used by `python/tests`): a zeroed host buffer exported through DLPack with a
/// device, strides, dtype and byte offset of the caller's choosing, so the boundary checks can be
/// exercised without a GPU (a "cuda" tensor made here must be rejected before anything reads it).
#[pyfunction]
#[pyo3(signature = (shape, dtype_code, bits, device_type=DL_CPU, device_id=0, strides=None, byte_offset=0, read_only=false))]
#[allow(clippy::too_many_arguments)] // mirrors the DLTensor fields one for one
pub fn probe_tensor(
    shape: Vec<i64>,
    dtype_code: u8,
    bits: u8,
    device_type: i32,
    device_id: i32,
    strides: Option<Vec<i64>>,
    byte_offset: u64,
    read_only: bool,
) -> PyResult<Exported> {
    let ushape: Vec<usize> = shape.iter().map(|&s| s.max(0) as usize).collect();
    let strides = strides.unwrap_or_else(|| {
        compact_strides(&ushape)
            .into_iter()
            .map(|s| s as i64)
            .collect()
    });
    if strides.len() != shape.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "strides and shape differ in length",
        ));
    }
    let elem_bytes = (bits as usize).div_ceil(8).max(1);
    // cover every addressable element, plus the offset
    let span = ushape
        .iter()
        .zip(&strides)
        .map(|(&n, &s)| n.saturating_sub(1) * s.unsigned_abs() as usize)
        .sum::<usize>()
        + 1;
    let data = vec![0u8; span * elem_bytes + byte_offset as usize + 16];
    Ok(Exported {
        holder: Some(Box::new(Holder {
            data,
            shape,
            strides,
        })),
        // any dtype at all, so that the consumer's dtype check can be exercised
        dtype: DLDataType {
            code: dtype_code,
            bits,
            lanes: 1,
        },
        claimed: DLDevice {
            device_type,
            device_id,
        },
        byte_offset,
        read_only,
    })
}
