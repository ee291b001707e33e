//! The stack world: the whole production supervisor stack under the simulator.
//!
//! `palisade-supervise`'s loop ([`palisade_embed::supervise::run`]) → the tokio
//! [`Supervisor`](palisade_embed::Supervisor) → the [`Engine`](palisade_embed::Engine)
//! → the process seam, all the production code, on madsim's clock and tasks
//! ([`env::SimPlatform`]). Agent processes are madsim tasks running the shared
//! [`AgentModel`](palisade_testkit::agent_model::AgentModel) behind in-memory pipes; the
//! state file lives on a [`env::SimDisk`] that fails (ENOSPC, EIO), tears a write or
//! crashes between write and rename when the plan says. The caller pipes prompts into
//! the loop's stdin and reads its events (and may stop reading for a while).
//!
//! Faults the environment injects: an agent's exit at any point (`provider_exit`), right
//! after it answers a prompt (`exit_after_turn`, the next prompt may find it dying), an
//! agent that ignores stdin EOF (`late_callback`), agents whose behaviour runs them
//! through a launcher (the codex npm launcher: a launcher process and the agent it starts,
//! one process tree), a caller that stops reading
//! (`caller_stall`), disk faults, and crash-restarts of the supervisor itself: its tasks
//! are aborted, the watchdog takes down the agents it guarded, and a new incarnation starts
//! from whatever reached the simulated disk; the caller re-sends the prompts no incarnation
//! claimed.
//!
//! The oracle judges from what the environment recorded: what the caller got (events,
//! messages, exit codes, the turn each prompt was claimed as), what each agent received,
//! which processes run, and what the disk did. The core's reference model and invariants
//! run on every core step, as in the engine world.

mod env;
mod oracle;
pub(crate) mod proxy;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_core::driver::{Observer, Step};
use palisade_core::mutants::Mutant;
use palisade_core::{Core, Effect, SessionId, Timestamp, TurnId};
use palisade_embed::platform::BoxFuture;
use palisade_embed::supervise::{self, Console, Io, Options};
use palisade_embed::{Embedding, SessionEvent, StateFile};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::logbook::{lock as lock_logbook, Finished, Logbook, Observe};
use crate::mix::{mix, pick};
use crate::plan::{Fault, FaultKind, FaultPlan};
use crate::scenario::Scenario;
use env::{lock, Env, EnvState, SimDisk, SimPlatform};
use oracle::CallerLog;

/// Where the supervisor keeps its state on the simulated disk.
const STATE_PATH: &str = "/var/lib/palisade/state";
/// How long a crashed supervisor stays down before it is started again.
const RESTART_AFTER_MS: u64 = 50;
/// Incarnations a run may have: each crash-restart fault or crashing disk fault is one.
const MAX_INCARNATIONS: u32 = 64;

/// The engine's observer in the stack world: stamps simulated time, then the observer both
/// worlds share (the logbook's trace and checker).
struct StackObserve {
    logbook: Arc<Mutex<Logbook>>,
    start: Duration,
}

impl Observer for StackObserve {
    fn observe(&mut self, now: Timestamp, core: &Core, step: Step<'_>, effects: &[Effect]) {
        lock_logbook(&self.logbook).now_ms = env::now_ms(self.start);
        Observe(self.logbook.clone()).observe(now, core, step, effects);
    }
}

/// The caller's console: records every event and message, and stalls when told to.
struct SimConsole {
    log: Arc<Mutex<CallerLog>>,
    env: Env,
    logbook: Arc<Mutex<Logbook>>,
    incarnation: u32,
    start: Duration,
}

