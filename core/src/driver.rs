//! The one loop around [`Core`] that every embedder uses: the production embedding
//! (`palisade-engine`'s engine), the simulator, the fuzz harness and the core's own tests.
//!
//! A [`Driver`] owns the core and makes the embed loop non-re-entrant by construction:
//!
//! - **One input at a time.** [`Driver::handle`] feeds an input only when the driver is
//!   idle (every effect of earlier inputs was pulled). Inputs an embedder raises *while
//!   carrying out effects* go to a FIFO inbox with [`Driver::enqueue`] and reach the core
//!   after the pending effects, never in the middle of them. (A nested `handle` is refused
//!   with [`RejectReason::Reentrant`], state untouched.)
//! - **Verdicts are outputs.** The verdict of a queued input comes back from
//!   [`Driver::poll_output`] as [`Output::Verdict`], under the [`Ticket`] `enqueue`
//!   returned, when the input reaches the core: a `Bound`'s generation is never lost.
//! - **The lease check on pull** (rule 4). A leased effect is confirmed with
//!   [`Input::Perform`] in the same call that hands it out ([`Driver::poll_output`]), so
//!   validation and the act are one step; a refused one is never handed out.
//! - **One output**, after str0m: drain [`Driver::poll_output`] until it returns
//!   [`Output::Timeout`] or [`Output::Idle`], carrying out each [`Output::Effect`] and
//!   reading each [`Output::Verdict`].
//! - **An observer hook** ([`Observer`]) sees every step the core takes — its input and
//!   verdict (or timeout, or restore) and the effects it queued, with the core after the
//!   step — before any of those effects is carried out. Checkers (the reference model,
//!   `check_invariants`) and trace recorders plug in here.
//!
//! ```
//! use palisade_core::driver::{Driver, Output};
//! use palisade_core::*;
//!
//! let core = Core::new(Config::default(), Epoch::FIRST).unwrap();
//! let mut driver = Driver::new(core);
//! let session = SessionId::new(1).unwrap();
//! let now = Timestamp::from_millis(0);
//! assert_eq!(driver.handle(now, Input::Resume { session }), Verdict::Started {
//!     attempt: driver.core().live_attempt(session).unwrap(),
//! });
//! let mut bind = None;
//! let mut generation = None;
//! loop {
//!     match driver.poll_output(now) {
//!         Output::Effect(Effect::StartRuntime { session, attempt, .. }) => {
//!             // Spawn the runtime; its report is an input raised while carrying out an
//!             // effect, so it waits in the inbox for the effects before it.
//!             let execution = ExecutionId::new(7).unwrap();
//!             bind = Some(driver.enqueue(Input::Bound { session, attempt, execution }).unwrap());
//!         }
//!         Output::Effect(_) => {}
//!         // The queued input reached the core: its verdict comes back under its ticket.
//!         Output::Verdict { ticket, verdict: Verdict::Bound { generation: g } } => {
//!             assert_eq!(Some(ticket), bind);
//!             generation = Some(g);
//!         }
//!         Output::Verdict { verdict, .. } => panic!("{verdict:?}"),
//!         Output::Timeout(_) | Output::Idle => break,
//!     }
//! }
//! assert!(generation.is_some(), "the runtime's callbacks carry this generation");
//! assert!(driver.is_idle());
//! ```

use std::collections::VecDeque;

use crate::core::Core;
use crate::ids::{LeaseId, SessionId};
use crate::io::{Effect, Input, RejectReason, Verdict};
use crate::time::Timestamp;

/// Inputs waiting in the inbox at most. An embedder raises a handful per effect; more
/// means it raises inputs in a loop, which is its bug, refused rather than grown without
/// bound.
pub const MAX_INBOX: usize = 4096;

/// The receipt for an input queued with [`Driver::enqueue`]: its verdict comes back from
/// [`Driver::poll_output`] as an [`Output::Verdict`] with the same ticket. Tickets count up
/// from 1 per driver, in the order the inputs were queued (and reach the core).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

impl Ticket {
    /// The ticket's number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// What the embedder must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Carry this effect out now. A leased effect's lease was confirmed in this very call
    /// (under [`LeaseCheck::OnPull`]): act on it before feeding anything else.
    Effect(Effect),
    /// A queued input reached the core: its verdict (the observer saw it too). The effects
    /// it caused come next.
    Verdict {
        /// What [`Driver::enqueue`] returned for the input.
        ticket: Ticket,
        /// The core's verdict.
        verdict: Verdict,
    },
    /// Nothing to do until then: call [`Driver::handle_timeout`] at that time (or earlier,
    /// when an input arrives).
    Timeout(Timestamp),
    /// Nothing to do and no timer armed.
    Idle,
}

