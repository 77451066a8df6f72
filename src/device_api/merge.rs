//! The merge of partial attention states on the device: per-rank (or per-split) partials
//! `(O_r, LSE_r)` folded into one `(O, LSE)` with the softmax-state merge of LeanAttention
//! appendix D, the step context-parallel decode ends with. Engines that gather the partials with
//! their own collective (`torch.distributed.all_gather_into_tensor`, NCCL) call this on the
//! gathered tensors; ferrattn's own NCCL path (`ferrattn_cuda::cp::CpRank`) runs the same kernel.

use super::{check_view, LeanDecoder, Location, Stream, TensorView, ViewError};
use crate::Result;
use ferrattn_core::cp::{CpShape, MAX_RANKS};
use ferrattn_core::DType;
use ferrattn_cuda::cp::{CpKernels, GatheredPartials};
use ferrattn_cuda::CudaError;

/// The tensors of one merge.
#[derive(Clone, Copy, Debug)]
pub struct MergeViews<'v, 'a> {
    /// Partial outputs `[ranks, batch, query_len, heads, head_dim]`, f16 or bf16, each rank's
    /// normalised by its own softmax sum.
    pub o: &'v TensorView<'a>,
    /// Partial LSEs `f32 [ranks, batch, heads, query_len]`, natural log, `-inf` where a rank
    /// saw no key (its O is then never read).
    pub lse: &'v TensorView<'a>,
    /// Output `[batch, query_len, heads, head_dim]` in o's dtype.
    pub out: &'v TensorView<'a>,
    /// Output `f32 [batch, heads, query_len]`, natural log (`-inf` for a row no rank saw).
    pub out_lse: &'v TensorView<'a>,
}

/// The boundary check of a merge, on the host: ranks, shapes, dtypes, device, lengths,
/// contiguity and alignment of every view, and `order` a permutation of the ranks. Returns the
/// merge's shape and its rank order.
pub fn validate_merge(
    x: &MergeViews<'_, '_>,
    order: Option<&[usize]>,
    location: Location,
) -> std::result::Result<(CpShape, Vec<usize>), ViewError> {
    const OL: &str = "[ranks, batch, query_len, heads, head_dim]";
    if x.o.shape().len() != 5 {
        return Err(ViewError::Rank {
            tensor: "o",
            shape: x.o.shape().to_vec(),
            got: x.o.shape().len(),
            expected: 5,
            layout: OL,
        });
    }
    let [r, b, sq, h, d] = [0, 1, 2, 3, 4].map(|i| x.o.shape()[i]);
    if r == 0 || r > MAX_RANKS {
        return Err(ViewError::Length {
            what: "the number of partials (o.shape[0])".into(),
            got: r,
            requirement: format!("1 to {MAX_RANKS}"),
        });
    }
    if d == 0 || d > 256 {
        return Err(ViewError::Length {
            what: "head_dim (o.shape[4])".into(),
            got: d,
            requirement: "1 to 256".into(),
        });
    }
    let dtype = x.o.dtype();
    check_view("o", x.o, &[r, b, sq, h, d], OL, dtype, location)?;
    check_view(
        "lse",
        x.lse,
        &[r, b, h, sq],
        "[ranks, batch, heads, query_len], f32",
        DType::F32,
        location,
    )?;
    check_view(
        "out",
        x.out,
        &[b, sq, h, d],
        "[batch, query_len, heads, head_dim], o's dtype",
        dtype,
        location,
    )?;
    check_view(
        "out_lse",
        x.out_lse,
        &[b, h, sq],
        "[batch, heads, query_len], f32",
        DType::F32,
        location,
    )?;
    let order = match order {
        None => (0..r).collect(),
        Some(o) => {
            let mut seen = vec![false; r];
            if o.len() != r
                || o.iter()
                    .any(|&i| i >= r || std::mem::replace(&mut seen[i], true))
            {
                return Err(ViewError::Length {
                    what: format!("the merge order {o:?} (length)"),
                    got: o.len(),
                    requirement: format!("a permutation of 0..{r}"),
                });
            }
            o.to_vec()
        }
    };
    let shape = CpShape {
        batch: b,
        seqlen_q: sq,
        heads_q: h,
        heads_kv: 1,
        head_dim: d,
        dtype,
        causal: false,
    };
    Ok((shape, order))
}

impl LeanDecoder {
    /// Validates the views and enqueues the merge of the partials into `out`/`out_lse` on
    /// `stream`, folding ranks in `order` (default `0..ranks`; the same order gives the same
    /// bits). No allocation, synchronisation or copy: capturable in a CUDA graph. The merge
    /// kernels of each dtype load at first use.
    pub fn merge_states(
        &self,
        x: &MergeViews<'_, '_>,
        order: Option<&[usize]>,
        stream: Stream,
    ) -> Result<()> {
        let (shape, order) = validate_merge(x, order, Location::Cuda(self.ordinal))?;
        let slot = match shape.dtype {
            DType::F16 => 0,
            DType::BF16 => 1,
            other => {
                return Err(CudaError::Unsupported {
                    what: format!("{other} partials for the device merge"),
                    supported: "f16, bf16 (merge f32 partials on the host)".into(),
                }
                .into())
            }
        };
        let gpu = self.backend.gpu()?;
        let kernels = self.merge[slot]
            .get_or_init(|| CpKernels::load(gpu, shape.dtype, false).map_err(|e| e.to_string()));
        let kernels = kernels
            .as_ref()
            .map_err(|r| CudaError::Unavailable { reason: r.clone() })?;
        let per_rank = |v: &TensorView<'_>| (v.strides()[0] * v.dtype().size_bytes()) as u64;
        let parts = GatheredPartials {
            o: x.o.addr(),
            o_stride: per_rank(x.o),
            lse: x.lse.addr(),
            lse_stride: per_rank(x.lse),
        };
        // SAFETY: every view was checked above (shape, dtype, device, declared length,
        // contiguity, 16-byte alignment) and the order is a permutation of the ranks; the stream
        // by Stream::from_raw.
        unsafe {
            kernels.merge_gathered(
                gpu,
                &shape,
                &parts,
                &order,
                (0, shape.heads_q),
                (x.out.addr(), x.out_lse.addr()),
                stream.as_raw() as _,
            )?;
        }
        Ok(())
    }
}
