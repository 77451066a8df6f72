//! FlashQ blockwise progressive quantization (BPQ), TurboAttention section 3.1.
//!
//! Stage 1 (Eq. 9; Alg. 1 line "compute s_Q = max(abs(Q_i))/119, Q_i^q1 = round(Q_i / s_Q)"):
//! INT8 symmetric quantization of a whole block (`B_r` query rows or `B_c` key/value rows of one
//! head, every channel) with one `f32` scale.
//!
//! Stage 2 (Eq. 10; Alg. 1 lines "compute s^int_K^q2 ..., z^int_K^q2 ..., K_j^q2 ..."
//! (channelwise)): asymmetric INT4 or INT2 quantization of the INT8 codes of one cache block,
//! one integer scale and one integer zero point per channel, all in integer arithmetic.
//! Decompression (Alg. 2 line "K_j^q1 = K_j^q2 s^int + z") returns INT8 codes, so the
//! attention matmuls stay on INT8 tensor cores.
//!
//! The exact integer rules (rounding, clamping, packing order) are stated in the parent module's
//! docs and on each function; they are the contract a GPU kernel must reproduce bit for bit.

use serde::{Deserialize, Serialize};

/// Divisor of the INT8 scale: `s = max|x| / 119` (Alg. 1). The 8 codes of headroom up to 127
/// are what the decode buffer's clamping (section 3.3) uses for tokens larger than its scale.
pub const INT8_DIVISOR: f32 = 119.0;

/// Largest INT8 code magnitude; codes are clamped to `[-127, 127]` (symmetric, -128 unused).
pub const INT8_MAX_CODE: i32 = 127;

/// Round half to even, the mode of CUDA's `__float2int_rn` / PTX `cvt.rni`.
#[inline]
pub fn rne(x: f32) -> f32 {
    x.round_ties_even()
}

/// INT8 scale of a set of values: `max|x| / 119` as one IEEE `f32` division.
pub fn int8_scale<'a>(values: impl IntoIterator<Item = &'a f32>) -> f32 {
    let amax = values.into_iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    amax / INT8_DIVISOR
}

/// INT8 code of `x` under `scale`: `clamp(rne(x / scale), -127, 127)`; 0 when `scale == 0`.
#[inline]
pub fn quantize_int8(x: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    rne(x / scale).clamp(-INT8_MAX_CODE as f32, INT8_MAX_CODE as f32) as i8
}

/// A block of rows quantized to INT8 with one scale (BPQ stage 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Block {
    /// Scale in value units per code (`max|x| / 119`, or the decode buffer's universal scale).
    pub scale: f32,
    /// Rows (tokens) in the block.
    pub rows: usize,
    /// `rows x d` codes, row-major, each in `[-127, 127]`.
    pub codes: Vec<i8>,
}

impl Int8Block {
    /// Quantizes `rows` (each of the same length `d`) with the scale of their absolute maximum.
    pub fn quantize(rows: &[&[f32]]) -> Int8Block {
        let scale = int8_scale(rows.iter().flat_map(|r| r.iter()));
        Int8Block::quantize_with_scale(rows, scale)
    }

    /// Quantizes `rows` with a given scale, clamping codes to `[-127, 127]`.
    pub fn quantize_with_scale(rows: &[&[f32]], scale: f32) -> Int8Block {
        let codes = rows
            .iter()
            .flat_map(|r| r.iter().map(|&x| quantize_int8(x, scale)))
            .collect();
        Int8Block {
            scale,
            rows: rows.len(),
            codes,
        }
    }

    /// The values the codes stand for: `code * scale`.
    pub fn dequantize(&self) -> Vec<f32> {
        self.codes.iter().map(|&c| c as f32 * self.scale).collect()
    }
}

/// Integer scale and zero point of one channel of one cache block (BPQ stage 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelParams {
    /// Step between adjacent low-bit codes, in INT8 codes (`>= 1`).
    pub scale: u8,
    /// INT8 code that low-bit code 0 stands for (the channel's minimum in the block).
    pub zero: i8,
}

