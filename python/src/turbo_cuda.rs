//! The TurboAttention cache on CUDA tensors: `ferrattn.TurboCache` holds one
//! [`ferrattn::device_api::TurboCache`] (the compressed cache in device memory it owns) and runs
//! prefill, append and decode through the facade's device path on the caller's stream, with
//! the caller's tensors and a workspace its framework allocated.
//!
//! Each call plans its own step and copies the step's small tables into the workspace on the
//! stream (as `ferrattn.attention` does on CUDA): nothing is synchronised, allocated or copied
//! back, but a call is not one to capture in a CUDA graph (the capturable per-layer launches
//! are `TurboDecodeStep::append` / `decode` of the Rust device path, after one
//! `TurboDevice::begin_decode` per step).

use crate::cuda::{self, ordinal};
use crate::dlpack::View;
use crate::error::{BoundaryError, Result};
use ferrattn::device_api::{
    Location, Stream, TensorView, TurboCache, TurboCacheSpec, TurboDecodePlan, TurboDecodeViews,
    TurboDevice, TurboPrefillPlan, TurboPrefillViews, TurboShape, Workspace,
};
use ferrattn_core::turbo::{CacheMemory, KvBits, TurboConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Tokens per sequence a CUDA cache makes room for beyond its prompt when the caller gave no
/// `max_tokens`: the cache's memory is allocated once, at its first prefill.
pub const DEFAULT_RESERVE_TOKENS: usize = 4096;

/// One TurboAttention device per CUDA device and decode kind, opened at first use and kept for
/// the process (its kernels are resolved once per configuration and cached inside): the
/// backend's default decode (the fast-contract kernels on sm_90), or with `exact` the bit-exact
/// kernels (`ferrattn_cuda::Options::exact_turbo_decode`).
fn device(ordinal: usize, exact: bool) -> Result<Arc<TurboDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<TurboDevice>>>> = OnceLock::new();
    static EXACT: OnceLock<Mutex<HashMap<usize, Arc<TurboDevice>>>> = OnceLock::new();
    if exact {
        crate::cuda::per_device(&EXACT, ordinal, |o| {
            let options = ferrattn_cuda::Options {
                exact_turbo_decode: true,
                ..ferrattn_cuda::Options::default()
            };
            Ok(TurboDevice::with_options(o, options)?)
        })
    } else {
        crate::cuda::per_device(&DEVICES, ordinal, |o| Ok(TurboDevice::new(o)?))
    }
}

/// The per-head bit widths of a cache made on the device. `mixed` picks the 2-bit heads from
/// statistics of the prompt (section 3.2) that this path would have to copy to the host.
pub fn device_bits(policy: &KvBits, heads_kv: usize) -> Result<Vec<u8>> {
    match policy {
        KvBits::Int4 => Ok(vec![4; heads_kv]),
        KvBits::Int2 => Ok(vec![2; heads_kv]),
        KvBits::PerHead { bits } => Ok(bits.clone()),
        KvBits::Mixed { .. } => Err(BoundaryError::Unsupported(
            "kv_bits=\"mixed\" on CUDA tensors: the 2-bit heads are chosen from statistics of \
             the prompt on the host (TurboAttention section 3.2), which the device path never \
             copies there; pass the bits per KV head (a list of 2 and 4, e.g. from a host \
             prefill's TurboCache.bits) or \"int4\" / \"int2\""
                .into(),
        )),
    }
}

/// The caller's workspace tensor as a [`Workspace`] (a contiguous buffer of its framework).
pub fn workspace(v: &View<'_>) -> Result<Workspace> {
    let ordinal = ordinal(v)?;
    if v.strides.last().is_some_and(|&s| s != 1) && v.numel() > 1 {
        return Err(BoundaryError::Layout {
            name: v.name,
            message: format!(
                "has strides {:?}; the workspace must be one contiguous buffer",
                v.strides
            ),
        });
    }
    // SAFETY: `numel * size` bytes of device `ordinal` memory (a contiguous framework tensor
    // the Python wrapper keeps referenced while the call's work runs: it keeps the workspace on
    // the cache object); size, device and alignment are checked by begin_prefill/begin_decode.
    Ok(unsafe { Workspace::cuda(v.ptr as u64, v.numel() * v.elem.size_bytes(), ordinal) })
}

