//! A list rebuilt at every execution that writes only the entries that changed.

use std::ops::Deref;

/// A `Vec` that [`clear`](Kept::clear) empties without dropping its entries, so that the
/// next [`push`](Kept::push)es compare with what was there and write only what differs.
///
/// A stage's layout is rebuilt at every execution, and is almost always the same as the
/// last one. The peers read it (the agreement), so its lines are shared with their cores:
/// a write, even of the same value, takes the line back from them, and the stores that
/// wait for it fill the store buffer: in a stage of many small values, writing the same
/// slots again is a visible part of the stage (the `64x256 f32, 2 actors/one fused stage`
/// row of `BENCHMARKS.md`).
#[derive(Debug)]
pub(super) struct Kept<T> {
    all: Vec<T>,
    len: usize,
}

impl<T: Copy + PartialEq> Kept<T> {
    pub(super) const fn new() -> Self {
        Self {
            all: Vec::new(),
            len: 0,
        }
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
    }

    pub(super) fn push(&mut self, value: T) {
        match self.all.get_mut(self.len) {
            Some(old) if *old == value => {}
            Some(old) => *old = value,
            None => self.all.push(value),
        }
        self.len += 1;
    }

    pub(super) fn extend_from_slice(&mut self, values: &[T]) {
        for &v in values {
            self.push(v);
        }
    }
}

impl<T> Deref for Kept<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.all[..self.len]
    }
}

impl<'a, T> IntoIterator for &'a Kept<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::Kept;

    #[test]
    fn holds_what_was_pushed_since_the_last_clear() {
        let mut k = Kept::new();
        k.extend_from_slice(&[1, 2, 3]);
        assert_eq!(&*k, &[1, 2, 3]);
        k.clear();
        assert!(k.is_empty());
        k.push(1);
        k.push(5);
        assert_eq!(
            &*k,
            &[1, 5],
            "a changed entry is written, a stale one not shown"
        );
        k.extend_from_slice(&[3, 4]);
        assert_eq!(&*k, &[1, 5, 3, 4], "entries past the old end are appended");
        k.clear();
        k.push(9);
        assert_eq!(&*k, &[9]);
    }
}
