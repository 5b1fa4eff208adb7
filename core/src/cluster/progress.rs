//! A job's kept progress points, delta-encoded: the bulk of the memory a live job costs.
//!
//! Issue 17 budgets 2 KB per live job. Kept as plain structs, 32 points took 1,152 bytes even
//! packed to 36 bytes each (heaptrack at 10,000 jobs: the largest row of the manager's heap).
//! Consecutive points of one job differ little: a second apart, a few steps apart, the same
//! epoch, a metric and a CPU total that change in their low bits. So each point after the first
//! is kept as its difference from the one before, as LEB128 varints:
//! - times, steps, epochs and CPU totals as zigzag differences. The CPU total is kept in whole
//!   microseconds of a core (the only field rounded: it comes from heartbeats' CPU use times
//!   their interval, whose float bits differ all the way down, and the estimates read it over
//!   windows of tens of core-seconds);
//! - the metric as the XOR of its bits with the previous point's (Gorilla's observation,
//!   Pelkonen et al., VLDB 2015: equal sign, exponent and leading mantissa bits XOR to zeros),
//!   shifted right past its trailing zeros, with their count first: a metric computed in
//!   `f32`, as our trainer's loss and most frameworks' are, has 29 zero bits at the bottom of
//!   every `f64` it is read as. Exact: every bit comes back.
//!
//! The oldest and the newest point are also kept whole: dropping the oldest decodes only the
//! next one's difference, and adding a point encodes it against the newest, so neither walks
//! the history.

use serde::{Deserialize, Serialize};

/// Progress points a stored job keeps ([`crate::cluster::lifecycle::Job::progress`]).
pub const STORED_PROGRESS: usize = 32;

/// One progress point as it is read ([`Progress::iter`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProgressPoint {
    /// When the agent read it (Unix ms).
    pub unix_ms: i64,
    /// Step.
    pub step: u64,
    /// Metric value.
    pub value: Option<f64>,
    /// Incarnation.
    pub epoch: u64,
    /// Reference core-seconds the job had used by then
    /// ([`crate::cluster::lifecycle::Job::cpu_s`]), to the microsecond once kept.
    pub cpu_s: f64,
}

/// A point as its bits: a missing value is NaN, which a real one never is (the contract refuses
/// non-finite metrics), an epoch (a job's incarnation count) past `u32::MAX` is saturated, and
/// the CPU total is in whole microseconds (saturated at both ends; NaN is 0).
/// `packed(4)`: two are kept inline in every job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, packed(4))]
struct Bits {
    unix_ms: i64,
    step: u64,
    value: u64,
    cpu_us: i64,
    epoch: u32,
}

/// Microseconds in a second: the CPU total's unit.
const US: f64 = 1e6;

impl From<ProgressPoint> for Bits {
    fn from(p: ProgressPoint) -> Self {
        Bits {
            unix_ms: p.unix_ms,
            step: p.step,
            value: p.value.unwrap_or(f64::NAN).to_bits(),
            // `as` rounds toward zero and saturates: round first.
            cpu_us: (p.cpu_s * US).round() as i64,
            epoch: u32::try_from(p.epoch).unwrap_or(u32::MAX),
        }
    }
}

impl From<Bits> for ProgressPoint {
    fn from(b: Bits) -> Self {
        let value = f64::from_bits(b.value);
        ProgressPoint {
            unix_ms: b.unix_ms,
            step: b.step,
            value: (!value.is_nan()).then_some(value),
            epoch: u64::from(b.epoch),
            cpu_s: b.cpu_us as f64 / US,
        }
    }
}

impl Bits {
    /// Appends what turns `self` into `next`.
    fn encode_to(self, next: Bits, out: &mut Delta) {
        let (a, b) = (self, next);
        put(out, zigzag(b.unix_ms.wrapping_sub(a.unix_ms)));
        put(out, zigzag(b.step.wrapping_sub(a.step) as i64));
        put(out, zigzag(i64::from(b.epoch) - i64::from(a.epoch)));
        put_xor(out, b.value ^ a.value);
        put(out, zigzag(b.cpu_us.wrapping_sub(a.cpu_us)));
    }

