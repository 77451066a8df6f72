//! TurboQuant KV compression (Zandieh et al., arXiv 2504.19874) and attention over it, in the
//! dataflow of the fused TurboQuant attention kernel (`shared/papers/turboquant-fused-attention-kernels.txt`).
//!
//! * [`rotation`]: the seeded Haar rotation `Π` (dense; see there for why not Hadamard).
//! * [`codebook`](mod@codebook): Lloyd-Max codebooks for one rotated coordinate, computed from the exact
//!   coordinate law `∝ (1 - t²)^((d-3)/2)` and cached per `(bits, d)`.
//! * [`quant`]: `TurboQuant_mse` ([`MseQuantizer`]) and `TurboQuant_prod` ([`ProdQuantizer`]:
//!   `b-1` MSE bits + a 1-bit QJL sketch of the residual, unbiased inner products).
//! * [`attention`]: the compressed cache in kernel operand layout and the fused attention loop
//!   (keys by prod estimate with the query rotated once, values decompressed per block, online
//!   softmax, GQA, ragged lengths, causal).
//! * [`distortion`]: the paper's distortion figures, measured ([`distortion_table`]).
//!
//! [`plan`] picks the paper's settings (4-bit keys = 3-bit codebook + QJL, 3-bit values, `m = d`)
//! and a KV block that fits the device; [`emulate`] compresses K and V and runs the fused loop on
//! the CPU; [`TurboQuantConfig::compression`] accounts the bytes per token against fp16.

pub mod accuracy;
pub mod attention;
pub mod codebook;
pub mod distortion;
pub mod planes;
pub mod quant;
pub mod rng;
pub mod rotation;

#[cfg(test)]
mod tests;

pub use attention::{CompressedKv, TurboQuantCodec};
pub use codebook::{codebook, Codebook, CoordinateLaw};
pub use distortion::{distortion_table, DistortionRow};
pub use quant::{MseCode, MseQuantizer, PreparedQuery, ProdCode, ProdQuantizer, QjlSketch};
pub use rotation::Rotation;

use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, BackendKind, BlockSizes, CoreError,
    DeviceCaps, KvLayout, Result,
};
use serde::{Deserialize, Serialize};

/// Bit widths the attention path supports for keys (total, QJL bit included) and values.
pub const SUPPORTED_BITS: std::ops::RangeInclusive<u8> = 1..=4;
/// Smallest supported head dim.
pub const MIN_HEAD_DIM: usize = 16;
/// Largest supported head dim.
pub const MAX_HEAD_DIM: usize = 1024;
/// Head dims must be multiples of this (tensor-core `k` granularity of an fp16 MMA).
pub const HEAD_DIM_MULTIPLE: usize = 8;
/// The QJL dimension `m` must be a multiple of this (sign rows are packed in bytes).
pub const QJL_DIM_MULTIPLE: usize = 8;
/// On CUDA, `block_k` must be a multiple of this (the MMA tile).
pub const CUDA_BLOCK_K_MULTIPLE: usize = 16;
/// Largest QJL sketch dimension `m`.
pub const MAX_QJL_DIM: usize = 4096;
/// Largest KV block.
pub const MAX_BLOCK_K: usize = 1024;
/// Default key bits: a 3-bit codebook (8 centroids, the kernel's `_3bit` variant) plus the QJL bit.
pub const DEFAULT_KEY_BITS: u8 = 4;
/// Default value bits: the same 8-centroid codebook. With 4-bit keys that is 3.5 bits per channel
/// on average, the budget at which the paper reports quality-neutral KV caches (the paper gets
/// there by giving outlier channels more bits than the rest, which this module does not do).
pub const DEFAULT_VALUE_BITS: u8 = 3;
/// Preferred KV block; smaller ones are tried when the fused kernel's shared memory would not fit.
pub const DEFAULT_BLOCK_K: usize = 64;
/// Default seed of `Π` and `S` (any fixed value; a deployment stores its own per layer).
pub const DEFAULT_SEED: u64 = 0x7475_7262_6f71_7561; // "turboqua"
/// Pipeline stages of the fused kernel's KV loads (`latency=2`).
pub const KERNEL_STAGES: usize = 2;

