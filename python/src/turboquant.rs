//! `ferrattn.TurboQuantCache`: the TurboQuant compressed KV cache of a batch (Zandieh et al.;
//! rotated Lloyd-Max codes, QJL signs of the key residual), fed by `append(k, v)` and read by
//! `decode(q)`.
//!
//! On CUDA tensors (float16, head dim 64 or 128) the cache is a
//! [`ferrattn::device_api::TurboQuantCache`] in device memory it owns, allocated (and zeroed,
//! synchronously, once) at the first append for `max_tokens` tokens per sequence. Every call
//! then runs on the caller's stream with a workspace from the caller's framework (the Python
//! wrapper keeps one for appends and one for decodes on the cache object, grown when a step
//! needs more): it plans its step ([`TurboQuantDecodePlan`], host only), copies the step's
//! tables into the workspace with one stream-ordered copy
//! ([`TurboQuantDevice::begin_decode`]) and enqueues the launches. Nothing is allocated by
//! ferrattn, synchronised or copied back. A decode whose step (query heads, scale, the cache's
//! lengths) and workspace are those of the previous decode reuses the tables already there and
//! only launches, so once a decode ran eagerly, the same decode can be captured in a CUDA graph
//! (appends, which move the lengths, stay outside the graph).
//!
//! On host tensors it keeps the tokens as given (widened to f32) and `decode` runs the CPU
//! emulation (`ferrattn_core::turboquant::emulate`) over everything held: each token is
//! compressed alone, so that equals compressing them as they arrive.
//!
//! `compress` picks the CUDA cache's compression kernels
//! ([`TurboQuantCompression`]: `"exact"`, bit for bit the emulation's codes; `"fast"`, the
//! device API's default, and `"split"` on tensor cores within their stated contract). The host
//! cache is the emulation, the exact contract: it accepts `"exact"` or nothing, and refuses
//! `"fast"` / `"split"` with a message saying so.

use crate::cuda::{self, ordinal};
use crate::dlpack::{same_device, Device, View};
use crate::error::{BoundaryError, Result};
use crate::host;
use crate::ops::{deliver, parse_opt, Outputs};
use crate::turbo_cuda::workspace as workspace_of;
use ferrattn::device_api::{
    Location, Stream, TurboQuantCache as DeviceCache, TurboQuantCacheSpec, TurboQuantCompression,
    TurboQuantDecodePlan, TurboQuantDecodeStep, TurboQuantDecodeViews, TurboQuantDevice,
    TurboQuantShape, Workspace,
};
use ferrattn_core::turboquant::{self, TurboQuantConfig};
use ferrattn_core::{AttentionInputs, AttentionProblem, DType, Tensor};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Tokens per sequence a CUDA cache is made for when the caller gave no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: usize = 4096;

/// One TurboQuant device per CUDA device, opened at first use and kept for the process (its
/// kernels are loaded once per configuration and cached inside).
fn device(ordinal: usize) -> Result<Arc<TurboQuantDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<TurboQuantDevice>>>> = OnceLock::new();
    crate::cuda::per_device(&DEVICES, ordinal, |o| Ok(TurboQuantDevice::new(o)?))
}

/// The tokens of a host cache, per sequence `[tokens, heads_kv, head_dim]` in f32.
struct HostKv {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    lens: Vec<usize>,
}

/// A cache on a CUDA device.
struct DeviceKv {
    /// The last decode's step, its tables in the decode workspace (declared first: dropped
    /// before the cache).
    decode: Option<DecodeStep>,
    device: Arc<TurboQuantDevice>,
    cache: DeviceCache,
}

/// A decode step whose tables are in the caller's decode workspace, kept so that the next
/// decode of the same step (shape, lengths) into the same workspace only launches.
///
/// `TurboQuantDecodeStep` borrows its plan and (mutably) its workspace; all three live here,
/// boxed so their addresses never move, and the step is declared first so it is dropped before
/// what it borrows (dropping it waits for nothing).
struct DecodeStep {
    step: Option<TurboQuantDecodeStep<'static, 'static>>,
    plan: Box<TurboQuantDecodePlan>,
    workspace: Box<Workspace>,
}

