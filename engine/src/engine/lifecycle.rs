//! A runtime's life: spawned (or taken over by a successor, with runtime reuse), started,
//! closed, reported exited, killed, and finished once its process is reaped.

use super::*;

impl Engine {
    /// The shell started (or failed to start) the agent for `attempt` after
    /// [`Action::Spawn`]: `Ok(pid)` or `Err(why)`. Returns the execution allocated to it.
    ///
    /// With [`EngineConfig::reuse_runtimes`], a process started for an attempt that was
    /// retired meanwhile goes to the session's live attempt if that one waits for it: the
    /// live attempt binds it first, then the retired attempt's own bind is reported, late,
    /// and the core decides what that may do (rule 5: nothing, once a later attempt claimed
    /// the execution).
    pub fn spawned(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
        result: Result<Option<u32>, String>,
    ) -> ExecutionId {
        self.spawning.remove(&(session, attempt));
        let execution = ExecutionId::new(self.counters.next_execution)
            .expect("the execution counter starts at 1 and only grows");
        self.counters.next_execution = self.counters.next_execution.saturating_add(1);
        let (pid, has_process) = match &result {
            Ok(pid) => (*pid, true),
            Err(_) => (None, false),
        };
        self.runtimes.insert(
            execution,
            Runtime {
                session,
                attempt,
                generation: None,
                has_process,
                load_capability: None,
                loading: None,
                new_reason: None,
                conversation: None,
                prompt: None,
                held: None,
                close_reason: None,
                reaped: None,
                lists_sessions: false,
                listing: None,
                exit_reported: false,
                stop_requested: false,
                kill_requested: false,
            },
        );
        if let Some(successor) = self.take_waiter(session, attempt) {
            if has_process && self.take_over(now, session, attempt, successor, execution, pid) {
                return execution;
            }
            // Not taken over: the waiting attempt starts a process of its own.
            if self.driver.core().live_attempt(session) == Some(successor) {
                self.spawn(session, successor);
            }
        }
        let verdict = self.input(
            now,
            Input::Bound {
                session,
                attempt,
                execution,
            },
        );
        let Verdict::Bound { generation } = verdict else {
            // The attempt is no longer live: nobody will ever stop this process but us.
            self.kill(execution);
            if !has_process {
                self.finish_runtime(now, execution);
            }
            return execution;
        };
        self.started(now, execution, attempt, generation, pid, result.err());
        execution
    }

    /// Asks the shell to start a process for `attempt`.
    pub(super) fn spawn(&mut self, session: SessionId, attempt: AttemptId) {
        self.spawning.insert((session, attempt));
        self.act(Action::Spawn { session, attempt });
    }

    /// The live attempt of `session` that waits for the process `attempt`'s spawn started,
    /// if any (an attempt retired meanwhile waits for nothing).
    pub(super) fn take_waiter(
        &mut self,
        session: SessionId,
        attempt: AttemptId,
    ) -> Option<AttemptId> {
        let waiter = *self.waiting.get(&session)?;
        if waiter == attempt {
            return None;
        }
        self.waiting.remove(&session);
        (self.driver.core().live_attempt(session) == Some(waiter)).then_some(waiter)
    }

    /// Runtime reuse: `successor` binds the process started for the retired `attempt`;
    /// then the retired attempt's bind is reported, late. False if the core refused the
    /// successor (then the runtime is still the retired attempt's).
    pub(super) fn take_over(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
        successor: AttemptId,
        execution: ExecutionId,
        pid: Option<u32>,
    ) -> bool {
        let verdict = self.input(
            now,
            Input::Bound {
                session,
                attempt: successor,
                execution,
            },
        );
        let Verdict::Bound { generation } = verdict else {
            return false;
        };
        if let Some(runtime) = self.runtimes.get_mut(&execution) {
            runtime.attempt = successor;
        }
        self.started(now, execution, successor, generation, pid, None);
        // The retired attempt's start completed too: a late callback of its own, which
        // the core fences (the process is the successor's now, whatever it says).
        let late = self.input(
            now,
            Input::Bound {
                session,
                attempt,
                execution,
            },
        );
        debug_assert!(
            late.is_reject(),
            "a retired attempt's bind is refused: {late:?}"
        );
        true
    }

