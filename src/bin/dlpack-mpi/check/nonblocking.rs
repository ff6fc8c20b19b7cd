//! How a case calls its operation ([`Call`]): the blocking method, or the nonblocking one
//! posted in an rsmpi scope ([`mpi::request::scope`]) and completed there by `wait` or by a
//! `test` loop ([`Completion`]).

use dlpack_mpi::comm::TensorRequest;
use dlpack_mpi::Error;
use mpi::request::LocalScope;

/// How a case calls its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// The blocking `TensorComm` method.
    Blocking,
    /// The nonblocking method (`immediate_…`), posted in an rsmpi scope and completed in it.
    Nonblocking(Completion),
}

/// How a rank completes a nonblocking case's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Completion {
    /// [`TensorRequest::wait`].
    Wait,
    /// [`TensorRequest::test`] until the request completes, yielding the processor between
    /// tests (so that ranks oversubscribing the cores progress).
    Test,
}

impl Completion {
    /// How rank `rank` completes its request in a case of `len` elements: with a `test`
    /// loop when `rank + len` is odd, else with `wait`. Each rank completes its own request,
    /// so at two ranks or more every case has ranks of both kinds; at one rank the cases of
    /// odd length (1 and 7 by default) test.
    pub(super) fn of(rank: i32, len: i64) -> Completion {
        if (i64::from(rank) + len) % 2 == 1 {
            Completion::Test
        } else {
            Completion::Wait
        }
    }

    /// Posts a request with `post` in a new rsmpi scope and completes it (this rank's
    /// refusal of its own arguments comes from the post; a peer's, `PeerRefused`, from the
    /// completion).
    pub(super) fn post<'a, F>(self, post: F) -> Result<(), Error>
    where
        F: for<'s> FnOnce(
            &'s LocalScope<'a>,
        ) -> Result<TensorRequest<'a, &'s LocalScope<'a>>, Error>,
    {
        mpi::request::scope(|scope| {
            let mut request = post(scope)?;
            match self {
                Completion::Wait => request.wait().map(drop),
                Completion::Test => loop {
                    match request.test() {
                        Ok(done) => return done.map(drop),
                        Err(pending) => request = pending,
                    }
                    std::thread::yield_now();
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_alternates_with_rank_and_length() {
        assert_eq!(Completion::of(0, 0), Completion::Wait);
        assert_eq!(Completion::of(0, 7), Completion::Test);
        assert_eq!(Completion::of(1, 1000), Completion::Test);
        assert_eq!(Completion::of(1, 7), Completion::Wait);
    }
}
