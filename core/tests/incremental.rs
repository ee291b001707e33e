//! The shared checker walks only what a step could have changed (`audit::Checker`); the
//! reference is the full `Core::check_invariants` walk. After EVERY step of random
//! operation sequences — resumes, prompts, cancels, binds to fresh and reused executions,
//! callbacks from live, stale and forged attempts and generations, performed leases,
//! teardowns reported stopped, timers firing, restarts from a snapshot — both run, and they
//! must agree: no violation for either, or the same violation at the same step. The
//! sequences run on the real core and, with feature `mutants`, on each mutant (which is
//! what breaks the invariants, so the comparison sees failing verdicts too).

use palisade_core::audit::Checker;
use palisade_core::classify::{
    ErrorAnswer, LoadFailure, LoadOutcome, SessionListing, TransportState,
};
use palisade_core::driver::{Driver, LeaseCheck, Observer, Output, Step};
use palisade_core::*;

/// Runs the partial checker (no reference model, so nothing stops it before the core's
/// invariants do) and the full walk after every step, and records the first disagreement.
struct Both {
    partial: Checker,
    /// Steps seen, from 1.
    steps: u64,
    /// The first violation both agree on, with its step: the comparison ends there (the
    /// checker stops after its first finding).
    agreed: Option<(u64, String)>,
    /// The first disagreement.
    differs: Option<String>,
    /// Steps compared (a test must compare some).
    compared: u64,
}

impl Observer for Both {
    fn observe(&mut self, now: Timestamp, core: &Core, step: Step<'_>, effects: &[Effect]) {
        self.partial.observe(now, core, step, effects);
        self.steps += 1;
        if self.agreed.is_some() || self.differs.is_some() {
            return;
        }
        self.compared += 1;
        let full = core
            .check_invariants()
            .map_err(|e| format!("{}: core invariant: {}", e.rule, e.detail));
        let partial = match self.partial.found() {
            None => Ok(()),
            Some(f) if f.step == self.steps => Err(f.violation.to_string()),
            Some(f) => Err(format!("(stale, step {}) {}", f.step, f.violation)),
        };
        match (&full, &partial) {
            (Ok(()), Ok(())) => {}
            (Err(a), Err(b)) if a == b => self.agreed = Some((self.steps, a.clone())),
            _ => {
                let what = match step {
                    Step::Input { input, verdict, .. } => format!("{input:?} -> {verdict:?}"),
                    Step::Timeout { .. } => "timeout".into(),
                    Step::Restored => "restore".into(),
                };
                self.differs = Some(format!(
                    "step {} ({what}, effects {effects:?}): full walk {full:?}, partial {partial:?}",
                    self.steps
                ));
            }
        }
    }
}

/// A small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Takes an item of a non-empty list: mostly the oldest (in order), one time in
/// `reorder` any (reordered); and one time in `keep` leaves it there (duplicated).
fn take<T: Clone>(rng: &mut Rng, list: &mut Vec<T>, reorder: u64, keep: u64) -> T {
    let at = if rng.below(reorder) == 0 {
        rng.below(list.len() as u64) as usize
    } else {
        0
    };
    if rng.below(keep) == 0 {
        list[at].clone()
    } else {
        list.remove(at)
    }
}

/// A runtime the harness knows about: what it was bound to.
#[derive(Clone, Copy, Debug)]
struct Bound {
    session: SessionId,
    execution: ExecutionId,
    attempt: AttemptId,
    generation: Generation,
}

struct World {
    driver: Driver<Both>,
    mutant: Option<u8>,
    rng: Rng,
    now: Timestamp,
    /// Effects the harness has not answered yet (the newest last, a bounded window).
    pending: Vec<Effect>,
    bound: Vec<Bound>,
    /// Well-formed callbacks a runtime would send next (its script), oldest first.
    script: Vec<Callback>,
    turns: u64,
    stamps: u64,
}

