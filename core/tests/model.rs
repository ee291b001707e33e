//! Model-based test: random operation sequences — begin, cancel, accept, finish, callbacks
//! with right and wrong attempt / execution / generation, duplicates, reorderings, leases,
//! timeouts, and restarts via snapshot/restore — are applied to the core, and after every
//! step the independent reference model (`audit::Auditor`) and `check_invariants()` must
//! hold. At the end, with inputs stopped, the provider finishing the turns it has and
//! timers run, every turn must have ended.

mod common;
use std::collections::{BTreeMap, BTreeSet};

use common::*;
use palisade_core::classify::{
    ErrorAnswer, LoadFailure, LoadOutcome, SessionListing, TransportState,
};
use palisade_core::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Pick {
    Newest,
    Nth(u8),
    Unminted,
    None,
}

#[derive(Clone, Debug)]
enum GenPick {
    Current,
    Older,
    Future,
}

#[derive(Clone, Debug)]
enum Ev {
    Boot,
    AgentReady(Option<bool>),
    Created,
    Loaded,
    LoadFailed(i64, bool, u8),
    StartFailed,
    Accepted,
    Stream(u8),
    Completed,
    Failed,
    Exited,
}

#[derive(Clone, Debug)]
enum Op {
    Resume(u8),
    Prompt(u8),
    Cancel(u8),
    Bind(u8, Pick, u8),
    Callback(u8, u8, Pick, GenPick, Ev),
    /// Re-deliver an earlier callback (duplicate / reordering).
    Replay(u8),
    Perform(u8),
    Stopped(u8),
    Dismiss(u8),
    /// Resume and cancel `n` times: churns the tombstone ring.
    Churn(u8, u8),
    Advance(u16),
    Restart,
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![6 => Just(Pick::Newest), 3 => (0u8..20).prop_map(Pick::Nth), 1 => Just(Pick::Unminted), 1 => Just(Pick::None)]
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        Just(Ev::Boot),
        prop_oneof![Just(None), Just(Some(true)), Just(Some(false))].prop_map(Ev::AgentReady),
        Just(Ev::Created),
        Just(Ev::Loaded),
        (
            prop_oneof![
                Just(-32002i64),
                Just(-32603),
                Just(-32601),
                Just(-32000),
                Just(0)
            ],
            any::<bool>(),
            0u8..3
        )
            .prop_map(|(c, t, m)| Ev::LoadFailed(c, t, m)),
        Just(Ev::StartFailed),
        Just(Ev::Accepted),
        (1u8..6).prop_map(Ev::Stream),
        Just(Ev::Completed),
        Just(Ev::Failed),
        Just(Ev::Exited),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let sess = 1u8..4;
    let exec = 1u8..5;
    prop_oneof![
        3 => sess.clone().prop_map(Op::Resume),
        4 => sess.clone().prop_map(Op::Prompt),
        3 => sess.clone().prop_map(Op::Cancel),
        5 => (sess.clone(), pick(), exec.clone()).prop_map(|(s, p, e)| Op::Bind(s, p, e)),
        12 => (sess.clone(), exec.clone(), pick(), prop_oneof![8 => Just(GenPick::Current), 1 => Just(GenPick::Older), 1 => Just(GenPick::Future)], ev())
            .prop_map(|(s, e, p, g, v)| Op::Callback(s, e, p, g, v)),
        2 => any::<u8>().prop_map(Op::Replay),
        6 => any::<u8>().prop_map(Op::Perform),
        2 => exec.prop_map(Op::Stopped),
        1 => sess.clone().prop_map(Op::Dismiss),
        1 => (sess, 1u8..24).prop_map(|(s, n)| Op::Churn(s, n)),
        3 => (1u16..20_000).prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

struct World {
    h: H,
    started: Vec<(u64, AttemptId)>,
    leases: Vec<LeaseId>,
    callbacks: Vec<Input>,
    next_turn: u64,
    next_stamp: u64,
    /// The attempt each (execution, generation) was bound to.
    bound_to: BTreeMap<(u64, u64), AttemptId>,
    /// Leases the core confirmed: their effects were carried out.
    performed: BTreeSet<LeaseId>,
    /// (session, turn)s whose acceptance or stream the core took: the provider has them.
    taken: BTreeSet<(u64, u64)>,
}

impl World {
    fn attempt(&self, session: u64, p: &Pick) -> Option<AttemptId> {
        let of: Vec<AttemptId> = self
            .started
            .iter()
            .filter(|(s, _)| *s == session)
            .map(|(_, a)| *a)
            .collect();
        match p {
            Pick::Newest => of.last().copied(),
            Pick::Nth(k) => {
                let all: Vec<AttemptId> = self.started.iter().map(|(_, a)| *a).collect();
                all.get(usize::from(*k) % all.len().max(1)).copied()
            }
            Pick::Unminted => AttemptId::new(self.h.core().epoch(), MAX_ATTEMPT_SEQ),
            Pick::None => None,
        }
    }

    fn generation(&self, exec: u64, g: &GenPick) -> Generation {
        let current = self
            .h
            .log()
            .iter()
            .rev()
            .find_map(|e| match e {
                Effect::LoadConversation {
                    execution,
                    generation,
                    ..
                }
                | Effect::NewConversation {
                    execution,
                    generation,
                    ..
                }
                | Effect::DispatchPrompt {
                    execution,
                    generation,
                    ..
                } if execution.get() == exec => Some(generation.get()),
                _ => None,
            })
            .or(self.h.bound.get(&exec).copied())
            .unwrap_or(1);
        let raw = match g {
            GenPick::Current => current,
            GenPick::Older => current.saturating_sub(1).max(1),
            GenPick::Future => current + 3,
        };
        Generation::new(raw).unwrap()
    }

    /// The liveness phase's provider: it finishes every turn it has (the last dispatch of
    /// each turn whose prompt was carried out, or whose acceptance or stream the core took),
    /// from the runtime it was dispatched to, as a well-behaved agent does. A turn already
    /// ended is refused by the core as a late callback.
    fn finish_turns(&mut self) {
        let mut last: BTreeMap<(u64, u64), (u64, u64, LeaseId)> = BTreeMap::new();
        for e in self.h.log() {
            if let Effect::DispatchPrompt {
                lease,
                session,
                execution,
                generation,
                turn,
                ..
            } = e
            {
                last.insert(
                    (session.get(), turn.get()),
                    (execution.get(), generation.get(), *lease),
                );
            }
        }
        for ((session, turn), (exec, generation, lease)) in last {
            if !self.performed.contains(&lease) && !self.taken.contains(&(session, turn)) {
                continue;
            }
            let Some(&attempt) = self.bound_to.get(&(exec, generation)) else {
                continue;
            };
            self.h.input(Input::Callback(Callback {
                session: s_id(session),
                execution: e_id(exec),
                attempt: Some(attempt),
                generation: Generation::new(generation).unwrap(),
                event: RuntimeEvent::PromptCompleted {
                    turn: TurnId::new(turn).unwrap(),
                },
            }));
        }
    }

    fn collect(&mut self) {
        for e in self.h.last().to_vec().iter() {
            match e {
                Effect::StartRuntime {
                    session, attempt, ..
                } => self.started.push((session.get(), *attempt)),
                Effect::LoadConversation { lease, .. }
                | Effect::NewConversation { lease, .. }
                | Effect::DispatchPrompt { lease, .. } => self.leases.push(*lease),
                _ => {}
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Resume(s) => {
                self.h.resume(u64::from(*s));
            }
            Op::Prompt(s) => {
                self.next_turn += 1;
                self.h.prompt(u64::from(*s), self.next_turn);
            }
            Op::Cancel(s) => {
                self.h.cancel(u64::from(*s));
            }
            Op::Bind(s, p, e) => {
                let session = u64::from(*s);
                if let Some(a) = self.attempt(session, p) {
                    if let Verdict::Bound { generation } = self.h.bind(session, a, u64::from(*e)) {
                        self.h.bound.insert(u64::from(*e), generation.get());
                        self.bound_to.insert((u64::from(*e), generation.get()), a);
                    }
                }
            }
            Op::Callback(s, e, p, g, v) => {
                let session = u64::from(*s);
                let exec = u64::from(*e);
                let attempt = self.attempt(session, p);
                let generation = self.generation(exec, g);
                self.next_stamp += 1;
                let turn = TurnId::new(self.next_turn.max(1)).unwrap();
                const MESSAGES: [&str; 3] = [
                    "Resource not found: s",
                    "resource not found while resolving configuration",
                    "Internal error",
                ];
                let load = |code: i64, timeout: bool, m: u8| LoadOutcome {
                    load_capability: Some(true),
                    requested_session: "s".into(),
                    result: if timeout {
                        LoadFailure::TimedOut
                    } else {
                        LoadFailure::Rpc(ErrorAnswer {
                            code,
                            message: MESSAGES[usize::from(m) % 3].into(),
                            data_details: None,
                            data_present: false,
                        })
                    },
                    transport: TransportState::Open,
                    listing: SessionListing::Unknown,
                };
                let event = match v {
                    Ev::Boot => RuntimeEvent::BootReady,
                    Ev::AgentReady(c) => RuntimeEvent::AgentReady {
                        load_capability: *c,
                    },
                    Ev::Created => RuntimeEvent::ConversationCreated {
                        token: token(self.next_stamp),
                    },
                    Ev::Loaded => RuntimeEvent::ConversationLoaded,
                    Ev::LoadFailed(c, t, m) => RuntimeEvent::LoadFailed(load(*c, *t, *m)),
                    Ev::StartFailed => RuntimeEvent::StartFailed {
                        stamp: stamp(self.next_stamp),
                    },
                    Ev::Accepted => RuntimeEvent::PromptAccepted { turn },
                    Ev::Stream(n) => RuntimeEvent::Stream {
                        turn,
                        seq: u64::from(*n),
                        bytes: 8,
                    },
                    Ev::Completed => RuntimeEvent::PromptCompleted { turn },
                    Ev::Failed => RuntimeEvent::PromptFailed {
                        turn,
                        stamp: stamp(self.next_stamp),
                    },
                    Ev::Exited => RuntimeEvent::Exited {
                        stamp: stamp(self.next_stamp),
                    },
                };
                let input = Input::Callback(Callback {
                    session: s_id(session),
                    execution: e_id(exec),
                    attempt,
                    generation,
                    event,
                });
                self.callbacks.push(input.clone());
                let verdict = self.h.input(input);
                if verdict == Verdict::Accepted && matches!(v, Ev::Accepted | Ev::Stream(_)) {
                    self.taken.insert((session, turn.get()));
                }
            }
            Op::Replay(k) => {
                if !self.callbacks.is_empty() {
                    let input = self.callbacks[usize::from(*k) % self.callbacks.len()].clone();
                    self.h.input(input);
                }
            }
            Op::Perform(k) => {
                if !self.leases.is_empty() {
                    let lease = self.leases[usize::from(*k) % self.leases.len()];
                    if self.h.perform(lease) == Verdict::Accepted {
                        self.performed.insert(lease);
                    }
                }
            }
            Op::Stopped(e) => {
                self.h.input(Input::Stopped {
                    execution: e_id(u64::from(*e)),
                });
            }
            Op::Dismiss(s) => {
                self.h.input(Input::DismissFailure {
                    session: s_id(u64::from(*s)),
                });
            }
            Op::Churn(s, n) => {
                for _ in 0..*n {
                    self.h.resume(u64::from(*s));
                    self.collect();
                    self.h.cancel(u64::from(*s));
                }
            }
            Op::Advance(ms) => self.h.advance(u64::from(*ms)),
            Op::Restart => self.h.restart(),
        }
        self.collect();
    }
}

fn s_id(n: u64) -> SessionId {
    SessionId::new(n).unwrap()
}
fn e_id(n: u64) -> ExecutionId {
    ExecutionId::new(n).unwrap()
}

/// `PALISADE_MUTANT=<name>` runs the model test against a mutant (to measure its power).
fn with_env_mutant(h: H) -> H {
    #[cfg(feature = "mutants")]
    if let Some(m) = std::env::var("PALISADE_MUTANT")
        .ok()
        .and_then(|n| palisade_core::mutants::Mutant::from_name(&n))
    {
        return h.mutant(m);
    }
    h
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn random_operation_sequences_keep_every_rule(ops in proptest::collection::vec(op(), 1..120)) {
        let mut w = World { h: with_env_mutant(H::default()), started: vec![], leases: vec![], callbacks: vec![], next_turn: 0, next_stamp: 0, bound_to: BTreeMap::new(), performed: BTreeSet::new(), taken: BTreeSet::new() };
        for (i, op) in ops.iter().enumerate() {
            w.apply(op);
            prop_assert!(w.h.violation().is_none(), "after step {i} {op:?}: {:?}", w.h.violation());
        }
        // Liveness: stop the inputs, let the provider finish the turns it has (the core sets
        // no deadline on a turn an agent works on), let every deadline pass, answer every
        // teardown.
        for _ in 0..8 {
            w.finish_turns();
            w.h.advance(120_000);
            let stops: Vec<ExecutionId> = w.h.log().iter().filter_map(|e| match e { Effect::StopExecution { execution, .. } => Some(*execution), _ => None }).collect();
            for e in stops {
                w.h.input(Input::Stopped { execution: e });
            }
        }
        prop_assert!(w.h.violation().is_none(), "{:?}", w.h.violation());
        prop_assert_eq!(w.h.audit().check_quiescent(), Ok(()));
    }
}
