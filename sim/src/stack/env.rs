//! The stack world's environment behind the production seams: a [`SimPlatform`] (madsim's
//! clock and tasks, agent processes as madsim tasks running the shared
//! [`AgentModel`] behind in-memory pipes) and a [`SimDisk`] (a state file that fails,
//! tears and loses writes when the plan says). Everything the environment does is
//! recorded in [`EnvState`], the ground truth the stack oracle judges from.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use palisade_embed::platform::{
    AgentCommand, AgentTree, BlockingJob, BoxFuture, Platform, SpawnError, SpawnedAgent,
    StderrMode, Task, TreeSignal, WatchdogProgram,
};
use palisade_embed::state_file::{StateFs, StateLock};
use palisade_embed::watch;
use palisade_testkit::agent_model::{
    AgentModel, Behaviour, LoadCapability, MemoryStore, Out, Script, Seen, StreamedEvent,
};
use palisade_wire::jsonrpc::{parse_frame, Frame};
use palisade_wire::{ProcessExit, RequestId};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

use crate::plan::DiskFaultClass;
use crate::world::oracle::LoadTruth;

/// The Unix time the simulated wall clock starts at (2026-01-01T00:00:00Z): any fixed
/// value works; deadlines only take differences.
const UNIX_START_MS: u64 = 1_767_225_600_000;
/// The most milliseconds between a kill and its signs (stdout EOF, the exit status).
pub(crate) const DYING_MS: u64 = 20;
/// Bytes of an in-memory pipe: a real pipe's default capacity on Linux.
const PIPE_BYTES: usize = 64 * 1024;
/// Launcher processes (the codex npm launcher's node process) get pids from here on, apart
/// from the agents' own, so that an agent's pid (and the behaviour drawn from it) does not
/// depend on which agents before it had launchers.
const LAUNCHER_PIDS: u32 = 500_000;

#[cfg(test)]
thread_local! {
    /// Test only: the platform's signals reach only an agent tree's top process (the
    /// launcher), never its group, and nothing takes down what is left of the tree: the
    /// fence `process.rs` keeps with process groups, broken.
    pub(crate) static SIGNALS_REACH_TOP_ONLY: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

fn signals_reach_top_only() -> bool {
    #[cfg(test)]
    {
        SIGNALS_REACH_TOP_ONLY.with(std::cell::Cell::get)
    }
    #[cfg(not(test))]
    {
        false
    }
}

/// One agent process, as the environment knows it.
#[derive(Debug, Clone)]
pub(crate) struct ProcTruth {
    /// The supervisor incarnation that started it.
    pub(crate) incarnation: u32,
    pub(crate) alive: bool,
    /// Its watchdog is armed: the tree dies with the supervisor.
    pub(crate) guarded: bool,
    /// When it died (simulated ms).
    pub(crate) died_at_ms: Option<u64>,
    /// It was taken down with its crashed supervisor (the watchdog), not by its own
    /// failure or the supervisor's decision.
    pub(crate) died_with_supervisor: bool,
    /// When the supervisor first asked its tree to go (closed its stdin, signalled it,
    /// killed it), simulated ms.
    pub(crate) asked_at_ms: Option<u64>,
    /// It died on its own: neither asked to go by the supervisor nor taken down with it.
    pub(crate) died_unasked: bool,
    /// A launcher's agent: the real agent it runs as its child.
    pub(crate) agent: Option<u32>,
}

impl ProcTruth {
    /// A process `incarnation` just started: alive, its watchdog not yet armed.
    fn started(incarnation: u32) -> ProcTruth {
        ProcTruth {
            incarnation,
            alive: true,
            guarded: false,
            died_at_ms: None,
            died_with_supervisor: false,
            asked_at_ms: None,
            died_unasked: false,
            agent: None,
        }
    }
}

/// A prompt an agent really received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) at_ms: u64,
    /// The process that received it.
    pub(crate) pid: u32,
    /// Its tag (`p<pid>.<n>`): the markers of the events it wrote start with it.
    pub(crate) tag: String,
    pub(crate) text: String,
}

