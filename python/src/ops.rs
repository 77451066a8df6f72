//! The three entry points behind the Python API: `attention`, the paged decode plan/run, and
//! the TurboAttention cache. Each parses its DLPack arguments into checked [`View`]s, checks that
//! they share one device, then runs on that device.
//!
//! Host tensors run the CPU emulations through the facade (`ferrattn::Runtime`), which compute in
//! `f32`: the inputs are widened exactly from f16/bf16 and the outputs rounded back.

use crate::cuda::{self, DeviceStep};
use crate::dlpack::{same_device, Device, Exported, View};
use crate::error::{BoundaryError, Result};
use crate::host;
use crate::turbo_cuda::DeviceTurbo;
use ferrattn::device_api::{DecodeShape, DecodeViews, KvCache};
use ferrattn::{Algorithm, BackendChoice, BackendKind, Runtime};
use ferrattn_core::turbo::{self, KvBits, TurboConfig, TurboKvCache};
use ferrattn_core::{AttentionInputs, AttentionOptions, AttentionOutput, DType, Tensor};
use pyo3::prelude::*;

/// Outputs of a call: each either written into the caller's tensor (`None`) or a new host tensor.
pub(crate) type Outputs = (Option<Exported>, Option<Exported>);

fn algorithm(name: &str) -> Result<Algorithm> {
    match Algorithm::parse(name) {
        Some(Algorithm::Amla) | None => Err(BoundaryError::Unsupported(format!(
            "algo={name:?}; expected one of \"exact\", \"lean\", \"turbo\", \"turboquant\""
        ))),
        Some(a) => Ok(a),
    }
}

fn cuda_unsupported(what: &str) -> BoundaryError {
    BoundaryError::Unsupported(format!(
        "{what} on CUDA tensors: the device path runs LeanAttention decode (ferrattn.attention \
         with algo=\"lean\", BatchDecodeWithPagedKVCacheWrapper), the TurboAttention cache \
         (ferrattn.TurboCache) and the TurboQuant cache (ferrattn.TurboQuantCache); other \
         algorithms run on host tensors"
    ))
}

fn cpu_runtime(algo: Algorithm) -> Result<Runtime> {
    Ok(Runtime::select(BackendChoice::Exactly(BackendKind::Cpu), algo)?.runtime)
}

/// Threads the CPU backend plans for (its `DeviceCaps::compute_units`, rayon's pool size): the
/// CPU schedules (Lean's CTA count, the exact block split) depend on it, so a result compared bit
/// for bit with another process needs the same count there (`RAYON_NUM_THREADS`).
#[pyfunction]
pub fn cpu_threads() -> PyResult<usize> {
    let rt = cpu_runtime(Algorithm::Exact)?;
    Ok(rt.caps().map_err(BoundaryError::from)?.compute_units)
}

/// Writes `t` into the caller's `out` view when given, else hands it back as a new host tensor.
pub(crate) fn deliver(out: Option<&View<'_>>, t: &Tensor) -> Result<Option<Exported>> {
    match out {
        Some(v) => {
            host::write(v, t)?;
            Ok(None)
        }
        None => Ok(Some(Exported::from_bytes(
            &t.shape,
            crate::dlpack::Elem::Float(t.dtype),
            host::to_bytes(t),
        ))),
    }
}

pub(crate) fn parse_opt<'py>(
    name: &'static str,
    x: Option<&Bound<'py, PyAny>>,
) -> Result<Option<View<'py>>> {
    x.map(|c| View::parse(name, c)).transpose()
}

/// Expected output shapes `[B, Sq, Hq, Dv]` and `[B, Hq, Sq]` from q and v (rank checked).
fn output_shapes(q: &View<'_>, v: &View<'_>) -> Result<([usize; 4], [usize; 3])> {
    q.expect_rank(4, "[batch, seq_q, heads_q, head_dim]")?;
    v.expect_rank(4, "[batch, seq_k, heads_kv, head_dim_v]")?;
    let (b, sq, hq) = (q.shape[0], q.shape[1], q.shape[2]);
    Ok(([b, sq, hq, v.shape[3]], [b, hq, sq]))
}

fn check_outputs(
    out: Option<&View<'_>>,
    lse: Option<&View<'_>>,
    o_shape: &[usize],
    lse_shape: &[usize],
    dtype: DType,
) -> Result<()> {
    if let Some(o) = out {
        host::check_output(o, o_shape, dtype)?;
    }
    if let Some(l) = lse {
        host::check_output(l, lse_shape, DType::F32)?;
    }
    Ok(())
}