/// Who confirms a leased effect's lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseCheck {
    /// The driver, when the effect is pulled: the only mode a production embedder needs.
    #[default]
    OnPull,
    /// The caller, with an explicit [`Input::Perform`] whenever it chooses. For harnesses
    /// that model an embedder with its own asynchronous work between an effect and its
    /// act (the core's tests, the fuzzer): the lease then guards that gap. Feature
    /// `harness` only: a production build has no mode that opens the gap.
    #[cfg(feature = "harness")]
    ByCaller,
}

/// One step the core took, as an [`Observer`] sees it.
#[derive(Clone, Copy, Debug)]
pub enum Step<'a> {
    /// An input and the core's verdict.
    Input {
        /// The input.
        input: &'a Input,
        /// The verdict.
        verdict: &'a Verdict,
        /// The session the input is about: its own, or for [`Input::Perform`] the leased
        /// effect's (`None` for [`Input::Stopped`] and for an unknown lease).
        session: Option<SessionId>,
    },
    /// Timers fired ([`Driver::handle_timeout`]); the effects may be empty.
    Timeout {
        /// The sessions of the timers that were due when they fired, in timer order, as
        /// the core held them before the step (a teardown timer's is its execution's, a
        /// lease timer's its lease's; a timer of a record already gone names none, and
        /// fires nothing). Every timer that fired is among them; one that stayed pending
        /// (the effect queue was full) may be too.
        due: &'a [SessionId],
    },
    /// The core was restored from a snapshot ([`Driver::restore`]); the effects are the
    /// ones the restore queued.
    Restored,
}

/// Sees every step of the core, with the core after the step and the effects it queued,
/// before any of them is carried out. Checkers and trace recorders implement it.
pub trait Observer {
    /// One step. `now` is the time the embedder passed in.
    fn observe(&mut self, now: Timestamp, core: &Core, step: Step<'_>, effects: &[Effect]);
}

/// The observer that observes nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn observe(&mut self, _: Timestamp, _: &Core, _: Step<'_>, _: &[Effect]) {}
}

impl<O: Observer + ?Sized> Observer for Box<O> {
    fn observe(&mut self, now: Timestamp, core: &Core, step: Step<'_>, effects: &[Effect]) {
        (**self).observe(now, core, step, effects);
    }
}

impl<O: Observer> Observer for Option<O> {
    fn observe(&mut self, now: Timestamp, core: &Core, step: Step<'_>, effects: &[Effect]) {
        if let Some(o) = self {
            o.observe(now, core, step, effects);
        }
    }
}

/// Counters of a driver. Monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Steps the core took (inputs, timeouts, restores).
    pub steps: u64,
    /// Leased effects confirmed on pull and handed out.
    pub leases_confirmed: u64,
    /// Leased effects whose lease was refused on pull (never handed out).
    pub leases_refused: u64,
    /// Inputs refused because they were fed while effects were pending (embedder bugs).
    pub reentrant_refused: u64,
    /// Inputs refused because the inbox was full (embedder bugs).
    pub inbox_full: u64,
}

/// The non-re-entrant driver around a [`Core`]. See the module docs for the call order.
#[derive(Debug)]
pub struct Driver<O: Observer = NoObserver> {
    core: Core,
    observer: O,
    leases: LeaseCheck,
    /// Inputs raised while effects were pending, in arrival order, with their tickets.
    inbox: VecDeque<(Ticket, Input)>,
    /// The last ticket handed out.
    last_ticket: Ticket,
    /// Effects the core queued and the embedder has not pulled yet, in order.
    outbox: VecDeque<Effect>,
    /// Scratch buffer for one step's effects.
    scratch: Vec<Effect>,
    /// Scratch buffer for a timeout's due sessions ([`Step::Timeout`]).
    due: Vec<SessionId>,
    stats: DriverStats,
}

impl Driver<NoObserver> {
    /// A driver with no observer that confirms leases on pull.
    pub fn new(core: Core) -> Driver<NoObserver> {
        Driver::with_observer(core, NoObserver)
    }
}

