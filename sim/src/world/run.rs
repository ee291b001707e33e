//! The world of one seed: the production orchestrator (`palisade-embed`'s [`Engine`], the
//! very code `palisade-supervise` runs) and its environment — simulated ACP agent
//! processes speaking JSON-RPC over pipes, the agents' disk of conversations, one client
//! per session, the clock and the faults.
//!
//! The world holds only the environment. It carries out what the engine asks
//! ([`Action`]s) the way processes and pipes would: a spawn starts an agent process (a
//! [`AgentModel`] from the behaviour table of real agents), a request is framed by the
//! production [`Wire`] and written to the agent's stdin, the agent's stdout is read back
//! through the same `Wire` (in wire order, and only while the engine can take more), a
//! stop closes stdin and kills after the grace, a kill kills. Every decision is the
//! engine's (and, inside it, the core's); every check is the oracle's, on what the
//! environment recorded.
//!
//! Everything runs in one madsim task as a discrete-event loop over an agenda ordered by
//! (time, posting order): cheap, and deterministic by construction.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use palisade_core::driver::Observer;
use palisade_core::mutants::Mutant;
use palisade_core::{
    AttemptId, ExecutionId, RejectReason, SessionId, Timestamp, TurnId, TurnOutcome, Verdict,
};
use palisade_engine::{Action, Engine, EngineConfig, Op, Output, PromptError, SessionEvent};
use palisade_testkit::agent_model::{
    push_decimal, AgentModel, LoadAnswer, MemoryStore, NextLoad, Out, Seen,
};
use palisade_wire::connection::{Incoming, Wire};
use palisade_wire::jsonrpc::encode_response;
use palisade_wire::{AgentEvent, CloseReason, ProcessExit, RpcFailure};

use super::agenda::Agenda;
use super::dense::DenseMap;
use super::oracle::Oracle;
use crate::logbook::trace::Tracer;
use crate::logbook::{lock, Finished, Logbook, Observe};
use crate::mix::{chance, mix, pick};
use crate::oracle::{CaughtBy, Violation};
use crate::plan::agents::behaviour;
use crate::plan::setup::Environment;
use crate::plan::{Fault, FaultKind, FaultPlan, LoadErrorClass, WorkloadCut};
use crate::scenario::Scenario;

/// Prompts a client resends after a roll-back or failure.
const CLIENT_RETRIES: u32 = 2;
/// How long a user waits before resending a prompt the session refused as busy.
const CLIENT_BUSY_RETRY_MS: u64 = 100;
/// A line's trip through a pipe.
const PIPE_MS: u64 = 1;
/// The longest a sidecar takes to carry out a restarted engine's kill of a runtime it
/// still runs (the runtime goes on writing meanwhile).
const SIDECAR_KILL_MS: u64 = 2_000;

/// What happens at a time.
#[derive(Debug)]
enum Ev {
    /// A planned fault fires.
    Fault(Fault),
    /// A line reaches an agent's stdin.
    ToAgent { pid: Pid, line: String },
    /// An agent's stdin closed (the engine stopped it).
    StdinEof { pid: Pid },
    /// An agent has something to write or do.
    AgentWake { pid: Pid },
    /// An agent's stdout may have a line to read.
    Readable { pid: Pid },
    /// A request's deadline (the shell's: it dies with its incarnation).
    Deadline { pid: Pid, id: i64 },
    /// A stop's grace is over: kill (the shell's timer: it dies with its incarnation).
    StopGrace { pid: Pid },
    /// A sidecar carries out a restarted engine's kill of a runtime it still runs.
    SidecarKill { pid: Pid },
    /// The oracle judges a teardown's deadline.
    StopCheck {
        exec: ExecutionId,
        /// The process the engine asked to stop (its truth is judged, whatever its key).
        pid: Option<Pid>,
        due: Timestamp,
    },
    /// The oracle judges a join's deadline.
    JoinCheck {
        session: u32,
        attempt: AttemptId,
        due: Timestamp,
    },
    /// A client's next action.
    ClientStep { session: u32 },
    /// The stalled caller takes events again.
    CallerResumes,
    /// A process the engine asked for is up (a slow start: `spawn_delay_ms`); the engine
    /// of `incarnation` asked for it (a crashed one's start is lost with it).
    Spawned {
        session: SessionId,
        attempt: AttemptId,
        incarnation: u32,
    },
}

/// The world's engine, with the deadline its last [`Output::Wait`] named. The loop asks
/// for it at every turn, most of which (an agent waking, a line reaching an agent) leave
/// the engine alone. Only `&Engine` derefs out of a `Held`; every change goes through
/// [`Held::get_mut`], which forgets the deadline until the next [`World::settle`] drains
/// the engine to its next `Wait`.
struct Held {
    engine: Engine,
    /// The `until` of the engine's last `Wait`, if nothing changed since.
    next: Option<Option<Timestamp>>,
}

impl Held {
    fn new(engine: Engine) -> Held {
        Held { engine, next: None }
    }

    /// The engine, to change it.
    fn get_mut(&mut self) -> &mut Engine {
        self.next = None;
        &mut self.engine
    }

    /// The engine settled (it said `Wait`), and when it wants the time next.
    fn waits_until(&mut self, until: Option<Timestamp>) {
        self.next = Some(until);
    }

    /// The deadline of the engine's last `Wait`, if nothing changed since.
    fn poll_timeout(&self) -> Option<Option<Timestamp>> {
        self.next
    }
}

