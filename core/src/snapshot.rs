//! Snapshot and restore: the core's state survives a process restart. Restore bumps the
//! epoch, so no callback carrying an attempt ID minted after the snapshot (by a previous
//! incarnation that then crashed) is ever accepted: such an ID is either unknown to the
//! snapshot (rejected) or from the new epoch's future.

use std::collections::{BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::core::{Core, CORE_STAMP_BIT};
use crate::execution::{Execution, StopState};
use crate::idmap::IdMap;
use crate::ids::{
    AttemptId, Epoch, ErrorStamp, ExecutionId, Generation, LeaseId, SessionId, MAX_ATTEMPT_SEQ,
};
use crate::io::{Effect, TurnOutcome};
use crate::mutants::ActiveMutant;
use crate::ring::Retired;
use crate::session::{ConvPhase, Session, TurnPhase, MAX_ORPHANS_PER_SESSION};
use crate::time::Timestamp;
use crate::timers::{Timer, Timers};

/// Format tag: 4 magic bytes and a version.
const MAGIC: &[u8; 4] = b"PLSD";
/// Bump on any change to the encoded state. Version 2 dropped the attempt state and the
/// recovery flag of a live attempt and the published flag of an execution, and encodes a
/// tombstone ring and a binding history as the prefix they hold rather than a fixed array.
/// Version 3 added the configuration's `turn_idle_ms` and a turn's idle deadline.
/// Older versions are refused (no one deployed them), not converted.
const VERSION: u16 = 3;
/// Events one turn may have delivered in a restored snapshot. A live core would need nine
/// years at a million events a second to get here; refusing more keeps the turn's
/// counters far from overflowing when it streams on.
pub const MAX_RESTORED_TURN_EVENTS: u64 = 1 << 48;

#[derive(Serialize, Deserialize)]
struct Encoded {
    config: Config,
    epoch: Epoch,
    next_attempt_seq: u64,
    next_generation: u64,
    next_lease: u64,
    next_stamp: u64,
    last_now: Timestamp,
    sessions: Vec<(SessionId, Session)>,
    executions: Vec<(ExecutionId, Execution)>,
}

/// Why a snapshot could not be restored. The bytes are the outside world's; none of
/// these is a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreError {
    /// Shorter than its header or its encoded state.
    Truncated,
    /// Not a Palisade snapshot.
    BadMagic,
    /// Written by another format version.
    UnsupportedVersion(u16),
    /// The bytes do not decode.
    Corrupt(String),
    /// Bytes follow the encoded state: the snapshot was glued to something else, or its
    /// length is wrong. Refused rather than ignored.
    TrailingBytes(usize),
    /// The snapshot's epoch is the last one; a restart cannot bump it.
    EpochExhausted,
    /// It decodes, but it is not a state the core could have reached: a cross-reference
    /// that does not hold, a counter behind what the state uses, a bounded collection out
    /// of shape, or a broken invariant. `rule` names the check (stable, for tests and
    /// logs), `detail` what was seen.
    Inconsistent {
        /// The check that failed, e.g. `turn-execution` or `ring-shape`.
        rule: &'static str,
        /// What was seen.
        detail: String,
    },
}

/// `Err(Inconsistent)` unless `cond`.
macro_rules! require {
    ($cond:expr, $rule:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(RestoreError::Inconsistent { rule: $rule, detail: format!($($fmt)+) });
        }
    };
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Truncated => write!(f, "snapshot truncated"),
            RestoreError::BadMagic => write!(f, "not a palisade snapshot"),
            RestoreError::UnsupportedVersion(v) => {
                write!(f, "snapshot version {v}, expected {VERSION}")
            }
            RestoreError::Corrupt(e) => write!(f, "snapshot corrupt: {e}"),
            RestoreError::TrailingBytes(n) => {
                write!(f, "snapshot followed by {n} bytes that are not part of it")
            }
            RestoreError::EpochExhausted => write!(f, "snapshot epoch is the last one"),
            RestoreError::Inconsistent { rule, detail } => {
                write!(f, "snapshot inconsistent ({rule}): {detail}")
            }
        }
    }
}

impl std::error::Error for RestoreError {}