impl<O: Observer> Driver<O> {
    /// A driver with `observer` that confirms leases on pull. Effects the core already
    /// holds (a restored core's) are observed as [`Step::Restored`] and wait for pulling.
    pub fn with_observer(core: Core, observer: O) -> Driver<O> {
        let mut driver = Driver {
            core,
            observer,
            leases: LeaseCheck::OnPull,
            inbox: VecDeque::new(),
            last_ticket: Ticket(0),
            outbox: VecDeque::new(),
            scratch: Vec::new(),
            due: Vec::new(),
            stats: DriverStats::default(),
        };
        if driver.core.has_effects() {
            let now = driver.core.clock();
            driver.settle(now, Step::Restored);
        }
        driver
    }

    /// A driver for `core`, restored from a snapshot at `now` (its previous incarnation
    /// crashed): [`Driver::with_observer`], with the core's clock first raised to `now` as
    /// [`Driver::restore`] raises it (a snapshot carries the time of its own last step).
    pub fn restored(now: Timestamp, mut core: Core, observer: O) -> Driver<O> {
        core.observe(now);
        Driver::with_observer(core, observer)
    }

    /// Who confirms leases (default: [`LeaseCheck::OnPull`]; feature `harness`).
    #[cfg(feature = "harness")]
    #[must_use]
    pub fn lease_check(mut self, mode: LeaseCheck) -> Self {
        self.leases = mode;
        self
    }

