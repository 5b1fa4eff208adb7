//! [`Ranked`]: a number with a tie-breaking index, in a total order.

/// A value and the index of what it belongs to, ordered by the value (`f64::total_cmp`), then
/// by the index. Heaps and selections over it come out the same whichever way they are built:
/// no two entries are equal, and NaN has a place. Used where the result must be byte for byte
/// the same across changes to how it is found (the offline value schedule's heap, the nearest
/// scores an event lists).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked(pub f64, pub usize);

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_value_then_index() {
        let mut v = vec![
            Ranked(2.0, 0),
            Ranked(1.0, 5),
            Ranked(1.0, 3),
            Ranked(-0.0, 9),
        ];
        v.sort();
        assert_eq!(
            v,
            vec![
                Ranked(-0.0, 9),
                Ranked(1.0, 3),
                Ranked(1.0, 5),
                Ranked(2.0, 0)
            ]
        );
    }
}
