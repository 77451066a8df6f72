//! The closed list of configurations the TurboQuant kernels support, and their entry points.

#[cfg(doc)] // intra-doc links only
use super::{merge_warps, CompressPath};
use crate::error::{CudaError, Result};
use ferrattn_core::turboquant::TurboQuantConfig;
use ferrattn_core::{AttentionProblem, DType, KvLayout};

/// Entry points of one configuration (the closed list of `turboquant_*.cu`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelNames {
    /// Keys: `TurboQuant_prod` (QJL) or `TurboQuant_mse`.
    pub compress_keys: String,
    /// Values: `TurboQuant_mse`.
    pub compress_values: String,
    /// `Π q`, `S q` into A fragments.
    pub prepare_q: String,
    /// Fused decode with rows 8-15 of the MMA unused.
    pub decode_r8: String,
    /// The same with the merge fused in (the small-work schedule: [`super::small_work_smem_bytes`]).
    pub decode_r8f: String,
    /// Fused decode with all 16 MMA rows.
    pub decode_r16: String,
    /// Merge of the partials and `Πᵀ`, 8 warps a CTA.
    pub combine: String,
    /// The same merge, 16 warps a CTA (small batch, [`merge_warps`]).
    pub combine_w16: String,
    /// Keys on tensor cores, one f16 `Π` ([`CompressPath::Fast`]).
    pub fast_keys: String,
    /// Values on tensor cores, one f16 `Π`.
    pub fast_values: String,
    /// Keys on tensor cores, `Π` split hi + lo ([`CompressPath::Split`]).
    pub split_keys: String,
    /// Values on tensor cores, `Π` split hi + lo.
    pub split_values: String,
}

/// Checks a configuration against the closed list of the kernels.
pub fn check_supported(cfg: &TurboQuantConfig, p: &AttentionProblem) -> Result<()> {
    let unsupported = |what: String, supported: &str| CudaError::Unsupported {
        what,
        supported: supported.into(),
    };
    if p.dtype != DType::F16 {
        return Err(unsupported(
            format!("TurboQuant on CUDA with {} inputs", p.dtype),
            "f16",
        ));
    }
    if p.kv_layout != KvLayout::Separate {
        return Err(unsupported(
            "TurboQuant on CUDA over an MLA latent cache".into(),
            "separate K and V",
        ));
    }
    let d = p.head_dim_qk;
    if p.head_dim_v != d || !matches!(d, 64 | 128) {
        return Err(unsupported(
            format!(
                "TurboQuant on CUDA with head dims qk = {d}, v = {}",
                p.head_dim_v
            ),
            "qk = v = 64 or 128",
        ));
    }
    if !(2..=4).contains(&cfg.key_bits) || !(2..=4).contains(&cfg.value_bits) {
        return Err(unsupported(
            format!(
                "TurboQuant on CUDA with {} key bits and {} value bits",
                cfg.key_bits, cfg.value_bits
            ),
            "2, 3 or 4 bits for keys (QJL bit included) and values",
        ));
    }
    if cfg.key_qjl && cfg.qjl_dim != d {
        return Err(unsupported(
            format!(
                "TurboQuant on CUDA with qjl_dim = {} at d = {d}",
                cfg.qjl_dim
            ),
            "qjl_dim = head dim (the paper's m = d)",
        ));
    }
    Ok(())
}

/// Whether the device stores key codes and value codes as crumbs (2 bits a code: a key codebook
/// of at most 2 bits, 2-bit values; [`super::layout`]) rather than nibbles.
pub fn code_crumbs(cfg: &TurboQuantConfig) -> (bool, bool) {
    (
        super::layout::crumbs(cfg.key_codebook_bits()),
        super::layout::crumbs(cfg.value_bits),
    )
}

/// Kernel names for a configuration; `Unsupported` outside the closed list.
pub fn kernel_names(cfg: &TurboQuantConfig, p: &AttentionProblem) -> Result<KernelNames> {
    check_supported(cfg, p)?;
    let d = p.head_dim_qk;
    // codes of at most 2 bits as crumbs (`c`), 3-4 bits as nibbles (8- or 16-entry tables)
    let k = match (cfg.key_qjl, cfg.key_codebook_bits()) {
        (true, 1..=2) => "kqjlc",
        (true, 3) => "kqjl",
        (false, 2) => "knc",
        (false, 3) => "kn8",
        (false, 4) => "kn16",
        (qjl, b) => {
            return Err(CudaError::Unsupported {
                what: format!("key codebook of {b} bits (QJL {qjl})"),
                supported: "1-3 bits with QJL, 2-4 without".into(),
            })
        }
    };
    let v = match cfg.value_bits {
        2 => "vc",
        3 => "v8",
        4 => "v16",
        b => {
            return Err(CudaError::Unsupported {
                what: format!("{b}-bit values"),
                supported: "2, 3 or 4 bits".into(),
            })
        }
    };
    Ok(KernelNames {
        compress_keys: format!(
            "turboquant_compress_keys_{}_d{d}",
            if cfg.key_qjl { "qjl" } else { "mse" }
        ),
        compress_values: format!("turboquant_compress_values_d{d}"),
        fast_keys: format!(
            "turboquant_fast_keys_{}_d{d}",
            if cfg.key_qjl { "qjl" } else { "mse" }
        ),
        fast_values: format!("turboquant_fast_values_d{d}"),
        split_keys: format!(
            "turboquant_split_keys_{}_d{d}",
            if cfg.key_qjl { "qjl" } else { "mse" }
        ),
        split_values: format!("turboquant_split_values_d{d}"),
        prepare_q: format!("turboquant_prepare_q_d{d}"),
        decode_r8: format!("turboquant_decode_d{d}_{k}_{v}_r8"),
        decode_r8f: format!("turboquant_decode_d{d}_{k}_{v}_r8f"),
        decode_r16: format!("turboquant_decode_d{d}_{k}_{v}_r16"),
        combine: format!("turboquant_combine_d{d}"),
        combine_w16: format!("turboquant_combine_w16_d{d}"),
    })
}
