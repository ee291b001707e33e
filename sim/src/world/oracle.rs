//! The oracle: every rule as a check on **ground truth** — what the environment recorded
//! about what really happened: which agent processes ran and when they died, what each
//! agent received (its prompts, with their text) and wrote (every stream event, with its
//! marker), which conversations really exist on the agent's disk, and what each client
//! really got. It never reads the core's or the engine's view of themselves.
//!
//! What the client gets is read for its content too: `R9-output-altered` holds that each
//! output event is the update its agent wrote, the same bytes or (written again by a
//! reader that decoded it) the same text and tool-call input once decoded. The agents
//! write escapes, unicode, backslash runs and nested JSON (`palisade_testkit::wire_text`),
//! so a reader that mis-reads them shows here.
//!
//! Beside it, the engine's driver runs the shared [`palisade_core::audit::Checker`] (the
//! reference model and the core's own invariants) after every core step; see `crate::logbook`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use memchr::memmem;
use palisade_core::classify::AgentProfile;
use palisade_core::{AttemptId, AttemptOutcome, ExecutionId, TurnId, TurnOutcome};
use palisade_engine::replay::REPLAY_BLOCK_TAG;
use palisade_engine::{EngineConfig, OutputEvent, SessionEvent};
use palisade_reference::rule6;
use palisade_testkit::agent_model::{Behaviour, LoadCapability, Seen, StreamedEvent};
use palisade_wire::jsonrpc::RpcError;

use crate::oracle::{
    blames_agent_exit, replay_delivered_through, replay_generation, strip_blocks, Violation,
};
use crate::scenario::Expect;

/// Slack for a deadline judged by the environment: the core acts on a deadline when the
/// embedder next wakes it, and the environment's messages take a few milliseconds.
const DEADLINE_SLACK_MS: u64 = 50;

pub(crate) fn v(invariant: &str, message: String, idx: u64) -> Violation {
    Violation {
        invariant: invariant.to_owned(),
        message,
        events: vec![idx],
        by: crate::oracle::CaughtBy::GroundTruth,
    }
}

/// One agent process, as the environment saw it.
#[derive(Debug, Clone)]
pub(crate) struct ProcTruth {
    pub(crate) session: u32,
    pub(crate) behaviour: Behaviour,
    pub(crate) alive: bool,
    /// When the engine asked to stop or kill it.
    pub(crate) stop_asked_at: Option<u64>,
    /// A prompt it accepted (wrote an event for) got `session/cancel` and is unanswered.
    pub(crate) cancelled_accepted: Option<String>,
    /// The prompt in flight: its tag and whether it wrote an event yet.
    pub(crate) prompting: Option<(String, bool)>,
    /// Orphaned by an orchestrator crash (killed with it).
    pub(crate) orphaned: bool,
    /// It outlived the orchestrator that started it (a sidecar's runtime): retired by
    /// that crash, its output fenced from the client.
    pub(crate) survivor: bool,
    /// It died on its own: before the engine asked to stop or kill it.
    pub(crate) died_unasked: bool,
    /// When the engine last read an update of it, on the engine's clock (ms).
    pub(crate) last_update_read: Option<u64>,
    /// The trace line of its spawn, and of the first request to stop it.
    pub(crate) spawn_line: u64,
    pub(crate) stop_line: Option<u64>,
}

/// One prompt as an agent received it.
#[derive(Debug, Clone)]
pub(crate) struct PromptTruth {
    /// The agent process that received it.
    pub(crate) exec: ExecutionId,
    /// The client text it carried (replay blocks stripped).
    pub(crate) original: String,
    /// Events written, in order.
    pub(crate) events: Vec<StreamedEvent>,
    /// `Some(true)` answered end_turn / cancelled, `Some(false)` answered with an error.
    pub(crate) answered: Option<bool>,
}

/// One `session/load` as an agent process received and answered it.
#[derive(Debug, Clone)]
pub(crate) struct LoadTruth {
    /// The conversation asked for.
    pub(crate) id: String,
    /// Whether it existed on the agent's disk.
    pub(crate) existed: bool,
    /// The answer the agent wrote; `None` while it wrote none (a hung load).
    pub(crate) answer: Option<Result<(), RpcError>>,
}

/// One prompt a client sent.
#[derive(Debug, Clone, Default)]
pub(crate) struct SentTurn {
    pub(crate) session: u32,
    pub(crate) text: String,
    pub(crate) ended: Option<TurnOutcome>,
    pub(crate) outputs: u64,
    /// Markers received, per prompt tag: the highest index so far.
    pub(crate) marks_seen: BTreeMap<String, u32>,
    pub(crate) recoveries: u32,
    pub(crate) exhausted: u32,
    pub(crate) cancelled: bool,
    /// A failure was shown to the client since the turn was sent.
    pub(crate) explained: bool,
    /// The trace line of the core's `prompt` input that claimed it, and of the first
    /// `turn_ended` the client got for it.
    pub(crate) sent_line: u64,
    pub(crate) ended_line: Option<u64>,
    /// The prompt whose answer completed the turn (see [`Oracle::completer`]), fixed when
    /// the client saw the turn complete.
    pub(crate) completed_by: Option<String>,
}

/// Per session, what its client got.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientTruth {
    /// The conversation the client was last told is ready, and its runtime.
    pub(crate) conversation: Option<(String, ExecutionId)>,
    /// Runtimes reported exited to the client.
    pub(crate) exited: BTreeSet<ExecutionId>,
    /// Attempts the client was told failed, with the trace line that told it.
    pub(crate) failed_attempts: BTreeMap<AttemptId, u64>,
    pub(crate) reported_attempts: BTreeSet<AttemptId>,
    /// Joins waiting for an answer: attempt → joined at (ms).
    pub(crate) joins: BTreeMap<AttemptId, u64>,
    pub(crate) answered_attempts: BTreeSet<AttemptId>,
    /// The trace line of the last `turn_ended` the client got.
    pub(crate) last_response_line: Option<u64>,
}

/// What the environment recorded, and the checks on it.
#[derive(Debug)]
pub(crate) struct Oracle {
    enabled: bool,
    pub(crate) procs: BTreeMap<ExecutionId, ProcTruth>,
    /// Prompts by tag.
    pub(crate) prompts: BTreeMap<String, PromptTruth>,
    /// Sent turns, by (session, turn).
    pub(crate) turns: BTreeMap<(u32, TurnId), SentTurn>,
    /// Client texts sent, to recognise a prompt's original: each with the turns it was
    /// sent as (see [`Oracle::turn_of_text`]).
    texts: BTreeMap<String, Vec<(u32, TurnId)>>,
    pub(crate) clients: BTreeMap<u32, ClientTruth>,
    /// Prompt tags per original text, in the order agents received them.
    dispatched: BTreeMap<String, Vec<String>>,
    /// Prompts the engine wrote to an agent's pipe, per original text (received or not: a
    /// process may be dead by then).
    sent: BTreeMap<String, usize>,
    /// Prompts received without a replay block, per original text.
    plain: BTreeMap<String, usize>,
    /// The replay generation of the last re-prompt a live agent received, per original text.
    generations: BTreeMap<String, u32>,
    /// The last `session/load` each agent process received, and its answer.
    loads: BTreeMap<ExecutionId, LoadTruth>,
    /// The agent the engine is configured for (rule 6's profile).
    profile: AgentProfile,
    pub(crate) turns_claimed: u32,
    schedule_len: usize,
    stop_deadline_ms: u64,
    /// The idle rule's deadline (0: off).
    turn_idle_ms: u64,
    join_wait_ms: u64,
    coalesce_events: usize,
    coalesce_bytes: u64,
    fallback_allowed: bool,
    responses_per_session: Option<u32>,
    responses: BTreeMap<u32, u32>,
}

