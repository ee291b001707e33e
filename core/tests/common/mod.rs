//! A driver for core tests, after quinn-proto's `Pair`: it keeps virtual time, feeds
//! inputs, drains effects into a log, and runs the auditor and `check_invariants` after
//! every step.
#![allow(dead_code)]

use palisade_core::audit::Auditor;
use palisade_core::*;

pub struct H {
    pub core: Core,
    pub now: Timestamp,
    pub audit: Auditor,
    /// Effects of the last step.
    pub last: Vec<Effect>,
    /// Every effect so far.
    pub log: Vec<Effect>,
    /// First audit violation seen (tests of mutants look here).
    pub violation: Option<String>,
    /// Last generation bound per execution (raw), for tests that forge callbacks.
    pub bound: std::collections::BTreeMap<u64, u64>,
    #[cfg(feature = "mutants")]
    pub mutant_kept: Option<palisade_core::mutants::Mutant>,
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
        let audit = Auditor::new(&config);
        H {
            core: Core::new(config, Epoch::FIRST).unwrap(),
            now: Timestamp::ZERO,
            audit,
            last: vec![],
            log: vec![],
            violation: None,
            bound: Default::default(),
            #[cfg(feature = "mutants")]
            mutant_kept: None,
        }
    }

    pub fn default() -> H {
        H::new(Config::default())
    }

    #[cfg(feature = "mutants")]
    pub fn mutant(mut self, m: palisade_core::mutants::Mutant) -> H {
        self.core.set_mutant(Some(m));
        self.mutant_kept = Some(m);
        self
    }

    fn drain(&mut self) -> Vec<Effect> {
        let mut v = vec![];
        while let Some(e) = self.core.poll_effect() {
            v.push(e);
        }
        if let Err(err) = self.core.check_invariants() {
            self.violation.get_or_insert(format!("invariant {err}"));
        }
        self.log.extend(v.iter().cloned());
        self.last = v.clone();
        v
    }

    pub fn input(&mut self, input: Input) -> Verdict {
        let v = self.core.handle(self.now, input.clone());
        let effects = self.drain();
        if let Err(err) = self.audit.observe(self.now, &input, &v, &effects) {
            self.violation.get_or_insert(err.to_string());
        }
        v
    }

    pub fn advance(&mut self, ms: u64) {
        let target = self.now.plus_millis(ms);
        while let Some(at) = self.core.poll_timeout() {
            if at > target {
                break;
            }
            self.now = self.now.max(at);
            self.core.handle_timeout(self.now);
            let effects = self.drain();
            if let Err(err) = self.audit.observe_timeout(self.now, &effects) {
                self.violation.get_or_insert(err.to_string());
            }
        }
        self.now = target;
    }

    pub fn restart(&mut self) {
        let snap = self.core.snapshot();
        #[cfg(feature = "mutants")]
        let mutant = self.core_mutant();
        self.core = Core::restore(&snap).expect("own snapshot restores");
        #[cfg(feature = "mutants")]
        self.core.set_mutant(mutant);
        let effects = self.drain();
        if let Err(err) = self.audit.observe_restart(self.now, &effects) {
            self.violation.get_or_insert(err.to_string());
        }
    }

    #[cfg(feature = "mutants")]
    fn core_mutant(&self) -> Option<palisade_core::mutants::Mutant> {
        self.mutant_kept
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
        self.log
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
        self.log
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
        self.log.iter().filter(|e| pred(e)).count()
    }

    /// Starts a runtime for the session's pending attempt on `exec` and brings it to a
    /// ready conversation (`load` decides load vs new). Returns (attempt, generation).
    pub fn ready(&mut self, session: u64, exec: u64) -> (AttemptId, Generation) {
        let a = self.started(session);
        let Verdict::Bound { generation: g } = self.bind(session, a, exec) else {
            panic!("bind failed: {:?}", self.last)
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
        let ev = if self.core.conversation(s(session)).is_some() {
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
        assert_eq!(self.perform(lease), Verdict::Accepted, "{:?}", self.last);
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
        assert_eq!(self.violation, None);
    }
}