impl std::ops::Deref for Held {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

/// The world's name for an agent process: its pid, unique in a seed. The engine names
/// a runtime by its execution id, which is the platform's key for it; a process keeps
/// its pid whatever ids a restarted engine hands out.
type Pid = u32;

/// One simulated agent process and the engine's connection to it.
#[derive(Debug)]
struct Proc {
    session: u32,
    /// The execution id the engine gave it (what the world tells the engine).
    execution: ExecutionId,
    /// Its key in the oracle's tables: its execution id, or, once it outlived the engine
    /// that started it (a sidecar's runtime), a key no later execution can take.
    truth: ExecutionId,
    /// The orchestrator incarnation that started it.
    incarnation: u32,
    model: AgentModel,
    /// The connection's bookkeeping (the production code).
    wire: Wire<Op>,
    alive: bool,
    stdin_open: bool,
    /// It ignores stdin EOF (a hung teardown), whatever its behaviour says.
    ignores_eof: bool,
    /// Lines written, with the time each becomes readable.
    stdout: VecDeque<(u64, String)>,
    /// Nothing on its stdout is readable before this (a stalled pipe).
    stall_until: u64,
    exit: Option<ProcessExit>,
    /// The engine asked for it to die (a kill, or a stop's grace ran out).
    kill_requested: bool,
    /// A stop or kill waits for the process to be reaped.
    reap_pending: bool,
    /// The engine got its connection's close.
    closed: bool,
    reaped: bool,
    /// Killed with an orchestrator that crashed: nothing of it reaches the new one.
    orphaned: bool,
    wake_at: Option<u64>,
    read_at: Option<u64>,
    /// Dies right after writing its first stream event (an exit fault armed before it ran).
    exit_after_event: bool,
    /// Dies right after answering a prompt (the agent goes away between turns).
    exit_after_answer: bool,
}

/// A client: prompts with think time, waits for each turn's end, resends after a
/// roll-back or failure, resumes and cancels when the plan says.
#[derive(Debug, Default)]
struct Client {
    turns_left: u32,
    sends: u32,
    tries: u32,
    /// The turn it waits for, and its text.
    awaiting: Option<TurnId>,
    /// The text to (re)send.
    text: Option<String>,
    until_ms: u64,
    runs: bool,
}

/// Faults armed for a session's next occurrence of something.
#[derive(Debug, Default)]
struct Arms {
    burst: Option<u32>,
    exits: u32,
    load: Option<LoadErrorClass>,
    load_hang: bool,
    hang_teardown: bool,
    kill_between_turns: bool,
    jitter: Vec<(u64, u64, f64, u64)>,
    extra_prompts: u32,
    /// The next agent process's stdout stalls this long from its start.
    late: Option<u64>,
}

/// The world of one seed.
pub(crate) struct World {
    scenario: std::rc::Rc<Scenario>,
    seed: u64,
    mutant: Option<Mutant>,
    /// The seed's drawn environment (swarm over the environment), if it drew one.
    env: Option<Environment>,
    clock: madsim::time::TimeHandle,
    start_elapsed: Duration,
    now: u64,
    config: EngineConfig,
    engine: Held,
    logbook: Arc<Mutex<Logbook>>,
    skew_ms: i64,
    /// The latest engine time so far.
    mono: Timestamp,
    agenda: Agenda<Ev>,
    /// What an agent received, between its model and the oracle (kept to reuse its room).
    received: Vec<Seen>,
    /// Every agent process of the seed, by pid. Boxed: a process is large, and the table
    /// grows by doubling.
    procs: DenseMap<Pid, Box<Proc>>,
    /// The platform's table: the process each execution id names (the newest one given
    /// that id).
    by_exec: DenseMap<ExecutionId, Pid>,
    /// Runtimes outlive the orchestrator: after a crash-restart they go on running, and
    /// what they write reaches the restarted engine under their execution ids, until it
    /// stops them (a sidecar runs them, as kandev's agentctl does).
    sidecar: bool,
    store: MemoryStore,
    oracle: Oracle,
    clients: DenseMap<u32, Client>,
    arms: DenseMap<u32, Arms>,
    /// Agents whose stdout waits for the engine to take more.
    blocked: BTreeSet<Pid>,
    /// The caller takes no events before this (a caller that stops reading).
    caller_stall_until: u64,
    next_pid: u32,
    /// How long a start takes (its environment's, else its workload's).
    spawn_delay_ms: crate::scenario::Bounds<u64>,
    /// Starts asked for so far (keys their delays).
    spawns_asked: u64,
    /// Orchestrator restarts so far.
    incarnation: u32,
    workload: WorkloadCut,
    violation: Option<Violation>,
}

/// A client's `sends`-th prompt text: `s<session>.<sends>: summarise the repository`,
/// written piece by piece (`format!` was about 1 % of a seed's instructions).
fn prompt_text(session: u32, sends: u32) -> String {
    let mut text = String::with_capacity(48);
    text.push('s');
    push_decimal(&mut text, u64::from(session));
    text.push('.');
    push_decimal(&mut text, u64::from(sends));
    text.push_str(": summarise the repository");
    text
}

/// The text a client sends on its `tries`-th try of `base`: `<base> (try <tries>)`.
fn try_text(base: &str, tries: u32) -> String {
    let mut text = String::with_capacity(base.len() + 16);
    text.push_str(base);
    text.push_str(" (try ");
    push_decimal(&mut text, u64::from(tries));
    text.push(')');
    text
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl World {
    fn elapsed_ms(&self) -> u64 {
        (self.clock.elapsed() - self.start_elapsed).as_millis() as u64
    }

    /// The engine's clock: simulated time, shifted by the clock-jump faults.
    fn ts(&self) -> Timestamp {
        let t = self.now as i64 + self.skew_ms;
        Timestamp::from_millis(t.max(0) as u64)
    }

    /// The engine's clock as the core keeps it: never backwards (a clock that jumps back
    /// delays every deadline until it catches up).
    fn mono(&mut self) -> Timestamp {
        self.mono = self.mono.max(self.ts());
        self.mono
    }

    /// An engine time as simulated milliseconds (never before now).
    fn world_ms(&self, at: Timestamp) -> u64 {
        if at == Timestamp::MAX {
            return u64::MAX;
        }
        let t = at.as_millis() as i64 - self.skew_ms;
        (t.max(0) as u64).max(self.now)
    }

    fn key(&self, a: u64, b: u64, c: u64) -> u64 {
        mix(self.seed, a, b, c)
    }

    fn logbook(&self) -> MutexGuard<'_, Logbook> {
        let mut w = lock(&self.logbook);
        w.now_ms = self.now;
        w
    }

    fn note(&self, actor: &str, kind: &str, fields: &[(&'static str, u64)]) -> u64 {
        self.logbook().tracer.note(self.now, actor, kind, fields)
    }

    fn violate(&mut self, v: Violation) {
        if self.violation.is_none() {
            let now = self.now;
            self.logbook().tracer.line(
                now,
                "oracle",
                "violation",
                &[("invariant", &v.invariant), ("message", &v.message)],
            );
            self.violation = Some(v);
        }
    }

    fn checked(&mut self, result: Result<(), Violation>) {
        if let Err(v) = result {
            self.violate(v);
        }
    }

    /// Schedules `ev` at simulated time `at` (not before now).
    fn post(&mut self, at: u64, ev: Ev) {
        self.agenda.post(at.max(self.now), ev);
    }

    fn due(&mut self) -> Option<Ev> {
        self.agenda.pop_due(self.now)
    }

    /// Extra pipe latency for `session` now (its jitter fault).
    fn jitter(&self, session: u32, key: u64) -> u64 {
        let now = self.now;
        let Some(arms) = self.arms.get(&session) else {
            return 0;
        };
        match arms.jitter.iter().find(|j| j.0 <= now && now < j.1) {
            Some(&(_, _, p, max)) if chance(self.key(key, 42, now), p) => {
                pick(self.key(key, 43, now), 1, max.max(1))
            }
            _ => 0,
        }
    }

    // ----- the engine's side: after every call, carry out what it asks -------------

    /// Carries out the engine's actions and hands its events to the clients, until it
    /// has nothing more; then lets blocked agents be read again if it can take more.
    fn settle(&mut self) {
        let room = if self.now >= self.caller_stall_until {
            usize::MAX
        } else {
            0
        };
        loop {
            let now = self.ts();
            let engine = self.engine.get_mut();
            engine.set_caller_room(room);
            match engine.poll_output(now) {
                Output::Action(action) => self.carry_out(action),
                // The client takes the event as it comes (it is done with it at once).
                Output::Event(event) => {
                    self.engine.get_mut().acknowledge(1);
                    self.client_event(event);
                }
                // The world's engine keeps no state file: its crash-restarts restore the
                // state as of the crash ([`World::crash_restart`]).
                Output::Persist => {
                    let version = self.engine.version();
                    self.engine.get_mut().persisted(version);
                }
                Output::Wait { until, .. } => {
                    self.engine.waits_until(until);
                    break;
                }
            }
        }
        if self.engine.can_accept() && !self.blocked.is_empty() {
            let blocked = std::mem::take(&mut self.blocked);
            for pid in blocked {
                self.post(self.now, Ev::Readable { pid });
            }
        }
        let found = lock(&self.logbook).found.take();
        if let Some(v) = found {
            self.violate(v);
        }
    }

    /// A process the engine asked for is up: the shell reports it to the engine, and the
    /// simulated agent runs.
    fn start_process(&mut self, session: SessionId, attempt: AttemptId) {
        let now = self.ts();
        self.next_pid += 1;
        let pid = self.next_pid;
        let s = session.get() as u32;
        let behaviour = behaviour(
            &self.scenario.workload,
            &self.scenario.expect,
            self.env.as_ref(),
            self.seed,
            u64::from(pid),
        );
        let execution = self
            .engine
            .get_mut()
            .spawned(now, session, attempt, Ok(Some(pid)));
        let spawn_line = self.note(
            "env",
            "spawn",
            &[("session", u64::from(s)), ("execution", execution.get())],
        );
        // An execution id handed out again (a restarted engine that reused it): the new
        // process gets a name of its own, and the oracle keeps the earlier one's truth
        // under a key no execution takes.
        let earlier = self.pid_of(execution);
        if let Some(old) = earlier {
            self.set_apart(old, false);
        }
        let name = match earlier {
            None => execution.get().to_string(),
            Some(_) => format!("{}p{pid}", execution.get()),
        };
        let mut model = AgentModel::new(
            name,
            behaviour.clone(),
            self.key(u64::from(pid), 17, 0),
            self.now,
        );
        if let Some(cap) = self.workload.notifications_per_turn {
            model.cap_events(cap);
        }
        let arms = self.arms.or_default(s);
        let exit_after_event = arms.exits > 0;
        if exit_after_event {
            arms.exits -= 1;
        }
        let late = arms.late.take();
        let ignores_eof = std::mem::take(&mut arms.hang_teardown) || late.is_some();
        let stall_until = late.map_or(0, |d| self.now.saturating_add(d));
        let exit_after_answer = std::mem::take(&mut arms.kill_between_turns);
        self.oracle
            .spawned(execution, s, behaviour.clone(), spawn_line);
        self.by_exec.insert(execution, pid);
        self.procs.insert(
            pid,
            Box::new(Proc {
                session: s,
                execution,
                truth: execution,
                incarnation: self.incarnation,
                model,
                // The production connection's own garbage budget.
                wire: Wire::new(palisade_embed::ConnectionConfig::default().garbage_budget),
                alive: true,
                stdin_open: true,
                ignores_eof,
                stdout: VecDeque::new(),
                stall_until,
                exit: None,
                kill_requested: false,
                reap_pending: false,
                closed: false,
                reaped: false,
                orphaned: false,
                wake_at: None,
                read_at: None,
                exit_after_event,
                exit_after_answer,
            }),
        );
        self.drive_agent(pid);
    }

    /// Moves the oracle's truth of process `pid` to a key of its own, which no execution
    /// id takes (once: a survivor of the orchestrator, or a process whose execution id a
    /// restarted engine handed out again).
    fn set_apart(&mut self, pid: Pid, survivor: bool) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.truth == p.execution {
            let alias = super::oracle::set_apart_key(pid, p.execution);
            p.truth = alias;
            self.oracle.rekey(p.execution, alias, survivor);
        }
    }

    /// The oracle's key of the process the platform runs as `execution`.
    fn truth_of(&self, execution: ExecutionId) -> ExecutionId {
        self.pid_of(execution)
            .and_then(|pid| self.procs.get(&pid))
            .map_or(execution, |p| p.truth)
    }

    /// The process the platform runs as `execution`, if any.
    fn pid_of(&self, execution: ExecutionId) -> Option<Pid> {
        self.by_exec.get(&execution).copied()
    }

    fn carry_out(&mut self, action: Action) {
        let now = self.ts();
        match action {
            Action::Spawn { session, attempt } => {
                let d = self.spawn_delay_ms;
                if d.hi == 0 {
                    self.start_process(session, attempt);
                } else {
                    self.spawns_asked += 1;
                    let delay = pick(self.key(self.spawns_asked, 44, 0), d.lo, d.hi);
                    self.post(
                        self.now + delay,
                        Ev::Spawned {
                            session,
                            attempt,
                            incarnation: self.incarnation,
                        },
                    );
                }
            }
            Action::Request {
                execution,
                op,
                method,
                params,
                deadline,
            } => {
                let pid = self.pid_of(execution).unwrap_or_default();
                let session = self.procs.get(&pid).map(|p| p.session);
                let Some(p) = self.procs.get_mut(&pid).filter(|p| !p.orphaned) else {
                    if method == palisade_wire::acp::SESSION_PROMPT {
                        // The engine wrote it to a pipe no agent reads any more.
                        let text = params.prompt_text().unwrap_or_default();
                        let idx = (lock(&self.logbook).tracer.len() as u64).saturating_sub(1);
                        if let Err(v) = self.oracle.prompt_sent(text, idx) {
                            self.violation.get_or_insert(v);
                        }
                    }
                    self.engine.get_mut().reply(
                        now,
                        execution,
                        op,
                        Err(RpcFailure::TransportClosed),
                    );
                    return;
                };
                match p.wire.request(&method, &params, op) {
                    Err((op, failure)) => {
                        self.engine
                            .get_mut()
                            .reply(now, execution, op, Err(failure))
                    }
                    Ok((id, line)) => {
                        if method == palisade_wire::acp::SESSION_PROMPT {
                            let text = params.prompt_text().unwrap_or_default();
                            // The engine writes it as it performs the dispatch: the
                            // trace's last line is that `perform`.
                            let idx = (lock(&self.logbook).tracer.len() as u64).saturating_sub(1);
                            if let Err(v) = self.oracle.prompt_sent(text, idx) {
                                self.violation.get_or_insert(v);
                            }
                        }
                        if !p.alive || !p.stdin_open {
                            // The write fails: the pipe is closed.
                            let op = p.wire.abandon(id);
                            if let Some(op) = op {
                                self.engine.get_mut().reply(
                                    now,
                                    execution,
                                    op,
                                    Err(RpcFailure::TransportClosed),
                                );
                            }
                            return;
                        }
                        let late = self.jitter(session.unwrap_or(0), execution.get() ^ id as u64);
                        self.post(self.now + PIPE_MS + late, Ev::ToAgent { pid, line });
                        let at = self.world_ms(deadline);
                        if at != u64::MAX {
                            self.post(at, Ev::Deadline { pid, id });
                        }
                    }
                }
            }
            Action::Notify {
                execution,
                method,
                params,
            } => {
                let line = params.notification_line(method);
                self.write_to_agent(execution, line);
            }
            Action::Respond {
                execution,
                id,
                outcome,
            } => {
                let line = encode_response(&id, &outcome);
                self.write_to_agent(execution, line);
            }
            Action::Stop {
                execution,
                deadline,
                grace_ms,
            } => {
                let idx = self.note("env", "stop", &[("execution", execution.get())]);
                let engine_ms = self.mono().as_millis();
                let r = self
                    .oracle
                    .stop_asked(self.truth_of(execution), self.now, engine_ms, idx);
                self.checked(r);
                // Judged on the engine's clock: a clock that jumps back delays every deadline.
                let due = self.mono().plus_millis(self.oracle.stop_deadline_ms());
                self.post(
                    self.world_ms(due),
                    Ev::StopCheck {
                        exec: execution,
                        pid: self.pid_of(execution),
                        due,
                    },
                );
                let pid = self.pid_of(execution).unwrap_or_default();
                let Some(p) = self.procs.get_mut(&pid).filter(|p| !p.orphaned) else {
                    self.engine.get_mut().reaped(now, execution, None);
                    return;
                };
                p.reap_pending = true;
                if !p.alive {
                    if p.closed && !p.reaped {
                        p.reaped = true;
                        let status = p.exit;
                        self.engine.get_mut().reaped(now, execution, status);
                    }
                    return;
                }
                p.stdin_open = false;
                self.post(self.now + PIPE_MS, Ev::StdinEof { pid });
                let grace = self.now + grace_ms;
                let until = grace.min(self.world_ms(deadline));
                self.post(until, Ev::StopGrace { pid });
            }
            Action::Kill { execution } => {
                // A kill follows a runtime the engine found dead or wedged (or a teardown
                // past its deadline); rule 5's teardown decisions arrive as stops.
                self.note("env", "kill", &[("execution", execution.get())]);
                self.oracle.kill_asked(self.truth_of(execution), self.now);
                let pid = self.pid_of(execution).unwrap_or_default();
                let incarnation = self.incarnation;
                let Some(p) = self.procs.get_mut(&pid).filter(|p| !p.orphaned) else {
                    self.engine.get_mut().reaped(now, execution, None);
                    return;
                };
                if p.incarnation != incarnation {
                    // A runtime of an earlier incarnation, still run by the sidecar: the
                    // kill reaches it a moment later (it goes on writing meanwhile).
                    let delay = pick(self.key(u64::from(pid), 45, 0), 1, SIDECAR_KILL_MS);
                    self.post(self.now + delay, Ev::SidecarKill { pid });
                    return;
                }
                self.kill_proc(pid);
            }
        }
    }

    /// Kills a process the engine asked to kill; its reap is reported to the engine once
    /// its connection closed.
    fn kill_proc(&mut self, pid: Pid) {
        let now = self.ts();
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.reap_pending = true;
        p.kill_requested = true;
        if p.alive {
            self.die(pid, ProcessExit::Signal(9));
        } else if p.closed && !p.reaped {
            p.reaped = true;
            let (execution, status) = (p.execution, p.exit);
            self.engine.get_mut().reaped(now, execution, status);
        }
    }

    fn write_to_agent(&mut self, exec: ExecutionId, line: String) {
        let pid = self.pid_of(exec).unwrap_or_default();
        let Some(p) = self.procs.get(&pid) else {
            return;
        };
        if !p.alive || !p.stdin_open || p.orphaned {
            return;
        }
        let late = self.jitter(p.session, exec.get() ^ line.len() as u64);
        self.post(self.now + PIPE_MS + late, Ev::ToAgent { pid, line });
    }

    // ----- agents -----------------------------------------------------------------------

    /// Lets the agent act on what is due, writes what it wrote, and schedules its next
    /// wake-up and the reading of its stdout.
    ///
    /// What the agent received is noted first, then each output in write order as it is
    /// taken (its line onto stdout, its note to the oracle, an exit as the process's
    /// death), so nothing is gathered into a list on the way.
    fn drive_agent(&mut self, pid: Pid) {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if !p.alive {
            return;
        }
        let (exec, truth) = (p.execution, p.truth);
        p.model.on_wake(now);
        let mut received = std::mem::take(&mut self.received);
        received.extend(p.model.poll_seen());
        for seen in received.drain(..) {
            let idx = self.note("agent", "received", &[("execution", exec.get())]);
            let r = self.oracle.agent_received(truth, seen, idx);
            self.checked(r);
        }
        self.received = received;
        while let Some(p) = self.procs.get_mut(&pid) {
            let Some((out, note)) = p.model.poll_out(now) else {
                break;
            };
            match out {
                Out::Line(line) => {
                    let at = p.stdout.back().map_or(now, |(t, _)| *t).max(now) + PIPE_MS;
                    p.stdout.push_back((at, line));
                }
                Out::Stderr(_) => {}
                Out::Exit(code) => {
                    self.die(pid, ProcessExit::Code(code));
                    break;
                }
            }
            let dies_now = match &note {
                Some(Seen::Event { event, .. }) => p.exit_after_event && event.index == 1,
                Some(Seen::PromptAnswered { .. }) => p.exit_after_answer,
                _ => false,
            };
            let exit_after_answer = p.exit_after_answer;
            if dies_now && exit_after_answer {
                lock(&self.logbook).mark("kill-between-turns");
            }
            if let Some(note) = note {
                // A stream event shows in the trace as the core's stream input; an answer
                // is noted here.
                if !matches!(note, Seen::Event { .. }) {
                    self.note("agent", "answer", &[("execution", exec.get())]);
                }
                self.oracle.agent_wrote(truth, note);
            }
            if dies_now {
                let code = if exit_after_answer { 0 } else { 1 };
                self.die(pid, ProcessExit::Code(code));
                break;
            }
        }
        self.schedule_agent(pid);
    }

    fn schedule_agent(&mut self, pid: Pid) {
        let Some(p) = self
            .procs
            .get_mut(&pid)
            .filter(|p| !p.orphaned && !p.closed)
        else {
            return;
        };
        // At most a wake-up and a read, posted in that order (no list to allocate).
        let mut wake = None;
        let mut read = None;
        if p.alive {
            if let Some(at) = p.model.next_wake() {
                if p.wake_at.is_none_or(|w| at < w || w < self.now) {
                    p.wake_at = Some(at);
                    wake = Some(at);
                }
            }
        }
        let readable = p
            .stdout
            .front()
            .map(|(t, _)| (*t).max(p.stall_until))
            .or((!p.alive && !p.closed).then_some(self.now));
        if let Some(at) = readable {
            if p.read_at.is_none_or(|r| at < r || r < self.now) {
                p.read_at = Some(at);
                read = Some(at);
            }
        }
        if let Some(at) = wake {
            self.post(at, Ev::AgentWake { pid });
        }
        if let Some(at) = read {
            self.post(at, Ev::Readable { pid });
        }
    }

    /// The process dies (it exited, or was killed): its stdout stays readable until
    /// drained, then the engine gets the close.
    fn die(&mut self, pid: Pid, status: ProcessExit) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if !p.alive {
            return;
        }
        let (exec, truth) = (p.execution, p.truth);
        p.alive = false;
        p.stdin_open = false;
        p.exit = Some(status);
        p.model.kill();
        self.oracle.died(truth);
        let code = match status {
            ProcessExit::Code(c) => c as u64,
            ProcessExit::Signal(s) => 1000 + s as u64,
            ProcessExit::Unknown => 2000,
        };
        self.note(
            "env",
            "process_died",
            &[("execution", exec.get()), ("status", code)],
        );
        self.schedule_agent(pid);
    }

    /// Reads the agent's stdout into the engine while it can take more.
    fn read(&mut self, pid: Pid) {
        enum Next {
            Stop,
            Blocked(u32),
            Line(String),
            Eof(CloseReason),
        }
        while self.violation.is_none() {
            let now = self.now;
            let engine = &self.engine;
            let next = match self.procs.get_mut(&pid) {
                None => Next::Stop,
                Some(p) => {
                    p.read_at = None;
                    if p.orphaned || p.closed {
                        Next::Stop
                    } else {
                        match p.stdout.front() {
                            Some((at, _)) if *at > now || p.stall_until > now => Next::Stop,
                            // Asked only when a line is due to be read.
                            Some(_) if !engine.can_accept() => Next::Blocked(p.session),
                            Some(_) => Next::Line(p.stdout.pop_front().expect("just seen").1),
                            None if !p.alive => Next::Eof(match (p.kill_requested, p.exit) {
                                (true, status) => CloseReason::Killed(status),
                                (false, Some(status)) => CloseReason::ProcessExited(status),
                                (false, None) => CloseReason::StdoutClosed,
                            }),
                            None => Next::Stop,
                        }
                    }
                }
            };
            match next {
                Next::Stop => {
                    self.schedule_agent(pid);
                    return;
                }
                Next::Blocked(session) => {
                    self.blocked.insert(pid);
                    lock(&self.logbook).mark("backpressure");
                    let recovering = self
                        .oracle
                        .turns
                        .values()
                        .any(|t| t.session == session && t.recoveries > 0 && t.ended.is_none());
                    if recovering {
                        lock(&self.logbook).mark("queue-full-during-recovery");
                    }
                    return;
                }
                Next::Eof(reason) => {
                    self.close(pid, reason);
                    self.settle();
                    return;
                }
                Next::Line(line) => {
                    let ts = self.ts();
                    let Some(p) = self.procs.get_mut(&pid) else {
                        return;
                    };
                    let exec = p.execution;
                    if p.incarnation != self.incarnation {
                        // A survivor's line reaches the restarted engine.
                        lock(&self.logbook).mark("survivor-wrote-after-restart");
                    }
                    match p.wire.receive(line.trim_end().as_bytes()) {
                        Incoming::Reply { tag, result } => {
                            self.engine.get_mut().reply(ts, exec, tag, result);
                        }
                        Incoming::Event(event) => {
                            let closes = p.wire.spend(&event);
                            if matches!(event, AgentEvent::Update { .. }) {
                                let truth = p.truth;
                                let engine_ms = self.mono().as_millis();
                                self.oracle.update_read(truth, engine_ms);
                            }
                            if matches!(
                                event,
                                AgentEvent::Anomaly(palisade_embed::Anomaly::LateResponse { .. })
                            ) {
                                lock(&self.logbook).mark("late-answer-after-teardown");
                            }
                            self.engine.get_mut().agent_event(ts, exec, event);
                            if let Some(reason) = closes {
                                // Garbage past the budget: the reader closes the connection.
                                self.close(pid, reason);
                                self.settle();
                                return;
                            }
                        }
                        Incoming::Nothing => {}
                    }
                    self.settle();
                }
            }
        }
    }

    /// The connection closes: every request still waiting fails (in id order), then the
    /// engine gets the close, then the reap a stop or kill waited for.
    fn close(&mut self, pid: Pid, reason: CloseReason) {
        let ts = self.ts();
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.closed {
            return;
        }
        let exec = p.execution;
        p.closed = true;
        let failed = p.wire.close(reason.clone());
        for (op, failure) in failed {
            self.engine.get_mut().reply(ts, exec, op, Err(failure));
        }
        self.note("engine", "closed", &[("execution", exec.get())]);
        self.engine
            .get_mut()
            .agent_event(ts, exec, AgentEvent::Closed(reason.clone()));
        if let Some(p) = self.procs.get_mut(&pid) {
            if p.reap_pending && !p.reaped && !p.alive {
                p.reaped = true;
                let status = p.exit;
                self.engine.get_mut().reaped(ts, exec, status);
            }
        }
    }

    fn deliver_to_agent(&mut self, pid: Pid, line: String) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if !p.alive || p.orphaned {
            return;
        }
        let session = p.session;
        let arms = self.arms.or_default(session);
        // The line is read once, here, for the arms and for the agent.
        let frame = palisade_wire::jsonrpc::parse_frame(line.trim_end().as_bytes());
        let method = match &frame {
            Ok(palisade_wire::jsonrpc::Frame::Request { method, .. }) => method.as_str(),
            _ => "",
        };
        if method == "session/prompt" {
            if let Some(count) = arms.burst.take() {
                p.model.burst_next(count);
            }
        }
        if method == "session/load" {
            if std::mem::take(&mut arms.load_hang) {
                p.model.set_next_load(NextLoad::Hang);
            } else if let Some(class) = arms.load.take() {
                match class {
                    LoadErrorClass::UnknownSession => {
                        // The agent's disk really lost the conversation.
                        if let Ok(palisade_wire::jsonrpc::Frame::Request { params, .. }) = &frame {
                            if let Some(id) = palisade_wire::acp::string_member(params, "sessionId")
                            {
                                self.store.lose(&id);
                            }
                        }
                    }
                    LoadErrorClass::Answer(answer) => {
                        p.model.set_next_load(NextLoad::Answer(answer));
                    }
                    LoadErrorClass::Internal => p
                        .model
                        .set_next_load(NextLoad::Answer(LoadAnswer::InternalError)),
                    LoadErrorClass::NotFoundSubstring => p
                        .model
                        .set_next_load(NextLoad::Answer(LoadAnswer::NotFoundSubstring)),
                    LoadErrorClass::AuthRequired => p
                        .model
                        .set_next_load(NextLoad::Answer(LoadAnswer::AuthRequired)),
                }
            }
        }
        let now = self.now;
        p.model.on_frame(now, frame, &mut self.store);
        self.drive_agent(pid);
    }

