//! Reading inputs from and writing outputs to safetensors files.
//!
//! Inputs: `q`, `k`, `v` (or MLA: `q` and the latent `kv`, whose first `Dv` columns are V), optional
//! int32/int64 `seqlens_k` and `seqlens_q`, in f32, f16 or bf16. Outputs: `o` (the problem's dtype)
//! and `lse` (f32).

use crate::{FerrattnError, Result};
use ferrattn_core::{AttentionInputs, DType, Tensor};
use half::{bf16, f16};
use safetensors::tensor::{Dtype as StDtype, TensorView};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::Path;

fn file_err(path: &Path, message: impl std::fmt::Display) -> FerrattnError {
    FerrattnError::File {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Decodes a float tensor view into a host [`Tensor`].
pub fn tensor_from_view(name: &str, view: &TensorView<'_>) -> std::result::Result<Tensor, String> {
    let shape = view.shape().to_vec();
    let bytes = view.data();
    let (dtype, data): (DType, Vec<f32>) = match view.dtype() {
        StDtype::F32 => (
            DType::F32,
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        StDtype::F16 => (
            DType::F16,
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        StDtype::BF16 => (
            DType::BF16,
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        other => {
            return Err(format!(
                "tensor {name} has dtype {other:?}; expected F32, F16 or BF16"
            ))
        }
    };
    Ok(Tensor { shape, dtype, data })
}

fn ints_from_view(name: &str, view: &TensorView<'_>) -> std::result::Result<Vec<i64>, String> {
    let b = view.data();
    match view.dtype() {
        StDtype::I32 => Ok(b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect()),
        StDtype::I64 => Ok(b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()),
        other => Err(format!("{name} has dtype {other:?}; expected I32 or I64")),
    }
}

/// Encodes a host tensor as little-endian bytes of its dtype.
pub fn tensor_bytes(t: &Tensor) -> (StDtype, Vec<u8>) {
    match t.dtype {
        DType::F32 => (
            StDtype::F32,
            t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        DType::F16 => (
            StDtype::F16,
            t.data
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
        ),
        DType::BF16 => (
            StDtype::BF16,
            t.data
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
        ),
    }
}

/// A parsed safetensors file: float tensors, integer tensors and metadata.
#[derive(Debug, Default)]
pub struct TensorFile {
    /// Float tensors by name.
    pub tensors: HashMap<String, Tensor>,
    /// Integer tensors by name (as i64).
    pub ints: HashMap<String, Vec<i64>>,
    /// The file's `__metadata__`.
    pub metadata: HashMap<String, String>,
}

/// Reads every tensor of a safetensors file.
pub fn read_file(path: &Path) -> Result<TensorFile> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| file_err(path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| file_err(path, e))?;
    let mut out = TensorFile {
        metadata: meta
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        ..Default::default()
    };
    for (name, view) in st.tensors() {
        match view.dtype() {
            StDtype::I32 | StDtype::I64 => {
                out.ints.insert(
                    name.clone(),
                    ints_from_view(&name, &view).map_err(|e| file_err(path, e))?,
                );
            }
            _ => {
                out.tensors.insert(
                    name.clone(),
                    tensor_from_view(&name, &view).map_err(|e| file_err(path, e))?,
                );
            }
        }
    }
    Ok(out)
}

/// Names an input file may hold: `q` with `k`, `v` (or MLA `q` with the latent `kv`), and the
/// optional integer lengths.
pub const INPUT_NAMES: [&str; 6] = ["q", "k", "v", "kv", "seqlens_q", "seqlens_k"];

/// Reads attention inputs: `q` plus `k`,`v` or the MLA latent `kv`, optional `seqlens_q/k`.
///
/// Strict, because a silently ignored tensor runs the wrong problem: any other name (a misspelt
/// `seqlen_k`) is an error, `seqlens_*` must be I32/I64 and the others float.
pub fn read_inputs(path: &Path) -> Result<AttentionInputs> {
    let mut f = read_file(path)?;
    let mut names: Vec<&String> = f.tensors.keys().chain(f.ints.keys()).collect();
    names.sort();
    if let Some(unknown) = names.iter().find(|n| !INPUT_NAMES.contains(&n.as_str())) {
        return Err(file_err(
            path,
            format!(
                "unknown tensor {unknown:?}; an input file holds q, k, v (or MLA q, kv) and optional int32 seqlens_q, seqlens_k"
            ),
        ));
    }
    for name in ["seqlens_q", "seqlens_k"] {
        if let Some(t) = f.tensors.get(name) {
            return Err(file_err(
                path,
                format!("{name} is {}; it must be I32 or I64", t.dtype),
            ));
        }
    }
    for name in ["q", "k", "v", "kv"] {
        if f.ints.contains_key(name) {
            return Err(file_err(
                path,
                format!("{name} is an integer tensor; it must be F32, F16 or BF16"),
            ));
        }
    }
    let mut take = |name: &str| f.tensors.remove(name);
    let q = take("q").ok_or_else(|| file_err(path, "no tensor named q"))?;
    let x = match (take("k"), take("v"), take("kv")) {
        (Some(k), Some(v), None) => AttentionInputs::new(q, k, v),
        (None, None, Some(kv)) => AttentionInputs::mla(q, kv),
        _ => return Err(file_err(path, "expected tensors q, k, v or (MLA) q, kv")),
    };
    Ok(AttentionInputs {
        seqlens_q: f.ints.remove("seqlens_q"),
        seqlens_k: f.ints.remove("seqlens_k"),
        ..x
    })
}

/// Writes named tensors (and optional int32 vectors) with metadata.
///
/// The bytes are a function of the arguments alone (`ferrattn golden` is reproducible to the
/// byte): the header is written here with tensors and metadata keys in sorted order, where
/// `safetensors::serialize` would write metadata in `HashMap` order, which changes from run to
/// run. The layout is the safetensors format (8-byte little-endian header length, JSON header
/// padded with spaces to 8 bytes, data in header order) and is read back by `safetensors`.
pub fn write_file(
    path: &Path,
    tensors: &[(&str, &Tensor)],
    ints: &[(&str, &[i64])],
    metadata: HashMap<String, String>,
) -> Result<()> {
    let mut encoded: Vec<(String, StDtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            let (dt, b) = tensor_bytes(t);
            (n.to_string(), dt, t.shape.clone(), b)
        })
        .chain(ints.iter().map(|(n, v)| {
            let b = v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
            (n.to_string(), StDtype::I32, vec![v.len()], b)
        }))
        .collect();
    encoded.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let sorted: std::collections::BTreeMap<String, String> = metadata.into_iter().collect();
        header.insert(
            "__metadata__".into(),
            serde_json::to_value(sorted).expect("strings serialise"),
        );
    }
    let mut offset = 0usize;
    for (name, dt, shape, bytes) in &encoded {
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": format!("{dt:?}"),
                "shape": shape,
                "data_offsets": [offset, offset + bytes.len()],
            }),
        );
        offset += bytes.len();
    }
    let mut head = serde_json::to_vec(&header).expect("a JSON map serialises");
    head.resize(head.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + head.len() + offset);
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    for (_, _, _, bytes) in &encoded {
        out.extend_from_slice(bytes);
    }
    // what is written must be what safetensors reads
    SafeTensors::deserialize(&out).map_err(|e| file_err(path, e))?;
    std::fs::write(path, out).map_err(|e| file_err(path, e))
}