impl DecodeStep {
    fn begin(
        device: &TurboQuantDevice,
        plan: TurboQuantDecodePlan,
        workspace: Workspace,
        stream: Stream,
    ) -> Result<DecodeStep> {
        let mut s = DecodeStep {
            step: None,
            plan: Box::new(plan),
            workspace: Box::new(workspace),
        };
        // SAFETY: the step borrows `*s.plan` and `*s.workspace`, boxes owned by `s` whose
        // contents never move and are never touched while the step exists; the field order
        // drops the step before both.
        let (plan, ws): (&'static TurboQuantDecodePlan, &'static mut Workspace) = unsafe {
            (
                &*(s.plan.as_ref() as *const TurboQuantDecodePlan),
                &mut *(s.workspace.as_mut() as *mut Workspace),
            )
        };
        s.step = Some(device.begin_decode(plan, ws, stream)?);
        Ok(s)
    }

    /// Whether this step's tables serve a decode planned as `shape` over `lens` in `ws`.
    fn serves(&self, shape: &TurboQuantShape, lens: &[usize], ws: &Workspace) -> bool {
        self.plan.shape() == shape
            && self.plan.lens_before() == lens
            && self.plan.new_rows() == 0
            && (self.workspace.addr(), self.workspace.bytes()) == (ws.addr(), ws.bytes())
    }
}

/// The plan of a step of `new[b]` tokens appended to caches of `before` (host only, once the
/// configuration's kernels are loaded).
fn plan_step(
    device: &TurboQuantDevice,
    cfg: &TurboQuantConfig,
    shape: &TurboQuantShape,
    before: &[usize],
    new: &[usize],
) -> Result<TurboQuantDecodePlan> {
    let after: Vec<usize> = before.iter().zip(new).map(|(l, n)| l + n).collect();
    let schedule = device.decode_schedule(cfg, shape, &after)?;
    Ok(TurboQuantDecodePlan::new(
        cfg, shape, before, new, schedule,
    )?)
}

/// The TurboQuant compressed KV cache of a batch: `append` compresses a step's tokens (or a
/// prompt), `decode` attends one query token per sequence over everything held.
#[pyclass(module = "ferrattn._ferrattn")]
pub struct TurboQuantCache {
    cfg: TurboQuantConfig,
    /// The compression asked for (`None`: the device API's default on CUDA, the emulation's
    /// exact contract on the host).
    compress: Option<TurboQuantCompression>,
    batch: usize,
    heads_kv: usize,
    head_dim: usize,
    max_tokens: usize,
    host: Option<HostKv>,
    device: Option<DeviceKv>,
}

impl TurboQuantCache {
    fn held_lens(&self) -> Vec<usize> {
        match (&self.host, &self.device) {
            (Some(h), _) => h.lens.clone(),
            (None, Some(d)) => d.cache.lens().to_vec(),
            (None, None) => vec![0; self.batch],
        }
    }

    fn empty() -> BoundaryError {
        BoundaryError::Unsupported(
            "the TurboQuantCache is empty: call append(k, v) before decode".into(),
        )
    }

    fn check_kv(&self, k: &View<'_>, v: &View<'_>) -> Result<()> {
        for t in [k, v] {
            t.expect_rank(4, "[batch, new_tokens, heads_kv, head_dim]")?;
            let ok = t.shape[0] == self.batch
                && t.shape[1] > 0
                && t.shape[2] == self.heads_kv
                && t.shape[3] == self.head_dim;
            if !ok {
                return Err(BoundaryError::Shape {
                    name: t.name,
                    message: format!(
                        "has shape {:?} but the cache is for [{}, new_tokens >= 1, {}, {}]",
                        t.shape, self.batch, self.heads_kv, self.head_dim
                    ),
                });
            }
        }
        if k.shape != v.shape {
            return Err(BoundaryError::Shape {
                name: "v",
                message: format!("has shape {:?} but k has {:?}", v.shape, k.shape),
            });
        }
        Ok(())
    }

    fn shape(&self, heads_q: usize, scale: Option<f32>) -> TurboQuantShape {
        TurboQuantShape {
            batch: self.batch,
            heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            softmax_scale: scale,
        }
    }

    /// Makes the CUDA cache at the first append (its memory allocated and zeroed once).
    fn device_cache(&mut self, ordinal: usize) -> Result<&mut DeviceKv> {
        if self.device.is_none() {
            let spec = TurboQuantCacheSpec {
                batch: self.batch,
                heads_kv: self.heads_kv,
                head_dim: self.head_dim,
                capacity_tokens: self.max_tokens,
                config: self.cfg.clone(),
                compression: self.compress.unwrap_or_default(),
            };
            let device = device(ordinal)?;
            let cache = device.cache(&spec)?;
            self.host = None;
            self.device = Some(DeviceKv {
                decode: None,
                device,
                cache,
            });
        }
        Ok(self.device.as_mut().expect("made above"))
    }

