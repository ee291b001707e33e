//! The stack world's invariants (issue 11, item 5), judged from what the environment
//! recorded: what the caller got, what each agent received, which processes run, what the
//! disk did. Never from the supervisor's or the core's view of themselves.
//!
//! - `S-prompt-lost`: every prompt the supervisor claimed (the caller got its turn id)
//!   ends with a `TurnEnded` the caller receives.
//! - `S-end-without-cause`: a turn that ended neither completed nor cancelled says why.
//! - `S-completed-turn-rerun`: no agent receives a prompt again after the caller saw it
//!   complete (a restored state that forgot the completion re-sends it).
//! - `S-output-gap`: a turn the caller saw complete reached it with every output seq from
//!   the first to its last, across restarts: nothing is dropped for a slow caller (issue
//!   29, item 3).
//! - `S-output-missing`: an agent re-prompted with a replay block that says the caller
//!   has `delivered-through` events of the turn continues right after them: none of its
//!   events reaches the caller at one of those seqs (it would stand in for one the caller
//!   was counted as having and never got: across restarts, none is missing; issue 29,
//!   class 6).
//! - `S-failure-invented`: a failure shown to the caller names a fault the environment
//!   injected. This world starts an agent at once whenever the supervisor asks (a spawn
//!   neither fails nor hangs), so an attempt shown failed on a core deadline without ever
//!   having had a runtime was never given one: after a restart, a retry whose spawn was in
//!   flight (`[world] spawn_crashes`) must get its runtime at once (issue 29, class 4).
//! - `S-output-altered`: every output event the caller gets is an update an agent wrote,
//!   as it wrote it: the same bytes, or the same text (and tool-call input) once decoded.
//!   The agents write escapes, unicode, backslash runs and nested JSON
//!   (`palisade_testkit::wire_text`), so a reader of the wire that mis-reads them shows
//!   here (issue 29, class 5). The caller reads the lines `palisade-supervise` prints
//!   (`SessionEvent::to_json`), so the updates judged are the bytes it printed.
//! - `S-event-misprinted`: each printed line names the event, session, turn and output
//!   seqs the supervisor handed out, and its updates are JSON.
//! - `S-output-seq-twice`: no output seq of a turn reaches the caller twice with different
//!   content. (The same event handed out again after a crash is the write-ahead's
//!   at-least-once delivery: the state listing it undelivered was durable, the step that
//!   marked it delivered was not; the caller drops it by its seq.)
//! - `S-event-shown-again`: an event the caller was shown by an incarnation that exited on
//!   its own (end of input, a failure; not a crash, not a failed state-file write, not a
//!   caller gone) is not shown again by a later one: a turn's output seq or its end. What
//!   a clean stop hands its caller is done with for good (issue 28, item 1: every start
//!   printed the previous run's last turn again).
//! - `S-persist-failure-hidden`: an incarnation whose state-file writes failed tells its
//!   caller (a message) and does not exit 0.
//! - `S-restart-spends-recovery`: a turn the caller saw end `Failed` had more of its
//!   runtimes fail than the recovery schedule has steps (with a non-empty schedule),
//!   counting the agent processes that died while it was in flight (one given up on
//!   silence, or that refused to load a conversation (one it had, or one lost with an
//!   agent killed before it kept it), counts when its stdin was closed) and not the ones taken down with a crashed
//!   supervisor: a supervisor restart resumes an in-flight turn without using up one of its
//!   recovery steps (issue 11, third bug).
//! - `S-agent-outlives-supervisor`: no agent process runs once its supervisor exited.
//! - `S-second-process-ran`: a second `palisade-supervise` started on the state file while
//!   another holds it exits 2 having claimed no prompt, shown no event and started no
//!   agent (issue 28, item 3: it took over the first one's running turn).
//! - `S-caller-gone-hidden`: an incarnation that could not write an event to its caller
//!   (the caller went away: a broken pipe) says so on stderr (a message naming stdout)
//!   and does not exit 0. A caller that went away can be told nothing more, so the checks
//!   that the caller saw every claimed turn end (`S-prompt-lost`, `S-exit-0-unfinished`,
//!   `S-prompt-not-run`) do not apply once it left.
//! - `R10-failure-cause`: a failure the caller is shown that blames the agent's exit (its
//!   process exited, its stdout closed) names a process tree in which a process really
//!   died on its own: not one the supervisor asked to go (closed its stdin, signalled,
//!   killed) nor one taken down with a crashed supervisor. The world's rule of the same
//!   name, judged from this environment's process records.
//! - `S-exit-0-unfinished`: exit 0 only when every claimed turn completed.
//! - `S-no-exit`: the supervise loop exits within the run (its caller closed stdin).
//! - `S-prompt-resent`: a prompt reaches agents at most once plus once per step of the
//!   recovery schedule. A receipt by a process the supervisor asked to go, or took down
//!   with itself when it crashed, does not count: a restart resumes a turn without using
//!   up a step (issue 28, item 4: a rolled-back prompt was sent again outside the
//!   schedule, so an agent that read it and died before its first update got it three
//!   times).
//! - `S-prompt-sent-bare-twice`: a prompt's text reaches agents without a replay block at
//!   most once per time the caller sent it (again after a restart when it never saw the
//!   claim), whoever received it and whatever became of them: every other send is a
//!   recovery's re-prompt and carries its block (rule 8). The receipts
//!   `S-prompt-resent` excuses count here: a process asked to go after a prompt was written
//!   to it may have read it, since ACP has no acknowledgement.
//! - `S-cause-untrue`: a message that says a prompt never reached (or was never sent to)
//!   an agent is about a prompt no agent had received (issue 28, item 4).
//! - `S-replay-generation`: a re-prompt a live agent receives restates a later recovery
//!   generation than any re-prompt of the same text before it in the same incarnation
//!   (issue 29, item 2; `stale_replay`, shared with the proxy world).
//! - `S-silent-uncancelled`: an agent whose prompt went silent, and whose stdin a running
//!   supervisor closed (the idle rule gave the turn up), had read a `session/cancel` for
//!   that prompt's conversation first: the provider is told to drop the prompt before its
//!   runtime is asked to go. Not judged for agents taken down by a supervisor that was
//!   signalled, crashed, lost its caller or its state file (a shutdown stops agents as they
//!   are). (Found by the real-agent test of the idle rule: the cancel and the stop were
//!   written by two tasks in either order, and the stdin's end could overtake the cancel.)
//! - `S-state-misread`: a state file is used as written or refused: an incarnation started
//!   on one with a bit flipped at rest (`[world] bit_rot`) exits 2, saying it cannot
//!   restore, having claimed no prompt, shown no event and started no agent (issue 28,
//!   item 5: 15 of 909 single-bit flips of a crashed run's state file were accepted and
//!   hung the restart). Once the last start refused its state file, no check asks that the
//!   caller saw its turns end: a person must look first.
//! - `S-prompt-not-run`: a prompt first sent after the environment's last disruption (an
//!   agent killed or gone silent, a refused load, a disk fault, a crash) completes: nothing that happened before it may
//!   doom it (a runtime killed right before it must not take it down).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use palisade_core::{ExecutionId, TurnId, TurnOutcome};
use palisade_embed::SessionEvent;
use palisade_engine::FailureCause;
use palisade_wire::RawJson;

use super::env::{EnvState, ProcTruth};
use crate::oracle::{
    blames_agent_exit, replay_delivered_through, replay_generation, strip_blocks, CaughtBy,
    Violation,
};