/// What happened in the environment.
#[derive(Debug, Default)]
pub(crate) struct EnvState {
    pub(crate) procs: BTreeMap<u32, ProcTruth>,
    pub(crate) prompts: Vec<Received>,
    /// Conversations the agents keep (shared by every process, as on the agent's disk).
    pub(crate) store: MemoryStore,
    /// Files on the simulated disk.
    pub(crate) files: BTreeMap<PathBuf, Vec<u8>>,
    /// Armed disk faults: the next writes fail this way.
    pub(crate) disk_faults: VecDeque<DiskFaultClass>,
    /// State-file writes that failed, per incarnation.
    pub(crate) write_failures: BTreeMap<u32, u32>,
    /// The supervisor crashed inside a write (a torn write, or before the rename).
    pub(crate) crash_requested: bool,
    /// The supervisor dies while it starts its agent number `crash_at_spawn` (1 the
    /// first; 0 never) of this incarnation (`[world] spawn_crashes`): once the agent's
    /// watchdog is armed, before a state write records it.
    pub(crate) crash_at_spawn: u32,
    /// Agents the running incarnation started.
    pub(crate) spawns: u32,
    /// The next agent started ignores stdin EOF (and SIGTERM's grace runs out).
    pub(crate) next_ignores_eof: bool,
    /// The running agent exits right after it answers its next prompt.
    pub(crate) exit_after_answer: bool,
    /// This many of the next agents to receive a prompt exit right after reading it,
    /// before any update or answer.
    pub(crate) exit_on_prompt: u32,
    /// Launchers started so far.
    launchers: u32,
    /// Kill switches of live agents.
    pub(crate) kills: BTreeMap<u32, watch::Sender<bool>>,
    pub(crate) incarnation: u32,
    /// State files' locks ([`StateFs::lock`]) and the incarnation (the supervisor process)
    /// that holds each. A lock held by an earlier incarnation is free: the process died,
    /// and the OS released its lock.
    pub(crate) state_locks: BTreeMap<PathBuf, u32>,
    /// When the environment last hurt the stack: an agent killed, a disk fault armed, a
    /// crash. After it, every prompt the caller sends must complete.
    pub(crate) last_disruption_ms: u64,
    next_pid: u32,
    /// The proxy world's records of what the agents asked, got and wrote (`None` in the
    /// supervise world, which records none of it).
    pub(crate) proxy: Option<ProxyTruth>,
    /// History updates every successful `session/load` replays (the proxy world's agents).
    pub(crate) load_replay: u32,
    /// Every stream event an agent wrote, by its marker (`<tag>#<k>`), as it wrote it:
    /// what a caller or client must get when it gets that event.
    pub(crate) written: BTreeMap<String, StreamedEvent>,
    /// Agents whose stdin the supervisor closed while a prompt of theirs had gone silent.
    pub(crate) silent_stopped: Vec<SilentStop>,
    /// Agents that refused to load a conversation: one they had (a drawn flake), or one
    /// lost with an agent killed before it kept it.
    pub(crate) load_failed: BTreeSet<u32>,
    /// Prompts an agent held mute (nothing written for them) until it read a
    /// `session/cancel` for them: a dispatch given up at its start deadline, its agent
    /// alive. By process, when it read the cancel.
    pub(crate) mute_cancelled: Vec<(u32, u64)>,
    /// Agents whose stdin the supervisor closed while they held a prompt mute (its
    /// attempt given up at its start deadline): when.
    pub(crate) mute_stopped: BTreeMap<u32, u64>,
    /// Incarnations started on a state file with a bit flipped at rest (`[world] bit_rot`).
    pub(crate) rotted: BTreeSet<u32>,
}

/// An agent whose stdin the supervisor closed while the prompt it held had gone silent.
#[derive(Debug, Clone)]
pub(crate) struct SilentStop {
    pub(crate) pid: u32,
    /// The prompt's conversation.
    pub(crate) session: String,
    /// It read a `session/cancel` for that conversation before its stdin's end.
    pub(crate) cancelled: bool,
    pub(crate) at_ms: u64,
}

/// A `session/request_permission` an agent process wrote.
#[derive(Debug, Clone)]
pub(crate) struct AgentAsk {
    pub(crate) pid: u32,
    /// The agent's own request id.
    pub(crate) id: RequestId,
    /// The request's `toolCall.toolCallId` (`<tag>-perm`).
    pub(crate) tool: String,
    pub(crate) at_ms: u64,
    /// The supervisor had already asked the process to go when it wrote the request.
    pub(crate) after_retired: bool,
}