    // ----- clients ----------------------------------------------------------------------

    fn client_event(&mut self, event: SessionEvent) {
        let now = self.now;
        let idx = self.logbook().tracer.client(now, &event);
        let r = self.oracle.client_got(&event, idx);
        self.checked(r);
        if let SessionEvent::TurnEnded {
            session,
            turn,
            outcome,
            ..
        } = event
        {
            let s = session.get() as u32;
            let think = self.think(s, 7);
            let Some(c) = self.clients.get_mut(&s) else {
                return;
            };
            if c.awaiting != Some(turn) {
                return;
            }
            c.awaiting = None;
            match outcome {
                TurnOutcome::RolledBack | TurnOutcome::Failed if c.tries <= CLIENT_RETRIES => {
                    self.post(now + 50, Ev::ClientStep { session: s });
                }
                _ => {
                    c.text = None;
                    c.tries = 0;
                    c.turns_left = c.turns_left.saturating_sub(1);
                    if c.turns_left > 0 {
                        self.post(now + think, Ev::ClientStep { session: s });
                    }
                }
            }
        }
    }

    fn think(&self, session: u32, salt: u64) -> u64 {
        let wl = &self.scenario.workload;
        let k = self.clients.get(&session).map_or(0, |c| u64::from(c.sends));
        pick(
            self.key(u64::from(session), k, 31 + salt),
            wl.think_ms.lo,
            wl.think_ms.hi,
        )
        .max(1)
    }