/// What the caller of `palisade-supervise` got, over every incarnation.
#[derive(Debug, Default)]
pub(crate) struct CallerLog {
    /// Events in order: incarnation, agent prompts received so far, the event.
    pub(crate) events: Vec<(u32, usize, SessionEvent)>,
    /// The trace line of each of `events`.
    pub(crate) event_lines: Vec<u64>,
    /// Operator messages: incarnation, text.
    pub(crate) messages: Vec<(u32, String)>,
    /// For each of `messages`: how many prompts had been claimed and how many prompts the
    /// agents had received when it was written, and its trace line.
    pub(crate) message_at: Vec<(usize, usize, u64)>,
    /// Prompts the supervisor claimed: incarnation, turn, text.
    pub(crate) claimed: Vec<(u32, TurnId, String)>,
    /// How many times the caller piped each prompt's text to a supervisor's stdin: again
    /// after a restart when it never saw the claim (a supervisor that died between its
    /// claim and its answer may still run the first).
    pub(crate) piped: BTreeMap<String, usize>,
    /// When each of `claimed` was claimed (simulated ms).
    pub(crate) claimed_at: Vec<u64>,
    /// The trace line (`caller claimed`) of each of `claimed`.
    pub(crate) claimed_lines: Vec<u64>,
    /// When the caller got each turn's (first) end (simulated ms).
    pub(crate) ended_at: BTreeMap<TurnId, u64>,
    /// Exits: incarnation, code, agents still alive at the exit.
    pub(crate) exits: Vec<(u32, u8, Vec<u32>)>,
    /// The trace line (`world supervisor_exited`) of each of `exits`.
    pub(crate) exit_lines: Vec<u64>,
    /// The caller takes no events before this.
    pub(crate) stall_until: u64,
    /// A crash-restart fault fired.
    pub(crate) crash_now: bool,
    /// When the caller went away for good (its pipes closed), simulated ms.
    pub(crate) gone_at: Option<u64>,
    /// Per incarnation, the trace line of its first event write that failed.
    pub(crate) write_failed: BTreeMap<u32, u64>,
    /// The second `palisade-supervise` processes started on the same state file.
    pub(crate) second: Vec<SecondRun>,
    /// The first event whose printed line (what the caller reads) does not say what the
    /// supervisor handed out: its trace line and why.
    pub(crate) misprinted: Option<(u64, String)>,
}

/// A second `palisade-supervise` started on the state file while an incarnation held it.
#[derive(Debug, Default)]
pub(crate) struct SecondRun {
    /// Its process number (its agents' `ProcTruth::incarnation`).
    pub(crate) process: u32,
    /// Its exit code, once it exited.
    pub(crate) code: Option<u8>,
    /// Prompts it claimed and events it showed its caller.
    pub(crate) claimed: usize,
    pub(crate) events: usize,
    /// The trace line of its start.
    pub(crate) line: u64,
}

pub(crate) fn lock(log: &Mutex<CallerLog>) -> MutexGuard<'_, CallerLog> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CallerLog {
    /// Whether a claimed turn has not been seen ending.
    pub(crate) fn unfinished(&self) -> bool {
        self.claimed.iter().any(|(_, turn, _)| {
            !self
                .events
                .iter()
                .any(|(_, _, e)| matches!(e, SessionEvent::TurnEnded { turn: t, .. } if t == turn))
        })
    }

    /// Records an event the caller got, written to the trace at `line`.
    pub(crate) fn event(
        &mut self,
        incarnation: u32,
        agent_prompts: usize,
        event: SessionEvent,
        line: u64,
    ) {
        self.events.push((incarnation, agent_prompts, event));
        self.event_lines.push(line);
    }
}

/// The event as the caller reads it: `palisade-supervise` prints each event as one JSON
/// line ([`SessionEvent::to_json`]); the caller's record is the event the supervisor
/// handed out with each output's update taken from the printed line (the bytes the caller
/// got), after checking that the line names the same event, session, turn and seqs.
/// `Err` says how the line differs.
pub(crate) fn as_printed(event: &SessionEvent) -> Result<SessionEvent, String> {
    read_printed(event, &event.to_json())
}

/// The event as `line` shows it (see [`as_printed`]).
fn read_printed(event: &SessionEvent, line: &str) -> Result<SessionEvent, String> {
    #[derive(serde::Deserialize)]
    struct Printed<'a> {
        event: String,
        session: String,
        #[serde(default)]
        turn: Option<String>,
        #[serde(default, borrow)]
        events: Option<Vec<PrintedOutput<'a>>>,
    }
    #[derive(serde::Deserialize)]
    struct PrintedOutput<'a> {
        seq: u64,
        #[serde(borrow)]
        update: &'a serde_json::value::RawValue,
    }
    let printed: Printed<'_> = serde_json::from_str(line)
        .map_err(|e| format!("the line is not an event ({e}): {line}"))?;
    if printed.event != event.name() || printed.session != event.session().get().to_string() {
        return Err(format!(
            "the line names event {:?} of session {}, the supervisor handed out {} of {}",
            printed.event,
            printed.session,
            event.name(),
            event.session().get()
        ));
    }
    let mut shown = event.clone();
    let turn = match &shown {
        SessionEvent::Output { turn, .. } | SessionEvent::TurnEnded { turn, .. } => Some(*turn),
        _ => None,
    };
    if let Some(turn) = turn {
        if printed.turn != Some(turn.get().to_string()) {
            return Err(format!(
                "the line names turn {:?}, the supervisor's event turn {}",
                printed.turn,
                turn.get()
            ));
        }
    }
    if let SessionEvent::Output { events, .. } = &mut shown {
        let lines = printed.events.unwrap_or_default();
        if lines.len() != events.len() {
            return Err(format!(
                "the line holds {} output events, the supervisor handed out {}",
                lines.len(),
                events.len()
            ));
        }
        for (e, p) in events.iter_mut().zip(lines) {
            if e.seq != p.seq {
                return Err(format!(
                    "the line says seq {}, the supervisor's event {}",
                    p.seq, e.seq
                ));
            }
            e.update = RawJson::from_text(p.update.get())
                .map_err(|err| format!("seq {}'s update is not JSON ({err})", p.seq))?;
        }
    }
    Ok(shown)
}

/// Rule 8 on what the agents read, in both stack worlds: a re-prompt a live agent receives
/// restates a later recovery generation than any re-prompt of the same text before it in
/// the same supervisor incarnation and turn (a restart may start a new turn of the same
/// text; a first dispatch, bare, starts one, and so does a claim of the text, `new_turns`:
/// incarnation, when, text, in time order: its bare dispatch may never reach an agent that
/// is exiting). A prompt that reached its process only after the supervisor asked it to go
/// (a pipe held it) may be older. The first re-prompt that breaks it: when, its
/// generation, the one before.
pub(crate) fn stale_replay(
    env: &EnvState,
    new_turns: &[(u32, u64, &str)],
) -> Option<(u64, u32, u32)> {
    let mut generations: BTreeMap<(u32, &str), u32> = BTreeMap::new();
    let mut claims = new_turns.iter().peekable();
    for received in &env.prompts {
        while let Some((incarnation, _, text)) = claims.next_if(|(_, at, _)| *at <= received.at_ms)
        {
            generations.remove(&(*incarnation, *text));
        }
        let Some(p) = env.procs.get(&received.pid) else {
            continue;
        };
        let original = strip_blocks(&received.text);
        let Some(generation) = replay_generation(&received.text) else {
            // A first dispatch: a new turn of this text (the caller sent it again), whose
            // recoveries count from the first generation.
            generations.remove(&(p.incarnation, original));
            continue;
        };
        if p.asked_at_ms.is_some_and(|at| at <= received.at_ms) {
            continue;
        }
        let before = generations.insert((p.incarnation, original), generation);
        if let Some(before) = before.filter(|b| generation <= *b) {
            return Some((received.at_ms, generation, before));
        }
    }
    None
}

/// Why `update` (an output event's update as the caller got it) is not an update an agent
/// wrote, as it wrote it; `None` when it is. An update is found by its marker, or (a
/// scripted agent's plain chunk has none) among every update written, by its bytes or by
/// its decoded text.
fn altered(env: &EnvState, update: &str) -> Option<String> {
    if let Some((tag, k)) = crate::world::oracle::marker_of(update) {
        let key = format!("{tag}#{k}");
        return match env.written.get(&key) {
            Some(w) if w.delivered_as_written(update) => None,
            Some(_) => Some(format!("altered from the update {key} its agent wrote")),
            None => Some(format!("as {key}, an update no agent wrote")),
        };
    }
    let found = env.written.values().any(|w| w.delivered_as_written(update));
    (!found).then(|| "as an update no agent wrote".to_owned())
}

