//! Spans of the `tracing` crate (feature `tracing`): one per `execute` (and `submit`,
//! `wait`), per actor step, per method call, per fused stage and per collective inside it,
//! per value sent or received over an edge.
//!
//! Everything that opens a span goes through this module, so that the rest of the runtime
//! holds only its guard types and calls only its functions. Without the feature they are
//! zero-sized and empty, `#[inline(always)]`: the steps compile to what they were before
//! spans existed. The generated code never opens a span itself: a `#[cfg(feature)]` there
//! would test the feature of the user's crate, not this one's.
//!
//! The spans, their names and fields (all with target `actorgraph`, so that a filter such
//! as `actorgraph=info` selects them), are listed in the reference's tracing page.

#[cfg(feature = "tracing")]
pub(crate) use on::*;

#[cfg(not(feature = "tracing"))]
pub(crate) use off::*;

#[cfg(feature = "tracing")]
mod on {
    use std::fmt;

    use tracing::field::{display, Empty};
    use tracing::span::EnteredSpan;
    use tracing::{debug_span, info_span};

    pub(crate) use tracing::Span;

    use crate::comm::Collective;
    use crate::DType;

    /// A span entered on this thread until the guard drops.
    #[must_use]
    pub(crate) struct Guard {
        _entered: EnteredSpan,
    }

    /// The subscriber that was the calling thread's default where a graph was launched, for
    /// its actor threads to use: a subscriber set with `tracing::subscriber::with_default`
    /// (a test's, say) sees the actors' spans too, not only the driver's.
    #[derive(Clone)]
    pub(crate) struct Dispatch(Option<tracing::Dispatch>);

    /// Keeps a [`Dispatch`] the thread's default until it drops.
    pub(crate) struct DispatchGuard {
        _default: Option<tracing::dispatcher::DefaultGuard>,
    }

    impl Dispatch {
        /// The calling thread's default subscriber, unless it has none: an actor thread
        /// then uses the global one, even one set after the launch.
        pub(crate) fn current() -> Self {
            let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
            let none = dispatch.is::<tracing::subscriber::NoSubscriber>();
            Self((!none).then_some(dispatch))
        }

        /// Makes it the calling thread's default until the guard drops.
        pub(crate) fn enter(&self) -> DispatchGuard {
            DispatchGuard {
                _default: self.0.as_ref().map(tracing::dispatcher::set_default),
            }
        }
    }

