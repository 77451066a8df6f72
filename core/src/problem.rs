//! Attention problems and their inputs, validated once at the public boundary.
//!
//! Layout follows FlashAttention and FlashMLA: tensors are `[batch, seq, heads, head_dim]`,
//! LSE is `f32 [batch, heads_q, seq_q]`. Ragged batches keep padded tensors plus per-sequence
//! lengths (`seqlens_q`, `seqlens_k`), as FlashAttention's `cache_seqlens` does. Causal masks
//! align to the bottom right: query `i` of a sequence sees keys `0..=i + sk - sq`.

use crate::{CoreError, DType, Result, Tensor};
use serde::{Deserialize, Serialize};

/// How keys and values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvLayout {
    /// Separate `k [B, Sk, Hk, Dqk]` and `v [B, Sk, Hk, Dv]`.
    Separate,
    /// MLA: one latent `kv [B, Sk, 1, Dqk]` whose first `Dv` columns are V.
    MlaLatent,
}

/// The shape and semantics of one attention call; no data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionProblem {
    /// Sequences in the batch.
    pub batch: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (divides `heads_q`; 1 for MQA and MLA).
    pub heads_kv: usize,
    /// Head dimension of Q and K (576 for MLA).
    pub head_dim_qk: usize,
    /// Head dimension of V and O (512 for MLA).
    pub head_dim_v: usize,
    /// Padded query extent of the `q` tensor (tokens).
    pub max_seqlen_q: usize,
    /// Padded key extent of the `k`/`kv` tensor (tokens).
    pub max_seqlen_k: usize,
    /// Valid query tokens per sequence (each `<= max_seqlen_q`).
    pub seqlens_q: Vec<usize>,
    /// Valid key tokens per sequence (each `<= max_seqlen_k`).
    pub seqlens_k: Vec<usize>,
    /// Bottom-right aligned causal mask.
    pub causal: bool,
    /// Multiplier of `q . k` before the softmax (default `1/sqrt(head_dim_qk)`).
    pub softmax_scale: f32,
    /// Element type of q, k, v and o.
    pub dtype: DType,
    /// Separate K/V or an MLA latent cache.
    pub kv_layout: KvLayout,
}

impl AttentionProblem {
    /// A uniform (non-ragged) problem with the default scale.
    #[allow(clippy::too_many_arguments)] // mirrors the CLI's B,Sq,Sk,Hq,Hk,D,Dv tuple
    pub fn uniform(
        batch: usize,
        seq_q: usize,
        seq_k: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim_qk: usize,
        head_dim_v: usize,
        dtype: DType,
    ) -> AttentionProblem {
        AttentionProblem {
            batch,
            heads_q,
            heads_kv,
            head_dim_qk,
            head_dim_v,
            max_seqlen_q: seq_q,
            max_seqlen_k: seq_k,
            seqlens_q: vec![seq_q; batch],
            seqlens_k: vec![seq_k; batch],
            causal: false,
            softmax_scale: 1.0 / (head_dim_qk.max(1) as f32).sqrt(),
            dtype,
            kv_layout: KvLayout::Separate,
        }
    }

    /// Query heads sharing one KV head.
    pub fn group_size(&self) -> usize {
        self.heads_q / self.heads_kv
    }

    /// Whether every sequence has the full padded lengths.
    pub fn is_uniform(&self) -> bool {
        self.seqlens_q.iter().all(|&s| s == self.max_seqlen_q)
            && self.seqlens_k.iter().all(|&s| s == self.max_seqlen_k)
    }

    /// Sum of valid key tokens over the batch.
    pub fn total_kv_tokens(&self) -> usize {
        self.seqlens_k.iter().sum()
    }

    /// Last key index (exclusive) visible to query `i` of sequence `b`.
    pub fn visible_keys(&self, b: usize, i: usize) -> usize {
        let sk = self.seqlens_k[b];
        if !self.causal {
            return sk;
        }
        let sq = self.seqlens_q[b];
        // bottom-right alignment: i sees keys 0..=i + sk - sq
        let end = i as i64 + sk as i64 - sq as i64 + 1;
        end.clamp(0, sk as i64) as usize
    }