impl Console for SimConsole {
    fn event<'a>(&'a mut self, event: &'a SessionEvent) -> BoxFuture<'a, std::io::Result<()>> {
        Box::pin(async move {
            let now = env::now_ms(self.start);
            if oracle::lock(&self.log).gone_at.is_some() {
                // Nobody reads the other end of stdout any more: EPIPE.
                let line = lock_logbook(&self.logbook).tracer.note(
                    now,
                    "caller",
                    "write_failed",
                    &[("incarnation", u64::from(self.incarnation))],
                );
                oracle::lock(&self.log)
                    .write_failed
                    .entry(self.incarnation)
                    .or_insert(line);
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            let stall_until = oracle::lock(&self.log).stall_until;
            if stall_until > now {
                madsim::time::sleep(Duration::from_millis(stall_until - now)).await;
            }
            let now = env::now_ms(self.start);
            let agent_prompts = lock(&self.env).prompts.len();
            let line = lock_logbook(&self.logbook).tracer.client(now, event);
            // The caller reads the line palisade-supervise prints for the event.
            let shown = oracle::as_printed(event);
            let mut log = oracle::lock(&self.log);
            if let SessionEvent::TurnEnded { turn, .. } = event {
                log.ended_at.entry(*turn).or_insert(now);
            }
            let shown = match shown {
                Ok(shown) => shown,
                Err(why) => {
                    log.misprinted.get_or_insert((line, why));
                    event.clone()
                }
            };
            log.event(self.incarnation, agent_prompts, shown, line);
            Ok(())
        })
    }

    fn message(&mut self, text: &str) {
        let now = env::now_ms(self.start);
        let line =
            lock_logbook(&self.logbook)
                .tracer
                .line(now, "supervise", "message", &[("text", text)]);
        let received = lock(&self.env).prompts.len();
        let mut log = oracle::lock(&self.log);
        let claimed = log.claimed.len();
        log.messages.push((self.incarnation, text.to_owned()));
        log.message_at.push((claimed, received, line));
    }

    fn prompt_claimed(&mut self, _session: SessionId, turn: TurnId, text: &str) {
        let now = env::now_ms(self.start);
        let line = lock_logbook(&self.logbook).tracer.note(
            now,
            "caller",
            "claimed",
            &[
                ("turn", turn.get()),
                ("incarnation", u64::from(self.incarnation)),
            ],
        );
        oracle::lock(&self.log)
            .claimed
            .push((self.incarnation, turn, text.to_owned()));
        let mut log = oracle::lock(&self.log);
        log.claimed_at.push(now);
        log.claimed_lines.push(line);
    }
}

/// What every incarnation of the program under test (palisade-supervise's loop, or
/// palisade-proxy's) starts on: the world's environment, agents and disk.
pub(crate) struct Stage<'a> {
    pub(crate) env: &'a Env,
    pub(crate) seed: u64,
    pub(crate) behaviour: &'a env::BehaviourTable,
    /// madsim's elapsed time at the world's start, and the `Instant` standing for it.
    pub(crate) start: Duration,
    pub(crate) base: Instant,
    pub(crate) logbook: &'a Arc<Mutex<Logbook>>,
    pub(crate) config: &'a palisade_embed::EngineConfig,
    pub(crate) mutant: Option<Mutant>,
}

impl Stage<'_> {
    /// Starts incarnation `incarnation`: its platform (and the notification of its death
    /// inside a state-file write), the embedding on the simulated disk with the engine's
    /// observer; after the first, the checker rewound to what reached the disk. Traced as
    /// `world <started>`.
    pub(crate) fn incarnation(
        &self,
        incarnation: u32,
        started: &str,
    ) -> (Arc<SimPlatform>, Arc<Notify>, Embedding) {
        {
            let mut e = lock(self.env);
            e.incarnation = incarnation;
            e.crash_requested = false;
        }
        let mutant = self.mutant;
        let crashed = Arc::new(Notify::new());
        let platform = Arc::new(SimPlatform {
            env: self.env.clone(),
            seed: self.seed,
            behaviour: self.behaviour.clone(),
            incarnation,
            start: self.start,
            base: self.base,
            tasks: Mutex::new(Vec::new()),
            crashed: crashed.clone(),
        });
        let now = env::now_ms(self.start);
        if incarnation > 1 {
            lock_logbook(self.logbook).rewind_to_durable(self.config);
        }
        lock_logbook(self.logbook).tracer.note(
            now,
            "world",
            started,
            &[("incarnation", u64::from(incarnation))],
        );
        let embedding = Embedding {
            platform: platform.clone(),
            state: Some(StateFile {
                fs: Arc::new(SimDisk {
                    env: self.env.clone(),
                    logbook: self.logbook.clone(),
                }),
                path: PathBuf::from(STATE_PATH),
            }),
            observer: Some(Box::new(StackObserve {
                logbook: self.logbook.clone(),
                start: self.start,
            })),
            setup: Some(Box::new(move |engine| engine.set_mutant(mutant))),
        };
        (platform, crashed, embedding)
    }
}