/// An answer an agent process received to one of its own requests.
#[derive(Debug, Clone)]
pub(crate) struct AgentGot {
    pub(crate) pid: u32,
    pub(crate) id: RequestId,
    /// The `_meta.answers` of the answer: the request the client meant to answer (`None`:
    /// not the simulated client's answer, e.g. the engine's `cancelled`).
    pub(crate) answers: Option<String>,
    pub(crate) at_ms: u64,
}

/// What the proxy world's agents did, for its oracle.
#[derive(Debug, Default)]
pub(crate) struct ProxyTruth {
    /// Prompts received: pid, tag, text.
    pub(crate) prompts: Vec<(u32, String, String)>,
    /// The markers each prompt (by tag) wrote, in order.
    pub(crate) events: BTreeMap<String, Vec<String>>,
    /// Each prompt's answer: `Some(stopReason)`, `None` for an error.
    pub(crate) answers: BTreeMap<String, Option<String>>,
    pub(crate) asked: Vec<AgentAsk>,
    pub(crate) got: Vec<AgentGot>,
    /// Each agent's `loadSession` capability and whether it lists its sessions, by pid.
    pub(crate) caps: BTreeMap<u32, (LoadCapability, bool)>,
    /// The loads agents answered: pid, when, the load.
    pub(crate) loads: Vec<(u32, u64, LoadTruth)>,
    /// The conversations agents created: pid, when, its id.
    pub(crate) created: Vec<(u32, u64, String)>,
    /// The conversation of each prompt an agent received, in order.
    pub(crate) prompted: Vec<String>,
    /// The `agentInfo` of every `initialize` an agent answered.
    pub(crate) agent_infos: Vec<serde_json::Value>,
    /// The `session/set_mode`s agents received: pid, the conversation, the mode.
    pub(crate) modes: Vec<(u32, String, String)>,
    /// The `authenticate`s agents received: pid, when, whether it named their method.
    pub(crate) authenticated: Vec<(u32, u64, bool)>,
    /// Session requests agents refused as unauthenticated: pid, when, the method.
    pub(crate) unauthenticated: Vec<(u32, u64, String)>,
}

/// The shared environment.
pub(crate) type Env = Arc<Mutex<EnvState>>;

pub(crate) fn lock(env: &Env) -> MutexGuard<'_, EnvState> {
    env.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl EnvState {
    /// Kills agent `pid` (SIGKILL): its task ends at its next step.
    pub(crate) fn kill(&mut self, pid: u32) {
        if let Some(kill) = self.kills.get(&pid) {
            kill.send_replace(true);
        }
    }

    /// The supervisor asked process `pid` to go (the first time counts).
    fn asked(&mut self, pid: u32, now: u64) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.asked_at_ms.get_or_insert(now);
        }
    }

    /// Process `pid` died at `now`: on its own unless the supervisor asked it to go or
    /// took it down with itself.
    fn died(&mut self, pid: u32, now: u64) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.died_unasked |= p.alive && p.asked_at_ms.is_none() && !p.died_with_supervisor;
            p.alive = false;
            p.died_at_ms = Some(now);
        }
        self.kills.remove(&pid);
    }

    /// Live agents, ascending.
    pub(crate) fn alive(&self) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|(_, p)| p.alive)
            .map(|(pid, _)| *pid)
            .collect()
    }
}

impl ProxyTruth {
    fn saw(&mut self, pid: u32, at_ms: u64, seen: &Seen) {
        match seen {
            Seen::New(Ok(conversation)) => self.created.push((pid, at_ms, conversation.clone())),
            Seen::Initialize { agent_info } => self.agent_infos.push(agent_info.clone()),
            Seen::Load {
                id,
                existed,
                answer,
                ..
            } => self.loads.push((
                pid,
                at_ms,
                LoadTruth {
                    id: id.clone(),
                    existed: *existed,
                    answer: Some(answer.clone()),
                },
            )),
            Seen::SetMode { session, mode } => {
                self.modes.push((pid, session.clone(), mode.clone()));
            }
            Seen::Authenticate { ok } => self.authenticated.push((pid, at_ms, *ok)),
            Seen::Unauthenticated { method } => {
                self.unauthenticated.push((pid, at_ms, method.clone()));
            }
            Seen::Prompt { tag, text, session } => {
                self.prompts.push((pid, tag.clone(), text.clone()));
                self.prompted.push(session.clone());
            }
            Seen::Event { tag, event } => self
                .events
                .entry(tag.clone())
                .or_default()
                .push(event.marker.clone()),
            Seen::PromptAnswered { tag, answer } => {
                self.answers
                    .insert(tag.clone(), answer.as_ref().ok().cloned());
            }
            _ => {}
        }
    }
}