const SESSIONS: u64 = 3;
const EXECUTIONS: u64 = 5;
const PENDING: usize = 48;

fn sid(n: u64) -> SessionId {
    SessionId::new(n).unwrap()
}

impl World {
    fn new(seed: u64, config: Config, mutant: Option<u8>) -> World {
        let core = Core::new(config.clone(), Epoch::FIRST).unwrap();
        let both = Both {
            partial: Checker::without_model(&config),
            steps: 0,
            agreed: None,
            differs: None,
            compared: 0,
        };
        let mut w = World {
            driver: Driver::with_observer(core, both).lease_check(LeaseCheck::ByCaller),
            mutant,
            rng: Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            now: Timestamp::ZERO,
            pending: Vec::new(),
            bound: Vec::new(),
            script: Vec::new(),
            turns: 0,
            stamps: 0,
        };
        w.set_mutant();
        w
    }

    #[cfg(feature = "mutants")]
    fn set_mutant(&mut self) {
        let m = self.mutant.map(|i| mutants::Mutant::ALL[usize::from(i)]);
        self.driver.set_mutant(m);
    }

    #[cfg(not(feature = "mutants"))]
    fn set_mutant(&mut self) {
        assert!(self.mutant.is_none());
    }

    fn drain(&mut self) {
        while let Output::Effect(e) = self.driver.poll_output(self.now) {
            self.pending.push(e);
        }
        if self.pending.len() > PENDING {
            let extra = self.pending.len() - PENDING;
            self.pending.drain(..extra);
        }
    }

    fn input(&mut self, input: Input) -> Verdict {
        let v = self.driver.handle(self.now, input);
        self.drain();
        v
    }

    fn stamp(&mut self) -> ErrorStamp {
        self.stamps += 1;
        ErrorStamp::new(self.stamps).unwrap()
    }

    fn event(&mut self) -> RuntimeEvent {
        let turn = TurnId::new(1 + self.rng.below(self.turns.max(1))).unwrap();
        match self.rng.below(12) {
            0 => RuntimeEvent::BootReady,
            1 => RuntimeEvent::AgentReady {
                load_capability: [None, Some(true), Some(false)][self.rng.below(3) as usize],
            },
            2 => RuntimeEvent::ConversationCreated {
                token: ConversationToken::new(1 + self.rng.below(1_000)).unwrap(),
            },
            3 => RuntimeEvent::ConversationLoaded,
            4 => {
                let code = [-32002, -32603, -32601, -32000, 0][self.rng.below(5) as usize];
                let result = if self.rng.below(4) == 0 {
                    LoadFailure::TimedOut
                } else {
                    LoadFailure::Rpc(ErrorAnswer {
                        code,
                        message: "Resource not found: s".into(),
                        data_details: None,
                        data_present: false,
                    })
                };
                RuntimeEvent::LoadFailed(LoadOutcome {
                    load_capability: Some(self.rng.below(2) == 0),
                    requested_session: "s".into(),
                    result,
                    transport: TransportState::Open,
                    listing: SessionListing::Unknown,
                })
            }
            5 => RuntimeEvent::StartFailed {
                stamp: self.stamp(),
            },
            6 | 7 => RuntimeEvent::PromptAccepted { turn },
            8 => RuntimeEvent::Stream {
                turn,
                seq: 1 + self.rng.below(4),
                bytes: self.rng.below(5_000) as u32,
            },
            9 => RuntimeEvent::PromptCompleted { turn },
            10 => RuntimeEvent::PromptFailed {
                turn,
                stamp: self.stamp(),
            },
            _ => RuntimeEvent::Exited {
                stamp: self.stamp(),
            },
        }
    }