    /// The graph's name in its `execute` spans.
    #[derive(Clone, Copy)]
    pub(crate) struct GraphName(&'static str);

    impl GraphName {
        pub(crate) fn of<G: ?Sized>() -> Self {
            let path = std::any::type_name::<G>();
            // The graph as its user wrote it, without the module path.
            let name = path.rsplit("::").next().unwrap_or(path);
            Self(name)
        }
        pub(crate) const UNNAMED: Self = Self("graph");
    }

    /// Which of the driver's calls a span is for.
    #[derive(Clone, Copy)]
    pub(crate) enum Call {
        Execute,
        Submit,
        Wait,
    }

    /// The span of one driver call; `execution` is recorded once known.
    pub(crate) fn driver(call: Call, graph: GraphName) -> Guard {
        let span = match call {
            Call::Execute => {
                info_span!(target: "actorgraph", "execute", graph = graph.0, execution = Empty)
            }
            Call::Submit => {
                info_span!(target: "actorgraph", "submit", graph = graph.0, execution = Empty)
            }
            Call::Wait => {
                info_span!(target: "actorgraph", "wait", graph = graph.0, execution = Empty)
            }
        };
        Guard {
            _entered: span.entered(),
        }
    }

    impl Guard {
        /// The span entered.
        pub(crate) fn span(&self) -> &Span {
            &self._entered
        }
    }

    /// An `execute` span for `execute_async`, whose future moves between polls: entered
    /// only while it is polled (see [`instrument`]).
    pub(crate) fn execute_async(graph: GraphName) -> Span {
        info_span!(target: "actorgraph", "execute", graph = graph.0, execution = Empty)
    }

    /// Runs `fut` inside `span` at each poll.
    pub(crate) fn instrument<F: std::future::Future>(
        fut: F,
        span: Span,
    ) -> impl std::future::Future<Output = F::Output> {
        tracing::Instrument::instrument(fut, span)
    }

    /// Records the execution (the ticket's index, from 0) of a driver call's span.
    pub(crate) fn execution(span: &Span, index: u64) {
        span.record("execution", index);
    }

    /// The span of one actor's step of execution `round` (counted from 1 by the actor).
    pub(crate) fn step(group: &'static str, rank: usize, round: u64) -> Guard {
        let execution = round.wrapping_sub(1);
        Guard {
            _entered: info_span!(target: "actorgraph", "step", group, rank, execution).entered(),
        }
    }

    /// The span of one method call; `actor` is the actor's type.
    pub(crate) fn method(
        group: &'static str,
        rank: usize,
        actor: &'static str,
        method: &'static str,
    ) -> Guard {
        Guard {
            _entered: info_span!(target: "actorgraph", "method", group, rank, actor, method)
                .entered(),
        }
    }

    /// The span of one fused stage, from its layout to its last output; what the stage
    /// carries is recorded at [`run`](crate::exec::Stage::run).
    pub(crate) fn stage(
        group: &'static str,
        rank: usize,
        stage: &'static str,
        values: &'static [&'static str],
    ) -> Guard {
        Guard {
            _entered: info_span!(
                target: "actorgraph",
                "stage",
                group,
                rank,
                stage,
                values = display(Names(values)),
                collective = Empty,
                op = Empty,
                root = Empty,
                slots = Empty,
                bytes = Empty,
                dtypes = Empty,
            )
            .entered(),
        }
    }

    /// The span of the collective itself (the agreement with the peers, and the data
    /// moved), inside its stage's span; records on both what the stage carries: its
    /// collective, reduction and root, its slots, its bytes and its elements per dtype.
    pub(crate) fn collective(
        stage: &Guard,
        collective: Collective,
        slots: &[crate::comm::SlotDesc],
    ) -> Guard {
        let stage: &Span = &stage._entered;
        let span = debug_span!(target: "actorgraph", "collective", collective = collective.name(), bytes = Empty);
        if stage.is_disabled() && span.is_disabled() {
            return Guard {
                _entered: span.entered(),
            };
        }
        let bytes: usize = slots.iter().map(|s| s.len * s.dtype.size()).sum();
        span.record("bytes", bytes);
        stage.record("collective", collective.name());
        match collective {
            Collective::AllReduce(op)
            | Collective::ReduceScatter(op)
            | Collective::Reduce { op, .. } => {
                stage.record("op", display(OpName(op)));
            }
            _ => {}
        }
        if let Some(root) = collective.root() {
            stage.record("root", root);
        }
        stage.record("slots", slots.len());
        stage.record("bytes", bytes);
        stage.record("dtypes", display(Dtypes(slots)));
        Guard {
            _entered: span.entered(),
        }
    }

    /// The span of sending a value over an edge to another actor: waiting, when the
    /// consumer has not taken the previous one, and handing it over.
    pub(crate) fn send(value: &'static str) -> Guard {
        Guard {
            _entered: debug_span!(target: "actorgraph", "send", value).entered(),
        }
    }

    /// The span of receiving a value over an edge from another actor: mostly waiting for
    /// the producer.
    pub(crate) fn recv(value: &'static str, from_group: &'static str) -> Guard {
        Guard {
            _entered: debug_span!(target: "actorgraph", "recv", value, from_group).entered(),
        }
    }

    /// The span of waiting for a fused stage that went on while the step ran other calls
    /// (see `StepCtx::complete`).
    pub(crate) fn complete(group: &'static str, rank: usize, stage: &'static str) -> Guard {
        Guard {
            _entered: info_span!(target: "actorgraph", "complete", group, rank, stage).entered(),
        }
    }

    struct OpName(crate::ReduceOp);

