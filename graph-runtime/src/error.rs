//! The one public error type of actorgraph.

/// A boxed error returned by a fallible actor method.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong when building or running a graph.
///
/// Each variant says what happened and where: the actor group, the rank and the method or
/// stage involved. Errors that come from one rank of a collective are agreed on by every
/// rank first, so one failing actor never leaves the others waiting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `launch` was given an actor group with no actors.
    #[error("actor group `{group}` is empty: launch needs at least one actor")]
    EmptyGroup {
        /// The group's name in the graph.
        group: &'static str,
    },

    /// Two groups whose values are zipped into one output have different sizes.
    #[error("actor groups `{first}` ({first_len} actors) and `{second}` ({second_len} actors) feed one output and must have the same size")]
    GroupSizeMismatch {
        /// The first group.
        first: &'static str,
        /// Its number of actors.
        first_len: usize,
        /// The second group.
        second: &'static str,
        /// Its number of actors.
        second_len: usize,
    },

    /// A per-actor value of one group is read by another group of a different size: actor
    /// i of the producing group feeds actor i of the consuming one, so their sizes must be
    /// equal. `launch` checks it.
    #[error("value `{value}` of group `{from}` ({from_len} actors) is read by group `{to}` ({to_len} actors): actor i of one feeds actor i of the other, so both groups must have the same size (between groups of different sizes, read one rank's value, `{value}[k]`, or every rank's on one actor, `gather({value})`)")]
    EdgeSizeMismatch {
        /// The value, as named in the graph.
        value: &'static str,
        /// The group that produces it.
        from: &'static str,
        /// Its number of actors.
        from_len: usize,
        /// The group that reads it.
        to: &'static str,
        /// Its number of actors.
        to_len: usize,
    },

    /// The graph addresses one actor (`workers[3].method(..)`) that its group does not have.
    /// `launch` checks it (a group declared with a fixed size, `[Worker; 2]`, gets a compile
    /// error instead).
    #[error("the graph uses `{group}[{index}]`, but group `{group}` has {size} actors (ranks 0..{size})")]
    IndexOutOfRange {
        /// The actor group.
        group: &'static str,
        /// The index used.
        index: usize,
        /// The number of actors in the group.
        size: usize,
    },

    /// A per-rank input (`batch: PerRank<T>`) was given to `execute` with another number of
    /// values than its group has actors; the execution is not started, and the next one
    /// runs as usual.
    #[error("per-rank input `{input}` has {got} values, but group `{group}` that reads it has {expected} actors (one value per rank)")]
    PerRankLength {
        /// The input, as named in the graph.
        input: &'static str,
        /// The group that reads it.
        group: &'static str,
        /// The number of actors in the group.
        expected: usize,
        /// The number of values given.
        got: usize,
    },

    /// An output holds a value of one actor at its rank, zipped with the per-actor values
    /// of another group, and that group has no such rank. `launch` checks it.
    #[error("output value `{value}` is `Some` at rank {rank}, but the output has one entry per actor of group `{group}` ({size} actors)")]
    OutputRank {
        /// The value, as written in the graph.
        value: &'static str,
        /// The rank of the actor that holds it.
        rank: usize,
        /// The group whose per-actor values the output zips.
        group: &'static str,
        /// Its number of actors.
        size: usize,
    },

    /// A `scatter(v)` in the graph got a `Vec` without one value per actor of the group it
    /// is split over. The producing actor fails; its consumers skip this execution.
    #[error("`{value}` on rank {rank} of group `{group}` got {got} values for {expected} actors (one value per rank)")]
    ScatterLength {
        /// The scatter, as written in the graph (`scatter(shards)`).
        value: &'static str,
        /// The group that produced it.
        group: &'static str,
        /// The rank that produced it.
        rank: usize,
        /// The number of actors it is split over.
        expected: usize,
        /// The number of values it held.
        got: usize,
    },

    /// A tensor's data length does not match its shape.
    #[error("tensor shape {shape:?} holds {expected} elements but {got} were given")]
    ShapeData {
        /// The requested shape.
        shape: Vec<usize>,
        /// The number of elements the shape holds.
        expected: usize,
        /// The number of elements given.
        got: usize,
    },

    /// An actor method returned `Err`.
    #[error("method `{method}` failed on rank {rank} of group `{group}`: {source}")]
    Method {
        /// The actor group.
        group: &'static str,
        /// The rank of the actor in its group.
        rank: usize,
        /// The method that failed.
        method: &'static str,
        /// The method's own error.
        source: BoxError,
    },

    /// Code running on an actor thread panicked; the actor is poisoned from then on.
    #[error("{} panicked on rank {rank} of group `{group}`: {message}", fmt_method(.method))]
    Panic {
        /// The actor group.
        group: &'static str,
        /// The rank of the actor in its group.
        rank: usize,
        /// The method that panicked, or `None` when the panic came from the graph's own code
        /// (for example a user's `Bucketable` impl).
        method: Option<&'static str>,
        /// The panic message.
        message: String,
    },

    /// An actor panicked in an earlier execution, so its state may be torn.
    #[error("actor {rank} of group `{group}` is poisoned: it panicked in an earlier execution ({message})")]
    Poisoned {
        /// The actor group.
        group: &'static str,
        /// The rank of the poisoned actor.
        rank: usize,
        /// The message of the panic that poisoned it.
        message: String,
    },

    /// The ranks of a fused collective stage disagreed on the dtype, the element count or
    /// the shape of one value (every dimension counts, but the first for `allgather`), or
    /// of one item of a value that is a list.
    #[error("shape mismatch in stage `{stage}`, {}: {}", fmt_value(.value, *.slot, *.item), fmt_counts(.counts, .shapes))]
    ShapeMismatch {
        /// The stage, as written in the graph.
        stage: &'static str,
        /// The value, as written in the graph (e.g. `g`, or `workers.grad(..)`); empty
        /// when not known (a stage driven by hand).
        value: &'static str,
        /// The position of the value in the stage's bucket.
        slot: usize,
        /// When the value is a list whose items travel one by one (a `Vec` of tensors),
        /// the position in it of the item that disagreed; `None` for any other value.
        /// `counts` and `shapes` are then that item's.
        item: Option<usize>,
        /// Each rank's `(dtype, element count)` for that value, indexed by rank.
        counts: Vec<(crate::DType, usize)>,
        /// Each rank's shape for that value, indexed by rank (empty for a value without a
        /// shape beyond its length: a scalar, a `Vec` of numbers).
        shapes: Vec<Vec<usize>>,
    },

    /// The ranks of a fused collective stage hold lists of different lengths for one value
    /// (a `Vec` of tensors, whose items travel one by one); found before any item is
    /// compared.
    #[error("list length mismatch in stage `{stage}`, {}: {}", fmt_value(.value, *.slot, *.item), fmt_lens(.lens))]
    LengthMismatch {
        /// The stage, as written in the graph.
        stage: &'static str,
        /// The value, as written in the graph; empty when not known (a stage driven by
        /// hand).
        value: &'static str,
        /// The position of the value in the stage's bucket.
        slot: usize,
        /// When the list is inside an item of a value that is itself a list
        /// (`Vec<Vec<Tensor<f32>>>`), the position of that item; `None` when the list is
        /// the value, or a part of a struct.
        item: Option<usize>,
        /// Each rank's number of items, indexed by rank.
        lens: Vec<usize>,
    },

    /// The ranks of a fused stage put different numbers of values in their buckets.
    #[error("stage `{stage}`: ranks put different numbers of values in the bucket ({counts:?})")]
    BucketMismatch {
        /// The stage, as written in the graph.
        stage: &'static str,
        /// Each rank's number of values, indexed by rank.
        counts: Vec<usize>,
    },

    /// A value of a `reducescatter` stage cannot be split evenly over the ranks: its length
    /// along its first dimension (its element count, for a flat value) is not a multiple of
    /// the number of ranks. Agreed on by every rank before any data moves.
    #[error("stage `{stage}`, slot {slot}: a length of {len} cannot be split evenly over {ranks} ranks; `reducescatter` needs each value's first dimension to be a multiple of the number of ranks")]
    NotDivisible {
        /// The stage, as written in the graph.
        stage: &'static str,
        /// The position of the value in the stage's bucket.
        slot: usize,
        /// Its length along the dimension it is split on.
        len: usize,
        /// The number of ranks.
        ranks: usize,
    },

    /// A rooted collective (`broadcast`, `reduce`) names a root that is not a rank of its
    /// group. `launch` checks it, so a graph never starts with such a stage.
    #[error("stage `{stage}` of group `{group}` has root {root}, but the group has {size} actors (ranks 0..{size})")]
    RootOutOfRange {
        /// The actor group.
        group: &'static str,
        /// The stage, as written in the graph.
        stage: &'static str,
        /// The root given.
        root: usize,
        /// The number of actors in the group.
        size: usize,
    },

    /// This rank skipped its work because rank `failed_rank` of its group failed first.
    ///
    /// `execute` reports the root cause instead; this variant only surfaces on its own when a
    /// custom communicator reports a failure without one.
    #[error("rank {rank} of group `{group}` stopped because rank {failed_rank} failed")]
    Aborted {
        /// The actor group.
        group: &'static str,
        /// The rank that stopped.
        rank: usize,
        /// The rank that failed.
        failed_rank: usize,
    },

    /// This rank stopped because a value it needed comes from an actor that failed in this
    /// execution (or did not run it).
    ///
    /// `execute` reports the producer's own error instead; this variant only surfaces on its
    /// own when that error is lost (e.g. a custom communicator reported none).
    #[error("rank {rank} of group `{group}` stopped: value `{value}` from rank {from_rank} of group `{from_group}` was not produced, because that actor failed")]
    Upstream {
        /// The actor group of the rank that stopped.
        group: &'static str,
        /// The rank that stopped.
        rank: usize,
        /// The value it was waiting for, as named in the graph.
        value: &'static str,
        /// The group that produces the value.
        from_group: &'static str,
        /// The rank that failed to produce it.
        from_rank: usize,
    },

    /// An actor thread is gone (it could not be spawned or it died).
    #[error("actor {rank} of group `{group}` is gone: {reason}")]
    ActorLost {
        /// The actor group.
        group: &'static str,
        /// The rank of the actor.
        rank: usize,
        /// What happened to it.
        reason: String,
    },

    /// An execution did not finish in time.
    #[error("execution timed out after {timeout:?} in group `{group}`: ranks {ranks:?} had not finished their methods (ranks {waiting:?} were waiting for other actors, in a collective or for a value); the graph is now broken")]
    Timeout {
        /// The group that did not finish.
        group: &'static str,
        /// The ranks that were still in their own code (a method), in order: the cause.
        /// Empty when every late rank was waiting for a value of another group (whose own
        /// `Timeout` names the culprits). Global ranks: over MPI, those of every process.
        ranks: Vec<usize>,
        /// The ranks that were waiting for other actors: in a collective, or on an edge
        /// (global ranks, of every process, like `ranks`).
        waiting: Vec<usize>,
        /// The timeout that passed.
        timeout: std::time::Duration,
    },

    /// The graph cannot run any more (after a timeout or a lost actor thread); only
    /// `teardown` is left.
    #[error("actor group `{group}` is broken: {reason}")]
    Broken {
        /// The broken group.
        group: &'static str,
        /// What broke it.
        reason: String,
    },

    /// A backend or communicator failed.
    #[error("backend error: {0}")]
    Backend(String),

    /// `submit` (or an `execute`) found `max_in_flight` executions already submitted whose
    /// results have not been read: wait for the oldest ticket first. Nothing was submitted;
    /// the graph is unchanged.
    #[error("{max_in_flight} executions are already in flight (the most this graph was launched with); wait for a ticket before submitting another")]
    InFlightFull {
        /// The bound set at launch ([`LaunchOptions::max_in_flight`](crate::LaunchOptions::max_in_flight)).
        max_in_flight: usize,
    },

    /// `wait` was given a ticket that another graph issued. The graph is unchanged.
    #[error("this ticket was issued by another graph")]
    ForeignTicket,

    /// A shared library the NCCL backend needs (libcuda, libnccl) could not be opened.
    /// Nothing was called; the process is unchanged.
    #[error("{library} could not be loaded (looked for {searched:?}): {hint}")]
    LibraryMissing {
        /// The library, as a user knows it (e.g. "NCCL (libnccl)").
        library: &'static str,
        /// The file names that were tried.
        searched: Vec<String>,
        /// What to install or set to fix it.
        hint: String,
    },

    /// A GPU was asked for that this machine does not have.
    #[error("GPU {ordinal} was asked for, but this machine has {count} GPU(s)")]
    NoSuchDevice {
        /// The device ordinal asked for.
        ordinal: usize,
        /// The number of GPUs the driver reports.
        count: usize,
    },

    /// A CUDA driver or NCCL call failed.
    #[error("{call} failed: {message}")]
    Gpu {
        /// The call, e.g. `cuMemAlloc` or `ncclAllReduce`.
        call: &'static str,
        /// The library's own description of the failure.
        message: String,
    },

    /// An actor's constructor (see [`Actors::try_each`](crate::Actors::try_each)) failed or
    /// panicked on its thread; `launch` started no execution.
    #[error("actor {rank} of group `{group}` could not be made: {source}")]
    ActorInit {
        /// The group's name in the graph.
        group: &'static str,
        /// The actor's rank.
        rank: usize,
        /// What the constructor returned, or the panic's message.
        source: BoxError,
    },

    /// A group of fixed size (`workers: [Worker; N]`) was launched with another number of
    /// actors.
    #[error(
        "actor group `{group}` has a fixed size of {expected} actors, but launch was given {got}"
    )]
    GroupSize {
        /// The group's name in the graph.
        group: &'static str,
        /// The size the graph declares.
        expected: usize,
        /// The number of actors given.
        got: usize,
    },

    /// A tensor is not where an operation needs it: a GPU tensor given to the CPU
    /// communicator, or read as a host slice, or a tensor of another GPU than the actor's.
    #[error("{0}")]
    Placement(String),

    /// A value whose type a collective takes, but whose run-time kind it cannot: a candle
    /// tensor of a dtype that has no actorgraph element type (feature `candle`).
    #[error("{0}")]
    Unsupported(String),

    /// The processes of a launch over MPI did not all launch the same graph: another graph,
    /// the same one over other types, or in another order (feature `mpi`).
    #[error("process {process} launched another graph than `{graph}` (its fingerprint differs from process 0's): every process must launch the same graphs in the same order")]
    GraphMismatch {
        /// The graph this process launched.
        graph: &'static str,
        /// The lowest process whose graph differs from process 0's.
        process: usize,
    },

    /// A process of a launch over MPI gave a group no actor: every process hosts at least
    /// one actor of every group (feature `mpi`).
    #[error("process {process} gave group `{group}` no actor: under MPI every process hosts at least one actor of every group")]
    ProcessLayout {
        /// The group.
        group: &'static str,
        /// The lowest process that gave it none.
        process: usize,
    },

    /// Another process of a launch over MPI could not launch its part of the graph, so
    /// this one's launch fails too (feature `mpi`).
    #[error("process {process} could not launch graph `{graph}`: {reason}")]
    ProcessLaunch {
        /// The graph.
        graph: &'static str,
        /// The lowest process whose launch failed.
        process: usize,
        /// Its error.
        reason: String,
    },

    /// An edge of the graph carries a value from an actor of one process to an actor of
    /// another, and the value's type can travel neither through `Travel` nor (feature
    /// `serde`) through serde: a `launch` error, the same on every process (feature `mpi`).
    #[error("value `{value}` (type `{ty}`) goes from group `{from_group}` to group `{to_group}` across processes, and its type cannot travel: implement `actorgraph::travel::Travel` for it, or enable feature `serde` and derive `Serialize` and `Deserialize`")]
    CannotTravel {
        /// The value, as the graph names it.
        value: &'static str,
        /// Its type, as `std::any::type_name` spells it.
        ty: &'static str,
        /// The group that produces it.
        from_group: &'static str,
        /// The group that reads it.
        to_group: &'static str,
    },

    /// A value on its way between processes could not be written by its sender or read
    /// by its receiver: its `Travel` or serde implementation failed or panicked (feature
    /// `mpi`). The same error on every process; the graph stays usable.
    #[error(
        "value `{value}` could not cross processes on rank {rank} of group `{group}`: {reason}"
    )]
    Travel {
        /// The group of the rank where it failed: the producer's when writing, the
        /// consumer's when reading.
        group: &'static str,
        /// That rank.
        rank: usize,
        /// The value, as the graph names it.
        value: &'static str,
        /// What failed.
        reason: String,
    },
}

