//! Which actors an edge connects: the pure arithmetic of an edge's slots, by rank. An
//! [`Edge`](super::Edge) has one slot per producer -> consumer pair; a [`Route`] says how
//! many, which slots a producer fills, which one a consumer reads (or gathers from), and
//! whose each slot is.

/// Which actors an edge connects, by rank. Sizes are checked at `launch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Rank i of the producing group feeds rank i of the consuming group (equal sizes).
    Zip,
    /// Rank `from` feeds every rank of the consuming group. With `skip_from` (producer and
    /// consumer are one group), rank `from` keeps its own value and gets no message.
    Fan {
        /// The producing rank.
        from: usize,
        /// Whether the consumer with rank `from` is the producer itself.
        skip_from: bool,
    },
    /// Rank `from` feeds rank `to`, and nobody else.
    One {
        /// The producing rank.
        from: usize,
        /// The consuming rank.
        to: usize,
    },
    /// Every producing rank feeds consumer `to`, which gets the values in rank order (a
    /// gather: one slot per producer). With `keep` (producer and consumer are one group),
    /// rank `to` keeps its own value and gets no message.
    Gather {
        /// The consuming rank.
        to: usize,
        /// Whether the consumer is producing rank `to` itself.
        keep: bool,
    },
    /// Every producing rank feeds every rank of another group, which gets the values in
    /// rank order (a gather to a group: one slot per producer and consumer, consumer c's
    /// from `c * producers`).
    GatherAll {
        /// The number of producing ranks.
        producers: usize,
    },
    /// Producer `from` splits a `Vec` over the consumers, the k-th value to rank k (a
    /// scatter: one slot per consumer). With `keep` (producer and consumer are one group),
    /// rank `from` keeps its own value and sends itself no message.
    Scatter {
        /// The producing rank.
        from: usize,
        /// Whether the consumer with rank `from` is the producer itself.
        keep: bool,
    },
}

impl Route {
    /// The number of slots for a consuming group of `consumers` actors.
    #[inline]
    pub(super) fn slots(self, consumers: usize) -> usize {
        match self {
            Route::Zip | Route::Fan { .. } | Route::Gather { .. } | Route::Scatter { .. } => {
                consumers
            }
            Route::One { .. } => 1,
            Route::GatherAll { producers } => consumers * producers,
        }
    }

    /// The slots producer `rank` fills.
    #[inline]
    pub(super) fn outgoing(self, rank: usize, n: usize) -> impl Iterator<Item = usize> {
        let range = match self {
            Route::Zip if rank < n => rank..rank + 1,
            Route::Fan { from, .. } | Route::Scatter { from, .. } if from == rank => 0..n,
            Route::One { from, .. } if from == rank => 0..1,
            Route::Gather { .. } if rank < n => rank..rank + 1,
            Route::GatherAll { producers } if rank < producers => rank..n,
            _ => 0..0,
        };
        // A producer of a gather to a group fills one slot per consumer, `producers` apart.
        let step = match self {
            Route::GatherAll { producers } => producers.max(1),
            _ => 1,
        };
        let skip = match self {
            Route::Fan {
                from,
                skip_from: true,
            } => Some(from),
            Route::Gather { to, keep: true } => Some(to),
            Route::Scatter { from, keep: true } => Some(from),
            _ => None,
        };
        range.step_by(step).filter(move |&s| Some(s) != skip)
    }

    /// The slot consumer `rank` reads, if it reads one.
    #[inline]
    pub(super) fn incoming(self, rank: usize, n: usize) -> Option<usize> {
        match self {
            Route::Zip if rank < n => Some(rank),
            Route::Fan {
                from,
                skip_from: keep,
            }
            | Route::Scatter { from, keep }
                if rank < n && !(keep && rank == from) =>
            {
                Some(rank)
            }
            Route::One { to, .. } if to == rank => Some(0),
            _ => None,
        }
    }

    /// The slots consumer `rank` gathers from, in rank order ([`Route::Gather`] only),
    /// with the slot it keeps its own value for instead.
    #[inline]
    pub(super) fn gathered(
        self,
        rank: usize,
        n: usize,
    ) -> Option<(std::ops::Range<usize>, Option<usize>)> {
        match self {
            Route::Gather { to, keep } if to == rank => Some((0..n, keep.then_some(to))),
            Route::GatherAll { producers } if (rank + 1) * producers <= n => {
                Some((rank * producers..(rank + 1) * producers, None))
            }
            _ => None,
        }
    }

    /// The consuming rank of slot `slot`.
    #[inline]
    pub(super) fn consumer(self, slot: usize) -> usize {
        match self {
            Route::Zip | Route::Fan { .. } | Route::Scatter { .. } => slot,
            Route::One { to, .. } | Route::Gather { to, .. } => to,
            Route::GatherAll { producers } => slot / producers.max(1),
        }
    }

    /// Whether slot `slot` carries no message: its consumer keeps its own value.
    #[inline]
    pub(super) fn unused(self, slot: usize) -> bool {
        match self {
            Route::Fan {
                from,
                skip_from: true,
            }
            | Route::Scatter { from, keep: true } => slot == from,
            Route::Gather { to, keep: true } => slot == to,
            _ => false,
        }
    }

    /// The producing rank of slot `slot`.
    #[inline]
    pub(super) fn producer(self, slot: usize) -> usize {
        match self {
            Route::Zip | Route::Gather { .. } => slot,
            Route::GatherAll { producers } => slot % producers.max(1),
            Route::Fan { from, .. } | Route::One { from, .. } | Route::Scatter { from, .. } => from,
        }
    }
}
