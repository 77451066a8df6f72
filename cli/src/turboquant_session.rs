//! TurboQuant serving loop (`ferrattn turboquant-session`): compress a prefill's K/V into the
//! TurboQuant cache, then decode N tokens one at a time, each appended to the cache first,
//! reporting bytes per token, compression against fp16 and each step's error against exact
//! attention over everything cached so far.
//!
//! On `cuda` the cache lives on the GPU (`ferrattn_cuda::turboquant`: compression kernels and the
//! fused decode); the prefill's own attention runs on the same fused kernel over the compressed
//! cache (causal), so the prefill output has TurboQuant's semantics, as
//! `ferrattn_core::turboquant::emulate`. On `cpu` every step runs the emulation over the prefix.

use crate::{FerrattnError, Result};
use ferrattn_core::turboquant::{self, TurboQuantConfig};
use ferrattn_core::{
    AttentionInputs, AttentionOptions, AttentionProblem, BackendKind, Comparison, DType, Tensor,
};
use std::time::Instant;

/// What a session is asked to do.
#[derive(Clone, Debug)]
pub struct SessionArgs {
    /// `Cpu` (the emulation) or `Cuda` (the kernels).
    pub backend: BackendKind,
    /// Sequences.
    pub batch: usize,
    /// Prefill tokens per sequence.
    pub context: usize,
    /// Query heads.
    pub heads_q: usize,
    /// KV heads.
    pub heads_kv: usize,
    /// Head dim.
    pub head_dim: usize,
    /// Decode steps.
    pub steps: usize,
    /// Key bits (QJL bit included when `key_qjl`).
    pub key_bits: u8,
    /// Value bits.
    pub value_bits: u8,
    /// Keys with the QJL correction.
    pub key_qjl: bool,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Compare every step with exact attention.
    pub check: bool,
}

/// What a session measured.
#[derive(Clone, Debug)]
pub struct SessionReport {
    /// The configuration used.
    pub config: TurboQuantConfig,
    /// Prefill (compression + the prefill's attention), host wall clock, ms.
    pub prefill_ms: f64,
    /// Mean decode step (append + decode, transfers included), host wall clock, ms.
    pub step_ms: f64,
    /// Packed bytes per token (all KV heads, norms included) of the configuration.
    pub packed_bytes_per_token: f64,
    /// Bytes per token the device layout holds (one nibble per coordinate), 0 on the CPU.
    pub device_bytes_per_token: usize,
    /// fp16 bytes per token.
    pub fp16_bytes_per_token: usize,
    /// Worst step's relative Frobenius error of O against exact attention (f64).
    pub worst_step_error: f64,
    /// Prefill O against exact causal attention.
    pub prefill_error: f64,
}

fn rel_error(p: &AttentionProblem, x: &AttentionInputs, o: &Tensor) -> f64 {
    let (g, _) = ferrattn_core::golden::exact_attention_f64(p, x);
    Comparison::new(&g, &o.data.iter().map(|&v| v as f64).collect::<Vec<_>>()).rel_fro
}