    /// Answers one pending effect the way an embedder would (or a late, duplicated one).
    fn answer(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let effect = take(&mut self.rng, &mut self.pending, 3, 8);
        if let Some(lease) = effect.lease() {
            let _ = self.input(Input::Perform { lease });
        }
        let scripted = |w: &mut World, execution, generation, events: Vec<RuntimeEvent>| {
            let b = w
                .bound
                .iter()
                .rev()
                .find(|b| b.execution == execution && b.generation == generation)
                .copied();
            if let Some(b) = b {
                for event in events {
                    w.script.push(Callback {
                        session: b.session,
                        execution,
                        attempt: Some(b.attempt),
                        generation,
                        event,
                    });
                }
            }
        };
        match effect {
            Effect::NewConversation {
                execution,
                generation,
                ..
            } => {
                let token = ConversationToken::new(1 + self.rng.below(1_000)).unwrap();
                scripted(
                    self,
                    execution,
                    generation,
                    vec![RuntimeEvent::ConversationCreated { token }],
                );
            }
            Effect::LoadConversation {
                execution,
                generation,
                ..
            } => {
                let event = if self.rng.below(3) == 0 {
                    self.event()
                } else {
                    RuntimeEvent::ConversationLoaded
                };
                scripted(self, execution, generation, vec![event]);
            }
            Effect::DispatchPrompt {
                execution,
                generation,
                turn,
                ..
            } => {
                let mut events = vec![RuntimeEvent::PromptAccepted { turn }];
                for seq in 1..=self.rng.below(4) {
                    events.push(RuntimeEvent::Stream {
                        turn,
                        seq,
                        bytes: self.rng.below(5_000) as u32,
                    });
                }
                events.push(match self.rng.below(6) {
                    0 => RuntimeEvent::PromptFailed {
                        turn,
                        stamp: self.stamp(),
                    },
                    1 => RuntimeEvent::Exited {
                        stamp: self.stamp(),
                    },
                    _ => RuntimeEvent::PromptCompleted { turn },
                });
                scripted(self, execution, generation, events);
            }
            Effect::StartRuntime {
                session, attempt, ..
            } => {
                let execution = ExecutionId::new(1 + self.rng.below(EXECUTIONS)).unwrap();
                if let Verdict::Bound { generation } = self.input(Input::Bound {
                    session,
                    attempt,
                    execution,
                }) {
                    self.bound.push(Bound {
                        session,
                        execution,
                        attempt,
                        generation,
                    });
                    let load_capability =
                        [None, Some(true), Some(false)][self.rng.below(3) as usize];
                    scripted(
                        self,
                        execution,
                        generation,
                        vec![
                            RuntimeEvent::BootReady,
                            RuntimeEvent::AgentReady { load_capability },
                        ],
                    );
                }
            }
            Effect::StopExecution { execution, .. } => {
                let _ = self.input(Input::Stopped { execution });
            }
            _ => {}
        }
    }

    /// The next scripted callback (sometimes a later one: reordered; sometimes kept:
    /// duplicated).
    fn scripted(&mut self) {
        if self.script.is_empty() {
            return self.callback();
        }
        let cb = take(&mut self.rng, &mut self.script, 4, 10);
        let _ = self.input(Input::Callback(cb));
    }

    fn callback(&mut self) {
        let Some(&b) = self
            .bound
            .len()
            .checked_sub(1 + self.rng.below(4) as usize)
            .and_then(|i| self.bound.get(i))
            .or(self.bound.last())
        else {
            return;
        };
        let mut cb = Callback {
            session: b.session,
            execution: b.execution,
            attempt: Some(b.attempt),
            generation: b.generation,
            event: self.event(),
        };
        match self.rng.below(12) {
            0 => cb.attempt = None,
            1 => cb.session = sid(1 + self.rng.below(SESSIONS)),
            2 => cb.execution = ExecutionId::new(1 + self.rng.below(EXECUTIONS)).unwrap(),
            3 => cb.generation = Generation::new(1 + self.rng.below(30)).unwrap(),
            _ => {}
        }
        let _ = self.input(Input::Callback(cb));
    }

