//! Correctness of every row before it is timed.
//!
//! Device rows run on inputs filled on the device (`fill_uniform_*` in
//! `cuda-kernels/lean_decode.cu`, a hash of (seed, index)), too large to copy back. The reference
//! regenerates the slice it needs on the host with [`fill_value`], the host twin of that hash, and
//! computes the f64 golden ([`ferrattn_core::golden`]) for one sequence, its last query rows and
//! two KV heads (with their query heads). If the twin ever drifted from the kernel, the check
//! would fail loudly rather than pass: the reference would no longer describe the inputs.
//!
//! Host rows are checked on the whole problem.

use crate::bench::report::Check;
use ferrattn_core::{
    golden, Algorithm, AttentionInputs, AttentionProblem, Comparison, DType, Tensor, Tolerance,
};
use half::{bf16, f16};
use rayon::prelude::*;

/// What an algorithm promises against exact attention (the bounds of `cli/tests/golden.rs`, where
/// each is derived).
pub fn tolerance(algo: Algorithm, dtype: DType) -> Tolerance {
    match algo {
        Algorithm::Exact | Algorithm::Lean => Tolerance::output(dtype),
        // BF16 casts of Q, K, V and P before each Cube stage (AMLA Alg. 2)
        Algorithm::Amla => Tolerance {
            rel_fro: 1e-2,
            max_abs: 5e-2,
        },
        // quantisation noise of the loosest default path (mixed 2/4-bit decode)
        Algorithm::Turbo => Tolerance {
            rel_fro: 0.60,
            max_abs: 3.0,
        },
        // 3-bit codebook keys + QJL and 3-bit values
        Algorithm::TurboQuant => Tolerance {
            rel_fro: 0.48,
            max_abs: 3.0,
        },
    }
}

/// The seed the device fill uses for buffer `buffer` (0 = Q, 1 = K, 2 = V) of inputs made with
/// `seed` (`DeviceInputs::random`).
pub fn buffer_seed(seed: u32, buffer: u32) -> u32 {
    seed.wrapping_mul(3)
        .wrapping_add(buffer.wrapping_mul(0x5bd1_e995))
}

/// Host twin of `fill_uniform_{f16,bf16}`: element `i` of a buffer filled with `seed`.
pub fn fill_value(seed: u32, i: u64, scale: f32, dtype: DType) -> f32 {
    let mut h =
        (i as u32).wrapping_mul(0x9E37_79B1) ^ seed ^ ((i >> 32) as u32).wrapping_mul(0x85EB_CA77);
    h ^= h >> 15;
    h = h.wrapping_mul(0x2C1B_3C6D);
    h ^= h >> 12;
    h = h.wrapping_mul(0x297A_2D39);
    h ^= h >> 15;
    let u = (h >> 8) as f32 * (1.0 / 16_777_216.0);
    let x = (2.0 * u - 1.0) * scale;
    match dtype {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::F32 => x,
    }
}

/// A device-filled `[B, S, H, D]` buffer: its seed (already per buffer), scale and dims.
#[derive(Clone, Copy, Debug)]
pub struct Filled {
    /// Seed of this buffer ([`buffer_seed`]).
    pub seed: u32,
    /// Values are uniform in `[-scale, scale)`.
    pub scale: f32,
    /// Element type.
    pub dtype: DType,
    /// `[B, S, H, D]`.
    pub dims: [usize; 4],
}

impl Filled {
    /// Rows `rows` of sequence `b`, heads `heads`, as a `[1, rows, heads, D]` tensor.
    pub fn slice(&self, b: usize, rows: std::ops::Range<usize>, heads: &[usize]) -> Tensor {
        let [_, s, h, d] = self.dims;
        let n = rows.len();
        let data: Vec<f32> = (0..n * heads.len())
            .into_par_iter()
            .flat_map_iter(|rh| {
                let (r, hi) = (rows.start + rh / heads.len(), heads[rh % heads.len()]);
                let base = (((b * s + r) * h + hi) * d) as u64;
                (0..d as u64).map(move |j| fill_value(self.seed, base + j, self.scale, self.dtype))
            })
            .collect();
        Tensor {
            shape: vec![1, n, heads.len(), d],
            dtype: self.dtype,
            data,
        }
    }
}

/// Which part of a device problem the reference covers.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Sequence.
    pub b: usize,
    /// Query rows checked: the last `rows` (bottom-right causal alignment keeps their masks).
    pub rows: usize,
    /// KV heads checked (with every query head of their groups).
    pub kv_heads: Vec<usize>,
    /// KV tokens of the sequence the output attends to.
    pub kv_len: usize,
}