/// A permission request's `toolCall.toolCallId`.
fn tool_call_id(params: &palisade_wire::RawJson) -> Option<String> {
    let value: serde_json::Value = params.parse().ok()?;
    Some(
        value
            .get("toolCall")?
            .get("toolCallId")?
            .as_str()?
            .to_owned(),
    )
}

/// The `_meta.answers` of an answer the simulated client wrote.
fn answers_of(result: &palisade_wire::RawJson) -> Option<String> {
    let value: serde_json::Value = result.parse().ok()?;
    Some(value.get("_meta")?.get("answers")?.as_str()?.to_owned())
}

/// Simulated milliseconds since the world started.
pub(crate) fn now_ms(start: Duration) -> u64 {
    (madsim::time::TimeHandle::current().elapsed() - start).as_millis() as u64
}

/// The behaviour of the agent process with a given pid (the shared table).
pub(crate) type BehaviourTable = Arc<dyn Fn(u64) -> Behaviour + Send + Sync>;

/// madsim's clock and tasks, agent processes as madsim tasks. One per supervisor
/// incarnation: a crash aborts every task it spawned.
pub(crate) struct SimPlatform {
    pub(crate) env: Env,
    pub(crate) seed: u64,
    pub(crate) behaviour: BehaviourTable,
    pub(crate) incarnation: u32,
    /// madsim's elapsed time at the world's start.
    pub(crate) start: Duration,
    /// The `Instant` that stands for the world's start.
    pub(crate) base: Instant,
    /// Abort handles of every task this incarnation spawned.
    pub(crate) tasks: Mutex<Vec<madsim::task::AbortHandle>>,
    /// Woken when the supervisor dies inside a state-file write.
    pub(crate) crashed: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for SimPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimPlatform")
            .field("incarnation", &self.incarnation)
            .finish_non_exhaustive()
    }
}

impl SimPlatform {
    /// Aborts every task of this incarnation (the supervisor process is gone).
    pub(crate) fn crash(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for task in tasks {
            task.abort();
        }
    }
}

impl Platform for SimPlatform {
    fn now(&self) -> Instant {
        self.base + Duration::from_millis(now_ms(self.start))
    }