impl Oracle {
    pub(crate) fn new(config: &EngineConfig, expect: &Expect) -> Oracle {
        Oracle {
            enabled: std::env::var_os("PALISADE_ORACLE").is_none_or(|v| v != "off"),
            procs: BTreeMap::new(),
            prompts: BTreeMap::new(),
            turns: BTreeMap::new(),
            texts: BTreeMap::new(),
            clients: BTreeMap::new(),
            dispatched: BTreeMap::new(),
            sent: BTreeMap::new(),
            plain: BTreeMap::new(),
            generations: BTreeMap::new(),
            loads: BTreeMap::new(),
            profile: config.core.agent_profile,
            turns_claimed: 0,
            schedule_len: config.core.recovery_delays_ms.len(),
            stop_deadline_ms: config.core.stop_deadline_ms,
            turn_idle_ms: config.core.turn_idle_ms,
            join_wait_ms: config.core.join_wait_ms,
            coalesce_events: config.coalescer.max_events,
            coalesce_bytes: config.coalescer.max_bytes,
            fallback_allowed: expect.fallback_allowed,
            responses_per_session: expect.responses_per_session,
            responses: BTreeMap::new(),
        }
    }

    fn check(
        &self,
        ok: bool,
        invariant: &str,
        message: impl FnOnce() -> String,
        idx: u64,
    ) -> Result<(), Violation> {
        if ok || !self.enabled {
            Ok(())
        } else {
            Err(v(invariant, message(), idx))
        }
    }

    // ----- the environment ------------------------------------------------------------

    pub(crate) fn spawned(
        &mut self,
        exec: ExecutionId,
        session: u32,
        behaviour: Behaviour,
        line: u64,
    ) {
        self.procs.insert(
            exec,
            ProcTruth {
                session,
                behaviour,
                alive: true,
                stop_asked_at: None,
                cancelled_accepted: None,
                prompting: None,
                orphaned: false,
                survivor: false,
                died_unasked: false,
                last_update_read: None,
                spawn_line: line,
                stop_line: None,
            },
        );
    }

    /// The engine read an update `exec` wrote, at `engine_ms` on its clock.
    pub(crate) fn update_read(&mut self, exec: ExecutionId, engine_ms: u64) {
        if let Some(p) = self.procs.get_mut(&exec) {
            p.last_update_read = Some(engine_ms);
        }
    }

    /// The process known as `exec` is known from now on as `alias`: it outlived the engine
    /// that started it (`survivor`), or a restarted engine handed `exec` out again.
    pub(crate) fn rekey(&mut self, exec: ExecutionId, alias: ExecutionId, survivor: bool) {
        if let Some(mut p) = self.procs.remove(&exec) {
            p.survivor |= survivor;
            self.procs.insert(alias, p);
        }
        if let Some(l) = self.loads.remove(&exec) {
            self.loads.insert(alias, l);
        }
    }

    pub(crate) fn died(&mut self, exec: ExecutionId) {
        if let Some(p) = self.procs.get_mut(&exec) {
            p.died_unasked |= p.alive && p.stop_asked_at.is_none();
            p.alive = false;
            p.prompting = None;
            p.cancelled_accepted = None;
        }
    }

    /// The engine asked to stop or kill `exec`. Rule 5: a runtime whose accepted prompt
    /// the user cancelled is not torn down for it.
    pub(crate) fn stop_asked(
        &mut self,
        exec: ExecutionId,
        now: u64,
        engine_ms: u64,
        idx: u64,
    ) -> Result<(), Violation> {
        let Some(p) = self.procs.get_mut(&exec) else {
            return Ok(());
        };
        if p.stop_asked_at.is_none() {
            p.stop_asked_at = Some(now);
            p.stop_line = Some(idx);
        }
        let cancelled = p.cancelled_accepted.clone();
        let session = p.session;
        // The idle rule gives up an agent the engine heard nothing from for the idle
        // deadline, on the engine's clock (a clock that jumps forward makes that sooner),
        // cancelled or not.
        let idle = self.turn_idle_ms;
        let silent = idle > 0
            && p.last_update_read
                .is_some_and(|t| engine_ms.saturating_sub(t) >= idle);
        self.check(
            cancelled.is_none() || !p_alive(&self.procs, exec) || silent,
            "R5-cancel-keeps-runtime",
            || {
                format!(
                    "session {session}: {exec} was torn down while its agent was still \
                     answering the accepted prompt {} the user cancelled",
                    cancelled.unwrap_or_default()
                )
            },
            idx,
        )
    }

    /// The engine killed `exec`.
    pub(crate) fn kill_asked(&mut self, exec: ExecutionId, now: u64) {
        if let Some(p) = self.procs.get_mut(&exec) {
            p.stop_asked_at.get_or_insert(now);
        }
    }

    /// Rule 5: a teardown the engine asked for at `asked` is over by its deadline.
    pub(crate) fn stop_deadline_passed(
        &mut self,
        exec: ExecutionId,
        idx: u64,
    ) -> Result<(), Violation> {
        let Some(p) = self.procs.get(&exec) else {
            return Ok(());
        };
        // A survivor of a crashed orchestrator is not this deadline's: whoever asked died,
        // and the restarted engine's kill is judged by the end (`R5-leaked-execution`).
        let late = p.alive && !p.orphaned && !p.survivor;
        let session = p.session;
        let deadline = self.stop_deadline_ms;
        self.check(
            !late,
            "R5-stop-deadline",
            || {
                format!(
                    "session {session}: {exec} still runs {deadline} ms (+{DEADLINE_SLACK_MS}) \
                     after the engine asked to stop it"
                )
            },
            idx,
        )
    }

    /// How long after the engine asks for a teardown it must be over (the core's stop
    /// deadline, plus the slack of a deadline acted on at the next wake-up).
    pub(crate) fn stop_deadline_ms(&self) -> u64 {
        self.stop_deadline_ms + DEADLINE_SLACK_MS
    }