    fn client_step(&mut self, session: u32) {
        let now = self.now;
        let Some(c) = self.clients.get_mut(&session) else {
            return;
        };
        if !c.runs || c.awaiting.is_some() || c.turns_left == 0 || now >= c.until_ms {
            return;
        }
        if c.text.is_none() {
            c.sends += 1;
            c.text = Some(prompt_text(session, c.sends));
        }
        c.tries += 1;
        // A resend is a new turn: its text says which try it is, so an agent's prompt
        // names its turn.
        let text = try_text(c.text.as_deref().unwrap_or_default(), c.tries);
        let sid = SessionId::new(u64::from(session)).expect("sessions start at 1");
        let ts = self.ts();
        // The prompt's first trace line is the core's `prompt` input.
        let line = self.logbook().tracer.len() as u64;
        match self.engine.get_mut().prompt(ts, sid, text.clone()) {
            Ok(turn) => {
                if let Some(c) = self.clients.get_mut(&session) {
                    c.awaiting = Some(turn);
                }
                self.oracle.client_sent(session, turn, &text, line);
            }
            Err(PromptError::Rejected(RejectReason::SessionBusy)) => {
                if let Some(c) = self.clients.get_mut(&session) {
                    c.tries -= 1;
                }
                self.post(now + CLIENT_BUSY_RETRY_MS, Ev::ClientStep { session });
            }
            Err(_) => {
                self.post(now + 50, Ev::ClientStep { session });
            }
        }
        self.settle();
    }