    fn unix_ms(&self) -> u64 {
        UNIX_START_MS + now_ms(self.start)
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        let wait = deadline.saturating_duration_since(self.now());
        Box::pin(madsim::time::sleep(wait))
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) -> Task {
        let handle = madsim::task::spawn(task);
        let abort = handle.abort_handle();
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle.abort_handle());
        Task::new(move || abort.abort())
    }

    fn blocking(&self, job: BlockingJob) -> BoxFuture<'static, io::Result<()>> {
        if lock(&self.env).crash_requested {
            // The process is dying (whoever doomed it tells the world when it is gone):
            // nothing it asks for any more reaches the disk.
            return Box::pin(std::future::pending());
        }
        let result = job();
        if lock(&self.env).crash_requested {
            // The process died inside the write: nothing after it runs.
            self.crashed.notify_one();
            return Box::pin(std::future::pending());
        }
        Box::pin(std::future::ready(result))
    }

    fn spawn_agent(
        &self,
        _command: &AgentCommand,
        _stderr: StderrMode,
        _watchdog: &WatchdogProgram,
    ) -> Result<SpawnedAgent, SpawnError> {
        let (ours_in, agent_in) = tokio::io::duplex(PIPE_BYTES);
        let (agent_out, ours_out) = tokio::io::duplex(PIPE_BYTES);
        let (kill_tx, kill_rx) = watch::channel(false);
        let (exit_tx, exit_rx) = watch::channel(None);
        let (pid, ignores_eof, load_replay, dies) = {
            let mut env = lock(&self.env);
            env.next_pid += 1;
            let pid = 1000 + env.next_pid;
            env.procs.insert(pid, ProcTruth::started(self.incarnation));
            env.kills.insert(pid, kill_tx);
            // The supervisor dies while it starts this agent: from now on nothing it
            // writes lands; it is gone once the agent's watchdog is armed.
            env.spawns += 1;
            let dies = env.spawns == env.crash_at_spawn;
            env.crash_requested |= dies;
            (
                pid,
                std::mem::take(&mut env.next_ignores_eof),
                env.load_replay,
                dies,
            )
        };
        let mut behaviour = (self.behaviour)(u64::from(pid));
        if ignores_eof {
            behaviour.exits_on_eof = false;
        }
        if let Some(truth) = lock(&self.env).proxy.as_mut() {
            truth
                .caps
                .insert(pid, (behaviour.load_capability, behaviour.lists_sessions));
        }
        // The codex npm launcher: the supervisor's child is the launcher, which runs the
        // real agent as its own child and passes its stdio on.
        let top = behaviour.launcher.then(|| {
            let mut env = lock(&self.env);
            env.launchers += 1;
            let launcher = LAUNCHER_PIDS + env.launchers;
            env.procs.insert(
                launcher,
                ProcTruth {
                    agent: Some(pid),
                    ..ProcTruth::started(self.incarnation)
                },
            );
            let (kill_tx, kill_rx) = watch::channel(false);
            env.kills.insert(launcher, kill_tx);
            (launcher, kill_rx)
        });
        let model = AgentModel::new(
            format!("p{pid}"),
            behaviour,
            crate::mix::mix(self.seed, u64::from(pid), 0x57ac, 0),
            now_ms(self.start),
        );
        let model = if load_replay > 0 {
            model.with_script(Script {
                load_replay,
                ..Script::default()
            })
        } else {
            model
        };
        // An agent process is not the supervisor's task: a crash does not abort it.
        madsim::task::spawn(agent_process(
            self.env.clone(),
            self.start,
            pid,
            model,
            agent_in,
            agent_out,
            kill_rx,
            exit_tx,
        ));
        let (child, exit) = match top {
            None => (pid, exit_rx.clone()),
            Some((launcher, kill)) => {
                let (launcher_tx, launcher_rx) = watch::channel(None);
                madsim::task::spawn(launcher_process(
                    self.env.clone(),
                    self.start,
                    launcher,
                    kill,
                    exit_rx.clone(),
                    launcher_tx,
                ));
                (launcher, launcher_rx)
            }
        };
        Ok(SpawnedAgent {
            pid: Some(child),
            stdin: Box::new(ours_in),
            stdout: Box::new(ours_out),
            tree: Box::new(SimTree {
                env: self.env.clone(),
                start: self.start,
                child,
                agent: pid,
                exit,
                agent_exit: exit_rx,
                crash_on_arm: dies.then(|| self.crashed.clone()),
            }),
        })
    }
}