impl Core {
    /// Serializes the state. Sessions and executions are written in ID order, so equal
    /// states give equal bytes. Leases and pending effects are not part of it: drain
    /// effects before persisting; leases die with the process.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut sessions: Vec<_> = self
            .sessions
            .iter()
            .map(|(k, v)| (*k, (**v).clone()))
            .collect();
        sessions.sort_unstable_by_key(|(k, _)| *k);
        let mut executions: Vec<_> = self
            .executions
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        executions.sort_unstable_by_key(|(k, _)| *k);
        let enc = Encoded {
            config: self.config.clone(),
            epoch: self.epoch,
            next_attempt_seq: self.next_attempt_seq,
            next_generation: self.next_generation,
            next_lease: self.next_lease,
            next_stamp: self.next_stamp,
            last_now: self.last_now,
            sessions,
            executions,
        };
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        match postcard::to_extend(&enc, out) {
            Ok(v) => v,
            Err(_) => unreachable!("encoding plain data into a Vec cannot fail"),
        }
    }

    /// Restores a snapshot into a new incarnation with the next epoch. Outstanding leases
    /// are gone: a dispatched-but-unconfirmed prompt is rolled back (its fate is unknown,
    /// and a prompt must never reach the provider twice), and attempts waiting on a lost
    /// load rely on their start deadline.
    ///
    /// The bytes are the outside world's (a disk, a file someone edited): restore never
    /// panics on them, and it accepts exactly the states a live core could have reached.
    /// Every cross-reference is checked before anything is rebuilt — turns, attempts and
    /// executions against their session, every ID and stamp against the counter that
    /// minted it, every deadline against the clock and the configuration, the bounded
    /// collections against their bounds — and the encoding must be the one
    /// [`Core::snapshot`] writes, with nothing after it. Anything else is a
    /// [`RestoreError`], and the restored core passes [`Core::check_invariants`].
    pub fn restore(bytes: &[u8]) -> Result<Core, RestoreError> {
        if bytes.len() < MAGIC.len() + 2 {
            return Err(RestoreError::Truncated);
        }
        if &bytes[..4] != MAGIC {
            return Err(RestoreError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return Err(RestoreError::UnsupportedVersion(version));
        }
        let body = &bytes[6..];
        let (enc, rest): (Encoded, &[u8]) =
            postcard::take_from_bytes(body).map_err(|e| match e {
                postcard::Error::DeserializeUnexpectedEnd => RestoreError::Truncated,
                other => RestoreError::Corrupt(other.to_string()),
            })?;
        if !rest.is_empty() {
            return Err(RestoreError::TrailingBytes(rest.len()));
        }
        // One state, one encoding: what `snapshot` would write for this state, byte for
        // byte (sessions and executions in ID order, no duplicates).
        require!(
            enc.sessions.windows(2).all(|w| w[0].0 < w[1].0),
            "encoding",
            "sessions not in strictly increasing ID order"
        );
        require!(
            enc.executions.windows(2).all(|w| w[0].0 < w[1].0),
            "encoding",
            "executions not in strictly increasing ID order"
        );
        let canonical = postcard::to_allocvec(&enc)
            .map_err(|e| RestoreError::Corrupt(format!("does not encode again: {e}")))?;
        require!(
            canonical.as_slice() == body,
            "encoding",
            "the bytes are not the encoding snapshot() writes for the state they decode to"
        );
        enc.config
            .validate()
            .map_err(|e| RestoreError::Inconsistent {
                rule: "config",
                detail: e.to_string(),
            })?;
        require!(
            Epoch::new(enc.epoch.get()).is_some(),
            "epoch",
            "epoch {} is not one a core runs in",
            enc.epoch.get()
        );
        let epoch = enc.epoch.next().ok_or(RestoreError::EpochExhausted)?;
        let minted = Minted {
            epoch: enc.epoch,
            next_attempt_seq: enc.next_attempt_seq,
            next_generation: enc.next_generation,
            next_lease: enc.next_lease,
            next_stamp: enc.next_stamp,
        };
        minted.check_counters()?;
        let mut core = Core {
            config: enc.config,
            epoch,
            next_attempt_seq: 1,
            next_generation: enc.next_generation,
            next_lease: enc.next_lease,
            next_stamp: enc.next_stamp,
            last_now: enc.last_now,
            sessions: IdMap::default(),
            executions: IdMap::default(),
            leases: IdMap::default(),
            timers: Timers::default(),
            effects: VecDeque::new(),
            mutant: ActiveMutant::NONE,
            deaf: false,
            parked: Vec::new(),
        };
        for (id, s) in enc.sessions {
            core.sessions.insert(id, Box::new(s));
        }
        for (id, e) in enc.executions {
            core.executions.insert(id, e);
        }
        core.check_restorable(&minted)?;
        core.rebuild_after_restore();
        core.check_invariants()
            .map_err(|v| RestoreError::Inconsistent {
                rule: v.rule,
                detail: v.detail,
            })?;
        Ok(core)
    }

    /// Every session ID the core tracks, ascending.
    ///
    /// With [`Core::known_executions`], what an embedder that lost its own records needs
    /// after a [`Core::restore`]: the sessions to ask about, and the runtimes to report.
    pub fn known_sessions(&self) -> Vec<SessionId> {
        let mut ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Every execution (runtime) the core believes exists, by ID.
    ///
    /// After a restart its processes died with the previous incarnation; an embedder
    /// reports each one with a callback from `owner` under `generation` carrying
    /// [`RuntimeEvent::Exited`](crate::RuntimeEvent::Exited) (and [`Input::Stopped`](crate::Input::Stopped) for one
    /// that was `stopping`), as `palisade-engine` does from its own records.
    pub fn known_executions(&self) -> Vec<KnownExecution> {
        let mut all: Vec<KnownExecution> = self
            .executions
            .iter()
            .map(|(&execution, e)| KnownExecution {
                execution,
                session: e.session,
                owner: e.owner,
                generation: e.generation,
                stopping: e.is_stopping(),
            })
            .collect();
        all.sort_unstable_by_key(|k| k.execution);
        all
    }

    /// The cross-references of a decoded state, before anything is rebuilt from it (the
    /// rebuild pushes onto tombstone rings and re-issues leases, so it must only ever see
    /// a state a live core could have reached).
    fn check_restorable(&self, minted: &Minted) -> Result<(), RestoreError> {
        require!(
            self.sessions.len() <= self.config.max_sessions,
            "max-sessions",
            "{} sessions, but the configuration allows {}",
            self.sessions.len(),
            self.config.max_sessions
        );
        // Attempt IDs are minted from one counter: no attempt is live or retired twice.
        let mut attempts = BTreeSet::new();
        for id in self.known_sessions() {
            let s = &self.sessions[&id];
            self.check_restored_session(minted, id, s, &mut attempts)?;
        }
        let mut ids: Vec<ExecutionId> = self.executions.keys().copied().collect();
        ids.sort_unstable();
        for eid in ids {
            self.check_restored_execution(minted, eid, &self.executions[&eid])?;
        }
        Ok(())
    }

    fn check_restored_session(
        &self,
        minted: &Minted,
        id: SessionId,
        s: &Session,
        attempts: &mut BTreeSet<AttemptId>,
    ) -> Result<(), RestoreError> {
        let config = &self.config;
        require!(
            s.ring.is_well_formed(),
            "ring-shape",
            "session {id}: the tombstone ring is not one that pushes produce"
        );
        let mut previous: Option<AttemptId> = None;
        for t in s.ring.iter() {
            minted.attempt(t.attempt, || format!("session {id}: tombstone"))?;
            require!(
                previous.is_none_or(|p| p < t.attempt),
                "ring-order",
                "session {id}: tombstones out of order at {}",
                t.attempt
            );
            require!(
                attempts.insert(t.attempt),
                "attempt-twice",
                "attempt {} is retired twice",
                t.attempt
            );
            previous = Some(t.attempt);
        }
        if let Some(w) = s.watermark {
            minted.attempt(w, || format!("session {id}: watermark"))?;
            // Evictions happen only from a full ring, and only older IDs are evicted.
            require!(
                s.ring.len() == crate::config::TOMBSTONES_PER_SESSION,
                "watermark",
                "session {id}: a watermark {w} but the ring never filled"
            );
            require!(
                s.ring.iter().next().is_some_and(|o| w < o.attempt),
                "watermark",
                "session {id}: watermark {w} not below the oldest tombstone"
            );
        }

        require!(
            s.owner.is_some() == s.runtime.is_some(),
            "owner",
            "session {id}: an owner without a runtime or a runtime without an owner"
        );
        if let (Some(owner), Some(runtime)) = (s.owner, s.runtime) {
            let newest = s.ring.newest();
            require!(
                newest.is_some_and(|t| t.attempt == owner
                    && t.outcome == Retired::Finished
                    && t.execution == Some(runtime)),
                "owner",
                "session {id}: owner {owner} is not its newest attempt, finished on {runtime}"
            );
            require!(
                s.live.is_none(),
                "owner",
                "session {id}: an owner and a live attempt at once"
            );
            let exec = self.executions.get(&runtime);
            require!(
                exec.is_some_and(|e| e.session == id && e.owner == owner && !e.is_stopping()),
                "runtime",
                "session {id}: runtime {runtime} is not a running execution of this session owned by {owner}"
            );
        }

        if let Some(live) = s.live {
            minted.attempt(live.id, || format!("session {id}: live attempt"))?;
            require!(
                attempts.insert(live.id),
                "attempt-twice",
                "attempt {} is live and retired, or live twice",
                live.id
            );
            require!(
                previous.is_none_or(|p| p < live.id) && s.watermark.is_none_or(|w| w < live.id),
                "live-attempt",
                "session {id}: live {} older than a retired one",
                live.id
            );
            require!(
                live.execution.is_some() == live.generation.is_some(),
                "live-binding",
                "session {id}: live {} has an execution without a generation or the reverse",
                live.id
            );
            require!(
                live.conversation == ConvPhase::Pending || live.execution.is_some(),
                "live-binding",
                "session {id}: live {} asks for a conversation without a runtime",
                live.id
            );
            if let (Some(e), Some(g)) = (live.execution, live.generation) {
                minted.generation(g, || format!("session {id}: live attempt's generation"))?;
                // A bound live attempt owns its execution's current generation until it
                // retires: no one else can rebind, stop or forget it meanwhile.
                let exec = self.executions.get(&e);
                require!(
                    exec.is_some_and(|x| x.session == id
                        && x.generation == g
                        && x.owner == live.id
                        && !x.is_stopping()),
                    "live-binding",
                    "session {id}: live {} bound to {e} generation {g}, which is not its running execution",
                    live.id
                );
            }
            require!(
                live.start_deadline <= self.last_now.plus_millis(config.start_deadline_ms),
                "deadline",
                "session {id}: start deadline {} later than the clock ({}) allows",
                live.start_deadline,
                self.last_now
            );
            require!(
                live.join_deadline
                    .is_none_or(|j| j <= self.last_now.plus_millis(config.join_wait_ms)),
                "deadline",
                "session {id}: join deadline later than the clock ({}) allows",
                self.last_now
            );
        }

        if let Some(turn) = s.turn {
            require!(
                s.last_turn.is_some_and(|l| l >= turn.id),
                "turn",
                "session {id}: turn {} newer than the last claimed",
                turn.id
            );
            // Exhaustion ends the turn in the same step.
            require!(
                !turn.exhausted,
                "turn",
                "session {id}: turn {} exhausted but not ended",
                turn.id
            );
            require!(
                turn.accepted_once
                    || (turn.recoveries_started == 0
                        && turn.recovery_generation == 0
                        && turn.delivered == 0),
                "turn",
                "session {id}: turn {} recovered or streamed before the provider accepted it",
                turn.id
            );
            require!(
                turn.delivered <= MAX_RESTORED_TURN_EVENTS
                    && turn.runtime_next >= 1
                    && turn.runtime_next - 1 <= turn.delivered,
                "turn",
                "session {id}: turn {} delivered {} events, expects runtime event {}",
                turn.id,
                turn.delivered,
                turn.runtime_next
            );
            require!(
                usize::from(turn.recoveries_started) <= config.recovery_delays_ms.len(),
                "turn",
                "session {id}: turn {} started {} recoveries",
                turn.id,
                turn.recoveries_started
            );
            require!(
                turn.idle_at.is_none() || matches!(turn.phase, TurnPhase::Accepted { .. }),
                "turn",
                "session {id}: turn {} has an idle deadline but is not accepted",
                turn.id
            );
            // Where the turn runs must be this session's runtime or its live attempt's.
            let runs_on_ours = |e: ExecutionId| {
                live_execution(s) == Some(e) || (s.live.is_none() && s.runtime == Some(e))
            };
            match turn.phase {
                TurnPhase::WaitingRuntime => require!(
                    s.live.is_some(),
                    "turn",
                    "session {id}: turn {} waits for a runtime no attempt is starting",
                    turn.id
                ),
                TurnPhase::Dispatched { lease, execution } => {
                    minted.lease(lease, || format!("session {id}: turn {}", turn.id))?;
                    require!(
                        runs_on_ours(execution),
                        "turn-execution",
                        "session {id}: turn {} dispatched on {execution}, not this session's runtime",
                        turn.id
                    );
                }
                TurnPhase::Performed {
                    execution,
                    deadline,
                } => {
                    require!(
                        runs_on_ours(execution),
                        "turn-execution",
                        "session {id}: turn {} performed on {execution}, not this session's runtime",
                        turn.id
                    );
                    require!(
                        deadline <= self.last_now.plus_millis(config.start_deadline_ms),
                        "deadline",
                        "session {id}: turn {} acceptance deadline later than the clock allows",
                        turn.id
                    );
                }
                TurnPhase::Accepted { execution } => {
                    require!(
                        turn.accepted_once && s.live.is_none() && s.runtime == Some(execution),
                        "turn-execution",
                        "session {id}: turn {} accepted on {execution}, not this session's runtime",
                        turn.id
                    );
                    require!(
                        turn.idle_at.is_none_or(|at| config.turn_idle_ms > 0
                            && at <= self.last_now.plus_millis(config.turn_idle_ms)),
                        "deadline",
                        "session {id}: turn {} idle deadline later than the clock allows",
                        turn.id
                    );
                }
                TurnPhase::Recovering { at } => {
                    let longest = config.recovery_delays_ms.iter().copied().max();
                    require!(
                        turn.accepted_once
                            && longest.is_some_and(|d| at <= self.last_now.plus_millis(d)),
                        "deadline",
                        "session {id}: turn {} recovers at {at}, which the schedule cannot reach",
                        turn.id
                    );
                }
            }
        }

        if let Some(f) = s.failure {
            minted.attempt(f.failure.attempt, || {
                format!("session {id}: stored failure")
            })?;
            minted.stamp(f.failure.stamp, || format!("session {id}: stored failure"))?;
        }

        require!(
            s.orphans.len() <= MAX_ORPHANS_PER_SESSION,
            "orphans",
            "session {id}: {} orphans, at most {MAX_ORPHANS_PER_SESSION}",
            s.orphans.len()
        );
        for (i, e) in s.orphans.iter().enumerate() {
            require!(
                !s.orphans[..i].contains(e),
                "orphans",
                "session {id}: orphan {e} listed twice"
            );
            require!(
                self.executions.get(e).is_some_and(|x| x.session == id),
                "orphans",
                "session {id}: orphan {e} is not an execution of this session"
            );
        }
        Ok(())
    }

    fn check_restored_execution(
        &self,
        minted: &Minted,
        eid: ExecutionId,
        e: &Execution,
    ) -> Result<(), RestoreError> {
        let Some(s) = self.sessions.get(&e.session) else {
            return Err(RestoreError::Inconsistent {
                rule: "execution-session",
                detail: format!("execution {eid} of unknown session {}", e.session),
            });
        };
        require!(
            e.history_is_canonical(),
            "execution-history",
            "execution {eid}: the generation history is not one that binding produces"
        );
        // Every binding is of an attempt of this session: its live one, a retired one, or
        // one evicted from its ring.
        let of_session = |a: AttemptId| {
            live_attempt(s) == Some(a)
                || s.ring.find(a).is_some()
                || s.watermark.is_some_and(|w| a <= w)
        };
        for (g, a) in e.history() {
            minted.generation(g, || format!("execution {eid}"))?;
            minted.attempt(a, || format!("execution {eid}: binding"))?;
            require!(
                of_session(a),
                "execution-binding",
                "execution {eid} of session {} bound to attempt {a}, which is not that session's",
                e.session
            );
        }
        if let StopState::Stopping { deadline } = e.stop {
            require!(
                deadline == Timestamp::MAX
                    || deadline <= self.last_now.plus_millis(self.config.stop_deadline_ms),
                "deadline",
                "execution {eid}: stop deadline {deadline} later than the clock ({}) allows",
                self.last_now
            );
        }
        Ok(())
    }

    fn rebuild_after_restore(&mut self) {
        let mut ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        ids.sort_unstable();
        let mut ready = Vec::new();
        for id in ids {
            let s = self.sessions.get_mut(&id).expect("listed");
            if let Some(live) = s.live {
                self.timers
                    .insert((live.start_deadline, Timer::Start(id, live.id)));
                if let Some(j) = live.join_deadline {
                    self.timers.insert((j, Timer::Join(id, live.id)));
                }
            }
            let mut ended = None;
            // The runtime an accepted turn is on (or the one its live attempt is starting)
            // died with the previous incarnation: that loss is the orchestrator's, and
            // resumes the turn without using up a recovery step.
            let inherited = s.live.and_then(|l| l.execution);
            if let Some(t) = s.turn.as_mut() {
                t.restart_grace = t.accepted_once
                    && (t.execution().is_some()
                        || (t.phase == TurnPhase::WaitingRuntime && inherited.is_some()));
                t.next_loss_rolls_back = !t.accepted_once;
                match t.phase {
                    TurnPhase::Recovering { at } => {
                        self.timers.insert((at, Timer::Recovery(id, t.id)));
                    }
                    TurnPhase::Performed { deadline, .. } => {
                        self.timers.insert((deadline, Timer::Accept(id, t.id)));
                    }
                    TurnPhase::Accepted { .. } => {
                        if let Some(at) = t.idle_at {
                            self.timers.insert((at, Timer::Idle(id, t.id)));
                        }
                    }
                    TurnPhase::Dispatched { .. } if !t.accepted_once => ended = Some(t.id),
                    TurnPhase::Dispatched { execution, .. } => {
                        // A re-prompt whose fate is unknown: treat the dispatch as performed;
                        // the provider either accepts it or the runtime's loss recovers it.
                        let deadline = self.last_now.plus_millis(self.config.start_deadline_ms);
                        t.phase = TurnPhase::Performed {
                            execution,
                            deadline,
                        };
                        self.timers.insert((deadline, Timer::Accept(id, t.id)));
                    }
                    _ => {}
                }
            }
            if let Some(turn) = ended {
                s.turn = None;
                self.effects.push_back(Effect::TurnEnded {
                    session: id,
                    turn,
                    outcome: TurnOutcome::RolledBack,
                });
                // Its attempt had a ready conversation and waited only for that prompt's
                // acceptance: it is done, and owns its runtime.
                if s.live.is_some_and(|l| l.conversation == ConvPhase::Ready) {
                    ready.push(id);
                }
            }
        }
        for id in ready {
            self.retire_live(id, Retired::Finished);
        }
        // A conversation request whose lease died with the old process is asked again, so
        // the attempt does not stall until its start deadline. (`session/load` is
        // idempotent; a `session/new` the old process already sent leaves an unused
        // conversation on the provider, never a second one in the session.)
        let mut ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        ids.sort_unstable();
        let now = self.last_now;
        for id in ids {
            let Some(live) = self.sessions.get(&id).and_then(|s| s.live) else {
                continue;
            };
            let (Some(e), Some(g)) = (live.execution, live.generation) else {
                continue;
            };
            let current = self
                .executions
                .get(&e)
                .is_some_and(|x| x.generation == g && x.owner == live.id);
            if current
                && matches!(
                    live.conversation,
                    ConvPhase::Loading | ConvPhase::Creating(_)
                )
            {
                let _ = self.request_conversation(now, id, live.id, e, g, live.conversation);
            }
        }
        let mut stops: Vec<_> = self
            .executions
            .iter()
            .filter_map(|(id, e)| match e.stop {
                StopState::Stopping { deadline } if deadline != Timestamp::MAX => {
                    Some((deadline, *id))
                }
                _ => None,
            })
            .collect();
        stops.sort_unstable();
        for (deadline, id) in stops {
            self.timers.insert((deadline, Timer::Stop(id)));
        }
    }
}

fn live_attempt(s: &Session) -> Option<AttemptId> {
    s.live.map(|l| l.id)
}

fn live_execution(s: &Session) -> Option<ExecutionId> {
    s.live.and_then(|l| l.execution)
}

/// An execution the core believes exists (see [`Core::known_executions`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownExecution {
    /// The execution.
    pub execution: ExecutionId,
    /// Its session.
    pub session: SessionId,
    /// The attempt that owns it (its current generation's).
    pub owner: AttemptId,
    /// Its current startup generation.
    pub generation: Generation,
    /// A teardown was claimed and has not been confirmed.
    pub stopping: bool,
}

