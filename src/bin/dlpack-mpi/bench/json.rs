//! `--json`: one array of objects, one per (operation, case, size, path) that ran, whatever
//! the operation (docs/CLI.md, "`--json`", has the schema). Each bench turns its rows into
//! [`JsonRow`]s; this file only defines the object (`crate::common::write_json` writes the
//! array). Uses `common`.

use super::common::Samples;

/// One object of `--json`. Every key is always present (`null` where it does not apply),
/// except `block_elems`, which only `strided` objects have.
#[derive(Debug, serde::Serialize)]
pub struct JsonRow {
    /// The operation, as `--op` names it: `latency`, `bandwidth`, `allreduce`, `allgatherv`,
    /// `alltoall`, `strided`, `overlap`, `fused`, `plan`.
    pub op: &'static str,
    /// The case: the operation's name for the sweeps (one object per size), the view for
    /// `strided` (`step 2`, `block 64`, …), `allreduce-16MiB-f32` / `post-8B` for `overlap`,
    /// the list for `fused` and `plan` (`plan`'s `8B` too).
    pub case: String,
    /// The path's name.
    pub path: &'static str,
    /// `strided` only: the view's contiguous inner block, in elements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_elems: Option<usize>,
    /// The size as the operation defines it: the message (latency, bandwidth), the vector
    /// (all-reduce), each rank's block (all-gatherv, all-to-all, as `--sizes`), the view's
    /// logical bytes (strided), the all-reduced tensor (overlap), the whole list (fused,
    /// plan).
    pub size_bytes: u64,
    /// Ranks in the job.
    pub ranks: i32,
    /// Iterations per round.
    pub iters: u64,
    /// Median over the rounds of the round's mean, µs per message or call.
    pub median_us: f64,
    /// The fastest round's mean, µs.
    pub best_us: f64,
    /// Percentiles of the samples (linear interpolation), µs.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// How many samples `p50_us` and `p99_us` are taken over.
    pub samples: usize,
    /// Iterations per sample: 1 = every iteration timed alone; `iters` = one sample per round.
    pub batch_iters: u64,
    /// The bytes `algbw_gbs` divides by the time: `size_bytes`, except for all-gatherv and
    /// all-to-all, where it is `ranks × size_bytes` (nccl-tests' total buffer); `null` where
    /// no bandwidth applies.
    pub algbw_bytes: Option<u64>,
    /// `algbw_bytes / median_us`, in GB/s = 10^9 bytes/s.
    pub algbw_gbs: Option<f64>,
    /// nccl-tests' factor: 2(n−1)/n (all-reduce), (n−1)/n (all-gatherv, all-to-all), 1
    /// (bandwidth, point to point).
    pub busbw_factor: Option<f64>,
    /// `algbw_gbs × busbw_factor`, GB/s.
    pub busbw_gbs: Option<f64>,
}

impl JsonRow {
    /// The object of `path` in `case` of `op` at `size_bytes`: no times yet (NaN, written
    /// `null`), no bandwidth, no block.
    pub fn new(op: &'static str, case: &str, path: &'static str, size_bytes: usize) -> Self {
        JsonRow {
            op,
            case: case.to_string(),
            path,
            block_elems: None,
            size_bytes: size_bytes as u64,
            ranks: 0,
            iters: 0,
            median_us: f64::NAN,
            best_us: f64::NAN,
            p50_us: f64::NAN,
            p99_us: f64::NAN,
            samples: 0,
            batch_iters: 0,
            algbw_bytes: None,
            algbw_gbs: None,
            busbw_factor: None,
            busbw_gbs: None,
        }
    }

    /// Sets the ranks, the iterations per round and the times: `rounds` (µs, one mean per
    /// round) and `samples` (µs, one per batch of `batch` iterations).
    pub fn times(
        mut self,
        ranks: i32,
        iters: u64,
        rounds: &Samples,
        samples: &Samples,
        batch: u64,
    ) -> Self {
        self.ranks = ranks;
        self.iters = iters;
        self.median_us = rounds.median();
        self.best_us = rounds.best();
        self.p50_us = samples.percentile(0.50);
        self.p99_us = samples.percentile(0.99);
        self.samples = samples.0.len();
        self.batch_iters = batch;
        self
    }

    /// Sets the bandwidths: `bytes` moved in `median_us`, and nccl-tests' `factor`.
    pub fn bus(mut self, bytes: usize, factor: f64) -> Self {
        let algbw = algbw_gbs(bytes, self.median_us);
        self.algbw_bytes = Some(bytes as u64);
        self.algbw_gbs = Some(algbw);
        self.busbw_factor = Some(factor);
        self.busbw_gbs = Some(algbw * factor);
        self
    }
}

/// GB/s (10^9 bytes per second) of `bytes` in `us` µs.
pub fn algbw_gbs(bytes: usize, us: f64) -> f64 {
    bytes as f64 / us / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_is_algbw_times_the_factor() {
        let rounds = Samples(vec![4.0, 2.0, 3.0]);
        let samples = Samples(vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        let r = JsonRow::new("allgatherv", "allgatherv", "raw", 1000)
            .times(2, 10, &rounds, &samples, 6)
            .bus(2000, 0.5);
        assert_eq!((r.median_us, r.best_us, r.p50_us), (3.0, 2.0, 3.0));
        assert!((r.p99_us - 4.96).abs() < 1e-12, "{}", r.p99_us);
        // 2000 B in 3 µs = 0.667 GB/s.
        assert_eq!(r.algbw_gbs, Some(2000.0 / 3.0 / 1e3));
        assert_eq!(r.busbw_gbs, Some(2000.0 / 3.0 / 1e3 * 0.5));
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("block_elems"), "{text}");
        let none = JsonRow::new("latency", "latency", "raw", 8);
        let text = serde_json::to_string(&none).unwrap();
        assert!(text.contains(r#""algbw_gbs":null"#), "{text}");
        assert!(text.contains(r#""median_us":null"#), "NaN is null: {text}");
    }
}
