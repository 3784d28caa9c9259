//! Per-rank inputs (`batch: PerRank<T>`): rank k of the group that reads one gets its k-th
//! value, so one group reads it, and a single actor of it (`workers[k]`) reads value k.

use proc_macro2::Span;

use super::super::ir::{OpKind, Origin};
use super::Lowerer;

impl Lowerer<'_> {
    /// Reports each per-rank input read by more than one group, at the first read of each
    /// further group: its values are split by the ranks of one group.
    pub(super) fn per_rank_readers(&mut self) {
        for (i, input) in self.inputs.iter().enumerate().filter(|(_, d)| d.per_rank) {
            let mut readers: Vec<(usize, Span)> = Vec::new();
            for op in &self.ops {
                let reads: Vec<(usize, Span)> = match &op.kind {
                    OpKind::Call {
                        args, arg_spans, ..
                    } => args
                        .iter()
                        .copied()
                        .zip(arg_spans.iter().copied())
                        .collect(),
                    OpKind::Tuple { parts } => {
                        parts.iter().map(|&v| (v, input.name.span())).collect()
                    }
                    _ => Vec::new(),
                };
                for (v, span) in reads {
                    if self.values[v].origin == Origin::Input(i)
                        && !readers.iter().any(|&(g, _)| g == op.group())
                    {
                        readers.push((op.group(), span));
                    }
                }
            }
            if let [(first, _), rest @ ..] = &readers[..] {
                for &(g, span) in rest {
                    let msg = format!(
                        "per-rank input `{}` is split over the ranks of group `{}`, so group `{}` cannot read it too; give `{}` an input of its own",
                        input.name, self.groups[*first].name, self.groups[g].name, self.groups[g].name
                    );
                    self.diag.error(span, msg);
                }
            }
        }
    }
}