/// The counters of a decoded snapshot: everything in it was minted below them.
struct Minted {
    epoch: Epoch,
    next_attempt_seq: u64,
    next_generation: u64,
    next_lease: u64,
    next_stamp: u64,
}

impl Minted {
    fn check_counters(&self) -> Result<(), RestoreError> {
        require!(
            (1..=MAX_ATTEMPT_SEQ + 1).contains(&self.next_attempt_seq),
            "counters",
            "next attempt sequence {} out of range",
            self.next_attempt_seq
        );
        require!(
            self.next_generation >= 1 && self.next_lease >= 1,
            "counters",
            "a generation or lease counter at zero"
        );
        // The core's own stamps carry the top bit; the counter never does.
        require!(
            self.next_stamp & CORE_STAMP_BIT == 0,
            "counters",
            "stamp counter {:#x} has the core's stamp bit set",
            self.next_stamp
        );
        Ok(())
    }

    /// An attempt ID that decodes, from this core's epochs, minted before the snapshot.
    fn attempt(&self, a: AttemptId, what: impl Fn() -> String) -> Result<(), RestoreError> {
        let minted = AttemptId::from_raw(a.raw()) == Some(a)
            && (a.epoch() < self.epoch
                || (a.epoch() == self.epoch && a.seq() < self.next_attempt_seq));
        require!(
            minted,
            "attempt-unminted",
            "{}: attempt {a} was never minted",
            what()
        );
        Ok(())
    }