/// Process numbers of the second supervisors: their incarnation plus this.
const SECOND_PROCESS: u32 = 1000;

/// What a second supervisor on the same state file runs with.
struct SecondStart {
    env: Env,
    seed: u64,
    behaviour: env::BehaviourTable,
    start: Duration,
    base: Instant,
    logbook: Arc<Mutex<Logbook>>,
    log: Arc<Mutex<CallerLog>>,
    config: palisade_engine::EngineConfig,
    mutant: Option<Mutant>,
}

/// At `at`, while incarnation `incarnation` runs and holds the state file, a second
/// `palisade-supervise` starts on it with a prompt of its own (an operator's second
/// start, a service manager's overlap): the production lock must refuse it.
async fn second_start(s: SecondStart, incarnation: u32, at: u64) {
    let now = env::now_ms(s.start);
    madsim::time::sleep(Duration::from_millis(at.saturating_sub(now))).await;
    {
        let e = lock(&s.env);
        let path = PathBuf::from(STATE_PATH);
        if e.incarnation != incarnation || e.state_locks.get(&path) != Some(&incarnation) {
            return;
        }
    }
    let process = SECOND_PROCESS + incarnation;
    let line = lock_logbook(&s.logbook).tracer.note(
        env::now_ms(s.start),
        "world",
        "second_supervisor_started",
        &[("process", u64::from(process))],
    );
    let slot = {
        let mut l = oracle::lock(&s.log);
        l.second.push(oracle::SecondRun {
            process,
            line,
            ..oracle::SecondRun::default()
        });
        l.second.len() - 1
    };
    let platform = Arc::new(SimPlatform {
        env: s.env.clone(),
        seed: s.seed,
        behaviour: s.behaviour.clone(),
        incarnation: process,
        start: s.start,
        base: s.base,
        tasks: Mutex::new(Vec::new()),
        crashed: Arc::new(Notify::new()),
    });
    let mutant = s.mutant;
    let embedding = Embedding {
        platform,
        state: Some(StateFile {
            fs: Arc::new(SimDisk {
                env: s.env.clone(),
                logbook: s.logbook.clone(),
            }),
            path: PathBuf::from(STATE_PATH),
        }),
        observer: None,
        setup: Some(Box::new(move |engine| engine.set_mutant(mutant))),
    };
    let options = Options {
        agent: vec!["sim-agent".into()],
        state: Some(PathBuf::from(STATE_PATH)),
        prompts: vec!["the second supervisor's prompt".into()],
        session: SessionId::new(2).expect("2 is not zero"),
        cwd: Some(PathBuf::from("/work")),
        recovery_delays_ms: None,
        profile: None,
        log_format: Default::default(),
        initialize_timeout_ms: None,
        turn_idle_ms: None,
    };
    let io = Io {
        embedding,
        console: Box::new(SecondConsole {
            log: s.log.clone(),
            slot,
        }),
        stdin: None,
        stop: Box::pin(std::future::pending()),
    };
    let config = palisade_embed::SupervisorConfig {
        engine: s.config,
        ..palisade_embed::SupervisorConfig::default()
    };
    let code = supervise::run(options, config, io).await;
    oracle::lock(&s.log).second[slot].code = Some(code);
    lock_logbook(&s.logbook).tracer.note(
        env::now_ms(s.start),
        "world",
        "second_supervisor_exited",
        &[("process", u64::from(process)), ("code", u64::from(code))],
    );
}

/// The second supervisor's console: counts what it shows and claims.
struct SecondConsole {
    log: Arc<Mutex<CallerLog>>,
    slot: usize,
}

impl Console for SecondConsole {
    fn event<'a>(&'a mut self, _event: &'a SessionEvent) -> BoxFuture<'a, std::io::Result<()>> {
        oracle::lock(&self.log).second[self.slot].events += 1;
        Box::pin(std::future::ready(Ok(())))
    }

    fn message(&mut self, _text: &str) {}

    fn prompt_claimed(&mut self, _session: SessionId, _turn: TurnId, _text: &str) {
        oracle::lock(&self.log).second[self.slot].claimed += 1;
    }
}