    fn step(&mut self) {
        let s = sid(1 + self.rng.below(SESSIONS));
        match self.rng.below(20) {
            0 | 1 => {
                let _ = self.input(Input::Resume { session: s });
            }
            2 | 3 => {
                self.turns += 1;
                let turn = TurnId::new(self.turns).unwrap();
                let _ = self.input(Input::Prompt { session: s, turn });
            }
            4 => {
                let _ = self.input(Input::Cancel { session: s });
            }
            5..=8 => self.answer(),
            9..=12 => self.scripted(),
            13 | 14 => self.callback(),
            15 => {
                let execution = ExecutionId::new(1 + self.rng.below(EXECUTIONS)).unwrap();
                let _ = self.input(Input::Stopped { execution });
            }
            16 => {
                let _ = self.input(Input::DismissFailure { session: s });
            }
            17 | 18 => {
                let most = [20, 400, 4_000][self.rng.below(3) as usize];
                self.now = self.now.plus_millis(1 + self.rng.below(most));
                self.driver.handle_timeout(self.now);
                self.drain();
            }
            _ => {
                if self.rng.below(4) == 0 {
                    let bytes = self.driver.core().snapshot();
                    if let Ok(core) = Core::restore(&bytes) {
                        self.driver.restore(self.now, core);
                        self.set_mutant();
                        self.pending.clear();
                        self.script.clear();
                        self.drain();
                    }
                } else {
                    // A lease performed late or twice, by number.
                    if let Some(lease) = LeaseId::new(1 + self.rng.below(40)) {
                        let _ = self.input(Input::Perform { lease });
                    }
                }
            }
        }
    }
}

fn config(rng: &mut Rng) -> Config {
    Config {
        lease_ms: 1 + rng.below(3_000),
        stop_deadline_ms: 1 + rng.below(5_000),
        start_deadline_ms: 100 + rng.below(5_000),
        join_wait_ms: 1 + rng.below(5_000),
        recovery_delays_ms: (0..rng.below(4)).map(|_| 1 + rng.below(2_000)).collect(),
        ..Config::default()
    }
}

/// Runs `seeds` sequences of `ops` operations; returns (steps compared, violations agreed
/// on). Panics on the first disagreement.
fn run(seeds: u64, ops: usize, mutant: Option<u8>) -> (u64, u64) {
    let (mut compared, mut agreed) = (0, 0);
    for seed in 0..seeds {
        let mut rng = Rng(seed.wrapping_add(0x5eed) | 1);
        let mut w = World::new(seed, config(&mut rng), mutant);
        for _ in 0..ops {
            w.step();
            let both = w.driver.observer();
            if let Some(d) = &both.differs {
                panic!("seed {seed}, mutant {mutant:?}: the partial check differs: {d}");
            }
            if both.agreed.is_some() {
                break;
            }
        }
        let both = w.driver.observer();
        compared += both.compared;
        agreed += u64::from(both.agreed.is_some());
    }
    (compared, agreed)
}

#[test]
fn the_partial_check_matches_the_full_walk_after_every_step() {
    let (compared, agreed) = run(1_500, 400, None);
    // The sequences are long enough to matter, and the real core breaks nothing.
    assert!(compared > 400_000, "{compared} steps compared");
    assert_eq!(agreed, 0);
}

#[cfg(feature = "mutants")]
#[test]
fn the_partial_check_matches_the_full_walk_under_every_mutant() {
    let mut failing = 0;
    for m in 0..mutants::Mutant::ALL.len() {
        // Its bug trips the core's own rule-2 assertion (a panic) at the first attempt ID
        // a restart reuses: there is no state past it to walk.
        if mutants::Mutant::ALL[m] == mutants::Mutant::RestoreReusesAttemptIds {
            continue;
        }
        let (compared, agreed) = run(200, 400, Some(m as u8));
        assert!(compared > 5_000, "mutant {m}: {compared} steps compared");
        failing += agreed;
    }
    // Some mutants break the core's own invariants: the comparison saw failing verdicts.
    assert!(failing > 0, "no mutant broke an invariant");
}