/// The error of an actor method on another process, as this process learns it (under
/// MPI, the `source` of an [`Error::Method`] of a rank hosted elsewhere): its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RemoteError(pub String);

fn fmt_method(method: &Option<&'static str>) -> String {
    match method {
        Some(m) => format!("method `{m}`"),
        None => "the actor step".to_string(),
    }
}

fn fmt_value(value: &str, slot: usize, item: Option<usize>) -> String {
    let value = if value.is_empty() {
        format!("slot {slot}")
    } else {
        format!("value `{value}` (slot {slot})")
    };
    match item {
        Some(item) => format!("item {item} of {value}"),
        None => value,
    }
}

fn fmt_lens(lens: &[usize]) -> String {
    let each = lens
        .iter()
        .enumerate()
        .map(|(rank, &n)| format!("rank {rank} has {n} item{}", if n == 1 { "" } else { "s" }));
    each.collect::<Vec<_>>().join(", ")
}

fn fmt_counts(counts: &[(crate::DType, usize)], shapes: &[Vec<usize>]) -> String {
    let each = counts.iter().enumerate().map(|(rank, (dtype, n))| {
        match shapes.get(rank).filter(|s| !s.is_empty()) {
            Some(shape) => format!("rank {rank} has {dtype} {shape:?}"),
            None => format!("rank {rank} has {n} x {dtype}"),
        }
    });
    each.collect::<Vec<_>>().join(", ")
}