/// TurboQuant settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurboQuantConfig {
    /// Keys per tile of the fused decode.
    pub block_k: usize,
    /// Bits per key coordinate: with [`Self::key_qjl`], `b` of `TurboQuant_prod` (`b - 1`
    /// codebook bits plus 1 QJL bit, `m / d` bits, exactly 1 when `qjl_dim = d`); without it, all
    /// `b` bits on the MSE codebook (`TurboQuant_mse` keys).
    pub key_bits: u8,
    /// Keys carry the QJL sketch of their residual (`TurboQuant_prod`, unbiased inner products).
    /// `false` puts all `key_bits` on the Lloyd-Max codebook and stores neither signs nor `‖r‖`:
    /// biased inner products (`<q, k_mse>` shrinks them by `1 - D_mse` on average) but lower
    /// variance, which practice reports keeps top-1 agreement better (llama.cpp forks use
    /// MSE-only keys; issue 10).
    #[serde(default = "default_key_qjl")]
    pub key_qjl: bool,
    /// Bits per value coordinate (`TurboQuant_mse` codebook).
    pub value_bits: u8,
    /// QJL sketch rows `m` (the paper uses `m = d`).
    pub qjl_dim: usize,
    /// Seed of the rotation `Π` and the sketch `S`.
    pub seed: u64,
    /// Un-rotate each finished output row once instead of each value tile (same result up to
    /// rounding; the kernel write-up un-rotates per tile).
    pub defer_value_unrotation: bool,
}

impl BlockSizes for TurboQuantConfig {
    fn block_q(&self) -> usize {
        1
    }
    fn block_k(&self) -> usize {
        self.block_k
    }
}

fn default_key_qjl() -> bool {
    true
}

/// Bytes of a TurboQuant KV cache against fp16.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compression {
    /// Bits of one key row (one token, one KV head), packed: `(b_k - 1) d_k + m + 2 · 16` (f16 `‖k‖`
    /// and `‖r‖`), or `b_k d_k + 16` without QJL.
    pub key_bits_per_row: usize,
    /// Bits of one value row, packed: `b_v d_v + 16` (f16 `‖v‖`).
    pub value_bits_per_row: usize,
    /// K + V bytes per token over all KV heads, indices bit-packed.
    pub packed_bytes_per_token: f64,
    /// K + V bytes per token in the fused kernel's operand layout (one `u8` per index, packed
    /// signs, f16 norms).
    pub kernel_bytes_per_token: usize,
    /// K + V bytes per token in fp16: `2 H_k (d_k + d_v)`.
    pub fp16_bytes_per_token: usize,
    /// `fp16 / packed`.
    pub packed_ratio: f64,
    /// `fp16 / kernel layout`.
    pub kernel_ratio: f64,
    /// Packed bits per K/V coordinate, norms included.
    pub bits_per_coordinate: f64,
    /// One-off fp16 matrices per layer: `Π` per distinct head dim and `S`.
    pub fixed_bytes: usize,
    /// Valid KV tokens of the problem.
    pub tokens: usize,
    /// Packed cache bytes for the problem (without `fixed_bytes`).
    pub total_packed_bytes: f64,
    /// Kernel-layout cache bytes for the problem.
    pub total_kernel_bytes: usize,
    /// fp16 cache bytes for the problem.
    pub total_fp16_bytes: usize,
}

/// `x` is a multiple of `k` (`usize::is_multiple_of` needs Rust 1.87; the workspace targets 1.80).
fn multiple_of(x: usize, k: usize) -> bool {
    x.checked_rem(k) == Some(0)
}

fn unsupported(what: String, supported: &str) -> CoreError {
    CoreError::Unsupported {
        what,
        supported: supported.into(),
    }
}

impl TurboQuantConfig {
    /// The paper's settings for `p`: 4-bit keys, 3-bit values, `m = d_k`, block 64, default seed.
    pub fn paper_default(p: &AttentionProblem) -> TurboQuantConfig {
        TurboQuantConfig {
            block_k: DEFAULT_BLOCK_K,
            key_bits: DEFAULT_KEY_BITS,
            value_bits: DEFAULT_VALUE_BITS,
            qjl_dim: p.head_dim_qk,
            seed: DEFAULT_SEED,
            defer_value_unrotation: false,
            key_qjl: true,
        }
    }

    /// Bits of the key codebook: `key_bits - 1` with QJL, `key_bits` without.
    pub fn key_codebook_bits(&self) -> u8 {
        if self.key_qjl {
            self.key_bits.saturating_sub(1)
        } else {
            self.key_bits
        }
    }

