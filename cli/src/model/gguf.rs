//! A reader for GGUF v2/v3 files (the llama.cpp model container): header, typed metadata,
//! tensor directory, and the tensors' bytes dequantised to `f32`.
//!
//! Layout (all little endian): `"GGUF"`, `u32` version, `u64` tensor count, `u64` metadata count;
//! each metadata entry is a string key, a `u32` value type and the value (arrays carry an element
//! type and a `u64` length); each tensor entry is its name, `u32` rank, `u64` extents (the first
//! is the fastest-varying, so a `[576, 49152]` tensor is 49152 rows of 576), `u32` ggml type and a
//! `u64` offset into the data section, which starts at the next multiple of `general.alignment`
//! (32 by default) after the directory. Every length and offset is checked against the file before
//! it is used: a truncated or corrupt file is a [`ModelError`], never a panic.

use super::quant::{dequantize, GgmlType};
use super::ModelError;
use std::collections::HashMap;
use std::path::Path;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Any unsigned integer type, widened.
    U64(u64),
    /// Any signed integer type, widened.
    I64(i64),
    /// `f32` or `f64`, widened.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of values.
    Array(Vec<Value>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::U64(_) => "unsigned integer",
            Value::I64(_) => "signed integer",
            Value::F64(_) => "float",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Extents, fastest-varying first (ggml order).
    pub dims: Vec<usize>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data, from the start of the file.
    pub start: usize,
    /// Byte length of the data.
    pub len: usize,
}

impl TensorInfo {
    /// Elements in the tensor.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// A GGUF file held in memory.
pub struct Gguf {
    bytes: Vec<u8>,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata by key.
    pub metadata: HashMap<String, Value>,
    /// Tensor directory by name.
    pub tensors: HashMap<String, TensorInfo>,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ModelError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        match end {
            Some(end) => {
                let s = &self.b[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(ModelError::Format {
                offset: self.pos,
                what: format!(
                    "{what}: needs {n} bytes but the file ends at {}",
                    self.b.len()
                ),
            }),
        }
    }
    fn u8(&mut self, what: &str) -> Result<u8, ModelError> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    /// A count or length, refused when it could not fit in the rest of the file (each element
    /// takes at least `min_bytes`), so a corrupt length cannot trigger a huge allocation.
    fn len(&mut self, what: &str, min_bytes: usize) -> Result<usize, ModelError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = (self.b.len() - self.pos) as u64;
        if n.saturating_mul(min_bytes as u64) > left {
            return Err(ModelError::Format {
                offset: at,
                what: format!("{what} = {n} does not fit in the {left} bytes left"),
            });
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String, ModelError> {
        let at = self.pos;
        let n = self.len(what, 1)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|e| ModelError::Format {
            offset: at,
            what: format!("{what} is not UTF-8: {e}"),
        })
    }
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value, ModelError> {
        let at = self.pos;
        Ok(match ty {
            0 => Value::U64(self.u8(key)? as u64),
            1 => Value::I64(self.u8(key)? as i8 as i64),
            2 => {
                let s = self.take(2, key)?;
                Value::U64(u16::from_le_bytes([s[0], s[1]]) as u64)
            }
            3 => {
                let s = self.take(2, key)?;
                Value::I64(i16::from_le_bytes([s[0], s[1]]) as i64)
            }
            4 => Value::U64(self.u32(key)? as u64),
            5 => Value::I64(self.u32(key)? as i32 as i64),
            6 => Value::F64(f32::from_bits(self.u32(key)?) as f64),
            7 => Value::Bool(self.u8(key)? != 0),
            8 => Value::Str(self.string(key)?),
            9 if depth == 0 => {
                let elem = self.u32(key)?;
                let n = self.len(key, 1)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(self.u64(key)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(key)?)),
            _ => {
                return Err(ModelError::Format {
                    offset: at,
                    what: format!(
                        "metadata {key}: value type {ty} (nested arrays are refused too)"
                    ),
                })
            }
        })
    }
}

impl Gguf {
    /// Reads and indexes a GGUF file.
    pub fn open(path: &Path) -> Result<Gguf, ModelError> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Gguf::parse(bytes)
    }

