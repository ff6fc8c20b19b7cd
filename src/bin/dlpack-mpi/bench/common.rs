//! What every bench uses: the element type, aligned exporter-owned buffers, the values sent,
//! per-round samples and their percentiles, the per-batch timer, the warm-up-then-rotated-rounds
//! driver, the ping-pong leg order, nccl-tests' bus-bandwidth factors, and size formatting.
//! Uses nothing of `bench/` (what `check` and `info` also use is in `crate::common`).

use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Alignment of the first element of every benchmarked host buffer, in bytes.
pub const ALIGN: usize = 4096;
/// Element type of every message.
pub type Elem = f32;
/// Bytes per element.
pub const ELEM: usize = std::mem::size_of::<Elem>();

/// The value stored at storage index `k` of rank `r`'s send buffer: exact in f32, distinct
/// per rank, and small enough that sums over a few ranks stay exact.
pub fn value(r: i32, k: usize) -> Elem {
    ((k % 4096) + 4096 * r as usize) as Elem
}

/// `"met"` or `"NOT met"`.
pub fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// `bytes` in the largest binary unit that divides it: `64 MiB`, `4 KiB`, `8 B`.
pub fn fmt_size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// MB/s (10^6 bytes per second) of messages of `bytes` taking `us` µs each.
pub fn mb_per_s(bytes: usize, us: f64) -> f64 {
    bytes as f64 / us
}

/// Per-round times of one path at one size (µs per message in the host benches, seconds in
/// the GPU bench).
#[derive(Debug, Default, Clone)]
pub struct Samples(pub Vec<f64>);

impl Samples {
    /// The median round (the mean of the middle two for an even count); NaN when empty.
    pub fn median(&self) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    /// The fastest round; +∞ when empty.
    pub fn best(&self) -> f64 {
        self.0.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The `q`-quantile (0 ≤ q ≤ 1) by linear interpolation between the closest ranks
    /// (NumPy's default: `percentile(0.5)` is [`Samples::median`]); NaN when empty.
    pub fn percentile(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let Some(&last) = v.last() else {
            return f64::NAN;
        };
        let h = (v.len() - 1) as f64 * q.clamp(0.0, 1.0);
        let lo = h.floor() as usize;
        match v.get(lo + 1) {
            Some(&hi) => v[lo] + (h - lo as f64) * (hi - v[lo]),
            None => last,
        }
    }
}

/// The shortest a latency sample may last, seconds: a sample is the mean of a batch of
/// consecutive iterations at least this long (one iteration when it is), so the timer read
/// that ends it (`MPI_Wtime`, 34 ns on the 2-core test machine) stays below 0.4 % of it.
pub const SAMPLE_MIN_SECS: f64 = 10e-6;

/// The per-batch timer of one timed run: [`Laps::tick`] after every iteration; every
/// `batch` iterations (and at the end) it records the batch's seconds per iteration.
#[derive(Debug)]
pub struct Laps {
    batch: u64,
    since: u64,
    last: f64,
    /// Seconds per iteration of every batch, in order.
    pub secs: Vec<f64>,
}

impl Laps {
    /// A timer recording every `batch` iterations (at least 1).
    pub fn new(batch: u64) -> Self {
        Laps {
            batch: batch.max(1),
            since: 0,
            last: 0.0,
            secs: Vec::new(),
        }
    }

    /// Starts the first batch now.
    fn start(&mut self, now: f64) {
        self.last = now;
        self.since = 0;
    }

