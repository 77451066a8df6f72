//! Context-parallel decode from Python: the merge of per-rank partial attention states
//! (`ferrattn_core::cp::merge_partials`, LeanAttention appendix D across ranks). The Python half
//! (`ferrattn.context_parallel`) runs each rank's attention through ferrattn, gathers the
//! partials with the caller's `torch.distributed` process group and merges them here.

use crate::cuda;
use crate::dlpack::{same_device, Device, View};
use crate::error::BoundaryError;
use crate::host;
use crate::ops::{deliver, Outputs};
use ferrattn::device_api::MergeViews;
use ferrattn_core::cp::{merge_partials, CpShape};
use ferrattn_core::{DType, Tensor};
use pyo3::prelude::*;

/// `ferrattn.merge_states`: partials `o [R, B, Sq, H, D]` (normalised, any float dtype) and
/// `lse [R, B, H, Sq]` (f32, natural log, `-inf` where a rank saw no key), ranks folded in
/// `order` (default `0..R`); returns O `[B, Sq, H, D]` in o's dtype and LSE `[B, H, Sq]`.
/// CUDA tensors merge on the device, on `stream` (the caller's current stream), into `out` and
/// `out_lse`, which the Python wrapper allocates through the framework.
#[pyfunction]
#[pyo3(signature = (o, lse, order=None, out=None, out_lse=None, stream=None))]
pub fn merge_states<'py>(
    py: Python<'py>,
    o: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    order: Option<Vec<usize>>,
    out: Option<&Bound<'py, PyAny>>,
    out_lse: Option<&Bound<'py, PyAny>>,
    stream: Option<usize>,
) -> PyResult<Outputs> {
    let (o, lse) = (View::parse("o", o)?, View::parse("lse", lse)?);
    let out = out.map(|x| View::parse("out", x)).transpose()?;
    let out_lse = out_lse.map(|x| View::parse("out_lse", x)).transpose()?;
    let mut all = vec![&o, &lse];
    all.extend(out.iter());
    all.extend(out_lse.iter());
    if let Device::Cuda(_) = same_device(&all)? {
        return merge_on_device(py, &o, &lse, order, out.as_ref(), out_lse.as_ref(), stream);
    }
    o.expect_rank(5, "[ranks, batch, seq_q, heads, head_dim]")?;
    lse.expect_rank(4, "[ranks, batch, heads, seq_q]")?;
    let (r, b, sq, h, d) = (o.shape[0], o.shape[1], o.shape[2], o.shape[3], o.shape[4]);
    if lse.shape != [r, b, h, sq] || lse.float_dtype()? != DType::F32 {
        return Err(BoundaryError::Unsupported(format!(
            "lse has shape {:?} and dtype {:?}; o {:?} needs float32 [ranks, batch, heads, seq_q] = {:?}",
            lse.shape,
            lse.dtype(),
            o.shape,
            [r, b, h, sq]
        ))
        .into());
    }
    let dtype = o.float_dtype()?;
    if let Some(v) = &out {
        host::check_output(v, &[b, sq, h, d], dtype)?;
    }
    if let Some(v) = &out_lse {
        host::check_output(v, &[b, h, sq], DType::F32)?;
    }
    let (ot, lt) = (host::read(&o)?, host::read(&lse)?);
    let order = order.unwrap_or_else(|| (0..r).collect());
    let shape = CpShape {
        batch: b,
        seqlen_q: sq,
        heads_q: h,
        heads_kv: 1,
        head_dim: d,
        dtype,
        causal: false,
    };
    let merged = py.detach(|| {
        let per_o = ot.data.len() / r.max(1);
        let per_l = lt.data.len() / r.max(1);
        let po: Vec<Vec<f32>> = ot.data.chunks(per_o.max(1)).map(<[f32]>::to_vec).collect();
        let pl: Vec<Vec<f32>> = lt.data.chunks(per_l.max(1)).map(<[f32]>::to_vec).collect();
        merge_partials(&shape, &po, &pl, &order, (0, h))
    });
    let (mo, ml) = merged.map_err(BoundaryError::from)?;
    let o_t = Tensor {
        shape: vec![b, sq, h, d],
        dtype,
        data: mo.into_iter().map(|x| dtype.round(x)).collect(),
    };
    let l_t = Tensor {
        shape: vec![b, h, sq],
        dtype: DType::F32,
        data: ml,
    };
    Ok((
        deliver(out.as_ref(), &o_t)?,
        deliver(out_lse.as_ref(), &l_t)?,
    ))
}

/// The device merge (`LeanDecoder::merge_states`): checks every view at the facade's boundary,
/// then launches on the caller's stream without a copy, an allocation or a synchronisation.
fn merge_on_device(
    py: Python<'_>,
    o: &View<'_>,
    lse: &View<'_>,
    order: Option<Vec<usize>>,
    out: Option<&View<'_>>,
    out_lse: Option<&View<'_>>,
    stream: Option<usize>,
) -> PyResult<Outputs> {
    let (Some(out), Some(out_lse)) = (out, out_lse) else {
        return Err(BoundaryError::Unsupported(
            "merge_states on CUDA tensors writes into out= and out_lse= (the Python wrapper \
             allocates them through the framework)"
                .into(),
        )
        .into());
    };
    let ordinal = cuda::ordinal(o)?;
    let views = [o, lse, out, out_lse].map(cuda::whole);
    let [o_v, lse_v, out_v, out_lse_v] = views;
    let (o_v, lse_v, out_v, out_lse_v) = (o_v?, lse_v?, out_v?, out_lse_v?);
    let x = MergeViews {
        o: &o_v,
        lse: &lse_v,
        out: &out_v,
        out_lse: &out_lse_v,
    };
    let decoder = cuda::decoder(ordinal)?;
    let stream = cuda::stream(stream);
    py.detach(|| decoder.merge_states(&x, order.as_deref(), stream))
        .map_err(BoundaryError::from)?;
    Ok((None, None))
}