/// One agent process: the shared behaviour model over its stdin and stdout.
#[allow(clippy::too_many_arguments)]
async fn agent_process(
    env: Env,
    start: Duration,
    pid: u32,
    mut model: AgentModel,
    stdin: tokio::io::DuplexStream,
    mut stdout: tokio::io::DuplexStream,
    mut kill: watch::Receiver<bool>,
    exit: watch::Sender<Option<ProcessExit>>,
) {
    let mut lines = BufReader::new(stdin).lines();
    let mut stdin_open = true;
    // The conversations it read a `session/cancel` for.
    let mut cancels: Vec<String> = Vec::new();
    let status = 'life: loop {
        let now = now_ms(start);
        while let Some((out, seen)) = model.poll_out(now) {
            let mut answered = false;
            if let Some(seen) = seen {
                let mut e = lock(&env);
                if let Some(truth) = e.proxy.as_mut() {
                    truth.saw(pid, now, &seen);
                }
                if let Seen::Event { event, .. } = &seen {
                    e.written.insert(event.marker.clone(), event.clone());
                }
                // (A prompt is seen when it is read, below: it comes with no output.)
                if let Seen::PromptAnswered { .. } = seen {
                    answered = true;
                }
                // A load refused: the runtime failed. A conversation it has, refused, is a
                // flake the environment drew (whatever prompt needed it may not complete);
                // one it does not have was lost with an agent killed before it kept it (the
                // kill was the disruption), and the load's failure is no less real.
                if let Seen::Load {
                    existed,
                    answer: Err(_),
                    ..
                } = seen
                {
                    e.load_failed.insert(pid);
                    if existed {
                        e.last_disruption_ms = now;
                    }
                }
            }
            match out {
                Out::Line(line) => {
                    if line.contains("\"session/request_permission\"") {
                        let mut e = lock(&env);
                        let after_retired =
                            e.procs.get(&pid).is_some_and(|p| p.asked_at_ms.is_some());
                        if let (Some(truth), Ok(Frame::Request { id, params, .. })) =
                            (e.proxy.as_mut(), parse_frame(line.trim_end().as_bytes()))
                        {
                            truth.asked.push(AgentAsk {
                                pid,
                                id,
                                tool: tool_call_id(&params).unwrap_or_default(),
                                at_ms: now,
                                after_retired,
                            });
                        }
                    }
                    tokio::select! {
                        biased;
                        _ = kill.wait_for(|k| *k) => break 'life ProcessExit::Signal(9),
                        written = stdout.write_all(line.as_bytes()) => {
                            if written.is_err() {
                                // The reader is gone (the supervisor died): SIGPIPE.
                                break 'life ProcessExit::Signal(13);
                            }
                        }
                    }
                }
                Out::Stderr(_) => {}
                Out::Exit(code) => break 'life ProcessExit::Code(code),
            }
            if answered && {
                let mut e = lock(&env);
                let dies = std::mem::take(&mut e.exit_after_answer);
                if dies {
                    e.last_disruption_ms = now;
                }
                dies
            } {
                // SIGKILLed right after its answer: it reads nothing more, and its death
                // (stdout EOF, the reaped status) shows a few milliseconds later, as a
                // real kill does.
                let dying =
                    crate::mix::pick(crate::mix::mix(u64::from(pid), now, 0xd1e, 0), 1, DYING_MS);
                madsim::time::sleep(Duration::from_millis(dying)).await;
                break 'life ProcessExit::Signal(9);
            }
        }
        let wake = model.next_wake();
        let nap = wake.map(|w| madsim::time::sleep(Duration::from_millis(w.saturating_sub(now))));
        tokio::select! {
            biased;
            _ = kill.wait_for(|k| *k) => break 'life ProcessExit::Signal(9),
            line = lines.next_line(), if stdin_open => match line {
                Ok(Some(line)) => {
                    let mut e = lock(&env);
                    let frame = parse_frame(line.as_bytes());
                    if let (Some(truth), Ok(Frame::Response { id, outcome })) = (e.proxy.as_mut(), &frame) {
                        truth.got.push(AgentGot {
                            pid,
                            id: id.clone(),
                            answers: match outcome {
                                Ok(result) => answers_of(result),
                                Err(error) => error
                                    .data
                                    .as_ref()
                                    .and_then(|d| d.get("answers"))
                                    .and_then(serde_json::Value::as_str)
                                    .map(str::to_owned),
                            },
                            at_ms: now_ms(start),
                        });
                    }
                    let now = now_ms(start);
                    let mute = model.mute_prompt().map(str::to_owned);
                    model.on_frame(now, frame, &mut e.store);
                    // What it received (its prompts) comes apart from what it wrote.
                    let mut read_prompt = false;
                    for seen in model.poll_seen() {
                        if let Some(truth) = e.proxy.as_mut() {
                            truth.saw(pid, now, &seen);
                        }
                        if let Seen::Cancel { session } = &seen {
                            if mute.as_ref() == Some(session) {
                                e.mute_cancelled.push((pid, now));
                            }
                            cancels.push(session.clone());
                        }
                        if let Seen::Prompt { tag, text, .. } = seen {
                            e.prompts.push(Received {
                                at_ms: now,
                                pid,
                                tag,
                                text,
                            });
                            read_prompt = true;
                        }
                    }
                    if read_prompt && (model.silent_prompt().is_some() || model.mute_prompt().is_some()) {
                        // It took the prompt and goes silent (or stays mute): a wedged or
                        // stalled agent, the environment's doing.
                        e.last_disruption_ms = now;
                    }
                    if read_prompt && e.exit_on_prompt > 0 {
                        // It read the prompt and dies before it writes anything for it.
                        e.exit_on_prompt -= 1;
                        e.last_disruption_ms = now;
                        break 'life ProcessExit::Code(1);
                    }
                }
                _ => {
                    // The supervisor closed its end: its way of asking an agent to go.
                    stdin_open = false;
                    let now = now_ms(start);
                    let mut e = lock(&env);
                    e.asked(pid, now);
                    // Every line written before the end was read before it (a pipe keeps
                    // order): a cancel sent first has been seen.
                    if model.mute_prompt().is_some() {
                        e.mute_stopped.insert(pid, now);
                    }
                    if let Some(session) = model.silent_prompt() {
                        e.silent_stopped.push(SilentStop {
                            pid,
                            session: session.to_owned(),
                            cancelled: cancels.iter().any(|c| c == session),
                            at_ms: now,
                        });
                    }
                    drop(e);
                    model.on_stdin_closed(now);
                }
            },
            () = async { nap.expect("guarded by is_some").await }, if nap.is_some() => {
                model.on_wake(now_ms(start));
            }
            // Nothing to do: wait for input or a kill (a process that ignores EOF idles).
            () = std::future::pending::<()>(), if !stdin_open && nap.is_none() => {}
        }
    };
    model.kill();
    lock(&env).died(pid, now_ms(start));
    drop(stdout);
    exit.send_replace(Some(status));
}

