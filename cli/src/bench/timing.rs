//! The one timing method of `ferrattn bench`, for every row on every backend.
//!
//! 1. Warm-up: [`Method::warmup`] calls (module load, JIT, first-touch allocation stay out),
//!    then calls for about [`Method::warmup_ms`] more, so the clocks a GPU lowered while the host
//!    built and checked the row are back up before anything is timed (the `do_bench` way: its
//!    warm-up is milliseconds too). Without it the first variant timed after a slow host check
//!    read up to 11% slower than the same grid timed right after it (H200, 2026-11-24).
//! 2. Size: one call timed alone estimates the cost; a batch holds enough calls to last about
//!    [`Method::batch_ms`] (between [`Method::min_per_batch`] and [`Method::max_per_batch`]), and enough batches
//!    are timed to fill about [`Method::budget_ms`] (between [`Method::min_batches`] and
//!    [`Method::max_batches`]).
//! 3. Measure: each batch of calls is timed by a [`Clock`]; on a GPU the batch is captured once in
//!    a CUDA graph and replayed between two events, so launch gaps are not counted (serving engines
//!    replay decode steps the same way); on the host it is a wall clock around the calls.
//! 4. Report the median time per call over batches, with the 10th and 90th percentiles as the
//!    spread.
//!
//! Call `i` of a batch uses input set `i % sets`; [`rotation_sets`] picks `sets` so that the sets
//! together are at least 4x the last-level cache (METHOD.md: "if the inputs fit in the cache,
//! repeated runs over one buffer measure the cache").
//!
//! The PyTorch baseline script gets [`Method`] in its request (`scripts/bench_sdpa.py`), so both
//! sides run under the same constants, stated here once.

use serde::{Deserialize, Serialize};

/// The constants of the method.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Method {
    /// Untimed calls before sizing.
    pub warmup: usize,
    /// Untimed calls for about this many milliseconds after those (a result file written
    /// before this field existed reads as 0).
    #[serde(default)]
    pub warmup_ms: f64,
    /// Target duration of one timed batch, milliseconds.
    pub batch_ms: f64,
    /// Fewest calls in one batch.
    pub min_per_batch: usize,
    /// Most calls in one batch (one captured graph).
    pub max_per_batch: usize,
    /// Target total timed duration per row, milliseconds.
    pub budget_ms: f64,
    /// Fewest batches timed.
    pub min_batches: usize,
    /// Most batches timed.
    pub max_batches: usize,
}

impl Method {
    /// The method every suite uses on a device.
    pub const DEVICE: Method = Method {
        warmup: 3,
        warmup_ms: 100.0,
        batch_ms: 2.0,
        min_per_batch: 3,
        max_per_batch: 200,
        budget_ms: 200.0,
        min_batches: 5,
        max_batches: 25,
    };

    /// The same method on the host, with a smaller budget: CPU emulations take milliseconds per
    /// call and the quick suite must run on a two-core CI machine in seconds.
    pub const HOST: Method = Method {
        warmup: 1,
        warmup_ms: 0.0,
        batch_ms: 5.0,
        min_per_batch: 1,
        max_per_batch: 50,
        budget_ms: 60.0,
        min_batches: 3,
        max_batches: 15,
    };

    /// Calls per batch and batches for one call lasting `est_ms`.
    pub fn sizes(&self, est_ms: f64) -> (usize, usize) {
        let est = est_ms.max(0.002);
        let per_batch =
            ((self.batch_ms / est) as usize).clamp(self.min_per_batch, self.max_per_batch);
        let batches = ((self.budget_ms / (est * per_batch as f64)) as usize)
            .clamp(self.min_batches, self.max_batches);
        (per_batch, batches)
    }
}

/// How the batches of one row were timed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ClockKind {
    /// CUDA graph replay between CUDA events.
    GraphReplay,
    /// Calls enqueued back to back between CUDA events (work a graph cannot hold).
    DeviceEvents,
    /// Host wall clock around the calls.
    Host,
    /// A timing model's prediction (the simulated Ascend 910), never a measurement.
    Model,
}

/// One row's time per call.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Timing {
    /// Median over batches of the time per call, milliseconds.
    pub median_ms: f64,
    /// 10th percentile over batches, milliseconds.
    pub p10_ms: f64,
    /// 90th percentile over batches, milliseconds.
    pub p90_ms: f64,
    /// Batches timed.
    pub batches: usize,
    /// Calls per batch.
    pub per_batch: usize,
    /// Input sets rotated through.
    pub sets: usize,
    /// How batches were timed.
    pub clock: ClockKind,
}

impl Timing {
    /// A timing model's single prediction.
    pub fn model(ms: f64) -> Timing {
        Timing {
            median_ms: ms,
            p10_ms: ms,
            p90_ms: ms,
            batches: 1,
            per_batch: 1,
            sets: 1,
            clock: ClockKind::Model,
        }
    }

    /// (p90 - p10) / median, percent.
    pub fn spread_pct(&self) -> f64 {
        100.0 * (self.p90_ms - self.p10_ms) / self.median_ms.max(f64::MIN_POSITIVE)
    }
}

