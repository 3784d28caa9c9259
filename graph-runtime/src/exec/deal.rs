//! How one execution's inputs reach the actors of one group: a graph input every actor
//! reads is cloned for each (the last one gets the value itself), and a per-rank input
//! (`batch: PerRank<T>` in the graph's parameters, a `Vec<T>` given to `execute`) hands its
//! k-th element to rank k, moved, so no element is copied and nothing is allocated.

use crate::Error;

/// A group's per-actor input type and how one execution's input for the whole group is
/// handed out to its actors.
pub trait Deal: Sized + Send + 'static {
    /// One execution's input for the whole group, as the driver hands it over.
    type Whole;

    /// An error if `whole` cannot give each of the `n` actors of `group` its input (a
    /// per-rank input of another length). The driver checks every group before it hands
    /// anything out, so a refused execution reaches no actor.
    fn check(whole: &Self::Whole, group: &'static str, n: usize) -> Result<(), Error>;

    /// Hands each rank `0..n`, in order, its input: `put(rank, input)`.
    fn deal(whole: Self::Whole, n: usize, put: impl FnMut(usize, Self));
}

/// The inputs every actor reads: a clone each, the value itself to the last.
impl<S: Clone + Send + 'static> Deal for S {
    type Whole = S;

    fn check(_: &S, _: &'static str, _: usize) -> Result<(), Error> {
        Ok(())
    }

    fn deal(whole: S, n: usize, mut put: impl FnMut(usize, S)) {
        let mut whole = Some(whole);
        for rank in 0..n {
            let value = if rank + 1 == n {
                whole.take()
            } else {
                whole.clone()
            };
            if let Some(value) = value {
                put(rank, value);
            }
        }
    }
}

/// One actor's input in a group that reads per-rank inputs: the shared inputs `S` (a
/// tuple, cloned for each actor) and its own element of each per-rank input (`P`, a list
/// `(T1, (T2, ()))`). Not `Clone`: an element is moved to its actor, never copied.
pub struct RankInputs<S, P> {
    /// The inputs every actor reads.
    pub shared: S,
    /// This actor's element of each per-rank input.
    pub own: P,
}

impl<S, P> Deal for RankInputs<S, P>
where
    S: Clone + Send + 'static,
    P: Elements,
{
    type Whole = (S, P::Lists);

    fn check((_, lists): &Self::Whole, group: &'static str, n: usize) -> Result<(), Error> {
        P::check(lists, group, n)
    }

    fn deal((shared, lists): Self::Whole, n: usize, mut put: impl FnMut(usize, Self)) {
        let mut lists = P::iters(lists);
        S::deal(shared, n, |rank, shared| {
            // `check` ran first: every list has an element for every rank.
            if let Some(own) = P::next(&mut lists) {
                put(rank, RankInputs { shared, own });
            }
        });
    }
}

/// One per-rank input of one execution: its name in the graph, for the length error, and
/// its values by rank.
pub struct PerRankValues<T> {
    input: &'static str,
    values: Vec<T>,
}

impl<T> PerRankValues<T> {
    /// The values of per-rank input `input`, by rank.
    pub fn new(input: &'static str, values: Vec<T>) -> Self {
        Self { input, values }
    }
}

/// A list of per-rank elements `(T1, (T2, ()))`, one per per-rank input a group reads.
pub trait Elements: Send + 'static + Sized {
    /// The inputs of the whole group: `(PerRankValues<T1>, (PerRankValues<T2>, ()))`.
    type Lists;
    /// Their values, consumed in rank order.
    type Iters;
    /// An error unless every list has `n` values.
    fn check(lists: &Self::Lists, group: &'static str, n: usize) -> Result<(), Error>;
    /// Starts consuming the lists.
    fn iters(lists: Self::Lists) -> Self::Iters;
    /// The next rank's elements.
    fn next(iters: &mut Self::Iters) -> Option<Self>;
}

impl Elements for () {
    type Lists = ();
    type Iters = ();
    fn check((): &(), _: &'static str, _: usize) -> Result<(), Error> {
        Ok(())
    }
    fn iters((): ()) {}
    fn next((): &mut ()) -> Option<()> {
        Some(())
    }
}

impl<T: Send + 'static, R: Elements> Elements for (T, R) {
    type Lists = (PerRankValues<T>, R::Lists);
    type Iters = (std::vec::IntoIter<T>, R::Iters);

    fn check((head, rest): &Self::Lists, group: &'static str, n: usize) -> Result<(), Error> {
        if head.values.len() != n {
            return Err(Error::PerRankLength {
                input: head.input,
                group,
                expected: n,
                got: head.values.len(),
            });
        }
        R::check(rest, group, n)
    }

    fn iters((head, rest): Self::Lists) -> Self::Iters {
        (head.values.into_iter(), R::iters(rest))
    }

    fn next((head, rest): &mut Self::Iters) -> Option<Self> {
        Some((head.next()?, R::next(rest)?))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn shared_inputs_are_cloned_and_per_rank_elements_moved_in_rank_order() {
        type In = RankInputs<(String,), (Box<u32>, (char, ()))>;
        let whole = (
            ("s".to_string(),),
            (
                PerRankValues::new("a", vec![Box::new(0), Box::new(1), Box::new(2)]),
                (PerRankValues::new("b", vec!['x', 'y', 'z']), ()),
            ),
        );
        let addr = &*whole.1 .0.values[2] as *const u32;
        In::check(&whole, "g", 3).unwrap();
        let mut got = Vec::new();
        In::deal(whole, 3, |rank, i| got.push((rank, i)));
        let seen: Vec<(usize, String, u32, char)> = got
            .iter()
            .map(|(r, i)| (*r, i.shared.0.clone(), *i.own.0, i.own.1 .0))
            .collect();
        assert_eq!(
            seen,
            [
                (0, "s".into(), 0, 'x'),
                (1, "s".into(), 1, 'y'),
                (2, "s".into(), 2, 'z')
            ]
        );
        // Moved, not copied.
        assert_eq!(&*got[2].1.own.0 as *const u32, addr);
    }

    #[test]
    fn a_per_rank_input_of_another_length_is_refused() {
        type In = RankInputs<(), (u8, (u8, ()))>;
        let whole = (
            (),
            (
                PerRankValues::new("a", vec![0, 1]),
                (PerRankValues::new("b", vec![0]), ()),
            ),
        );
        assert!(matches!(
            In::check(&whole, "g", 2),
            Err(Error::PerRankLength {
                input: "b",
                group: "g",
                expected: 2,
                got: 1
            })
        ));
    }
}
