//! One execution (runtime process) the core knows, and the leases on its generations.
//!
//! Rule 4's generations: every startup of an execution (an [`crate::Input::Bound`]) starts
//! a new generation bound to the attempt that asked for it, and an effect that acts on the
//! execution is leased on that generation. Rule 5's owner and teardown state: the newest
//! attempt that claimed the execution owns its cleanup. Plain data: the decisions are in
//! `lease.rs` (binding, leasing, performing) and `cleanup.rs` (stopping, forgetting).

use serde::{Deserialize, Serialize};

use crate::config::GENERATIONS_PER_EXECUTION;
use crate::ids::{AttemptId, ExecutionId, Generation, SessionId, TurnId};
use crate::time::Timestamp;

/// Teardown state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum StopState {
    Running,
    /// A stop was claimed; the core waits until the deadline.
    Stopping {
        deadline: Timestamp,
    },
}

/// One (generation, attempt) binding; `None` never written.
type Binding = Option<(Generation, AttemptId)>;

/// Where an execution's binding history lives: the prefix of the fixed array it stands for,
/// up to the last entry ever written.
///
/// Most executions are bound once and forgotten (the full resume cycle creates and drops
/// one record per cycle), so a prefix of at most one entry is kept inline and allocates
/// nothing; a longer one lives in a `Vec` grown as before (2, 4, then
/// [`GENERATIONS_PER_EXECUTION`] entries). The form is canonical (`One` exactly when the
/// prefix has at most one entry), so equal histories compare equal. Snapshots encode the
/// prefix as a sequence, and decoding rebuilds the canonical form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<Binding>", into = "Vec<Binding>")]
enum History {
    /// No entry (`None`) or one.
    One(Binding),
    /// Two or more entries.
    Many(Vec<Binding>),
}

impl From<Vec<Binding>> for History {
    fn from(prefix: Vec<Binding>) -> History {
        History::from_prefix(&prefix)
    }
}

impl From<History> for Vec<Binding> {
    fn from(h: History) -> Vec<Binding> {
        h.as_slice().to_vec()
    }
}

impl History {
    fn from_prefix(prefix: &[Binding]) -> History {
        match prefix {
            [] => History::One(None),
            [b] => History::One(*b),
            _ => {
                let mut v = Vec::with_capacity(history_capacity(prefix.len()));
                v.extend_from_slice(prefix);
                History::Many(v)
            }
        }
    }

    fn as_slice(&self) -> &[Binding] {
        match self {
            History::One(None) => &[],
            History::One(b) => std::slice::from_ref(b),
            History::Many(v) => v,
        }
    }
}

/// One execution (runtime process) the core knows.
///
/// The binding history grows with it: its first entry inline, then a `Vec` of 2, 4, then
/// [`GENERATIONS_PER_EXECUTION`] entries and never beyond (see [`History`]), so the usual
/// execution, bound once, neither allocates nor pays for eight entries (issue 2: at most
/// 512 bytes per session at rest). Indexing is exactly that of a fixed array, of which
/// `history` holds the prefix up to the last entry written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Execution {
    pub(crate) session: SessionId,
    /// The current startup generation.
    pub(crate) generation: Generation,
    /// The newest attempt that claimed this execution; it owns the cleanup.
    pub(crate) owner: AttemptId,
    /// (generation, attempt) bindings, oldest first, in `history[..hist_len]`; at most
    /// [`GENERATIONS_PER_EXECUTION`]. Never ends with `None`.
    history: History,
    hist_len: u8,
    pub(crate) stop: StopState,
    /// The owner was cancelled while a later attempt was live; stop when it settles
    /// unless it claims this execution.
    pub(crate) orphan: bool,
}

/// Storage for `used` entries: the next power of two, at most [`GENERATIONS_PER_EXECUTION`].
fn history_capacity(used: usize) -> usize {
    if used == 0 {
        0
    } else {
        used.next_power_of_two().min(GENERATIONS_PER_EXECUTION)
    }
}

impl Execution {
    pub(crate) fn new(session: SessionId, generation: Generation, owner: AttemptId) -> Self {
        let mut e = Execution {
            session,
            generation,
            owner,
            history: History::One(None),
            hist_len: 0,
            stop: StopState::Running,
            orphan: false,
        };
        e.push_history(generation, owner);
        debug_assert!(e.history_is_canonical());
        e
    }

    /// Starts a new generation bound to `attempt`; the oldest history entry falls out.
    pub(crate) fn rebind(&mut self, generation: Generation, attempt: AttemptId) {
        // Generations come from one core-wide counter, and a stopping execution is never
        // bound again (its successor starts another): rules 4 and 5.
        assert!(
            generation > self.generation && !self.is_stopping(),
            "rule 4: {generation} rebinds an execution at {} (stopping: {})",
            self.generation,
            self.is_stopping()
        );
        self.generation = generation;
        self.owner = attempt;
        self.orphan = false;
        self.push_history(generation, attempt);
        assert!(usize::from(self.hist_len) <= GENERATIONS_PER_EXECUTION);
        debug_assert!(self.history_is_canonical());
    }

    fn push_history(&mut self, generation: Generation, attempt: AttemptId) {
        if self.hist_len == 0 && self.history == History::One(None) {
            // The first binding of a new record: inline, no allocation.
            self.history = History::One(Some((generation, attempt)));
            self.hist_len = 1;
            return;
        }
        let mut history = match std::mem::replace(&mut self.history, History::One(None)) {
            History::One(None) => Vec::new(),
            History::One(b) => vec![b],
            History::Many(v) => v,
        };
        self.push_history_in(&mut history, generation, attempt);
        self.history = match history.as_slice() {
            [] => History::One(None),
            [b] => History::One(*b),
            _ => History::Many(history),
        };
    }

