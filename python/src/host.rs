//! Host tensors through their DLPack pointers: read into the core's `f32` [`Tensor`] (the CPU
//! emulations compute in `f32` on values already rounded to their dtype, so f16/bf16 inputs are
//! widened exactly) and write results back in the output's dtype.
//!
//! Only views on [`Device::Cpu`] reach this module, and only after [`View::parse`] and the
//! checks of the caller (unit last stride, writable outputs, shapes) have passed.

use crate::dlpack::{Device, Elem, View};
use crate::error::{BoundaryError, Result};
use ferrattn_core::{DType, Tensor};
use half::{bf16, f16};

/// Calls `row(flat_row_index, element_offset)` for each innermost row of `shape` under
/// `strides` (row-major order of the rows).
fn for_each_row(shape: &[usize], strides: &[usize], mut row: impl FnMut(usize, usize)) {
    let outer: Vec<usize> = shape[..shape.len().saturating_sub(1)].to_vec();
    let rows: usize = outer.iter().product();
    let mut index = vec![0usize; outer.len()];
    for r in 0..rows {
        let off: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        row(r, off);
        for a in (0..index.len()).rev() {
            index[a] += 1;
            if index[a] < outer[a] {
                break;
            }
            index[a] = 0;
        }
    }
}

fn expect_host(v: &View<'_>) -> Result<()> {
    if v.device != Device::Cpu {
        return Err(BoundaryError::Device {
            name: v.name,
            message: format!("is on {}; this path reads host memory", v.device),
        });
    }
    Ok(())
}

/// Reads a float view into a dense row-major tensor of its dtype.
pub fn read(v: &View<'_>) -> Result<Tensor> {
    expect_host(v)?;
    v.expect_unit_last_stride()?;
    let dtype = v.float_dtype()?;
    let n = v.numel();
    let mut data = Vec::with_capacity(n);
    if n > 0 {
        let d = *v.shape.last().unwrap_or(&1);
        let base = v.ptr;
        for_each_row(&v.shape, &v.strides, |_, off| {
            // SAFETY: the producer guarantees every index inside shape/strides is addressable;
            // rows are contiguous (unit last stride checked) and aligned (checked in parse).
            unsafe {
                match dtype {
                    DType::F32 => {
                        let p = (base as *const f32).add(off);
                        data.extend_from_slice(std::slice::from_raw_parts(p, d));
                    }
                    DType::F16 => {
                        let p = (base as *const f16).add(off);
                        data.extend(std::slice::from_raw_parts(p, d).iter().map(|x| x.to_f32()));
                    }
                    DType::BF16 => {
                        let p = (base as *const bf16).add(off);
                        data.extend(std::slice::from_raw_parts(p, d).iter().map(|x| x.to_f32()));
                    }
                }
            }
        });
    }
    Ok(Tensor {
        shape: v.shape.clone(),
        dtype,
        data,
    })
}

/// Reads an `int32` view in row-major order.
pub fn read_i32(v: &View<'_>) -> Result<Vec<i32>> {
    expect_host(v)?;
    v.expect_i32()?;
    let mut out = Vec::with_capacity(v.numel());
    if v.numel() > 0 {
        if v.shape.is_empty() {
            // SAFETY: a 0-d tensor holds one aligned element.
            return Ok(vec![unsafe { *(v.ptr as *const i32) }]);
        }
        let d = *v.shape.last().unwrap_or(&1);
        let ls = *v.strides.last().unwrap_or(&1);
        for_each_row(&v.shape, &v.strides, |_, off| {
            for j in 0..d {
                // SAFETY: inside shape/strides of a live, aligned producer buffer.
                out.push(unsafe { *(v.ptr as *const i32).add(off + j * ls) });
            }
        });
    }
    Ok(out)
}

/// Checks an output the caller passed: its dtype, writability, and either exactly `shape` or a
/// flat 1-d buffer of at least `shape`'s element count (engines often pass one preallocated
/// buffer per step).
pub fn check_output(v: &View<'_>, shape: &[usize], dtype: DType) -> Result<()> {
    if v.elem != Elem::Float(dtype) {
        return Err(BoundaryError::DType {
            name: v.name,
            got: v.elem.to_string(),
            expected: format!("{dtype}, the dtype of this output"),
        });
    }
    let need: usize = shape.iter().product();
    if v.shape.len() == 1 && shape.len() != 1 {
        if v.shape[0] < need {
            return Err(BoundaryError::Layout {
                name: v.name,
                message: format!(
                    "is a flat buffer of {} elements but the output {shape:?} needs {need}",
                    v.shape[0]
                ),
            });
        }
        if v.strides[0] != 1 && v.shape[0] > 1 {
            return Err(BoundaryError::Layout {
                name: v.name,
                message: format!(
                    "is a flat buffer with stride {}; a flat output must be contiguous",
                    v.strides[0]
                ),
            });
        }
    } else if v.shape != shape {
        return Err(BoundaryError::Shape {
            name: v.name,
            message: format!("has shape {:?} but the output is {shape:?}", v.shape),
        });
    }
    v.expect_unit_last_stride()?;
    v.expect_writable()
}

/// Writes `t` (already checked against `v` by [`check_output`]) through the view.
pub fn write(v: &View<'_>, t: &Tensor) -> Result<()> {
    expect_host(v)?;
    let flat = v.shape.len() == 1 && t.shape.len() != 1;
    let (shape, strides) = if flat {
        (t.shape.clone(), crate::dlpack::compact_strides(&t.shape))
    } else {
        (v.shape.clone(), v.strides.clone())
    };
    if t.data.is_empty() {
        return Ok(());
    }
    let d = *shape.last().unwrap_or(&1);
    let base = v.ptr;
    let dtype = t.dtype;
    for_each_row(&shape, &strides, |r, off| {
        let src = &t.data[r * d..(r + 1) * d];
        // SAFETY: `check_output` established the view is writable, non-overlapping and covers
        // `shape` under `strides`; rows are contiguous and aligned.
        unsafe {
            match dtype {
                DType::F32 => {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), (base as *mut f32).add(off), d);
                }
                DType::F16 => {
                    let dst = std::slice::from_raw_parts_mut((base as *mut f16).add(off), d);
                    for (o, &x) in dst.iter_mut().zip(src) {
                        *o = f16::from_f32(x);
                    }
                }
                DType::BF16 => {
                    let dst = std::slice::from_raw_parts_mut((base as *mut bf16).add(off), d);
                    for (o, &x) in dst.iter_mut().zip(src) {
                        *o = bf16::from_f32(x);
                    }
                }
            }
        }
    });
    Ok(())
}

/// A tensor's values as little-endian bytes of its dtype (for a Rust-allocated output).
pub fn to_bytes(t: &Tensor) -> Vec<u8> {
    match t.dtype {
        DType::F32 => t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => t
            .data
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        DType::BF16 => t
            .data
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
    }
}
