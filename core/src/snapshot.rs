//! Snapshot and restore: the core's state survives a process restart. Restore bumps the
//! epoch, so no callback carrying an attempt ID minted after the snapshot (by a previous
//! incarnation that then crashed) is ever accepted: such an ID is either unknown to the
//! snapshot (rejected) or from the new epoch's future.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::attempt::{ConvPhase, Retired};
use crate::cleanup::{Execution, StopState};
use crate::config::Config;
use crate::core::{Core, Session, Timer};
use crate::idmap::IdMap;
use crate::ids::{Epoch, ExecutionId, SessionId};
use crate::io::{Effect, TurnOutcome};
use crate::mutants::ActiveMutant;
use crate::time::Timestamp;
use crate::turn::TurnPhase;

/// Format tag: 4 magic bytes and a version.
const MAGIC: &[u8; 4] = b"PLSD";
/// Bump on any change to the encoded state.
const VERSION: u16 = 1;

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
    /// The snapshot's epoch is the last one; a restart cannot bump it.
    EpochExhausted,
    /// It decodes but breaks an invariant.
    Inconsistent(String),
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
            RestoreError::EpochExhausted => write!(f, "snapshot epoch is the last one"),
            RestoreError::Inconsistent(e) => write!(f, "snapshot inconsistent: {e}"),
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
        let enc: Encoded = postcard::from_bytes(&bytes[6..]).map_err(|e| match e {
            postcard::Error::DeserializeUnexpectedEnd => RestoreError::Truncated,
            other => RestoreError::Corrupt(other.to_string()),
        })?;
        enc.config
            .validate()
            .map_err(|e| RestoreError::Inconsistent(e.to_string()))?;
        let epoch = enc.epoch.next().ok_or(RestoreError::EpochExhausted)?;
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
            timers: crate::timers::Timers::default(),
            effects: VecDeque::new(),
            mutant: ActiveMutant::NONE,
        };
        let _ = enc.next_attempt_seq;
        for (id, s) in enc.sessions {
            if core.sessions.insert(id, Box::new(s)).is_some() {
                return Err(RestoreError::Inconsistent(format!("session {id} twice")));
            }
        }
        for (id, e) in enc.executions {
            if core.executions.insert(id, e).is_some() {
                return Err(RestoreError::Inconsistent(format!("execution {id} twice")));
            }
        }
        core.rebuild_after_restore();
        core.check_invariants()
            .map_err(|v| RestoreError::Inconsistent(v.to_string()))?;
        Ok(core)
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
            if let Some(t) = s.turn.as_mut() {
                match t.phase {
                    TurnPhase::Recovering { at } => {
                        self.timers.insert((at, Timer::Recovery(id, t.id)));
                    }
                    TurnPhase::Performed { deadline, .. } => {
                        self.timers.insert((deadline, Timer::Accept(id, t.id)));
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