/// At most 300 bytes of `text`, for a message.
fn cut(text: &str) -> &str {
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn v(invariant: &str, message: String, idx: u64) -> Violation {
    // Judged from the environment's records once the run ended; the four that say
    // something never happened are liveness.
    let liveness = matches!(
        invariant,
        "S-no-exit" | "S-prompt-not-run" | "S-exit-0-unfinished" | "S-prompt-lost"
    );
    Violation {
        invariant: invariant.into(),
        message,
        events: vec![idx],
        by: if liveness {
            CaughtBy::Liveness
        } else {
            CaughtBy::GroundTruth
        },
    }
}

/// Judges a finished run. Each violation names the trace line of the event it was decided
/// on: the caller's event, the claim or the exit it is about; `idx` (the judgement's own
/// line) only when there is none (the supervisor never exited and nothing reached the caller).
pub(crate) fn judge(
    env: &EnvState,
    log: &CallerLog,
    _prompts: &[String],
    schedule: usize,
    finished: bool,
    idx: u64,
) -> Result<(), Violation> {
    let line_of = |lines: &[u64], i: usize| lines.get(i).copied().unwrap_or(idx);
    // What the caller reads says what the supervisor handed out.
    if let Some((line, why)) = &log.misprinted {
        return Err(v(
            "S-event-misprinted",
            format!("an event palisade-supervise printed does not say what it handed out: {why}"),
            *line,
        ));
    }
    // One supervisor per state file: a second one is refused before it does anything.
    for second in &log.second {
        let agents = env
            .procs
            .values()
            .filter(|p| p.incarnation == second.process)
            .count();
        if second.code != Some(2) || second.claimed > 0 || second.events > 0 || agents > 0 {
            return Err(v(
                "S-second-process-ran",
                format!(
                    "a second palisade-supervise on the same state file (process {}) was not refused: exit {:?}, {} prompts claimed, {} events shown, {agents} agents started",
                    second.process, second.code, second.claimed, second.events
                ),
                second.line,
            ));
        }
    }
    // A state file is used as written or refused: one the disk changed at rest is refused
    // (exit 2, saying it cannot restore) before anything is claimed, shown or started.
    for &rotted in &env.rotted {
        let exit = log.exits.iter().position(|(i, _, _)| *i == rotted);
        let code = exit.map(|k| log.exits[k].1);
        let claimed = log.claimed.iter().filter(|(i, _, _)| *i == rotted).count();
        let shown = log.events.iter().filter(|(i, _, _)| *i == rotted).count();
        let agents = env
            .procs
            .values()
            .filter(|p| p.incarnation == rotted)
            .count();
        let told = log
            .messages
            .iter()
            .any(|(i, text)| *i == rotted && text.contains("cannot restore"));
        if code != Some(2) || claimed > 0 || shown > 0 || agents > 0 || !told {
            return Err(v(
                "S-state-misread",
                format!(
                    "incarnation {rotted} started on a state file with a bit flipped at rest and was not refused: exit {code:?}, {claimed} prompts claimed, {shown} events shown, {agents} agents started{}",
                    if told { "" } else { ", no message that it cannot restore" }
                ),
                exit.map_or(idx, |k| line_of(&log.exit_lines, k)),
            ));
        }
    }
    // Every turn's end, as the caller got it (the first one), with its trace line.
    let mut ended: BTreeMap<TurnId, (TurnOutcome, bool, usize, u64)> = BTreeMap::new();
    let mut seqs: BTreeMap<(TurnId, u64), &str> = BTreeMap::new();
    // The process the caller was told runs each execution, per incarnation (a restart
    // from a lagging state file may hand an execution id out again).
    let mut pids: BTreeMap<(u32, ExecutionId), u32> = BTreeMap::new();
    // Incarnations that exited on their own with their caller's events written down.
    let stopped_cleanly = |incarnation: u32| {
        log.exits.iter().any(|(i, _, _)| *i == incarnation)
            && env.write_failures.get(&incarnation).copied().unwrap_or(0) == 0
            && !log.write_failed.contains_key(&incarnation)
    };
    // Per turn's output seq (`None`: its end), the incarnation that showed it first.
    let mut shown: BTreeMap<(TurnId, Option<u64>), u32> = BTreeMap::new();
    // Per re-prompt a live agent received (by its tag), how many events of the turn its
    // replay block says the caller already has.
    let resumes_after: BTreeMap<&str, (u64, &super::env::Received)> = env
        .prompts
        .iter()
        .filter(|r| {
            env.procs
                .get(&r.pid)
                .is_none_or(|p| p.asked_at_ms.is_none_or(|at| at > r.at_ms))
        })
        .filter_map(|r| Some((r.tag.as_str(), (replay_delivered_through(&r.text)?, r))))
        .collect();
    for (i, (incarnation, agent_prompts, event)) in log.events.iter().enumerate() {
        let line = line_of(&log.event_lines, i);
        let keys: Vec<(TurnId, Option<u64>)> = match event {
            SessionEvent::Output { turn, events, .. } => {
                events.iter().map(|e| (*turn, Some(e.seq))).collect()
            }
            SessionEvent::TurnEnded { turn, .. } => vec![(*turn, None)],
            _ => Vec::new(),
        };
        for key in keys {
            let first = *shown.entry(key).or_insert(*incarnation);
            if first < *incarnation && stopped_cleanly(first) {
                let what = match key.1 {
                    Some(seq) => format!("output seq {seq} of turn {}", key.0.get()),
                    None => format!("the end of turn {}", key.0.get()),
                };
                return Err(v(
                    "S-event-shown-again",
                    format!(
                        "{what} was shown by incarnation {first}, which exited on its own, and again by incarnation {incarnation}"
                    ),
                    line,
                ));
            }
        }
        match event {
            SessionEvent::RuntimeStarted {
                execution,
                pid: Some(pid),
                ..
            } => {
                pids.insert((*incarnation, *execution), *pid);
            }
            SessionEvent::FailureReported { failure, cause, .. } => {
                // This world starts an agent at once whenever the supervisor asks (a spawn
                // neither fails nor hangs): an attempt that never got a runtime failed on
                // its start deadline only if the supervisor never asked for one.
                if *cause == FailureCause::CoreDeadline && failure.execution.is_none() {
                    return Err(v(
                        "S-failure-invented",
                        format!(
                            "attempt {} was shown failed on a core deadline without ever having a runtime, but this environment starts an agent at once whenever asked: no fault it injected made the start miss its deadline",
                            failure.attempt
                        ),
                        line,
                    ));
                }
                let pid = failure
                    .execution
                    .filter(|_| blames_agent_exit(cause))
                    .and_then(|exec| pids.get(&(*incarnation, exec)));
                if let Some(&pid) = pid {
                    let agent = env.procs.get(&pid).and_then(|p| p.agent);
                    let tree = [Some(pid), agent];
                    let on_its_own = tree
                        .iter()
                        .flatten()
                        .filter_map(|p| env.procs.get(p))
                        .any(|p| p.died_unasked);
                    if !on_its_own {
                        let how = match env.procs.get(&pid) {
                            Some(p) if p.alive => "is still running".to_owned(),
                            Some(p) if p.died_with_supervisor => {
                                "was taken down with its crashed supervisor".to_owned()
                            }
                            Some(ProcTruth {
                                asked_at_ms: Some(t),
                                ..
                            }) => format!("was asked to go by the supervisor at {t} ms"),
                            _ => "never died on its own".to_owned(),
                        };
                        return Err(v(
                            "R10-failure-cause",
                            format!(
                                "attempt {} failed with \"{cause}\", but process {pid} (incarnation {incarnation}) {how}",
                                failure.attempt
                            ),
                            line,
                        ));
                    }
                }
            }
            SessionEvent::TurnEnded {
                turn,
                outcome,
                cause,
                ..
            } => {
                ended
                    .entry(*turn)
                    .or_insert((*outcome, cause.is_some(), *agent_prompts, line));
            }
            SessionEvent::Output { turn, events, .. } => {
                for e in events {
                    let content = e.update.get();
                    let through = crate::world::oracle::marker_of(content)
                        .and_then(|(tag, _)| resumes_after.get(tag));
                    if let Some(&(through, r)) = through.filter(|(through, _)| e.seq <= *through) {
                        return Err(v(
                            "S-output-missing",
                            format!(
                                "output seq {} of turn {} is an event of process {}, re-prompted at {} ms to continue after the {through} events its replay block says the caller has: the caller never got seq {} as it was",
                                e.seq,
                                turn.get(),
                                r.pid,
                                r.at_ms,
                                e.seq
                            ),
                            line,
                        ));
                    }
                    if let Some(why) = altered(env, content) {
                        return Err(v(
                            "S-output-altered",
                            format!(
                                "output seq {} of turn {} reached the caller {why}: {}",
                                e.seq,
                                turn.get(),
                                cut(content)
                            ),
                            line,
                        ));
                    }
                    if let Some(before) = seqs.insert((*turn, e.seq), content) {
                        if before != content {
                            return Err(v(
                                "S-output-seq-twice",
                                format!(
                                    "output seq {} of turn {} reached the caller twice, with different content",
                                    e.seq,
                                    turn.get()
                                ),
                                line,
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    // Nothing dropped for a slow caller: a turn the caller saw complete reached it with
    // every output seq from the first to its last, none left out.
    for (turn, (outcome, _, _, line)) in &ended {
        if *outcome != TurnOutcome::Completed {
            continue;
        }
        let shown: Vec<u64> = seqs
            .range((*turn, 0)..=(*turn, u64::MAX))
            .map(|((_, seq), _)| *seq)
            .collect();
        if let Some(missing) =
            (1..=shown.last().copied().unwrap_or(0)).find(|k| shown.binary_search(k).is_err())
        {
            return Err(v(
                "S-output-gap",
                format!(
                    "turn {} completed, and the caller got its output seqs up to {} without seq {missing}",
                    turn.get(),
                    shown.last().copied().unwrap_or(0)
                ),
                *line,
            ));
        }
    }
    for (turn, (outcome, caused, _, line)) in &ended {
        if !matches!(outcome, TurnOutcome::Completed | TurnOutcome::Cancelled) && !caused {
            return Err(v(
                "S-end-without-cause",
                format!(
                    "turn {} ended {outcome:?} and the caller was not told why",
                    turn.get()
                ),
                *line,
            ));
        }
    }
    // A message that says the last claimed prompt never reached an agent, while one had
    // received it.
    for ((_, message), &(claimed, received, line)) in log.messages.iter().zip(&log.message_at) {
        let Some((_, turn, text)) = claimed.checked_sub(1).and_then(|i| log.claimed.get(i)) else {
            continue;
        };
        let says_unreached = message.contains("never reached") || message.contains("never sent");
        if let Some(r) = env.prompts[..received.min(env.prompts.len())]
            .iter()
            .find(|r| says_unreached && strip_blocks(&r.text) == text)
        {
            return Err(v(
                "S-cause-untrue",
                format!(
                    "the caller was told \"{message}\" about turn {} ({text:?}), but process {} received it at {} ms",
                    turn.get(),
                    r.pid,
                    r.at_ms
                ),
                line,
            ));
        }
    }
    // Each prompt reaches agents at most once, and once more per recovery step; a process
    // the supervisor asked to go or took down with itself when it crashed is not a
    // recovery's (a restart resumes a turn without using up a step).
    let mut first_line: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, (_, _, text)) in log.claimed.iter().enumerate() {
        first_line
            .entry(text)
            .or_insert(line_of(&log.claimed_lines, i));
    }
    for (text, line) in &first_line {
        let receipts: Vec<&super::env::Received> = env
            .prompts
            .iter()
            .filter(|r| strip_blocks(&r.text) == *text)
            .collect();
        let excused = receipts
            .iter()
            .filter(|r| {
                env.procs
                    .get(&r.pid)
                    .is_some_and(|p| p.died_with_supervisor || p.asked_at_ms.is_some())
            })
            .count();
        if receipts.len() - excused > 1 + schedule {
            return Err(v(
                "S-prompt-resent",
                format!(
                    "prompt {text:?} reached agents {} times ({excused} of them processes the supervisor stopped or took down with it), more than once plus a recovery schedule of {schedule} step(s)",
                    receipts.len()
                ),
                *line,
            ));
        }
    }
    for (incarnation, turn, text) in &log.claimed {
        if let Some((TurnOutcome::Completed, _, seen, line)) = ended.get(turn) {
            if let Some(again) = env.prompts[*seen..]
                .iter()
                .find(|r| strip_blocks(&r.text) == text)
            {
                // The agents' receipts are not trace lines: name the completion the
                // prompt was received again after.
                return Err(v(
                    "S-completed-turn-rerun",
                    format!(
                        "turn {} ({text:?}, claimed by incarnation {incarnation}) completed, and an agent received it again at {} ms",
                        turn.get(),
                        again.at_ms
                    ),
                    *line,
                ));
            }
        }
    }
    // Only a recovery sends a prompt again, and it restates the conversation first: a
    // bare send more times than the caller piped the text (a caller that never saw its
    // claim sends it again after a restart) is a re-send around rule 8, whoever received
    // the first.
    for (text, line) in &first_line {
        let claims = log.piped.get(*text).copied().unwrap_or(0).max(1);
        let bare: Vec<&super::env::Received> = env
            .prompts
            .iter()
            .filter(|r| r.text.as_str() == *text)
            .collect();
        if bare.len() > claims {
            let (first, last) = (bare[0], bare[bare.len() - 1]);
            return Err(v(
                "S-prompt-sent-bare-twice",
                format!(
                    "prompt {text:?}, sent by the caller {claims} time(s), reached agents without a replay block {} times: first process {} at {} ms, last process {} at {} ms",
                    bare.len(),
                    first.pid,
                    first.at_ms,
                    last.pid,
                    last.at_ms
                ),
                *line,
            ));
        }
    }
    for ((incarnation, turn, text), claimed_at) in log.claimed.iter().zip(&log.claimed_at) {
        // An empty schedule disables recovery: the turn fails at its first loss, whatever
        // it was (and says so).
        if schedule == 0 || !matches!(ended.get(turn), Some((TurnOutcome::Failed, _, _, _))) {
            continue;
        }
        let ended_line = ended.get(turn).map_or(idx, |e| e.3);
        let ended_at = log.ended_at.get(turn).copied().unwrap_or(u64::MAX);
        // A runtime killed just before the claim may be the one the turn was sent to.
        let from = claimed_at.saturating_sub(super::env::DYING_MS);
        // A runtime given up on silence, or holding a prompt mute, or that refused a
        // load, failed when it was asked to go (it dies up to the stop deadline later,
        // maybe after the turn ended, maybe with a crashed supervisor); any other when it
        // died, unless it died with one.
        let failed = env
            .procs
            .iter()
            .filter(|(pid, p)| {
                let silent = env.silent_stopped.iter().find(|s| s.pid == **pid);
                let refused = env.load_failed.contains(pid);
                silent
                    .map(|s| s.at_ms)
                    .or(env.mute_stopped.get(pid).copied())
                    .or(if refused { p.asked_at_ms } else { None })
                    .or(if p.died_with_supervisor {
                        None
                    } else {
                        p.died_at_ms
                    })
                    .is_some_and(|at| at >= from && at <= ended_at)
            })
            .count();
        // A prompt an agent held mute until its cancel is a dispatch given up at its start
        // deadline: one failure of the turn's runtime, which stays alive.
        let failed = failed
            + env
                .mute_cancelled
                .iter()
                .filter(|(_, at)| *at >= from && *at <= ended_at)
                .count();
        let restarts = env
            .procs
            .values()
            .filter(|p| p.died_with_supervisor)
            .filter(|p| p.died_at_ms.is_some_and(|at| at >= from && at <= ended_at))
            .count();
        if failed <= schedule {
            return Err(v(
                "S-restart-spends-recovery",
                format!(
                    "turn {} ({text:?}, claimed by incarnation {incarnation}) ended Failed with a recovery schedule of {schedule} step(s), but only {failed} of its runtimes failed ({restarts} went down with a crashed supervisor)",
                    turn.get()
                ),
                ended_line,
            ));
        }
    }
    for (i, (incarnation, code, alive)) in log.exits.iter().enumerate() {
        let line = line_of(&log.exit_lines, i);
        if !alive.is_empty() {
            return Err(v(
                "S-agent-outlives-supervisor",
                format!("incarnation {incarnation} exited ({code}) with agent processes {alive:?} still running"),
                line,
            ));
        }
        if let Some(&failed) = log.write_failed.get(incarnation) {
            let told = log
                .messages
                .iter()
                .any(|(i, text)| i == incarnation && text.contains("stdout"));
            if *code == 0 || !told {
                return Err(v(
                    "S-caller-gone-hidden",
                    format!(
                        "incarnation {incarnation} could not write an event to its caller (a broken pipe) and exited {code}{}",
                        if told { "" } else { " without saying so" }
                    ),
                    if *code == 0 { line } else { failed },
                ));
            }
        }
        let failures = env.write_failures.get(incarnation).copied().unwrap_or(0);
        let told = log
            .messages
            .iter()
            .any(|(i, text)| i == incarnation && text.contains("state file"));
        if failures > 0 && (*code == 0 || !told) {
            return Err(v(
                "S-persist-failure-hidden",
                format!(
                    "{failures} state-file write(s) of incarnation {incarnation} failed; it exited {code}{}",
                    if told { "" } else { " and told its caller nothing" }
                ),
                line,
            ));
        }
    }
    let mut new_turns: Vec<(u32, u64, &str)> = log
        .claimed
        .iter()
        .zip(&log.claimed_at)
        .map(|((incarnation, _, text), at)| (*incarnation, *at, text.as_str()))
        .collect();
    new_turns.sort_by_key(|(_, at, _)| *at);
    if let Some((at_ms, generation, before)) = stale_replay(env, &new_turns) {
        return Err(v(
            "S-replay-generation",
            format!(
                "an agent re-prompted at {at_ms} ms was told it continues recovery generation {generation}, after a re-prompt of generation {before} reached an agent"
            ),
            idx,
        ));
    }
    // A prompt given up on silence is cancelled before its runtime is asked to go, unless
    // the runtime went down with its supervisor (a signal, a crash, a caller gone, a state
    // file that failed: the shutdown stops every agent as it is).
    for stop in env.silent_stopped.iter().filter(|s| !s.cancelled) {
        let incarnation = env.procs.get(&stop.pid).map_or(0, |p| p.incarnation);
        let own_exit = log
            .exits
            .iter()
            .any(|(i, code, _)| *i == incarnation && *code != 143);
        if own_exit && stopped_cleanly(incarnation) {
            return Err(v(
                "S-silent-uncancelled",
                format!(
                    "agent {} went silent on a prompt of conversation {:?} and had its stdin closed at {} ms by incarnation {incarnation} without having been sent session/cancel for it",
                    stop.pid, stop.session, stop.at_ms
                ),
                idx,
            ));
        }
    }
    if !finished {
        // The last thing the caller saw before the supervisor went quiet.
        let last = log.event_lines.last().copied().unwrap_or(idx);
        return Err(v(
            "S-no-exit",
            "palisade-supervise did not exit before the run's end (its stdin was closed)".into(),
            last,
        ));
    }
    // Per prompt text: when it was first claimed (and on which line), and whether any of its
    // turns completed.
    let mut first_claim: BTreeMap<&str, (u64, TurnId, u64)> = BTreeMap::new();
    let mut completed: BTreeMap<&str, bool> = BTreeMap::new();
    for (i, ((_, turn, text), at)) in log.claimed.iter().zip(&log.claimed_at).enumerate() {
        first_claim
            .entry(text)
            .or_insert((*at, *turn, line_of(&log.claimed_lines, i)));
        *completed.entry(text).or_insert(false) |=
            matches!(ended.get(turn), Some((TurnOutcome::Completed, _, _, _)));
    }
    if log.gone_at.is_some() {
        // Nobody is left to see the claimed turns end.
        return Ok(());
    }
    if log
        .exits
        .last()
        .is_some_and(|(i, code, _)| *code == 2 && env.rotted.contains(i))
    {
        // The last start refused a damaged state file: a person must look, and until then
        // nothing runs the claimed turns.
        return Ok(());
    }
    if finished {
        for (text, (at, turn, line)) in &first_claim {
            if *at > env.last_disruption_ms && !completed[text] {
                return Err(v(
                    "S-prompt-not-run",
                    format!(
                        "prompt {text:?} (turn {}) was sent at {at} ms, after the last disruption ({} ms), and never completed",
                        turn.get(),
                        env.last_disruption_ms
                    ),
                    *line,
                ));
            }
        }
    }
    let last_exit_0 = log.exits.last().is_some_and(|(_, code, _)| *code == 0);
    for (i, (incarnation, turn, text)) in log.claimed.iter().enumerate() {
        if !ended.contains_key(turn) {
            let (invariant, how) = if last_exit_0 {
                ("S-exit-0-unfinished", "palisade-supervise exited 0")
            } else {
                ("S-prompt-lost", "the caller never saw it end")
            };
            return Err(v(
                invariant,
                format!(
                    "prompt {text:?} was claimed as turn {} by incarnation {incarnation}; {how} and the turn never ended",
                    turn.get()
                ),
                line_of(&log.claimed_lines, i),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The checker fed recorded histories: each invariant fails on a history that breaks
    //! it and holds on the same history without the break.

    use palisade_core::{ExecutionId, SessionId};
    use palisade_embed::FailureCause;

    use super::super::env::{ProcTruth, Received, SilentStop};
    use super::*;
    use palisade_engine::replay::REPLAY_BLOCK_TAG;

    fn turn(n: u64) -> TurnId {
        TurnId::new(n).expect("not zero")
    }

    /// The caller's record is what `palisade-supervise` printed: an output's updates as the
    /// line holds them (escapes and all), and a line that says another event, turn or seq,
    /// or holds an update that is not JSON, is `Err` (`S-event-misprinted`).
    #[test]
    fn the_caller_reads_the_printed_line() {
        use palisade_core::delivery::EventKind;
        use palisade_embed::OutputEvent;
        let update = RawJson::from_text(
            r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"C:\\Users\\ \"q\" \ud83d\ude00"}}"#,
        )
        .expect("JSON");
        let event = SessionEvent::Output {
            session: SessionId::new(1).expect("not zero"),
            turn: turn(3),
            events: vec![OutputEvent {
                seq: 7,
                kind: EventKind::Text,
                update: update.clone(),
            }],
        };
        assert_eq!(as_printed(&event), Ok(event.clone()));
        let line = event.to_json();
        assert!(
            line.contains(update.get()),
            "updates are printed as written: {line}"
        );
        for (from, to) in [
            (r#""turn":"3""#, r#""turn":"4""#),
            (r#""seq":7"#, r#""seq":8"#),
            (r#""event":"output""#, r#""event":"update""#),
            (update.get(), r#"{"text":"cut"#),
        ] {
            assert!(line.contains(from), "{from} in {line}");
            let bad = line.replacen(from, to, 1);
            assert!(read_printed(&event, &bad).is_err(), "{bad}");
        }
    }

    fn ended(n: u64, outcome: TurnOutcome, cause: Option<FailureCause>) -> SessionEvent {
        SessionEvent::TurnEnded {
            session: SessionId::new(1).expect("not zero"),
            turn: turn(n),
            outcome,
            stop_reason: None,
            cause,
        }
    }

    /// One turn, claimed at 10 ms by incarnation 1, whose end the caller got at 900 ms
    /// after the agents had received `prompts_before_end` prompts; the supervisor exited 0
    /// with nothing running.
    fn history(event: SessionEvent, prompts_before_end: usize) -> CallerLog {
        let mut log = CallerLog::default();
        log.claimed.push((1, turn(1), "prompt-1".into()));
        log.claimed_at.push(10);
        log.ended_at.insert(turn(1), 900);
        log.event(1, prompts_before_end, event, 3);
        log.exits.push((1, 0, Vec::new()));
        log
    }

    fn received(at_ms: u64) -> Received {
        Received {
            at_ms,
            pid: 7,
            tag: "p7.1".into(),
            text: "prompt-1".into(),
        }
    }

    /// The agent received the prompt at 20 ms; the environment's last disruption came
    /// when it was claimed.
    fn environment() -> EnvState {
        let mut env = EnvState::default();
        env.prompts.push(received(20));
        env.last_disruption_ms = 10;
        env
    }

    fn dead(at_ms: u64, with_supervisor: bool) -> ProcTruth {
        ProcTruth {
            incarnation: 1,
            alive: false,
            guarded: true,
            died_at_ms: Some(at_ms),
            died_with_supervisor: with_supervisor,
            asked_at_ms: None,
            died_unasked: !with_supervisor,
            agent: None,
        }
    }

    fn caught(env: &EnvState, log: &CallerLog, schedule: usize) -> Option<String> {
        judge(env, log, &[], schedule, true, 0)
            .err()
            .map(|v| v.invariant)
    }

    /// An output event is the update its agent wrote: the same bytes, or the same text
    /// written again; a text cut at its escaped backslash, a `null`, or an update no agent
    /// wrote is `S-output-altered`.
    #[test]
    fn an_output_event_altered_on_its_way_is_caught() {
        use palisade_core::delivery::EventKind;
        use palisade_embed::OutputEvent;
        use palisade_testkit::agent_model::{EventText, StreamedEvent};
        use palisade_wire::RawJson;

        let text = "p7.1#1 xx C:\\Users\\José\\ 😀";
        let written = serde_json::json!({
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": text},
        })
        .to_string();
        let mut env = environment();
        env.written.insert(
            "p7.1#1".into(),
            StreamedEvent {
                marker: "p7.1#1".into(),
                index: 1,
                wire_bytes: written.len() + 60,
                tool_call: false,
                raw_crc: palisade_testkit::wire_text::raw_crc(&written),
                text: EventText::Plain(text.into()),
                args: None,
            },
        );
        let with_output = |update: &str| {
            let mut log = history(ended(1, TurnOutcome::Completed, None), 1);
            let output = SessionEvent::Output {
                session: SessionId::new(1).expect("not zero"),
                turn: turn(1),
                events: vec![OutputEvent {
                    seq: 1,
                    kind: EventKind::Text,
                    update: RawJson::from_text(update).expect("json"),
                }],
            };
            log.events.insert(0, (1, 1, output));
            log.event_lines.insert(0, 2);
            log
        };
        assert_eq!(caught(&env, &with_output(&written), 3), None);
        // Written again, non-ASCII as `\u` escapes: the same content.
        let ascii = written
            .replace('é', "\\u00e9")
            .replace('😀', "\\ud83d\\ude00");
        assert_ne!(ascii, written);
        assert_eq!(caught(&env, &with_output(&ascii), 3), None);
        let cut = written.replace("José\\\\ ", "José\\\\\\\" ");
        assert_ne!(cut, written);
        for altered in [cut.as_str(), "null", r#"{"content":{"text":"p7.1#2 x"}}"#] {
            assert_eq!(
                caught(&env, &with_output(altered), 3).as_deref(),
                Some("S-output-altered"),
                "{altered}"
            );
        }
    }

    #[test]
    fn a_silent_prompt_stopped_without_its_cancel_is_caught_unless_the_supervisor_went_down() {
        let log = history(ended(1, TurnOutcome::Completed, None), 1);
        let mut env = environment();
        env.procs.insert(7, dead(1200, false));
        env.silent_stopped.push(SilentStop {
            pid: 7,
            session: "sess-1".into(),
            cancelled: true,
            at_ms: 1100,
        });
        assert_eq!(caught(&env, &log, 3), None);
        env.silent_stopped[0].cancelled = false;
        assert_eq!(
            caught(&env, &log, 3).as_deref(),
            Some("S-silent-uncancelled")
        );
        // Its incarnation was signalled: the shutdown stops agents as they are.
        let mut signalled = history(ended(1, TurnOutcome::Completed, None), 1);
        signalled.exits[0].1 = 143;
        assert_ne!(
            caught(&env, &signalled, 3).as_deref(),
            Some("S-silent-uncancelled")
        );
    }

    #[test]
    fn a_completed_turn_with_an_output_seq_left_out_is_caught() {
        use palisade_testkit::agent_model::{EventText, StreamedEvent};
        let mut env = environment();
        // The updates the agent wrote (`p7.1#<seq>`), as it wrote them.
        let written = |seq: u64| {
            serde_json::json!({
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": format!("p7.1#{seq} x")},
            })
            .to_string()
        };
        for seq in 1..=4 {
            let line = written(seq);
            env.written.insert(
                format!("p7.1#{seq}"),
                StreamedEvent {
                    marker: format!("p7.1#{seq}"),
                    index: seq as u32,
                    wire_bytes: line.len() + 60,
                    tool_call: false,
                    raw_crc: palisade_testkit::wire_text::raw_crc(&line),
                    text: EventText::Plain(format!("p7.1#{seq} x")),
                    args: None,
                },
            );
        }
        let mut log = history(ended(1, TurnOutcome::Completed, None), 1);
        let output = |seqs: &[u64]| {
            let events = seqs
                .iter()
                .map(|&seq| palisade_embed::OutputEvent {
                    seq,
                    kind: palisade_core::delivery::EventKind::Text,
                    update: palisade_wire::RawJson::from_text(written(seq)).expect("json"),
                })
                .collect();
            SessionEvent::Output {
                session: SessionId::new(1).expect("not zero"),
                turn: turn(1),
                events,
            }
        };
        log.events.insert(0, (1, 1, output(&[1, 2])));
        log.event_lines.insert(0, 2);
        assert_eq!(caught(&env, &log, 3), None);
        log.events.insert(1, (1, 1, output(&[4])));
        log.event_lines.insert(1, 2);
        assert_eq!(caught(&env, &log, 3).as_deref(), Some("S-output-gap"));
    }

    #[test]
    fn a_rotted_state_file_used_is_caught_and_refused_is_not() {
        let mut log = history(ended(1, TurnOutcome::Completed, None), 1);
        let mut env = environment();
        env.rotted.insert(2);
        // The second start refused it, said why, and did nothing else.
        log.exits.push((2, 2, Vec::new()));
        log.exit_lines.push(9);
        log.messages
            .push((2, "cannot restore: state file damaged".into()));
        assert_eq!(caught(&env, &log, 3), None);
        // The same start without a word about it.
        let mut silent = history(ended(1, TurnOutcome::Completed, None), 1);
        silent.exits.push((2, 2, Vec::new()));
        assert_eq!(caught(&env, &silent, 3).as_deref(), Some("S-state-misread"));
        // Used as if whole: it showed an event and exited 0.
        log.exits[1].1 = 0;
        assert_eq!(caught(&env, &log, 3).as_deref(), Some("S-state-misread"));
    }

    #[test]
    fn a_completed_turn_an_agent_receives_again_is_caught() {
        let log = history(ended(1, TurnOutcome::Completed, None), 1);
        let mut env = environment();
        assert_eq!(caught(&env, &log, 3), None);
        env.prompts.push(received(1500));
        assert_eq!(
            caught(&env, &log, 3).as_deref(),
            Some("S-completed-turn-rerun")
        );
    }

    /// A prompt's text reaches agents bare at most once: a second bare receipt is caught
    /// even by a process the supervisor asked to go (which `S-prompt-resent` excuses), and
    /// a recovery's re-prompt, wrapped in its replay block, is not.
    #[test]
    fn a_prompt_sent_bare_twice_is_caught_and_a_wrapped_re_prompt_is_not() {
        let log = history(ended(1, TurnOutcome::Completed, None), 2);
        let mut env = environment();
        let asked = ProcTruth {
            asked_at_ms: Some(400),
            died_unasked: false,
            ..dead(500, false)
        };
        env.procs.insert(7, asked);
        env.procs.insert(8, dead(800, false));
        let wrapped = Received {
            at_ms: 600,
            pid: 8,
            tag: "p8.1".into(),
            text: format!(
                "{REPLAY_BLOCK_TAG} generation=\"1\" delivered-through=\"0\">\n</palisade-resume>\n\nprompt-1"
            ),
        };
        env.prompts.push(wrapped);
        assert_eq!(caught(&env, &log, 3), None);
        env.prompts[1].text = "prompt-1".into();
        assert_eq!(
            caught(&env, &log, 3).as_deref(),
            Some("S-prompt-sent-bare-twice")
        );
    }

    #[test]
    fn an_end_shown_again_after_a_clean_exit_is_caught_and_after_a_crash_is_not() {
        let env = environment();
        let mut log = history(ended(1, TurnOutcome::Completed, None), 1);
        // A second incarnation started on the same state file shows the end again.
        log.event(2, 1, ended(1, TurnOutcome::Completed, None), 5);
        log.exits.push((2, 0, Vec::new()));
        assert_eq!(
            caught(&env, &log, 3).as_deref(),
            Some("S-event-shown-again")
        );
        // The same history where incarnation 1 crashed: at least once is the promise.
        log.exits.remove(0);
        assert_eq!(caught(&env, &log, 3), None);
    }

    #[test]
    fn a_turn_that_ends_without_completing_and_without_a_cause_is_caught() {
        let env = environment();
        let told = history(
            ended(1, TurnOutcome::RolledBack, Some(FailureCause::CoreDeadline)),
            1,
        );
        assert_eq!(caught(&env, &told, 3), None);
        let untold = history(ended(1, TurnOutcome::RolledBack, None), 1);
        assert_eq!(
            caught(&env, &untold, 3).as_deref(),
            Some("S-end-without-cause")
        );
    }

    #[test]
    fn a_turn_failed_by_supervisor_restarts_alone_is_caught() {
        let cause = Some(FailureCause::SupervisorRestarted);
        let log = history(ended(1, TurnOutcome::Failed, cause), 1);
        let mut env = environment();
        // Three restarts and one agent failure under it: a schedule of two steps was
        // not used up by the agents.
        for (pid, at) in [(1001, 100), (1002, 300), (1003, 500)] {
            env.procs.insert(pid, dead(at, true));
        }
        env.procs.insert(1004, dead(700, false));
        assert_eq!(
            caught(&env, &log, 2).as_deref(),
            Some("S-restart-spends-recovery")
        );
        // Two more agent failures use it up: the turn may fail.
        env.procs.insert(1005, dead(800, false));
        env.procs.insert(1006, dead(850, false));
        assert_eq!(caught(&env, &log, 2), None);
        // Deaths outside the turn do not count.
        env.procs.remove(&1006);
        env.procs.insert(1007, dead(2000, false));
        assert_eq!(
            caught(&env, &log, 2).as_deref(),
            Some("S-restart-spends-recovery")
        );
        // An empty schedule fails the turn at its first loss, whatever it was.
        assert_eq!(caught(&env, &log, 0), None);
    }

    #[test]
    fn an_agent_running_when_its_supervisor_exited_is_caught() {
        let mut log = history(ended(1, TurnOutcome::Completed, None), 1);
        let env = environment();
        assert_eq!(caught(&env, &log, 3), None);
        log.exits[0].2.push(1001);
        assert_eq!(
            caught(&env, &log, 3).as_deref(),
            Some("S-agent-outlives-supervisor")
        );
    }

    /// A completed turn, then incarnation 1 was told execution 1 runs as process 1001 and
    /// that its attempt failed because the agent's transport closed.
    fn transport_failure_history() -> CallerLog {
        let session = SessionId::new(1).expect("non-zero");
        let execution = ExecutionId::new(1).expect("non-zero");
        let attempt = palisade_core::AttemptId::new(palisade_core::Epoch::FIRST, 1).expect("seq");
        let mut log = history(ended(1, TurnOutcome::Completed, None), 1);
        let started = SessionEvent::RuntimeStarted {
            session,
            execution,
            attempt,
            generation: palisade_core::Generation::new(1).expect("non-zero"),
            pid: Some(1001),
        };
        log.event(1, 1, started, 4);
        let failed = SessionEvent::FailureReported {
            session,
            failure: palisade_core::RecoveryFailure {
                attempt,
                execution: Some(execution),
                stamp: palisade_core::ErrorStamp::new(1).expect("non-zero"),
            },
            cause: FailureCause::Prompt(palisade_embed::RpcFailure::TransportClosed),
        };
        log.event(1, 1, failed, 6);
        log
    }

    /// Rule 10 on the stack's ground truth: "the agent's transport closed" must name a
    /// process tree in which something died on its own.
    #[test]
    fn a_transport_failure_of_an_agent_the_supervisor_stopped_is_caught() {
        let log = transport_failure_history();
        let mut env = environment();
        // It died on its own (the environment killed it): the failure is true.
        env.procs.insert(1001, dead(500, false));
        assert_eq!(caught(&env, &log, 3), None);
        // The supervisor closed its stdin first, and it went: no agent failure.
        let asked = ProcTruth {
            asked_at_ms: Some(450),
            died_unasked: false,
            ..dead(500, false)
        };
        env.procs.insert(1001, asked.clone());
        let v = judge(&env, &log, &[], 3, true, 0).unwrap_err();
        assert_eq!(v.invariant, "R10-failure-cause");
        assert_eq!(v.events, vec![6], "named on the failure's line");
        // Still running, or taken down with a crashed supervisor: no agent failure either.
        env.procs.insert(
            1001,
            ProcTruth {
                alive: true,
                died_at_ms: None,
                died_unasked: false,
                ..dead(500, false)
            },
        );
        assert_eq!(caught(&env, &log, 3).as_deref(), Some("R10-failure-cause"));
        env.procs.insert(1001, dead(500, true));
        assert_eq!(caught(&env, &log, 3).as_deref(), Some("R10-failure-cause"));
        // A launcher asked to go whose agent had died on its own first: true.
        env.procs.insert(
            1001,
            ProcTruth {
                agent: Some(1002),
                ..asked
            },
        );
        env.procs.insert(1002, dead(400, false));
        assert_eq!(caught(&env, &log, 3), None);
        // The same failure told by another incarnation names another process.
        let mut other = transport_failure_history();
        other.events[1].0 = 2;
        assert_eq!(caught(&env, &other, 3), None);
    }

    /// A core deadline shown for an attempt that never had a runtime: this world starts
    /// an agent at once whenever asked, so the failure is invented (issue 29, class 4); the
    /// same deadline of an attempt that had one is the agent's slowness, not invented.
    #[test]
    fn a_start_deadline_failure_of_an_attempt_never_started_is_caught() {
        let failed = |execution: Option<ExecutionId>| {
            let mut log = history(ended(1, TurnOutcome::Completed, None), 1);
            let failure = SessionEvent::FailureReported {
                session: SessionId::new(1).expect("non-zero"),
                failure: palisade_core::RecoveryFailure {
                    attempt: palisade_core::AttemptId::new(palisade_core::Epoch::FIRST, 1)
                        .expect("seq"),
                    execution,
                    stamp: palisade_core::ErrorStamp::new(1).expect("non-zero"),
                },
                cause: FailureCause::CoreDeadline,
            };
            log.events.insert(0, (1, 0, failure));
            log.event_lines.insert(0, 2);
            log
        };
        let env = environment();
        let v = judge(&env, &failed(None), &[], 3, true, 0).unwrap_err();
        assert_eq!(v.invariant, "S-failure-invented");
        assert_eq!(v.events, vec![2], "named on the failure's line");
        assert_eq!(caught(&env, &failed(ExecutionId::new(1)), 3), None);
    }

    /// A re-prompted agent told the caller has 2 events of the turn: its first event shown
    /// as seq 3 continues the turn; shown as seq 2 it stands in for an event the caller
    /// never got (issue 29, class 6).
    #[test]
    fn a_continuation_shown_under_a_seq_the_caller_was_counted_as_having_is_caught() {
        use palisade_testkit::agent_model::{EventText, StreamedEvent};
        let update = |marker: &str| {
            serde_json::json!({
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": format!("{marker} x")},
            })
            .to_string()
        };
        let mut env = environment();
        for marker in ["p7.1#1", "p7.1#2", "p8.1#1"] {
            let line = update(marker);
            env.written.insert(
                marker.into(),
                StreamedEvent {
                    marker: marker.into(),
                    index: 1,
                    wire_bytes: line.len() + 60,
                    tool_call: false,
                    raw_crc: palisade_testkit::wire_text::raw_crc(&line),
                    text: EventText::Plain(format!("{marker} x")),
                    args: None,
                },
            );
        }
        let block = palisade_engine::replay::render_prompt(
            "prompt-1",
            &palisade_core::PromptRequest {
                replay_blocks: 1,
                replay_generation: 1,
                delivered_through: 2,
            },
        );
        env.prompts.push(Received {
            at_ms: 300,
            pid: 8,
            tag: "p8.1".into(),
            text: block,
        });
        let shown = |seqs: &[(u64, &str)]| {
            let mut log = history(ended(1, TurnOutcome::Completed, None), 2);
            let events = seqs
                .iter()
                .map(|&(seq, marker)| palisade_embed::OutputEvent {
                    seq,
                    kind: palisade_core::delivery::EventKind::Text,
                    update: palisade_wire::RawJson::from_text(update(marker)).expect("json"),
                })
                .collect();
            let output = SessionEvent::Output {
                session: SessionId::new(1).expect("not zero"),
                turn: turn(1),
                events,
            };
            log.events.insert(0, (1, 1, output));
            log.event_lines.insert(0, 2);
            log
        };
        let whole = shown(&[(1, "p7.1#1"), (2, "p7.1#2"), (3, "p8.1#1")]);
        assert_eq!(caught(&env, &whole, 3), None);
        let one_lost = shown(&[(1, "p7.1#1"), (2, "p8.1#1")]);
        assert_eq!(
            caught(&env, &one_lost, 3).as_deref(),
            Some("S-output-missing")
        );
    }

    /// Two re-prompts of one text in one incarnation, both of recovery generation 1: the
    /// second restates nothing newer unless a new turn of that text was claimed between
    /// them (the caller sent it again; its bare first dispatch may have gone to an agent
    /// that was exiting and never read it: stack-crash-caller-stalled, the sweep of
    /// 2026-12-03).
    #[test]
    fn a_new_turn_of_the_same_text_starts_its_recovery_generations_again() {
        let mut env = EnvState::default();
        for pid in [7, 8] {
            env.procs.insert(
                pid,
                ProcTruth {
                    incarnation: 4,
                    alive: true,
                    guarded: true,
                    died_at_ms: None,
                    died_with_supervisor: false,
                    asked_at_ms: None,
                    died_unasked: false,
                    agent: None,
                },
            );
        }
        let block = palisade_engine::replay::render_prompt(
            "prompt-3",
            &palisade_core::PromptRequest {
                replay_blocks: 1,
                replay_generation: 1,
                delivered_through: 0,
            },
        );
        for (at_ms, pid) in [(100, 7), (300, 8)] {
            env.prompts.push(Received {
                at_ms,
                pid,
                tag: format!("p{pid}.1"),
                text: block.clone(),
            });
        }
        assert_eq!(stale_replay(&env, &[]), Some((300, 1, 1)));
        assert_eq!(stale_replay(&env, &[(4, 200, "prompt-3")]), None);
        assert_eq!(
            stale_replay(&env, &[(3, 200, "prompt-3")]),
            Some((300, 1, 1)),
            "a claim by another incarnation"
        );
        assert_eq!(
            stale_replay(&env, &[(4, 50, "prompt-3")]),
            Some((300, 1, 1)),
            "a claim before both"
        );
    }

    /// The caller went away mid-turn: the incarnation's event write failed (line 8).
    #[test]
    fn a_supervisor_that_hides_a_gone_caller_is_caught() {
        let env = environment();
        let mut log = unfinished_log();
        log.gone_at = Some(100);
        log.write_failed.insert(1, 8);
        log.exits.push((1, 0, Vec::new()));
        log.exit_lines.push(9);
        // Exit 0, nothing said: caught, on the exit's line.
        let v = judge(&env, &log, &[], 3, true, 40).unwrap_err();
        assert_eq!(v.invariant, "S-caller-gone-hidden");
        assert_eq!(v.events, vec![9]);
        // Exit 1 without a word: caught, on the failed write's line.
        log.exits[0].1 = 1;
        let v = judge(&env, &log, &[], 3, true, 40).unwrap_err();
        assert_eq!(v.invariant, "S-caller-gone-hidden");
        assert_eq!(v.events, vec![8]);
        // Exit 1, and the operator was told: it holds, and the turn the caller can no
        // longer see end is nobody's loss.
        log.messages
            .push((1, "events cannot be written to stdout (Broken pipe)".into()));
        assert_eq!(caught(&env, &log, 3), None);
        // With the caller still there, the same unfinished turn is lost.
        log.gone_at = None;
        log.write_failed.clear();
        assert_eq!(caught(&env, &log, 3).as_deref(), Some("S-prompt-lost"));
    }

    /// A caller log with one claimed prompt (on trace line 5) that never ended.
    fn unfinished_log() -> CallerLog {
        CallerLog {
            claimed: vec![(1, turn(1), "fix the build".into())],
            claimed_at: vec![0],
            claimed_lines: vec![5],
            ..CallerLog::default()
        }
    }

    #[test]
    fn an_unfinished_turn_names_the_line_it_was_claimed_on() {
        let mut log = unfinished_log();
        log.exits.push((1, 0, Vec::new()));
        log.exit_lines.push(9);
        let v = judge(&EnvState::default(), &log, &[], 3, true, 40).unwrap_err();
        assert_eq!(v.invariant, "S-exit-0-unfinished");
        assert_eq!(v.events, vec![5]);
    }

    #[test]
    fn a_supervisor_that_never_exits_names_the_last_event_its_caller_got() {
        let mut log = unfinished_log();
        let loading = SessionEvent::ConversationLoading {
            session: SessionId::new(1).expect("non-zero"),
            execution: ExecutionId::new(1).expect("non-zero"),
            conversation: "sess-1".into(),
        };
        log.event(1, 0, loading, 7);
        let v = judge(&EnvState::default(), &log, &[], 3, false, 40).unwrap_err();
        assert_eq!(v.invariant, "S-no-exit");
        assert_eq!(v.events, vec![7]);
        // With nothing to point at, the judgement's own line.
        let v = judge(&EnvState::default(), &unfinished_log(), &[], 3, false, 40).unwrap_err();
        assert_eq!(v.events, vec![40]);
    }
}
