//! Lloyd-Max scalar codebooks for one coordinate of a randomly rotated unit vector, computed
//! here from the exact coordinate law (nothing is pasted from the paper).
//!
//! Lemma 1 of arXiv 2504.19874: a coordinate `t` of a uniform point on the unit sphere of `R^d`
//! has density `f(t) = Γ(d/2) / (√π Γ((d-1)/2)) · (1 - t²)^((d-3)/2)` on `[-1, 1]`, which tends to
//! `N(0, 1/d)`. We work with `u = √d · t` (unit variance) and integrate
//! `g(u) ∝ (1 - u²/d)^((d-3)/2)` numerically: cumulative moments `∫ u^k g`, `k = 0, 1, 2`, are
//! tabulated on a grid of step 1/128 with 8-point Gauss-Legendre panels (nodes computed, not
//! pasted), normalised so `∫ g = 1`, and read at arbitrary points by one more panel. The support
//! is cut at `|u| ≤ min(√d, 14)`; beyond 14 the density is below `e^-90`.
//!
//! Lloyd iteration (Lloyd 1982, Max 1960): boundaries at midpoints of neighbouring centroids,
//! each centroid moved to the conditional mean of its cell, repeated until no centroid moves by
//! more than `1e-12` (in units of `1/√d`). It starts from the Panter-Dite companding points (the
//! quantiles of `g^(1/3)`), which are already close for every bit width. Each step is made
//! exactly symmetric (`c_i = -c_(n-1-i)`), as the law is.
//!
//! The `distortion` of a codebook is `d · E[(t - c(t))²]`, which by symmetry of the coordinates is
//! exactly `E ||x - Q(x)||²` for a unit `x` (Theorem 1's `D_mse`): 0.3634, 0.1175, 0.03454,
//! 0.009497 at 1-4 bits as `d` grows (Max's Gaussian values; the paper prints them rounded as
//! 0.36, 0.117, 0.03, 0.009).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Largest codebook bit width the library computes (the attention config accepts 1..=4).
pub const MAX_CODEBOOK_BITS: u8 = 8;

/// Grid step of the moment tables in `u = √d · t` units.
const GRID_STEP: f64 = 1.0 / 128.0;
/// Gauss-Legendre points per panel.
const GL_POINTS: usize = 8;
/// Support cut in `u` units for large `d`.
const U_CUT: f64 = 14.0;
/// Lloyd stops when no centroid moves by more than this (in `u` units).
const LLOYD_TOL: f64 = 1e-12;
/// Lloyd iteration cap (only reached by the 7-8 bit codebooks, if ever).
const LLOYD_MAX_ITERS: usize = 200_000;

/// Gauss-Legendre nodes and weights on `[-1, 1]`, by Newton's method on `P_n`.
fn gauss_legendre(n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut x = vec![0.0; n];
    let mut w = vec![0.0; n];
    for i in 0..n {
        let mut z = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
        let mut dp = 0.0;
        for _ in 0..100 {
            let (mut p0, mut p1) = (1.0f64, z);
            for k in 2..=n {
                let p2 = ((2 * k - 1) as f64 * z * p1 - (k - 1) as f64 * p0) / k as f64;
                p0 = p1;
                p1 = p2;
            }
            // p1 = P_n(z), p0 = P_(n-1)(z)
            dp = n as f64 * (z * p1 - p0) / (z * z - 1.0);
            let dz = p1 / dp;
            z -= dz;
            if dz.abs() < 1e-15 {
                break;
            }
        }
        x[i] = z;
        w[i] = 2.0 / ((1.0 - z * z) * dp * dp);
    }
    (x, w)
}

/// The law of one coordinate of a uniform unit vector in `R^d`, in `u = √d · t` units, with
/// tabulated cumulative moments.
#[derive(Clone, Debug)]
pub struct CoordinateLaw {
    d: usize,
    expo: f64,
    lim: f64,
    norm: f64,
    nodes: Vec<f64>,
    weights: Vec<f64>,
    /// `cum[i] = ∫_{-lim}^{-lim + i·h} (g, u g, u² g, g^(1/3))`, the first three normalised.
    cum: Vec<[f64; 4]>,
}

impl CoordinateLaw {
    /// The law for dimension `d >= 3`.
    pub fn new(d: usize) -> CoordinateLaw {
        assert!(
            d >= 3,
            "the coordinate law (1 - t^2)^((d-3)/2) needs d >= 3 (got {d})"
        );
        let (nodes, weights) = gauss_legendre(GL_POINTS);
        let lim = (d as f64).sqrt().min(U_CUT);
        let mut law = CoordinateLaw {
            d,
            expo: (d as f64 - 3.0) / 2.0,
            lim,
            norm: 1.0,
            nodes,
            weights,
            cum: Vec::new(),
        };
        let panels = (2.0 * lim / GRID_STEP).ceil() as usize;
        let h = 2.0 * lim / panels as f64;
        let mut cum = Vec::with_capacity(panels + 1);
        let mut acc = [0.0f64; 4];
        cum.push(acc);
        for i in 0..panels {
            let a = -lim + i as f64 * h;
            let m = law.panel(a, a + h);
            for k in 0..4 {
                acc[k] += m[k];
            }
            cum.push(acc);
        }
        let z = acc[0];
        for c in cum.iter_mut() {
            for v in c.iter_mut().take(3) {
                *v /= z;
            }
        }
        law.norm = z;
        law.cum = cum;
        law
    }