impl Probe {
    /// The first and last KV heads of sequence `b`, the last `rows` query rows.
    pub fn of(p: &AttentionProblem, b: usize, rows: usize) -> Probe {
        let mut kv_heads = vec![0];
        if p.heads_kv > 1 {
            kv_heads.push(p.heads_kv - 1);
        }
        Probe {
            b,
            rows: rows.min(p.seqlens_q[b]),
            kv_heads,
            kv_len: p.seqlens_k[b],
        }
    }
}

/// The slice `probe` of a device problem as a host problem with its regenerated inputs, the query
/// rows and heads it covers, and the device output `o` (`[B, Sq, Hq, Dv]`) at those rows and heads.
struct Slice {
    sub: AttentionProblem,
    x: AttentionInputs,
    q_rows: std::ops::Range<usize>,
    q_heads: Vec<usize>,
}

impl Slice {
    fn new(p: &AttentionProblem, q: Filled, k: Filled, v: Filled, probe: &Probe) -> Slice {
        let g = p.group_size();
        let sq = p.seqlens_q[probe.b];
        let q_rows = sq - probe.rows..sq;
        let q_heads: Vec<usize> = probe
            .kv_heads
            .iter()
            .flat_map(|&hk| hk * g..(hk + 1) * g)
            .collect();
        let x = AttentionInputs::new(
            q.slice(probe.b, q_rows.clone(), &q_heads),
            k.slice(probe.b, 0..probe.kv_len, &probe.kv_heads),
            v.slice(probe.b, 0..probe.kv_len, &probe.kv_heads),
        );
        let mut sub = AttentionProblem::uniform(
            1,
            probe.rows,
            probe.kv_len,
            q_heads.len(),
            probe.kv_heads.len(),
            p.head_dim_qk,
            p.head_dim_v,
            p.dtype,
        );
        sub.causal = p.causal;
        sub.softmax_scale = p.softmax_scale;
        Slice {
            sub,
            x,
            q_rows,
            q_heads,
        }
    }

    /// O of the device output at the slice, in the sub-problem's `[1, rows, heads, Dv]` order.
    fn o(&self, p: &AttentionProblem, b: usize, o: &Tensor) -> Vec<f64> {
        let (hq, dv) = (p.heads_q, p.head_dim_v);
        let mut got = Vec::with_capacity(self.q_rows.len() * self.q_heads.len() * dv);
        for i in self.q_rows.clone() {
            for &h in &self.q_heads {
                let at = ((b * p.max_seqlen_q + i) * hq + h) * dv;
                got.extend(o.data[at..at + dv].iter().map(|&x| x as f64));
            }
        }
        got
    }

    /// LSE of the device output at the slice, in the sub-problem's `[1, heads, rows]` order.
    fn lse(&self, p: &AttentionProblem, b: usize, lse: &Tensor) -> Vec<f64> {
        let mut got = Vec::with_capacity(self.q_rows.len() * self.q_heads.len());
        for &h in &self.q_heads {
            for i in self.q_rows.clone() {
                got.push(lse.data[(b * p.heads_q + h) * p.max_seqlen_q + i] as f64);
            }
        }
        got
    }
}

/// Checks outputs `o` (`[B, Sq, Hq, Dv]`) and optionally `lse` (`[B, Hq, Sq]`) of problem `p`
/// over the slice `probe`, whose inputs are the device-filled `q`, `k`, `v`, against the f64
/// golden (kernels that compute exact attention).
#[allow(clippy::too_many_arguments)] // the three inputs, the outputs and the slice are all needed
pub fn check_device(
    what: &str,
    p: &AttentionProblem,
    q: Filled,
    k: Filled,
    v: Filled,
    probe: &Probe,
    o: &Tensor,
    lse: Option<&Tensor>,
    tol: Tolerance,
) -> Check {
    let s = Slice::new(p, q, k, v, probe);
    let (go, gl) = golden::exact_attention_f64(&s.sub, &s.x);
    let reference = format!(
        "f64 golden of sequence {} ({} keys), last {} query rows, KV heads {:?}",
        probe.b, probe.kv_len, probe.rows, probe.kv_heads
    );
    let lse_cmp = lse.map(|l| Comparison::new(&gl, &s.lse(p, probe.b, l)));
    Check::from(
        what,
        reference,
        Comparison::new(&go, &s.o(p, probe.b, o)),
        lse_cmp,
        tol,
    )
}

