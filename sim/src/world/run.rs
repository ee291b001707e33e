//! The world of one seed: an orchestrator (a thin shell around the real core, with a
//! durable store that survives its crash), the provider (agent controllers and agents),
//! and one client per session, as madsim tasks exchanging messages with delays,
//! duplication and reordering. The shell carries out effects and delivers inputs; every
//! decision is the core's.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::StreamExt;
use madsim::task::spawn_local;
use madsim::time::{sleep, Instant};

use palisade_core::delivery::{NotificationQueue, PushError};
use palisade_core::mutants::{ActiveMutant, Mutant};
use palisade_core::{
    AttemptId, Callback, Config, ConversationToken, Core, Effect, Epoch, ExecutionId, Generation,
    Input, LeaseId, RejectReason, RuntimeEvent, SessionId, Timestamp, TurnId, TurnOutcome, Verdict,
};

use super::oracle::Oracle;
use super::plan::{chance, mix, pick, Fault, FaultKind, FaultPlan, LoadErrorClass, WorkloadCut};
use super::provider::{load_failure, profile, AgentProc, Provider};
use super::trace::Tracer;
use super::Violation;
use crate::scenario::{Agent, Scenario};

/// The controller's own `session/load` deadline: past it, it reports a timeout.
const CONTROLLER_LOAD_TIMEOUT_MS: u64 = 5_000;
/// Prompts a client retries after a roll-back or failure.
const CLIENT_RETRIES: u32 = 2;
/// How long a user waits before resending a prompt the session refused as busy.
const CLIENT_BUSY_RETRY_MS: u64 = 100;
/// Notifications the controller forwards per millisecond of simulated time.
const DRAIN_PER_MS: usize = 64;