/// Runs one seed of a stack scenario inside the current madsim runtime.
pub(crate) async fn run(
    scenario: Rc<Scenario>,
    seed: u64,
    plan: FaultPlan,
    mutant: Option<Mutant>,
    capture: bool,
) -> Finished {
    let config = plan.run_config(&scenario).engine();
    let logbook = Logbook::shared(&config, capture);
    let start = madsim::time::TimeHandle::current().elapsed();
    let base = Instant::now();
    let env: Env = Arc::new(Mutex::new(EnvState::default()));
    let log = Arc::new(Mutex::new(CallerLog::default()));
    let (workload, expect) = (scenario.workload.clone(), scenario.expect.clone());
    let drawn = plan.environment.clone();
    let behaviour: env::BehaviourTable = Arc::new(move |process| {
        crate::plan::agents::behaviour(&workload, &expect, drawn.as_ref(), seed, process)
    });
    let window = scenario.limits.fault_window_ms;
    let end = window + scenario.limits.quiesce_ms;
    let turns = plan.workload.turns(scenario.workload.turns_per_session);
    let prompts: Vec<String> = (1..=turns).map(|k| format!("prompt-{k}")).collect();
    let mut faults: VecDeque<Fault> = plan.faults.iter().copied().collect();
    let mut violation = None;
    let mut finished = false;
    let mut incarnation = 0;
    let mut restarts_left = scenario.world.restarts_after_exit;
    let mut signalled = false;
    let mut refused = false;

    'incarnations: while incarnation < MAX_INCARNATIONS {
        incarnation += 1;
        let (platform, crashed, embedding) = Stage {
            env: &env,
            seed,
            behaviour: &behaviour,
            start,
            base,
            logbook: &logbook,
            config: &config,
            mutant,
        }
        .incarnation(incarnation, "supervisor_started");
        let options = Options {
            agent: vec!["sim-agent".into()],
            state: Some(PathBuf::from(STATE_PATH)),
            prompts: Vec::new(),
            session: SessionId::new(1).expect("1 is not zero"),
            cwd: Some(PathBuf::from("/work")),
            recovery_delays_ms: None,
            profile: None,
            log_format: Default::default(),
            initialize_timeout_ms: None,
            turn_idle_ms: None,
        };
        // The caller pipes in every prompt no incarnation claimed, then closes stdin.
        let (stdin_tx, stdin_rx) = mpsc::channel(16);
        let unclaimed: Vec<String> = {
            let log = oracle::lock(&log);
            prompts
                .iter()
                .filter(|p| !log.claimed.iter().any(|(_, _, text)| text == *p))
                .cloned()
                .collect()
        };
        let think = scenario.workload.think_ms;
        let caller = log.clone();
        let feeder = async move {
            let gone = || oracle::lock(&caller).gone_at.is_some();
            for (k, text) in unclaimed.into_iter().enumerate() {
                let pause = pick(
                    mix(seed, u64::from(incarnation), k as u64, 0x7417),
                    think.lo,
                    think.hi,
                );
                madsim::time::sleep(Duration::from_millis(pause.max(1))).await;
                // A caller that went away sends nothing more: its end of stdin closes.
                if gone() || stdin_tx.send(Ok(text.clone().into_bytes())).await.is_err() {
                    return;
                }
                *oracle::lock(&caller).piped.entry(text).or_default() += 1;
            }
        };
        // The supervisor dies while it starts its second agent (a replacement), for the
        // first `spawn_crashes` incarnations.
        {
            let mut e = lock(&env);
            e.spawns = 0;
            e.crash_at_spawn = if incarnation <= scenario.world.spawn_crashes {
                2
            } else {
                0
            };
        }
        // SIGTERM at a drawn moment of the fault window, for the first `signal_stops`
        // incarnations: the supervisor's graceful stop (exit 143), then a new start.
        let signal_at = (incarnation <= scenario.world.signal_stops)
            .then(|| {
                let now = env::now_ms(start);
                (now < window).then(|| {
                    pick(
                        mix(seed, u64::from(incarnation), 0x51_67, 0),
                        now + 1,
                        window,
                    )
                })
            })
            .flatten();
        let signal: futures::future::BoxFuture<'static, Option<u8>> = match signal_at {
            Some(at) => {
                let (logbook, env) = (logbook.clone(), env.clone());
                Box::pin(async move {
                    let now = env::now_ms(start);
                    madsim::time::sleep(Duration::from_millis(at.saturating_sub(now))).await;
                    // A disruption, as a crash is: what was in flight may end unfinished.
                    lock(&env).last_disruption_ms = env::now_ms(start);
                    lock_logbook(&logbook).tracer.note(
                        env::now_ms(start),
                        "world",
                        "sigterm",
                        &[("incarnation", u64::from(incarnation))],
                    );
                    Some(143)
                })
            }
            None => Box::pin(std::future::pending()),
        };
        // Power lost at a drawn moment of the fault window, for the first `bit_rot`
        // incarnations: the machine comes back with a bit of the state file flipped.
        let rot_at = (incarnation <= scenario.world.bit_rot)
            .then(|| {
                let now = env::now_ms(start);
                (now < window)
                    .then(|| pick(mix(seed, u64::from(incarnation), 0xb17, 0), now + 1, window))
            })
            .flatten();
        let mut rot_now = false;
        if incarnation <= scenario.world.second_starts {
            let now = env::now_ms(start);
            if now < window {
                let at = pick(
                    mix(seed, u64::from(incarnation), 0x5ec0, 0),
                    now + 1,
                    window,
                );
                madsim::task::spawn(second_start(
                    SecondStart {
                        env: env.clone(),
                        seed,
                        behaviour: behaviour.clone(),
                        start,
                        base,
                        logbook: logbook.clone(),
                        log: log.clone(),
                        config: config.clone(),
                        mutant,
                    },
                    incarnation,
                    at,
                ));
            }
        }
        let io = Io {
            embedding,
            console: Box::new(SimConsole {
                log: log.clone(),
                env: env.clone(),
                logbook: logbook.clone(),
                incarnation,
                start,
            }),
            stdin: Some(stdin_rx),
            stop: signal,
        };
        let (done_tx, mut done_rx) = oneshot::channel();
        let config = palisade_embed::SupervisorConfig {
            engine: config.clone(),
            ..palisade_embed::SupervisorConfig::default()
        };
        use palisade_embed::Platform as _;
        let _ = platform.spawn(Box::pin(feeder));
        let _ = platform.spawn(Box::pin(async move {
            let code = supervise::run(options, config, io).await;
            let _ = done_tx.send(code);
        }));

        // Until the loop exits, a fault crashes it, or the run's time is up.
        let crash = loop {
            let now = env::now_ms(start);
            let next = faults
                .front()
                .map_or(end, |f| f.at_ms.min(end))
                .min(rot_at.unwrap_or(u64::MAX));
            let nap = madsim::time::sleep(Duration::from_millis(next.saturating_sub(now)));
            tokio::select! {
                biased;
                code = &mut done_rx => {
                    if lock(&env).crash_requested {
                        break true;
                    }
                    let code = code.unwrap_or(255);
                    let now = env::now_ms(start);
                    let line = lock_logbook(&logbook).tracer.note(
                        now,
                        "world",
                        "supervisor_exited",
                        &[("incarnation", u64::from(incarnation)), ("code", u64::from(code))],
                    );
                    let alive = lock(&env).alive();
                    let mut l = oracle::lock(&log);
                    l.exits.push((incarnation, code, alive));
                    l.exit_lines.push(line);
                    // Stopped by its signal: the service manager starts it again.
                    if signal_at.is_some_and(|at| at <= now) && code == 143 {
                        signalled = true;
                        break false;
                    }
                    // Exit 2 is bad input (a refused state file, a usage error): a person
                    // must look, and the service manager does not start it again.
                    if code == 2 {
                        refused = true;
                        finished = true;
                        break false;
                    }
                    // A service manager starts a failed supervisor again while its caller
                    // still waits for a turn (a caller that went away waits for nothing).
                    if code != 0 && l.unfinished() && l.gone_at.is_none() {
                        break true;
                    }
                    finished = true;
                    break false;
                }
                () = crashed.notified() => break true,
                () = nap => {
                    let now = env::now_ms(start);
                    if now >= end {
                        break 'incarnations;
                    }
                    if rot_at.is_some_and(|at| at <= now) {
                        rot_now = true;
                        break true;
                    }
                    while faults.front().is_some_and(|f| f.at_ms <= now) {
                        let f = faults.pop_front().expect("peeked");
                        lock_logbook(&logbook).tracer.fault(now, &f);
                        if apply(&env, &log, &f, now) {
                            // The remaining due faults hit the next incarnation.
                            break;
                        }
                    }
                    if oracle::lock(&log).crash_now {
                        oracle::lock(&log).crash_now = false;
                        break true;
                    }
                }
            }
        };
        if signalled {
            signalled = false;
            let now = env::now_ms(start);
            lock_logbook(&logbook).tracer.note(
                now,
                "caller",
                "starts_again",
                &[("incarnation", u64::from(incarnation))],
            );
            madsim::time::sleep(Duration::from_millis(RESTART_AFTER_MS)).await;
            continue;
        }
        if refused {
            break;
        }
        if !crash {
            // The caller starts it again on the same state file, with nothing new to ask:
            // what a platform does at its next start.
            let now = env::now_ms(start);
            if restarts_left == 0 || oracle::lock(&log).gone_at.is_some() || now >= end {
                break;
            }
            restarts_left -= 1;
            finished = false;
            lock_logbook(&logbook).tracer.note(
                now,
                "caller",
                "starts_again",
                &[("incarnation", u64::from(incarnation))],
            );
            madsim::time::sleep(Duration::from_millis(RESTART_AFTER_MS)).await;
            continue;
        }
        // The supervisor process is gone: its tasks stop; the watchdog takes down the
        // agent trees it guarded.
        platform.crash();
        {
            let mut e = lock(&env);
            e.last_disruption_ms = env::now_ms(start);
            let guarded: Vec<u32> = e
                .procs
                .iter()
                .filter(|(_, p)| p.alive && p.guarded && p.incarnation == incarnation)
                .map(|(pid, _)| *pid)
                .collect();
            for pid in guarded {
                if let Some(p) = e.procs.get_mut(&pid) {
                    p.died_with_supervisor = true;
                }
                e.kill(pid);
            }
        }
        let now = env::now_ms(start);
        lock_logbook(&logbook).tracer.note(
            now,
            "world",
            "supervisor_crashed",
            &[("incarnation", u64::from(incarnation))],
        );
        if rot_now {
            // The machine comes back with one bit of the state file flipped at rest.
            let mut e = lock(&env);
            if let Some(bytes) = e.files.get_mut(Path::new(STATE_PATH)) {
                let bits = (bytes.len() as u64 * 8).max(1);
                let bit = pick(mix(seed, u64::from(incarnation), 0xb17, 1), 0, bits - 1);
                if let Some(byte) = bytes.get_mut((bit / 8) as usize) {
                    *byte ^= 1 << (bit % 8);
                    e.rotted.insert(incarnation + 1);
                    drop(e);
                    lock_logbook(&logbook).tracer.note(
                        now,
                        "world",
                        "bit_rot",
                        &[("incarnation", u64::from(incarnation)), ("bit", bit)],
                    );
                }
            }
        }
        madsim::time::sleep(Duration::from_millis(RESTART_AFTER_MS)).await;
    }

    let found = lock_logbook(&logbook).found.take();
    if let Some(v) = found {
        violation = Some(v);
    }
    if violation.is_none() {
        let now = env::now_ms(start);
        let idx = lock_logbook(&logbook)
            .tracer
            .note(now, "oracle", "judge", &[]);
        let e = lock(&env);
        let l = oracle::lock(&log);
        let schedule = config.core.recovery_delays_ms.len();
        violation = oracle::judge(&e, &l, &prompts, schedule, finished, idx).err();
    }
    if let Some(v) = &violation {
        let now = env::now_ms(start);
        lock_logbook(&logbook).tracer.line(
            now,
            "oracle",
            "violation",
            &[("invariant", &v.invariant), ("message", &v.message)],
        );
    }
    let turns = oracle::lock(&log).claimed.len() as u32;
    let mut w = lock_logbook(&logbook);
    Finished {
        tracer: std::mem::take(&mut w.tracer),
        marks: std::mem::take(&mut w.marks),
        turns,
        violation,
    }
}