    /// A prompt the plan sends on its own (a scenario step), outside the client's turns.
    fn extra_prompt(&mut self, session: u32, fault: Fault) {
        let sid = SessionId::new(u64::from(session)).expect("sessions start at 1");
        let n = {
            let arms = self.arms.or_default(session);
            arms.extra_prompts += 1;
            arms.extra_prompts
        };
        let text = format!("s{session}.step{n}: run the tests");
        let ts = self.ts();
        let line = self.logbook().tracer.len() as u64;
        match self.engine.get_mut().prompt(ts, sid, text.clone()) {
            Ok(turn) => self.oracle.client_sent(session, turn, &text, line),
            Err(PromptError::Rejected(RejectReason::SessionBusy))
                if self.now < self.scenario.limits.fault_window_ms =>
            {
                self.arms.or_default(session).extra_prompts -= 1;
                self.post(
                    self.now + CLIENT_BUSY_RETRY_MS,
                    Ev::Fault(Fault {
                        at_ms: self.now + CLIENT_BUSY_RETRY_MS,
                        ..fault
                    }),
                );
            }
            Err(_) => {}
        }
        self.settle();
    }

    fn resume(&mut self, session: u32) {
        let sid = SessionId::new(u64::from(session)).expect("sessions start at 1");
        let ts = self.ts();
        let verdict = self.engine.get_mut().resume(ts, sid);
        if let Verdict::Joined { attempt, .. } = verdict {
            self.oracle.client_joined(session, attempt, self.now);
            let due = self.mono().plus_millis(self.oracle.join_wait_ms());
            self.post(
                self.world_ms(due),
                Ev::JoinCheck {
                    session,
                    attempt,
                    due,
                },
            );
        }
        self.settle();
    }

