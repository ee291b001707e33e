//! The engine's one output: what the shell must do next, drained after every input.

use super::*;

/// What the engine asks of its shell next. Drain [`Engine::poll_output`] after every input
/// until it says [`Output::Wait`].
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum Output {
    /// Write the state durably: [`Engine::state_image`], then [`Engine::persisted`] with
    /// its version once the write is durable (with [`EngineConfig::persistence`] only).
    /// Asked again only after that report; meanwhile the engine takes inputs, and the
    /// next write covers all of them.
    Persist,
    /// Something for the shell to do; its result comes back as an input.
    Action(Action),
    /// An event for the caller, which had room for it ([`Engine::set_caller_room`]).
    /// With persistence it stays in the state until [`Engine::acknowledge`]d.
    Event(SessionEvent),
    /// Nothing more until the next input.
    Wait {
        /// Call [`Engine::handle_timeout`] then, if nothing came before.
        until: Option<Timestamp>,
        /// Whether the shell may read its agents (false: the delivery queues are full and
        /// the agents must wait: backpressure).
        read_agents: bool,
        /// Events wait for the caller's room: wake when it has some.
        caller_blocked: bool,
    },
}

/// Where [`Engine::poll_output`] is in its round.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Round {
    /// Output was moved out of the delivery queues in this round.
    pumped: bool,
    /// Something was given out in this round.
    gave: bool,
}

/// A state image to write, and the version it covers (for [`Engine::persisted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateImage {
    /// The version of the state it holds.
    pub version: u64,
    /// The bytes (see [`crate::state`]).
    pub bytes: Vec<u8>,
}

impl Engine {
    /// The next thing the shell must do, in rounds: the actions (in the order they were
    /// asked for), the write the state needs, then output moved out of the delivery
    /// queues once and events for the caller while it has room; a round that gave anything
    /// out is followed by another (the caller's room may let more output through), and a
    /// round that gave nothing ends in [`Output::Wait`].
    pub fn poll_output(&mut self, now: Timestamp) -> Output {
        loop {
            if let Some((version, _)) = self.actions.front() {
                if self.released(*version) {
                    let (_, action) = self.actions.pop_front().expect("the front was just seen");
                    self.round.gave = true;
                    return Output::Action(action);
                }
            }
            if self.config.persistence && self.version > self.durable && !self.writing {
                self.writing = true;
                return Output::Persist;
            }
            if !self.round.pumped {
                self.pump_outlets(now);
                self.round.pumped = true;
            }
            if self.caller_room > 0 {
                let durable = if self.config.persistence {
                    self.durable
                } else {
                    u64::MAX
                };
                if let Some(event) = self.ready.pop_released(durable) {
                    self.caller_room -= 1;
                    if self.config.persistence {
                        self.handed.push_back(event.clone());
                    }
                    self.round.gave = true;
                    return Output::Event(event);
                }
            }
            let gave = self.round.gave;
            self.round = Round::default();
            if !gave {
                return Output::Wait {
                    until: self.poll_timeout(),
                    read_agents: self.can_accept(),
                    caller_blocked: self.caller_room == 0 && !self.ready.events.is_empty(),
                };
            }
        }
    }

    /// How many events the caller can take now (the free room of its channel); each
    /// [`Output::Event`] uses one.
    pub fn set_caller_room(&mut self, room: usize) {
        // Mutant `caller-room-ignored`: the caller is taken to have room for everything.
        #[cfg(feature = "mutants")]
        let room = if self.driver.core().active_mutant().get()
            == Some(palisade_core::mutants::Mutant::CallerRoomIgnored)
        {
            usize::MAX
        } else {
            room
        };
        self.caller_room = room;
    }

    /// The state to write for an [`Output::Persist`]: everything up to now.
    #[must_use]
    pub fn state_image(&self, now: Timestamp) -> StateImage {
        StateImage {
            version: self.version,
            bytes: self.encode_state(now),
        }
    }

    /// A write of `version` is durable: what waited for it may leave.
    pub fn persisted(&mut self, version: u64) {
        self.durable = self.durable.max(version);
        self.writing = false;
    }

    /// The state's version now; [`Engine::is_durable`] of it says when a write covers
    /// everything done so far (a prompt's claim, say).
    #[must_use]
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether a durable write covers `version` (always, without persistence).
    #[must_use]
    pub fn is_durable(&self, version: u64) -> bool {
        self.released(version)
    }
}
