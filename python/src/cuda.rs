//! CUDA tensors through the Rust crate's device path (`ferrattn::device_api`): DLPack device
//! pointers become [`TensorView`]s, the caller's stream a [`Stream`], and Lean decode runs on
//! them without a copy, an allocation or a host synchronisation (FlashInfer's plan/run split).
//!
//! The device path covers LeanAttention decode (contiguous or paged NHD K/V, f16/bf16). Other
//! algorithms on CUDA tensors are refused with the support matrix rather than staged through
//! host memory.

use crate::dlpack::{Device, Elem, View};
use crate::error::{BoundaryError, Result};
use ferrattn::device_api::{
    DecodePlan, DecodeShape, DecodeStep, DecodeViews, KvCache, LeanDecoder, LeanSchedule, Stream,
    TensorView, Workspace,
};
use ferrattn_core::DType;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Per-device objects opened at first use and kept for the process: the entry of `ordinal` in
/// `devices`, made by `open` the first time.
pub fn per_device<T>(
    devices: &'static OnceLock<Mutex<HashMap<usize, Arc<T>>>>,
    ordinal: usize,
    open: impl FnOnce(usize) -> Result<T>,
) -> Result<Arc<T>> {
    let mut map = devices
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Arc::new(open(ordinal)?);
    map.insert(ordinal, d.clone());
    Ok(d)
}

/// One decoder per device, opened at first use and kept for the process (its kernels are
/// resolved once per instance and cached inside).
pub fn decoder(ordinal: usize) -> Result<Arc<LeanDecoder>> {
    static DECODERS: OnceLock<Mutex<HashMap<usize, Arc<LeanDecoder>>>> = OnceLock::new();
    per_device(&DECODERS, ordinal, |o| Ok(LeanDecoder::new(o)?))
}

pub fn ordinal(v: &View<'_>) -> Result<usize> {
    match v.device {
        Device::Cuda(i) if i >= 0 => Ok(i as usize),
        other => Err(BoundaryError::Device {
            name: v.name,
            message: format!("is on {other}; this path reads CUDA memory"),
        }),
    }
}

/// A device-path view of `v` with the given (logical) shape and element strides. DLPack carries
/// no buffer length, so the declared length is what the shape and strides reach.
pub fn view<'a>(v: &View<'_>, shape: &[usize], strides: &[usize]) -> Result<TensorView<'a>> {
    let ordinal = ordinal(v)?;
    let dtype = match v.elem {
        Elem::Float(d) => d,
        other @ (Elem::I32 | Elem::U8) => {
            return Err(BoundaryError::DType {
                name: v.name,
                got: other.to_string(),
                expected: "float16, bfloat16 or float32".into(),
            })
        }
    };
    let reach = if shape.contains(&0) {
        0
    } else {
        (shape
            .iter()
            .zip(strides)
            .map(|(&n, &s)| (n - 1) * s)
            .sum::<usize>()
            + 1)
            * dtype.size_bytes()
    };
    // SAFETY: the DLPack producer guarantees that every element inside shape/strides of this
    // CUDA device's memory is addressable, and the capsule (held by `v` for the whole call, and
    // by the caller's framework tensor beyond it) keeps it allocated; the device path checks
    // everything else (dtype, device, contiguity, alignment) before any launch.
    Ok(unsafe { TensorView::cuda(v.ptr as u64, reach, ordinal, dtype, shape, strides) }?)
}

/// The view as it is.
pub fn whole<'a>(v: &View<'_>) -> Result<TensorView<'a>> {
    view(v, &v.shape, &v.strides)
}

/// The caller's stream (`None`: the legacy default stream).
pub fn stream(handle: Option<usize>) -> Stream {
    match handle {
        // SAFETY: the handle is the framework's current stream (or one the caller named) of the
        // device the tensors live on; the framework keeps it alive while work runs on it.
        Some(h) => unsafe { Stream::from_raw(h as *mut std::ffi::c_void) },
        None => Stream::LEGACY_DEFAULT,
    }
}

