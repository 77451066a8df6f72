//! Inputs of the CLI's serving sessions (`turbo-session`, `turboquant-session`): Q, K and V of a
//! whole sequence (the prefill context and every decode step's token), drawn up front so that each
//! step can be checked against exact attention over its prefix.

use crate::Result;
use ferrattn_core::{problem, CoreError, DType, Tensor};
use rand::SeedableRng;

/// Shape of a session: batch, context tokens, decode steps, query and KV heads, head dim.
#[derive(Clone, Copy, Debug)]
pub struct SessionShape {
    /// Sequences.
    pub batch: usize,
    /// Tokens of the prefill.
    pub context: usize,
    /// Decode steps after it (one token each).
    pub steps: usize,
    /// Query heads.
    pub heads_q: usize,
    /// KV heads.
    pub heads_kv: usize,
    /// Head dim of Q, K and V.
    pub head_dim: usize,
}

/// `[q, k, v]` as `[batch, context + steps, heads, head_dim]` Gaussian tensors of `dtype`, or a
/// typed error, before anything is allocated, when the token count overflows or the three
/// tensors exceed what the host can hold. `label` names the session in that error.
pub fn sequence(label: &str, s: SessionShape, dtype: DType, seed: u64) -> Result<[Tensor; 3]> {
    let SessionShape {
        batch: b,
        context,
        steps,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
    } = s;
    let total = context
        .checked_add(steps)
        .ok_or_else(|| CoreError::BadValue {
            what: "--steps".into(),
            value: steps.to_string(),
            requirement: format!(
                "at most {} with a context of {context} tokens",
                usize::MAX - context
            ),
        })?;
    let shapes = [[b, total, hq, d], [b, total, hk, d], [b, total, hk, d]];
    let mut bytes = 0u128;
    for (name, shape) in ["q", "k", "v"].into_iter().zip(&shapes) {
        problem::check_buffer(name, shape)?;
        bytes += problem::buffer_bytes(shape);
    }
    problem::check_host_memory(
        &format!(
            "{label} with B={b}, {total} tokens, Hq={hq}, Hk={hk}, D={d} (q, k, v of every step)"
        ),
        bytes,
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Ok(shapes.map(|shape| Tensor::randn(&shape, dtype, 1.0, &mut rng)))
}