    /// The append step's shape: the KV heads as query heads (its decode half is never run).
    fn append_shape(&self) -> TurboQuantShape {
        TurboQuantShape {
            batch: self.batch,
            heads_q: self.heads_kv,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            softmax_scale: None,
        }
    }

    fn append_cuda(
        &mut self,
        k: &View<'_>,
        v: &View<'_>,
        stream: Stream,
        ws: &View<'_>,
    ) -> Result<()> {
        if self
            .host
            .as_ref()
            .is_some_and(|h| h.lens.iter().any(|&l| l > 0))
        {
            return Err(BoundaryError::Device {
                name: "TurboQuantCache",
                message: "holds a host cache (its tokens came as host tensors); append and \
                          decode take tensors on the device they live on"
                    .into(),
            });
        }
        let ordinal = ordinal(k)?;
        if let Some(d) = &self.device {
            if d.cache.location() != Location::Cuda(ordinal) {
                return Err(BoundaryError::Device {
                    name: "k",
                    message: format!(
                        "is on cuda:{ordinal} but the cache lives on {}",
                        d.cache.location()
                    ),
                });
            }
        }
        let (shape, cfg) = (self.append_shape(), self.cfg.clone());
        let new = vec![k.shape[1]; self.batch];
        let d = self.device_cache(ordinal)?;
        let plan = plan_step(&d.device, &cfg, &shape, d.cache.lens(), &new)?;
        let mut w = workspace_of(ws)?;
        let (kv, vv) = (cuda::whole(k)?, cuda::whole(v)?);
        let step = d.device.begin_decode(&plan, &mut w, stream)?;
        step.append(&kv, &vv, &mut d.cache, stream)?;
        Ok(())
    }

    /// Workspace bytes of the next append of `new_tokens` per sequence (`like`: its `k`) or
    /// decode with `heads_q` query heads (a decode's plan is kept for the decode that follows).
    fn step_workspace_bytes(
        &mut self,
        kind: &str,
        new_tokens: usize,
        heads_q: usize,
        scale: Option<f32>,
        like: &View<'_>,
    ) -> Result<usize> {
        if !matches!(like.device, Device::Cuda(_)) {
            return Ok(0);
        }
        match kind {
            "append" => {
                if self
                    .host
                    .as_ref()
                    .is_some_and(|h| h.lens.iter().any(|&l| l > 0))
                {
                    return Ok(0); // append refuses CUDA tensors for a host cache
                }
                let (shape, cfg) = (self.append_shape(), self.cfg.clone());
                let new = vec![new_tokens; self.batch];
                let d = self.device_cache(ordinal(like)?)?;
                Ok(plan_step(&d.device, &cfg, &shape, d.cache.lens(), &new)?.workspace_bytes())
            }
            "decode" => {
                let shape = self.shape(heads_q, scale);
                let Some(d) = &self.device else {
                    return Err(TurboQuantCache::empty());
                };
                if let Some(s) = &d.decode {
                    if s.plan.shape() == &shape && s.plan.lens_before() == d.cache.lens() {
                        return Ok(s.plan.workspace_bytes());
                    }
                }
                let zero = vec![0; self.batch];
                Ok(
                    plan_step(&d.device, &self.cfg, &shape, d.cache.lens(), &zero)?
                        .workspace_bytes(),
                )
            }
            other => Err(BoundaryError::Unsupported(format!(
                "workspace_bytes({other:?}); expected \"append\" or \"decode\""
            ))),
        }
    }

    fn append_host(&mut self, k: &View<'_>, v: &View<'_>) -> Result<()> {
        if self.device.is_some() {
            return Err(BoundaryError::Device {
                name: "TurboQuantCache",
                message: "holds a CUDA cache (its tokens came as CUDA tensors); append and \
                          decode take tensors on that device"
                    .into(),
            });
        }
        if let Some(c) = self.compress.filter(|&c| c != TurboQuantCompression::Exact) {
            return Err(BoundaryError::Unsupported(format!(
                "compress={:?} on host tensors: the host cache is the CPU emulation, which is \
                 the exact contract (codes bit for bit); the tensor-core paths \"fast\" and \
                 \"split\" run on CUDA tensors. Use compress=\"exact\" (or leave it unset) for \
                 a host cache",
                c.name()
            )));
        }
        let (kt, vt) = (host::read(k)?, host::read(v)?);
        let (b, s) = (self.batch, k.shape[1]);
        let row = self.heads_kv * self.head_dim;
        let h = self.host.get_or_insert_with(|| HostKv {
            k: vec![Vec::new(); b],
            v: vec![Vec::new(); b],
            lens: vec![0; b],
        });
        for bi in 0..b {
            let r = bi * s * row..(bi + 1) * s * row;
            h.k[bi].extend_from_slice(&kt.data[r.clone()]);
            h.v[bi].extend_from_slice(&vt.data[r]);
            h.lens[bi] += s;
        }
        Ok(())
    }
}