/// Which TurboAttention call a device output came from.
#[derive(Clone, Debug)]
pub enum TurboCall {
    /// Alg. 1 prefill.
    Prefill,
    /// Alg. 2 decode over a cache compressed at these bits per KV head (of the whole problem).
    Decode {
        /// Bits of every KV head.
        bits: Vec<u8>,
        /// The decode ran the fast-contract instances (`CudaBackend::turbo_decode_is_fast`, the
        /// default on sm_90): held to [`TURBO_FAST_DECODE_VS_EMULATION`].
        fast: bool,
    },
}

/// How close a TurboAttention kernel stays to its CPU emulation, the definition of correct for a
/// quantised kernel (`backends/cuda/tests/gpu_turbo.rs`): O within 1e-3 relative Frobenius error
/// (the warpgroup-MMA prefill may land a P code one step apart; the decode with one unit per
/// output tile follows the emulation bit for bit), absolute error a few bf16 steps of |O| <= 2.
///
/// A stream-K decode is not held to the emulation: a split quantises P against each segment's
/// own tile maximum and applies SAS's threshold against its own running maximum, so on long
/// contexts of uniform inputs (outputs near zero) it lands up to about 10% (relative) away from the
/// sequential emulation. It is judged against the f64 golden instead, no worse than the emulation.
const TURBO_VS_EMULATION: (Tolerance, f64) = (
    Tolerance {
        rel_fro: 1e-3,
        max_abs: 2e-2,
    },
    0.999_999,
);

/// [`TURBO_VS_EMULATION`] for the fast-contract decode (`ferrattn_cuda::Options` docs,
/// `docs/TURBO_CUDA.md`): O within 2e-2 relative Frobenius error of the bit-exact result (the
/// contract's bound, `FAST_O_REL` of `backends/cuda/tests/gpu_turbo.rs`), hence a cosine of at
/// least 1 - 2e-2^2 / 2; the absolute bound scaled from [`TURBO_VS_EMULATION`]'s by the same
/// factor as the relative one would be 0.4, held at 0.1 (5% of |O| <= 2). Against the f64
/// golden it is held, as every turbo kernel, to the emulation's error + 10%.
const TURBO_FAST_DECODE_VS_EMULATION: (Tolerance, f64) = (
    Tolerance {
        rel_fro: 2e-2,
        max_abs: 1e-1,
    },
    0.9998,
);

/// Checks a TurboAttention device output `o` over the slice `probe` against the CPU emulation of
/// the same slice (per-head, per-block quantisation makes a slice of whole query blocks and whole
/// heads exact), and that the timed output (`timed`, else `o`) is no worse than the emulation
/// against the f64 golden by more than 10%.
#[allow(clippy::too_many_arguments)] // the three inputs, the outputs, the slice and the call
pub fn check_turbo_device(
    what: &str,
    p: &AttentionProblem,
    q: Filled,
    k: Filled,
    v: Filled,
    probe: &Probe,
    o: &Tensor,
    timed: Option<&Tensor>,
    cfg: &ferrattn_core::turbo::TurboConfig,
    call: &TurboCall,
) -> Check {
    use ferrattn_core::turbo::{self, KvBits, TurboConfig, TurboKvCache};
    let s = Slice::new(p, q, k, v, probe);
    let emu = match call {
        TurboCall::Prefill => turbo::prefill(cfg, &s.sub, &s.x).map(|(o, _)| o),
        TurboCall::Decode { bits, .. } => {
            let sub_cfg = TurboConfig {
                kv_bits: KvBits::PerHead {
                    bits: probe.kv_heads.iter().map(|&h| bits[h]).collect(),
                },
                ..cfg.clone()
            };
            let v = s.x.v.as_ref().expect("separate K and V");
            TurboKvCache::from_context(&sub_cfg, &s.x.k, v, &[probe.kv_len])
                .and_then(|c| turbo::decode(&sub_cfg, &c, &s.x.q, s.sub.softmax_scale))
        }
    };
    let emu = match emu {
        Ok(e) => e,
        Err(e) => {
            return Check {
                reference: "CPU emulation".into(),
                rel_fro: f64::NAN,
                max_abs: f64::NAN,
                cosine: f64::NAN,
                lse_max_abs: None,
                tol_rel_fro: 0.0,
                tol_max_abs: 0.0,
                passed: false,
                failure: Some(format!("{what}: the emulation refused the slice: {e}")),
            }
        }
    };
    let got = s.o(p, probe.b, o);
    let emu_o: Vec<f64> = emu.o.data.iter().map(|&x| x as f64).collect();
    let (go, _) = golden::exact_attention_f64(&s.sub, &s.x);
    let got_timed = timed.map(|t| s.o(p, probe.b, t));
    let (e_emu, e_gpu) = (
        Comparison::new(&go, &emu_o).rel_fro,
        Comparison::new(&go, got_timed.as_ref().unwrap_or(&got)).rel_fro,
    );
    let (tol, min_cos) = match call {
        TurboCall::Decode { fast: true, .. } => TURBO_FAST_DECODE_VS_EMULATION,
        _ => TURBO_VS_EMULATION,
    };
    let cmp = Comparison::new(&emu_o, &got);
    let cosine = cmp.cosine;
    let reference = format!(
        "CPU emulation of sequence {} ({} keys), last {} query rows, KV heads {:?}{}; vs f64 golden: emulation {e_emu:.3e}, timed kernel {e_gpu:.3e}",
        probe.b,
        probe.kv_len,
        probe.rows,
        probe.kv_heads,
        if timed.is_some() { " (one unit per output tile)" } else { "" }
    );
    let mut c = Check::from(what, reference, cmp, None, tol);
    if c.passed && cosine < min_cos {
        c.passed = false;
        c.failure = Some(format!(
            "{what}: cosine {cosine:.6} against the emulation (bound {min_cos})"
        ));
    }
    if c.passed && e_gpu > 1.1 * e_emu + 1e-6 {
        c.passed = false;
        c.failure = Some(format!(
            "{what}: error against the f64 golden {e_gpu:.4e} exceeds the emulation's {e_emu:.4e} by more than 10%"
        ));
    }
    c
}