    fn generation(&self, g: Generation, what: impl Fn() -> String) -> Result<(), RestoreError> {
        require!(
            g.get() < self.next_generation,
            "generation-unminted",
            "{}: generation {g} was never minted",
            what()
        );
        Ok(())
    }

    fn lease(&self, l: LeaseId, what: impl Fn() -> String) -> Result<(), RestoreError> {
        require!(
            l.get() < self.next_lease,
            "lease-unminted",
            "{}: lease {l} was never minted",
            what()
        );
        Ok(())
    }

    /// A stamp the core minted itself (top bit) is below its counter; a runtime's stamp is
    /// the runtime's business.
    fn stamp(&self, stamp: ErrorStamp, what: impl Fn() -> String) -> Result<(), RestoreError> {
        let raw = stamp.get();
        require!(
            raw & CORE_STAMP_BIT == 0 || (raw & !CORE_STAMP_BIT) < self.next_stamp,
            "stamp-unminted",
            "{}: core stamp {raw:#x} was never minted",
            what()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{Callback, Input, RuntimeEvent, Verdict};
    use crate::{ConversationToken, TurnId};

    fn sid(n: u64) -> SessionId {
        SessionId::new(n).unwrap()
    }

    fn drain(core: &mut Core) -> Vec<Effect> {
        std::iter::from_fn(|| core.poll_effect()).collect()
    }

    fn lease_of(effects: &[Effect]) -> LeaseId {
        effects
            .iter()
            .find_map(|e| match e {
                Effect::NewConversation { lease, .. } | Effect::DispatchPrompt { lease, .. } => {
                    Some(*lease)
                }
                _ => None,
            })
            .expect("a leased effect")
    }

    /// Session `n` claims turn 1 and runs it on execution `exec` up to the provider's
    /// acceptance (`accept`), or leaves it dispatched but not performed.
    fn turn_on(core: &mut Core, n: u64, exec: u64, accept: bool) {
        let now = Timestamp::from_millis(10);
        let session = sid(n);
        let turn = TurnId::new(1).unwrap();
        assert_eq!(
            core.handle(now, Input::Prompt { session, turn }),
            Verdict::Claimed
        );
        let attempt = core.live_attempt(session).unwrap();
        let execution = ExecutionId::new(exec).unwrap();
        let Verdict::Bound { generation } = core.handle(
            now,
            Input::Bound {
                session,
                attempt,
                execution,
            },
        ) else {
            panic!("bound")
        };
        drain(core);
        let cb = |event| {
            Input::Callback(Callback {
                session,
                execution,
                attempt: Some(attempt),
                generation,
                event,
            })
        };
        assert_eq!(
            core.handle(now, cb(RuntimeEvent::BootReady)),
            Verdict::Accepted
        );
        let ready = RuntimeEvent::AgentReady {
            load_capability: Some(true),
        };
        assert_eq!(core.handle(now, cb(ready)), Verdict::Accepted);
        let lease = lease_of(&drain(core));
        assert_eq!(
            core.handle(now, Input::Perform { lease }),
            Verdict::Accepted
        );
        let token = ConversationToken::new(n).unwrap();
        let created = RuntimeEvent::ConversationCreated { token };
        assert_eq!(core.handle(now, cb(created)), Verdict::Accepted);
        if !accept {
            drain(core);
            return;
        }
        let lease = lease_of(&drain(core));
        assert_eq!(
            core.handle(now, Input::Perform { lease }),
            Verdict::Accepted
        );
        let accepted = RuntimeEvent::PromptAccepted { turn };
        assert_eq!(core.handle(now, cb(accepted)), Verdict::Accepted);
        drain(core);
        core.check_invariants().unwrap();
    }

    fn decode(bytes: &[u8]) -> Encoded {
        postcard::from_bytes(&bytes[6..]).unwrap()
    }

    fn encode(enc: &Encoded) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend(postcard::to_allocvec(enc).unwrap());
        out
    }

    fn refused_by(bytes: &[u8]) -> &'static str {
        match Core::restore(bytes) {
            Err(RestoreError::Inconsistent { rule, .. }) => rule,
            other => panic!("restored or refused otherwise: {other:?}"),
        }
    }

