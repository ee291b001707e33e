//! A driver for core tests, after quinn-proto's `Pair`: it keeps virtual time, feeds
//! inputs, drains effects into a log, and runs the auditor and `check_invariants` after
//! every step.
#![allow(dead_code)]

use palisade_core::audit::{Auditor, Checker};
use palisade_core::driver::{Driver, LeaseCheck, Observer, Output, Step};
use palisade_core::*;

/// What the harness checks and records after every step of the core: the shared
/// checker (reference model and invariants), and the effects.
pub struct Checks {
    pub checker: Checker,
    /// Effects of the last step.
    pub last: Vec<Effect>,
    /// Every effect so far.
    pub log: Vec<Effect>,
}

impl Observer for Checks {
    fn observe(&mut self, now: Timestamp, core: &Core, step: Step<'_>, effects: &[Effect]) {
        self.checker.observe(now, core, step, effects);
        self.log.extend(effects.iter().cloned());
        self.last = effects.to_vec();
    }
}

pub struct H {
    /// The core behind the one driver every embedder uses; the tests perform leases
    /// themselves (`LeaseCheck::ByCaller`) to reach the gaps a lease guards.
    pub driver: Driver<Checks>,
    pub now: Timestamp,
    /// Last generation bound per execution (raw), for tests that forge callbacks.
    pub bound: std::collections::BTreeMap<u64, u64>,
}

pub fn s(n: u64) -> SessionId {
    SessionId::new(n).unwrap()
}
pub fn e(n: u64) -> ExecutionId {
    ExecutionId::new(n).unwrap()
}
pub fn t(n: u64) -> TurnId {
    TurnId::new(n).unwrap()
}
pub fn stamp(n: u64) -> ErrorStamp {
    ErrorStamp::new(n).unwrap()
}
pub fn token(n: u64) -> ConversationToken {
    ConversationToken::new(n).unwrap()
}

impl H {
    pub fn new(config: Config) -> H {
        let checks = Checks {
            checker: Checker::new(&config),
            last: vec![],
            log: vec![],
        };
        let core = Core::new(config, Epoch::FIRST).unwrap();
        H {
            driver: Driver::with_observer(core, checks).lease_check(LeaseCheck::ByCaller),
            now: Timestamp::ZERO,
            bound: Default::default(),
        }
    }

    pub fn default() -> H {
        H::new(Config::default())
    }

    #[cfg(feature = "mutants")]
    pub fn mutant(mut self, m: palisade_core::mutants::Mutant) -> H {
        self.driver.set_mutant(Some(m));
        self
    }

    pub fn core(&self) -> &Core {
        self.driver.core()
    }

    pub fn audit(&self) -> &Auditor {
        self.driver
            .observer()
            .checker
            .auditor()
            .expect("the tests run the model")
    }

    /// Effects of the last step.
    pub fn last(&self) -> &[Effect] {
        &self.driver.observer().last
    }

    /// Every effect so far.
    pub fn log(&self) -> &[Effect] {
        &self.driver.observer().log
    }

    /// The first violation seen, as text.
    pub fn violation(&self) -> Option<String> {
        self.driver
            .observer()
            .checker
            .found()
            .map(|f| f.violation.to_string())
    }

    /// Pulls every output (the test carries nothing out: it plays the embedder by hand).
    fn drain(&mut self) {
        while let Output::Effect(_) = self.driver.poll_output(self.now) {}
    }

    pub fn input(&mut self, input: Input) -> Verdict {
        let v = self.driver.handle(self.now, input);
        self.drain();
        v
    }

    /// Says whether the embedder reads its runtimes now ([`Core::set_listening`]).
    #[allow(dead_code)]
    pub fn listening(&mut self, on: bool) {
        self.driver.set_listening(self.now, on);
    }

    pub fn advance(&mut self, ms: u64) {
        let target = self.now.plus_millis(ms);
        while let Some(at) = self.driver.poll_timeout() {
            if at > target {
                break;
            }
            self.now = self.now.max(at);
            self.driver.handle_timeout(self.now);
            self.drain();
        }
        self.now = target;
    }

