//! The sweeps' measurement driver: a warm-up, the size of the batches a latency sample is
//! taken over, then `--rounds` rounds of every path in an order rotated from round to round,
//! each round timed as a whole (its mean) and in batches (the samples of p50 and p99); under
//! `--check`, every iteration run alone, timed, and its received values checked after it.
//! Uses `common`.

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::common::{Samples, SAMPLE_MIN_SECS};

/// How one call of a path runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// `iters` iterations, timed as a whole and in batches of `batch` iterations.
    Timed {
        /// Iterations.
        iters: u64,
        /// Iterations per batch.
        batch: u64,
    },
    /// One iteration, timed, into receive buffers filled beforehand with a value no rank
    /// sends; after it (untimed) the received values are checked element by element.
    Checked {
        /// The test hook `--inject-wrong`: before the check, overwrite the first received
        /// element with a value no rank sends, as if it had arrived wrong.
        spoil: bool,
    },
}

/// What one call of a path measured.
#[derive(Debug, Default)]
pub struct Timing {
    /// Seconds per message (per call) of the whole call: rank 0's for point-to-point, the
    /// slowest rank's for collectives (0 on the ranks that do not time).
    pub secs: f64,
    /// Seconds per message of every batch of [`Run::Timed`], same convention.
    pub batches: Vec<f64>,
    /// [`Run::Checked`]: this rank's first wrong element, if any.
    pub problem: Option<String>,
}

/// What the sweep's measurement of one path gave.
#[derive(Debug, Default, Clone)]
pub struct Sampled {
    /// µs per message, the mean of every round.
    pub rounds: Samples,
    /// µs per message of every sample (the mean of one batch).
    pub samples: Samples,
}

/// What [`measure`] measures.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Rounds (`--rounds`).
    pub rounds: u32,
    /// Iterations per round.
    pub iters: u64,
    /// `--check`: every iteration run alone and checked.
    pub check: bool,
    /// The hidden `--inject-wrong ITER`: under `--check`, iteration ITER of the first round's
    /// first path (raw) is reported wrong.
    pub spoil: Option<u64>,
    /// Messages (or calls) per iteration: [`Timing::secs`] × this = seconds per iteration.
    pub msgs_per_iter: f64,
}

/// What [`measure`] returns.
#[derive(Debug)]
pub struct Measured {
    /// Per path, in the order of the paths given.
    pub paths: Vec<Sampled>,
    /// Iterations per sample.
    pub batch: u64,
    /// `--check`: every wrong iteration on this rank, the round and iteration named.
    pub problems: Vec<String>,
}

/// Warm-up (one call of every path with `iters / 5`, at least 2, iterations), the batch size
/// ([`batch_for`], 1 under `--check`), then `plan.rounds` rounds of every path of `paths`,
/// the order rotated from round to round, with a barrier before each round. Under `--check`
/// a round of a path is `plan.iters` calls of [`Run::Checked`]: the round's mean is that of
/// its iterations' times (the checks and the barrier before each iteration are outside
/// them) and every iteration is a sample.
pub fn measure<P: Copy, E>(
    world: &SimpleCommunicator,
    plan: &Plan,
    paths: &[P],
    mut run: impl FnMut(P, Run) -> Result<Timing, E>,
) -> Result<Measured, E> {
    let warm = (plan.iters / 5).max(2);
    let mut fastest = f64::INFINITY;
    for &p in paths {
        let t = run(
            p,
            Run::Timed {
                iters: warm,
                batch: warm,
            },
        )?;
        fastest = fastest.min(t.secs);
    }
    let batch = if plan.check {
        1
    } else {
        batch_for(world, fastest * plan.msgs_per_iter, plan.iters)
    };
    let mut out = vec![Sampled::default(); paths.len()];
    let mut problems = Vec::new();
    for round in 0..plan.rounds as usize {
        world.barrier();
        for k in 0..paths.len() {
            let i = (round + k) % paths.len();
            let s = &mut out[i];
            if !plan.check {
                let t = run(
                    paths[i],
                    Run::Timed {
                        iters: plan.iters,
                        batch,
                    },
                )?;
                s.rounds.0.push(t.secs * 1e6);
                s.samples.0.extend(t.batches.iter().map(|b| b * 1e6));
                continue;
            }
            let mut sum = 0.0;
            for it in 0..plan.iters {
                let spoil = round == 0 && k == 0 && plan.spoil == Some(it + 1);
                let t = run(paths[i], Run::Checked { spoil })?;
                sum += t.secs;
                s.samples.0.push(t.secs * 1e6);
                problems.extend(
                    t.problem.map(|m| {
                        format!("{m} (--check: round {}, iteration {})", round + 1, it + 1)
                    }),
                );
            }
            s.rounds.0.push(sum / plan.iters as f64 * 1e6);
        }
    }
    world.barrier();
    Ok(Measured {
        paths: out,
        batch,
        problems,
    })
}

/// Iterations per sample for iterations of `iter_secs` (rank 0's word, on every rank): 1
/// when an iteration lasts at least [`SAMPLE_MIN_SECS`], else the fewest that last that
/// long, at most `iters` (then a sample is a round).
fn batch_for(world: &SimpleCommunicator, iter_secs: f64, iters: u64) -> u64 {
    let mut batch = if iter_secs >= SAMPLE_MIN_SECS {
        1
    } else if iter_secs > 0.0 {
        (SAMPLE_MIN_SECS / iter_secs).ceil() as u64
    } else {
        iters
    }
    .clamp(1, iters.max(1));
    world.process_at_rank(0).broadcast_into(&mut batch);
    batch
}