/// Carries out a planned fault; true if it crashes the supervisor now.
fn apply(env: &Env, log: &Arc<Mutex<CallerLog>>, f: &Fault, now: u64) -> bool {
    match apply_to_env(env, f, now) {
        ToCaller::Nothing => false,
        ToCaller::Stall { ms } => {
            let mut l = oracle::lock(log);
            l.stall_until = l.stall_until.max(now + ms);
            false
        }
        ToCaller::Crash => {
            oracle::lock(log).crash_now = true;
            true
        }
        ToCaller::Gone => {
            lock(env).last_disruption_ms = now;
            oracle::lock(log).gone_at.get_or_insert(now);
            false
        }
    }
}

/// What a planned fault asks of the world's caller (palisade-supervise's, or the proxy's
/// client) once the environment's part is done.
pub(crate) enum ToCaller {
    Nothing,
    /// It takes nothing for `ms`.
    Stall {
        ms: u64,
    },
    /// The program under test crashes now.
    Crash,
    /// The caller goes away for good.
    Gone,
}

/// Carries out the environment's part of a planned fault (agents, disk), shared by the
/// stack and proxy worlds; the caller's part is returned.
pub(crate) fn apply_to_env(env: &Env, f: &Fault, now: u64) -> ToCaller {
    let mut e = lock(env);
    if matches!(
        f.kind,
        FaultKind::ProviderExit | FaultKind::DiskFault { .. } | FaultKind::CrashRestart
    ) {
        e.last_disruption_ms = now;
    }
    match f.kind {
        FaultKind::ProviderExit => {
            if let Some(&pid) = e.alive().last() {
                e.kill(pid);
            }
        }
        FaultKind::ExitAfterTurn => e.exit_after_answer = true,
        FaultKind::ExitOnPrompt => e.exit_on_prompt += 1,
        FaultKind::LateCallback { .. } | FaultKind::HangTeardown => e.next_ignores_eof = true,
        FaultKind::CallerStall { ms } => return ToCaller::Stall { ms },
        FaultKind::DiskFault { class, count } => {
            e.disk_faults
                .extend(std::iter::repeat_n(class, count as usize));
        }
        FaultKind::CrashRestart => return ToCaller::Crash,
        FaultKind::CallerGone => return ToCaller::Gone,
        // The callers only send prompts (the proxy's client draws its own cancels); the
        // agents' load answers and the message network are the engine world's.
        FaultKind::Prompt
        | FaultKind::Resume
        | FaultKind::Retry
        | FaultKind::Cancel
        | FaultKind::Burst { .. }
        | FaultKind::LoadError { .. }
        | FaultKind::LoadTimeout
        | FaultKind::ClockJump { .. }
        | FaultKind::Jitter { .. } => {}
    }
    ToCaller::Nothing
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::runner::run_seed;
    use crate::scenario::Scenario;

    /// Seeds of `stack-basic` tried: about one in five ends with a launcher whose agent
    /// ignores stdin EOF.
    const SEEDS: u64 = 40;

    fn stack_basic() -> Scenario {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/stack-basic.toml");
        Scenario::load(&path).expect("the shipped scenario loads")
    }

    /// The seeds of `stack-basic` that fail `invariant`, each on a fresh thread (as
    /// `palisade run` runs one), with the platform's group signals broken or not.
    fn failing(invariant: &str, signals_reach_top_only: bool) -> Vec<u64> {
        let scenario = stack_basic();
        (1..=SEEDS)
            .filter(|&seed| {
                let scenario = scenario.clone();
                let outcome = std::thread::spawn(move || {
                    super::env::SIGNALS_REACH_TOP_ONLY.with(|b| b.set(signals_reach_top_only));
                    run_seed(&scenario, seed, None, None)
                })
                .join()
                .expect("a seed's thread does not panic");
                outcome.violation.is_some_and(|v| v.invariant == invariant)
            })
            .collect()
    }

    /// `S-agent-outlives-supervisor` can fail: when the platform's signals reach only the
    /// top of an agent's tree (the codex npm launcher) and nothing takes down the rest,
    /// the agent the launcher runs (one that ignores stdin EOF) outlives the supervisor.
    #[test]
    fn an_agent_outlives_a_supervisor_whose_signals_reach_only_the_launcher() {
        let caught = failing("S-agent-outlives-supervisor", true);
        assert!(
            !caught.is_empty(),
            "no seed of 1..={SEEDS} caught the broken group signals"
        );
        let fenced = failing("S-agent-outlives-supervisor", false);
        assert!(
            fenced.is_empty(),
            "with the process-group fence in place, seeds {fenced:?} still left an agent running"
        );
    }
}