    /// The core, to read (`check_invariants`, `snapshot`, queries). All input goes through
    /// the driver.
    #[must_use]
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The observer.
    #[must_use]
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// The observer, to read what it recorded or to change it.
    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }

    /// Counters so far.
    #[must_use]
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Re-creates a known bug in the core (feature `mutants`; tests, sim and fuzzer only).
    #[cfg(feature = "mutants")]
    pub fn set_mutant(&mut self, mutant: Option<crate::mutants::Mutant>) {
        self.core.set_mutant(mutant);
    }

    /// Says whether the embedder reads its runtimes' output now ([`Core::set_listening`]);
    /// it queues no effect.
    pub fn set_listening(&mut self, now: Timestamp, listening: bool) {
        self.core.set_listening(now, listening);
    }

    /// Whether every effect was pulled and no input waits: then [`Driver::handle`] may feed
    /// the next input.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.outbox.is_empty() && self.inbox.is_empty()
    }

    /// Feeds one input now and returns its verdict; its effects wait for
    /// [`Driver::poll_output`]. The driver must be idle: an input raised while carrying out
    /// an effect goes through [`Driver::enqueue`] instead, and one fed here is refused with
    /// [`RejectReason::Reentrant`] (nothing changes).
    #[must_use = "a rejection is a value; look at it"]
    pub fn handle(&mut self, now: Timestamp, input: Input) -> Verdict {
        if !self.is_idle() {
            self.stats.reentrant_refused += 1;
            return Verdict::Reject(RejectReason::Reentrant);
        }
        self.step(now, input)
    }

    /// Queues an input raised while carrying out effects: the core sees it after every
    /// effect pulled or pending now, in the order raised. Its verdict comes back from
    /// [`Driver::poll_output`] as [`Output::Verdict`] under the returned ticket (and goes to
    /// the observer). Refused with [`RejectReason::InboxFull`] only when [`MAX_INBOX`]
    /// inputs already wait; nothing changes then.
    pub fn enqueue(&mut self, input: Input) -> Result<Ticket, RejectReason> {
        if self.inbox.len() >= MAX_INBOX {
            self.stats.inbox_full += 1;
            return Err(RejectReason::InboxFull);
        }
        self.last_ticket = Ticket(self.last_ticket.0 + 1);
        self.inbox.push_back((self.last_ticket, input));
        Ok(self.last_ticket)
    }

    /// Fires every core timer due at `now`, if the driver is idle (otherwise the pending
    /// work comes first, and the next [`Output::Timeout`] asks again). Returns whether it
    /// ran.
    pub fn handle_timeout(&mut self, now: Timestamp) -> bool {
        if !self.is_idle() {
            return false;
        }
        let mut due = std::mem::take(&mut self.due);
        self.core.due_sessions(now, &mut due);
        self.core.handle_timeout(now);
        self.settle(now, Step::Timeout { due: &due });
        self.due = due;
        true
    }

    /// The core restarted from a snapshot (its previous incarnation crashed): `core`
    /// replaces the driver's, everything pending is dropped (it died with the process: a
    /// queued input gets no verdict),
    /// and the effects the restore queued are observed ([`Step::Restored`]) and wait for
    /// pulling. `now` is a time like any other the driver is handed: the restored core's
    /// clock is raised to it (a snapshot carries the time of its own last step, which may
    /// be long before), so a clock that reads earlier afterwards cannot move a deadline
    /// promised from then on before `now`. No timer fires here; the next
    /// [`Driver::handle_timeout`] fires the ones the downtime made due.
    pub fn restore(&mut self, now: Timestamp, mut core: Core) {
        core.observe(now);
        self.core = core;
        self.inbox.clear();
        self.outbox.clear();
        self.settle(now, Step::Restored);
    }

    /// The next thing to do. Drain until [`Output::Timeout`] or [`Output::Idle`]: pending
    /// effects first (a leased one confirmed right now), then queued inputs, one at a time,
    /// each answered with its [`Output::Verdict`] before its effects.
    pub fn poll_output(&mut self, now: Timestamp) -> Output {
        loop {
            if let Some(effect) = self.outbox.pop_front() {
                let lease = match (self.leases, effect.lease()) {
                    (LeaseCheck::OnPull, Some(lease)) => lease,
                    _ => return Output::Effect(effect),
                };
                if self.confirm(now, lease, effect.session()) {
                    self.stats.leases_confirmed += 1;
                    return Output::Effect(effect);
                }
                self.stats.leases_refused += 1;
                continue;
            }
            if let Some((ticket, input)) = self.inbox.pop_front() {
                let verdict = self.step(now, input);
                return Output::Verdict { ticket, verdict };
            }
            return match self.core.poll_timeout() {
                Some(at) => Output::Timeout(at),
                None => Output::Idle,
            };
        }
    }

    /// When [`Driver::handle_timeout`] must next be called, if the driver is idle.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.core.poll_timeout()
    }

    fn confirm(&mut self, now: Timestamp, lease: LeaseId, session: SessionId) -> bool {
        let input = Input::Perform { lease };
        let verdict = self.core.handle_ref(now, &input);
        self.observe_input(now, &input, &verdict, Some(session));
        verdict == Verdict::Accepted
    }

    fn step(&mut self, now: Timestamp, input: Input) -> Verdict {
        let verdict = self.core.handle_ref(now, &input);
        let session = input.session();
        self.observe_input(now, &input, &verdict, session);
        verdict
    }

    fn observe_input(
        &mut self,
        now: Timestamp,
        input: &Input,
        verdict: &Verdict,
        session: Option<SessionId>,
    ) {
        self.settle(
            now,
            Step::Input {
                input,
                verdict,
                session,
            },
        );
    }

    /// Moves the core's new effects to the outbox, after showing them to the observer.
    fn settle(&mut self, now: Timestamp, step: Step<'_>) {
        self.stats.steps += 1;
        let mut effects = std::mem::take(&mut self.scratch);
        while let Some(e) = self.core.poll_effect() {
            effects.push(e);
        }
        self.observer.observe(now, &self.core, step, &effects);
        self.outbox.extend(effects.drain(..));
        self.scratch = effects;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::ids::{Epoch, ExecutionId, TurnId};
    use crate::io::{Callback, RuntimeEvent};

    #[derive(Debug, Default)]
    struct Log(Vec<String>);

    impl Observer for Log {
        fn observe(&mut self, _: Timestamp, _: &Core, step: Step<'_>, effects: &[Effect]) {
            let what = match step {
                Step::Input { input, verdict, .. } => format!("{input:?} -> {verdict:?}"),
                Step::Timeout { due } => format!("timeout {due:?}"),
                Step::Restored => "restored".into(),
            };
            let names: Vec<&str> = effects.iter().map(Effect::name).collect();
            self.0.push(format!("{what} [{}]", names.join(",")));
        }
    }

    fn s(n: u64) -> SessionId {
        SessionId::new(n).unwrap()
    }

    fn driver() -> Driver<Log> {
        Driver::with_observer(
            Core::new(Config::default(), Epoch::FIRST).unwrap(),
            Log::default(),
        )
    }

    /// Drains every output, answering each effect with `answer`'s inputs (queued).
    fn drain(d: &mut Driver<Log>, now: Timestamp, answer: impl Fn(&Effect) -> Vec<Input>) {
        loop {
            match d.poll_output(now) {
                Output::Effect(e) => {
                    for input in answer(&e) {
                        d.enqueue(input).expect("room in the inbox");
                    }
                }
                Output::Verdict { .. } => {}
                Output::Timeout(_) | Output::Idle => return,
            }
        }
    }

    /// Found by cargo-fuzz (`fuzz/regressions/callback_orderings/restore-at-a-later-time-
    /// then-a-clock-reading-earlier`): a core restored from a snapshot of its last step
    /// kept that step's clock, not the restore's, so after a clock that read earlier
    /// than the restore it promised a joiner an answer by a time the restore had already
    /// passed, and answered late.
    #[test]
    fn a_restore_raises_the_clock_so_an_earlier_reading_cannot_shorten_a_promise() {
        let config = Config::default();
        let mut d = driver();
        let _ = d.handle(Timestamp::ZERO, Input::Resume { session: s(1) });
        drain(&mut d, Timestamp::ZERO, |_| vec![]);
        let snapshot = d.core().snapshot();
        let restart = Timestamp::from_millis(120_000);
        d.restore(restart, Core::restore(&snapshot).unwrap());
        drain(&mut d, restart, |_| vec![]);
        // The embedder's clock now reads earlier than at the restore.
        let earlier = Timestamp::from_millis(119_530);
        assert!(matches!(
            d.handle(earlier, Input::Resume { session: s(2) }),
            Verdict::Started { .. }
        ));
        let Output::Effect(Effect::StartRuntime { deadline, .. }) = d.poll_output(earlier) else {
            panic!("a runtime to start")
        };
        assert_eq!(deadline, restart.plus_millis(config.start_deadline_ms));
        drain(&mut d, earlier, |_| vec![]);
        let Verdict::Joined { until, .. } = d.handle(earlier, Input::Resume { session: s(2) })
        else {
            panic!("the second resume joins the first")
        };
        assert_eq!(until, restart.plus_millis(config.join_wait_ms));
        // The core asks to be woken by then, and answers the joiner when it is.
        let wake = d.poll_timeout().expect("a wake-up for the joiner");
        assert!(wake <= until, "woken at {wake}, promised by {until}");
        assert!(d.handle_timeout(until));
        let mut answered = false;
        while let Output::Effect(e) = d.poll_output(until) {
            answered |= matches!(e, Effect::JoinTimedOut { session, .. } if session == s(2));
        }
        assert!(answered, "{:?}", d.observer().0);
    }

    #[test]
    fn a_timeout_names_the_sessions_of_the_timers_due() {
        let mut d = driver();
        let _ = d.handle(Timestamp::ZERO, Input::Resume { session: s(1) });
        drain(&mut d, Timestamp::ZERO, |_| vec![]);
        let later = Timestamp::from_millis(1_000);
        let _ = d.handle(later, Input::Resume { session: s(2) });
        drain(&mut d, later, |_| vec![]);
        // Session 1's start deadline comes first; session 2's is not due yet.
        let first = d.poll_timeout().expect("a start deadline");
        assert!(first >= later, "{first}");
        assert!(d.handle_timeout(first));
        let log = &d.observer().0;
        assert!(
            log.last().unwrap().starts_with("timeout [SessionId(1)]"),
            "{log:?}"
        );
        // Nothing due: no session named.
        drain(&mut d, first, |_| vec![]);
        assert!(d.handle_timeout(first));
        assert!(d.observer().0.last().unwrap().starts_with("timeout []"));
    }

    #[test]
    fn an_input_fed_while_effects_are_pending_is_refused_untouched() {
        let mut d = driver();
        let now = Timestamp::ZERO;
        assert!(matches!(
            d.handle(now, Input::Resume { session: s(1) }),
            Verdict::Started { .. }
        ));
        assert!(!d.is_idle());
        let before = d.core().snapshot();
        assert_eq!(
            d.handle(now, Input::Cancel { session: s(1) }),
            Verdict::Reject(RejectReason::Reentrant)
        );
        assert_eq!(d.core().snapshot(), before);
        assert_eq!(d.stats().reentrant_refused, 1);
    }

    #[test]
    fn queued_inputs_reach_the_core_after_every_pending_effect() {
        let mut d = driver();
        let now = Timestamp::ZERO;
        let _ = d.handle(
            now,
            Input::Prompt {
                session: s(1),
                turn: TurnId::new(1).unwrap(),
            },
        );
        let execution = ExecutionId::new(9).unwrap();
        drain(&mut d, now, |e| match *e {
            Effect::StartRuntime {
                session, attempt, ..
            } => vec![Input::Bound {
                session,
                attempt,
                execution,
            }],
            _ => vec![],
        });
        let log = &d.observer().0;
        assert_eq!(log.len(), 2, "{log:?}");
        assert!(log[0].starts_with("Prompt"), "{log:?}");
        assert!(log[0].ends_with("[start_runtime]"), "{log:?}");
        assert!(log[1].starts_with("Bound"), "{log:?}");
        assert!(d.is_idle());
    }

    #[test]
    fn a_queued_bind_s_generation_comes_back_under_its_ticket() {
        let mut d = driver();
        let now = Timestamp::ZERO;
        let session = s(1);
        let _ = d.handle(
            now,
            Input::Prompt {
                session,
                turn: TurnId::new(1).unwrap(),
            },
        );
        let Output::Effect(Effect::StartRuntime { attempt, .. }) = d.poll_output(now) else {
            panic!("a runtime to start")
        };
        let execution = ExecutionId::new(4).unwrap();
        let bind = d
            .enqueue(Input::Bound {
                session,
                attempt,
                execution,
            })
            .unwrap();
        let late = d.enqueue(Input::Cancel { session: s(9) }).unwrap();
        assert!(late > bind);
        let Output::Verdict { ticket, verdict } = d.poll_output(now) else {
            panic!("the bind's verdict")
        };
        assert_eq!(ticket, bind);
        let Verdict::Bound { generation } = verdict else {
            panic!("{verdict:?}")
        };
        assert_eq!(
            d.poll_output(now),
            Output::Verdict {
                ticket: late,
                verdict: Verdict::Reject(RejectReason::UnknownSession)
            }
        );
        assert!(matches!(d.poll_output(now), Output::Timeout(_)));
        // The generation the runtime's callbacks must carry is the one the core bound.
        let boot = Input::Callback(Callback {
            session,
            execution,
            attempt: Some(attempt),
            generation,
            event: RuntimeEvent::BootReady,
        });
        assert_eq!(d.handle(now, boot), Verdict::Accepted);
    }

    #[test]
    fn a_full_inbox_refuses_the_next_input_untouched() {
        let mut d = driver();
        let now = Timestamp::ZERO;
        let _ = d.handle(now, Input::Resume { session: s(1) });
        for _ in 0..MAX_INBOX {
            d.enqueue(Input::Cancel { session: s(2) }).unwrap();
        }
        assert_eq!(
            d.enqueue(Input::Cancel { session: s(1) }),
            Err(RejectReason::InboxFull)
        );
        assert_eq!(d.stats().inbox_full, 1);
        let mut verdicts = 0;
        loop {
            match d.poll_output(now) {
                Output::Verdict { .. } => verdicts += 1,
                Output::Effect(_) => {}
                Output::Timeout(_) | Output::Idle => break,
            }
        }
        assert_eq!(verdicts, MAX_INBOX);
        assert!(
            d.core().live_attempt(s(1)).is_some(),
            "the refused cancel never ran"
        );
    }

    #[test]
    fn a_leased_effect_is_confirmed_when_pulled_and_a_revoked_one_never_leaves() {
        let mut d = driver();
        let now = Timestamp::ZERO;
        let session = s(1);
        let _ = d.handle(now, Input::Resume { session });
        let attempt = d.core().live_attempt(session).unwrap();
        let execution = ExecutionId::new(3).unwrap();
        drain(&mut d, now, |_| vec![]);
        let Verdict::Bound { generation } = d.handle(
            now,
            Input::Bound {
                session,
                attempt,
                execution,
            },
        ) else {
            panic!("bound")
        };
        drain(&mut d, now, |_| vec![]);
        let cb = |event| {
            Input::Callback(Callback {
                session,
                execution,
                attempt: Some(attempt),
                generation,
                event,
            })
        };
        // agent_ready asks for session/new under a lease. Pulled in time, the lease is
        // confirmed in the same call; pulled after its deadline, it is refused and the
        // effect never leaves (the attempt fails instead).
        assert_eq!(
            d.handle(
                now,
                cb(RuntimeEvent::AgentReady {
                    load_capability: Some(true)
                })
            ),
            Verdict::Accepted
        );
        let late = now.plus_millis(Config::default().lease_ms + 1);
        let mut pulled = Vec::new();
        while let Output::Effect(e) = d.poll_output(late) {
            pulled.push(e);
        }
        assert!(
            !pulled
                .iter()
                .any(|e| matches!(e, Effect::NewConversation { .. })),
            "{pulled:?}"
        );
        assert!(pulled
            .iter()
            .any(|e| matches!(e, Effect::FailureReported { .. })));
        assert_eq!(d.stats().leases_refused, 1);
        assert_eq!(d.stats().leases_confirmed, 0);
        assert!(d.observer().0.iter().any(|l| l.contains("LeaseExpired")));
    }
}
