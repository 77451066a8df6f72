//! The ggml storage types this model's file uses, dequantised to `f32`.
//!
//! Block formats (ggml `ggml-common.h`), 32 weights per block, blocks never straddle a row:
//! - `Q4_0`: `f16 d`, 16 bytes of nibbles; `x = (q - 8) d`.
//! - `Q4_1`: `f16 d`, `f16 m`, 16 bytes of nibbles; `x = q d + m`.
//! - `Q8_0`: `f16 d`, 32 `i8`; `x = q d`.
//!
//! In the nibble formats byte `j` holds weight `j` in its low nibble and weight `j + 16` in its
//! high nibble. The SmolLM2 Q4_1 file stores the projection matrices in `Q4_1`, the token
//! embedding in `Q8_0` and the norms in `F32`.

use half::f16;

/// Weights per quantisation block.
pub const BLOCK: usize = 32;

/// A ggml tensor type this reader can dequantise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    /// IEEE `f32`.
    F32,
    /// IEEE `f16`.
    F16,
    /// 4-bit symmetric with an offset of 8, one `f16` scale per 32.
    Q4_0,
    /// 4-bit with an `f16` scale and minimum per 32.
    Q4_1,
    /// 8-bit with an `f16` scale per 32.
    Q8_0,
}

impl GgmlType {
    /// The type of a ggml type id, if supported (ids from ggml's `enum ggml_type`).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            _ => return None,
        })
    }

    /// `(weights, bytes)` of one block.
    fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 => (1, 2),
            GgmlType::Q4_0 => (BLOCK, 2 + BLOCK / 2),
            GgmlType::Q4_1 => (BLOCK, 4 + BLOCK / 2),
            GgmlType::Q8_0 => (BLOCK, 2 + BLOCK),
        }
    }

    /// Bytes of a tensor of `numel` weights in rows of `row` weights; an error when the rows do
    /// not split into whole blocks.
    pub fn bytes_for(self, row: usize, numel: usize) -> Result<usize, String> {
        let (w, b) = self.block();
        if !row.is_multiple_of(w) {
            return Err(format!(
                "{self:?} rows of {row} weights do not split into blocks of {w}"
            ));
        }
        (numel / w)
            .checked_mul(b)
            .ok_or_else(|| format!("{numel} weights of {self:?} overflow"))
    }
}

fn half(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Dequantises `numel` weights of type `ty` from `bytes` (exactly [`GgmlType::bytes_for`] long,
/// as the GGUF reader has checked).
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(numel);
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(half)),
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (_, bb) = ty.block();
            for blk in bytes.chunks_exact(bb) {
                let d = half(&blk[0..2]);
                let (m, qs) = match ty {
                    GgmlType::Q4_1 => (half(&blk[2..4]), &blk[4..]),
                    _ => (-8.0 * d, &blk[2..]),
                };
                out.extend(qs.iter().map(|&q| (q & 0x0f) as f32 * d + m));
                out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
            }
        }
        GgmlType::Q8_0 => {
            for blk in bytes.chunks_exact(2 + BLOCK) {
                let d = half(&blk[0..2]);
                out.extend(blk[2..].iter().map(|&q| q as i8 as f32 * d));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_block_layout() {
        // d = 0.5, m = -1: byte j = (j & 15) | ((15 - j) << 4)
        let mut blk = vec![];
        blk.extend(f16::from_f32(0.5).to_le_bytes());
        blk.extend(f16::from_f32(-1.0).to_le_bytes());
        blk.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let x = dequantize(GgmlType::Q4_1, &blk, 32);
        for j in 0..16 {
            assert_eq!(x[j], j as f32 * 0.5 - 1.0);
            assert_eq!(x[j + 16], (15 - j) as f32 * 0.5 - 1.0);
        }
    }

    #[test]
    fn q8_0_and_q4_0_blocks() {
        let mut blk = vec![];
        blk.extend(f16::from_f32(0.25).to_le_bytes());
        blk.extend((0..32i8).map(|j| (j - 16) as u8));
        let x = dequantize(GgmlType::Q8_0, &blk, 32);
        assert!(x
            .iter()
            .enumerate()
            .all(|(j, &v)| v == (j as f32 - 16.0) * 0.25));
        let mut blk = vec![];
        blk.extend(f16::from_f32(2.0).to_le_bytes());
        blk.extend([0x80u8; 16]);
        let x = dequantize(GgmlType::Q4_0, &blk, 32);
        assert!(x[..16].iter().all(|&v| v == -16.0) && x[16..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn rows_must_split_into_blocks() {
        assert!(GgmlType::Q4_1.bytes_for(48, 96).is_err());
        assert_eq!(GgmlType::Q4_1.bytes_for(64, 128), Ok(4 * 20));
        assert_eq!(GgmlType::F32.bytes_for(3, 6), Ok(24));
    }
}