    /// Checks the config against a problem (device-independent): bit widths, head dims, sketch
    /// size, block size and KV layout.
    pub fn check(&self, p: &AttentionProblem) -> Result<()> {
        if p.kv_layout != KvLayout::Separate {
            return Err(unsupported(
                "TurboQuant over an MLA latent KV cache (kv_layout = mla_latent)".into(),
                "separate K and V tensors (kv_layout = separate)",
            ));
        }
        for (what, bits) in [("key_bits", self.key_bits), ("value_bits", self.value_bits)] {
            if !SUPPORTED_BITS.contains(&bits) {
                return Err(unsupported(
                    format!("{what} = {bits}"),
                    if what == "key_bits" && self.key_qjl {
                        "1, 2, 3 or 4 bits per key coordinate (b - 1 codebook bits + 1 QJL bit)"
                    } else if what == "key_bits" {
                        "1, 2, 3 or 4 bits per key coordinate (all on the codebook, no QJL)"
                    } else {
                        "1, 2, 3 or 4 bits per value coordinate"
                    },
                ));
            }
        }
        for (what, d) in [("head_dim_qk", p.head_dim_qk), ("head_dim_v", p.head_dim_v)] {
            if !(MIN_HEAD_DIM..=MAX_HEAD_DIM).contains(&d) || !multiple_of(d, HEAD_DIM_MULTIPLE) {
                return Err(unsupported(
                    format!("TurboQuant with {what} = {d}"),
                    "head dims that are multiples of 8 from 16 to 1024",
                ));
            }
        }
        if self.qjl_dim == 0
            || !multiple_of(self.qjl_dim, QJL_DIM_MULTIPLE)
            || self.qjl_dim > MAX_QJL_DIM
        {
            return Err(CoreError::BadLength {
                what: "qjl_dim".into(),
                value: self.qjl_dim as i64,
                requirement: format!(
                    "a multiple of 8 from 8 to {MAX_QJL_DIM} (sign rows are packed in bytes; the paper uses m = d = {})",
                    p.head_dim_qk
                ),
            });
        }
        if self.block_k == 0 || self.block_k > MAX_BLOCK_K {
            return Err(CoreError::BadLength {
                what: "block_k".into(),
                value: self.block_k as i64,
                requirement: format!("between 1 and {MAX_BLOCK_K} keys"),
            });
        }
        Ok(())
    }

    /// Shared memory one thread block of the fused decode kernel needs: the resident fp16 `Π_v`,
    /// the query tile (the `H_q / H_k` heads of one KV head: `Q` and `Q_proj` in fp16),
    /// [`KERNEL_STAGES`] buffers of compressed KV rows, and the decompressed fp16 K, sign and V
    /// tiles.
    pub fn fused_smem_bytes(&self, p: &AttentionProblem) -> usize {
        let (dk, dv, m) = (p.head_dim_qk, p.head_dim_v, self.qjl_dim);
        let rows = p.group_size();
        let key_row = self.kernel_key_row_bytes(dk);
        let m = if self.key_qjl { m } else { 0 };
        let value_row = dv + 2;
        2 * dv * dv
            + 2 * rows * (dk + m)
            + KERNEL_STAGES * self.block_k * (key_row + value_row)
            + 2 * self.block_k * (dk + m + dv)
    }

    /// [`Self::check`] plus the device limits: on CUDA the block must be a multiple of 16 (MMA
    /// tiles) and the fused kernel's shared memory must fit.
    pub fn check_device(&self, p: &AttentionProblem, caps: &DeviceCaps) -> Result<()> {
        self.check(p)?;
        if caps.backend == BackendKind::Cuda && !multiple_of(self.block_k, CUDA_BLOCK_K_MULTIPLE) {
            return Err(CoreError::InvalidPlan(format!(
                "block_k = {} is not a multiple of 16, the MMA tile of the fused TurboQuant kernel on {}",
                self.block_k, caps.name
            )));
        }
        let need = self.fused_smem_bytes(p);
        if need > caps.shared_mem_per_block {
            return Err(CoreError::InvalidPlan(format!(
                "the fused TurboQuant kernel needs {need} bytes of shared memory per block (fp16 Π of \
                 {dv} x {dv} = {pi} bytes resident, block_k = {bk}) but {name} offers {have}; use a \
                 smaller block_k or a head_dim_v of at most 256",
                dv = p.head_dim_v,
                pi = 2 * p.head_dim_v * p.head_dim_v,
                bk = self.block_k,
                name = caps.name,
                have = caps.shared_mem_per_block
            )));
        }
        Ok(())
    }

