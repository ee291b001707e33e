//! Rule 5, cleanup ownership, and the per-execution generation history of rule 4.
//!
//! Every execution the core knows has exactly one owner: the newest attempt that claimed
//! it. Only the owner may stop it, only once, and only with a deadline. An attempt may
//! stop an execution only if no later attempt claimed that execution and no later attempt
//! is live; otherwise the stop is deferred (an orphan) until the later attempt settles.

use serde::{Deserialize, Serialize};

use crate::config::GENERATIONS_PER_EXECUTION;
use crate::ids::{AttemptId, Generation, SessionId};
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

/// One execution (runtime process) the core knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Execution {
    pub(crate) session: SessionId,
    /// The current startup generation.
    pub(crate) generation: Generation,
    /// The newest attempt that claimed this execution; it owns the cleanup.
    pub(crate) owner: AttemptId,
    /// (generation, attempt) bindings, oldest first; at most [`GENERATIONS_PER_EXECUTION`].
    history: [Option<(Generation, AttemptId)>; GENERATIONS_PER_EXECUTION],
    hist_len: u8,
    /// A callback of the current generation was published: its binding is frozen.
    pub(crate) published: bool,
    pub(crate) stop: StopState,
    /// The owner was cancelled while a later attempt was live; stop when it settles
    /// unless it claims this execution.
    pub(crate) orphan: bool,
}

impl Execution {
    pub(crate) fn new(session: SessionId, generation: Generation, owner: AttemptId) -> Self {
        let mut e = Execution {
            session,
            generation,
            owner,
            history: [None; GENERATIONS_PER_EXECUTION],
            hist_len: 0,
            published: false,
            stop: StopState::Running,
            orphan: false,
        };
        e.push_history(generation, owner);
        e
    }

    /// Starts a new generation bound to `attempt`; the oldest history entry falls out.
    pub(crate) fn rebind(&mut self, generation: Generation, attempt: AttemptId) {
        self.generation = generation;
        self.owner = attempt;
        self.published = false;
        self.orphan = false;
        self.push_history(generation, attempt);
    }

    fn push_history(&mut self, generation: Generation, attempt: AttemptId) {
        if usize::from(self.hist_len) == GENERATIONS_PER_EXECUTION {
            self.history.rotate_left(1);
            self.hist_len -= 1;
        }
        self.history[usize::from(self.hist_len)] = Some((generation, attempt));
        self.hist_len += 1;
    }

    /// The attempt bound to `generation`, if still in the history.
    pub(crate) fn bound_attempt(&self, generation: Generation) -> Option<AttemptId> {
        self.history()
            .find(|(g, _)| *g == generation)
            .map(|(_, a)| a)
    }

    /// Bindings oldest first.
    pub(crate) fn history(&self) -> impl Iterator<Item = (Generation, AttemptId)> + '_ {
        self.history[..usize::from(self.hist_len)]
            .iter()
            .flatten()
            .copied()
    }

    pub(crate) fn is_stopping(&self) -> bool {
        matches!(self.stop, StopState::Stopping { .. })
    }
}

/// Whether `attempt` may stop `exec` now: it is still the owner (no later attempt claimed
/// the execution) and no later attempt is live.
pub(crate) fn may_stop(exec: &Execution, attempt: AttemptId, live: Option<AttemptId>) -> bool {
    exec.owner == attempt && live.is_none_or(|l| l <= attempt)
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
    fn an_attempt_never_stops_an_execution_a_later_attempt_claimed() {
        let s = SessionId::new(1).unwrap();
        let mut e = Execution::new(s, g(1), a(1));
        assert!(may_stop(&e, a(1), None));
        assert!(!may_stop(&e, a(1), Some(a(2))), "a later attempt is live");
        e.rebind(g(2), a(2));
        assert!(!may_stop(&e, a(1), None), "a later attempt claimed it");
        assert!(may_stop(&e, a(2), Some(a(2))));
    }
}