/// Times batches of calls.
pub trait Clock {
    /// Error of the device.
    type Error;
    /// What this clock is.
    fn kind(&self) -> ClockKind;
    /// Milliseconds for one call of `f(0)` (sizing estimate; synchronous).
    fn once(
        &mut self,
        f: &mut dyn FnMut(usize) -> Result<(), Self::Error>,
    ) -> Result<f64, Self::Error>;
    /// Prepares a batch of `per_batch` calls (`f(k)` for `k` in `0..per_batch`) and returns the
    /// milliseconds of each of `batches` runs of it.
    fn batches(
        &mut self,
        per_batch: usize,
        batches: usize,
        f: &mut dyn FnMut(usize) -> Result<(), Self::Error>,
    ) -> Result<Vec<f64>, Self::Error>;
}

/// Times `f` (call `i` uses input set `i % sets`) under `method` with `clock`.
pub fn measure<C: Clock>(
    method: &Method,
    clock: &mut C,
    sets: usize,
    mut f: impl FnMut(usize) -> Result<(), C::Error>,
) -> Result<Timing, C::Error> {
    let sets = sets.max(1);
    let mut call = |i: usize| f(i % sets);
    for i in 0..method.warmup {
        call(i)?;
    }
    let mut est = clock.once(&mut call)?;
    if method.warmup_ms > 0.0 {
        let more = (method.warmup_ms / est.max(0.002)).ceil().min(5000.0) as usize;
        for i in 0..more {
            call(i)?;
        }
        est = clock.once(&mut call)?;
    }
    let (per_batch, batches) = method.sizes(est);
    let per_call: Vec<f64> = clock
        .batches(per_batch, batches, &mut call)?
        .into_iter()
        .map(|ms| ms / per_batch as f64)
        .collect();
    Ok(summarise(per_call, per_batch, sets, clock.kind()))
}

/// Median and 10th/90th percentiles of per-call times.
pub fn summarise(
    mut per_call: Vec<f64>,
    per_batch: usize,
    sets: usize,
    clock: ClockKind,
) -> Timing {
    per_call.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| {
        if per_call.is_empty() {
            f64::NAN
        } else {
            per_call[((per_call.len() - 1) as f64 * q).round() as usize]
        }
    };
    Timing {
        median_ms: pick(0.5),
        p10_ms: pick(0.1),
        p90_ms: pick(0.9),
        batches: per_call.len(),
        per_batch,
        sets,
        clock,
    }
}

/// Input sets to rotate so that together they hold at least 4x `cache_bytes` (at most 32 sets).
pub fn rotation_sets(set_bytes: usize, cache_bytes: usize) -> usize {
    if set_bytes == 0 {
        return 1;
    }
    (4 * cache_bytes).div_ceil(set_bytes).clamp(1, 32)
}

/// The host wall clock.
pub struct HostClock;

impl Clock for HostClock {
    type Error = crate::FerrattnError;

    fn kind(&self) -> ClockKind {
        ClockKind::Host
    }

    fn once(&mut self, f: &mut dyn FnMut(usize) -> crate::Result<()>) -> crate::Result<f64> {
        let t = std::time::Instant::now();
        f(0)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    fn batches(
        &mut self,
        per_batch: usize,
        batches: usize,
        f: &mut dyn FnMut(usize) -> crate::Result<()>,
    ) -> crate::Result<Vec<f64>> {
        let mut out = Vec::with_capacity(batches);
        for _ in 0..batches {
            let t = std::time::Instant::now();
            for k in 0..per_batch {
                f(k)?;
            }
            out.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_method() {
        let m = Method::DEVICE;
        // a 10 us call: 200 per batch (capped), 5 batches fill less than the budget -> 100 batches
        // would be needed, capped at 25
        assert_eq!(m.sizes(0.01), (200, 25));
        // a 1 ms call: 3 per batch (floor), 200 / 3 -> 66 batches, capped at 25
        assert_eq!(m.sizes(1.0), (3, 25));
        // a 50 ms call: 3 per batch, 200 / 150 -> 1 batch, raised to the minimum 5
        assert_eq!(m.sizes(50.0), (3, 5));
    }

    #[test]
    fn summary_is_median_and_percentiles() {
        let t = summarise(
            (1..=11).rev().map(|x| x as f64).collect(),
            4,
            2,
            ClockKind::Host,
        );
        assert_eq!((t.median_ms, t.p10_ms, t.p90_ms), (6.0, 2.0, 10.0));
        assert_eq!((t.batches, t.per_batch, t.sets), (11, 4, 2));
        assert!((t.spread_pct() - 100.0 * 8.0 / 6.0).abs() < 1e-9);
    }

    #[test]
    fn rotation_covers_four_times_the_cache() {
        assert_eq!(rotation_sets(10 << 20, 50 << 20), 20);
        assert_eq!(rotation_sets(300 << 20, 50 << 20), 1);
        assert_eq!(rotation_sets(1, 50 << 20), 32);
        assert_eq!(rotation_sets(0, 50 << 20), 1);
    }

    #[test]
    fn measure_rotates_sets_and_counts_calls() {
        let mut seen = vec![0usize; 3];
        let t = measure(&Method::HOST, &mut HostClock, 3, |i| {
            seen[i] += 1;
            std::thread::sleep(std::time::Duration::from_micros(200));
            Ok(())
        })
        .unwrap();
        assert!(seen.iter().all(|&n| n > 0), "every set used: {seen:?}");
        assert!(
            t.median_ms >= 0.2,
            "sleep of 0.2 ms timed as {}",
            t.median_ms
        );
        assert_eq!(t.clock, ClockKind::Host);
    }
}
