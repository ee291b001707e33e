//! [`Agenda`]: the world's events by simulated time, then by the order they were posted.
//!
//! A binary heap of single integers: each key packs the time, the posting order and the
//! event's slot, so one integer comparison orders two entries (time first, then posting
//! order; the slot never decides, posting orders being unique) and a heap move is 16
//! bytes. The events themselves wait in slots beside the heap and never move.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Events one seed posts at most: the posting order takes 32 bits of a key. A seed ends
/// long before (its scenario's `limits.max_events` stops a livelock at tens of thousands
/// of trace events).
pub(crate) const AGENDA_POSTS: u64 = u32::MAX as u64;

/// Events scheduled and not yet taken, by time, then posting order.
pub(crate) struct Agenda<T> {
    /// `time << 64 | posting order << 32 | slot`, smallest first.
    keys: BinaryHeap<Reverse<u128>>,
    /// Events posted so far (the last one's posting order).
    posted: u64,
    /// The events, each in the slot its key names.
    slots: Vec<Option<T>>,
    /// Slots free for reuse.
    free: Vec<u32>,
}

impl<T> Agenda<T> {
    /// An empty agenda.
    pub(crate) fn new() -> Agenda<T> {
        Agenda {
            keys: BinaryHeap::new(),
            posted: 0,
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Schedules `item` at `at`, after everything posted before it for the same time.
    pub(crate) fn post(&mut self, at: u64, item: T) {
        self.posted += 1;
        assert!(
            self.posted <= AGENDA_POSTS,
            "a seed posts at most {AGENDA_POSTS} events"
        );
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(item);
                slot
            }
            None => {
                // Fewer slots than posts, so this fits too.
                let slot = self.slots.len() as u32;
                self.slots.push(Some(item));
                slot
            }
        };
        let key = (u128::from(at) << 64) | (u128::from(self.posted) << 32) | u128::from(slot);
        self.keys.push(Reverse(key));
    }

    /// When the next event is due, if any is scheduled.
    pub(crate) fn next_at(&self) -> Option<u64> {
        self.keys.peek().map(|&Reverse(key)| (key >> 64) as u64)
    }

    /// Takes the next event if it is due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<T> {
        match self.keys.peek() {
            Some(&Reverse(key)) if (key >> 64) as u64 <= now => {
                self.keys.pop();
                let slot = key as u32;
                self.free.push(slot);
                self.slots[slot as usize].take()
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agenda the world had before (a heap of `(time, posting order, slot)` tuples
    /// beside a slab): the reference order.
    struct Reference {
        heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
        posted: u64,
        slots: Vec<Option<u64>>,
        free: Vec<usize>,
    }

    impl Reference {
        fn post(&mut self, at: u64, item: u64) {
            self.posted += 1;
            let slot = match self.free.pop() {
                Some(slot) => {
                    self.slots[slot] = Some(item);
                    slot
                }
                None => {
                    self.slots.push(Some(item));
                    self.slots.len() - 1
                }
            };
            self.heap.push(Reverse((at, self.posted, slot)));
        }

        fn pop_due(&mut self, now: u64) -> Option<u64> {
            match self.heap.peek() {
                Some(&Reverse((at, _, _))) if at <= now => {
                    let Reverse((_, _, slot)) = self.heap.pop()?;
                    self.free.push(slot);
                    self.slots[slot].take()
                }
                _ => None,
            }
        }
    }

    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Random runs of posts (many at the same time, some far ahead, times up to
    /// `u64::MAX`) and takes as the clock moves: the agenda gives the reference's events
    /// in the reference's order, and the same next time.
    #[test]
    fn the_agenda_takes_events_in_the_reference_order() {
        for run in 0..300u64 {
            let mut rng = run;
            let mut agenda = Agenda::new();
            let mut reference = Reference {
                heap: BinaryHeap::new(),
                posted: 0,
                slots: Vec::new(),
                free: Vec::new(),
            };
            let mut now = 0u64;
            let spread = [1, 3, 50, 1_000][(run % 4) as usize];
            for item in 0..2_000u64 {
                let r = splitmix(&mut rng);
                match r % 8 {
                    0..=3 => {
                        let at = match r % 97 {
                            0 => u64::MAX,
                            1 => u64::MAX - 1,
                            _ => now + (r >> 16) % spread,
                        };
                        agenda.post(at, item);
                        reference.post(at, item);
                    }
                    4..=6 => assert_eq!(agenda.pop_due(now), reference.pop_due(now)),
                    _ => now += (r >> 8) % (spread + 1),
                }
                assert_eq!(
                    agenda.next_at(),
                    reference.heap.peek().map(|&Reverse((at, _, _))| at)
                );
            }
            loop {
                let taken = agenda.pop_due(u64::MAX);
                assert_eq!(taken, reference.pop_due(u64::MAX));
                if taken.is_none() {
                    break;
                }
            }
        }
    }

    /// Equal times leave in posting order, whatever slot each event took.
    #[test]
    fn events_at_one_time_leave_in_posting_order() {
        let mut agenda = Agenda::new();
        agenda.post(5, 'a');
        agenda.post(9, 'x');
        assert_eq!(agenda.pop_due(5), Some('a'));
        // 'b' reuses 'a''s slot 0, which is smaller than 'x''s: the posting order decides.
        agenda.post(9, 'b');
        assert_eq!(agenda.pop_due(8), None);
        assert_eq!(agenda.pop_due(9), Some('x'));
        assert_eq!(agenda.pop_due(9), Some('b'));
        assert_eq!(agenda.next_at(), None);
    }
}
