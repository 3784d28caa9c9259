//! What the processes of a group exchange about a stage, as words (`u64`): each rank's
//! header and collective, and the error of a rank that failed, so that every process
//! decides the same verdict and reports the same error.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use crate::comm::{Collective, Header, SlotDesc, Status};
use crate::{DType, Error, ReduceOp, RemoteError};

/// A rank's header and collective, owned: as a peer process sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedHeader {
    pub(crate) collective: Collective,
    pub(crate) status: Status,
    pub(crate) slots: Vec<SlotDesc>,
    pub(crate) dims: Vec<usize>,
}

impl OwnedHeader {
    pub(crate) fn header(&self) -> Header<'_> {
        Header {
            status: self.status,
            slots: &self.slots,
            dims: &self.dims,
            data: &[],
        }
    }
}

fn op_code(op: ReduceOp) -> u64 {
    ReduceOp::ALL.iter().position(|&o| o == op).unwrap_or(0) as u64
}

fn op_of(code: u64) -> Option<ReduceOp> {
    ReduceOp::ALL.get(usize::try_from(code).ok()?).copied()
}

/// Appends `header` and `collective` to `out`: the collective (kind, op, root), the
/// status, the number of slots, each slot (dtype, len, rows, ndim), then the dimensions.
pub(crate) fn encode(header: &Header<'_>, collective: Collective, out: &mut Vec<u64>) {
    let (kind, op, root) = match collective {
        Collective::AllReduce(op) => (0, op_code(op), 0),
        Collective::AllGather => (1, 0, 0),
        Collective::ReduceScatter(op) => (2, op_code(op), 0),
        Collective::Broadcast { root } => (3, 0, root as u64),
        Collective::Reduce { op, root } => (4, op_code(op), root as u64),
    };
    let status = u64::from(header.status == Status::Failed);
    out.extend([kind, op, root, status, header.slots.len() as u64]);
    for s in header.slots {
        out.extend([
            s.dtype.index() as u64,
            s.len as u64,
            s.rows as u64,
            s.ndim as u64,
        ]);
    }
    out.extend(header.dims.iter().map(|&d| d as u64));
}