    /// `push_history` on the history as a `Vec`: the fixed array's indexing.
    fn push_history_in(
        &mut self,
        history: &mut Vec<Binding>,
        generation: Generation,
        attempt: AttemptId,
    ) {
        if usize::from(self.hist_len) == GENERATIONS_PER_EXECUTION {
            // As the full array did: everything moves one slot towards the front.
            history.resize(GENERATIONS_PER_EXECUTION, None);
            history.rotate_left(1);
            self.hist_len -= 1;
        }
        let i = usize::from(self.hist_len);
        if i >= history.len() {
            let want = history_capacity(i + 1);
            if history.capacity() < want {
                history.reserve_exact(want - history.len());
            }
            history.resize(i + 1, None);
        }
        history[i] = Some((generation, attempt));
        self.hist_len += 1;
        while history.last() == Some(&None) {
            history.pop();
        }
    }

    /// The attempt bound to `generation`, if still in the history. (`check_invariants`
    /// reads the same in its one walk of the history; this is the reference its test
    /// compares it with.)
    #[cfg(test)]
    pub(crate) fn bound_attempt(&self, generation: Generation) -> Option<AttemptId> {
        self.history()
            .find(|(g, _)| *g == generation)
            .map(|(_, a)| a)
    }

    /// Whether the history's length is within its bound and matches its entries (a
    /// decoded snapshot may claim anything).
    pub(crate) fn history_is_well_formed(&self) -> bool {
        let n = usize::from(self.hist_len);
        (1..=GENERATIONS_PER_EXECUTION).contains(&n) && self.history().count() == n
    }

    /// Whether the history is exactly what binding and rebinding produce: well formed, no
    /// entry stored past `hist_len`, and its newest entry the current generation bound to
    /// the owner. (A decoded snapshot may claim anything; `restore` asks this.)
    pub(crate) fn history_is_canonical(&self) -> bool {
        self.history_is_well_formed()
            && self.history.as_slice().len() == usize::from(self.hist_len)
            && self.history().last() == Some((self.generation, self.owner))
    }

    /// The execution with its history replaced, as a corrupt snapshot could hold it.
    #[cfg(test)]
    pub(crate) fn with_history_for_test(
        mut self,
        prefix: Vec<Option<(Generation, AttemptId)>>,
        hist_len: u8,
    ) -> Execution {
        self.history = History::from(prefix);
        self.hist_len = hist_len;
        self
    }

    /// The history's length as recorded (`history_is_well_formed` checks it against the
    /// entries).
    pub(crate) fn history_len(&self) -> usize {
        usize::from(self.hist_len)
    }

    /// Bindings oldest first.
    pub(crate) fn history(&self) -> impl Iterator<Item = (Generation, AttemptId)> + '_ {
        self.history
            .as_slice()
            .iter()
            .take(usize::from(self.hist_len))
            .flatten()
            .copied()
    }

    pub(crate) fn is_stopping(&self) -> bool {
        matches!(self.stop, StopState::Stopping { .. })
    }
}

/// What a lease allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum LeaseAction {
    Load,
    New,
    Prompt(TurnId),
}

/// An outstanding lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub(crate) session: SessionId,
    pub(crate) execution: ExecutionId,
    pub(crate) generation: Generation,
    pub(crate) attempt: AttemptId,
    pub(crate) deadline: Timestamp,
    pub(crate) action: LeaseAction,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;

    fn a(n: u64) -> AttemptId {
        AttemptId::new(Epoch::FIRST, n).unwrap()
    }
    fn g(n: u64) -> Generation {
        Generation::new(n).unwrap()
    }

    #[test]
    fn history_keeps_the_last_eight_bindings() {
        let s = SessionId::new(1).unwrap();
        let mut e = Execution::new(s, g(1), a(1));
        for n in 2..=12 {
            e.rebind(g(n), a(n));
        }
        let gens: Vec<u64> = e.history().map(|(g, _)| g.get()).collect();
        assert_eq!(gens, (5..=12).collect::<Vec<_>>());
        assert_eq!(e.bound_attempt(g(12)), Some(a(12)));
        assert_eq!(e.bound_attempt(g(4)), None);
    }

    #[test]
    fn history_storage_grows_with_its_bindings_and_round_trips() {
        let s = SessionId::new(1).unwrap();
        let mut e = Execution::new(s, g(1), a(1));
        assert!(
            matches!(e.history, History::One(Some(_))),
            "an execution bound once allocates nothing"
        );
        for n in 1..=20 {
            if n > 1 {
                e.rebind(g(n), a(n));
            }
            match &e.history {
                History::One(_) => assert_eq!(n, 1),
                History::Many(v) => assert!(v.capacity() <= GENERATIONS_PER_EXECUTION),
            }
            let first = n.saturating_sub(GENERATIONS_PER_EXECUTION as u64) + 1;
            let want: Vec<_> = (first..=n).map(|k| (g(k), a(k))).collect();
            assert_eq!(e.history().collect::<Vec<_>>(), want, "after {n} bindings");
            let bytes = postcard::to_allocvec(&e).unwrap();
            let back: Execution = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back, e, "after {n} bindings");
            assert!(back.history_is_canonical());
        }
    }
}