    /// Checks the problem's own consistency (dimensions positive, ratios, lengths in range).
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [
            ("batch", self.batch),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("head_dim_qk", self.head_dim_qk),
            ("head_dim_v", self.head_dim_v),
            ("max_seqlen_q", self.max_seqlen_q),
            ("max_seqlen_k", self.max_seqlen_k),
        ] {
            if v == 0 {
                return Err(CoreError::BadLength {
                    what: what.into(),
                    value: 0,
                    requirement: "at least 1".into(),
                });
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(CoreError::HeadRatio {
                heads_q: self.heads_q,
                heads_kv: self.heads_kv,
            });
        }
        if self.kv_layout == KvLayout::MlaLatent {
            if self.heads_kv != 1 {
                return Err(CoreError::Unsupported {
                    what: format!("MLA with {} latent KV heads", self.heads_kv),
                    supported: "exactly 1 shared latent head".into(),
                });
            }
            if self.head_dim_v > self.head_dim_qk {
                return Err(CoreError::BadLength {
                    what: "head_dim_v".into(),
                    value: self.head_dim_v as i64,
                    requirement: format!(
                        "at most head_dim_qk = {} (V is the first columns of the latent kv)",
                        self.head_dim_qk
                    ),
                });
            }
        }
        for (name, lens, max) in [
            ("seqlens_q", &self.seqlens_q, self.max_seqlen_q),
            ("seqlens_k", &self.seqlens_k, self.max_seqlen_k),
        ] {
            if lens.len() != self.batch {
                return Err(CoreError::Shape {
                    tensor: if name == "seqlens_q" {
                        "seqlens_q"
                    } else {
                        "seqlens_k"
                    },
                    actual: vec![lens.len()],
                    expected: format!("one length per sequence, [{}]", self.batch),
                });
            }
            for (b, &l) in lens.iter().enumerate() {
                if l > max {
                    return Err(CoreError::BadLength {
                        what: format!("{name}[{b}]"),
                        value: l as i64,
                        requirement: format!("at most {max}, the tensor's padded sequence extent"),
                    });
                }
            }
        }
        if !self.softmax_scale.is_finite() || self.softmax_scale <= 0.0 {
            return Err(CoreError::BadValue {
                what: "softmax_scale".into(),
                value: self.softmax_scale.to_string(),
                requirement: "finite and positive".into(),
            });
        }
        for (name, shape) in self.buffer_shapes() {
            check_buffer(name, &shape)?;
        }
        Ok(())
    }

    /// Every host buffer one call touches, by name: the inputs (`q`, `k`/`kv`, `v`) and the
    /// outputs (`o`, `lse`), each `[.., ..]` as the module docs lay them out.
    pub fn buffer_shapes(&self) -> Vec<(&'static str, Vec<usize>)> {
        let (b, sq, sk) = (self.batch, self.max_seqlen_q, self.max_seqlen_k);
        let (hq, hk, dk, dv) = (
            self.heads_q,
            self.heads_kv,
            self.head_dim_qk,
            self.head_dim_v,
        );
        let mut out = vec![("q", vec![b, sq, hq, dk])];
        match self.kv_layout {
            KvLayout::Separate => {
                out.push(("k", vec![b, sk, hk, dk]));
                out.push(("v", vec![b, sk, hk, dv]));
            }
            KvLayout::MlaLatent => out.push(("kv", vec![b, sk, hk, dk])),
        }
        out.push(("o", vec![b, sq, hq, dv]));
        out.push(("lse", vec![b, hq, sq]));
        out
    }

    /// Bytes of every buffer of [`Self::buffer_shapes`] as host tensors hold them (`f32` values),
    /// in `u128` so that no shape overflows the count.
    pub fn host_bytes(&self) -> u128 {
        self.buffer_shapes()
            .iter()
            .map(|(_, s)| buffer_bytes(s))
            .fold(0u128, u128::saturating_add)
    }
}

/// Bytes of one host tensor of `shape` (`f32` values), saturating instead of overflowing.
pub fn buffer_bytes(shape: &[usize]) -> u128 {
    shape.iter().fold(HOST_ELEMENT_BYTES as u128, |a, &d| {
        a.saturating_mul(d as u128)
    })
}

/// Bytes one host element takes: host tensors keep `f32` values whatever their dtype.
pub const HOST_ELEMENT_BYTES: usize = 4;

/// Largest single host buffer: Rust allocations are limited to `isize::MAX` bytes.
pub const MAX_BUFFER_BYTES: u128 = isize::MAX as u128;

/// Refuses a buffer whose element count overflows or whose bytes exceed [`MAX_BUFFER_BYTES`],
/// before anything is allocated.
pub fn check_buffer(name: &str, shape: &[usize]) -> Result<usize> {
    let bytes = buffer_bytes(shape);
    if bytes > MAX_BUFFER_BYTES {
        return Err(CoreError::TooLarge {
            what: format!("{name} of shape {shape:?}"),
            bytes_needed: bytes,
            available: format!("one buffer can hold at most {MAX_BUFFER_BYTES} bytes"),
        });
    }
    Ok((bytes / HOST_ELEMENT_BYTES as u128) as usize)
}