    // ----- faults -----------------------------------------------------------------------

    /// The session's newest live agent process.
    fn running(&self, session: u32) -> Option<Pid> {
        let incarnation = self.incarnation;
        self.procs
            .iter()
            .rev()
            .find(|(_, p)| {
                p.session == session
                    && p.alive
                    && !p.orphaned
                    && p.stdin_open
                    && p.incarnation == incarnation
            })
            .map(|(pid, _)| pid)
    }

    fn fault(&mut self, f: Fault) {
        let now = self.now;
        let s = f.session;
        self.logbook().tracer.fault(now, &f);
        match f.kind {
            FaultKind::Prompt => self.extra_prompt(s, f),
            FaultKind::Resume | FaultKind::Retry => self.resume(s),
            FaultKind::Cancel => {
                let sid = SessionId::new(u64::from(s.max(1))).expect("1-based");
                if self
                    .oracle
                    .turns
                    .values()
                    .any(|t| t.session == s && t.ended.is_none() && t.recoveries > 0)
                {
                    lock(&self.logbook).mark("cancel-after-provider-exit");
                }
                self.oracle.client_cancelled(s);
                let ts = self.ts();
                let _ = self.engine.get_mut().cancel(ts, sid);
                self.settle();
            }
            FaultKind::ProviderExit => match self.running(s) {
                Some(pid) => self.die(pid, ProcessExit::Code(1)),
                None => self.arms.or_default(s).exits += 1,
            },
            FaultKind::ExitAfterTurn => match self.running(s) {
                Some(pid) => {
                    if let Some(p) = self.procs.get_mut(&pid) {
                        p.exit_after_answer = true;
                    }
                }
                None => self.arms.or_default(s).kill_between_turns = true,
            },
            FaultKind::CrashRestart => self.crash_restart(),
            FaultKind::Burst { count } => self.arms.or_default(s).burst = Some(count),
            FaultKind::LateCallback { delay_ms } => {
                // The session's next agent process: its stdout stalls (everything it
                // writes, its answers included, arrives `delay_ms` late), and it ignores
                // the stdin EOF of its teardown.
                self.arms.or_default(s).late = Some(delay_ms);
            }
            FaultKind::HangTeardown => self.arms.or_default(s).hang_teardown = true,
            FaultKind::LoadError { class } => {
                self.arms.or_default(s).load = Some(class);
            }
            FaultKind::LoadTimeout => self.arms.or_default(s).load_hang = true,
            // The engine world has no state file, no palisade-supervise caller and no
            // exit on a prompt's receipt (plans refuse them there).
            FaultKind::DiskFault { .. } | FaultKind::CallerGone | FaultKind::ExitOnPrompt => {}
            FaultKind::ClockJump { ms } => {
                self.skew_ms = self.skew_ms.saturating_add(ms);
                self.mono();
            }
            FaultKind::CallerStall { ms } => {
                let until = now.saturating_add(ms);
                self.caller_stall_until = self.caller_stall_until.max(until);
                self.post(until, Ev::CallerResumes);
            }
            FaultKind::Jitter {
                until_ms,
                delay_p,
                max_delay_ms,
                ..
            } => {
                self.arms
                    .or_default(s)
                    .jitter
                    .push((f.at_ms, until_ms, delay_p, max_delay_ms));
            }
        }
    }

