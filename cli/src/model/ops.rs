//! The dense operations of a Llama block in `f32`: matrix products against row-major weights,
//! RMSNorm, RoPE, SwiGLU, log-softmax.

use rayon::prelude::*;

/// Dot product with eight independent accumulators (the compiler vectorises the chunks; one
/// accumulator would serialise on the add latency).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `y [n, out] = x [n, inp] · Wᵀ` with `W` row-major `[out, inp]` (the GGUF layout: one row per
/// output feature). Work is split over output features, and each weight row is used against
/// every input row while it is in cache.
pub fn matmul(x: &[f32], n: usize, w: &[f32], inp: usize, out: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), n * inp);
    debug_assert_eq!(w.len(), out * inp);
    const ROWS: usize = 16;
    let mut yt = vec![0.0f32; out * n];
    yt.par_chunks_mut(ROWS * n)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (r, col) in chunk.chunks_mut(n).enumerate() {
                let wr = &w[(c * ROWS + r) * inp..(c * ROWS + r + 1) * inp];
                for (t, y) in col.iter_mut().enumerate() {
                    *y = dot(&x[t * inp..(t + 1) * inp], wr);
                }
            }
        });
    if n == 1 {
        return yt;
    }
    let mut y = vec![0.0f32; n * out];
    for (o, col) in yt.chunks(n).enumerate() {
        for (t, &v) in col.iter().enumerate() {
            y[t * out + o] = v;
        }
    }
    y
}

/// RMSNorm of each row of `x` (`dim` wide): `x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let dim = w.len();
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(dim) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let r = 1.0 / (ms + eps).sqrt();
        y.extend(row.iter().zip(w).map(|(v, g)| v * r * g));
    }
    y
}

/// Rotary embedding in llama.cpp's "normal" layout, which GGUF Llama files assume (the
/// converter permutes the Q and K weights so that adjacent channels form a pair): channels
/// `2i, 2i + 1` of each head rotate by `pos · base^(-2i / d)` (RoFormer Eq. 34).
/// `x` is `[n, heads, d]` for positions `start..start + n`.
pub fn rope(x: &mut [f32], heads: usize, d: usize, start: usize, base: f32) {
    let inv: Vec<f64> = (0..d / 2)
        .map(|i| (base as f64).powf(-((2 * i) as f64) / d as f64))
        .collect();
    for (t, tok) in x.chunks_mut(heads * d).enumerate() {
        let pos = (start + t) as f64;
        let cs: Vec<(f32, f32)> = inv
            .iter()
            .map(|f| {
                let a = pos * f;
                (a.cos() as f32, a.sin() as f32)
            })
            .collect();
        for head in tok.chunks_mut(d) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = a * s + b * c;
            }
        }
    }
}

/// SwiGLU: `silu(gate) · up`, in place in `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Log-softmax of one row, in `f64` for the sums (vocabulary of 49152).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + logits
        .iter()
        .map(|&v| (v as f64 - m).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&v| (v as f64 - lse) as f32).collect()
}

/// Index of the largest value (the first at a tie).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive() {
        let (n, inp, out) = (3, 37, 35);
        let x: Vec<f32> = (0..n * inp).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..out * inp).map(|i| (i as f32 * 0.11).cos()).collect();
        let y = matmul(&x, n, &w, inp, out);
        for t in 0..n {
            for o in 0..out {
                let r: f64 = (0..inp)
                    .map(|i| x[t * inp + i] as f64 * w[o * inp + i] as f64)
                    .sum();
                assert!((y[t * out + o] as f64 - r).abs() < 1e-4, "{t} {o}");
            }
        }
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let mut x: Vec<f32> = (0..2 * 8).map(|i| i as f32).collect();
        let before: f32 = x.iter().map(|v| v * v).sum();
        rope(&mut x, 2, 4, 3, 10000.0);
        let after: f32 = x.iter().map(|v| v * v).sum();
        assert!((before - after).abs() < 1e-3);
        // pair 0 of head 0 at position 3 rotates by 3 radians
        let (c, s) = (3f32.cos(), 3f32.sin());
        assert!((x[0] - (0.0 * c - 1.0 * s)).abs() < 1e-5);
        assert!((x[1] - (0.0 * s + 1.0 * c)).abs() < 1e-5);
    }

    #[test]
    fn log_softmax_normalises() {
        let l = log_softmax(&[1.0, 2.0, 3.0]);
        let s: f32 = l.iter().map(|v| v.exp()).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(argmax(&l), 2);
    }
}