    /// Bytes of one key row (token, KV head) in the kernel operand layout: one `u8` index per
    /// coordinate when the codebook has any bits, packed signs and the f16 norms.
    fn kernel_key_row_bytes(&self, dk: usize) -> usize {
        let idx = if self.key_codebook_bits() > 0 { dk } else { 0 };
        if self.key_qjl {
            idx + self.qjl_dim.div_ceil(8) + 4
        } else {
            idx + 2
        }
    }

    /// Bytes per token of the compressed cache against fp16, and totals for `p`.
    pub fn compression(&self, p: &AttentionProblem) -> Compression {
        let (dk, dv, m, hk) = (p.head_dim_qk, p.head_dim_v, self.qjl_dim, p.heads_kv);
        let cb = self.key_codebook_bits() as usize;
        let key_bits_per_row = if self.key_qjl {
            cb * dk + m + 32
        } else {
            cb * dk + 16
        };
        let value_bits_per_row = self.value_bits as usize * dv + 16;
        let packed = hk as f64 * (key_bits_per_row + value_bits_per_row) as f64 / 8.0;
        let kernel = hk * (self.kernel_key_row_bytes(dk) + dv + 2);
        let fp16 = 2 * hk * (dk + dv);
        let tokens = p.total_kv_tokens();
        let sketch = if self.key_qjl { m * dk } else { 0 };
        let fixed = 2 * (dk * dk + if dv != dk { dv * dv } else { 0 } + sketch);
        Compression {
            key_bits_per_row,
            value_bits_per_row,
            packed_bytes_per_token: packed,
            kernel_bytes_per_token: kernel,
            fp16_bytes_per_token: fp16,
            packed_ratio: fp16 as f64 / packed,
            kernel_ratio: fp16 as f64 / kernel as f64,
            bits_per_coordinate: (key_bits_per_row + value_bits_per_row) as f64 / (dk + dv) as f64,
            fixed_bytes: fixed,
            tokens,
            total_packed_bytes: packed * tokens as f64,
            total_kernel_bytes: kernel * tokens,
            total_fp16_bytes: fp16 * tokens,
        }
    }
}

/// Plans TurboQuant attention: the paper's bit widths and `m = d`, and the largest KV block of
/// 64, 32, 16 whose fused-kernel shared memory fits the device.
pub fn plan(p: &AttentionProblem, caps: &DeviceCaps) -> Result<TurboQuantConfig> {
    p.validate()?;
    let mut cfg = TurboQuantConfig::paper_default(p);
    cfg.check(p)?;
    for bk in [DEFAULT_BLOCK_K, 32, 16] {
        cfg.block_k = bk;
        if cfg.fused_smem_bytes(p) <= caps.shared_mem_per_block {
            break;
        }
    }
    cfg.check_device(p, caps)?;
    Ok(cfg)
}

fn check_inputs(p: &AttentionProblem, x: &AttentionInputs) -> Result<()> {
    let want_q = [p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk];
    let want_k = [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_qk];
    let want_v = [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_v];
    if x.q.shape != want_q {
        return Err(CoreError::Shape {
            tensor: "q",
            actual: x.q.shape.clone(),
            expected: format!("{want_q:?} from the problem"),
        });
    }
    if x.k.shape != want_k {
        return Err(CoreError::Shape {
            tensor: "k",
            actual: x.k.shape.clone(),
            expected: format!("{want_k:?} from the problem"),
        });
    }
    match &x.v {
        None => Err(unsupported(
            "TurboQuant without a separate v tensor (MLA latent input)".into(),
            "separate K and V tensors",
        )),
        Some(v) if v.shape != want_v => Err(CoreError::Shape {
            tensor: "v",
            actual: v.shape.clone(),
            expected: format!("{want_v:?} from the problem"),
        }),
        Some(v) => {
            x.q.check_data("q")?;
            x.k.check_data("k")?;
            v.check_data("v")
        }
    }
}

/// Attention over a TurboQuant-compressed K and V: compresses the valid K rows with
/// `TurboQuant_prod` and V rows with `TurboQuant_mse` (norms in f16), then runs the fused
/// kernel's loop ([`attention`]).
pub fn emulate(
    cfg: &TurboQuantConfig,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<AttentionOutput> {
    p.validate()?;
    cfg.check(p)?;
    check_inputs(p, x)?;
    crate::range::check_turboquant(p, x)?;
    let codec = TurboQuantCodec::new(cfg, p.head_dim_qk, p.head_dim_v);
    let kv = codec.compress(p, x);
    Ok(codec.attend(cfg, p, &x.q, &kv))
}