    /// `attempt` is bound to `execution` under `generation`: tell the caller, then start
    /// the agent's connection (or report why it could not start).
    pub(super) fn started(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        attempt: AttemptId,
        generation: Generation,
        pid: Option<u32>,
        spawn_error: Option<String>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        runtime.generation = Some(generation);
        let session = runtime.session;
        self.emit(SessionEvent::RuntimeStarted {
            session,
            execution,
            attempt,
            generation,
            pid,
        });
        match spawn_error {
            Some(why) => {
                let stamp = self.stamp(attempt, FailureCause::Spawn(why));
                self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
            }
            None => {
                self.callback(now, execution, RuntimeEvent::BootReady);
                let deadline = now.plus_millis(self.config.initialize_timeout_ms);
                self.act(Action::Request {
                    execution,
                    op: Op::Initialize,
                    method: acp::INITIALIZE.into(),
                    params: self
                        .hello
                        .clone()
                        .map_or(acp::Params::Initialize, acp::Params::Raw),
                    deadline,
                });
            }
        }
    }

    pub(super) fn closed(&mut self, now: Timestamp, execution: ExecutionId, reason: CloseReason) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        runtime.close_reason = Some(reason.clone());
        runtime.prompt = None;
        runtime.held = None;
        runtime.loading = None;
        // A load failure still waiting for its listing: the exit reported below ends the
        // attempt anyway.
        runtime.listing = None;
        let ours = runtime.stop_requested
            || runtime.kill_requested
            || matches!(reason, CloseReason::Killed(_));
        if !ours {
            // Process exit, stdout closed, garbage: the runtime is dead.
            self.report_exit(now, execution, FailureCause::Connection(reason));
        }
        // Whatever ended the connection, the process must not outlive it.
        self.kill(execution);
        if self
            .runtimes
            .get(&execution)
            .is_some_and(|r| r.reaped.is_some())
        {
            self.finish_runtime(now, execution);
        }
    }

    /// Tells the core the runtime is dead (once) and makes sure its process is.
    pub(super) fn report_exit(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        cause: FailureCause,
    ) {
        if let Some(runtime) = self.runtimes.get_mut(&execution) {
            if runtime.exit_reported {
                return;
            }
            runtime.exit_reported = true;
            runtime.prompt = None;
            runtime.held = None;
            let attempt = runtime.attempt;
            self.turn_causes.insert(runtime.session, cause.clone());
            let stamp = self.stamp(attempt, cause);
            self.stats.exits_reported += 1;
            self.callback(now, execution, RuntimeEvent::Exited { stamp });
            self.kill(execution);
        } else if let Some(record) = self
            .graveyard
            .iter()
            .rev()
            .find(|r| r.execution == execution)
            .copied()
        {
            // A runtime of the previous incarnation died with it, whatever found it gone.
            let cause = if self.previous_incarnation.contains(&execution) {
                FailureCause::SupervisorRestarted
            } else {
                cause
            };
            self.turn_causes.insert(record.session, cause.clone());
            let stamp = self.stamp(record.attempt, cause);
            self.stats.exits_reported += 1;
            self.submit(
                now,
                Input::Callback(Callback {
                    session: record.session,
                    execution,
                    attempt: Some(record.attempt),
                    generation: record.generation,
                    event: RuntimeEvent::Exited { stamp },
                }),
            );
        }
    }

    pub(super) fn kill(&mut self, execution: ExecutionId) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        if runtime.has_process && !runtime.kill_requested && runtime.reaped.is_none() {
            runtime.kill_requested = true;
            self.act(Action::Kill { execution });
        }
    }

    /// The runtime is over: its process reaped and its connection closed.
    pub(super) fn finish_runtime(&mut self, now: Timestamp, execution: ExecutionId) {
        let Some(runtime) = self.runtimes.remove(&execution) else {
            return;
        };
        self.touch();
        self.close_tickets(execution, false);
        if let Some(generation) = runtime.generation {
            self.bury(ExecutionRecord {
                execution,
                session: runtime.session,
                attempt: runtime.attempt,
                generation,
            });
        }
        self.emit(SessionEvent::RuntimeExited {
            session: runtime.session,
            execution,
            status: runtime.reaped.flatten(),
            reason: runtime.close_reason,
        });
        if runtime.stop_requested {
            self.submit(now, Input::Stopped { execution });
        }
    }

    pub(super) fn bury(&mut self, record: ExecutionRecord) {
        if self.graveyard.len() == GRAVEYARD_RUNTIMES {
            self.graveyard.pop_front();
        }
        self.graveyard.push_back(record);
    }
}