    /// What an agent process received (a request, a notification).
    pub(crate) fn agent_received(
        &mut self,
        exec: ExecutionId,
        seen: Seen,
        idx: u64,
    ) -> Result<(), Violation> {
        match seen {
            Seen::Prompt { tag, text, .. } => {
                let blocks = text.matches(REPLAY_BLOCK_TAG).count();
                let original = strip_blocks(&text).to_owned();
                let earlier = self.dispatched.get(&original).map_or(0, Vec::len);
                let plain_before = self.plain.get(&original).copied().unwrap_or(0);
                if blocks == 0 {
                    *self.plain.entry(original.clone()).or_default() += 1;
                }
                // Whether an agent acknowledged an earlier dispatch of it (an update or an
                // answer): only then does the core know the agent had it.
                let acknowledged = self.dispatched.get(&original).is_some_and(|tags| {
                    tags.iter().any(|t| {
                        self.prompts
                            .get(t)
                            .is_some_and(|p| !p.events.is_empty() || p.answered.is_some())
                    })
                });
                self.dispatched
                    .entry(original.clone())
                    .or_default()
                    .push(tag.clone());
                let known = self.texts.contains_key(&original);
                if let Some(p) = self.procs.get_mut(&exec) {
                    p.prompting = Some((tag.clone(), false));
                }
                self.prompts.insert(
                    tag.clone(),
                    PromptTruth {
                        exec,
                        original: original.clone(),
                        events: Vec::new(),
                        answered: None,
                    },
                );
                self.check(
                    known,
                    "R7-prompt-text",
                    || format!("{exec} received a prompt no client sent: {text:?}"),
                    idx,
                )?;
                self.check(
                    blocks <= 1,
                    "R8-replay-once",
                    || format!("{exec} received a prompt with {blocks} replay blocks: {tag}"),
                    idx,
                )?;
                let wanted = usize::from(earlier > 0);
                // Before any agent acknowledged the prompt, the core cannot know whether one
                // read it (ACP has no acknowledgement; a dispatch may die in a pipe or be held
                // behind an earlier prompt): a re-prompt recovering it may carry the block,
                // which then resumes from nothing. And the first dispatch, the one without
                // a block, may reach its (stopping) agent after a re-prompt reached another:
                // a prompt without a block is received at most once, never after one
                // without. (This send is counted already.)
                let sent_before = self
                    .sent
                    .get(&original)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(1);
                self.check(
                    blocks == wanted
                        || (blocks == 1 && !acknowledged)
                        || (blocks == 0 && plain_before == 0),
                    "R8-replay-block",
                    || {
                        format!(
                            "{exec}: prompt {tag} carries {blocks} replay blocks; its text was \
                             dispatched {earlier} times before ({sent_before} sent)"
                        )
                    },
                    idx,
                )?;
                // Rule 9, partial output survives recovery: the replay block tells the agent
                // to continue after what the client already has, never before it (or the
                // agent repeats output the client got). Not for a prompt that reached its
                // process only after the engine asked that process to go (a pipe held it
                // back), nor for one that reached a runtime of a crashed orchestrator's (a
                // sidecar's, its prompt written before the crash): whatever it writes is a
                // retired execution's, fenced from the client, and the turn has moved on
                // without it.
                let resumes_after = replay_delivered_through(&text);
                let client_has = self.turn_of_text(&original).map_or(0, |(_, t)| t.outputs);
                let retired = self
                    .procs
                    .get(&exec)
                    .is_some_and(|p| p.stop_asked_at.is_some() || p.survivor);
                self.check(
                    retired || resumes_after.is_none_or(|n| n >= client_has),
                    "R9-replay-after-delivered",
                    || {
                        format!(
                            "{exec}: prompt {tag} tells the agent to continue after event {} \
                             of its turn, but the client already got {client_has}",
                            resumes_after.unwrap_or_default()
                        )
                    },
                    idx,
                )?;
                // Rule 8, what the replay says: each re-prompt a live agent receives
                // restates a later recovery generation than any before it (nothing older,
                // nothing twice), or the agent continues a run it was already told about.
                // (A retired process's prompt, held in a pipe, may be an older one.)
                let Some(generation) = replay_generation(&text).filter(|_| !retired) else {
                    return Ok(());
                };
                let before = self.generations.insert(original, generation);
                self.check(
                    before.is_none_or(|b| generation > b),
                    "R8-replay-generation",
                    || {
                        format!(
                            "{exec}: prompt {tag} restates recovery generation {generation}, \
                             after a re-prompt of generation {} reached an agent",
                            before.unwrap_or_default()
                        )
                    },
                    idx,
                )
            }
            Seen::Cancel { .. } => {
                if let Some(p) = self.procs.get_mut(&exec) {
                    if let Some((tag, true)) = &p.prompting {
                        p.cancelled_accepted = Some(tag.clone());
                    }
                }
                Ok(())
            }
            Seen::Load { id, existed, .. } => {
                // A load the agent will never answer (an answered one is noted when the
                // agent writes its answer).
                self.loads.insert(
                    exec,
                    LoadTruth {
                        id,
                        existed,
                        answer: None,
                    },
                );
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// What an agent process wrote (an answer, a stream event), as it wrote it.
    pub(crate) fn agent_wrote(&mut self, exec: ExecutionId, seen: Seen) {
        match seen {
            Seen::Event { tag, event } => {
                if let Some(p) = self.procs.get_mut(&exec) {
                    if let Some((t, accepted)) = p.prompting.as_mut() {
                        if *t == tag {
                            *accepted = true;
                        }
                    }
                }
                if let Some(p) = self.prompts.get_mut(&tag) {
                    p.events.push(event);
                }
            }
            Seen::PromptAnswered { tag, answer } => {
                if let Some(p) = self.procs.get_mut(&exec) {
                    if p.prompting.as_ref().is_some_and(|(t, _)| *t == tag) {
                        p.prompting = None;
                        p.cancelled_accepted = None;
                    }
                }
                if let Some(p) = self.prompts.get_mut(&tag) {
                    p.answered = Some(answer.is_ok());
                }
            }
            Seen::Load {
                id,
                existed,
                answer,
                ..
            } => {
                self.loads.insert(
                    exec,
                    LoadTruth {
                        id,
                        existed,
                        answer: Some(answer),
                    },
                );
            }
            _ => {}
        }
    }

    // ----- the clients ----------------------------------------------------------------

    /// A client's prompt was claimed as `turn`; `line` is the core's `prompt` input.
    pub(crate) fn client_sent(&mut self, session: u32, turn: TurnId, text: &str, line: u64) {
        self.turns_claimed += 1;
        match self.texts.get_mut(text) {
            Some(sent_as) => sent_as.push((session, turn)),
            None => {
                self.texts.insert(text.to_owned(), vec![(session, turn)]);
            }
        }
        self.turns.insert(
            (session, turn),
            SentTurn {
                session,
                text: text.to_owned(),
                sent_line: line,
                ..SentTurn::default()
            },
        );
    }

    /// The engine wrote a `session/prompt` with `text` to an agent's stdin. Rule 8: a
    /// re-prompt (one carrying a replay block) never goes out after the user cancelled its
    /// turn.
    pub(crate) fn prompt_sent(&mut self, text: &str, idx: u64) -> Result<(), Violation> {
        *self.sent.entry(strip_blocks(text).to_owned()).or_default() += 1;
        if !text.starts_with(REPLAY_BLOCK_TAG) {
            return Ok(());
        }
        let original = strip_blocks(text);
        let schedule = self.schedule_len;
        self.check(
            schedule > 0,
            "R8-recovery-disabled",
            || {
                format!(
                    "a recovery re-prompt went out although the recovery schedule is empty: \
                     {original:?}"
                )
            },
            idx,
        )?;
        let cancelled = self
            .turn_of_text(original)
            .filter(|(_, t)| t.cancelled)
            .map(|(k, _)| k);
        self.check(
            cancelled.is_none(),
            "R8-no-recovery-after-cancel",
            || {
                let (session, turn) = cancelled.unwrap_or((0, TurnId::new(1).expect("1")));
                format!("session {session}: turn {turn} is re-prompted after the user cancelled it")
            },
            idx,
        )
    }

    pub(crate) fn client_cancelled(&mut self, session: u32) {
        for t in self.turns_of(session) {
            if t.ended.is_none() {
                t.cancelled = true;
            }
        }
    }

    /// The first sent turn (in `(session, turn)` order) whose text is `text`, found through
    /// the index of texts instead of a walk comparing every turn's text. A turn sent again
    /// under the same key with another text leaves a stale entry in its old text's list,
    /// hence the text is compared again.
    fn turn_of_text(&self, text: &str) -> Option<((u32, TurnId), &SentTurn)> {
        self.texts
            .get(text)?
            .iter()
            .filter_map(|k| {
                self.turns
                    .get(k)
                    .filter(|t| t.text == text)
                    .map(|t| (*k, t))
            })
            .min_by_key(|(k, _)| *k)
    }

    /// The turns a client sent for `session`, in turn order.
    fn turns_of(&mut self, session: u32) -> impl Iterator<Item = &mut SentTurn> {
        let first = TurnId::new(1).expect("1 is not zero");
        self.turns
            .range_mut((session, first)..)
            .take_while(move |((s, _), _)| *s == session)
            .map(|(_, t)| t)
    }

    pub(crate) fn client_joined(&mut self, session: u32, attempt: AttemptId, now: u64) {
        self.clients
            .entry(session)
            .or_default()
            .joins
            .entry(attempt)
            .or_insert(now);
    }

    /// How long after a join its joiner must have an answer.
    pub(crate) fn join_wait_ms(&self) -> u64 {
        self.join_wait_ms + DEADLINE_SLACK_MS
    }

    /// Rule 1: a joiner is answered within the join wait.
    pub(crate) fn join_deadline_passed(
        &mut self,
        session: u32,
        attempt: AttemptId,
        caller_stalled: bool,
        idx: u64,
    ) -> Result<(), Violation> {
        let c = self.clients.entry(session).or_default();
        let waiting = c.joins.contains_key(&attempt) && !c.answered_attempts.contains(&attempt);
        let wait = self.join_wait_ms;
        self.check(
            !waiting || caller_stalled,
            "R1-join-bounded",
            || {
                format!(
                    "session {session}: a client joined attempt {attempt} and got no answer \
                     within the join wait ({wait} ms)"
                )
            },
            idx,
        )
    }

    /// An event reached the client.
    pub(crate) fn client_got(&mut self, event: &SessionEvent, idx: u64) -> Result<(), Violation> {
        let session = event.session().get() as u32;
        match event {
            SessionEvent::Output { turn, events, .. } => self.output(session, *turn, events, idx),
            SessionEvent::TurnEnded { turn, outcome, .. } => {
                *self.responses.entry(session).or_insert(0) += 1;
                self.clients.entry(session).or_default().last_response_line = Some(idx);
                let completer = match (outcome, self.turns.get(&(session, *turn))) {
                    (TurnOutcome::Completed, Some(t)) => self.completer(session, &t.text),
                    _ => None,
                };
                let Some(t) = self.turns.get_mut(&(session, *turn)) else {
                    return self.check(
                        false,
                        "R7-turn-ended-once",
                        || format!("session {session}: turn {turn} ended, but no client sent it"),
                        idx,
                    );
                };
                let again = t.ended.replace(*outcome);
                t.ended_line.get_or_insert(idx);
                if again.is_none() {
                    t.completed_by = completer;
                }
                let (outputs, explained) = (t.outputs, t.explained);
                self.check(
                    again.is_none(),
                    "R7-turn-ended-once",
                    || format!("session {session}: turn {turn} ended twice ({again:?}, then {outcome:?})"),
                    idx,
                )?;
                self.check(
                    !(*outcome == TurnOutcome::RolledBack && outputs > 0),
                    "R7-rolled-back-after-output",
                    || {
                        format!(
                            "session {session}: turn {turn} was rolled back after {outputs} output \
                             events reached the client"
                        )
                    },
                    idx,
                )?;
                self.check(
                    matches!(outcome, TurnOutcome::Completed | TurnOutcome::Cancelled)
                        || explained
                        || cause_given(event),
                    "R7-turn-says-why",
                    || {
                        format!(
                            "session {session}: turn {turn} ended {outcome:?} and nothing told the \
                             client why"
                        )
                    },
                    idx,
                )
            }
            SessionEvent::RecoveryStarted { turn, .. } => {
                let schedule = self.schedule_len;
                let Some(t) = self.turns.get_mut(&(session, *turn)) else {
                    return Ok(());
                };
                t.recoveries += 1;
                let n = t.recoveries;
                self.check(
                    (n as usize) <= schedule,
                    "R8-recovery-bounded",
                    || format!("session {session}: turn {turn}: recovery step {n} of a schedule of {schedule}"),
                    idx,
                )
            }
            SessionEvent::RecoveryExhausted { turn, .. } => {
                let Some(t) = self.turns.get_mut(&(session, *turn)) else {
                    return Ok(());
                };
                t.exhausted += 1;
                t.explained = true;
                let (n, recoveries) = (t.exhausted, t.recoveries);
                self.check(
                    n == 1 && recoveries >= 1,
                    "R8-exhausted-once",
                    || {
                        format!(
                            "session {session}: turn {turn}: recovery_exhausted #{n} after {recoveries} \
                             recoveries"
                        )
                    },
                    idx,
                )
            }
            SessionEvent::FailureReported { failure, cause, .. } => {
                // Rule 10 on ground truth: a failure that blames the agent's connection
                // (its process exited, its stdout closed) names a process that really did
                // die on its own, before the engine asked to stop or kill it. A runtime the
                // engine tore down itself, healthy and answering, is no agent's failure.
                if let Some(exec) = failure.execution.filter(|_| blames_agent_exit(cause)) {
                    if let Some(p) = self.procs.get(&exec) {
                        let (alive, asked) = (p.alive, p.stop_asked_at);
                        self.check(
                            p.died_unasked,
                            "R10-failure-cause",
                            || {
                                format!(
                                    "session {session}: attempt {} failed with \"{cause}\", but \
                                     {exec} {}",
                                    failure.attempt,
                                    match (alive, asked) {
                                        (true, _) => "is still running".to_owned(),
                                        (false, Some(t)) => format!(
                                            "ran until the engine itself tore it down at {t} ms"
                                        ),
                                        (false, None) => "never died".to_owned(),
                                    }
                                )
                            },
                            idx,
                        )?;
                    }
                }
                let c = self.clients.entry(session).or_default();
                c.reported_attempts.insert(failure.attempt);
                for t in self.turns_of(session) {
                    if t.ended.is_none() {
                        t.explained = true;
                    }
                }
                Ok(())
            }
            SessionEvent::AttemptSettled {
                attempt, outcome, ..
            } => {
                let c = self.clients.entry(session).or_default();
                c.answered_attempts.insert(*attempt);
                if *outcome == AttemptOutcome::Failed {
                    c.failed_attempts.entry(*attempt).or_insert(idx);
                }
                Ok(())
            }
            SessionEvent::JoinTimedOut { attempt, .. } => {
                let c = self.clients.entry(session).or_default();
                c.answered_attempts.insert(*attempt);
                Ok(())
            }
            SessionEvent::ConversationReady {
                execution,
                conversation,
                ..
            } => self.conversation_ready(session, *execution, conversation, idx),
            SessionEvent::RuntimeExited { execution, .. } => {
                self.clients
                    .entry(session)
                    .or_default()
                    .exited
                    .insert(*execution);
                Ok(())
            }
            SessionEvent::RuntimeStarted { .. } | SessionEvent::ConversationLoading { .. } => {
                Ok(())
            }
            // Only with a client behind the caller, which this world's engine has not.
            SessionEvent::Update { .. }
            | SessionEvent::History { .. }
            | SessionEvent::ClientRequest { .. }
            | SessionEvent::Forwarded { .. } => Ok(()),
        }
    }

    /// The prompt that completed a turn with `text`, judged when the client sees the turn
    /// complete: of the prompts carrying that text that an agent had already answered
    /// (`end_turn` or cancelled), the last one the execution serving the client's
    /// conversation received, else the last one any agent received. A prompt an agent
    /// received or answered only after that (a dispatch to a runtime the core had already
    /// given up on, delayed on its way) cannot have completed the turn, and neither can
    /// an earlier prompt on a runtime the client no longer talks to when the serving one
    /// answered too.
    fn completer(&self, session: u32, text: &str) -> Option<String> {
        let serving = self
            .clients
            .get(&session)
            .and_then(|c| c.conversation.as_ref())
            .map(|(_, exec)| *exec);
        let answered: Vec<(&String, &PromptTruth)> = self
            .dispatched
            .get(text)?
            .iter()
            .filter_map(|tag| self.prompts.get(tag).map(|p| (tag, p)))
            .filter(|(_, p)| p.answered == Some(true))
            .collect();
        answered
            .iter()
            .rev()
            .find(|(_, p)| Some(p.exec) == serving)
            .or_else(|| answered.last())
            .map(|(tag, _)| (*tag).clone())
    }

    /// Rule 6 on ground truth: the client's conversation is replaced (a ready conversation
    /// other than the one it was last told of) only when the agent's own answer to the
    /// load, as it wrote it, is positive proof under the independent reference
    /// ([`palisade_reference::rule6`], honouring the configured profile and what the
    /// agent's `session/list` would say).
    fn conversation_ready(
        &mut self,
        session: u32,
        exec: ExecutionId,
        conversation: &str,
        idx: u64,
    ) -> Result<(), Violation> {
        let previous = self
            .clients
            .entry(session)
            .or_default()
            .conversation
            .replace((conversation.to_owned(), exec));
        let Some((old, _)) = previous.filter(|(old, _)| old != conversation) else {
            return Ok(());
        };
        let Some(p) = self.procs.get(&exec) else {
            return Ok(());
        };
        self.check(
            self.fallback_allowed,
            "R6-fallback-proof",
            || {
                format!(
                    "session {session}: {exec} replaced conversation {old} with {conversation} \
                     in a scenario where every load can succeed"
                )
            },
            idx,
        )?;
        let load = self.loads.get(&exec).filter(|l| l.id == old);
        let (lists, capability, profile) = (
            p.behaviour.lists_sessions,
            p.behaviour.load_capability,
            self.profile,
        );
        let Err((existed, said)) = rule6_allows(profile, capability, lists, load, &old) else {
            return Ok(());
        };
        let invariant = if existed {
            "R6-conversation-kept"
        } else {
            "R6-fallback-proof"
        };
        self.check(
            false,
            invariant,
            || {
                format!(
                    "session {session}: {exec} replaced conversation {old} (which {}) with \
                     {conversation}, but the agent's answer proves nothing under rule 6 \
                     ({profile:?} profile): {said}; its session/list: {}",
                    if existed {
                        "the agent still has"
                    } else {
                        "is gone"
                    },
                    if lists { "lists sessions" } else { "none" }
                )
            },
            idx,
        )
    }

    fn output(
        &mut self,
        session: u32,
        turn: TurnId,
        events: &[OutputEvent],
        idx: u64,
    ) -> Result<(), Violation> {
        let enabled = self.enabled;
        let (max_events, max_bytes) = (self.coalesce_events, self.coalesce_bytes);
        let mut bytes = 0u64;
        let prompts = &self.prompts;
        let Some(t) = self.turns.get_mut(&(session, turn)) else {
            return Err(v(
                "R9-output-of-a-sent-turn",
                format!("session {session}: output for turn {turn}, which no client sent"),
                idx,
            ));
        };
        for e in events {
            t.outputs += 1;
            if enabled && e.seq != t.outputs {
                return Err(v(
                    "R9-output-seq",
                    format!(
                        "session {session}: turn {turn}: output seq {} where {} was next",
                        e.seq, t.outputs
                    ),
                    idx,
                ));
            }
            let Some((tag, k)) = marker(&e.update) else {
                return Err(v(
                    "R9-foreign-output",
                    format!(
                        "session {session}: turn {turn}: an output event no prompt of it wrote: {}",
                        e.update.get()
                    ),
                    idx,
                ));
            };
            let Some(p) = prompts.get(tag) else {
                return Err(v(
                    "R9-foreign-output",
                    format!("session {session}: turn {turn}: output of an unknown prompt {tag}"),
                    idx,
                ));
            };
            if enabled && p.original != t.text {
                return Err(v(
                    "R9-output-of-another-turn",
                    format!(
                        "session {session}: turn {turn} got output of prompt {tag}, which carried \
                         another turn's text"
                    ),
                    idx,
                ));
            }
            // Looked up before it is inserted: a key is allocated once per prompt, not per
            // event.
            let last = match t.marks_seen.get_mut(tag) {
                Some(last) => last,
                None => t.marks_seen.entry(tag.to_owned()).or_insert(0),
            };
            if enabled && k != *last + 1 {
                let got = *last;
                return Err(v(
                    "R9-no-loss-no-duplicate",
                    format!(
                        "session {session}: turn {turn}: event #{k} of prompt {tag} after #{got} \
                         (lost, duplicated or reordered on its way to the client)"
                    ),
                    idx,
                ));
            }
            *last = k;
            let written = p.events.get(k as usize - 1);
            if let Some(w) = written.filter(|_| enabled) {
                // What the agent wrote reaches the client as it wrote it, once decoded.
                if !w.delivered_as_written(e.update.get()) {
                    return Err(v(
                        "R9-output-altered",
                        format!(
                            "session {session}: turn {turn}: event #{k} of prompt {tag} reached \
                             the client altered: {}",
                            e.update.get()
                        ),
                        idx,
                    ));
                }
            }
            bytes += written.map_or(0, |ev| ev.wire_bytes as u64);
        }
        if enabled && events.len() > 1 && (events.len() > max_events || bytes > max_bytes) {
            return Err(v(
                "R9-coalescer-caps",
                format!(
                    "session {session}: turn {turn}: a batch of {} events and {bytes} bytes (caps: \
                     {max_events} events, {max_bytes} bytes)",
                    events.len()
                ),
                idx,
            ));
        }
        Ok(())
    }

    // ----- the end ----------------------------------------------------------------------

    /// Liveness once the faults stopped and the quiesce time passed. Each violation names
    /// the trace line of the last event it is about (the prompt that never ended, the
    /// completion that came short, the failure never shown, the process left running), and
    /// `idx`, the check's own line, only when there is none.
    pub(crate) fn liveness(&mut self, sessions: u32, idx: u64) -> Result<(), Violation> {
        // The idle rule, from the agents' side: an agent that took a prompt (wrote an event
        // for it) and then said nothing more, never answering, is given up (asked to stop)
        // long before the faults stop and the quiesce time passes; it never keeps its turn.
        for (exec, p) in &self.procs {
            if !p.alive || p.orphaned || p.behaviour.silent_per_mille == 0 {
                continue;
            }
            if let (Some((tag, true)), None) = (&p.prompting, p.stop_asked_at) {
                return Err(v(
                    "R8-silent-agent-given-up",
                    format!(
                        "session {}: {exec} went silent on prompt {tag} and was never given up",
                        p.session
                    ),
                    p.spawn_line,
                ));
            }
        }
        for ((session, turn), t) in &self.turns {
            if t.ended.is_none() {
                return Err(v(
                    "R7-liveness",
                    format!("session {session}: turn {turn} never ended"),
                    t.sent_line,
                ));
            }
            if t.ended == Some(TurnOutcome::Completed) && self.enabled {
                // Every event of the prompt that completed it reached the client.
                let completer = t
                    .completed_by
                    .as_ref()
                    .and_then(|tag| self.prompts.get(tag).map(|p| (tag, p)));
                if let Some((tag, p)) = completer {
                    let got = t.marks_seen.get(tag).copied().unwrap_or(0) as usize;
                    if got != p.events.len() {
                        return Err(v(
                            "R9-complete",
                            format!(
                                "session {session}: turn {turn} completed, but the client got {got} of the {} events its agent wrote for prompt {tag}",
                                p.events.len()
                            ),
                            t.ended_line.unwrap_or(idx),
                        ));
                    }
                }
            }
        }
        for (session, c) in &self.clients {
            for (attempt, line) in &c.failed_attempts {
                if !c.reported_attempts.contains(attempt) {
                    return Err(v(
                        "R10-failure-reported",
                        format!(
                            "session {session}: attempt {attempt} failed and no failure was shown"
                        ),
                        *line,
                    ));
                }
            }
        }
        for (exec, p) in &self.procs {
            if !p.alive || p.orphaned {
                continue;
            }
            let serving = self
                .clients
                .get(&p.session)
                .and_then(|c| c.conversation.as_ref())
                .is_some_and(|(_, e)| e == exec);
            if !serving || p.stop_asked_at.is_some() {
                let what = if p.stop_asked_at.is_some() {
                    "teardown never finished"
                } else {
                    "still running, serving no one"
                };
                return Err(v(
                    "R5-leaked-execution",
                    format!("session {}: {} {what}", p.session, process_name(*exec)),
                    p.stop_line.unwrap_or(p.spawn_line),
                ));
            }
        }
        if let Some(n) = self.responses_per_session {
            for s in 1..=sessions {
                let got = self.responses.get(&s).copied().unwrap_or(0);
                if got != n {
                    let last = self.clients.get(&s).and_then(|c| c.last_response_line);
                    return Err(v(
                        "responses",
                        format!("session {s}: {got} responses, expected exactly {n}"),
                        last.unwrap_or(idx),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The configured profile, as the reference names it.
/// Rule 6 on ground truth: whether an agent of `capability` (listing its sessions or not),
/// whose answer to the load of `requested` was `load` (`None`: no load reached it), gave
/// positive proof that the conversation is gone, under the independent reference
/// ([`palisade_reference::rule6`]) for the configured `profile`. `Err((whether the agent
/// still had it, what it said))` if not.
pub(crate) fn rule6_allows(
    profile: AgentProfile,
    capability: LoadCapability,
    lists_sessions: bool,
    load: Option<&LoadTruth>,
    requested: &str,
) -> Result<(), (bool, String)> {
    let capability_ = match capability {
        LoadCapability::True => rule6::Capability::True,
        LoadCapability::False => rule6::Capability::False,
        LoadCapability::Absent => rule6::Capability::Absent,
    };
    let (answer, existed, listing) = match load {
        None => (None, false, rule6::Listing::Unknown),
        Some(l) => (
            Some(l.answer.clone()),
            l.existed,
            match (lists_sessions, l.existed) {
                (false, _) => rule6::Listing::Unknown,
                (true, true) => rule6::Listing::Listed,
                (true, false) => rule6::Listing::NotListed,
            },
        ),
    };
    let details = |e: &RpcError| {
        e.data
            .as_ref()
            .and_then(|d| d.get("details"))
            .and_then(|d| d.as_str())
            .map(str::to_owned)
    };
    let (code, message, detail) = match &answer {
        Some(Some(Err(e))) => (e.code, e.message.clone(), details(e)),
        _ => (0, String::new(), None),
    };
    let wire_answer = match &answer {
        // No load reached this agent: only its capability can be the proof.
        None => rule6::Answer::NoAnswer,
        Some(None) => rule6::Answer::NoAnswer,
        // A load that succeeded is no proof of anything.
        Some(Some(Ok(()))) => rule6::Answer::NoAnswer,
        Some(Some(Err(_))) => rule6::Answer::Error {
            code,
            message: &message,
            details: detail.as_deref(),
        },
    };
    let judged = rule6::judge(&rule6::FailedLoad {
        agent: reference_agent(profile),
        capability: capability_,
        requested,
        answer: wire_answer,
        listing,
        // The agent answered (or was silent) on an open connection: the new
        // conversation came over the same one.
        transport: rule6::Transport::Open,
    });
    if judged == rule6::Judgement::Replace {
        return Ok(());
    }
    let said = match &answer {
        None => format!("no load; loadSession {capability:?}"),
        Some(None) => "no answer to its load".to_owned(),
        Some(Some(Ok(()))) => "it loaded the conversation".to_owned(),
        Some(Some(Err(e))) => format!("{} {:?} (data {:?})", e.code, e.message, e.data),
    };
    Err((existed, said))
}

fn reference_agent(profile: AgentProfile) -> rule6::Agent {
    match profile {
        AgentProfile::Generic => rule6::Agent::Generic,
        AgentProfile::ClaudeAgentAcp => rule6::Agent::ClaudeAgentAcp,
        AgentProfile::ClaudeCodeAcp => rule6::Agent::ClaudeCodeAcp,
        AgentProfile::CodexAcpRust => rule6::Agent::CodexAcpRust,
        AgentProfile::CodexAcpTs => rule6::Agent::CodexAcpTs,
        AgentProfile::GeminiCli => rule6::Agent::GeminiCli,
        AgentProfile::Goose => rule6::Agent::Goose,
        AgentProfile::Opencode => rule6::Agent::Opencode,
    }
}

/// Marks the oracle's key of a process set apart (see `World::set_apart`): above any
/// execution id a seed's engine reaches.
const SET_APART_KEY: u64 = 1 << 40;

/// The oracle's key for process `pid`, once set apart from execution id `exec` (it
/// outlived the engine that started it, or a restarted engine handed `exec` out again).
pub(crate) fn set_apart_key(pid: u32, exec: ExecutionId) -> ExecutionId {
    let key = SET_APART_KEY | (u64::from(pid) & 0xf_ffff) << 20 | (exec.get() & 0xf_ffff);
    ExecutionId::new(key).expect("not zero")
}

/// How a message names the process the oracle keeps under `key`: its execution id, and,
/// for one set apart, its pid too.
pub(crate) fn process_name(key: ExecutionId) -> String {
    let k = key.get();
    if k & SET_APART_KEY == 0 {
        key.to_string()
    } else {
        format!(
            "execution {} of an earlier incarnation (agent process {})",
            k & 0xf_ffff,
            (k >> 20) & 0xf_ffff
        )
    }
}

fn p_alive(procs: &BTreeMap<ExecutionId, ProcTruth>, exec: ExecutionId) -> bool {
    procs.get(&exec).is_some_and(|p| p.alive)
}

/// Whether a turn's end names its cause.
fn cause_given(event: &SessionEvent) -> bool {
    matches!(event, SessionEvent::TurnEnded { cause: Some(_), .. })
}

/// The marker an agent put at the start of an event (its prompt's tag and index), read
/// off the raw JSON the client got: the text of a chunk, or a tool call's id.
///
/// Runs for every event a client gets. The marker starts after the first
/// `"toolCallId":"` of the update, or after its first `"text":"` when it has no tool call
/// id; [`marker_start`] finds that place without scanning the whole payload twice.
pub(crate) fn marker(update: &palisade_wire::jsonrpc::RawJson) -> Option<(&str, u32)> {
    // The marker ends at a space or a quote: both ASCII, so the cut is on a character
    // boundary.
    marker_of(update.get())
}

/// [`marker`] of an update's raw text.
pub(crate) fn marker_of(raw: &str) -> Option<(&str, u32)> {
    let start = marker_start(raw.as_bytes())?;
    let rest = &raw[start..];
    let head = &rest[..memchr::memchr2(b' ', b'"', rest.as_bytes())?];
    let (tag, k) = head.rsplit_once('#')?;
    Some((tag, k.parse().ok()?))
}

/// The keys a marker follows, most specific first.
const TOOL_CALL_KEY: &[u8] = b"\"toolCallId\":\"";
const TEXT_KEY: &[u8] = b"\"text\":\"";

/// Finders built once (`str::find` built a two-way searcher per call).
static FINDERS: LazyLock<[memmem::Finder<'static>; 2]> = LazyLock::new(|| {
    [
        memmem::Finder::new(TOOL_CALL_KEY),
        memmem::Finder::new(TEXT_KEY),
    ]
});

/// Where the marker of `raw` starts: just after the first [`TOOL_CALL_KEY`] if there is
/// one, else just after the first [`TEXT_KEY`]. The same answer as
/// [`marker_start_by_scans`] for every input (a test holds them equal), at a fraction of
/// its cost on a stream event.
///
/// A chunk's text runs to the end of its payload, and proving that no tool call id
/// follows it took a second full-length `memmem` scan. Every occurrence of
/// [`TOOL_CALL_KEY`] begins with a `"`, so none begins inside a run of bytes without one
/// (the text after `"text":"`, up to its closing quote). Once the first `"text":"` is
/// found, the tool call key is looked for only where it could begin: at or before that
/// key's last quote, and from the next `"` on. The run between is skipped with `memchr`,
/// which reads one byte class several times faster than `memmem` matches a pair. Nothing
/// here assumes the update is valid JSON.
fn marker_start(raw: &[u8]) -> Option<usize> {
    let [tool_call, text] = &*FINDERS;
    let Some(at) = text.find(raw) else {
        // No text: the tool call key (if any) wherever it is.
        return tool_call.find(raw).map(|at| at + TOOL_CALL_KEY.len());
    };
    let open = at + TEXT_KEY.len();
    // A tool call key starting before `open` lies within the first `open - 1 + len` bytes.
    let before = &raw[..(open - 1 + TOOL_CALL_KEY.len()).min(raw.len())];
    if let Some(k) = tool_call.find(before) {
        return Some(k + TOOL_CALL_KEY.len());
    }
    // No key starts at `open..quote` (no `"` there); look again from the next quote on.
    match memchr::memchr(b'"', &raw[open..]) {
        Some(q) => match tool_call.find(&raw[open + q..]) {
            Some(k) => Some(open + q + k + TOOL_CALL_KEY.len()),
            None => Some(open),
        },
        None => Some(open),
    }
}

/// The reference for [`marker_start`]: one full scan for each key, in order.
#[cfg(test)]
fn marker_start_by_scans(raw: &[u8]) -> Option<usize> {
    FINDERS
        .iter()
        .find_map(|key| key.find(raw).map(|at| at + key.needle().len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_core::delivery::EventKind;
    use palisade_core::SessionId;
    use palisade_engine::{ConversationOrigin, FailureCause};
    use palisade_testkit::agent_model::EventText;
    use palisade_wire::jsonrpc::RawJson;
    use palisade_wire::RpcFailure;

    /// Every sequence of up to five of these pieces (keys, their fragments, quotes,
    /// escapes, markers, filler), about 100,000 inputs: the one-scan search finds the
    /// marker where the two full scans do.
    #[test]
    fn marker_start_agrees_with_two_full_scans() {
        const PIECES: &[&str] = &[
            "\"toolCallId\":\"",
            "\"text\":\"",
            "\"",
            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "\\",
            "\"toolCallId\"",
            "\"text",
            ":\"",
            "e1.2#3 ",
        ];
        let mut checked = 0u32;
        let mut indexes = Vec::new();
        for len in 0..=5u32 {
            for n in 0..PIECES.len().pow(len) {
                indexes.clear();
                let mut rest = n;
                for _ in 0..len {
                    indexes.push(rest % PIECES.len());
                    rest /= PIECES.len();
                }
                let raw: String = indexes.iter().map(|&i| PIECES[i]).collect();
                assert_eq!(
                    marker_start(raw.as_bytes()),
                    marker_start_by_scans(raw.as_bytes()),
                    "{raw:?}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 66_430);
    }

    /// The marker of a chunk, of a tool call (whose raw input carries a text too) and of
    /// a resource, as agents write them.
    #[test]
    fn marker_reads_chunks_tool_calls_and_resources() {
        let chunk = r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"e1.2#3 xxxx"}}"#;
        let tool = r#"{"sessionUpdate":"tool_call","toolCallId":"e4.1#2","title":"e4.1#2","kind":"read","status":"pending","rawInput":{"text":"e4.1#2 y"}}"#;
        let resource = r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"resource","resource":{"uri":"file:///work/e2.7#11","mimeType":"text/plain","text":"e2.7#11 z"}}}"#;
        let late_tool = r#"{"text":"e9.9#9 x","toolCallId":"e5.5#5"}"#;
        for (raw, want) in [
            (chunk, Some(("e1.2", 3))),
            (tool, Some(("e4.1", 2))),
            (resource, Some(("e2.7", 11))),
            (late_tool, Some(("e5.5", 5))),
            (r#"{"sessionUpdate":"plan"}"#, None),
        ] {
            let update = RawJson::from_value(&serde_json::from_str(raw).expect("json"));
            assert_eq!(marker(&update), want, "{raw}");
        }
    }

    /// The index of texts finds the turn the walk over every turn found, and a session's
    /// turns are the ones whose session it is, after any sequence of prompts sent (texts
    /// shared between turns and sessions, a turn sent again with another text): all
    /// 4^6 sequences of six prompts from four (session, turn, text) choices each.
    #[test]
    fn turn_of_text_and_turns_of_agree_with_walks() {
        const SENT: [(u32, u64, &str); 4] = [(2, 1, "a"), (1, 3, "b"), (2, 1, "b"), (1, 2, "a")];
        for n in 0..4usize.pow(6) {
            let mut o = oracle();
            let mut rest = n;
            let mut ever = vec![TEXT];
            for step in 0..6u64 {
                let (session, turn, text) = SENT[rest % 4];
                rest /= 4;
                o.client_sent(session, TurnId::new(turn).expect("nonzero"), text, step);
                ever.push(text);
                for text in ["a", "b", TEXT, "c"] {
                    let walk = o
                        .turns
                        .iter()
                        .find(|(_, t)| t.text == text)
                        .map(|(k, _)| *k);
                    assert_eq!(o.turn_of_text(text).map(|(k, _)| k), walk, "{n} {text}");
                    // A text once sent stays known, as in the set it replaced.
                    assert_eq!(
                        o.texts.contains_key(text),
                        ever.contains(&text),
                        "{n} {text}"
                    );
                }
                for session in 0..4 {
                    let walk: Vec<TurnId> = o
                        .turns
                        .iter()
                        .filter(|(_, t)| t.session == session)
                        .map(|((_, turn), _)| *turn)
                        .collect();
                    let mut indexed = Vec::new();
                    for t in o.turns_of(session) {
                        indexed.push(t.text.clone());
                    }
                    let texts: Vec<String> = walk
                        .iter()
                        .map(|turn| o.turns[&(session, *turn)].text.clone())
                        .collect();
                    assert_eq!(indexed, texts, "{n} session {session}");
                }
            }
        }
    }

    const TEXT: &str = "turn 9 of session 7";

    fn oracle() -> Oracle {
        let scenario = crate::scenario::resolve_one("swarm")
            .expect("shipped")
            .scenario;
        let config = crate::plan::setup::RunConfig::fixed(&scenario).engine();
        let mut o = Oracle::new(&config, &scenario.expect);
        o.enabled = true;
        o.client_sent(7, turn(), TEXT, 1);
        o
    }

    fn turn() -> TurnId {
        TurnId::new(9).expect("9")
    }

    fn exec(n: u64) -> ExecutionId {
        ExecutionId::new(n).expect("nonzero")
    }

    /// Agent `n` receives the turn's prompt (tag `n.1`; a re-prompt with its replay block
    /// when an agent received the text before), writes `events` events and answers
    /// `end_turn`.
    fn prompt(o: &mut Oracle, n: u64, events: u32) {
        let tag = format!("{n}.1");
        let text = if o.dispatched.contains_key(TEXT) {
            format!("{REPLAY_BLOCK_TAG}>earlier output</palisade-resume>\n\n{TEXT}")
        } else {
            TEXT.to_owned()
        };
        o.agent_received(
            exec(n),
            Seen::Prompt {
                tag: tag.clone(),
                session: "sess-6".into(),
                text,
            },
            0,
        )
        .expect("a prompt the client sent");
        for k in 1..=events {
            o.agent_wrote(
                exec(n),
                Seen::Event {
                    tag: tag.clone(),
                    event: StreamedEvent {
                        marker: format!("{tag}#{k}"),
                        index: k,
                        wire_bytes: 100,
                        tool_call: false,
                        raw_crc: 0,
                        text: EventText::Plain(format!("{tag}#{k} xxxx")),
                        args: None,
                    },
                },
            );
        }
        o.agent_wrote(
            exec(n),
            Seen::PromptAnswered {
                tag,
                answer: Ok("end_turn".into()),
            },
        );
    }

    fn ready(o: &mut Oracle, n: u64) {
        let event = SessionEvent::ConversationReady {
            session: SessionId::new(7).expect("7"),
            execution: exec(n),
            conversation: "sess-6".into(),
            origin: ConversationOrigin::Loaded,
            answer: None,
        };
        o.client_got(&event, 0).expect("the same conversation");
    }

    fn output(o: &mut Oracle, seq: u64, marker: &str) {
        let update = serde_json::json!({
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": format!("{marker} xxxx")},
        });
        let event = SessionEvent::Output {
            session: SessionId::new(7).expect("7"),
            turn: turn(),
            events: vec![OutputEvent {
                seq,
                kind: EventKind::Text,
                update: RawJson::from_value(&update),
            }],
        };
        o.client_got(&event, 0).expect("in order");
    }

    fn completed(o: &mut Oracle) {
        let event = SessionEvent::TurnEnded {
            session: SessionId::new(7).expect("7"),
            turn: turn(),
            outcome: TurnOutcome::Completed,
            stop_reason: Some("end_turn".into()),
            cause: None,
        };
        o.client_got(&event, 0).expect("ends once");
    }

    fn failure_shown(o: &mut Oracle, n: u64, cause: FailureCause) -> Result<(), String> {
        let event = SessionEvent::FailureReported {
            session: SessionId::new(7).expect("7"),
            failure: palisade_core::RecoveryFailure {
                attempt: AttemptId::new(palisade_core::Epoch::FIRST, n).expect("seq"),
                execution: Some(exec(n)),
                stamp: palisade_core::ErrorStamp::new(1).expect("1"),
            },
            cause,
        };
        o.client_got(&event, 0).map_err(|v| v.invariant)
    }

    fn agent(o: &mut Oracle, n: u64) {
        o.spawned(exec(n), 7, Behaviour::default(), 0);
    }

    const TRANSPORT_CLOSED: FailureCause = FailureCause::Prompt(RpcFailure::TransportClosed);

    /// Rule 10 on ground truth: "the agent's transport closed" is true of an agent that
    /// died on its own, before anyone asked it to stop.
    #[test]
    fn r10_failure_cause_holds_for_an_agent_that_died_on_its_own() {
        let mut o = oracle();
        agent(&mut o, 3);
        o.died(exec(3));
        o.kill_asked(exec(3), 10);
        assert_eq!(failure_shown(&mut o, 3, TRANSPORT_CLOSED), Ok(()));
    }

    /// A healthy agent the engine tore down itself (tombstone-eviction-reopens: a turn
    /// dispatched to a runtime whose conversation did not exist yet) is no agent failure,
    /// whether it is still running when the client hears of it or not.
    #[test]
    fn r10_failure_cause_refutes_a_transport_failure_of_an_agent_the_engine_killed() {
        let mut o = oracle();
        agent(&mut o, 3);
        assert_eq!(
            failure_shown(&mut o, 3, TRANSPORT_CLOSED),
            Err("R10-failure-cause".to_owned())
        );
        let mut o = oracle();
        agent(&mut o, 4);
        o.kill_asked(exec(4), 10);
        o.died(exec(4));
        assert_eq!(
            failure_shown(&mut o, 4, TRANSPORT_CLOSED),
            Err("R10-failure-cause".to_owned())
        );
        // A cause that blames no exit (a deadline the core enforces) says nothing of it.
        assert_eq!(failure_shown(&mut o, 4, FailureCause::CoreDeadline), Ok(()));
    }

    /// swarm seed 3088 (a guided plan): the core dispatched the turn's re-prompt to
    /// runtime 33, gave up on it (its start deadline passed before the agent accepted)
    /// and completed the turn on runtime 39; the jittered prompt reached runtime 33's
    /// agent only after the turn had completed, and it answered before its teardown. The
    /// client rightly never saw those events; the prompt that completed the turn is 39's.
    #[test]
    fn r9_complete_ignores_a_prompt_that_reached_an_abandoned_runtime_after_the_turn_ended() {
        let mut o = oracle();
        ready(&mut o, 39);
        prompt(&mut o, 39, 1);
        output(&mut o, 1, "39.1#1");
        completed(&mut o);
        prompt(&mut o, 33, 1);
        assert_eq!(o.liveness(8, 0).map_err(|v| v.message), Ok(()));
    }

    /// A stale prompt on a runtime the client no longer talks to that answers before the
    /// turn completes (after the serving runtime received its own) did not complete it.
    #[test]
    fn r9_complete_judges_the_prompt_of_the_serving_runtime() {
        let mut o = oracle();
        ready(&mut o, 39);
        prompt(&mut o, 39, 2);
        output(&mut o, 1, "39.1#1");
        output(&mut o, 2, "39.1#2");
        prompt(&mut o, 33, 1);
        completed(&mut o);
        assert_eq!(o.liveness(8, 0).map_err(|v| v.message), Ok(()));
    }

    /// An output event whose update is not the one its agent wrote (its text cut at an
    /// escaped backslash, as a scanner that misreads `\\"` would) is `R9-output-altered`;
    /// the update as written, or written again with `\u` escapes, holds.
    #[test]
    fn r9_output_altered_catches_an_update_read_wrong() {
        let got = |text: &str| {
            let mut o = oracle();
            ready(&mut o, 39);
            prompt(&mut o, 39, 1);
            let update = format!(
                r#"{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":{text}}}}}"#
            );
            let event = SessionEvent::Output {
                session: SessionId::new(7).expect("7"),
                turn: turn(),
                events: vec![OutputEvent {
                    seq: 1,
                    kind: EventKind::Text,
                    update: RawJson::from_text(update).expect("json"),
                }],
            };
            o.client_got(&event, 0).map_err(|v| v.invariant)
        };
        // `prompt` records each event's text as `<marker> xxxx`.
        assert_eq!(got(r#""39.1#1 xxxx""#), Ok(()));
        assert_eq!(got(r#""39.1#1 \u0078xxx""#), Ok(()));
        assert_eq!(got(r#""39.1#1 xx\\""#), Err("R9-output-altered".to_owned()));
    }

    /// A true loss is still caught: the prompt that completed the turn wrote two events and
    /// the client got one.
    #[test]
    fn r9_complete_still_catches_a_lost_event_of_the_completing_prompt() {
        let mut o = oracle();
        ready(&mut o, 39);
        prompt(&mut o, 39, 2);
        output(&mut o, 1, "39.1#1");
        completed(&mut o);
        let err = o.liveness(8, 0).expect_err("an event was lost");
        assert_eq!(err.invariant, "R9-complete");
        assert!(
            err.message.contains("got 1 of the 2 events"),
            "{}",
            err.message
        );
        // And with a late stale prompt in the picture too.
        let mut o = oracle();
        ready(&mut o, 39);
        prompt(&mut o, 39, 2);
        completed(&mut o);
        prompt(&mut o, 33, 1);
        let err = o.liveness(8, 0).expect_err("both events were lost");
        assert_eq!(err.invariant, "R9-complete");
        assert!(
            err.message
                .contains("got 0 of the 2 events its agent wrote for prompt 39.1"),
            "{}",
            err.message
        );
    }
}