/// A launcher: waits for the real agent, its child, and exits with its status; killed, it
/// dies alone (its child keeps running, reparented, until something kills the group).
async fn launcher_process(
    env: Env,
    start: Duration,
    pid: u32,
    mut kill: watch::Receiver<bool>,
    mut agent_exit: watch::Receiver<Option<ProcessExit>>,
    exit: watch::Sender<Option<ProcessExit>>,
) {
    let status = tokio::select! {
        biased;
        _ = kill.wait_for(|k| *k) => ProcessExit::Signal(9),
        status = agent_exit.wait_for(Option::is_some) => {
            status.ok().and_then(|s| *s).unwrap_or(ProcessExit::Unknown)
        }
    };
    lock(&env).died(pid, now_ms(start));
    exit.send_replace(Some(status));
}

/// An agent's process tree: the agent, or a launcher and the agent it runs.
struct SimTree {
    env: Env,
    /// madsim's elapsed time at the world's start.
    start: Duration,
    /// The supervisor's direct child: the launcher, or the agent itself.
    child: u32,
    /// The real agent.
    agent: u32,
    /// The direct child's exit.
    exit: watch::Receiver<Option<ProcessExit>>,
    /// The real agent's exit.
    agent_exit: watch::Receiver<Option<ProcessExit>>,
    /// The supervisor dies once this tree's watchdog is armed (`[world] spawn_crashes`).
    crash_on_arm: Option<Arc<tokio::sync::Notify>>,
}

impl SimTree {
    /// Records that the supervisor asked the whole tree to go.
    fn ask(&self, env: &mut EnvState) {
        let now = now_ms(self.start);
        env.asked(self.child, now);
        env.asked(self.agent, now);
    }
}

impl AgentTree for SimTree {
    fn arm(&mut self) -> BoxFuture<'_, ()> {
        let mut env = lock(&self.env);
        for pid in [self.child, self.agent] {
            if let Some(p) = env.procs.get_mut(&pid) {
                p.guarded = true;
            }
        }
        if let Some(crashed) = self.crash_on_arm.take() {
            crashed.notify_one();
        }
        Box::pin(std::future::ready(()))
    }

    fn wait(&mut self) -> BoxFuture<'_, ProcessExit> {
        Box::pin(async move {
            match self.exit.wait_for(Option::is_some).await {
                Ok(status) => status.unwrap_or(ProcessExit::Unknown),
                Err(_) => ProcessExit::Unknown,
            }
        })
    }

    fn signal(&mut self, _signal: TreeSignal) {
        // The real agents (and the launcher) die on SIGTERM as on SIGKILL.
        let mut env = lock(&self.env);
        self.ask(&mut env);
        env.kill(self.child);
        if !signals_reach_top_only() {
            env.kill(self.agent);
        }
    }

    fn kill_child(&mut self) {
        let mut env = lock(&self.env);
        self.ask(&mut env);
        env.kill(self.child);
    }

    fn take_down(&mut self, _kill: bool) -> BoxFuture<'_, bool> {
        let mut env = lock(&self.env);
        self.ask(&mut env);
        if signals_reach_top_only() {
            return Box::pin(std::future::ready(true));
        }
        env.kill(self.agent);
        drop(env);
        Box::pin(async move { self.agent_exit.wait_for(Option::is_some).await.is_ok() })
    }

    fn disarm(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// The simulated disk under the state file.
#[derive(Debug)]
pub(crate) struct SimDisk {
    pub(crate) env: Env,
    /// Checkpointed at every completed write (see `Logbook::checkpoint`).
    pub(crate) logbook: Arc<Mutex<crate::logbook::Logbook>>,
}

/// A state file's lock on the simulated disk, held by one incarnation; released when
/// dropped (or, as the OS does, when its incarnation is gone: [`EnvState::state_locks`]).
#[derive(Debug)]
struct SimLock {
    env: Env,
    path: PathBuf,
    incarnation: u32,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut env = lock(&self.env);
        if env.state_locks.get(&self.path) == Some(&self.incarnation) {
            env.state_locks.remove(&self.path);
        }
    }
}