/// Largest low-bit code: `2^bits - 1` (15 for INT4, 3 for INT2).
#[inline]
pub fn max_code(bits: u8) -> i32 {
    (1i32 << bits) - 1
}

impl ChannelParams {
    /// Parameters for a channel whose INT8 codes span `[lo, hi]`:
    /// `scale = max(1, ceil((hi - lo) / (2^bits - 1)))`, `zero = lo`.
    ///
    /// The listing rounds the scale to nearest; the ceiling is used so that every code of the
    /// channel lands in `[0, 2^bits - 1]` without clipping. The zero point is stored as the
    /// INT8 minimum itself (the listing's `z^int * s^int`), which costs the same INT8 byte and
    /// adds no rounding of its own.
    pub fn fit(lo: i8, hi: i8, bits: u8) -> ChannelParams {
        let range = hi as i32 - lo as i32;
        let levels = max_code(bits);
        let scale = ((range + levels - 1) / levels).max(1);
        ChannelParams {
            scale: scale as u8,
            zero: lo,
        }
    }

    /// Low-bit code of INT8 code `x`: `floor((2 (x - zero) + scale) / (2 scale))`, i.e.
    /// `(x - zero) / scale` rounded half up, then clamped to `[0, 2^bits - 1]` (a no-op for
    /// `x` inside the fitted range).
    #[inline]
    pub fn encode(self, x: i8, bits: u8) -> u8 {
        let num = 2 * (x as i32 - self.zero as i32) + self.scale as i32;
        let code = num.div_euclid(2 * self.scale as i32);
        code.clamp(0, max_code(bits)) as u8
    }

    /// INT8 code a low-bit code stands for: `clamp(code * scale + zero, -127, 127)` (Alg. 2).
    /// The clamp keeps the result an INT8 tensor-core operand; it only bites for the top code
    /// when the ceiling of the scale overshoots past 127.
    #[inline]
    pub fn decode(self, code: u8) -> i8 {
        let x = code as i32 * self.scale as i32 + self.zero as i32;
        x.clamp(-INT8_MAX_CODE, INT8_MAX_CODE) as i8
    }
}

/// Packs low-bit codes, `8 / bits` per byte, first code in the least significant bits.
///
/// Code `i` goes to byte `i * bits / 8` at bit offset `(i * bits) % 8`. For a block stored
/// token-major (`codes[t * d + c]`) with `d` a multiple of 4, each token row starts on a byte
/// boundary: byte `k` of a row holds channels `2k` (bits 0-3) and `2k + 1` (bits 4-7) for INT4,
/// channels `4k .. 4k + 3` at bits 0-1, 2-3, 4-5, 6-7 for INT2.
pub fn pack_codes(codes: &[u8], bits: u8) -> Vec<u8> {
    debug_assert!(bits == 2 || bits == 4, "bits {bits}");
    let per_byte = (8 / bits) as usize;
    let mask = max_code(bits) as u8;
    let mut out = vec![0u8; codes.len().div_ceil(per_byte)];
    for (i, &c) in codes.iter().enumerate() {
        out[i / per_byte] |= (c & mask) << ((i % per_byte) as u8 * bits);
    }
    out
}

/// Inverse of [`pack_codes`]: the first `n` codes.
pub fn unpack_codes(packed: &[u8], bits: u8, n: usize) -> Vec<u8> {
    let per_byte = (8 / bits) as usize;
    let mask = max_code(bits) as u8;
    (0..n)
        .map(|i| (packed[i / per_byte] >> ((i % per_byte) as u8 * bits)) & mask)
        .collect()
}

/// One compressed cache block of K or V of one head: `tokens x d` INT4/INT2 codes with
/// per-channel integer scale and zero point, plus the block's INT8 scale.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackedBlock {
    /// Tokens in the block (`B_c` = 64 for every block the cache holds).
    pub tokens: usize,
    /// Bits per code: 4 or 2.
    pub bits: u8,
    /// `f32` INT8 scale of the block (value units per INT8 code), `s_K` / `s_V` of Alg. 1-2.
    pub int8_scale: f32,
    /// Per-channel integer scale and zero point, `d` entries.
    pub channels: Vec<ChannelParams>,
    /// Packed codes, token-major, see [`pack_codes`]: `tokens * d * bits / 8` bytes.
    pub packed: Vec<u8>,
}

