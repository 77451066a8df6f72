/// First channel of key code byte `beta` of a token row (the second is the next channel):
/// lane block `q = beta / (d/8)` holds the channels of lane `4g + q`'s B fragments.
pub fn key_byte_channel(d: usize, beta: usize) -> usize {
    let (q, bl) = (beta / (d / 8), beta % (d / 8));
    16 * (bl / 2) + 8 * (bl % 2) + 2 * q
}

/// Channel of sign bit `bit` (0 .. d) of a token row's sign bytes.
pub fn sign_bit_channel(d: usize, bit: usize) -> usize {
    let per_lane = d / 4; // bits per lane block
    let (q, b) = (bit / per_lane, bit % per_lane);
    let (jj, e) = (b % (d / 8), b / (d / 8));
    16 * (jj / 2) + 8 * (jj % 2) + 2 * q + e
}

/// Channel of value code byte `beta` of a token pair (both tokens' nibbles share it).
pub fn value_byte_channel(d: usize, beta: usize) -> usize {
    let (g, nu) = (beta / (d / 8), beta % (d / 8));
    8 * nu + g
}

/// One key row (`d` indices) as its `d / 2` device bytes.
pub fn pack_key_codes(idx: &[u8]) -> Vec<u8> {
    let d = idx.len();
    (0..d / 2)
        .map(|beta| {
            let c = key_byte_channel(d, beta);
            idx[c] | (idx[c + 1] << 4)
        })
        .collect()
}

/// The core's packed signs (bit `i % 8` of byte `i / 8` is channel `i`) as device bytes.
pub fn pack_signs(d: usize, signs: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; d / 8];
    for bit in 0..d {
        let c = sign_bit_channel(d, bit);
        // lane block of d/32 bytes, little-endian word
        if signs[c / 8] >> (c % 8) & 1 == 1 {
            out[bit / 8] |= 1 << (bit % 8);
        }
    }
    out
}

/// Inverse of [`pack_signs`].
pub fn unpack_signs(d: usize, dev: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; d / 8];
    for bit in 0..d {
        if dev[bit / 8] >> (bit % 8) & 1 == 1 {
            let c = sign_bit_channel(d, bit);
            out[c / 8] |= 1 << (c % 8);
        }
    }
    out
}

/// Inverse of [`pack_key_codes`].
pub fn unpack_key_codes(dev: &[u8]) -> Vec<u8> {
    let d = dev.len() * 2;
    let mut idx = vec![0u8; d];
    for (beta, &byte) in dev.iter().enumerate() {
        let c = key_byte_channel(d, beta);
        idx[c] = byte & 15;
        idx[c + 1] = byte >> 4;
    }
    idx
}

/// Token `e` (0: even, 1: odd) of a value pair record (`d` bytes) as `d` indices.
pub fn unpack_value_codes(rec: &[u8], e: usize) -> Vec<u8> {
    let d = rec.len();
    let mut idx = vec![0u8; d];
    for (beta, &byte) in rec.iter().enumerate() {
        idx[value_byte_channel(d, beta)] = (byte >> (4 * e)) & 15;
    }
    idx
}