    /// Dimension `d`.
    pub fn dim(&self) -> usize {
        self.d
    }

    /// Unnormalised `g(u)`.
    fn g_raw(&self, u: f64) -> f64 {
        let s = u * u / self.d as f64;
        if s >= 1.0 {
            return 0.0;
        }
        if self.expo == 0.0 {
            return 1.0;
        }
        (self.expo * (-s).ln_1p()).exp()
    }

    /// `∫_a^b (g, u g, u² g, g^(1/3)) du` with the raw `g`, one Gauss-Legendre panel.
    fn panel(&self, a: f64, b: f64) -> [f64; 4] {
        let (mid, half) = ((a + b) / 2.0, (b - a) / 2.0);
        let mut m = [0.0f64; 4];
        for (&x, &w) in self.nodes.iter().zip(&self.weights) {
            let u = mid + half * x;
            let g = self.g_raw(u);
            let wg = w * half * g;
            m[0] += wg;
            m[1] += wg * u;
            m[2] += wg * u * u;
            m[3] += w * half * g.cbrt();
        }
        m
    }

    /// Normalised density of `u = √d · t`.
    pub fn pdf_u(&self, u: f64) -> f64 {
        self.g_raw(u) / self.norm
    }

    /// Normalised density of the coordinate `t` itself, on `[-1, 1]`.
    pub fn pdf(&self, t: f64) -> f64 {
        let s = (self.d as f64).sqrt();
        s * self.pdf_u(t * s)
    }

    /// Cumulative `(∫g, ∫u g, ∫u² g, ∫g^(1/3))` from the lower support end to `u`.
    fn cum_at(&self, u: f64) -> [f64; 4] {
        let u = u.clamp(-self.lim, self.lim);
        let panels = self.cum.len() - 1;
        let h = 2.0 * self.lim / panels as f64;
        let i = (((u + self.lim) / h).floor() as usize).min(panels - 1);
        let a = -self.lim + i as f64 * h;
        let mut c = self.cum[i];
        if u > a {
            let m = self.panel(a, u);
            for k in 0..3 {
                c[k] += m[k] / self.norm;
            }
            c[3] += m[3];
        }
        c
    }

    /// `(P, E[u; cell], E[u²; cell])` over the cell `lo < u < hi` (in `u` units).
    pub fn cell_moments_u(&self, lo: f64, hi: f64) -> [f64; 3] {
        let (a, b) = (self.cum_at(lo), self.cum_at(hi));
        [b[0] - a[0], b[1] - a[1], b[2] - a[2]]
    }

    /// Lower and upper end of the (cut) support in `u` units.
    pub fn support_u(&self) -> (f64, f64) {
        (-self.lim, self.lim)
    }

    /// Panter-Dite starting points: quantiles `(i + 1/2)/n` of `g^(1/3)`.
    fn companding_points(&self, n: usize) -> Vec<f64> {
        let total = self.cum.last().expect("table is never empty")[3];
        let panels = self.cum.len() - 1;
        let h = 2.0 * self.lim / panels as f64;
        (0..n)
            .map(|i| {
                let target = total * (i as f64 + 0.5) / n as f64;
                let k = self.cum.partition_point(|c| c[3] < target).clamp(1, panels);
                let (c0, c1) = (self.cum[k - 1][3], self.cum[k][3]);
                let frac = if c1 > c0 {
                    (target - c0) / (c1 - c0)
                } else {
                    0.5
                };
                -self.lim + (k as f64 - 1.0 + frac) * h
            })
            .collect()
    }
}

/// A Lloyd-Max codebook for one rotated coordinate at a given bit width and dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct Codebook {
    bits: u8,
    d: usize,
    centroids: Vec<f64>,
    boundaries: Vec<f64>,
    centroids_f32: Vec<f32>,
    boundaries_f32: Vec<f32>,
    distortion: f64,
    iterations: usize,
}

impl Codebook {
    /// Computes the `2^bits`-level Lloyd-Max codebook for dimension `d` (no cache; see
    /// [`codebook`]). `bits = 0` is the one-point codebook `{0}` (distortion 1), which is what
    /// `TurboQuant_prod` at 1 bit uses for its empty MSE stage.
    pub fn compute(bits: u8, d: usize) -> Codebook {
        assert!(
            bits <= MAX_CODEBOOK_BITS,
            "codebooks go up to {MAX_CODEBOOK_BITS} bits (asked {bits})"
        );
        let law = CoordinateLaw::new(d);
        Codebook::compute_with(bits, &law)
    }