impl PackedBlock {
    /// Compresses an INT8 block of `d` channels channel by channel (BPQ stage 2, Eq. 10).
    pub fn compress(block: &Int8Block, d: usize, bits: u8) -> PackedBlock {
        let rows = block.rows;
        let channels: Vec<ChannelParams> = (0..d)
            .map(|c| {
                let col = (0..rows).map(|t| block.codes[t * d + c]);
                let lo = col.clone().min().unwrap_or(0);
                let hi = col.max().unwrap_or(0);
                ChannelParams::fit(lo, hi, bits)
            })
            .collect();
        let codes: Vec<u8> = (0..rows * d)
            .map(|i| channels[i % d].encode(block.codes[i], bits))
            .collect();
        PackedBlock {
            tokens: rows,
            bits,
            int8_scale: block.scale,
            channels,
            packed: pack_codes(&codes, bits),
        }
    }

    /// Back to INT8 codes in integer arithmetic (Alg. 2), `tokens x d` row-major.
    pub fn decompress(&self) -> Int8Block {
        let d = self.channels.len();
        let codes = unpack_codes(&self.packed, self.bits, self.tokens * d);
        let codes = codes
            .iter()
            .enumerate()
            .map(|(i, &c)| self.channels[i % d].decode(c))
            .collect();
        Int8Block {
            scale: self.int8_scale,
            rows: self.tokens,
            codes,
        }
    }

    /// Bytes this block occupies in the cache: codes, one scale and one zero byte per channel,
    /// and the `f32` INT8 scale.
    pub fn bytes(&self) -> usize {
        self.packed.len() + 2 * self.channels.len() + 4
    }
}