/// Reads what [`encode`] wrote; `None` if the words are not a header (a peer's bug).
pub(crate) fn decode(words: &[u64]) -> Option<OwnedHeader> {
    let n = |w: u64| usize::try_from(w).ok();
    let (&[kind, op, root, status, count], rest) = words.split_first_chunk::<5>()?;
    let root = n(root)?;
    let collective = match kind {
        0 => Collective::AllReduce(op_of(op)?),
        1 => Collective::AllGather,
        2 => Collective::ReduceScatter(op_of(op)?),
        3 => Collective::Broadcast { root },
        4 => Collective::Reduce {
            op: op_of(op)?,
            root,
        },
        _ => return None,
    };
    let count = n(count)?;
    let (slot_words, dims) = rest.split_at_checked(count.checked_mul(4)?)?;
    let slots = slot_words
        .chunks_exact(4)
        .map(|w| {
            Some(SlotDesc {
                dtype: *DType::ALL.get(n(w[0])?)?,
                len: n(w[1])?,
                rows: n(w[2])?,
                ndim: n(w[3])?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let ndims = slots
        .iter()
        .try_fold(0usize, |n, s| n.checked_add(s.ndim))?;
    if ndims != dims.len() {
        return None;
    }
    Some(OwnedHeader {
        collective,
        status: if status == 0 {
            Status::Ok
        } else {
            Status::Failed
        },
        slots,
        dims: dims.iter().map(|&d| n(d)).collect::<Option<_>>()?,
    })
}

/// The root-cause error of a rank's step, as it travels to the other processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// [`Error::Method`]: the method and its error's message.
    Method {
        rank: usize,
        method: String,
        message: String,
    },
    /// [`Error::Panic`]: the method, if a method panicked, and the message.
    Panic {
        rank: usize,
        method: Option<String>,
        message: String,
    },
    /// [`Error::Poisoned`].
    Poisoned { rank: usize, message: String },
    /// [`Error::Travel`]: the value and why.
    Travel {
        rank: usize,
        value: String,
        reason: String,
    },
}

impl Failure {
    /// The failure of `error`, if it is one that other processes must learn (a root
    /// cause on this rank); `None` for the errors that follow from another's.
    pub(crate) fn of(error: &Error) -> Option<Self> {
        Some(match error {
            Error::Method {
                rank,
                method,
                source,
                ..
            } => Failure::Method {
                rank: *rank,
                method: (*method).to_string(),
                message: source.to_string(),
            },
            Error::Panic {
                rank,
                method,
                message,
                ..
            } => Failure::Panic {
                rank: *rank,
                method: method.map(str::to_string),
                message: message.clone(),
            },
            Error::Poisoned { rank, message, .. } => Failure::Poisoned {
                rank: *rank,
                message: message.clone(),
            },
            Error::Travel {
                rank,
                value,
                reason,
                ..
            } => Failure::Travel {
                rank: *rank,
                value: (*value).to_string(),
                reason: reason.clone(),
            },
            _ => return None,
        })
    }

    /// The error every process reports for it.
    pub(crate) fn to_error(&self, group: &'static str) -> Error {
        match self {
            Failure::Method {
                rank,
                method,
                message,
            } => Error::Method {
                group,
                rank: *rank,
                method: intern(method),
                source: Box::new(RemoteError(message.clone())),
            },
            Failure::Panic {
                rank,
                method,
                message,
            } => Error::Panic {
                group,
                rank: *rank,
                method: method.as_deref().map(intern),
                message: message.clone(),
            },
            Failure::Poisoned { rank, message } => Error::Poisoned {
                group,
                rank: *rank,
                message: message.clone(),
            },
            Failure::Travel {
                rank,
                value,
                reason,
            } => Error::Travel {
                group,
                rank: *rank,
                value: intern(value),
                reason: reason.clone(),
            },
        }
    }

    /// Appends the failure (or its absence) to `out`.
    pub(crate) fn encode(this: Option<&Self>, out: &mut Vec<u64>) {
        let (kind, rank, a, b) = match this {
            None => return out.push(0),
            Some(Failure::Method {
                rank,
                method,
                message,
            }) => (1, rank, Some(method.as_str()), message),
            Some(Failure::Panic {
                rank,
                method,
                message,
            }) => (2, rank, method.as_deref(), message),
            Some(Failure::Poisoned { rank, message }) => (3, rank, None, message),
            Some(Failure::Travel {
                rank,
                value,
                reason,
            }) => (4, rank, Some(value.as_str()), reason),
        };
        out.extend([kind, *rank as u64, u64::from(a.is_some())]);
        put_str(a.unwrap_or(""), out);
        put_str(b, out);
    }

    /// Reads what [`Failure::encode`] wrote, from the front of `words`, which it advances.
    pub(crate) fn decode(words: &mut &[u64]) -> Option<Option<Self>> {
        let kind = take(words)?;
        if kind == 0 {
            return Some(None);
        }
        let rank = usize::try_from(take(words)?).ok()?;
        let has_method = take(words)? != 0;
        let method = take_str(words)?;
        let message = take_str(words)?;
        Some(Some(match kind {
            1 => Failure::Method {
                rank,
                method,
                message,
            },
            2 => Failure::Panic {
                rank,
                method: has_method.then_some(method),
                message,
            },
            3 => Failure::Poisoned { rank, message },
            4 => Failure::Travel {
                rank,
                value: method,
                reason: message,
            },
            _ => return None,
        }))
    }
}

/// The first word of `words`, which it advances.
pub(crate) fn take(words: &mut &[u64]) -> Option<u64> {
    let (&first, rest) = words.split_first()?;
    *words = rest;
    Some(first)
}

/// The first `n` words of `words`, which it advances.
pub(crate) fn take_n<'a>(words: &mut &'a [u64], n: u64) -> Option<&'a [u64]> {
    let (head, rest) = words.split_at_checked(usize::try_from(n).ok()?)?;
    *words = rest;
    Some(head)
}

fn put_str(s: &str, out: &mut Vec<u64>) {
    out.push(s.len() as u64);
    out.extend(s.as_bytes().chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    }));
}