/// `ferrattn.attention`: `q [B, Sq, Hq, D]`, `k [B, Sk, Hk, D]`, `v [B, Sk, Hk, Dv]`.
#[pyfunction]
#[pyo3(signature = (q, k, v, algo, causal, softmax_scale, out=None, lse=None, want_lse=true, stream=None))]
#[allow(clippy::too_many_arguments)] // the Python signature, one argument per keyword
pub fn attention<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    algo: &str,
    causal: bool,
    softmax_scale: Option<f32>,
    out: Option<&Bound<'py, PyAny>>,
    lse: Option<&Bound<'py, PyAny>>,
    want_lse: bool,
    stream: Option<usize>,
) -> PyResult<Outputs> {
    // host tensors only reach the end of this function (CUDA ones are refused below or run
    // through DeviceDecode): there is no stream to order against
    let _ = stream;
    let algo = algorithm(algo)?;
    let (q, k, v) = (
        View::parse("q", q)?,
        View::parse("k", k)?,
        View::parse("v", v)?,
    );
    let (out, lse) = (parse_opt("out", out)?, parse_opt("lse", lse)?);
    let mut all = vec![&q, &k, &v];
    all.extend(out.iter());
    all.extend(lse.iter());
    let device = same_device(&all)?;
    let (o_shape, lse_shape) = output_shapes(&q, &v)?;
    let dtype = q.float_dtype()?;
    check_outputs(out.as_ref(), lse.as_ref(), &o_shape, &lse_shape, dtype)?;
    if let Device::Cuda(_) = device {
        return Err(cuda_unsupported(&format!("attention with algo={:?}", algo.name())).into());
    }
    let x = AttentionInputs::new(host::read(&q)?, host::read(&k)?, host::read(&v)?);
    let opts = AttentionOptions {
        causal,
        softmax_scale,
    };
    let result: Result<AttentionOutput> = py.detach(|| {
        let problem = x.problem(opts, None)?;
        let rt = cpu_runtime(algo)?;
        let plan = rt.plan(algo, &problem)?;
        Ok(rt.run(&plan, &x)?)
    });
    let r = result?;
    let o = deliver(out.as_ref(), &r.o)?;
    let l = if want_lse || lse.is_some() {
        deliver(lse.as_ref(), &r.lse)?
    } else {
        None
    };
    Ok((o, l))
}

/// One decode step's page layout, planned once and run for every layer (FlashInfer's
/// `BatchDecodeWithPagedKVCacheWrapper.plan`): the page table `[batch, max_pages]`, each
/// sequence's length, the head layout and the scale, all checked here so `run` only has to
/// check the tensors of the layer.
#[pyclass(module = "ferrattn._ferrattn")]
pub struct PagedDecodePlan {
    page_table: Vec<i32>,
    max_pages: usize,
    seq_lens: Vec<usize>,
    page_size: usize,
    heads_q: usize,
    heads_kv: usize,
    head_dim: usize,
    softmax_scale: f32,
    algo: Algorithm,
    /// Largest page index the table uses and where: `run` checks it against the pool.
    max_page: Option<(i32, usize, usize)>,
    /// The device step when the step runs on CUDA (`device=` given at plan time).
    device: Option<DeviceStep>,
}

#[pymethods]
impl PagedDecodePlan {
    /// Checks and records one step's pages. `page_table` and `seq_lens` are host `int32` tensors.
    #[new]
    ///
    /// With `cuda_device` the step runs on that GPU: `num_pages` and `dtype` (`"f16"`, `"bf16"`)
    /// are then required, the page table is checked against the pool now, and [`Self::begin`]
    /// must hand the step its workspace before `run`.
    #[pyo3(signature = (page_table, seq_lens, page_size, heads_q, heads_kv, head_dim, softmax_scale, algo="lean", num_pages=None, cuda_device=None, dtype=None))]
    #[allow(clippy::too_many_arguments)] // FlashInfer's plan() arguments
    fn new(
        page_table: &Bound<'_, PyAny>,
        seq_lens: &Bound<'_, PyAny>,
        page_size: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        softmax_scale: Option<f32>,
        algo: &str,
        num_pages: Option<usize>,
        cuda_device: Option<usize>,
        dtype: Option<&str>,
    ) -> PyResult<PagedDecodePlan> {
        let algo = match algorithm(algo)? {
            a @ (Algorithm::Lean | Algorithm::Exact) => a,
            other => {
                return Err(BoundaryError::Unsupported(format!(
                    "paged decode with algo={:?}; the paged cache is read by \"lean\" (and \
                     \"exact\" on the cpu); TurboAttention keeps its own compressed cache \
                     (ferrattn.TurboCache)",
                    other.name()
                ))
                .into())
            }
        };
        if page_size == 0 {
            return Err(
                BoundaryError::PageTable("page_size is 0; it must be positive".into()).into(),
            );
        }
        if heads_kv == 0 || heads_q == 0 || !heads_q.is_multiple_of(heads_kv) {
            return Err(BoundaryError::Library(
                ferrattn_core::CoreError::HeadRatio { heads_q, heads_kv }.into(),
            )
            .into());
        }
        let (pt, sl) = (
            View::parse("page_table", page_table)?,
            View::parse("seq_lens", seq_lens)?,
        );
        pt.expect_rank(2, "[batch, max_pages_per_sequence]")?;
        sl.expect_rank(1, "[batch]")?;
        if sl.shape[0] != pt.shape[0] {
            return Err(BoundaryError::Shape {
                name: "seq_lens",
                message: format!(
                    "has {} entries but page_table has {} rows; one length per sequence",
                    sl.shape[0], pt.shape[0]
                ),
            }
            .into());
        }
        let (batch, max_pages) = (pt.shape[0], pt.shape[1]);
        let table = host::read_i32(&pt)?;
        let lens = host::read_i32(&sl)?;
        let mut seq_lens = Vec::with_capacity(batch);
        let mut max_page: Option<(i32, usize, usize)> = None;
        for (b, &len) in lens.iter().enumerate() {
            if len < 1 {
                return Err(BoundaryError::PageTable(format!(
                    "seq_lens[{b}] is {len}; a decode step needs at least one key"
                ))
                .into());
            }
            let len = len as usize;
            let need = len.div_ceil(page_size);
            if need > max_pages {
                return Err(BoundaryError::PageTable(format!(
                    "sequence {b} has {len} tokens but page_table gives it {max_pages} pages of \
                     {page_size} ({} tokens); it needs {need} pages",
                    max_pages * page_size
                ))
                .into());
            }
            for j in 0..need {
                let p = table[b * max_pages + j];
                let out_of_pool = num_pages.is_some_and(|n| p as i64 >= n as i64);
                if p < 0 || out_of_pool {
                    return Err(BoundaryError::PageTable(format!(
                        "page_table[{b}][{j}] is {p}; page indices must be in 0..{}",
                        num_pages.map_or("the pool size".to_string(), |n| n.to_string())
                    ))
                    .into());
                }
                if max_page.is_none_or(|(m, _, _)| p > m) {
                    max_page = Some((p, b, j));
                }
            }
            seq_lens.push(len);
        }
        let softmax_scale = softmax_scale.unwrap_or(1.0 / (head_dim.max(1) as f32).sqrt());
        let device = match cuda_device {
            None => None,
            Some(ordinal) => {
                if algo != Algorithm::Lean {
                    return Err(cuda_unsupported(&format!(
                        "paged decode with algo={:?}",
                        algo.name()
                    ))
                    .into());
                }
                let num_pages = num_pages.ok_or_else(|| {
                    BoundaryError::PageTable(
                        "num_pages is required on CUDA: the plan checks the page table against \
                         the pool before anything launches"
                            .into(),
                    )
                })?;
                let dtype = match dtype.and_then(DType::parse) {
                    Some(d) => d,
                    None => {
                        return Err(BoundaryError::DType {
                            name: "dtype",
                            got: format!("{dtype:?}"),
                            expected: "\"f16\" or \"bf16\" (q_data_type)".into(),
                        }
                        .into())
                    }
                };
                let shape = DecodeShape {
                    batch,
                    query_len: 1,
                    heads_q,
                    heads_kv,
                    head_dim,
                    dtype,
                    causal: false,
                    softmax_scale: Some(softmax_scale),
                };
                let kv = KvCache::Paged {
                    page_size,
                    num_pages,
                    max_pages,
                    page_table: &table,
                };
                Some(DeviceStep::plan(ordinal, shape, &seq_lens, kv)?)
            }
        };
        Ok(PagedDecodePlan {
            page_table: table,
            max_pages,
            seq_lens,
            page_size,
            heads_q,
            heads_kv,
            head_dim,
            softmax_scale,
            algo,
            max_page,
            device,
        })
    }