    pub fn restart(&mut self) {
        let snap = self.core().snapshot();
        #[cfg(feature = "mutants")]
        let mutant = self.core().mutant();
        let core = Core::restore(&snap).expect("own snapshot restores");
        self.driver.restore(self.now, core);
        #[cfg(feature = "mutants")]
        self.driver.set_mutant(mutant);
        self.drain();
    }

    pub fn resume(&mut self, session: u64) -> Verdict {
        self.input(Input::Resume {
            session: s(session),
        })
    }

    pub fn prompt(&mut self, session: u64, turn: u64) -> Verdict {
        self.input(Input::Prompt {
            session: s(session),
            turn: t(turn),
        })
    }

    pub fn cancel(&mut self, session: u64) -> Verdict {
        self.input(Input::Cancel {
            session: s(session),
        })
    }

    /// The attempt of the last StartRuntime for `session`.
    pub fn started(&self, session: u64) -> AttemptId {
        self.log()
            .iter()
            .rev()
            .find_map(|e| match e {
                Effect::StartRuntime {
                    session: ss,
                    attempt,
                    ..
                } if *ss == s(session) => Some(*attempt),
                _ => None,
            })
            .expect("an attempt was started")
    }

    pub fn bind(&mut self, session: u64, attempt: AttemptId, exec: u64) -> Verdict {
        self.input(Input::Bound {
            session: s(session),
            attempt,
            execution: e(exec),
        })
    }

    pub fn cb(
        &mut self,
        session: u64,
        exec: u64,
        attempt: Option<AttemptId>,
        generation: Generation,
        event: RuntimeEvent,
    ) -> Verdict {
        self.input(Input::Callback(Callback {
            session: s(session),
            execution: e(exec),
            attempt,
            generation,
            event,
        }))
    }

    /// The lease of the last effect with one, for `session`.
    pub fn last_lease(&self) -> LeaseId {
        self.log()
            .iter()
            .rev()
            .find_map(|e| match e {
                Effect::LoadConversation { lease, .. }
                | Effect::NewConversation { lease, .. }
                | Effect::DispatchPrompt { lease, .. } => Some(*lease),
                _ => None,
            })
            .expect("a leased effect")
    }

    pub fn perform(&mut self, lease: LeaseId) -> Verdict {
        self.input(Input::Perform { lease })
    }

    pub fn count(&self, pred: impl Fn(&Effect) -> bool) -> usize {
        self.log().iter().filter(|e| pred(e)).count()
    }

    /// Starts a runtime for the session's pending attempt on `exec` and brings it to a
    /// ready conversation (`load` decides load vs new). Returns (attempt, generation).
    pub fn ready(&mut self, session: u64, exec: u64) -> (AttemptId, Generation) {
        let a = self.started(session);
        let Verdict::Bound { generation: g } = self.bind(session, a, exec) else {
            panic!("bind failed: {:?}", self.last())
        };
        assert_eq!(
            self.cb(session, exec, Some(a), g, RuntimeEvent::BootReady),
            Verdict::Accepted
        );
        assert_eq!(
            self.cb(
                session,
                exec,
                Some(a),
                g,
                RuntimeEvent::AgentReady {
                    load_capability: Some(true)
                }
            ),
            Verdict::Accepted
        );
        let lease = self.last_lease();
        assert_eq!(self.perform(lease), Verdict::Accepted);
        let ev = if self.core().conversation(s(session)).is_some() {
            RuntimeEvent::ConversationLoaded
        } else {
            RuntimeEvent::ConversationCreated {
                token: token(session * 100 + exec),
            }
        };
        assert_eq!(self.cb(session, exec, Some(a), g, ev), Verdict::Accepted);
        (a, g)
    }

    /// Performs the pending dispatch and has the provider accept it.
    pub fn accept(&mut self, session: u64, exec: u64, a: AttemptId, g: Generation, turn: u64) {
        let lease = self.last_lease();
        assert_eq!(self.perform(lease), Verdict::Accepted, "{:?}", self.last());
        assert_eq!(
            self.cb(
                session,
                exec,
                Some(a),
                g,
                RuntimeEvent::PromptAccepted { turn: t(turn) }
            ),
            Verdict::Accepted
        );
    }

    pub fn assert_clean(&self) {
        assert_eq!(self.violation(), None);
    }
}