    /// Indexes GGUF bytes.
    pub fn parse(bytes: Vec<u8>) -> Result<Gguf, ModelError> {
        let mut c = Cursor { b: &bytes, pos: 0 };
        if c.take(4, "magic")? != b"GGUF" {
            return Err(ModelError::Format {
                offset: 0,
                what: "no GGUF magic (not a GGUF file)".into(),
            });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(ModelError::Format {
                offset: 4,
                what: format!("GGUF version {version}; this reader handles 2 and 3"),
            });
        }
        // a tensor entry takes at least 8 + 4 + 8 + 4 + 8 bytes, a metadata entry 8 + 4 + 1
        let n_tensors = c.len("tensor count", 32)?;
        let n_kv = c.len("metadata count", 13)?;
        let mut metadata = HashMap::with_capacity(n_kv);
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32(&key)?;
            let v = c.value(ty, &key, 0)?;
            metadata.insert(key, v);
        }
        let mut dir = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let at = c.pos;
            let name = c.string("tensor name")?;
            let rank = c.u32(&name)? as usize;
            if rank == 0 || rank > 4 {
                return Err(ModelError::Format {
                    offset: at,
                    what: format!("tensor {name} has rank {rank}; ggml tensors have 1 to 4"),
                });
            }
            let mut dims = Vec::with_capacity(rank);
            for _ in 0..rank {
                dims.push(c.u64(&name)? as usize);
            }
            let ty = c.u32(&name)?;
            let offset = c.u64(&name)? as usize;
            dir.push((name, dims, ty, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(Value::U64(a)) if *a > 0 && a.is_power_of_two() => *a as usize,
            Some(v) => {
                return Err(ModelError::Format {
                    offset: c.pos,
                    what: format!("general.alignment {v:?} is not a power of two"),
                })
            }
        };
        let data_start = c.pos.div_ceil(alignment) * alignment;
        let mut tensors = HashMap::with_capacity(n_tensors);
        for (name, dims, ty, offset) in dir {
            let ggml_type = GgmlType::from_id(ty).ok_or_else(|| ModelError::UnsupportedType {
                tensor: name.clone(),
                ggml_type: ty,
            })?;
            let numel = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| ModelError::Format {
                    offset: data_start,
                    what: format!("tensor {name} extents {dims:?} overflow"),
                })?;
            let len = ggml_type
                .bytes_for(dims[0], numel)
                .map_err(|what| ModelError::Format {
                    offset: data_start,
                    what: format!("tensor {name}: {what}"),
                })?;
            let start = data_start.checked_add(offset);
            let end = start.and_then(|s| s.checked_add(len));
            match (start, end) {
                (Some(start), Some(end)) if end <= bytes.len() => {
                    tensors.insert(
                        name,
                        TensorInfo {
                            dims,
                            ggml_type,
                            start,
                            len,
                        },
                    );
                }
                _ => {
                    return Err(ModelError::Format {
                        offset: data_start,
                        what: format!(
                            "tensor {name} at data offset {offset} + {len} bytes runs past the end of the file ({} bytes)",
                            bytes.len()
                        ),
                    })
                }
            }
        }
        Ok(Gguf {
            bytes,
            version,
            metadata,
            tensors,
        })
    }