    impl fmt::Display for OpName {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(match self.0 {
                crate::ReduceOp::Sum => "sum",
                crate::ReduceOp::Prod => "prod",
                crate::ReduceOp::Min => "min",
                crate::ReduceOp::Max => "max",
                crate::ReduceOp::Avg => "avg",
            })
        }
    }

    /// A stage's values as the graph names them: `c1 c2`.
    struct Names(&'static [&'static str]);

    impl fmt::Display for Names {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            for (i, name) in self.0.iter().enumerate() {
                if i > 0 {
                    f.write_str(" ")?;
                }
                f.write_str(name)?;
            }
            Ok(())
        }
    }

    /// Elements per dtype, in the stage's region order: `f32:1030 i64:2`.
    struct Dtypes<'a>(&'a [crate::comm::SlotDesc]);

    impl fmt::Display for Dtypes<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let mut first = true;
            for dtype in DType::ALL {
                let mut of_dtype = self.0.iter().filter(|s| s.dtype == dtype).peekable();
                if of_dtype.peek().is_none() {
                    continue;
                }
                let n: usize = of_dtype.map(|s| s.len).sum();
                if !first {
                    f.write_str(" ")?;
                }
                first = false;
                write!(f, "{dtype}:{n}")?;
            }
            Ok(())
        }
    }
}

#[cfg(not(feature = "tracing"))]
mod off {
    use crate::comm::Collective;

    /// Nothing: the feature is off.
    #[must_use]
    pub(crate) struct Guard;

    impl Guard {
        #[inline(always)]
        pub(crate) fn span(&self) -> &Span {
            &Span
        }
    }

    /// Nothing: the feature is off.
    #[derive(Clone)]
    pub(crate) struct Span;

    /// Nothing: the feature is off.
    #[derive(Clone, Copy)]
    pub(crate) struct GraphName;

    /// Nothing: the feature is off. (`Clone` only, as with the feature: the launch clones
    /// it for each actor thread.)
    #[derive(Clone)]
    pub(crate) struct Dispatch;

    impl Dispatch {
        #[inline(always)]
        pub(crate) fn current() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn enter(&self) -> DispatchGuard {
            DispatchGuard
        }
    }

    /// Nothing: the feature is off.
    pub(crate) struct DispatchGuard;

    impl GraphName {
        #[inline(always)]
        #[allow(clippy::extra_unused_type_parameters)] // the graph's type names it with the feature
        pub(crate) fn of<G: ?Sized>() -> Self {
            Self
        }
        pub(crate) const UNNAMED: Self = Self;
    }

    #[derive(Clone, Copy)]
    pub(crate) enum Call {
        Execute,
        Submit,
        Wait,
    }

    #[inline(always)]
    pub(crate) fn driver(_: Call, _: GraphName) -> Guard {
        Guard
    }

    #[inline(always)]
    pub(crate) fn execute_async(_: GraphName) -> Span {
        Span
    }

    #[inline(always)]
    pub(crate) fn instrument<F: std::future::Future>(fut: F, _: Span) -> F {
        fut
    }

    #[inline(always)]
    pub(crate) fn execution(_: &Span, _: u64) {}

    #[inline(always)]
    pub(crate) fn step(_: &'static str, _: usize, _: u64) -> Guard {
        Guard
    }

    #[inline(always)]
    pub(crate) fn method(_: &'static str, _: usize, _: &'static str, _: &'static str) -> Guard {
        Guard
    }

    #[inline(always)]
    pub(crate) fn stage(
        _: &'static str,
        _: usize,
        _: &'static str,
        _: &'static [&'static str],
    ) -> Guard {
        Guard
    }

    #[inline(always)]
    pub(crate) fn send(_: &'static str) -> Guard {
        Guard
    }

    #[inline(always)]
    pub(crate) fn complete(_: &'static str, _: usize, _: &'static str) -> Guard {
        Guard
    }

    #[inline(always)]
    pub(crate) fn recv(_: &'static str, _: &'static str) -> Guard {
        Guard
    }

    #[inline(always)]
    pub(crate) fn collective(_: &Guard, _: Collective, _: &[crate::comm::SlotDesc]) -> Guard {
        Guard
    }
}