impl Error {
    /// The rank whose own failure this error is (a method's error or panic, a poisoned
    /// actor, a value that could not travel or be scattered), if it is one.
    pub(crate) fn failed_rank(&self) -> Option<usize> {
        match self {
            Error::Method { rank, .. }
            | Error::Panic { rank, .. }
            | Error::Poisoned { rank, .. }
            | Error::Travel { rank, .. }
            | Error::ScatterLength { rank, .. } => Some(*rank),
            _ => None,
        }
    }

    /// Whether this error is the cause of a failure rather than a rank stopping because of
    /// another rank's failure.
    pub(crate) fn is_root_cause(&self) -> bool {
        !matches!(
            self,
            Error::Aborted { .. } | Error::Broken { .. } | Error::Upstream { .. }
        )
    }

    /// A timeout of a group that was only waiting for another group's values.
    fn is_waiting_timeout(&self) -> bool {
        matches!(self, Error::Timeout { ranks, .. } if ranks.is_empty())
    }

    /// The error an execution of a graph reports, given each group's error: the first root
    /// cause (a timeout of a group that only waited for another comes last), else the first
    /// error. `None` when there is none.
    pub(crate) fn root_cause(errors: impl IntoIterator<Item = Error>) -> Option<Error> {
        let mut best: Option<(u8, Error)> = None;
        for e in errors {
            let score = match (e.is_root_cause(), e.is_waiting_timeout()) {
                (true, false) => 2,
                (true, true) => 1,
                (false, _) => 0,
            };
            if best.as_ref().is_none_or(|(b, _)| score > *b) {
                best = Some((score, e));
            }
        }
        best.map(|(_, e)| e)
    }
}

/// Runs user code `f`; a panic in it is `Err` with its message ("it panicked: ..."). The
/// payload is forgotten, not dropped: its own drop could panic.
pub(crate) fn caught<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let message = panic_message(&*payload);
        std::mem::forget(payload);
        format!("it panicked: {message}")
    })
}

/// The message of a caught panic's payload (a `&str` or a `String`, as `panic!` makes).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".to_string()
    }
}