    #[test]
    fn a_turn_running_on_another_sessions_execution_is_refused() {
        let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
        turn_on(&mut core, 1, 1, true);
        turn_on(&mut core, 2, 3, true);
        let snap = core.snapshot();
        assert!(Core::restore(&snap).is_ok());
        let mut enc = decode(&snap);
        let turn = enc.sessions[0].1.turn.as_mut().unwrap();
        turn.phase = TurnPhase::Accepted {
            execution: ExecutionId::new(3).unwrap(),
        };
        // The state passes the invariants the live core keeps (the execution exists), so
        // only the cross-reference shows that session 1 would stay busy forever: no
        // callback of execution 3 is ever admitted for session 1.
        assert_eq!(refused_by(&encode(&enc)), "turn-execution");
    }

    #[test]
    fn a_ring_longer_than_its_bound_is_refused_before_anything_is_pushed() {
        // A prompt dispatched but not performed: the restore rolls it back and retires the
        // attempt that waited for it, a push onto its ring.
        let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
        turn_on(&mut core, 1, 1, false);
        let mut enc = decode(&core.snapshot());
        let ring = &mut enc.sessions[0].1.ring;
        *ring = ring.clone().with_len_for_test(255);
        assert_eq!(refused_by(&encode(&enc)), "ring-shape");
    }