/// Bytes of one compressed block of `tokens` tokens and `d` channels at `bits` bits; equals
/// [`PackedBlock::bytes`] of such a block.
pub fn packed_block_bytes(tokens: usize, d: usize, bits: u8) -> usize {
    (tokens * d * bits as usize).div_ceil(8) + 2 * d + 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    #[test]
    fn turbo_rne_is_half_to_even() {
        assert_eq!(rne(0.5), 0.0);
        assert_eq!(rne(1.5), 2.0);
        assert_eq!(rne(2.5), 2.0);
        assert_eq!(rne(-2.5), -2.0);
        assert_eq!(rne(-3.5), -4.0);
        assert_eq!(rne(2.4999998), 2.0);
    }

    #[test]
    fn turbo_int8_block_round_trip_within_half_a_step() {
        let mut rng = StdRng::seed_from_u64(11);
        for rows in [1usize, 37, 64] {
            let data: Vec<Vec<f32>> = (0..rows)
                .map(|_| (0..64).map(|_| rng.gen_range(-3.0f32..3.0)).collect())
                .collect();
            let refs: Vec<&[f32]> = data.iter().map(|r| r.as_slice()).collect();
            let b = Int8Block::quantize(&refs);
            let amax = data.iter().flatten().fold(0.0f32, |m, x| m.max(x.abs()));
            assert_eq!(b.scale, amax / 119.0);
            // the largest magnitude maps to exactly +-119, never beyond
            assert_eq!(b.codes.iter().map(|c| (*c as i32).abs()).max(), Some(119));
            for (x, y) in data.iter().flatten().zip(b.dequantize()) {
                // |x - code*s| <= s/2, plus f32 rounding of x/s and of code*s (a few ulps of amax)
                let bound = 0.5 * b.scale + 4.0 * f32::EPSILON * amax;
                assert!((x - y).abs() <= bound, "{x} vs {y}, scale {}", b.scale);
            }
        }
    }

    #[test]
    fn turbo_int8_zero_block_and_clamping() {
        let zeros = [0.0f32; 8];
        let b = Int8Block::quantize(&[&zeros[..]]);
        assert_eq!(b.scale, 0.0);
        assert!(b.codes.iter().all(|&c| c == 0));
        // a fixed scale smaller than the data's clamps at +-127 (decode buffer case)
        // (scale 1: exact quotients) ties go to even, beyond +-127 clamps
        let row = [0.5f32, 1.5, 2.5, -2.5, 126.6, 200.0, -1e6];
        let b = Int8Block::quantize_with_scale(&[&row[..]], 1.0);
        assert_eq!(b.codes, vec![0, 2, 2, -2, 127, 127, -127]);
    }

    #[test]
    fn turbo_channel_params_cover_range_without_clipping() {
        for bits in [2u8, 4] {
            for lo in (-127i32..=127).step_by(7) {
                for hi in (lo..=127).step_by(5) {
                    let p = ChannelParams::fit(lo as i8, hi as i8, bits);
                    let bound = p.scale as i32 / 2; // round half up: error <= floor(s/2)
                    for x in lo..=hi {
                        let code = p.encode(x as i8, bits);
                        assert!(code as i32 <= max_code(bits));
                        // the unclamped code is already in range: no clipping happens
                        let raw = (2 * (x - lo) + p.scale as i32) / (2 * p.scale as i32);
                        assert_eq!(raw, code as i32, "bits {bits} lo {lo} hi {hi} x {x}");
                        let back = p.decode(code) as i32;
                        assert!(
                            (back - x).abs() <= bound,
                            "bits {bits} [{lo},{hi}] x {x} -> {back}, s {}",
                            p.scale
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn turbo_channel_rounding_is_half_up() {
        // scale 2, zero 0: x = 1 is exactly half way between codes 0 and 1 -> 1; x = 3 -> 2
        let p = ChannelParams { scale: 2, zero: 0 };
        assert_eq!(p.encode(1, 4), 1);
        assert_eq!(p.encode(3, 4), 2);
        // negative offset from the zero point clamps to code 0
        assert_eq!(p.encode(-5, 4), 0);
        // the top code can overshoot 127 before the decode clamp: lo 0, hi 127, 2 bits -> s 43
        let p = ChannelParams::fit(0, 127, 2);
        assert_eq!(p.scale, 43);
        assert_eq!(p.decode(3), 127);
    }

    #[test]
    fn turbo_pack_unpack_round_trip_and_layout() {
        let mut rng = StdRng::seed_from_u64(5);
        for bits in [2u8, 4] {
            for n in [1usize, 3, 4, 63, 64, 257] {
                let codes: Vec<u8> = (0..n)
                    .map(|_| rng.gen_range(0..=max_code(bits) as u8))
                    .collect();
                let packed = pack_codes(&codes, bits);
                assert_eq!(packed.len(), (n * bits as usize).div_ceil(8));
                assert_eq!(unpack_codes(&packed, bits, n), codes);
            }
        }
        // documented order: first code in the low bits
        assert_eq!(pack_codes(&[0x1, 0xA], 4), vec![0xA1]);
        assert_eq!(pack_codes(&[1, 2, 3, 0], 2), vec![0b00_11_10_01]);
    }

    #[test]
    fn turbo_packed_block_round_trip_error_bound() {
        let mut rng = StdRng::seed_from_u64(9);
        let d = 64;
        for bits in [2u8, 4] {
            for rows in [1usize, 5, 64] {
                let data: Vec<Vec<f32>> = (0..rows)
                    .map(|_| {
                        (0..d)
                            .map(|c| rng.gen_range(-1.0f32..1.0) * (1 + c % 5) as f32)
                            .collect()
                    })
                    .collect();
                let refs: Vec<&[f32]> = data.iter().map(|r| r.as_slice()).collect();
                let b8 = Int8Block::quantize(&refs);
                let pb = PackedBlock::compress(&b8, d, bits);
                assert_eq!(pb.bytes(), packed_block_bytes(rows, d, bits));
                let back = pb.decompress();
                assert_eq!(back.scale, b8.scale);
                for c in 0..d {
                    let half = (pb.channels[c].scale / 2) as i32;
                    for t in 0..rows {
                        let (x, y) = (b8.codes[t * d + c] as i32, back.codes[t * d + c] as i32);
                        assert!((x - y).abs() <= half, "bits {bits} t {t} c {c}: {x} -> {y}");
                    }
                }
            }
        }
    }
}