    /// The orchestrator crashes and restarts from its state: its agent processes die with
    /// it (their process group), and a new engine restores the state of its last step.
    fn crash_restart(&mut self) {
        // Starts the crashed orchestrator asked for are lost with it.
        self.incarnation += 1;
        let ts = self.ts();
        let bytes = self.engine.state_image(ts).bytes;
        let in_flight = self
            .procs
            .values()
            .any(|p| p.alive && !p.orphaned && p.model.prompting());
        if in_flight {
            lock(&self.logbook).mark("restart-with-attempt-in-flight");
        }
        let pids: Vec<Pid> = self.procs.keys().collect();
        for pid in pids {
            let sidecar = self.sidecar;
            let Some(p) = self.procs.get_mut(&pid) else {
                continue;
            };
            if p.orphaned {
                continue;
            }
            if sidecar {
                // It goes on running. The oracle keeps its truth under a key of its own
                // (a restarted engine could hand its execution id out again).
                self.set_apart(pid, true);
                continue;
            }
            p.orphaned = true;
            let truth = p.truth;
            if p.alive {
                p.alive = false;
                p.model.kill();
                self.oracle.died(truth);
            }
            if let Some(t) = self.oracle.procs.get_mut(&truth) {
                t.orphaned = true;
            }
        }
        if !self.sidecar {
            self.blocked.clear();
        }
        let restart = self.note("env", "crash_restart", &[]);
        let observer: Box<dyn Observer + Send> = Box::new(Observe(self.logbook.clone()));
        let mutant = self.mutant;
        // The mutant is on for the restore's own work too, as the stack world's setup hook
        // has it.
        match Engine::restore_prepared(self.config.clone(), &bytes, ts, Some(observer), |e| {
            e.set_mutant(mutant)
        }) {
            Ok(engine) => {
                self.engine = Held::new(engine);
                self.settle();
            }
            Err(e) => self.violate(Violation {
                invariant: "snapshot-restore".into(),
                message: format!("the engine's own state did not restore: {e}"),
                events: vec![restart],
                by: CaughtBy::World,
            }),
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Fault(f) => self.fault(f),
            Ev::ToAgent { pid, line } => self.deliver_to_agent(pid, line),
            Ev::StdinEof { pid } => {
                let now = self.now;
                if let Some(p) = self.procs.get_mut(&pid) {
                    if p.alive && !p.ignores_eof {
                        p.model.on_stdin_closed(now);
                    }
                }
                self.drive_agent(pid);
            }
            Ev::AgentWake { pid } => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.wake_at = None;
                }
                self.drive_agent(pid);
            }
            Ev::Readable { pid } => self.read(pid),
            Ev::Deadline { pid, id } => {
                let incarnation = self.incarnation;
                let Some(p) = self
                    .procs
                    .get_mut(&pid)
                    .filter(|p| !p.orphaned && p.incarnation == incarnation)
                else {
                    return;
                };
                let exec = p.execution;
                if let Some(op) = p.wire.abandon(id) {
                    let ts = self.ts();
                    self.engine
                        .get_mut()
                        .reply(ts, exec, op, Err(RpcFailure::TimedOut));
                    self.settle();
                }
            }
            Ev::StopGrace { pid } => {
                let incarnation = self.incarnation;
                let alive = self
                    .procs
                    .get(&pid)
                    .is_some_and(|p| p.alive && !p.orphaned && p.incarnation == incarnation);
                if alive {
                    if let Some(p) = self.procs.get_mut(&pid) {
                        p.kill_requested = true;
                    }
                    self.die(pid, ProcessExit::Signal(9));
                }
            }
            Ev::SidecarKill { pid } => {
                let execution = self.procs.get(&pid).map_or(0, |p| p.execution.get());
                self.note("env", "sidecar_kill", &[("execution", execution)]);
                self.kill_proc(pid);
                self.settle();
            }
            Ev::StopCheck { exec, pid, due } if self.mono() < due => {
                self.post(self.world_ms(due), Ev::StopCheck { exec, pid, due });
            }
            Ev::JoinCheck {
                session,
                attempt,
                due,
            } if self.mono() < due => {
                self.post(
                    self.world_ms(due),
                    Ev::JoinCheck {
                        session,
                        attempt,
                        due,
                    },
                );
            }
            Ev::StopCheck { exec, pid, .. } => {
                let idx = self.note("oracle", "stop_deadline", &[("execution", exec.get())]);
                let truth = pid
                    .and_then(|pid| self.procs.get(&pid))
                    .map_or(exec, |p| p.truth);
                let r = self.oracle.stop_deadline_passed(truth, idx);
                self.checked(r);
            }
            Ev::JoinCheck {
                session, attempt, ..
            } => {
                let idx = self.note(
                    "oracle",
                    "join_deadline",
                    &[("session", u64::from(session))],
                );
                let stalled = self.caller_stall_until > self.now.saturating_sub(1_000);
                let r = self
                    .oracle
                    .join_deadline_passed(session, attempt, stalled, idx);
                self.checked(r);
            }
            Ev::ClientStep { session } => self.client_step(session),
            Ev::CallerResumes => {
                if self.now >= self.caller_stall_until {
                    self.settle();
                }
            }
            Ev::Spawned {
                session,
                attempt,
                incarnation,
            } => {
                if incarnation == self.incarnation {
                    self.start_process(session, attempt);
                    self.settle();
                }
            }
        }
    }
}