/// A cache in device memory and the device it lives on.
pub struct DeviceTurbo {
    device: Arc<TurboDevice>,
    cache: TurboCache,
}

fn shape(
    cfg_heads: (usize, usize, usize),
    heads_q: usize,
    q: &View<'_>,
    scale: Option<f32>,
) -> Result<TurboShape> {
    let (batch, heads_kv, head_dim) = cfg_heads;
    Ok(TurboShape {
        batch,
        heads_q,
        heads_kv,
        head_dim,
        dtype: cuda::kernel_dtype(q)?,
        softmax_scale: scale,
    })
}

fn whole<'a>(v: &View<'_>) -> Result<TensorView<'a>> {
    cuda::whole(v)
}

impl DeviceTurbo {
    /// The device of the cache.
    pub fn ordinal(&self) -> usize {
        match self.cache.location() {
            Location::Cuda(i) => i,
            Location::Cpu => usize::MAX, // a TurboCache is always made on a CUDA device
        }
    }

    /// Workspace bytes a prefill of `seqlen` tokens per sequence with `heads_q` query heads
    /// needs.
    pub fn prefill_workspace_bytes(
        cfg: &TurboConfig,
        heads: (usize, usize, usize),
        heads_q: usize,
        seqlen: usize,
    ) -> Result<usize> {
        let (batch, heads_kv, head_dim) = heads;
        let s = TurboShape {
            batch,
            heads_q,
            heads_kv,
            head_dim,
            dtype: ferrattn_core::DType::F16,
            softmax_scale: None,
        };
        // the workspace (INT8 tiles of Q, K and V, the length table) depends on batch, the
        // heads, head dim and length only
        Ok(TurboPrefillPlan::new(cfg, &s, &vec![seqlen; batch], seqlen, true)?.workspace_bytes())
    }