fn take_str(words: &mut &[u64]) -> Option<String> {
    let len = usize::try_from(take(words)?).ok()?;
    let packed = take_n(words, len.div_ceil(8) as u64)?;
    let mut bytes: Vec<u8> = packed.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.truncate(len);
    String::from_utf8(bytes).ok()
}

/// A method name from another process, as the `&'static str` that [`Error`] holds: each
/// distinct name is leaked once (a graph has few methods).
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names.get_or_insert_with(HashSet::new);
    if let Some(&known) = names.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

/// A process's summary of its ranks' headers, the same in every process: word by word, a
/// multiply and a shift that each map a state to one state only, so two headers that
/// differ in one word never share a digest. (FNV-1a byte by byte would chain eight times
/// as many multiplies, each waiting on the last.)
pub(crate) fn digest(words: &[u64]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, &w| {
        let h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_bit_change_in_any_word_changes_the_digest() {
        let words: Vec<u64> = (0..40u64)
            .map(|i| i.wrapping_mul(0x1234_5678_9abc))
            .collect();
        let d = digest(&words);
        for i in 0..words.len() {
            for bit in 0..64 {
                let mut other = words.clone();
                other[i] ^= 1 << bit;
                assert_ne!(digest(&other), d, "word {i}, bit {bit}");
            }
        }
        assert_eq!(digest(&words), d);
    }

    #[test]
    fn headers_and_failures_round_trip() {
        let slots = [
            SlotDesc::shaped(DType::BF16, &[4, 2]).unwrap(),
            SlotDesc::flat(DType::U64, 3),
        ];
        let header = Header {
            status: Status::Ok,
            slots: &slots,
            dims: &[4, 2],
            data: &[],
        };
        for c in [
            Collective::AllReduce(ReduceOp::Avg),
            Collective::AllGather,
            Collective::ReduceScatter(ReduceOp::Min),
            Collective::Broadcast { root: 3 },
            Collective::Reduce {
                op: ReduceOp::Prod,
                root: 1,
            },
        ] {
            let mut words = Vec::new();
            encode(&header, c, &mut words);
            let back = decode(&words).unwrap();
            assert_eq!(back.collective, c);
            assert_eq!(
                (back.status, &back.slots[..], &back.dims[..]),
                (Status::Ok, &slots[..], &[4, 2][..])
            );
            assert_eq!(decode(&words[..words.len() - 1]), None);
        }
        let failures = [
            None,
            Some(Failure::Method {
                rank: 5,
                method: "step".into(),
                message: "bad input: ünïcode".into(),
            }),
            Some(Failure::Panic {
                rank: 0,
                method: None,
                message: String::new(),
            }),
            Some(Failure::Poisoned {
                rank: 2,
                message: "twelve bytes".into(),
            }),
            Some(Failure::Travel {
                rank: 3,
                value: "grads".into(),
                reason: "writing it: it panicked: no".into(),
            }),
        ];
        let mut words = Vec::new();
        for f in &failures {
            Failure::encode(f.as_ref(), &mut words);
        }
        let mut rest = &words[..];
        for f in &failures {
            assert_eq!(Failure::decode(&mut rest).unwrap().as_ref(), f.as_ref());
        }
        assert!(rest.is_empty());
        let e = failures[1].as_ref().unwrap().to_error("workers");
        assert_eq!(
            e.to_string(),
            "method `step` failed on rank 5 of group `workers`: bad input: ünïcode"
        );
        let e = failures[4].as_ref().unwrap().to_error("workers");
        assert_eq!(
            e.to_string(),
            "value `grads` could not cross processes on rank 3 of group `workers`: writing \
             it: it panicked: no"
        );
    }
}