    /// Workspace bytes the CUDA step needs (0 on the host).
    #[getter]
    fn workspace_bytes(&self) -> usize {
        self.device.as_ref().map_or(0, DeviceStep::workspace_bytes)
    }

    /// Copies the CUDA step's tables into `workspace` (a contiguous device buffer of at least
    /// `workspace_bytes`) on `stream`; once per step, outside any CUDA graph capture.
    #[pyo3(signature = (workspace, stream=None))]
    fn begin(&mut self, workspace: &Bound<'_, PyAny>, stream: Option<usize>) -> PyResult<()> {
        let ws = View::parse("workspace", workspace)?;
        let dev = self.device.as_mut().ok_or_else(|| {
            BoundaryError::Unsupported("begin() is for plans made with cuda_device".into())
        })?;
        dev.begin(&ws, cuda::stream(stream))?;
        Ok(())
    }

    /// Sequences in the step.
    #[getter]
    fn batch(&self) -> usize {
        self.seq_lens.len()
    }

    /// Benchmark hook: `iters` back-to-back Rust launches of one layer (views built and
    /// checked, then `DecodeStep::run`, as a Rust engine calls it per layer), returning the
    /// wall-clock nanoseconds per call; the tensors are checked once by a plain `run` first.
    /// What the Python path adds on top of this is its per-call overhead.
    #[pyo3(signature = (q, k_cache, v_cache, out, lse, stream, iters))]
    #[allow(clippy::too_many_arguments)] // mirrors run()
    fn rust_launch_ns(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        k_cache: &Bound<'_, PyAny>,
        v_cache: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        lse: &Bound<'_, PyAny>,
        stream: Option<usize>,
        iters: usize,
    ) -> PyResult<f64> {
        self.run(py, q, k_cache, v_cache, Some(out), Some(lse), stream)?;
        let dev = self
            .device
            .as_ref()
            .ok_or_else(|| BoundaryError::Unsupported("rust_launch_ns times CUDA steps".into()))?;
        let views = (
            View::parse("q", q)?,
            View::parse("k_cache", k_cache)?,
            View::parse("v_cache", v_cache)?,
            View::parse("out", out)?,
            View::parse("lse", lse)?,
        );
        let t0 = std::time::Instant::now();
        for _ in 0..iters {
            Self::run_device(
                dev,
                (&views.0, &views.1, &views.2, &views.3, &views.4),
                stream,
            )?;
        }
        Ok(t0.elapsed().as_nanos() as f64 / iters.max(1) as f64)
    }