    /// Prefill of `q`, `k`, `v` (`[B, S, H, D]`, CUDA) into `out`, `lse` and the cache in
    /// `slot` (made at the first prefill, for `capacity` tokens; emptied before a later one).
    #[allow(clippy::too_many_arguments)] // the tensors of one call and its settings
    pub fn prefill(
        slot: &mut Option<DeviceTurbo>,
        cfg: &TurboConfig,
        heads: (usize, usize, usize),
        capacity: Option<usize>,
        exact_decode: bool,
        t: [&View<'_>; 5],
        ws: &View<'_>,
        causal: bool,
        scale: Option<f32>,
        stream: Stream,
    ) -> Result<()> {
        let [q, k, v, out, lse] = t;
        let ordinal = ordinal(q)?;
        let (batch, heads_kv, head_dim) = heads;
        let seqlen = q.shape[1];
        let s = shape(heads, q.shape[2], q, scale)?;
        let bits = device_bits(&cfg.kv_bits, heads_kv)?;
        let capacity = capacity.unwrap_or(seqlen + DEFAULT_RESERVE_TOKENS);
        let spec = TurboCacheSpec {
            batch,
            heads_kv,
            head_dim,
            bits,
            capacity_tokens: capacity,
        };
        spec.validate()?;
        spec.check_lengths(&vec![seqlen; batch])?;
        let plan = TurboPrefillPlan::new(cfg, &s, &vec![seqlen; batch], seqlen, causal)?;
        let device = device(ordinal, exact_decode)?;
        let reuse = slot.as_ref().is_some_and(|d| {
            Arc::ptr_eq(&d.device, &device)
                && d.ordinal() == ordinal
                && d.cache.bits() == spec.bits.as_slice()
                && d.cache.capacity_tokens() >= spec.capacity()
        });
        if !reuse {
            *slot = None; // the old cache's memory goes before the new one is made
            *slot = Some(DeviceTurbo {
                cache: device.cache(&spec)?,
                device: device.clone(),
            });
        }
        let d = slot.as_mut().expect("made above");
        if d.cache.lens().iter().any(|&l| l > 0) {
            d.device.reset(&mut d.cache, stream)?;
        }
        let mut w = workspace(ws)?;
        let views = [whole(q)?, whole(k)?, whole(v)?, whole(out)?, whole(lse)?];
        let step = d.device.begin_prefill(&plan, &mut w, stream)?;
        let x = TurboPrefillViews {
            q: &views[0],
            k: &views[1],
            v: &views[2],
            o: &views[3],
            lse: &views[4],
        };
        step.run(&x, &mut d.cache, stream)?;
        Ok(())
    }

    fn plan(&self, cfg: &TurboConfig, s: &TurboShape, append: bool) -> Result<TurboDecodePlan> {
        let before = self.cache.lens().to_vec();
        let after: Vec<usize> = before.iter().map(|&l| l + append as usize).collect();
        let schedule = self.device.decode_schedule(s, &after)?;
        Ok(TurboDecodePlan::new(cfg, s, &before, append, schedule)?)
    }

    /// Workspace bytes of the next append (`append`) or decode with `heads_q` query heads.
    pub fn step_workspace_bytes(
        &self,
        cfg: &TurboConfig,
        heads_q: usize,
        like: &View<'_>,
        append: bool,
    ) -> Result<usize> {
        let c = &self.cache;
        let s = shape((c.batch(), c.heads_kv(), c.head_dim()), heads_q, like, None)?;
        Ok(self.plan(cfg, &s, append)?.workspace_bytes())
    }

    /// Appends one token per sequence (`k`, `v` `[B, 1, Hk, D]`, CUDA) on `stream`.
    pub fn append(
        &mut self,
        cfg: &TurboConfig,
        k: &View<'_>,
        v: &View<'_>,
        ws: &View<'_>,
        stream: Stream,
    ) -> Result<()> {
        let c = &self.cache;
        let s = shape(
            (c.batch(), c.heads_kv(), c.head_dim()),
            c.heads_kv(),
            k,
            None,
        )?;
        let plan = self.plan(cfg, &s, true)?;
        let mut w = workspace(ws)?;
        let (kv, vv) = (whole(k)?, whole(v)?);
        let step = self.device.begin_decode(&plan, &mut w, stream)?;
        step.append(&kv, &vv, &mut self.cache, stream)?;
        Ok(())
    }

    /// Decode of `q` (`[B, 1, Hq, D]`, CUDA) over the cache into `out`, `lse` on `stream`.
    #[allow(clippy::too_many_arguments)] // the tensors of one call and its settings
    pub fn decode(
        &self,
        cfg: &TurboConfig,
        q: &View<'_>,
        out: &View<'_>,
        lse: &View<'_>,
        ws: &View<'_>,
        scale: Option<f32>,
        stream: Stream,
    ) -> Result<()> {
        let c = &self.cache;
        let s = shape(
            (c.batch(), c.heads_kv(), c.head_dim()),
            q.shape[2],
            q,
            scale,
        )?;
        let plan = self.plan(cfg, &s, false)?;
        let mut w = workspace(ws)?;
        let views = [whole(q)?, whole(out)?, whole(lse)?];
        let step = self.device.begin_decode(&plan, &mut w, stream)?;
        let x = TurboDecodeViews {
            q: &views[0],
            o: &views[1],
            lse: &views[2],
        };
        step.decode(&x, &self.cache, stream)?;
        Ok(())
    }

    /// Tokens held per sequence.
    pub fn lens(&self) -> &[usize] {
        self.cache.lens()
    }

    /// Per-head bit widths.
    pub fn bits(&self) -> &[u8] {
        self.cache.bits()
    }

    /// Memory the contents take.
    pub fn memory(&self) -> CacheMemory {
        self.cache.memory()
    }

    /// Device memory allocated for the cache.
    pub fn allocated_bytes(&self) -> usize {
        self.cache.allocated_bytes()
    }
}