/// Runs a session.
pub fn run(a: &SessionArgs) -> Result<SessionReport> {
    let (b, s, hq, hk, d) = (a.batch, a.context, a.heads_q, a.heads_kv, a.head_dim);
    let shape = crate::session::SessionShape {
        batch: b,
        context: s,
        steps: a.steps,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
    };
    let [q_all, k_all, v_all] =
        crate::session::sequence("turboquant-session", shape, DType::F16, a.seed)?;
    let ctx = AttentionInputs::new(
        q_all.seq_range(0, s),
        k_all.seq_range(0, s),
        v_all.seq_range(0, s),
    );
    let p = ctx.problem(
        AttentionOptions {
            causal: true,
            softmax_scale: None,
        },
        None,
    )?;
    let cfg = TurboQuantConfig {
        key_bits: a.key_bits,
        value_bits: a.value_bits,
        key_qjl: a.key_qjl,
        ..TurboQuantConfig::paper_default(&p)
    };
    cfg.check(&p)?;
    let comp = cfg.compression(&p);
    // one decode step's problem over the first `seen` tokens
    let step = |t: usize| -> Result<(AttentionProblem, AttentionInputs)> {
        let seen = s + t + 1;
        let x = AttentionInputs::new(
            q_all.seq_range(s + t, 1),
            k_all.seq_range(0, seen),
            v_all.seq_range(0, seen),
        );
        let px = x.problem(
            AttentionOptions {
                causal: false,
                softmax_scale: Some(p.softmax_scale),
            },
            None,
        )?;
        Ok((px, x))
    };
    let (mut worst, mut step_secs) = (0.0f64, 0.0f64);
    let (prefill_ms, prefill_error, device_bytes_per_token);
    match a.backend {
        BackendKind::Cuda => {
            let gpu = ferrattn_cuda::CudaBackend::new(0);
            let t = gpu.turboquant(&cfg, &p)?;
            let t0 = Instant::now();
            let mut cache = t.alloc_cache(b, hk, q_all.shape[1])?;
            let k_d = t.upload_f16(&ctx.k.data)?;
            let v_d = t.upload_f16(&ctx.v.as_ref().expect("separate v").data)?;
            t.append(&mut cache, &k_d, &v_d, s, &vec![s; b])?;
            let prep = t.prepare_decode(&p, &cache, None)?;
            let mut out = t.alloc_outputs(&p)?;
            t.launch_decode(&prep, &t.upload_f16(&ctx.q.data)?, &cache, &mut out)?;
            let o = t.download(&out, &p)?;
            prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
            prefill_error = if a.check {
                rel_error(&p, &ctx, &o.o)
            } else {
                f64::NAN
            };
            device_bytes_per_token = cache.bytes_per_token_head() * hk;
            for i in 0..a.steps {
                let (px, x) = step(i)?;
                let t1 = Instant::now();
                let kn = k_all.seq_range(s + i, 1);
                let vn = v_all.seq_range(s + i, 1);
                t.append(
                    &mut cache,
                    &t.upload_f16(&kn.data)?,
                    &t.upload_f16(&vn.data)?,
                    1,
                    &vec![1; b],
                )?;
                let prep = t.prepare_decode(&px, &cache, None)?;
                let mut out = t.alloc_outputs(&px)?;
                t.launch_decode(&prep, &t.upload_f16(&x.q.data)?, &cache, &mut out)?;
                let o = t.download(&out, &px)?;
                step_secs += t1.elapsed().as_secs_f64();
                if a.check {
                    worst = worst.max(rel_error(&px, &x, &o.o));
                }
            }
        }
        BackendKind::Cpu => {
            let t0 = Instant::now();
            let o = turboquant::emulate(&cfg, &p, &ctx)?;
            prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
            prefill_error = if a.check {
                rel_error(&p, &ctx, &o.o)
            } else {
                f64::NAN
            };
            device_bytes_per_token = 0;
            for i in 0..a.steps {
                let (px, x) = step(i)?;
                let t1 = Instant::now();
                let o = turboquant::emulate(&cfg, &px, &x)?;
                step_secs += t1.elapsed().as_secs_f64();
                if a.check {
                    worst = worst.max(rel_error(&px, &x, &o.o));
                }
            }
        }
        other => {
            return Err(FerrattnError::NotSupported {
                algorithm: "turboquant-session".into(),
                backend: other.to_string(),
                supported: "cpu, cuda".into(),
            })
        }
    }
    Ok(SessionReport {
        config: cfg,
        prefill_ms,
        step_ms: if a.steps > 0 {
            step_secs * 1e3 / a.steps as f64
        } else {
            0.0
        },
        packed_bytes_per_token: comp.packed_bytes_per_token,
        device_bytes_per_token,
        fp16_bytes_per_token: comp.fp16_bytes_per_token,
        worst_step_error: worst,
        prefill_error,
    })
}