impl StateFs for SimDisk {
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
        let env = lock(&self.env);
        let bytes = env
            .files
            .get(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        if bytes.len() as u64 > max_bytes {
            return Err(io::Error::from(io::ErrorKind::FileTooLarge));
        }
        Ok(bytes.clone())
    }

    fn lock(&self, path: &Path) -> io::Result<StateLock> {
        let mut env = lock(&self.env);
        let incarnation = env.incarnation;
        if env.state_locks.get(path) == Some(&incarnation) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is in use by another supervisor", path.display()),
            ));
        }
        env.state_locks.insert(path.to_owned(), incarnation);
        Ok(StateLock::new(SimLock {
            env: self.env.clone(),
            path: path.to_owned(),
            incarnation,
        }))
    }

    fn write_synced(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut env = lock(&self.env);
        let fault = env.disk_faults.pop_front();
        let incarnation = env.incarnation;
        match fault {
            None => {
                env.files.insert(path.to_owned(), bytes.to_vec());
                Ok(())
            }
            Some(class) => {
                *env.write_failures.entry(incarnation).or_insert(0) += 1;
                match class {
                    DiskFaultClass::NoSpace => Err(io::Error::from_raw_os_error(28)),
                    DiskFaultClass::Io => Err(io::Error::from_raw_os_error(5)),
                    DiskFaultClass::TornWrite => {
                        env.files
                            .insert(path.to_owned(), bytes[..bytes.len() / 2].to_vec());
                        env.crash_requested = true;
                        Err(io::Error::from_raw_os_error(5))
                    }
                    DiskFaultClass::CrashBeforeRename => {
                        env.files.insert(path.to_owned(), bytes.to_vec());
                        env.crash_requested = true;
                        Err(io::Error::from_raw_os_error(5))
                    }
                }
            }
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut env = lock(&self.env);
        let bytes = env
            .files
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        env.files.insert(to.to_owned(), bytes);
        crate::logbook::lock(&self.logbook).checkpoint();
        Ok(())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The simulated disk's lock is the real one's: one holder per live supervisor
    /// process; released when dropped, and when its process (incarnation) dies.
    #[test]
    fn the_simulated_disk_locks_a_state_file_for_one_live_supervisor() {
        let env: Env = Arc::new(Mutex::new(EnvState {
            incarnation: 1,
            ..EnvState::default()
        }));
        let config = palisade_engine::EngineConfig::default();
        let disk = SimDisk {
            env: env.clone(),
            logbook: crate::logbook::Logbook::shared(&config, false),
        };
        let path = Path::new("/state");
        let held = disk.lock(path).expect("a free state file locks");
        let busy = disk.lock(path).expect_err("a second process is refused");
        assert_eq!(busy.kind(), io::ErrorKind::WouldBlock);
        assert!(disk.lock(Path::new("/other")).is_ok());
        drop(held);
        let again = disk.lock(path).expect("released when dropped");
        // The holder crashes: the next incarnation finds the lock free.
        lock(&env).incarnation = 2;
        let next = disk.lock(path).expect("released when its process died");
        assert!(disk.lock(path).is_err());
        // The dead process's guard going away later frees nothing of the new holder's.
        drop(again);
        assert!(disk.lock(path).is_err());
        drop(next);
        assert!(disk.lock(path).is_ok());
    }
}