/// What travels to the orchestrator.
#[derive(Debug)]
enum Msg {
    /// An input from a client (`actor = client`), the provider (`provider`) or the
    /// executor (`executor`).
    Input(&'static str, Input),
    /// The orchestrator's own async work for a leased effect is done: perform it now.
    Perform(LeaseId, u32),
    /// A planned fault fires.
    Fault(Fault),
    /// Agents whose startup delay ended report `agent_ready`.
    AgentReady,
}

/// What a client hears about its prompt.
#[derive(Clone, Copy, Debug)]
enum ClientEvent {
    Rejected(TurnId, RejectReason),
    Ended(TurnId, TurnOutcome),
}

/// Per-session state of the world (faults armed for the next occurrence).
#[derive(Debug, Default)]
struct SessionFaults {
    burst: Option<u32>,
    /// Exits that found no running agent: the next agent to take a prompt dies mid-turn.
    exits_armed: u32,
    load_error: Option<LoadErrorClass>,
    load_timeout: bool,
    hang_teardown: bool,
    jitter: Vec<(u64, u64, f64, f64, f64, u64)>,
    msg_counter: u64,
    next_turn: u64,
    /// The first callback of the session's first attempt, held back for `late_callback`.
    first_callback: Option<Input>,
}

/// An agent starting up: (session, execution, attempt, generation, loadSession capability).
type Starting = (u32, ExecutionId, AttemptId, Generation, bool);

/// The world of one seed.
pub(crate) struct World {
    scenario: Rc<Scenario>,
    seed: u64,
    mutant: Option<Mutant>,
    start: Instant,
    /// madsim's clock, held so a read is one lock instead of `Instant::now()`'s trip
    /// through the intercepted `clock_gettime`.
    clock: madsim::time::TimeHandle,
    /// The clock's reading at `start`.
    start_elapsed: Duration,
    /// The clock, read once per task wake-up.
    now: u64,
    core: Core,
    incarnation: u32,
    skew_ms: i64,
    /// Messages in flight to the orchestrator, by (arrival ms, send order): one agenda
    /// instead of a task per message, and same-millisecond arrivals keep send order.
    /// The messages themselves sit in `letters` (the agenda, a min-heap, orders small
    /// slot numbers instead of moving whole `Msg`s); `free_letters` are slots to reuse.
    agenda: BinaryHeap<Reverse<(u64, u64, usize)>>,
    agenda_seq: u64,
    letters: Vec<Option<Msg>>,
    free_letters: Vec<usize>,
    /// While the orchestrator sleeps: until when, and its waker. A post that arrives
    /// before then wakes it; a later one does not need to (it is on the agenda, and the
    /// orchestrator's next sleep accounts for it).
    sleeping_until: Option<u64>,
    orchestrator: Option<Waker>,
    clients: BTreeMap<u32, UnboundedSender<ClientEvent>>,
    provider: Provider,
    sessions: BTreeMap<u32, SessionFaults>,
    /// How much of the scenario's own workload runs (the plan's cut).
    workload: WorkloadCut,
    /// Agents starting up: (ready at ms, exec, generation) → who.
    pending_ready: BTreeMap<(u64, u64, u64), Starting>,
    /// A spare effects buffer for `step`.
    effects: Vec<Effect>,
    /// The session of the leased effect being performed (an `Input::Perform` names only
    /// its lease), for the oracle.
    performing: Option<SessionId>,
    /// Leased effects waiting for the orchestrator's async work.
    leased: BTreeMap<LeaseId, (Effect, u64)>,
    /// Order-preserving delivery per agent connection: the last scheduled arrival.
    fifo: BTreeMap<(ExecutionId, Generation), u64>,
    pub(crate) tracer: Tracer,
    pub(crate) oracle: Oracle,
    pub(crate) violation: Option<Violation>,
}

type Shared = Rc<RefCell<World>>;

/// Borrows the world after a wake-up and brings its clock up to date.
fn enter(w: &Shared) -> std::cell::RefMut<'_, World> {
    let mut me = w.borrow_mut();
    me.now = me.elapsed_ms();
    me
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl World {
    /// Simulated milliseconds since the start, read from the clock now (equal to
    /// `Instant::now() - start`: both are madsim's elapsed time).
    fn elapsed_ms(&self) -> u64 {
        (self.clock.elapsed() - self.start_elapsed).as_millis() as u64
    }

    /// Simulated milliseconds since the start, as of the last [`enter`].
    fn now_ms(&self) -> u64 {
        self.now
    }

    fn core_now(&self) -> Timestamp {
        let t = self.now_ms() as i64 + self.skew_ms;
        Timestamp::from_millis(t.max(0) as u64)
    }

    fn key(&self, a: u64, b: u64, c: u64) -> u64 {
        mix(self.seed, a, b, c)
    }

    fn violate(&mut self, v: Violation) {
        if self.violation.is_none() {
            self.tracer.line(
                self.now_ms(),
                "oracle",
                "violation",
                &[("invariant", &v.invariant), ("message", &v.message)],
            );
            self.violation = Some(v);
        }
    }

    /// Feeds one input to the core and carries out what follows.
    fn step(&mut self, w: &Shared, actor: &'static str, input: Input) -> Verdict {
        let now = self.core_now();
        let verdict = self.core.handle(now, input.clone());
        // A nested step (an effect carried out below may take one) finds the buffer empty
        // and makes its own.
        let mut effects = std::mem::take(&mut self.effects);
        while let Some(e) = self.core.poll_effect() {
            effects.push(e);
        }
        let idx = self.tracer.input(self.now_ms(), actor, &input, &verdict);
        for e in &effects {
            self.tracer.effect(self.now_ms(), e);
        }
        let about = input.session().or(self.performing.take());
        if let Err(v) = self.oracle.step(
            &self.core,
            now,
            &input,
            about,
            &verdict,
            &effects,
            &self.provider,
            idx,
        ) {
            self.violate(v);
        }
        for e in effects.drain(..) {
            self.carry_out(w, e);
        }
        self.effects = effects;
        verdict
    }

    fn handle_timeout(&mut self, w: &Shared) {
        let now = self.core_now();
        self.core.handle_timeout(now);
        let mut effects = Vec::new();
        while let Some(e) = self.core.poll_effect() {
            effects.push(e);
        }
        if effects.is_empty() {
            self.oracle.tick(now);
            return;
        }
        let idx = self.tracer.line(self.now_ms(), "core", "timeout", &[]);
        for e in &effects {
            self.tracer.effect(self.now_ms(), e);
        }
        if let Err(v) = self.oracle.timeout(&self.core, now, &effects, idx) {
            self.violate(v);
        }
        for e in effects {
            self.carry_out(w, e);
        }
    }

    /// The first message due by `now`, taken off the agenda.
    fn due(&mut self, now: u64) -> Option<Msg> {
        match self.agenda.peek() {
            Some(&Reverse((at, _, _))) if at <= now => {
                let Reverse((_, _, slot)) = self.agenda.pop()?;
                self.free_letters.push(slot);
                self.letters[slot].take()
            }
            _ => None,
        }
    }

    /// Sends `msg` to the orchestrator `delay` ms from now.
    fn post(&mut self, delay: u64, msg: Msg) {
        let at = self.now_ms() + delay;
        self.agenda_seq += 1;
        let slot = match self.free_letters.pop() {
            Some(slot) => {
                self.letters[slot] = Some(msg);
                slot
            }
            None => {
                self.letters.push(Some(msg));
                self.letters.len() - 1
            }
        };
        self.agenda.push(Reverse((at, self.agenda_seq, slot)));
        if self.sleeping_until.is_some_and(|t| at < t) {
            self.sleeping_until = None;
            if let Some(w) = self.orchestrator.take() {
                w.wake();
            }
        }
    }

    /// A callback from an agent: through its connection (order-preserving), with the
    /// session's jitter faults (delay, duplicate, reorder).
    fn send_callback(
        &mut self,
        session: u32,
        exec: ExecutionId,
        attempt: AttemptId,
        generation: Generation,
        event: RuntimeEvent,
    ) {
        let now = self.now_ms();
        let input = Input::Callback(Callback {
            session: SessionId::new(u64::from(session)).expect("sessions start at 1"),
            execution: exec,
            attempt: Some(attempt),
            generation,
            event,
        });
        let sf = self.sessions.entry(session).or_default();
        sf.msg_counter += 1;
        let n = sf.msg_counter;
        if sf.first_callback.is_none() {
            sf.first_callback = Some(input.clone());
        }
        let jitter = sf.jitter.iter().find(|j| j.0 <= now && now < j.1).copied();
        let k = self.key(u64::from(session), n, 0xca11);
        let mut delay = 1 + k % 3;
        let mut duplicate = None;
        let mut ordered = true;
        if let Some((_, _, dp, up, rp, max)) = jitter {
            if chance(self.key(u64::from(session), n, 1), dp) {
                delay += pick(self.key(u64::from(session), n, 2), 1, max.max(1));
            }
            if chance(self.key(u64::from(session), n, 3), up) {
                duplicate = Some(pick(self.key(u64::from(session), n, 4), 1, max.max(1)));
            }
            let lifecycle = !matches!(
                &input,
                Input::Callback(Callback {
                    event: RuntimeEvent::Stream { .. }
                        | RuntimeEvent::PromptAccepted { .. }
                        | RuntimeEvent::PromptCompleted { .. }
                        | RuntimeEvent::PromptFailed { .. }
                        | RuntimeEvent::Exited { .. },
                    ..
                })
            );
            ordered = !(lifecycle && chance(self.key(u64::from(session), n, 5), rp));
        }
        let mut at = now + delay;
        if ordered {
            let last = self.fifo.entry((exec, generation)).or_insert(0);
            at = at.max(*last);
            *last = at;
        }
        if let Some(extra) = duplicate {
            self.post(at + extra - now, Msg::Input("provider", input.clone()));
        }
        self.post(at - now, Msg::Input("provider", input));
    }

    fn carry_out(&mut self, w: &Shared, effect: Effect) {
        let now = self.now_ms();
        match effect {
            Effect::StartRuntime {
                session, attempt, ..
            } => {
                let s = session.get() as u32;
                let delay = 1 + self.key(attempt.raw(), 7, 0) % 5;
                let reuse = self.key(attempt.raw(), 8, 0) % 10 < 6;
                let w2 = w.clone();
                spawn_local(async move {
                    sleep(ms(delay)).await;
                    let mut me = enter(&w2);
                    me.start_runtime(s, attempt, reuse, false);
                });
            }
            Effect::LoadConversation { lease, .. }
            | Effect::NewConversation { lease, .. }
            | Effect::DispatchPrompt { lease, .. } => {
                // The orchestrator's own async work before acting (reading the prompt from
                // its store, etc.); the delay fault stretches it.
                let session = match &effect {
                    Effect::LoadConversation { session, .. }
                    | Effect::NewConversation { session, .. }
                    | Effect::DispatchPrompt { session, .. } => session.get() as u32,
                    _ => unreachable!(),
                };
                let n = lease.get();
                let jitter = self
                    .sessions
                    .get(&session)
                    .and_then(|sf| sf.jitter.iter().find(|j| j.0 <= now && now < j.1).copied());
                let mut delay = self.key(n, 11, 0) % 3;
                if let Some((_, _, dp, _, _, max)) = jitter {
                    if chance(self.key(n, 12, 0), dp) {
                        delay += pick(self.key(n, 13, 0), 1, max.max(1));
                    }
                }
                self.leased.insert(lease, (effect, now));
                self.post(delay, Msg::Perform(lease, self.incarnation));
            }
            Effect::CancelPrompt { execution, .. } => {
                if let Some(a) = self
                    .provider
                    .containers
                    .get_mut(&execution)
                    .and_then(|c| c.agent.as_mut())
                {
                    a.cancel_requested = true;
                }
            }
            Effect::StopExecution {
                session, execution, ..
            } => {
                let s = session.get() as u32;
                let hang = self
                    .sessions
                    .get_mut(&s)
                    .is_some_and(|sf| std::mem::take(&mut sf.hang_teardown));
                self.provider.stop_pending.insert(execution);
                if let Some(c) = self.provider.containers.get_mut(&execution) {
                    c.stopping = true;
                }
                if hang {
                    self.tracer.line(
                        now,
                        "provider",
                        "teardown_hangs",
                        &[("execution", &execution.to_string())],
                    );
                } else {
                    let delay = 2 + self.key(execution.get(), now, 14) % 20;
                    let w2 = w.clone();
                    spawn_local(async move {
                        sleep(ms(delay)).await;
                        let mut me = enter(&w2);
                        me.provider.kill(execution);
                        me.provider.stop_pending.remove(&execution);
                        me.post(1, Msg::Input("executor", Input::Stopped { execution }));
                    });
                }
            }
            Effect::KillExecution { execution, .. } => {
                self.provider.kill(execution);
                self.provider.stop_pending.remove(&execution);
            }
            Effect::TurnEnded {
                session,
                turn,
                outcome,
            } => {
                if let Some(tx) = self.clients.get(&(session.get() as u32)) {
                    let _ = tx.unbounded_send(ClientEvent::Ended(turn, outcome));
                }
            }
            Effect::AttemptSettled { .. }
            | Effect::JoinTimedOut { .. }
            | Effect::Deliver { .. }
            | Effect::RecoveryStarted { .. }
            | Effect::RecoveryExhausted { .. }
            | Effect::FailureReported { .. } => {}
        }
    }

    /// The executor starts (or re-uses) a runtime for `attempt` and reports the binding.
    /// The executor starts (or re-uses) a runtime for `attempt`; its report of the
    /// binding travels to the orchestrator like any message (and may be late).
    fn start_runtime(&mut self, session: u32, attempt: AttemptId, reuse: bool, fresh_only: bool) {
        let exec = self.provider.allocate(session, reuse, fresh_only);
        let input = Input::Bound {
            session: SessionId::new(u64::from(session)).expect("1-based"),
            attempt,
            execution: exec,
        };
        let delay = self.message_delay(session, attempt.raw() ^ exec.get());
        self.post(delay, Msg::Input("executor", input));
    }

    /// Latency of a message of `session`, stretched by its jitter fault.
    fn message_delay(&self, session: u32, key: u64) -> u64 {
        let now = self.now_ms();
        let mut delay = 1 + self.key(key, 41, 0) % 3;
        let jitter = self
            .sessions
            .get(&session)
            .and_then(|sf| sf.jitter.iter().find(|j| j.0 <= now && now < j.1).copied());
        if let Some((_, _, dp, _, _, max)) = jitter {
            if chance(self.key(key, 42, 0), dp) {
                delay += pick(self.key(key, 43, 0), 1, max.max(1));
            }
        }
        delay
    }

    /// The orchestrator answered a binding report.
    fn bound(&mut self, session: u32, attempt: AttemptId, exec: ExecutionId, verdict: &Verdict) {
        match verdict {
            Verdict::Bound { generation } => self.boot(session, exec, attempt, *generation),
            Verdict::Reject(RejectReason::ExecutionStopping) => {
                // The executor re-created an ID the core is still tearing down: what it
                // just started under that ID is its own to kill; start a fresh one.
                if self
                    .provider
                    .containers
                    .get(&exec)
                    .is_some_and(|c| c.agent.is_none())
                {
                    self.provider.kill(exec);
                }
                self.start_runtime(session, attempt, false, true)
            }
            // The attempt is gone: the process stays up until the core's cleanup ownership
            // decides who stops it (the oracle's leak check holds it to that).
            _ => {}
        }
    }

    fn boot(
        &mut self,
        session: u32,
        exec: ExecutionId,
        attempt: AttemptId,
        generation: Generation,
    ) {
        if let Some(c) = self.provider.containers.get_mut(&exec) {
            // The executor starts the agent it was asked for, even if the previous process
            // under this ID died in the meantime (a managed-runtime restart).
            c.alive = true;
            c.stopping = false;
            if let Some(old) = c.agent.as_mut() {
                old.alive = false;
            }
            c.agent = Some(AgentProc {
                attempt,
                generation,
                alive: true,
                cancel_requested: false,
            });
        }
        let cap = self.scenario.workload.agent != Agent::NoLoad;
        self.send_callback(session, exec, attempt, generation, RuntimeEvent::BootReady);
        let b = self.scenario.workload.boot_delay_ms;
        let delay = pick(self.key(attempt.raw(), generation.get(), 44), b.lo, b.hi);
        if delay <= 1 {
            self.send_callback(
                session,
                exec,
                attempt,
                generation,
                RuntimeEvent::AgentReady {
                    load_capability: Some(cap),
                },
            );
        } else {
            self.pending_ready.insert(
                (self.now_ms() + delay, exec.get(), generation.get()),
                (session, exec, attempt, generation, cap),
            );
            self.post(delay, Msg::AgentReady);
        }
    }

    /// The agent process dies: its execution is gone, and its controller reports the exit
    /// on the agent's connection (after everything it already sent).
    fn agent_exits(&mut self, session: u32, exec: ExecutionId, agent: AgentProc) {
        self.provider.kill(exec);
        let stamp = self.provider.stamp();
        self.send_callback(
            session,
            exec,
            agent.attempt,
            agent.generation,
            RuntimeEvent::Exited { stamp },
        );
    }

    /// Carries out a leased effect whose lease the core just confirmed.
    fn perform(&mut self, w: &Shared, effect: Effect) {
        let now = self.now_ms();
        match effect {
            Effect::LoadConversation {
                session,
                execution,
                generation,
                token,
                ..
            } => {
                let s = session.get() as u32;
                let Some(agent) = self.provider.agent(execution, generation) else {
                    return;
                };
                let sf = self.sessions.entry(s).or_default();
                let class = sf.load_error.take();
                let timeout = std::mem::take(&mut sf.load_timeout);
                let wl = &self.scenario.workload;
                let delay = pick(
                    self.key(u64::from(s), agent.attempt.raw(), 21),
                    wl.load_delay_ms.lo,
                    wl.load_delay_ms.hi,
                );
                let requested = format!("conv-{}", token.get());
                let agent_kind = wl.agent;
                if matches!(class, Some(LoadErrorClass::UnknownSession)) {
                    // The provider really lost the conversation.
                    self.provider.conversations.remove(&token.get());
                }
                let exists = self.provider.conversations.contains(&token.get());
                let w2 = w.clone();
                spawn_local(async move {
                    if timeout || delay > CONTROLLER_LOAD_TIMEOUT_MS {
                        sleep(ms(CONTROLLER_LOAD_TIMEOUT_MS)).await;
                    } else {
                        sleep(ms(delay.max(1))).await;
                    }
                    let mut me = enter(&w2);
                    if me.provider.agent(execution, generation).is_none() {
                        return;
                    }
                    let timed_out = timeout || delay > CONTROLLER_LOAD_TIMEOUT_MS;
                    let event = if !timed_out && class.is_none() && exists {
                        RuntimeEvent::ConversationLoaded
                    } else {
                        let c = if exists {
                            class
                        } else {
                            Some(LoadErrorClass::UnknownSession)
                        };
                        RuntimeEvent::LoadFailed(load_failure(agent_kind, &requested, c, timed_out))
                    };
                    me.send_callback(s, execution, agent.attempt, generation, event);
                });
                let _ = now;
            }
            Effect::NewConversation {
                session,
                execution,
                generation,
                reason,
                ..
            } => {
                let s = session.get() as u32;
                let Some(agent) = self.provider.agent(execution, generation) else {
                    return;
                };
                if let Err(v) = self.oracle.new_conversation(
                    &self.core,
                    session,
                    reason,
                    &self.provider,
                    self.scenario.workload.agent,
                ) {
                    self.violate(v);
                }
                let conv = self.provider.new_conversation();
                let token = ConversationToken::new(conv).expect("counter starts at one");
                self.send_callback(
                    s,
                    execution,
                    agent.attempt,
                    generation,
                    RuntimeEvent::ConversationCreated { token },
                );
            }
            Effect::DispatchPrompt {
                session,
                execution,
                generation,
                turn,
                request,
                ..
            } => {
                let s = session.get() as u32;
                if let Err(v) = self.oracle.prompt_arrived(
                    s,
                    turn,
                    execution,
                    generation,
                    request,
                    &mut self.provider,
                ) {
                    self.violate(v);
                }
                let Some(agent) = self.provider.agent(execution, generation) else {
                    return;
                };
                if let Some(a) = self
                    .provider
                    .containers
                    .get_mut(&execution)
                    .and_then(|c| c.agent.as_mut())
                {
                    a.cancel_requested = false;
                }
                let burst = self.sessions.entry(s).or_default().burst.take();
                let wl = &self.scenario.workload;
                let k = self.key(
                    u64::from(s),
                    turn.get(),
                    u64::from(request.replay_generation),
                );
                let count = burst.unwrap_or_else(|| {
                    self.workload.notifications(pick(
                        k,
                        u64::from(wl.notifications_per_turn.lo),
                        u64::from(wl.notifications_per_turn.hi),
                    ) as u32)
                });
                let bytes = pick(
                    k >> 7,
                    u64::from(wl.notification_bytes.lo),
                    u64::from(wl.notification_bytes.hi),
                ) as u32;
                let capacity = self
                    .scenario
                    .core
                    .queue_capacity
                    .map_or(palisade_core::delivery::DEFAULT_QUEUE_CAPACITY, |c| {
                        c as usize
                    });
                let think = pick(k >> 13, wl.think_ms.lo, wl.think_ms.hi);
                let mutant = self.mutant.map_or(ActiveMutant::NONE, ActiveMutant::on);
                let recovering = request.replay_blocks > 0;
                let w2 = w.clone();
                spawn_local(stream(
                    w2,
                    s,
                    execution,
                    agent,
                    turn,
                    count,
                    bytes,
                    capacity,
                    think,
                    mutant,
                    burst.is_some(),
                    recovering,
                ));
            }
            _ => {}
        }
    }

    fn fault(&mut self, w: &Shared, f: Fault) {
        let now = self.now_ms();
        let s = f.session;
        let sid = SessionId::new(u64::from(s.max(1))).expect("1-based");
        self.tracer.fault(now, &f);
        match f.kind {
            FaultKind::Prompt => {
                let sf = self.sessions.entry(s).or_default();
                sf.next_turn += 1;
                let turn = TurnId::new(sf.next_turn).expect("non-zero");
                let v = self.step(w, "client", Input::Prompt { session: sid, turn });
                if v == Verdict::Reject(RejectReason::SessionBusy)
                    && now < self.scenario.limits.fault_window_ms
                {
                    // The user sees "busy" and sends it again a little later.
                    self.post(
                        CLIENT_BUSY_RETRY_MS,
                        Msg::Fault(Fault {
                            at_ms: now + CLIENT_BUSY_RETRY_MS,
                            ..f
                        }),
                    );
                }
            }
            FaultKind::Resume | FaultKind::Retry => {
                self.step(w, "client", Input::Resume { session: sid });
            }
            FaultKind::Cancel => {
                self.step(w, "client", Input::Cancel { session: sid });
            }
            FaultKind::ProviderExit => {
                if let Some((exec, agent)) = self.provider.running(s) {
                    self.agent_exits(s, exec, agent);
                } else {
                    // Nothing runs right now (a replacement is starting): the exit hits the
                    // next agent that takes a prompt, mid-turn.
                    self.sessions.entry(s).or_default().exits_armed += 1;
                }
            }
            FaultKind::CrashRestart => {
                let snapshot = self.core.snapshot();
                let in_flight = (1..=self.scenario.workload.sessions).any(|n| {
                    SessionId::new(u64::from(n))
                        .is_some_and(|id| self.core.live_attempt(id).is_some())
                });
                match Core::restore(&snapshot) {
                    Ok(mut core) => {
                        core.set_mutant(self.mutant);
                        self.core = core;
                        self.incarnation += 1;
                        self.leased.clear();
                        let mut effects = Vec::new();
                        while let Some(e) = self.core.poll_effect() {
                            effects.push(e);
                        }
                        let idx = self.tracer.line(
                            now,
                            "core",
                            "restart",
                            &[("epoch", &self.core.epoch().get().to_string())],
                        );
                        for e in &effects {
                            self.tracer.effect(now, e);
                        }
                        if in_flight {
                            self.oracle.mark("restart-with-attempt-in-flight");
                        }
                        if let Err(v) =
                            self.oracle
                                .restart(&self.core, self.core_now(), &effects, idx)
                        {
                            self.violate(v);
                        }
                        for e in effects {
                            self.carry_out(w, e);
                        }
                    }
                    Err(e) => self.violate(Violation {
                        invariant: "snapshot-restore".into(),
                        message: format!("own snapshot did not restore: {e}"),
                        events: vec![],
                    }),
                }
            }
            FaultKind::Burst { count } => self.sessions.entry(s).or_default().burst = Some(count),
            FaultKind::LateCallback { delay_ms } => {
                if let Some(cb) = self
                    .sessions
                    .get(&s)
                    .and_then(|sf| sf.first_callback.clone())
                {
                    self.post(delay_ms, Msg::Input("provider", cb));
                }
            }
            FaultKind::HangTeardown => self.sessions.entry(s).or_default().hang_teardown = true,
            FaultKind::LoadError { class } => {
                self.sessions.entry(s).or_default().load_error = Some(class)
            }
            FaultKind::LoadTimeout => self.sessions.entry(s).or_default().load_timeout = true,
            FaultKind::ClockJump { ms } => self.skew_ms = self.skew_ms.saturating_add(ms),
            FaultKind::Jitter {
                until_ms,
                delay_p,
                duplicate_p,
                reorder_p,
                max_delay_ms,
            } => {
                self.sessions.entry(s).or_default().jitter.push((
                    f.at_ms,
                    until_ms,
                    delay_p,
                    duplicate_p,
                    reorder_p,
                    max_delay_ms,
                ));
            }
        }
    }

    fn handle(&mut self, w: &Shared, msg: Msg) {
        match msg {
            Msg::Input(actor, input) => {
                let prompt = match &input {
                    Input::Prompt { session, turn } => Some((session.get() as u32, *turn)),
                    _ => None,
                };
                let bound = match &input {
                    Input::Bound {
                        session,
                        attempt,
                        execution,
                    } => Some((session.get() as u32, *attempt, *execution)),
                    _ => None,
                };
                let v = self.step(w, actor, input);
                if let Some((s, attempt, exec)) = bound {
                    self.bound(s, attempt, exec, &v);
                }
                if let (Some((s, turn)), Verdict::Reject(r)) = (prompt, v) {
                    if let Some(tx) = self.clients.get(&s) {
                        let _ = tx.unbounded_send(ClientEvent::Rejected(turn, r));
                    }
                }
            }
            Msg::Perform(lease, incarnation) => {
                if incarnation != self.incarnation {
                    return; // The orchestrator that started this work crashed.
                }
                let Some((effect, issued)) = self.leased.remove(&lease) else {
                    return;
                };
                self.performing = Some(effect.session());
                match self.step(w, "orchestrator", Input::Perform { lease }) {
                    Verdict::Accepted => self.perform(w, effect),
                    Verdict::Reject(RejectReason::LeaseExpired | RejectReason::UnknownLease)
                        if self.now_ms().saturating_sub(issued) >= self.core.config().lease_ms =>
                    {
                        // The work outlived its lease: the core dropped the late effect.
                        self.oracle.mark("lease-expired");
                    }
                    _ => {}
                }
            }
            Msg::Fault(f) => self.fault(w, f),
            Msg::AgentReady => {
                let now = self.now_ms();
                while let Some((&key, _)) = self.pending_ready.first_key_value() {
                    if key.0 > now {
                        break;
                    }
                    let (session, exec, attempt, generation, cap) =
                        self.pending_ready.remove(&key).expect("just seen");
                    if self.provider.agent(exec, generation).is_some() {
                        self.send_callback(
                            session,
                            exec,
                            attempt,
                            generation,
                            RuntimeEvent::AgentReady {
                                load_capability: Some(cap),
                            },
                        );
                    }
                }
            }
        }
    }

    /// The core's next deadline in simulated milliseconds.
    fn next_wake(&self) -> Option<u64> {
        let t = self.core.poll_timeout()?;
        if t == Timestamp::MAX {
            return None;
        }
        let sim = t.as_millis() as i64 - self.skew_ms;
        Some(sim.max(0) as u64)
    }
}

/// An agent answering a prompt: accepted, `count` notifications through the controller's
/// bounded queue (backpressure, never drop), then the end of the turn.
#[allow(clippy::too_many_arguments)]
async fn stream(
    w: Shared,
    session: u32,
    exec: ExecutionId,
    agent: AgentProc,
    turn: TurnId,
    count: u32,
    bytes: u32,
    capacity: usize,
    think: u64,
    mutant: ActiveMutant,
    burst: bool,
    recovering: bool,
) {
    let alive = |w: &Shared| {
        w.borrow()
            .provider
            .agent(exec, agent.generation)
            .filter(|a| !a.cancel_requested)
            .is_some()
    };
    sleep(ms(1)).await;
    if w.borrow().provider.agent(exec, agent.generation).is_none() {
        return;
    }
    enter(&w).send_callback(
        session,
        exec,
        agent.attempt,
        agent.generation,
        RuntimeEvent::PromptAccepted { turn },
    );
    let mut queue: NotificationQueue<u32> = NotificationQueue::with_mutant(capacity, mutant);
    let mut runtime_seq = 0u64;
    let pace = if burst {
        0
    } else {
        (think / u64::from(count.max(1))).max(1)
    };
    let drain =
        |w: &Shared, queue: &mut NotificationQueue<u32>, max: usize, runtime_seq: &mut u64| {
            let mut me = enter(w);
            for _ in 0..max {
                let Some((_, b)) = queue.pop() else { break };
                *runtime_seq += 1;
                me.send_callback(
                    session,
                    exec,
                    agent.attempt,
                    agent.generation,
                    RuntimeEvent::Stream {
                        turn,
                        seq: *runtime_seq,
                        bytes: b,
                    },
                );
            }
        };
    for _ in 0..count {
        if !alive(&w) {
            break;
        }
        let mut item = bytes;
        loop {
            match queue.try_push(item) {
                Ok(_) => break,
                Err(PushError::Backpressure(back)) => {
                    item = back;
                    {
                        let mut me = enter(&w);
                        me.provider.backpressure += 1;
                        if recovering {
                            me.oracle.mark("queue-full-during-recovery");
                        }
                    }
                    drain(&w, &mut queue, DRAIN_PER_MS, &mut runtime_seq);
                    sleep(ms(1)).await;
                    if !alive(&w) {
                        break;
                    }
                }
                Err(PushError::Closed(_)) => {
                    // The connection closed because the queue was full: the agent is gone.
                    drain(&w, &mut queue, usize::MAX, &mut runtime_seq);
                    let mut me = enter(&w);
                    me.provider.closed_on_full += 1;
                    me.agent_exits(session, exec, agent);
                    return;
                }
            }
        }
        if !burst {
            drain(&w, &mut queue, usize::MAX, &mut runtime_seq);
            let died = {
                let mut me = enter(&w);
                let armed = me
                    .sessions
                    .get(&session)
                    .is_some_and(|sf| sf.exits_armed > 0);
                if armed && runtime_seq >= 1 {
                    // An armed exit: the agent dies after its first notifications.
                    if let Some(sf) = me.sessions.get_mut(&session) {
                        sf.exits_armed -= 1;
                    }
                    me.agent_exits(session, exec, agent);
                }
                armed && runtime_seq >= 1
            };
            if died {
                return;
            }
            sleep(ms(pace)).await;
        }
    }
    while !queue.is_empty() && w.borrow().provider.agent(exec, agent.generation).is_some() {
        drain(&w, &mut queue, DRAIN_PER_MS, &mut runtime_seq);
        sleep(ms(1)).await;
    }
    let mut me = enter(&w);
    if me.provider.agent(exec, agent.generation).is_some() {
        me.send_callback(
            session,
            exec,
            agent.attempt,
            agent.generation,
            RuntimeEvent::PromptCompleted { turn },
        );
    }
}

/// A client: prompts with think time, waits for each answer, retries after a roll-back.
async fn client(
    w: Shared,
    session: u32,
    turns: u32,
    mut rx: UnboundedReceiver<ClientEvent>,
    until_ms: u64,
) {
    let sid = SessionId::new(u64::from(session)).expect("1-based");
    for k in 0..turns {
        let think = {
            let me = w.borrow();
            let wl = &me.scenario.workload;
            pick(
                me.key(u64::from(session), u64::from(k), 31),
                wl.think_ms.lo,
                wl.think_ms.hi,
            )
        };
        sleep(ms(think.max(1))).await;
        let mut tries = 0;
        loop {
            if enter(&w).now_ms() >= until_ms {
                return;
            }
            let turn = {
                let mut me = enter(&w);
                let sf = me.sessions.entry(session).or_default();
                sf.next_turn += 1;
                let turn = TurnId::new(sf.next_turn).expect("non-zero");
                me.post(
                    0,
                    Msg::Input("client", Input::Prompt { session: sid, turn }),
                );
                turn
            };
            let outcome = loop {
                match rx.next().await {
                    Some(ClientEvent::Ended(t, o)) if t == turn => break Some(Ok(o)),
                    Some(ClientEvent::Rejected(t, r)) if t == turn => break Some(Err(r)),
                    Some(_) => {}
                    None => break None,
                }
            };
            tries += 1;
            match outcome {
                Some(Ok(TurnOutcome::Completed | TurnOutcome::Cancelled)) | None => break,
                Some(Ok(TurnOutcome::RolledBack | TurnOutcome::Failed)) | Some(Err(_))
                    if tries <= CLIENT_RETRIES =>
                {
                    sleep(ms(50)).await;
                }
                Some(_) => break,
            }
        }
    }
}

/// Builds the core's configuration for a scenario.
pub(crate) fn core_config(scenario: &Scenario) -> Config {
    let c = &scenario.core;
    let d = Config::default();
    Config {
        join_wait_ms: c.join_wait_ms.unwrap_or(d.join_wait_ms),
        // Unless a scenario says otherwise, the core's start (and prompt acceptance)
        // deadline fits three times in the liveness window, so a stalled attempt is
        // resolved by the core, not cut off by the end of the run.
        start_deadline_ms: c.start_deadline_ms.unwrap_or(
            d.start_deadline_ms
                .min((scenario.limits.quiesce_ms / 3).max(1)),
        ),
        lease_ms: c.lease_ms.unwrap_or(d.lease_ms),
        stop_deadline_ms: c.stop_deadline_ms.unwrap_or(d.stop_deadline_ms),
        recovery_delays_ms: c.recovery_delays_ms.clone().unwrap_or(d.recovery_delays_ms),
        max_sessions: d.max_sessions,
        agent_profile: profile(scenario.workload.agent),
    }
}

/// What a finished seed leaves behind.
pub(crate) struct Finished {
    pub(crate) tracer: Tracer,
    pub(crate) marks: BTreeMap<String, u64>,
    pub(crate) turns: u32,
    pub(crate) violation: Option<Violation>,
}

/// Runs one seed inside the current madsim runtime.
pub(crate) async fn run(
    scenario: Rc<Scenario>,
    seed: u64,
    plan: FaultPlan,
    mutant: Option<Mutant>,
    capture: bool,
) -> Finished {
    let config = core_config(&scenario);
    let mut core = Core::new(config.clone(), Epoch::FIRST)
        .unwrap_or_else(|e| panic!("scenario core config invalid: {e}"));
    core.set_mutant(mutant);
    let window = scenario.limits.fault_window_ms;
    let end = window + scenario.limits.quiesce_ms;
    let mut clients = BTreeMap::new();
    let mut client_rx = Vec::new();
    for s in 1..=scenario.workload.sessions {
        let (ctx, crx) = unbounded();
        clients.insert(s, ctx);
        client_rx.push((s, crx));
    }
    let world = Rc::new(RefCell::new(World {
        oracle: Oracle::new(&config, &scenario),
        scenario: scenario.clone(),
        seed,
        mutant,
        start: Instant::now(),
        clock: madsim::time::TimeHandle::current(),
        start_elapsed: madsim::time::TimeHandle::current().elapsed(),
        now: 0,
        core,
        incarnation: 0,
        skew_ms: 0,
        agenda: BinaryHeap::new(),
        agenda_seq: 0,
        letters: Vec::new(),
        free_letters: Vec::new(),
        performing: None,
        effects: Vec::new(),
        sleeping_until: None,
        orchestrator: None,
        clients,
        provider: Provider::default(),
        sessions: BTreeMap::new(),
        workload: plan.workload.clone(),
        leased: BTreeMap::new(),
        pending_ready: BTreeMap::new(),
        fifo: BTreeMap::new(),
        tracer: Tracer::new(capture),
        violation: None,
    }));
    for f in &plan.faults {
        enter(&world).post(f.at_ms, Msg::Fault(*f));
    }
    for (s, crx) in client_rx {
        // A session cut from the workload has no client; what is sent to it is dropped.
        if !plan.workload.client_runs(s) {
            continue;
        }
        spawn_local(client(
            world.clone(),
            s,
            plan.workload.turns(scenario.workload.turns_per_session),
            crx,
            plan.workload.until_ms(window),
        ));
    }
    let start = world.borrow().start;
    let max_events = scenario.limits.max_events;
    // The time of the newest timer registered for the orchestrator that may not have
    // fired yet.
    let mut armed: Option<u64> = None;
    loop {
        // Deliver everything due, in (arrival, send order), then fire due core timers.
        loop {
            // No await between reading the clock and handling, so one `enter` serves both.
            let w2 = world.clone();
            let mut me = enter(&world);
            let now = me.now_ms();
            let Some(msg) = me.due(now) else { break };
            me.handle(&w2, msg);
            if me.violation.is_some() {
                break;
            }
        }
        {
            let w2 = world.clone();
            let mut me = enter(&world);
            if me.next_wake().is_some_and(|t| t <= me.now_ms()) {
                me.handle_timeout(&w2);
            }
            if me.violation.is_some() {
                break;
            }
            if me.tracer.len() as u64 > max_events {
                let n = me.tracer.len() as u64;
                me.violate(Violation {
                    invariant: "livelock".into(),
                    message: format!("more than {max_events} trace events ({n})"),
                    events: vec![n.saturating_sub(1)],
                });
                break;
            }
        }
        let next = {
            let me = world.borrow();
            let a = me.agenda.peek().map(|&Reverse((at, _, _))| at);
            match (a, me.next_wake()) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            }
        };
        if world.borrow().elapsed_ms() >= end {
            break;
        }
        // Sleep until the next message or core timer, or until a post brings an earlier
        // message. madsim cannot cancel a timer, so one already registered for a time at
        // or before the target is reused rather than registering another each round.
        let target = next.map_or(end, |t| t.min(end));
        let mut parked = false;
        futures::future::poll_fn(|cx| {
            let mut me = world.borrow_mut();
            let now = me.elapsed_ms();
            if now >= target || (parked && me.sleeping_until.is_none()) {
                // Due, or a post woke us (it cleared `sleeping_until`).
                me.sleeping_until = None;
                me.orchestrator = None;
                return Poll::Ready(());
            }
            if armed.is_none_or(|a| a <= now || a > target) {
                let mut timer = madsim::time::sleep_until(start + ms(target));
                if Pin::new(&mut timer).poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                armed = Some(target);
            }
            parked = true;
            me.sleeping_until = Some(target);
            me.orchestrator = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }
    let mut me = enter(&world);
    if me.violation.is_none() {
        let t = me.now_ms();
        let idx = me.tracer.line(t, "oracle", "liveness", &[]);
        let World {
            oracle,
            core,
            provider,
            ..
        } = &mut *me;
        let result = oracle.liveness(core, provider, &scenario, idx);
        if let Err(v) = result {
            me.violate(v);
        }
    }
    Finished {
        tracer: std::mem::take(&mut me.tracer),
        marks: std::mem::take(&mut me.oracle.marks),
        turns: me.oracle.turns,
        violation: me.violation.take(),
    }
}
