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

// ---- 2-bit codes at 2 bits (crumbs)
//
// Key codebooks of at most 2 bits (k2 without QJL, k3q, k2q) and 2-bit values are stored 4 codes
// to a byte. The crumb layout is derived from the nibble layout above, per lane block (the `d/8`
// bytes a lane's B fragments come from: key rows have 4, value pair records 8): the block's
// `d/32` nibble words become `d/64` crumb words, crumb word `j` holding nibble word `2j` in bits
// 0-1 of every nibble and nibble word `2j + 1` in bits 2-3. The decode gets the nibble words back
// with `x & 0x33333333` and `(x >> 2) & 0x33333333` (two LOP3 and a shift a crumb word) and then
// runs the nibble path unchanged. A key row is `d/4` bytes, lane block `q` at `q·d/16`; a value
// pair record is `d/2` bytes, lane block `g` at `g·d/16`; the even token's codes are the low
// nibble of every byte (bits 0-3: two crumbs), the odd token's the high nibble, as in the nibble
// layout (so an append of one token of a pair masks the same way).

/// Whether codes of `bits` bits are stored as crumbs (4 a byte) rather than nibbles.
pub fn crumbs(bits: u8) -> bool {
    bits <= 2
}

/// Device bytes of one key row's codes (`crumbs`: 2-bit layout) at head dim `d`.
pub fn key_code_bytes(d: usize, crumbs: bool) -> usize {
    if crumbs {
        d / 4
    } else {
        d / 2
    }
}

/// Device bytes of one value token pair's codes.
pub fn value_pair_bytes(d: usize, crumbs: bool) -> usize {
    if crumbs {
        d / 2
    } else {
        d
    }
}

/// Nibble-layout bytes (whole lane blocks of `d/8` bytes, every nibble < 4) as crumb bytes: byte
/// `4j + b` of a block's crumbs is `(n[8j + b] & 0x33) | (n[8j + 4 + b] & 0x33) << 2`, so a
/// nibble byte's low nibble lands in bits 0-1 (or 2-3) and its high nibble in bits 4-5 (6-7).
pub fn crumbs_of_nibbles(d: usize, nib: &[u8]) -> Vec<u8> {
    let blk = d / 8;
    assert!(
        nib.len().is_multiple_of(blk) && blk.is_multiple_of(8),
        "whole lane blocks of d/8 bytes"
    );
    let mut out = vec![0u8; nib.len() / 2];
    for (bi, block) in nib.chunks(blk).enumerate() {
        for gamma in 0..blk / 2 {
            let (j, b) = (gamma / 4, gamma % 4);
            let (x, y) = (block[8 * j + b], block[8 * j + 4 + b]);
            debug_assert!(x & 0xcc == 0 && y & 0xcc == 0, "codes of at most 2 bits");
            out[bi * blk / 2 + gamma] = (x & 0x33) | (y & 0x33) << 2;
        }
    }
    out
}

/// Inverse of [`crumbs_of_nibbles`].
pub fn nibbles_of_crumbs(d: usize, cr: &[u8]) -> Vec<u8> {
    let half = d / 16;
    let mut out = vec![0u8; cr.len() * 2];
    for (bi, block) in cr.chunks(half).enumerate() {
        for (gamma, &c) in block.iter().enumerate() {
            let (j, b) = (gamma / 4, gamma % 4);
            out[bi * 2 * half + 8 * j + b] = c & 0x33;
            out[bi * 2 * half + 8 * j + 4 + b] = (c >> 2) & 0x33;
        }
    }
    out
}

/// The decode's unpacking of one crumb word into its two nibble words (the LOP3s and the shift
/// of `turboquant_decode.cu`'s `crumb_words`).
pub fn nibble_words_of_crumb_word(x: u32) -> (u32, u32) {
    (x & 0x3333_3333, (x >> 2) & 0x3333_3333)
}

/// One key row (`d` indices) as its device bytes (`crumbs`: `d/4`, else `d/2`).
pub fn pack_key_row(idx: &[u8], crumbs: bool) -> Vec<u8> {
    let nib = pack_key_codes(idx);
    if crumbs {
        crumbs_of_nibbles(idx.len(), &nib)
    } else {
        nib
    }
}

/// Inverse of [`pack_key_row`] at head dim `d`.
pub fn unpack_key_row(d: usize, dev: &[u8], crumbs: bool) -> Vec<u8> {
    if crumbs {
        unpack_key_codes(&nibbles_of_crumbs(d, dev))
    } else {
        unpack_key_codes(dev)
    }
}

/// Token `e` of a value pair record in either layout, as `d` indices.
pub fn unpack_value_pair(d: usize, rec: &[u8], e: usize, crumbs: bool) -> Vec<u8> {
    if crumbs {
        unpack_value_codes(&nibbles_of_crumbs(d, rec), e)
    } else {
        unpack_value_codes(rec, e)
    }
}

/// A value token pair (`even`, `odd`: `d` indices each) as its device record in either layout.
pub fn pack_value_pair(even: &[u8], odd: &[u8], crumbs: bool) -> Vec<u8> {
    let d = even.len();
    let nib: Vec<u8> = (0..d)
        .map(|beta| {
            let c = value_byte_channel(d, beta);
            even[c] | odd[c] << 4
        })
        .collect();
    if crumbs {
        crumbs_of_nibbles(d, &nib)
    } else {
        nib
    }
}

/// Device bytes a decode reads per token and KV head: key codes, signs (QJL), `{‖k‖, ‖r‖}`,
/// value codes (half a pair record), `‖v‖`. At d = 128: k4q-v3 150, k3q-v2 86, k2-v2 70.
pub fn bytes_per_token_head(
    d: usize,
    key_qjl: bool,
    key_crumbs: bool,
    value_crumbs: bool,
) -> usize {
    key_code_bytes(d, key_crumbs)
        + if key_qjl { d / 8 } else { 0 }
        + 4
        + value_pair_bytes(d, value_crumbs) / 2
        + 2
}