/// Checks a host row's whole output against the f64 golden of the whole problem.
pub fn check_host(
    what: &str,
    p: &AttentionProblem,
    x: &AttentionInputs,
    o: &Tensor,
    lse: &Tensor,
    tol: Tolerance,
    with_lse: bool,
) -> Check {
    let (go, gl) = golden::exact_attention_f64(p, x);
    let as64 = |t: &Tensor| t.data.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let lse_cmp = with_lse.then(|| Comparison::new(&gl, &as64(lse)));
    Check::from(
        what,
        "f64 golden of the whole problem".into(),
        Comparison::new(&go, &as64(o)),
        lse_cmp,
        tol,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_uniform_in_range_and_deterministic() {
        let s = buffer_seed(100, 1);
        let xs: Vec<f32> = (0..10_000)
            .map(|i| fill_value(s, i, 2.0, DType::F16))
            .collect();
        assert!(
            xs.iter().all(|&x| (-2.0..=2.0).contains(&x)),
            "f16 rounding may reach 2.0, never beyond"
        );
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert_eq!(xs[17], fill_value(s, 17, 2.0, DType::F16));
        assert_ne!(fill_value(buffer_seed(100, 2), 17, 2.0, DType::F16), xs[17]);
    }

    #[test]
    fn slice_indexes_the_full_layout() {
        let f = Filled {
            seed: 9,
            scale: 1.0,
            dtype: DType::F32,
            dims: [3, 10, 4, 8],
        };
        let t = f.slice(2, 7..9, &[3, 1]);
        assert_eq!(t.shape, vec![1, 2, 2, 8]);
        // row 8 (second), head 1 (second of the list), element 5
        let idx = ((2 * 10 + 8) * 4 + 1) * 8 + 5;
        assert_eq!(
            t.row4(0, 1, 1)[5],
            fill_value(9, idx as u64, 1.0, DType::F32)
        );
    }

    #[test]
    fn device_check_passes_on_the_golden_itself_and_fails_on_a_perturbation() {
        // A problem whose "device output" is the f64 golden of the full host-regenerated inputs:
        // the sliced check must agree with it; a perturbed output must fail.
        let mut p = AttentionProblem::uniform(2, 3, 40, 4, 2, 16, 16, DType::F32);
        p.seqlens_k = vec![40, 17];
        p.causal = true;
        let fill = |b: u32, dims| Filled {
            seed: buffer_seed(5, b),
            scale: 2.0,
            dtype: DType::F32,
            dims,
        };
        let (q, k, v) = (
            fill(0, [2, 3, 4, 16]),
            fill(1, [2, 40, 2, 16]),
            fill(2, [2, 40, 2, 16]),
        );
        let whole = |f: Filled| {
            let mut t = Tensor::zeros(&f.dims, DType::F32);
            for b in 0..f.dims[0] {
                let s = f.slice(b, 0..f.dims[1], &(0..f.dims[2]).collect::<Vec<_>>());
                let n = s.data.len();
                t.data[b * n..(b + 1) * n].copy_from_slice(&s.data);
            }
            t
        };
        let mut x = AttentionInputs::new(whole(q), whole(k), whole(v));
        x.seqlens_k = Some(vec![40, 17]);
        let out = golden::exact_attention(&p, &x);
        let tol = Tolerance::output(DType::F32);
        for b in 0..2 {
            let probe = Probe::of(&p, b, 2);
            let c = check_device("t", &p, q, k, v, &probe, &out.o, Some(&out.lse), tol);
            assert!(c.passed, "{c:?}");
        }
        let mut bad = out.o.clone();
        let (b, i, h) = (1, 2, 3); // sequence 1, last row, head 3 (KV head 1)
        let at = ((b * 3 + i) * 4 + h) * 16;
        bad.data[at] += 0.5;
        let c = check_device("t", &p, q, k, v, &Probe::of(&p, 1, 1), &bad, None, tol);
        assert!(!c.passed, "{c:?}");
    }

    fn whole(f: Filled) -> Tensor {
        let mut t = Tensor::zeros(&f.dims, f.dtype);
        let n = f.dims[1] * f.dims[2] * f.dims[3];
        for b in 0..f.dims[0] {
            let s = f.slice(b, 0..f.dims[1], &(0..f.dims[2]).collect::<Vec<_>>());
            t.data[b * n..(b + 1) * n].copy_from_slice(&s.data);
        }
        t
    }

    #[test]
    fn turbo_slices_reproduce_the_whole_emulation() {
        // The emulation of the whole problem, sliced, must pass the sliced check exactly: the
        // slice (whole query blocks, whole KV heads, one sequence) quantises as the whole does.
        use ferrattn_core::turbo::{self, KvBits, TurboConfig, TurboKvCache};
        let fill = |b: u32, dims| Filled {
            seed: buffer_seed(21, b),
            scale: 2.0,
            dtype: DType::BF16,
            dims,
        };
        let mut p = AttentionProblem::uniform(2, 128, 128, 4, 2, 64, 64, DType::BF16);
        p.causal = true;
        let (q, k, v) = (
            fill(0, [2, 128, 4, 64]),
            fill(1, [2, 128, 2, 64]),
            fill(2, [2, 128, 2, 64]),
        );
        let x = AttentionInputs::new(whole(q), whole(k), whole(v));
        let cfg = TurboConfig {
            kv_bits: KvBits::Int4,
            ..TurboConfig::default()
        };
        let (out, _) = turbo::prefill(&cfg, &p, &x).unwrap();
        for b in 0..2 {
            let c = check_turbo_device(
                "t",
                &p,
                q,
                k,
                v,
                &Probe::of(&p, b, 64),
                &out.o,
                None,
                &cfg,
                &TurboCall::Prefill,
            );
            assert!(
                c.passed && c.rel_fro == 0.0,
                "prefill slice of sequence {b}: {c:?}"
            );
        }
        // decode: one query token over a cache of 100 tokens (one block + 36 buffered)
        let mut pd = AttentionProblem::uniform(2, 1, 128, 4, 2, 64, 64, DType::BF16);
        pd.seqlens_k = vec![100, 100];
        let qd = fill(3, [2, 1, 4, 64]);
        let bits = vec![4u8, 2];
        let dcfg = TurboConfig {
            kv_bits: KvBits::PerHead { bits: bits.clone() },
            ..TurboConfig::default()
        };
        let cache =
            TurboKvCache::from_context(&dcfg, &x.k, x.v.as_ref().unwrap(), &[100, 100]).unwrap();
        let out = turbo::decode(&dcfg, &cache, &whole(qd), pd.softmax_scale).unwrap();
        let call = TurboCall::Decode { bits, fast: false };
        let c = check_turbo_device(
            "t",
            &pd,
            qd,
            k,
            v,
            &Probe::of(&pd, 1, 1),
            &out.o,
            Some(&out.o),
            &dcfg,
            &call,
        );
        assert!(c.passed && c.rel_fro == 0.0, "decode slice: {c:?}");
        let mut bad = out.o.clone();
        let (b, h) = (1, 3); // sequence 1, head 3 (KV head 1)
        bad.data[(b * 4 + h) * 64] += 0.25;
        let c = check_turbo_device(
            "t",
            &pd,
            qd,
            k,
            v,
            &Probe::of(&pd, 1, 1),
            &bad,
            None,
            &dcfg,
            &call,
        );
        assert!(!c.passed, "a perturbed output must fail: {c:?}");
    }
}