    /// One layer: `q [B, Hq, D]`, `k_cache`/`v_cache` `[num_pages, page_size, Hk, D]` (NHD).
    /// O is `[B, Hq, D]` in q's dtype, LSE `f32 [B, Hq]` (natural log).
    #[pyo3(signature = (q, k_cache, v_cache, out=None, lse=None, stream=None))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn run<'py>(
        &self,
        py: Python<'py>,
        q: &Bound<'py, PyAny>,
        k_cache: &Bound<'py, PyAny>,
        v_cache: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        lse: Option<&Bound<'py, PyAny>>,
        stream: Option<usize>,
    ) -> PyResult<Outputs> {
        let (q, kc, vc) = (
            View::parse("q", q)?,
            View::parse("k_cache", k_cache)?,
            View::parse("v_cache", v_cache)?,
        );
        let (out, lse) = (parse_opt("out", out)?, parse_opt("lse", lse)?);
        let mut all = vec![&q, &kc, &vc];
        all.extend(out.iter());
        all.extend(lse.iter());
        let device = same_device(&all)?;
        let b = self.seq_lens.len();
        let (hq, hk, d) = (self.heads_q, self.heads_kv, self.head_dim);
        q.expect_rank(3, "[batch, heads_q, head_dim]")?;
        if q.shape != [b, hq, d] {
            return Err(BoundaryError::Shape {
                name: "q",
                message: format!(
                    "has shape {:?} but the plan is for [{b}, {hq}, {d}] (batch, heads_q, head_dim)",
                    q.shape
                ),
            }
            .into());
        }
        let dtype = q.float_dtype()?;
        for c in [&kc, &vc] {
            c.expect_rank(4, "[num_pages, page_size, heads_kv, head_dim] (NHD)")?;
            if c.shape[1..] != [self.page_size, hk, d] {
                return Err(BoundaryError::Shape {
                    name: c.name,
                    message: format!(
                        "has shape {:?} but the plan is for [num_pages, {}, {hk}, {d}] \
                         (page_size, heads_kv, head_dim)",
                        c.shape, self.page_size
                    ),
                }
                .into());
            }
            if c.elem != q.elem {
                return Err(BoundaryError::DType {
                    name: c.name,
                    got: c.elem.to_string(),
                    expected: format!("{dtype}, the dtype of q"),
                }
                .into());
            }
        }
        if vc.shape[0] != kc.shape[0] {
            return Err(BoundaryError::Shape {
                name: "v_cache",
                message: format!(
                    "holds {} pages but k_cache holds {}",
                    vc.shape[0], kc.shape[0]
                ),
            }
            .into());
        }
        if let Some((p, sb, sj)) = self.max_page {
            if p as usize >= kc.shape[0] {
                return Err(BoundaryError::PageTable(format!(
                    "page_table[{sb}][{sj}] is {p} but the pool (k_cache) holds {} pages",
                    kc.shape[0]
                ))
                .into());
            }
        }
        if let Some(dev) = &self.device {
            if device != Device::Cuda(dev.ordinal as i32) {
                return Err(BoundaryError::Device {
                    name: "q",
                    message: format!(
                        "is on {device} but the step was planned for cuda:{}",
                        dev.ordinal
                    ),
                }
                .into());
            }
            let (Some(o), Some(l)) = (out.as_ref(), lse.as_ref()) else {
                return Err(BoundaryError::Unsupported(
                    "on CUDA run() writes into out= and lse= (the Python wrapper allocates them)"
                        .into(),
                )
                .into());
            };
            check_outputs(Some(o), Some(l), &[b, hq, d], &[b, hq], dtype)?;
            // the plan's layout is [B, 1, Hq, D] and [B, Hq, 1]: an axis of extent 1 takes any
            // stride
            let qv = cuda::view(
                &q,
                &[b, 1, hq, d],
                &[q.strides[0], 0, q.strides[1], q.strides[2]],
            )?;
            let ov = cuda::view(
                o,
                &[b, 1, hq, d],
                &[o.strides[0], 0, o.strides[1], o.strides[2]],
            )?;
            let lv = cuda::view(l, &[b, hq, 1], &[l.strides[0], l.strides[1], 0])?;
            let (kv, vv) = (cuda::whole(&kc)?, cuda::whole(&vc)?);
            let views = DecodeViews {
                q: &qv,
                k: &kv,
                v: &vv,
                o: &ov,
                lse: &lv,
            };
            dev.run(&views, cuda::stream(stream))?;
            return Ok((None, None));
        }
        check_outputs(out.as_ref(), lse.as_ref(), &[b, hq, d], &[b, hq], dtype)?;
        if let Device::Cuda(_) = device {
            return Err(BoundaryError::Unsupported(
                "CUDA tensors given to a step planned for the host: plan with the device".into(),
            )
            .into());
        }
        let (kt, vt) = (host::read(&kc)?, host::read(&vc)?);
        let qt = host::read(&q)?;
        let x = self.gather(&qt, &kt, &vt);
        let (algo, scale) = (self.algo, self.softmax_scale);
        let result: Result<AttentionOutput> = py.detach(|| {
            let problem = x.problem(
                AttentionOptions {
                    causal: false,
                    softmax_scale: Some(scale),
                },
                None,
            )?;
            let rt = cpu_runtime(algo)?;
            let plan = rt.plan(algo, &problem)?;
            Ok(rt.run(&plan, &x)?)
        });
        let r = result?;
        // the core returns [B, 1, Hq, D] and [B, Hq, 1]; the decode API drops the query axis
        let o = Tensor {
            shape: vec![b, hq, d],
            ..r.o
        };
        let l = Tensor {
            shape: vec![b, hq],
            ..r.lse
        };
        Ok((deliver(out.as_ref(), &o)?, deliver(lse.as_ref(), &l)?))
    }
}