/// Bytes of memory the host can still give this process (`MemAvailable` of `/proc/meminfo`);
/// `None` where that is not known (then only [`MAX_BUFFER_BYTES`] limits a buffer).
pub fn host_memory_available() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses `bytes` of host allocations for `what` when the host has less memory available,
/// naming both numbers; allocating anyway would abort the process instead of returning an error.
pub fn check_host_memory(what: &str, bytes: u128) -> Result<()> {
    match host_memory_available() {
        Some(avail) if bytes > avail => Err(CoreError::TooLarge {
            what: what.into(),
            bytes_needed: bytes,
            available: format!("the host has {avail} bytes of memory available"),
        }),
        _ if bytes > MAX_BUFFER_BYTES => Err(CoreError::TooLarge {
            what: what.into(),
            bytes_needed: bytes,
            available: format!("one address space holds at most {MAX_BUFFER_BYTES} bytes"),
        }),
        _ => Ok(()),
    }
}

/// Options of an attention call that are not carried by the tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// Bottom-right aligned causal mask.
    pub causal: bool,
    /// Override of `1/sqrt(head_dim_qk)`.
    pub softmax_scale: Option<f32>,
}

/// The tensors of one attention call.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionInputs {
    /// `[B, Sq, Hq, Dqk]`.
    pub q: Tensor,
    /// `[B, Sk, Hk, Dqk]`, or for MLA the latent `kv [B, Sk, 1, Dqk]`.
    pub k: Tensor,
    /// `[B, Sk, Hk, Dv]`; `None` for MLA (V is the first `Dv` columns of `k`).
    pub v: Option<Tensor>,
    /// Valid query tokens per sequence; `None` means all of `Sq`.
    pub seqlens_q: Option<Vec<i64>>,
    /// Valid key tokens per sequence; `None` means all of `Sk`.
    pub seqlens_k: Option<Vec<i64>>,
}

impl AttentionInputs {
    /// Separate Q, K, V with full lengths.
    pub fn new(q: Tensor, k: Tensor, v: Tensor) -> AttentionInputs {
        AttentionInputs {
            q,
            k,
            v: Some(v),
            seqlens_q: None,
            seqlens_k: None,
        }
    }

    /// MLA: `q [B, Sq, Hq, Dqk]` and the latent `kv [B, Sk, 1, Dqk]`.
    pub fn mla(q: Tensor, kv: Tensor) -> AttentionInputs {
        AttentionInputs {
            q,
            k: kv,
            v: None,
            seqlens_q: None,
            seqlens_k: None,
        }
    }

    /// V row `[b, j, h, :dv]` whatever the layout.
    pub fn v_row(&self, p: &AttentionProblem, b: usize, j: usize, h: usize) -> &[f32] {
        match &self.v {
            Some(v) => v.row4(b, j, h),
            None => &self.k.row4(b, j, h)[..p.head_dim_v],
        }
    }