    #[test]
    fn a_history_longer_than_its_bound_or_its_length_is_refused() {
        // Version 2 encodes the binding history as the prefix it holds, so a decoded
        // snapshot may claim any length: the fuzzer's old finding (a length of 255, then a
        // rebind) in this encoding.
        let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
        turn_on(&mut core, 1, 1, true);
        let snap = core.snapshot();
        let newest = decode(&snap).executions[0]
            .1
            .history()
            .last()
            .expect("bound once");
        for (entries, hist_len) in [(1, 255), (9, 9), (9, 8), (1, 0)] {
            let mut enc = decode(&snap);
            let e = enc.executions[0].1.clone();
            enc.executions[0].1 = e.with_history_for_test(vec![Some(newest); entries], hist_len);
            assert_eq!(
                refused_by(&encode(&enc)),
                "execution-history",
                "{entries} entries, length {hist_len}"
            );
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
        turn_on(&mut core, 1, 1, true);
        let mut snap = core.snapshot();
        snap.extend_from_slice(b"xyz");
        assert_eq!(
            Core::restore(&snap).unwrap_err(),
            RestoreError::TrailingBytes(3)
        );
    }

    #[test]
    fn deadlines_the_clock_cannot_have_set_are_refused() {
        let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
        assert!(matches!(
            core.handle(Timestamp::from_millis(5), Input::Resume { session: sid(1) }),
            Verdict::Started { .. }
        ));
        let mut enc = decode(&core.snapshot());
        enc.sessions[0].1.live.as_mut().unwrap().start_deadline = Timestamp::MAX;
        assert_eq!(refused_by(&encode(&enc)), "deadline");
    }

    #[test]
    fn ids_and_stamps_beyond_the_counters_are_refused() {
        let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
        turn_on(&mut core, 1, 1, true);
        let snap = core.snapshot();
        let mut enc = decode(&snap);
        enc.next_generation = 1;
        assert_eq!(refused_by(&encode(&enc)), "generation-unminted");
        let mut enc = decode(&snap);
        enc.next_attempt_seq = 1;
        assert_eq!(refused_by(&encode(&enc)), "attempt-unminted");
        let mut enc = decode(&snap);
        enc.sessions[0].1.failure = Some(crate::failure::StoredFailure {
            failure: crate::io::RecoveryFailure {
                attempt: enc.sessions[0].1.owner.unwrap(),
                execution: None,
                stamp: ErrorStamp::new(CORE_STAMP_BIT | 1_000).unwrap(),
            },
            dismissed: false,
        });
        assert_eq!(refused_by(&encode(&enc)), "stamp-unminted");
    }

    #[test]
    fn an_epoch_no_core_runs_in_is_refused_without_overflow() {
        let core = Core::new(Config::default(), Epoch::FIRST).unwrap();
        let mut enc = decode(&core.snapshot());
        // The encoding does not check the range a constructor does.
        enc.epoch = postcard::from_bytes(&postcard::to_allocvec(&u32::MAX).unwrap()).unwrap();
        assert_eq!(refused_by(&encode(&enc)), "epoch");
    }
}