    /// One iteration done: ends the batch when it is full.
    #[inline]
    pub fn tick(&mut self) {
        self.since += 1;
        if self.since == self.batch {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let now = mpi::time();
        self.secs.push((now - self.last) / self.since as f64);
        self.last = now;
        self.since = 0;
    }

    /// Ends the last, partial batch.
    fn finish(&mut self) {
        if self.since > 0 {
            self.flush();
        }
    }
}

/// [`timed`], with `f` ticking `laps` after every iteration: the seconds `f` took on this
/// rank (the batches in `laps`).
pub fn timed_laps<E>(
    world: &SimpleCommunicator,
    laps: &mut Laps,
    f: impl FnOnce(&mut Laps) -> Result<(), E>,
) -> Result<f64, E> {
    world.barrier();
    let start = mpi::time();
    laps.start(start);
    f(laps)?;
    laps.finish();
    Ok(mpi::time() - start)
}

/// nccl-tests' bus-bandwidth factor of an all-reduce over `n` ranks: 2(n − 1)/n.
pub fn allreduce_factor(n: i32) -> f64 {
    2.0 * f64::from(n - 1) / f64::from(n)
}

/// nccl-tests' bus-bandwidth factor of an all-gather, all-to-all or reduce-scatter over `n`
/// ranks: (n − 1)/n.
pub fn gather_factor(n: i32) -> f64 {
    f64::from(n - 1) / f64::from(n)
}

/// A barrier, then `f`, timed: the seconds `f` took on this rank.
pub fn timed<E>(world: &SimpleCommunicator, f: impl FnOnce() -> Result<(), E>) -> Result<f64, E> {
    world.barrier();
    let start = mpi::time();
    f()?;
    Ok(mpi::time() - start)
}

/// One half of a ping-pong round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    /// Send the buffer to the peer.
    Send,
    /// Receive the peer's message into the buffer.
    Recv,
}

/// `iters` round trips of a ping-pong: rank 0 sends then receives, its peer receives then
/// sends; `leg` does one half.
pub fn round_trips<E>(
    rank: i32,
    iters: u64,
    leg: impl FnMut(Leg) -> Result<(), E>,
) -> Result<(), E> {
    round_trips_ticked(rank, iters, || (), leg)
}

/// [`round_trips`], calling `tick` after every round trip.
pub fn round_trips_ticked<E>(
    rank: i32,
    iters: u64,
    mut tick: impl FnMut(),
    mut leg: impl FnMut(Leg) -> Result<(), E>,
) -> Result<(), E> {
    let order = if rank == 0 {
        [Leg::Send, Leg::Recv]
    } else {
        [Leg::Recv, Leg::Send]
    };
    for _ in 0..iters {
        for l in order {
            leg(l)?;
        }
        tick();
    }
    Ok(())
}

/// Warm-up (one call of `once` per path with `iters / 5`, at least 2, iterations), then
/// `rounds` rounds of every path in `paths`, the order rotated from round to round with a
/// barrier before each round: samples (µs per message) in the order of `paths`.
pub fn measure_rounds<P: Copy, E>(
    world: &SimpleCommunicator,
    rounds: u32,
    iters: u64,
    paths: &[P],
    mut once: impl FnMut(P, u64) -> Result<f64, E>,
) -> Result<Vec<Samples>, E> {
    let warm = (iters / 5).max(2);
    for &p in paths {
        once(p, warm)?;
    }
    let mut samples = vec![Samples::default(); paths.len()];
    for round in 0..rounds as usize {
        world.barrier();
        for k in 0..paths.len() {
            let i = (round + k) % paths.len();
            let secs = once(paths[i], iters)?;
            samples[i].0.push(secs * 1e6);
        }
    }
    world.barrier();
    Ok(samples)
}

/// A `Vec<f32>` with spare room, owned by the exporter, and the element offset at which it
/// is `ALIGN`-aligned.
pub struct Aligned {
    /// The exporter's storage.
    pub owned: Owned<Elem>,
    off: usize,
}

impl Aligned {
    /// Room for `max_elems` aligned elements, all `fill`.
    pub fn new(max_elems: usize, fill: Elem) -> Self {
        let mut owned = Owned::new(vec![fill; max_elems + ALIGN / ELEM]);
        let addr = owned.as_slice().as_ptr() as usize;
        let off_bytes = (ALIGN - addr % ALIGN) % ALIGN;
        Aligned {
            owned,
            off: off_bytes / ELEM,
        }
    }

    /// Makes the exporter hand out `shape` with `strides` (elements; `None` = compact) whose
    /// first element is the aligned address, and checks that address.
    pub fn set_layout(self, shape: &[i64], strides: Option<&[i64]>) -> dlpack_mpi::Result<Self> {
        let mut out = self.set_layout_at(shape, strides, 0)?;
        let raw_addr = out.owned.as_slice()[out.off..].as_ptr() as usize;
        assert_eq!(raw_addr % ALIGN, 0, "buffer not {ALIGN}-byte aligned");
        Ok(out)
    }

    /// As [`Aligned::set_layout`], with the first element `first` elements after the aligned
    /// address (for negative strides, whose elements lie below the first).
    pub fn set_layout_at(
        self,
        shape: &[i64],
        strides: Option<&[i64]>,
        first: usize,
    ) -> dlpack_mpi::Result<Self> {
        let Aligned { owned, off } = self;
        let mut owned = owned.with_layout(shape, strides, ((off + first) * ELEM) as u64)?;
        let tensor_addr = {
            let t = acquire(&owned, &AcquireOptions::default())?;
            t.first_element_ptr() as usize
        };
        let raw_addr = owned.as_slice()[off + first..].as_ptr() as usize;
        assert_eq!(tensor_addr, raw_addr, "tensor and raw slice differ");
        Ok(Aligned { owned, off })
    }

    /// The first `n` storage elements from the aligned address.
    pub fn raw(&mut self, n: usize) -> &mut [Elem] {
        let off = self.off;
        &mut self.owned.as_mut_slice()[off..off + n]
    }
}