/// The host path's decode: the emulation over every token held.
fn decode_host(
    cfg: &TurboQuantConfig,
    h: &HostKv,
    (hk, d): (usize, usize),
    q: &Tensor,
    scale: Option<f32>,
) -> Result<ferrattn_core::AttentionOutput> {
    if h.lens.contains(&0) {
        return Err(TurboQuantCache::empty());
    }
    let b = h.lens.len();
    let m = *h.lens.iter().max().expect("batch > 0");
    let mut p = AttentionProblem::uniform(b, 1, m, q.shape[2], hk, d, d, q.dtype);
    p.seqlens_k = h.lens.clone();
    if let Some(s) = scale {
        p.softmax_scale = s;
    }
    let pad = |rows: &[Vec<f32>]| {
        let mut t = Tensor::zeros(&[b, m, hk, d], q.dtype);
        for (bi, r) in rows.iter().enumerate() {
            t.data[bi * m * hk * d..bi * m * hk * d + r.len()].copy_from_slice(r);
        }
        t
    };
    let mut x = AttentionInputs::new(q.clone(), pad(&h.k), pad(&h.v));
    x.seqlens_k = Some(h.lens.iter().map(|&l| l as i64).collect());
    Ok(turboquant::emulate(cfg, &p, &x)?)
}