impl PagedDecodePlan {
    /// The CUDA run of one layer: the views as the plan lays them out, and the launch.
    fn run_device(
        dev: &DeviceStep,
        (q, kc, vc, o, l): (&View<'_>, &View<'_>, &View<'_>, &View<'_>, &View<'_>),
        stream: Option<usize>,
    ) -> Result<()> {
        let (b, hq, d) = (q.shape[0], q.shape[1], q.shape[2]);
        // the plan's layout is [B, 1, Hq, D] and [B, Hq, 1]: an axis of extent 1 takes any stride
        let qv = cuda::view(
            q,
            &[b, 1, hq, d],
            &[q.strides[0], 0, q.strides[1], q.strides[2]],
        )?;
        let ov = cuda::view(
            o,
            &[b, 1, hq, d],
            &[o.strides[0], 0, o.strides[1], o.strides[2]],
        )?;
        let lv = cuda::view(l, &[b, hq, 1], &[l.strides[0], l.strides[1], 0])?;
        let (kv, vv) = (cuda::whole(kc)?, cuda::whole(vc)?);
        let views = DecodeViews {
            q: &qv,
            k: &kv,
            v: &vv,
            o: &ov,
            lse: &lv,
        };
        dev.run(&views, cuda::stream(stream))
    }

    /// The CPU reads the pages through the table into padded `[B, max_len, Hk, D]` K and V.
    fn gather(&self, q: &Tensor, kc: &Tensor, vc: &Tensor) -> AttentionInputs {
        let (b, hk, d, ps) = (
            self.seq_lens.len(),
            self.heads_kv,
            self.head_dim,
            self.page_size,
        );
        let max_len = self.seq_lens.iter().copied().max().unwrap_or(1);
        let row = hk * d;
        let mut k = Tensor::zeros(&[b, max_len, hk, d], kc.dtype);
        let mut v = Tensor::zeros(&[b, max_len, hk, d], vc.dtype);
        for (s, &len) in self.seq_lens.iter().enumerate() {
            for t in 0..len {
                let page = self.page_table[s * self.max_pages + t / ps] as usize;
                let src = (page * ps + t % ps) * row;
                let dst = (s * max_len + t) * row;
                k.data[dst..dst + row].copy_from_slice(&kc.data[src..src + row]);
                v.data[dst..dst + row].copy_from_slice(&vc.data[src..src + row]);
            }
        }
        let q = Tensor {
            shape: vec![b, 1, self.heads_q, d],
            ..q.clone()
        };
        AttentionInputs {
            seqlens_k: Some(self.seq_lens.iter().map(|&l| l as i64).collect()),
            ..AttentionInputs::new(q, k, v)
        }
    }
}

/// LeanAttention decode of contiguous `q [B, Sq, Hq, D]` over `k`, `v` `[B, Sk, Hk, D]` on CUDA
/// (what `ferrattn.attention(..., algo="lean")` runs for CUDA tensors): plan, give the
/// workspace with `begin`, then `run`.
#[pyclass(module = "ferrattn._ferrattn")]
pub struct DeviceDecode {
    step: DeviceStep,
}

#[pymethods]
impl DeviceDecode {
    #[new]
    #[pyo3(signature = (q, k, v, causal=false, softmax_scale=None))]
    fn new(
        q: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        causal: bool,
        softmax_scale: Option<f32>,
    ) -> PyResult<DeviceDecode> {
        let (q, k, v) = (
            View::parse("q", q)?,
            View::parse("k", k)?,
            View::parse("v", v)?,
        );
        let Device::Cuda(_) = same_device(&[&q, &k, &v])? else {
            return Err(BoundaryError::Unsupported("DeviceDecode runs CUDA tensors".into()).into());
        };
        output_shapes(&q, &v)?;
        k.expect_rank(4, "[batch, seq_k, heads_kv, head_dim]")?;
        let dtype = cuda::kernel_dtype(&q)?;
        let (b, sq, hq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let (sk, hk) = (k.shape[1], k.shape[2]);
        if hk == 0 || !hq.is_multiple_of(hk) {
            return Err(BoundaryError::from(ferrattn_core::CoreError::HeadRatio {
                heads_q: hq,
                heads_kv: hk,
            })
            .into());
        }
        let shape = DecodeShape {
            batch: b,
            query_len: sq,
            heads_q: hq,
            heads_kv: hk,
            head_dim: d,
            dtype,
            causal,
            softmax_scale,
        };
        let lens = vec![sk; b];
        let step = DeviceStep::plan(
            cuda::ordinal(&q)?,
            shape,
            &lens,
            KvCache::Contiguous { max_seqlen_k: sk },
        )?;
        Ok(DeviceDecode { step })
    }

    #[getter]
    fn workspace_bytes(&self) -> usize {
        self.step.workspace_bytes()
    }

    #[pyo3(signature = (workspace, stream=None))]
    fn begin(&mut self, workspace: &Bound<'_, PyAny>, stream: Option<usize>) -> PyResult<()> {
        let ws = View::parse("workspace", workspace)?;
        self.step.begin(&ws, cuda::stream(stream))?;
        Ok(())
    }

    /// Launches on `stream`, writing `out [B, Sq, Hq, D]` and `lse f32 [B, Hq, Sq]`.
    #[pyo3(signature = (q, k, v, out, lse, stream=None))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn run(
        &self,
        q: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        lse: &Bound<'_, PyAny>,
        stream: Option<usize>,
    ) -> PyResult<()> {
        let views = [
            View::parse("q", q)?,
            View::parse("k", k)?,
            View::parse("v", v)?,
            View::parse("out", out)?,
            View::parse("lse", lse)?,
        ];
        let device = same_device(&views.iter().collect::<Vec<_>>())?;
        if device != Device::Cuda(self.step.ordinal as i32) {
            return Err(BoundaryError::Device {
                name: "q",
                message: format!(
                    "is on {device} but the call was planned for cuda:{}",
                    self.step.ordinal
                ),
            }
            .into());
        }
        let t: Vec<_> = views.iter().map(cuda::whole).collect::<Result<_>>()?;
        let x = DecodeViews {
            q: &t[0],
            k: &t[1],
            v: &t[2],
            o: &t[3],
            lse: &t[4],
        };
        self.step.run(&x, cuda::stream(stream))?;
        Ok(())
    }
}

fn kv_bits(name: &str) -> Result<KvBits> {
    Ok(match name {
        "int4" => KvBits::Int4,
        "int2" => KvBits::Int2,
        "mixed" => KvBits::Mixed {
            two_bit_fraction: 0.5,
        },
        other => {
            return Err(BoundaryError::Unsupported(format!(
                "kv_bits={other:?}; expected \"int4\", \"int2\" or \"mixed\" (half the KV heads \
                 at 2 bits, TurboAttention section 3.2)"
            )))
        }
    })
}

/// The TurboAttention compressed KV cache of a batch (INT4/INT2 blocks plus the INT8 buffer of
/// new tokens, section 3.3): `prefill` compresses a prompt, `append` adds a step's tokens,
/// `decode` attends one query token per sequence over everything held.
#[pyclass(module = "ferrattn._ferrattn")]
pub struct TurboCache {
    cfg: TurboConfig,
    batch: usize,
    heads_kv: usize,
    head_dim: usize,
    /// Tokens per sequence a CUDA cache holds (`None`: its prompt plus
    /// [`crate::turbo_cuda::DEFAULT_RESERVE_TOKENS`]).
    max_tokens: Option<usize>,
    /// Decode a CUDA cache on the bit-exact kernels (`ferrattn_cuda::Options::exact_turbo_decode`)
    /// instead of the backend's default (the fast-contract kernels on sm_90). A host cache is the
    /// emulation, exact either way.
    exact_decode: bool,
    /// The cache of the last host prefill.
    cache: Option<TurboKvCache>,
    /// The cache of the last CUDA prefill (one of the two is live).
    device: Option<DeviceTurbo>,
}

/// Which cache a [`TurboCache`] holds now.
enum Held<'a> {
    Host(&'a TurboKvCache),
    Cuda(&'a DeviceTurbo),
}

impl TurboCache {
    fn empty() -> BoundaryError {
        BoundaryError::Unsupported(
            "the TurboCache is empty: call prefill(q, k, v) before append or decode".into(),
        )
    }

    fn filled(&self) -> Result<&TurboKvCache> {
        self.cache.as_ref().ok_or_else(TurboCache::empty)
    }

    fn held(&self) -> Result<Held<'_>> {
        match (&self.cache, &self.device) {
            (Some(c), _) => Ok(Held::Host(c)),
            (None, Some(d)) => Ok(Held::Cuda(d)),
            (None, None) => Err(TurboCache::empty()),
        }
    }

    /// The CUDA cache for a call on CUDA tensors, or why there is none.
    fn on_device(&mut self) -> Result<&mut DeviceTurbo> {
        match (&self.cache, &mut self.device) {
            (None, Some(d)) => Ok(d),
            (Some(_), _) => Err(BoundaryError::Device {
                name: "TurboCache",
                message: "holds a host cache (its last prefill ran on host tensors); append and \
                          decode take tensors on the device of the last prefill"
                    .into(),
            }),
            (None, None) => Err(TurboCache::empty()),
        }
    }

    /// The caller's workspace argument of a CUDA call.
    fn workspace<'py>(ws: Option<&Bound<'py, PyAny>>) -> Result<View<'py>> {
        let ws = ws.ok_or_else(|| {
            BoundaryError::Unsupported(
                "a CUDA call needs workspace= (the Python wrapper allocates it)".into(),
            )
        })?;
        View::parse("workspace", ws)
    }

    fn check_kv(&self, k: &View<'_>, v: &View<'_>, tokens: Option<usize>) -> Result<()> {
        for t in [k, v] {
            t.expect_rank(4, "[batch, seq, heads_kv, head_dim]")?;
            let ok = t.shape[0] == self.batch
                && t.shape[2] == self.heads_kv
                && t.shape[3] == self.head_dim
                && tokens.is_none_or(|n| t.shape[1] == n);
            if !ok {
                return Err(BoundaryError::Shape {
                    name: t.name,
                    message: format!(
                        "has shape {:?} but the cache is for [{}, {}, {}, {}]",
                        t.shape,
                        self.batch,
                        tokens.map_or("seq".to_string(), |n| n.to_string()),
                        self.heads_kv,
                        self.head_dim
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
}

#[pymethods]
impl TurboCache {
    #[new]
    #[pyo3(signature = (batch, heads_kv, head_dim, kv_bits=None, sas=true, max_tokens=None, exact_decode=false))]
    fn new(
        batch: usize,
        heads_kv: usize,
        head_dim: usize,
        kv_bits: Option<&Bound<'_, PyAny>>,
        sas: bool,
        max_tokens: Option<usize>,
        exact_decode: bool,
    ) -> PyResult<TurboCache> {
        // a name ("int4", "int2", "mixed") or one bit width per KV head
        let policy = match kv_bits {
            None => self::kv_bits("mixed")?,
            Some(x) => match x.extract::<String>() {
                Ok(name) => self::kv_bits(&name)?,
                Err(_) => KvBits::PerHead {
                    bits: x.extract::<Vec<u8>>().map_err(|_| {
                        BoundaryError::Unsupported(format!(
                            "kv_bits={x}; expected \"int4\", \"int2\", \"mixed\" or a list of \
                             2 and 4, one per KV head"
                        ))
                    })?,
                },
            },
        };
        if let KvBits::PerHead { bits } = &policy {
            if bits.len() != heads_kv {
                return Err(BoundaryError::Shape {
                    name: "kv_bits",
                    message: format!(
                        "has {} entries ({bits:?}); one per KV head ({heads_kv}) is needed",
                        bits.len()
                    ),
                }
                .into());
            }
        }
        let cfg = TurboConfig {
            kv_bits: policy,
            sas,
            ..TurboConfig::default()
        };
        cfg.validate().map_err(BoundaryError::from)?;
        if batch == 0 || heads_kv == 0 {
            return Err(BoundaryError::Shape {
                name: "TurboCache",
                message: format!(
                    "has batch {batch} and heads_kv {heads_kv}; both must be positive"
                ),
            }
            .into());
        }
        Ok(TurboCache {
            cfg,
            batch,
            heads_kv,
            head_dim,
            max_tokens,
            exact_decode,
            cache: None,
            device: None,
        })
    }

    /// Prefill (Alg. 1) of `q [B, S, Hq, D]` against `k`, `v` `[B, S, Hk, D]`, and the cache of
    /// all of `k`, `v` (full blocks compressed, the tail in the INT8 buffer). Replaces whatever
    /// the cache held.
    #[pyo3(signature = (q, k, v, causal=true, softmax_scale=None, out=None, lse=None, stream=None, workspace=None))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn prefill<'py>(
        &mut self,
        py: Python<'py>,
        q: &Bound<'py, PyAny>,
        k: &Bound<'py, PyAny>,
        v: &Bound<'py, PyAny>,
        causal: bool,
        softmax_scale: Option<f32>,
        out: Option<&Bound<'py, PyAny>>,
        lse: Option<&Bound<'py, PyAny>>,
        stream: Option<usize>,
        workspace: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Outputs> {
        let (q, k, v) = (
            View::parse("q", q)?,
            View::parse("k", k)?,
            View::parse("v", v)?,
        );
        let (out, lse) = (parse_opt("out", out)?, parse_opt("lse", lse)?);
        let mut all = vec![&q, &k, &v];
        all.extend(out.iter());
        all.extend(lse.iter());
        let device = same_device(&all)?;
        self.check_kv(&k, &v, None)?;
        let (o_shape, lse_shape) = output_shapes(&q, &v)?;
        check_outputs(
            out.as_ref(),
            lse.as_ref(),
            &o_shape,
            &lse_shape,
            q.float_dtype()?,
        )?;
        if let Device::Cuda(_) = device {
            crate::turbo_cuda::device_bits(&self.cfg.kv_bits, self.heads_kv)?;
            let (out, lse) = match (&out, &lse) {
                (Some(o), Some(l)) => (o, l),
                _ => {
                    return Err(BoundaryError::Unsupported(
                        "TurboCache.prefill on CUDA writes into out= and lse= (the Python \
                         wrapper allocates them)"
                            .into(),
                    )
                    .into())
                }
            };
            if q.shape[1] != k.shape[1] {
                return Err(BoundaryError::Shape {
                    name: "q",
                    message: format!(
                        "has {} tokens but k has {}; a CUDA prefill attends a prompt to itself",
                        q.shape[1], k.shape[1]
                    ),
                }
                .into());
            }
            let ws = TurboCache::workspace(workspace)?;
            self.cache = None;
            DeviceTurbo::prefill(
                &mut self.device,
                &self.cfg,
                (self.batch, self.heads_kv, self.head_dim),
                self.max_tokens,
                self.exact_decode,
                [&q, &k, &v, out, lse],
                &ws,
                causal,
                softmax_scale,
                cuda::stream(stream),
            )?;
            return Ok((None, None));
        }
        let x = AttentionInputs::new(host::read(&q)?, host::read(&k)?, host::read(&v)?);
        let cfg = self.cfg.clone();
        let opts = AttentionOptions {
            causal,
            softmax_scale,
        };
        let result: Result<(AttentionOutput, TurboKvCache)> = py.detach(|| {
            let p = x.problem(opts, None)?;
            Ok(turbo::prefill(&cfg, &p, &x)?)
        });
        let (r, cache) = result?;
        self.cache = Some(cache);
        self.device = None;
        Ok((deliver(out.as_ref(), &r.o)?, deliver(lse.as_ref(), &r.lse)?))
    }

    /// Appends one token per sequence, `k`, `v` `[B, 1, Hk, D]` (a full INT8 buffer is
    /// compressed into a block).
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
        self.check_kv(&k, &v, Some(1))?;
        if let Device::Cuda(_) = device {
            let ws = TurboCache::workspace(workspace)?;
            let cfg = self.cfg.clone();
            self.on_device()?
                .append(&cfg, &k, &v, &ws, cuda::stream(stream))?;
            return Ok(());
        }
        self.filled()?;
        let (kt, vt) = (host::read(&k)?, host::read(&v)?);
        let cache = self.cache.as_mut().expect("checked by filled()");
        cache.append(&kt, &vt).map_err(BoundaryError::from)?;
        Ok(())
    }

    /// Decode (Alg. 2) of `q [B, 1, Hq, D]` over everything the cache holds. O is
    /// `[B, 1, Hq, D]`, LSE `f32 [B, Hq, 1]`.
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
        check_outputs(
            out.as_ref(),
            lse.as_ref(),
            &[b, 1, hq, self.head_dim],
            &[b, hq, 1],
            q.float_dtype()?,
        )?;
        if let Device::Cuda(_) = device {
            let (out, lse) = match (&out, &lse) {
                (Some(o), Some(l)) => (o, l),
                _ => {
                    return Err(BoundaryError::Unsupported(
                        "TurboCache.decode on CUDA writes into out= and lse= (the Python \
                         wrapper allocates them)"
                            .into(),
                    )
                    .into())
                }
            };
            let ws = TurboCache::workspace(workspace)?;
            let cfg = self.cfg.clone();
            self.on_device()?.decode(
                &cfg,
                &q,
                out,
                lse,
                &ws,
                softmax_scale,
                cuda::stream(stream),
            )?;
            return Ok((None, None));
        }
        let cache = self.filled()?;
        let qt = host::read(&q)?;
        let scale = softmax_scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt());
        let cfg = &self.cfg;
        let r = py
            .detach(|| turbo::decode(cfg, cache, &qt, scale))
            .map_err(BoundaryError::from)?;
        Ok((deliver(out.as_ref(), &r.o)?, deliver(lse.as_ref(), &r.lse)?))
    }

    /// Tokens held for sequence `b`.
    fn seq_len(&self, b: usize) -> PyResult<usize> {
        let lens: Vec<usize> = match self.held()? {
            Held::Host(c) => (0..c.batch()).map(|i| c.len(i)).collect(),
            Held::Cuda(d) => d.lens().to_vec(),
        };
        match lens.get(b) {
            Some(&l) => Ok(l),
            None => Err(BoundaryError::Shape {
                name: "b",
                message: format!("is {b} but the cache holds {} sequences", lens.len()),
            }
            .into()),
        }
    }

    /// Workspace bytes a CUDA call needs: `prefill` of `seqlen` tokens, or the next `append`
    /// / `decode` (`heads_q`: the call's query heads, for `prefill` and `decode`; `like`: a
    /// tensor of the call's dtype).
    #[pyo3(signature = (kind, seqlen=0, heads_q=0, like=None))]
    fn workspace_bytes(
        &self,
        kind: &str,
        seqlen: usize,
        heads_q: usize,
        like: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let heads = (self.batch, self.heads_kv, self.head_dim);
        let step = |append: bool| -> Result<usize> {
            // `like` is the call's k (append) or q (decode): its dtype picks the kernels
            let name = if append { "k" } else { "q" };
            let like = View::parse(name, like.ok_or_else(TurboCache::empty)?)?;
            let d = match self.held()? {
                Held::Cuda(d) => d,
                Held::Host(_) => return Ok(0),
            };
            let hq = if append { self.heads_kv } else { heads_q };
            d.step_workspace_bytes(&self.cfg, hq, &like, append)
        };
        Ok(match kind {
            "prefill" => DeviceTurbo::prefill_workspace_bytes(&self.cfg, heads, heads_q, seqlen)?,
            "append" => step(true)?,
            "decode" => step(false)?,
            other => {
                return Err(BoundaryError::Unsupported(format!(
                    "workspace_bytes({other:?}); expected \"prefill\", \"append\" or \"decode\""
                ))
                .into())
            }
        })
    }

    /// Device bytes allocated for a CUDA cache (its capacity), 0 for a host one.
    fn allocated_bytes(&self) -> PyResult<usize> {
        Ok(match self.held()? {
            Held::Host(_) => 0,
            Held::Cuda(d) => d.allocated_bytes(),
        })
    }

    /// Bits of each KV head's compressed blocks (fixed by the prefill's head priorities).
    #[getter]
    fn bits(&self) -> PyResult<Vec<u32>> {
        let bits = match self.held()? {
            Held::Host(c) => &c.bits[..],
            Held::Cuda(d) => d.bits(),
        };
        Ok(bits.iter().map(|&b| u32::from(b)).collect())
    }

    /// Memory held, counted from the stored buffers: a dict of bytes and ratios.
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let m = match self.held()? {
            Held::Host(c) => c.memory(),
            Held::Cuda(d) => d.memory(),
        };
        let d = pyo3::types::PyDict::new(py);
        d.set_item("tokens", m.tokens)?;
        d.set_item("compressed_bytes", m.compressed_bytes)?;
        d.set_item("buffer_bytes", m.buffer_bytes)?;
        d.set_item("fp16_bytes", m.fp16_bytes)?;
        d.set_item("bytes_per_token", m.bytes_per_token)?;
        d.set_item("compression_ratio", m.compression_ratio)?;
        Ok(d)
    }
}
