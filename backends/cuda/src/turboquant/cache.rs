//! The compressed cache on the device ([`DeviceTurboQuantCache`]).

use super::layout;
use crate::device::DeviceBuffer;
use crate::error::Result;
use ferrattn_core::turboquant::CompressedKv;
#[cfg(doc)] // intra-doc links only
use ferrattn_core::turboquant::TurboQuantCodec;
use half::f16;

/// The compressed cache on the device, contiguous per (sequence, KV head), `capacity` tokens.
#[derive(Debug)]
pub struct DeviceTurboQuantCache {
    pub(super) batch: usize,
    pub(super) heads_kv: usize,
    pub(super) head_dim: usize,
    pub(super) capacity: usize,
    pub(super) key_qjl: bool,
    /// Key codes as crumbs (codebook of at most 2 bits: [`layout::crumbs`]), else nibbles.
    pub(super) key_crumbs: bool,
    /// Value codes as crumbs (2-bit values), else nibbles.
    pub(super) value_crumbs: bool,
    pub(super) lens: Vec<usize>,
    pub(super) kcodes: DeviceBuffer,
    pub(super) ksigns: DeviceBuffer,
    pub(super) knorms: DeviceBuffer,
    pub(super) vcodes: DeviceBuffer,
    pub(super) vnorms: DeviceBuffer,
}

impl DeviceTurboQuantCache {
    /// Address of the key (`keys`) or value codes, as the compression kernels write them.
    pub(super) fn codes_of(&self, keys: bool) -> u64 {
        if keys {
            self.kcodes.ptr()
        } else {
            self.vcodes.ptr()
        }
    }

    /// Address of the key (`keys`) or value norms, as the compression kernels write them.
    pub(super) fn norms_of(&self, keys: bool) -> u64 {
        if keys {
            self.knorms.ptr()
        } else {
            self.vnorms.ptr()
        }
    }

    /// Tokens held per sequence.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Tokens each sequence can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes a decode step reads for the valid tokens (K codes, signs with QJL, norms, V codes
    /// and norms).
    pub fn bytes_read(&self) -> usize {
        self.lens.iter().sum::<usize>() * self.heads_kv * self.bytes_per_token_head()
    }

    /// Device bytes a decode reads per token and KV head: `d/2 + 4` for keys (`+ d/8` of signs
    /// with QJL), `d/2 + 2` for values, one nibble per coordinate for codes of 3-4 bits; codes
    /// of at most 2 bits take 2 bits (`d/4` instead of `d/2`: [`layout::bytes_per_token_head`]).
    pub fn bytes_per_token_head(&self) -> usize {
        layout::bytes_per_token_head(
            self.head_dim,
            self.key_qjl,
            self.key_crumbs,
            self.value_crumbs,
        )
    }

    /// Whether key and value codes are stored as crumbs (4 a byte).
    pub fn crumbs(&self) -> (bool, bool) {
        (self.key_crumbs, self.value_crumbs)
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// KV heads.
    pub fn heads_kv(&self) -> usize {
        self.heads_kv
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Whether keys carry QJL signs and residual norms.
    pub fn key_qjl(&self) -> bool {
        self.key_qjl
    }

    /// Device bytes allocated for the cache (its capacity, every buffer).
    pub fn allocated_bytes(&self) -> usize {
        [
            &self.kcodes,
            &self.ksigns,
            &self.knorms,
            &self.vcodes,
            &self.vnorms,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum()
    }

    /// Forgets every token (lengths to 0); the bytes stay until overwritten by the next append.
    pub fn clear(&mut self) {
        self.lens.iter_mut().for_each(|l| *l = 0);
    }

    /// `‖k‖` of the first token of every (sequence, KV head), as f32 (a cheap look at a cache
    /// written on the device, without downloading it all).
    pub fn first_key_norms(&self) -> Result<Vec<f32>> {
        let kn: Vec<u32> = self.knorms.to_vec()?;
        Ok((0..self.batch * self.heads_kv)
            .map(|bh| f16::from_bits(kn[bh * self.capacity] as u16).to_f32())
            .collect())
    }

    /// Copies the cache back as the core's [`CompressedKv`] over `max_seqlen_k` padded tokens
    /// (rows past each sequence's length are zero, as [`TurboQuantCodec::compress`] leaves them).
    pub fn download(&self, max_seqlen_k: usize) -> Result<CompressedKv> {
        let (b_, hk, d, cap) = (self.batch, self.heads_kv, self.head_dim, self.capacity);
        let kc: Vec<u8> = self.kcodes.to_vec()?;
        let ks: Vec<u8> = self.ksigns.to_vec()?;
        let kn: Vec<u32> = self.knorms.to_vec()?;
        let vc: Vec<u8> = self.vcodes.to_vec()?;
        let vn: Vec<u16> = self.vnorms.to_vec()?;
        let rows = b_ * max_seqlen_k * hk;
        let mut kv = CompressedKv {
            batch: b_,
            max_seqlen_k,
            heads_kv: hk,
            head_dim_k: d,
            head_dim_v: d,
            qjl_dim: d,
            seqlens_k: self.lens.clone(),
            k_idx: vec![0; rows * d],
            k_norm: vec![0.0; rows],
            k_signs: vec![0; rows * d / 8],
            r_norm: vec![0.0; rows],
            v_idx: vec![0; rows * d],
            v_norm: vec![0.0; rows],
        };
        let h2f = |b: u16| f16::from_bits(b).to_f32();
        let kb = layout::key_code_bytes(d, self.key_crumbs);
        let vb = layout::value_pair_bytes(d, self.value_crumbs);
        for b in 0..b_ {
            for j in 0..self.lens[b].min(max_seqlen_k) {
                for h in 0..hk {
                    let src = (b * hk + h) * cap + j;
                    let dst = (b * max_seqlen_k + j) * hk + h;
                    kv.k_idx[dst * d..(dst + 1) * d].copy_from_slice(&layout::unpack_key_row(
                        d,
                        &kc[src * kb..(src + 1) * kb],
                        self.key_crumbs,
                    ));
                    kv.k_signs[dst * d / 8..(dst + 1) * d / 8].copy_from_slice(
                        &layout::unpack_signs(d, &ks[src * d / 8..(src + 1) * d / 8]),
                    );
                    kv.k_norm[dst] = h2f(kn[src] as u16);
                    kv.r_norm[dst] = h2f((kn[src] >> 16) as u16);
                    let pair = ((b * hk + h) * cap) / 2 + j / 2;
                    kv.v_idx[dst * d..(dst + 1) * d].copy_from_slice(&layout::unpack_value_pair(
                        d,
                        &vc[pair * vb..(pair + 1) * vb],
                        j % 2,
                        self.value_crumbs,
                    ));
                    kv.v_norm[dst] = h2f(vn[src]);
                }
            }
        }
        Ok(kv)
    }
}