/// Runs one seed inside the current madsim runtime.
pub(crate) async fn run(
    scenario: std::rc::Rc<Scenario>,
    seed: u64,
    plan: FaultPlan,
    mutant: Option<Mutant>,
    capture: bool,
) -> Finished {
    // The seed's own configuration (swarm over configuration), else the scenario's.
    let config = plan.run_config(&scenario).engine();
    let logbook = Logbook::shared(&config, capture);
    let mut engine = match Engine::new(config.clone()) {
        Ok(engine) => engine,
        Err(e) => {
            let mut tracer = Tracer::new(capture);
            tracer.line(0, "world", "bad_config", &[("error", &e.to_string())]);
            return Finished {
                tracer,
                marks: BTreeMap::new(),
                turns: 0,
                violation: Some(Violation {
                    invariant: "scenario-config".into(),
                    message: format!("the scenario's engine configuration is invalid: {e}"),
                    // The `bad_config` line, the trace's only one.
                    events: vec![0],
                    by: CaughtBy::World,
                }),
            };
        }
    };
    engine.set_mutant(mutant);
    engine.set_observer(Box::new(Observe(logbook.clone())));
    let window = scenario.limits.fault_window_ms;
    let end = window + scenario.limits.quiesce_ms;
    let clock = madsim::time::TimeHandle::current();
    let start_elapsed = clock.elapsed();
    let start = madsim::time::Instant::now();
    let oracle = Oracle::new(&config, &scenario.expect);
    let mut world = World {
        scenario: scenario.clone(),
        seed,
        mutant,
        env: plan.environment.clone(),
        clock,
        start_elapsed,
        now: 0,
        config,
        engine: Held::new(engine),
        logbook: logbook.clone(),
        skew_ms: 0,
        mono: Timestamp::ZERO,
        agenda: Agenda::new(),
        received: Vec::new(),
        procs: DenseMap::default(),
        by_exec: DenseMap::default(),
        sidecar: plan
            .environment
            .as_ref()
            .map_or(scenario.workload.sidecar, |e| e.sidecar),
        store: MemoryStore::default(),
        oracle,
        clients: DenseMap::default(),
        arms: DenseMap::default(),
        blocked: BTreeSet::new(),
        caller_stall_until: 0,
        next_pid: 1000,
        spawn_delay_ms: plan
            .environment
            .as_ref()
            .map_or(scenario.workload.spawn_delay_ms, |e| e.spawn_delay_ms),
        spawns_asked: 0,
        incarnation: 0,
        workload: plan.workload.clone(),
        violation: None,
    };
    if plan.config.is_some() || plan.environment.is_some() {
        // What the seed drew besides its faults, at the head of its trace.
        let config = serde_json::to_string(&plan.config).unwrap_or_default();
        let env = serde_json::to_string(&plan.environment).unwrap_or_default();
        lock(&logbook).tracer.line(
            0,
            "world",
            "setup",
            &[("config", &config), ("environment", &env)],
        );
    }
    for f in &plan.faults {
        world.post(f.at_ms, Ev::Fault(*f));
    }
    let turns = plan.workload.turns(scenario.workload.turns_per_session);
    for s in 1..=scenario.workload.sessions {
        let runs = plan.workload.client_runs(s);
        world.clients.insert(
            s,
            Client {
                turns_left: turns,
                until_ms: plan.workload.until_ms(window),
                runs,
                ..Client::default()
            },
        );
        if runs && turns > 0 {
            let think = world.think(s, 0);
            world.post(think, Ev::ClientStep { session: s });
        }
    }
    let max_events = scenario.limits.max_events;
    loop {
        world.now = world.elapsed_ms();
        world.mono();
        while let Some(ev) = world.due() {
            world.handle(ev);
            if world.violation.is_some() {
                break;
            }
        }
        if world.violation.is_some() {
            break;
        }
        let ts = world.ts();
        if world.engine.poll_timeout().is_none() {
            world.settle();
        }
        let mut engine_at = world.engine.poll_timeout().flatten();
        if engine_at.is_some_and(|t| t <= ts) {
            world.engine.get_mut().handle_timeout(ts);
            world.settle();
            if world.violation.is_some() {
                break;
            }
            engine_at = world.engine.poll_timeout().flatten();
        }
        let events = lock(&logbook).tracer.len() as u64;
        if events > max_events {
            world.violate(Violation {
                invariant: "livelock".into(),
                message: format!("more than {max_events} trace events ({events})"),
                events: vec![events.saturating_sub(1)],
                by: CaughtBy::World,
            });
            break;
        }
        if world.now >= end {
            break;
        }
        let agenda_at = world.agenda.next_at();
        let engine_at = engine_at.map(|t| world.world_ms(t));
        let next = match (agenda_at, engine_at) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        if next.is_some_and(|t| t <= world.now) {
            continue;
        }
        let target = next.map_or(end, |t| t.min(end));
        // The world is this runtime's only task, so nothing can run while it waits: the
        // clock is moved to the next event directly instead of through a timer and a
        // task switch (the same times, without the scheduler's cost at every step).
        let deadline = start + ms(target);
        let clock_now = world.clock.now_instant();
        if deadline > clock_now {
            world.clock.advance(deadline - clock_now);
        }
    }
    if world.violation.is_none() {
        let idx = world.note("oracle", "liveness", &[]);
        let sessions = scenario.workload.sessions;
        let r = world.oracle.liveness(sessions, idx).map_err(|mut v| {
            v.by = CaughtBy::Liveness;
            v
        });
        world.checked(r);
    }
    let turns = world.oracle.turns_claimed;
    let violation = world.violation.take();
    drop(world);
    let mut w = lock(&logbook);
    Finished {
        tracer: std::mem::take(&mut w.tracer),
        marks: std::mem::take(&mut w.marks),
        turns,
        violation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_texts_are_what_format_wrote() {
        for (session, n) in [(1, 1), (9, 10), (12, 345), (u32::MAX, u32::MAX)] {
            let base = format!("s{session}.{n}: summarise the repository");
            assert_eq!(prompt_text(session, n), base);
            assert_eq!(try_text(&base, n), format!("{base} (try {n})"));
        }
    }

    /// A change made through `get_mut` forgets the deadline of the last `Wait`: it is
    /// never served stale, only after the engine settles again.
    #[test]
    fn held_engine_forgets_its_deadline_on_change() {
        let engine = Engine::new(EngineConfig::default()).expect("the default config");
        let mut held = Held::new(engine);
        assert_eq!(
            held.poll_timeout(),
            None,
            "nothing is known before a settle"
        );
        held.waits_until(None);
        assert_eq!(held.poll_timeout(), Some(None));
        let session = SessionId::new(1).expect("a nonzero session");
        let now = Timestamp::from_millis(5);
        held.get_mut()
            .prompt(now, session, "hello".into())
            .expect("the prompt is taken");
        assert_eq!(held.poll_timeout(), None, "a change forgets the deadline");
        let until = loop {
            if let Output::Wait { until, .. } = held.get_mut().poll_output(now) {
                break until;
            }
        };
        assert!(
            until.is_some(),
            "a prompt waiting for its runtime has a deadline"
        );
        held.waits_until(until);
        assert_eq!(held.poll_timeout(), Some(until));
    }
}