#[pymethods]
impl TurboQuantCache {
    #[new]
    #[pyo3(signature = (batch, heads_kv, head_dim, key_bits=4, value_bits=3, key_qjl=true, seed=None, max_tokens=None, compress=None))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn new(
        batch: usize,
        heads_kv: usize,
        head_dim: usize,
        key_bits: u8,
        value_bits: u8,
        key_qjl: bool,
        seed: Option<u64>,
        max_tokens: Option<usize>,
        compress: Option<&str>,
    ) -> PyResult<TurboQuantCache> {
        let compress = compress
            .map(|c| c.parse::<TurboQuantCompression>())
            .transpose()
            .map_err(|e| BoundaryError::Unsupported(e.to_string()))?;
        if batch == 0 || heads_kv == 0 || head_dim == 0 {
            return Err(BoundaryError::Shape {
                name: "TurboQuantCache",
                message: format!(
                    "has batch {batch}, heads_kv {heads_kv} and head_dim {head_dim}; all must \
                     be positive"
                ),
            }
            .into());
        }
        let max_tokens = max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        if max_tokens == 0 {
            return Err(BoundaryError::Shape {
                name: "max_tokens",
                message: "is 0; a cache holds at least one token per sequence".into(),
            }
            .into());
        }
        let p = AttentionProblem::uniform(1, 1, 1, 1, 1, head_dim, head_dim, DType::F16);
        let mut cfg = TurboQuantConfig::paper_default(&p);
        cfg.key_bits = key_bits;
        cfg.value_bits = value_bits;
        cfg.key_qjl = key_qjl;
        if let Some(s) = seed {
            cfg.seed = s;
        }
        cfg.check(&p).map_err(BoundaryError::from)?;
        Ok(TurboQuantCache {
            cfg,
            compress,
            batch,
            heads_kv,
            head_dim,
            max_tokens,
            host: None,
            device: None,
        })
    }

    /// Appends `k`, `v` (`[B, S, Hk, D]`, S >= 1): S tokens to every sequence, each compressed
    /// alone. On CUDA `workspace` is a device buffer of at least
    /// `workspace_bytes("append", S, ...)` bytes that outlives the enqueued work.
    #[pyo3(signature = (k, v, stream=None, workspace=None))]
    fn append(
        &mut self,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        stream: Option<usize>,
        workspace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (k, v) = (View::parse("k", k)?, View::parse("v", v)?);
        let device = same_device(&[&k, &v])?;
        self.check_kv(&k, &v)?;
        match device {
            Device::Cuda(_) => {
                let ws = parse_opt("workspace", workspace)?.ok_or_else(no_workspace)?;
                self.append_cuda(&k, &v, cuda::stream(stream), &ws)?
            }
            Device::Cpu => self.append_host(&k, &v)?,
        }
        Ok(())
    }

    /// Device bytes the next CUDA `append` of `new_tokens` tokens per sequence (`kind =
    /// "append"`) or `decode` with `heads_q` query heads (`"decode"`) needs in its workspace;
    /// `like` is the call's `k` or `q` (0 for host tensors).
    #[pyo3(signature = (kind, new_tokens, heads_q, softmax_scale, like))]
    fn workspace_bytes(
        &mut self,
        kind: &str,
        new_tokens: usize,
        heads_q: usize,
        softmax_scale: Option<f32>,
        like: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let like = View::parse("like", like)?;
        Ok(self.step_workspace_bytes(kind, new_tokens, heads_q, softmax_scale, &like)?)
    }

    /// Decode of `q [B, 1, Hq, D]` over everything the cache holds: O `[B, 1, Hq, D]`, LSE
    /// `f32 [B, Hq, 1]` (natural log).
    #[pyo3(signature = (q, softmax_scale=None, out=None, lse=None, stream=None, workspace=None))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn decode<'py>(
        &mut self,
        py: Python<'py>,
        q: &Bound<'py, PyAny>,
        softmax_scale: Option<f32>,
        out: Option<&Bound<'py, PyAny>>,
        lse: Option<&Bound<'py, PyAny>>,
        stream: Option<usize>,
        workspace: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Outputs> {
        let q = View::parse("q", q)?;
        let (out, lse) = (parse_opt("out", out)?, parse_opt("lse", lse)?);
        let mut all = vec![&q];
        all.extend(out.iter());
        all.extend(lse.iter());
        let device = same_device(&all)?;
        q.expect_rank(4, "[batch, 1, heads_q, head_dim]")?;
        let (b, hq) = (q.shape[0], q.shape[2]);
        if b != self.batch || q.shape[1] != 1 || q.shape[3] != self.head_dim {
            return Err(BoundaryError::Shape {
                name: "q",
                message: format!(
                    "has shape {:?} but the cache decodes [{}, 1, heads_q, {}]",
                    q.shape, self.batch, self.head_dim
                ),
            }
            .into());
        }
        if let Some(o) = &out {
            host_or_device_output(o, &[b, 1, hq, self.head_dim], q.float_dtype()?, device)?;
        }
        if let Some(l) = &lse {
            host_or_device_output(l, &[b, hq, 1], DType::F32, device)?;
        }
        if let Device::Cuda(_) = device {
            let (Some(out), Some(lse)) = (&out, &lse) else {
                return Err(BoundaryError::Unsupported(
                    "TurboQuantCache.decode on CUDA writes into out= and lse= (the Python \
                     wrapper allocates them)"
                        .into(),
                )
                .into());
            };
            let ws = parse_opt("workspace", workspace)?.ok_or_else(no_workspace)?;
            let Some(d) = &mut self.device else {
                return Err(match self.host {
                    Some(_) => BoundaryError::Device {
                        name: "TurboQuantCache",
                        message: "holds a host cache (its tokens came as host tensors); decode \
                                  takes host tensors"
                            .into(),
                    },
                    None => TurboQuantCache::empty(),
                }
                .into());
            };
            let shape = TurboQuantShape {
                batch: self.batch,
                heads_q: hq,
                heads_kv: self.heads_kv,
                head_dim: self.head_dim,
                softmax_scale,
            };
            let w = workspace_of(&ws)?;
            let views = [cuda::whole(&q)?, cuda::whole(out)?, cuda::whole(lse)?];
            let stream = cuda::stream(stream);
            // the previous decode's tables serve this one when the step and the workspace are
            // the same: then nothing is copied and the call only launches (capturable)
            if !d
                .decode
                .as_ref()
                .is_some_and(|s| s.serves(&shape, d.cache.lens(), &w))
            {
                d.decode = None;
                let zero = vec![0; b];
                let plan = plan_step(&d.device, &self.cfg, &shape, d.cache.lens(), &zero)?;
                d.decode = Some(DecodeStep::begin(&d.device, plan, w, stream)?);
            }
            let step = d.decode.as_ref().and_then(|s| s.step.as_ref());
            let step = step.expect("begun above");
            let x = TurboQuantDecodeViews {
                q: &views[0],
                o: &views[1],
                lse: &views[2],
            };
            step.run(&x, &d.cache, stream)
                .map_err(BoundaryError::from)?;
            return Ok((None, None));
        }
        if self.device.is_some() {
            return Err(BoundaryError::Device {
                name: "q",
                message: "is host memory but the cache lives on a CUDA device".into(),
            }
            .into());
        }
        let qt = host::read(&q)?;
        let h = self.host.as_ref().ok_or_else(TurboQuantCache::empty)?;
        let (cfg, dims) = (&self.cfg, (self.heads_kv, self.head_dim));
        let r = py.detach(|| decode_host(cfg, h, dims, &qt, softmax_scale))?;
        Ok((deliver(out.as_ref(), &r.o)?, deliver(lse.as_ref(), &r.lse)?))
    }

    /// The compression path of the appends: the one asked for; unset, `"exact"` for a host
    /// cache, the device API's default (`"fast"`) for a CUDA one, `None` before the first append.
    #[getter]
    fn compress(&self) -> Option<&'static str> {
        match (&self.device, &self.host, self.compress) {
            (Some(d), _, _) => Some(d.cache.compression().name()),
            (None, _, Some(c)) => Some(c.name()),
            (None, Some(_), None) => Some(TurboQuantCompression::Exact.name()),
            (None, None, None) => None,
        }
    }

    /// Tokens held per sequence.
    #[getter]
    fn lens(&self) -> Vec<usize> {
        self.held_lens()
    }

    /// Tokens held for sequence `b`.
    fn seq_len(&self, b: usize) -> PyResult<usize> {
        let lens = self.held_lens();
        lens.get(b).copied().ok_or_else(|| {
            BoundaryError::Shape {
                name: "b",
                message: format!("is {b} but the cache holds {} sequences", lens.len()),
            }
            .into()
        })
    }

    /// Forgets every token (a CUDA cache keeps its memory for the next sequences).
    fn reset(&mut self) {
        self.host = None;
        if let Some(d) = &mut self.device {
            d.decode = None;
            d.device.reset(&mut d.cache);
        }
    }

    /// The configuration: bits, QJL, seed.
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("key_bits", self.cfg.key_bits)?;
        d.set_item("value_bits", self.cfg.value_bits)?;
        d.set_item("key_qjl", self.cfg.key_qjl)?;
        d.set_item("qjl_dim", self.cfg.qjl_dim)?;
        d.set_item("seed", self.cfg.seed)?;
        Ok(d)
    }

    /// Device bytes allocated for a CUDA cache (its capacity), 0 for a host one.
    fn allocated_bytes(&self) -> usize {
        self.device
            .as_ref()
            .map_or(0, |d| d.cache.allocated_bytes())
    }

    /// Bytes of the compressed tokens on the device (what a decode reads), the fp16 bytes they
    /// stand for and the ratio; for a host cache the same counts for the device layout.
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let lens = self.held_lens();
        let tokens: usize = lens.iter().sum();
        let d = self.head_dim;
        // the device layout (ferrattn_cuda::turboquant::DeviceTurboQuantCache::bytes_per_token_head)
        let (kc, vc) = ferrattn_cuda::turboquant::code_crumbs(&self.cfg);
        let per_head =
            ferrattn_cuda::turboquant::layout::bytes_per_token_head(d, self.cfg.key_qjl, kc, vc);
        let compressed = tokens * self.heads_kv * per_head;
        let fp16 = tokens * self.heads_kv * 2 * d * 2;
        let m = pyo3::types::PyDict::new(py);
        m.set_item("tokens", tokens)?;
        m.set_item("compressed_bytes", compressed)?;
        m.set_item("fp16_bytes", fp16)?;
        m.set_item("bytes_per_token", self.heads_kv * per_head)?;
        m.set_item(
            "compression_ratio",
            if compressed == 0 {
                0.0
            } else {
                fp16 as f64 / compressed as f64
            },
        )?;
        Ok(m)
    }
}

fn no_workspace() -> BoundaryError {
    BoundaryError::Unsupported(
        "TurboQuantCache on CUDA takes workspace= (the Python wrapper allocates it)".into(),
    )
}

/// An output the caller passed: on the call's device, of the right shape and dtype.
fn host_or_device_output(
    v: &View<'_>,
    shape: &[usize],
    dtype: DType,
    device: Device,
) -> Result<()> {
    match device {
        Device::Cpu => host::check_output(v, shape, dtype),
        // the device path checks shape, dtype, contiguity and alignment before its launch
        Device::Cuda(_) => Ok(()),
    }
}