    /// As [`Codebook::compute`], with the law already tabulated.
    pub fn compute_with(bits: u8, law: &CoordinateLaw) -> Codebook {
        let d = law.dim();
        let n = 1usize << bits;
        let (lo, hi) = law.support_u();
        let mut c = if n == 1 {
            vec![0.0]
        } else {
            law.companding_points(n)
        };
        let mut iterations = 0;
        if n > 1 {
            let mut edges = vec![0.0f64; n + 1];
            let mut cums = vec![[0.0f64; 4]; n + 1];
            while iterations < LLOYD_MAX_ITERS {
                iterations += 1;
                edges[0] = lo;
                edges[n] = hi;
                for i in 1..n {
                    edges[i] = 0.5 * (c[i - 1] + c[i]);
                }
                for (k, e) in edges.iter().enumerate() {
                    cums[k] = law.cum_at(*e);
                }
                let mut next: Vec<f64> = (0..n)
                    .map(|i| {
                        let mass = cums[i + 1][0] - cums[i][0];
                        if mass > 0.0 {
                            (cums[i + 1][1] - cums[i][1]) / mass
                        } else {
                            c[i]
                        }
                    })
                    .collect();
                for i in 0..n / 2 {
                    let s = 0.5 * (next[n - 1 - i] - next[i]);
                    next[i] = -s;
                    next[n - 1 - i] = s;
                }
                let moved = c
                    .iter()
                    .zip(&next)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                c = next;
                if moved < LLOYD_TOL {
                    break;
                }
            }
        }
        let bounds_u: Vec<f64> = (1..n).map(|i| 0.5 * (c[i - 1] + c[i])).collect();
        // D = Σ_cells ∫ (u - c_i)² g
        let mut distortion = 0.0;
        for i in 0..n {
            let a = if i == 0 { lo } else { bounds_u[i - 1] };
            let b = if i == n - 1 { hi } else { bounds_u[i] };
            let [m0, m1, m2] = law.cell_moments_u(a, b);
            distortion += m2 - 2.0 * c[i] * m1 + c[i] * c[i] * m0;
        }
        let s = (d as f64).sqrt();
        let centroids: Vec<f64> = c.iter().map(|u| u / s).collect();
        let boundaries: Vec<f64> = (1..n)
            .map(|i| 0.5 * (centroids[i - 1] + centroids[i]))
            .collect();
        Codebook {
            bits,
            d,
            centroids_f32: centroids.iter().map(|&x| x as f32).collect(),
            boundaries_f32: boundaries.iter().map(|&x| x as f32).collect(),
            centroids,
            boundaries,
            distortion,
            iterations,
        }
    }

    /// Bits per coordinate.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// The dimension whose coordinate law it was fitted to.
    pub fn dim(&self) -> usize {
        self.d
    }

    /// `2^bits` centroids in coordinate units (a unit vector's rotated coordinates), ascending.
    pub fn centroids(&self) -> &[f64] {
        &self.centroids
    }

    /// The centroids as `f32`, as a kernel holds them.
    pub fn centroids_f32(&self) -> &[f32] {
        &self.centroids_f32
    }

    /// `2^bits - 1` decision boundaries (midpoints of neighbouring centroids), ascending.
    pub fn boundaries(&self) -> &[f64] {
        &self.boundaries
    }

    /// The boundaries as `f32`, as [`Self::index`] compares them (and a kernel must, to give the
    /// same indices).
    pub fn boundaries_f32(&self) -> &[f32] {
        &self.boundaries_f32
    }

    /// `E ||x - Q(x)||²` for a unit `x` (`d` times the per-coordinate mean squared error).
    pub fn distortion(&self) -> f64 {
        self.distortion
    }

    /// Lloyd iterations it took.
    pub fn iterations(&self) -> usize {
        self.iterations
    }

    /// Index of the centroid nearest to the coordinate `t`.
    #[inline]
    pub fn index(&self, t: f32) -> u8 {
        self.boundaries_f32.partition_point(|&b| b < t) as u8
    }

    /// Centroid `i` as `f32`.
    #[inline]
    pub fn centroid(&self, i: u8) -> f32 {
        self.centroids_f32[i as usize]
    }
}

/// The codebook for `(bits, d)`, computed once per process and shared.
pub fn codebook(bits: u8, d: usize) -> Arc<Codebook> {
    type Cache = Mutex<HashMap<(u8, usize), Arc<Codebook>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // computing under the lock keeps two threads from fitting the same codebook twice
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    map.entry((bits, d))
        .or_insert_with(|| Arc::new(Codebook::compute(bits, d)))
        .clone()
}