    /// A metadata value, or [`ModelError::MissingKey`].
    pub fn get(&self, key: &str) -> Result<&Value, ModelError> {
        self.metadata
            .get(key)
            .ok_or_else(|| ModelError::MissingKey(key.into()))
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> ModelError {
        ModelError::WrongType {
            key: key.into(),
            expected,
            actual: v.kind(),
        }
    }

    /// An unsigned integer metadata value.
    pub fn get_usize(&self, key: &str) -> Result<usize, ModelError> {
        match self.get(key)? {
            Value::U64(x) => Ok(*x as usize),
            Value::I64(x) if *x >= 0 => Ok(*x as usize),
            v => Err(Self::wrong(key, "unsigned integer", v)),
        }
    }

    /// A float metadata value.
    pub fn get_f32(&self, key: &str) -> Result<f32, ModelError> {
        match self.get(key)? {
            Value::F64(x) => Ok(*x as f32),
            v => Err(Self::wrong(key, "float", v)),
        }
    }

    /// A string metadata value.
    pub fn get_str(&self, key: &str) -> Result<&str, ModelError> {
        match self.get(key)? {
            Value::Str(s) => Ok(s),
            v => Err(Self::wrong(key, "string", v)),
        }
    }

    /// An array metadata value.
    pub fn get_array(&self, key: &str) -> Result<&[Value], ModelError> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            v => Err(Self::wrong(key, "array", v)),
        }
    }

    /// A tensor's directory entry.
    pub fn info(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))
    }

    /// A tensor dequantised to `f32`, checked to have extents `dims` (ggml order).
    pub fn tensor_f32(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>, ModelError> {
        let info = self.info(name)?;
        if info.dims != dims {
            return Err(ModelError::TensorShape {
                tensor: name.into(),
                actual: info.dims.clone(),
                expected: dims.to_vec(),
            });
        }
        Ok(dequantize(
            info.ggml_type,
            &self.bytes[info.start..info.start + info.len],
            info.numel(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small GGUF v3 file: one string, one u32 array, and a 2 x 32 Q8_0 tensor of ones.
    fn sample() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes()); // tensors
        b.extend(2u64.to_le_bytes()); // metadata
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u64).to_le_bytes());
            b.extend(x.as_bytes());
        };
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "ids");
        b.extend(9u32.to_le_bytes());
        b.extend(4u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        b.extend(9u32.to_le_bytes());
        s(&mut b, "w");
        b.extend(2u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(8u32.to_le_bytes()); // Q8_0
        b.extend(0u64.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32, 0);
        for _ in 0..2 {
            b.extend(half::f16::from_f32(0.5).to_le_bytes());
            b.extend([2u8; 32]);
        }
        b
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let g = Gguf::parse(sample()).unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get_array("ids").unwrap(), [Value::U64(7), Value::U64(9)]);
        assert_eq!(g.tensor_f32("w", &[32, 2]).unwrap(), vec![1.0; 64]);
        assert!(matches!(
            g.tensor_f32("w", &[64, 1]),
            Err(ModelError::TensorShape { .. })
        ));
        assert!(matches!(
            g.get_usize("general.architecture"),
            Err(ModelError::WrongType { .. })
        ));
        assert!(matches!(g.info("nope"), Err(ModelError::MissingTensor(_))));
    }

    #[test]
    fn truncated_or_corrupt_files_are_errors() {
        let full = sample();
        for cut in 0..full.len() {
            assert!(
                Gguf::parse(full[..cut].to_vec()).is_err(),
                "a file cut at {cut} of {} bytes parsed",
                full.len()
            );
        }
        let mut bad = full.clone();
        bad[0] = b'X';
        assert!(matches!(
            Gguf::parse(bad),
            Err(ModelError::Format { offset: 0, .. })
        ));
        // an absurd string length must not allocate: metadata key length 2^60
        let mut huge = full.clone();
        huge[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(Gguf::parse(huge), Err(ModelError::Format { .. })));
        // an unknown ggml type is a typed error
        let mut ty = full;
        let at = ty
            .windows(4)
            .rposition(|w| w == 8u32.to_le_bytes())
            .unwrap();
        ty[at..at + 4].copy_from_slice(&14u32.to_le_bytes());
        assert!(matches!(
            Gguf::parse(ty),
            Err(ModelError::UnsupportedType { ggml_type: 14, .. })
        ));
    }
}