    /// The point after `self`, read from the front of `bytes`, and the bytes it took.
    fn decode_next(self, bytes: &[u8]) -> (Bits, usize) {
        let mut at = 0;
        let mut next = || {
            let (v, n) = get(&bytes[at..]);
            at += n;
            v
        };
        let unix_ms = self.unix_ms.wrapping_add(unzigzag(next()));
        let step = self.step.wrapping_add(unzigzag(next()) as u64);
        let epoch = (i64::from(self.epoch) + unzigzag(next())) as u32;
        let value = self.value
            ^ match next() {
                NO_BITS => 0,
                zeros => next() << zeros,
            };
        let cpu_us = self.cpu_us.wrapping_add(unzigzag(next()));
        let bits = Bits {
            unix_ms,
            step,
            value,
            cpu_us,
            epoch,
        };
        (bits, at)
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// One difference being written, on the stack: its size is known before the job's buffer
/// grows for it.
struct Delta {
    bytes: [u8; MAX_DELTA],
    len: usize,
}

impl Delta {
    fn new() -> Self {
        Delta {
            bytes: [0; MAX_DELTA],
            len: 0,
        }
    }

    fn push(&mut self, b: u8) {
        self.bytes[self.len] = b;
        self.len += 1;
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// LEB128: seven bits a byte, low first, the high bit set on all but the last.
fn put(out: &mut Delta, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// What [`put_xor`] writes for an XOR of nothing (no trailing-zero count is that large).
const NO_BITS: u64 = 64;

/// An XOR of two floats' bits: the count of its trailing zeros, then what is left above them
/// (module doc); [`NO_BITS`] alone when they are equal.
fn put_xor(out: &mut Delta, x: u64) {
    if x == 0 {
        put(out, NO_BITS);
    } else {
        let zeros = x.trailing_zeros();
        put(out, u64::from(zeros));
        put(out, x >> zeros);
    }
}

/// Reads what [`put`] wrote; only ever given bytes [`put`] wrote.
fn get(bytes: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    for (i, &b) in bytes.iter().enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return (v, i + 1);
        }
    }
    unreachable!("a difference is always written whole")
}

/// Bytes added at least to the differences' buffer when the next difference does not fit: it
/// grows by about this much, not by doubling, so a job's history holds at most this much
/// unused (a trainer's difference takes about 11 bytes; growing by a whole worst-case
/// difference, 60, kept ~90 bytes a job unused on average).
const GROW: usize = 24;

/// A job's most recent progress points, oldest first (module doc).
#[derive(Clone, Default)]
pub struct Progress {
    /// Each point after the first as its difference from the one before.
    deltas: Vec<u8>,
    /// The oldest point (meaningless when `len` is 0).
    first: Bits,
    /// The newest.
    last: Bits,
    len: u32,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Point by point as read (a missing value's NaN bits compare equal here, as `None` does).
impl PartialEq for Progress {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Progress {
    /// Adds `point`, keeping the newest `cap` (none when `cap` is 0).
    pub fn push(&mut self, point: ProgressPoint, cap: usize) {
        if cap == 0 {
            *self = Progress::default();
            return;
        }
        self.keep_newest(cap - 1);
        let bits = Bits::from(point);
        if self.len == 0 {
            self.first = bits;
        } else {
            let mut one = Delta::new();
            self.last.encode_to(bits, &mut one);
            let one = one.as_slice();
            if self.deltas.capacity() - self.deltas.len() < one.len() {
                self.deltas.reserve_exact(one.len().max(GROW));
            }
            self.deltas.extend_from_slice(one);
        }
        self.last = bits;
        self.len += 1;
    }

    /// Drops all but the newest `n` points (a restart with a smaller `--progress-history`
    /// applies it to every job at once, not as each reports again).
    pub fn keep_newest(&mut self, n: usize) {
        let extra = self.len().saturating_sub(n);
        if extra == 0 {
            return;
        }
        if extra == self.len() {
            *self = Progress::default();
            return;
        }
        let (mut first, mut used) = (self.first, 0);
        for _ in 0..extra {
            let (next, n) = first.decode_next(&self.deltas[used..]);
            first = next;
            used += n;
        }
        self.deltas.drain(..used);
        self.first = first;
        self.len -= extra as u32;
    }

    /// The points, oldest first.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            bytes: &self.deltas,
            next: self.first,
            left: self.len(),
        }
    }

    /// The newest point.
    pub fn back(&self) -> Option<ProgressPoint> {
        (self.len > 0).then(|| self.last.into())
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes the differences take.
    #[cfg(test)]
    fn encoded_bytes(&self) -> usize {
        self.deltas.len()
    }
}

/// The most one difference takes: six varints of up to ten bytes.
const MAX_DELTA: usize = 60;

/// [`Progress::iter`].
pub struct Iter<'a> {
    bytes: &'a [u8],
    next: Bits,
    left: usize,
}

impl Iterator for Iter<'_> {
    type Item = ProgressPoint;

    fn next(&mut self) -> Option<ProgressPoint> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let this = self.next;
        if self.left > 0 {
            let (next, n) = this.decode_next(self.bytes);
            self.next = next;
            self.bytes = &self.bytes[n..];
        }
        Some(this.into())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl FromIterator<ProgressPoint> for Progress {
    fn from_iter<I: IntoIterator<Item = ProgressPoint>>(points: I) -> Self {
        let mut p = Progress::default();
        for point in points {
            p.push(point, usize::MAX);
        }
        p
    }
}

/// A stored progress point: a tuple `[unix_ms, step, value, epoch, cpu_s]`, not an object
/// with its field names (half the bytes of a record are its points).
#[derive(Serialize, Deserialize)]
struct StoredPoint(i64, u64, Option<f64>, u64, f64);

impl Serialize for Progress {
    /// The last [`STORED_PROGRESS`]: a record of bounded size however long the history kept in
    /// memory.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            self.iter()
                .skip(self.len().saturating_sub(STORED_PROGRESS))
                .map(|p| StoredPoint(p.unix_ms, p.step, p.value, p.epoch, p.cpu_s)),
        )
    }
}

impl<'de> Deserialize<'de> for Progress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let points = Vec::<StoredPoint>::deserialize(d)?;
        Ok(points
            .into_iter()
            .map(
                |StoredPoint(unix_ms, step, value, epoch, cpu_s)| ProgressPoint {
                    unix_ms,
                    step,
                    value,
                    epoch,
                    cpu_s,
                },
            )
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(i: u64) -> ProgressPoint {
        ProgressPoint {
            unix_ms: 1_700_000_000_000 + 1_000 * i as i64,
            step: 10 * i,
            value: (i % 7 != 3).then(|| 2.5 / (1.0 + i as f64)),
            epoch: 1 + i / 20,
            // Whole microseconds, so that a kept point reads back equal.
            cpu_s: 0.875 * i as f64,
        }
    }

    /// `cpu_s` as kept: to the microsecond, saturated.
    fn to_us(cpu_s: f64) -> f64 {
        (cpu_s * US).round() as i64 as f64 / US
    }

    #[test]
    fn every_bit_comes_back_in_order_including_the_extremes() {
        // Differences at the edges of every field: backwards in time and steps (a restore from
        // an older checkpoint, another worker's clock), signed zero, subnormals, saturation.
        let odd = [
            ProgressPoint {
                unix_ms: i64::MIN,
                step: u64::MAX,
                value: Some(-0.0),
                epoch: u64::MAX,
                cpu_s: f64::MIN_POSITIVE / 3.0,
            },
            ProgressPoint {
                unix_ms: i64::MAX,
                step: 0,
                value: None,
                epoch: 0,
                cpu_s: f64::MAX,
            },
            ProgressPoint {
                unix_ms: -5,
                step: 7,
                value: Some(f64::MIN),
                epoch: 3,
                cpu_s: 0.0,
            },
        ];
        let points: Vec<ProgressPoint> = (0..50)
            .map(point)
            .chain(odd)
            .chain((50..60).map(point))
            .collect();
        let p: Progress = points.iter().copied().collect();
        let back: Vec<ProgressPoint> = p.iter().collect();
        let saturated = |mut q: ProgressPoint| {
            q.epoch = q.epoch.min(u64::from(u32::MAX));
            q
        };
        let want: Vec<ProgressPoint> = points.iter().copied().map(saturated).collect();
        // The extremes of the CPU total: below a microsecond is none, past i64's microseconds
        // is saturated.
        assert_eq!(to_us(f64::MIN_POSITIVE / 3.0), 0.0);
        assert_eq!(to_us(f64::MAX), i64::MAX as f64 / US);
        assert_eq!(back.len(), want.len());
        for (a, b) in back.iter().zip(&want) {
            assert_eq!(a.unix_ms, b.unix_ms);
            assert_eq!(a.step, b.step);
            assert_eq!(a.epoch, b.epoch);
            assert_eq!(a.value.map(f64::to_bits), b.value.map(f64::to_bits));
            assert_eq!(a.cpu_s.to_bits(), to_us(b.cpu_s).to_bits());
        }
        let last = want.last().copied().map(|mut q| {
            q.cpu_s = to_us(q.cpu_s);
            q
        });
        assert_eq!(p.back(), last);
    }

    #[test]
    fn keeps_the_newest_and_drops_from_the_front() {
        let mut p = Progress::default();
        for i in 0..100 {
            p.push(point(i), 32);
            assert_eq!(p.len(), (i as usize + 1).min(32));
            assert_eq!(p.iter().next(), Some(point(i.saturating_sub(31))));
            assert_eq!(p.back(), Some(point(i)));
        }
        let kept: Vec<_> = p.iter().collect();
        assert_eq!(kept, (68..100).map(point).collect::<Vec<_>>());
        p.keep_newest(5);
        assert_eq!(
            p.iter().collect::<Vec<_>>(),
            (95..100).map(point).collect::<Vec<_>>()
        );
        p.push(point(100), 0);
        assert!(p.is_empty() && p.back().is_none() && p.iter().next().is_none());
    }

    fn any_point() -> impl proptest::strategy::Strategy<Value = ProgressPoint> {
        use proptest::prelude::*;
        (
            any::<i64>(),
            any::<u64>(),
            proptest::option::of(any::<f64>().prop_filter("finite", |v| v.is_finite())),
            0..=u64::from(u32::MAX),
            // A CPU total is kept to the microsecond, as a whole number of them read back
            // through f64: exact up to about 2^50 microseconds (35 years of one core), beyond
            // which reading it back and keeping it again may move it by one. Any total a
            // container reaches is far inside; `any::<f64>()` once drew -4.3e9 s and failed.
            -1e9..1e9f64,
        )
            .prop_map(|(unix_ms, step, value, epoch, cpu_s)| ProgressPoint {
                unix_ms,
                step,
                value,
                epoch,
                cpu_s,
            })
    }

    proptest::proptest! {
        /// Whatever the points and the cap, what is read is the newest `cap` points as given,
        /// bit for bit (a plain `VecDeque` is the model).
        #[test]
        fn reads_back_what_a_plain_queue_would_hold(
            points in proptest::collection::vec(any_point(), 0..80),
            cap in 0usize..40,
        ) {
            let mut p = Progress::default();
            let mut model = std::collections::VecDeque::new();
            for q in points {
                p.push(q, cap);
                model.push_back(q);
                while model.len() > cap {
                    model.pop_front();
                }
                let bits = |q: &ProgressPoint| Bits::from(*q);
                proptest::prop_assert!(p.iter().map(|q| bits(&q)).eq(model.iter().map(bits)));
                proptest::prop_assert_eq!(p.back().map(|q| bits(&q)), model.back().map(bits));
            }
        }
    }

    #[test]
    fn the_cpu_total_is_kept_to_the_microsecond() {
        let mut p = Progress::default();
        let at = |cpu_s| ProgressPoint { cpu_s, ..point(1) };
        p.push(at(1.234_567_4), 8);
        p.push(at(2.000_000_6), 8);
        let kept: Vec<f64> = p.iter().map(|q| q.cpu_s).collect();
        assert_eq!(kept, vec![1.234_567, 2.000_001]);
    }

    #[test]
    fn a_trainers_point_takes_under_a_third_of_its_plain_size() {
        // What a trainer sends: every 25 steps, about a second apart, a loss computed in f32
        // (candle's, trainer/src/run.rs), and the CPU total a heartbeat's use times its interval
        // makes, which differs in every bit.
        let mut p = Progress::default();
        for i in 0..32u64 {
            let loss = 2.3f32 * (-(i as f32) / 40.0).exp() + 0.05;
            p.push(
                ProgressPoint {
                    unix_ms: 1_700_000_000_000 + 1_013 * i as i64 + (i * 7 % 5) as i64,
                    step: 25 * i,
                    value: Some(f64::from(loss)),
                    epoch: 1,
                    cpu_s: 0.973_214_567 * i as f64 + (i as f64).sqrt() / 97.0,
                },
                32,
            );
        }
        // 31 differences; a plain point is 36 bytes.
        let per_point = p.encoded_bytes() as f64 / 31.0;
        assert!(per_point < 12.0, "{per_point} bytes a point");
    }

    #[test]
    fn a_point_takes_two_thirds_of_its_plain_size_or_less() {
        let mut p = Progress::default();
        for i in 0..32 {
            p.push(point(i), 32);
        }
        // 31 differences; a plain point is 36 bytes.
        let per_point = p.encoded_bytes() as f64 / 31.0;
        assert!(per_point < 24.0, "{per_point} bytes a point");
    }

    #[test]
    fn stored_form_round_trips_and_keeps_the_newest_stored_progress() {
        let p: Progress = (0..40).map(point).collect();
        // Through a JSON value, not its text: serde_json's default text parser may be an ulp
        // off, which is not this type's doing.
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json.as_array().map(Vec::len), Some(STORED_PROGRESS));
        let back: Progress = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.len(), STORED_PROGRESS);
        assert_eq!(
            back.iter().collect::<Vec<_>>(),
            (8..40).map(point).collect::<Vec<_>>()
        );
        // Byte for byte the same stored form again: what a restarted manager writes equals
        // what it read.
        assert_eq!(serde_json::to_value(&back).unwrap(), json);
    }
}
