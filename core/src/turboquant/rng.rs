//! A small, fully specified random generator, so that every TurboQuant matrix is a pure function
//! of its seed on every platform and with every version of the `rand` crates.
//!
//! Seeds are expanded with SplitMix64 (Steele, Lea and Flood 2014); the stream is xoshiro256++
//! (Blackman and Vigna 2019); normals come from the Box-Muller transform in `f64`. A CUDA or
//! Python port only needs these three definitions to rebuild the same rotation and sketch, though
//! in practice the host builds them once and uploads them.

/// One SplitMix64 step: advances `state` and returns the next output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from `seed` and a path of labels (e.g. `[TAG_ROTATION, d]`); distinct paths
/// give unrelated streams.
pub fn derive_seed(seed: u64, path: &[u64]) -> u64 {
    let mut s = seed;
    let mut out = splitmix64(&mut s);
    for &p in path {
        let mut t = out ^ p.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        out = splitmix64(&mut t);
    }
    out
}

/// xoshiro256++ with a cached second Box-Muller normal.
#[derive(Clone, Debug)]
pub struct SeededRng {
    s: [u64; 4],
    spare: Option<f64>,
}

impl SeededRng {
    /// A generator whose whole stream is fixed by `seed`.
    pub fn new(seed: u64) -> SeededRng {
        let mut st = seed;
        let s = [
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ];
        SeededRng { s, spare: None }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller; both outputs of a pair are used).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.uniform(); // (0, 1]: ln is finite
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
        self.spare = Some(r * s);
        r * c
    }

    /// A point uniform on the unit sphere of `R^d` (a normalised Gaussian vector).
    pub fn unit_vector(&mut self, d: usize) -> Vec<f32> {
        loop {
            let g: Vec<f64> = (0..d).map(|_| self.normal()).collect();
            let n = g.iter().map(|x| x * x).sum::<f64>().sqrt();
            if n > 0.0 {
                return g.iter().map(|x| (x / n) as f32).collect();
            }
        }
    }
}