    /// Validates every tensor and returns the problem they describe.
    ///
    /// `head_dim_v` for MLA inputs must be given (`mla_head_dim_v`), since it cannot be read off
    /// the latent tensor.
    pub fn problem(
        &self,
        opts: AttentionOptions,
        mla_head_dim_v: Option<usize>,
    ) -> Result<AttentionProblem> {
        let q = &self.q;
        let k = &self.k;
        let kname = if self.v.is_some() { "k" } else { "kv" };
        if q.shape.len() != 4 {
            return Err(CoreError::Shape {
                tensor: "q",
                actual: q.shape.clone(),
                expected: "rank 4 [batch, seq_q, heads_q, head_dim]".into(),
            });
        }
        if k.shape.len() != 4 {
            return Err(CoreError::Shape {
                tensor: if self.v.is_some() { "k" } else { "kv" },
                actual: k.shape.clone(),
                expected: "rank 4 [batch, seq_k, heads_kv, head_dim]".into(),
            });
        }
        // a tensor whose data is shorter than its shape would be read out of bounds by every
        // backend; this is the one place that checks it
        for (name, t) in [("q", q), (kname, k)]
            .into_iter()
            .chain(self.v.as_ref().map(|v| ("v", v)))
        {
            let n = check_buffer(name, &t.shape)?;
            if t.data.len() != n {
                return Err(CoreError::Shape {
                    tensor: name,
                    actual: t.shape.clone(),
                    expected: format!(
                        "{n} values for that shape, but its data holds {}",
                        t.data.len()
                    ),
                });
            }
        }
        let (b, sq, hq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let (sk, hk) = (k.shape[1], k.shape[2]);
        if k.shape[0] != b || k.shape[3] != d {
            return Err(CoreError::Shape {
                tensor: if self.v.is_some() { "k" } else { "kv" },
                actual: k.shape.clone(),
                expected: format!("[{b}, seq_k, heads_kv, {d}] to match q {:?}", q.shape),
            });
        }
        if k.dtype != q.dtype {
            return Err(CoreError::DTypeMismatch {
                tensor: if self.v.is_some() { "k" } else { "kv" },
                actual: k.dtype,
                expected_from: "q",
                expected: q.dtype,
            });
        }
        let (dv, layout) = match &self.v {
            Some(v) => {
                if v.shape.len() != 4 || v.shape[0] != b || v.shape[1] != sk || v.shape[2] != hk {
                    return Err(CoreError::Shape {
                        tensor: "v",
                        actual: v.shape.clone(),
                        expected: format!("[{b}, {sk}, {hk}, head_dim_v] to match k {:?}", k.shape),
                    });
                }
                if v.dtype != q.dtype {
                    return Err(CoreError::DTypeMismatch {
                        tensor: "v",
                        actual: v.dtype,
                        expected_from: "q",
                        expected: q.dtype,
                    });
                }
                (v.shape[3], KvLayout::Separate)
            }
            None => (mla_head_dim_v.unwrap_or(d), KvLayout::MlaLatent),
        };
        let lens =
            |name: &'static str, given: &Option<Vec<i64>>, max: usize| -> Result<Vec<usize>> {
                match given {
                    None => Ok(vec![max; b]),
                    Some(l) => {
                        if l.len() != b {
                            return Err(CoreError::Shape {
                                tensor: name,
                                actual: vec![l.len()],
                                expected: format!("[{b}], one length per sequence"),
                            });
                        }
                        l.iter()
                            .enumerate()
                            .map(|(i, &x)| {
                                if x < 0 || x as usize > max {
                                    Err(CoreError::BadLength {
                                        what: format!("{name}[{i}]"),
                                        value: x,
                                        requirement: format!(
                                        "between 0 and {max} (the tensor's padded sequence extent)"
                                    ),
                                    })
                                } else {
                                    Ok(x as usize)
                                }
                            })
                            .collect()
                    }
                }
            };
        let seqlens_q = lens("seqlens_q", &self.seqlens_q, sq)?;
        let seqlens_k = lens("seqlens_k", &self.seqlens_k, sk)?;
        let p = AttentionProblem {
            batch: b,
            heads_q: hq,
            heads_kv: hk,
            head_dim_qk: d,
            head_dim_v: dv,
            max_seqlen_q: sq,
            max_seqlen_k: sk,
            seqlens_q,
            seqlens_k,
            causal: opts.causal,
            softmax_scale: opts.softmax_scale.unwrap_or(1.0 / (d.max(1) as f32).sqrt()),
            dtype: q.dtype,
            kv_layout: layout,
        };
        p.validate()?;
        for (name, t) in [("q", q), (kname, k)] {
            if let Some((index, value)) = t.first_non_finite() {
                return Err(CoreError::NonFinite {
                    tensor: name,
                    index,
                    value,
                });
            }
        }
        if let Some(v) = &self.v {
            if let Some((index, value)) = v.first_non_finite() {
                return Err(CoreError::NonFinite {
                    tensor: "v",
                    index,
                    value,
                });
            }
        }
        Ok(p)
    }
}

/// The result of an attention call.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionOutput {
    /// `[B, Sq, Hq, Dv]`; rows past `seqlens_q` and fully masked rows are zero.
    pub o: Tensor,
    /// `f32 [B, Hq, Sq]`: natural-log sum of exp of scaled logits; `-inf` for rows with no key.
    pub lse: Tensor,
    /// Where and how this result was computed; says "simulated" when no hardware ran it.
    pub provenance: Provenance,
}

/// Where a result came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Backend that produced it (`cpu`, `cuda`, `ascend`).
    pub backend: String,
    /// Device name, e.g. `NVIDIA H200` or `host CPU (2 threads)`.
    pub device: String,
    /// `Some(reason)` when the result comes from a simulation rather than the named hardware.
    pub simulated: Option<String>,
}

impl Provenance {
    /// A result computed on the host CPU.
    pub fn cpu() -> Provenance {
        Provenance {
            backend: "cpu".into(),
            device: format!("host CPU ({} threads)", rayon::current_num_threads()),
            simulated: None,
        }
    }
}