/// A planned decode step whose tables are in the caller's workspace.
///
/// `DecodeStep` borrows its `DecodePlan` and (mutably) its `Workspace`; all three live here, the
/// plan and the workspace boxed so their addresses never move, and the step is declared first
/// so it is dropped before what it borrows.
pub struct DeviceStep {
    step: Option<DecodeStep<'static, 'static>>,
    plan: Box<DecodePlan>,
    workspace: Option<Box<Workspace>>,
    decoder: Arc<LeanDecoder>,
    pub ordinal: usize,
}

impl DeviceStep {
    /// Plans a step (pure host work; checks the lengths and the page table against the pool).
    pub fn plan(
        ordinal: usize,
        shape: DecodeShape,
        seqlens_k: &[usize],
        kv: KvCache<'_>,
    ) -> Result<DeviceStep> {
        let decoder = decoder(ordinal)?;
        let plan = DecodePlan::new(
            &shape,
            &decoder.caps()?,
            seqlens_k,
            kv,
            0,
            LeanSchedule::StreamK,
        )?;
        Ok(DeviceStep {
            step: None,
            plan: Box::new(plan),
            workspace: None,
            decoder,
            ordinal,
        })
    }

    pub fn workspace_bytes(&self) -> usize {
        self.plan.workspace_bytes()
    }

    /// Copies the step's tables into the workspace on `stream` (once per step, outside any graph
    /// capture).
    pub fn begin(&mut self, workspace: &View<'_>, stream: Stream) -> Result<()> {
        let ordinal = ordinal(workspace)?;
        let bytes = workspace.numel() * workspace.elem.size_bytes();
        if workspace.strides.last().is_some_and(|&s| s != 1) && workspace.numel() > 1 {
            return Err(BoundaryError::Layout {
                name: workspace.name,
                message: format!(
                    "has strides {:?}; the workspace must be one contiguous buffer",
                    workspace.strides
                ),
            });
        }
        // SAFETY: `bytes` bytes of device `ordinal` memory (a contiguous framework tensor that the
        // Python wrapper keeps referenced for the life of this step); size, device and alignment
        // are checked by begin_step.
        let ws = unsafe { Workspace::cuda(workspace.ptr as u64, bytes, ordinal) };
        self.step = None;
        let ws: &mut Workspace = self.workspace.insert(Box::new(ws));
        // SAFETY: the step borrows `*self.plan` and `*self.workspace`, boxes owned by `self` whose
        // contents never move; neither is touched while a step exists (`begin` drops the old step
        // before replacing the workspace, and the plan is never replaced), and the field order
        // drops the step before both.
        let (plan, ws): (&'static DecodePlan, &'static mut Workspace) = unsafe {
            (
                &*(self.plan.as_ref() as *const DecodePlan),
                &mut *(ws as *mut Workspace),
            )
        };
        self.step = Some(self.decoder.begin_step(plan, ws, stream)?);
        Ok(())
    }

    /// One layer: checks the views against the plan and launches on `stream`.
    pub fn run(&self, x: &DecodeViews<'_, '_>, stream: Stream) -> Result<()> {
        let step = self.step.as_ref().ok_or_else(|| {
            BoundaryError::Unsupported(
                "the decode step has no workspace yet (plan() gives it one)".into(),
            )
        })?;
        Ok(step.run(x, stream)?)
    }
}

/// The dtype the device path runs for a view (f16/bf16; f32 has no kernel).
pub fn kernel_dtype(v: &View<'_>) -> Result<DType> {
    match v.elem {
        Elem::Float(d @ (DType::F16 | DType::BF16)) => Ok(d),
        other => Err(BoundaryError::DType {
            name: v.name,
            got: other.to_string(),
            expected: "f16 or bf16 (the CUDA kernels' types; f32 runs on the cpu)".into(),
        }),
    }
}
