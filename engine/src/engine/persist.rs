//! The state image: what the engine writes after a step that changed it, and the restore
//! that starts the next incarnation from it.

use super::*;

impl Engine {
    /// Restores a state image written by [`Engine::state_image`]: the core comes back in
    /// the next epoch, every execution that was bound is reported exited (its process died
    /// with the previous incarnation) and stopped, and every live attempt that had no
    /// runtime yet gets one ([`Action::Spawn`]). The core's clock starts at `now` (a time
    /// the state image's core may never have seen). Persist the new state before anything
    /// else: it carries the new epoch.
    pub fn restore(
        config: EngineConfig,
        bytes: &[u8],
        now: Timestamp,
    ) -> Result<Engine, StateError> {
        Engine::restore_observed(config, bytes, now, None)
    }

    /// [`Engine::restore`], with `observer` watching from the first step (the restore's
    /// own): see [`Engine::set_observer`].
    pub fn restore_observed(
        config: EngineConfig,
        bytes: &[u8],
        now: Timestamp,
        observer: Option<Box<dyn Observer + Send>>,
    ) -> Result<Engine, StateError> {
        Engine::restore_prepared(config, bytes, now, observer, |_| {})
    }

    /// [`Engine::restore_observed`], with `prepare` run on the engine once it exists and
    /// before the restore does anything with it (binds, exits, spawns, the output it
    /// hands out): what an embedding runs on every engine before anything else (the
    /// simulator switches a mutant on there, so a bug of the restore itself can be
    /// switched too).
    pub fn restore_prepared(
        config: EngineConfig,
        bytes: &[u8],
        now: Timestamp,
        observer: Option<Box<dyn Observer + Send>>,
        prepare: impl FnOnce(&mut Engine),
    ) -> Result<Engine, StateError> {
        let decoded = state::decode(bytes)?;
        let core = Core::restore(decoded.core_snapshot).map_err(StateError::Core)?;
        state::cross_check(&decoded.header, &core)?;
        // The auditor cannot know the attempts before the restart: it would flag their
        // legitimate callbacks, so it stays off. The restore's own effects (turns rolled
        // back, conversation requests re-issued) wait in the driver for the first pull.
        let watch = StepWatch {
            outer: observer,
            ..StepWatch::default()
        };
        // Restored at `now`: the core's clock starts there, not at its snapshot's last
        // step, so a clock reading earlier later cannot shorten a deadline.
        let mut engine = Engine::with_driver(config, Driver::restored(now, core, watch));
        prepare(&mut engine);
        // Live attempts that had no runtime bound: their StartRuntime was being carried out
        // when the previous incarnation died, so they get a runtime below (attempts bound
        // to a recorded execution fail when it is reported exited).
        let unbound: Vec<(SessionId, AttemptId)> = decoded
            .header
            .sessions
            .iter()
            .filter_map(|r| {
                let attempt = engine.driver.core().live_attempt(r.session)?;
                let bound = decoded
                    .header
                    .executions
                    .iter()
                    .any(|e| e.session == r.session && e.attempt == attempt);
                (!bound).then_some((r.session, attempt))
            })
            .collect();
        let header = decoded.header;
        // The client's hello and authentication, for the runtimes started before it is
        // back (the restore's own spawns first).
        engine.hello = header.client_hello;
        engine.auth = header
            .client_auth
            .map(|params| (acp::AUTHENTICATE.to_owned(), params));
        // Mutant `restore-reuses-execution-ids`: the execution counter starts again.
        #[cfg(feature = "mutants")]
        let next_execution = if engine.driver.core().active_mutant().get()
            == Some(palisade_core::mutants::Mutant::RestoreReusesExecutionIds)
        {
            1
        } else {
            header.next_execution
        };
        #[cfg(not(feature = "mutants"))]
        let next_execution = header.next_execution;
        engine.counters = Counters {
            next_execution: next_execution.max(1),
            next_turn: header.next_turn.max(1),
            next_stamp: header.next_stamp.max(1),
            next_token: header.next_token.max(1),
        };
        for record in header.sessions {
            if let Some((turn, items)) = record.queued_output {
                engine.restore_outlet(now, record.session, turn, items);
            }
            engine.books.insert(
                record.session,
                Book {
                    conversation: record.conversation,
                    turn: record.turn,
                    setup: SessionSetup {
                        label: record.label,
                        params: record.params,
                        history: false,
                    },
                    stop_reason: None,
                },
            );
        }
        // What the caller had not taken goes first.
        #[cfg(feature = "mutants")]
        let skip = usize::from(
            engine.driver.core().active_mutant().get()
                == Some(palisade_core::mutants::Mutant::RestoreSkipsFirstUndelivered),
        );
        #[cfg(not(feature = "mutants"))]
        let skip = 0;
        for event in header.undelivered.into_iter().skip(skip) {
            engine.ready.push(event);
        }
        // The runtimes died with the previous incarnation. They are reported exited after
        // the effects the restore queued (the driver's order); one of those that acts on a
        // dead runtime (a re-issued conversation request) finds it gone and reports its
        // exit first, with the same cause.
        for record in &header.executions {
            engine.bury(*record);
            engine.previous_incarnation.insert(record.execution);
        }
        for record in header.executions {
            let stamp = engine.stamp(record.attempt, FailureCause::SupervisorRestarted);
            engine.stats.exits_reported += 1;
            engine.submit(
                now,
                Input::Callback(Callback {
                    session: record.session,
                    execution: record.execution,
                    attempt: Some(record.attempt),
                    generation: record.generation,
                    event: RuntimeEvent::Exited { stamp },
                }),
            );
            // Also a teardown the core may be waiting for: the process is gone.
            engine.submit(
                now,
                Input::Stopped {
                    execution: record.execution,
                },
            );
        }
        // The restore's own effects, then the exits above, in that order.
        engine.run(now);
        // Mutant `restore-leaves-spawn-unstarted`: the spawns in flight are left to the
        // core, which never asks again.
        #[cfg(feature = "mutants")]
        let unbound = if engine.driver.core().active_mutant().get()
            == Some(palisade_core::mutants::Mutant::RestoreLeavesSpawnUnstarted)
        {
            Vec::new()
        } else {
            unbound
        };
        for (session, attempt) in unbound {
            if engine.driver.core().live_attempt(session) == Some(attempt) {
                engine.spawn(session, attempt);
            }
        }
        // On a platform whose runtimes outlive their orchestrator (a sidecar runs them),
        // the previous incarnations' are still running, and nobody else will stop them:
        // they are killed, and killed again after each restart until the platform reports
        // them gone (a platform whose runtimes died with it has none by those ids, and
        // says so at once). Whatever they still write is fenced: their execution ids name
        // no runtime of this engine's, and never will (the counter is persisted).
        let survivors: BTreeSet<ExecutionId> = header
            .survivors
            .iter()
            .copied()
            .chain(engine.previous_incarnation.iter().copied())
            .collect();
        // Mutant `restore-leaves-survivors-running`: nobody kills them.
        #[cfg(feature = "mutants")]
        let survivors = if engine.driver.core().active_mutant().get()
            == Some(palisade_core::mutants::Mutant::RestoreLeavesSurvivorsRunning)
        {
            BTreeSet::new()
        } else {
            survivors
        };
        for &execution in &survivors {
            engine.act(Action::Kill { execution });
        }
        engine.survivors = survivors;
        engine.touch();
        Ok(engine)
    }

    /// The state image to persist: the core's snapshot and the engine's own records.
    /// Bytes from [`state::BODY_OFFSET`](crate::state) on change only when the state does.
    #[must_use]
    pub(super) fn encode_state(&self, now: Timestamp) -> Vec<u8> {
        // Mutant `image-lists-queue-before-batch`: the queue first, then the batch that
        // left it before them.
        #[cfg(feature = "mutants")]
        let queue_first = self.driver.core().active_mutant().get()
            == Some(palisade_core::mutants::Mutant::ImageListsQueueBeforeBatch);
        #[cfg(not(feature = "mutants"))]
        let queue_first = false;
        let header = HeaderOut {
            next_execution: self.counters.next_execution,
            next_turn: self.counters.next_turn,
            next_stamp: self.counters.next_stamp,
            next_token: self.counters.next_token,
            sessions: self
                .books
                .iter()
                .map(|(session, book)| SessionRecordOut {
                    session: *session,
                    conversation: &book.conversation,
                    turn: &book.turn,
                    label: &book.setup.label,
                    params: &book.setup.params,
                    queued_output: self.outlets.get(session).map(|o| {
                        let batching = o.coalescer.pending().iter().map(|e| (e.seq, &e.payload));
                        let queued = o.queue.iter().map(|(seq, (_, item))| (seq, item));
                        // The batch left the queue first: its seqs come before the
                        // queue's.
                        let items = if queue_first {
                            queued.chain(batching).map(queued_out).collect()
                        } else {
                            batching.chain(queued).map(queued_out).collect()
                        };
                        (o.turn, items)
                    }),
                })
                .collect(),
            undelivered: self
                .handed
                .iter()
                .chain(self.ready.events.iter().map(|(_, event)| event))
                .filter(|event| event.survives_restart())
                .collect(),
            client_hello: &self.hello,
            client_auth: self.auth.as_ref().map(|(_, params)| params),
            executions: self
                .runtimes
                .iter()
                .filter_map(|(execution, r)| {
                    r.generation.map(|generation| ExecutionRecord {
                        execution: *execution,
                        session: r.session,
                        attempt: r.attempt,
                        generation,
                    })
                })
                .collect(),
            // Those of earlier incarnations not yet reported gone, and this one's not yet
            // bound (not among `executions`): a restart kills them all.
            survivors: self
                .survivors
                .iter()
                .copied()
                .chain(
                    self.runtimes
                        .iter()
                        .filter(|(_, r)| {
                            r.generation.is_none() && r.has_process && r.reaped.is_none()
                        })
                        .map(|(execution, _)| *execution),
                )
                .collect(),
        };
        state::encode(now.as_millis(), &header, &self.driver.core().snapshot())
    }
}

/// One output the state image lists for its session's delivery path.
fn queued_out((seq, item): (Seq, &OutputItem)) -> QueuedOutputOut<'_> {
    QueuedOutputOut {
        seq: seq.get(),
        update: &item.update,
        wire_bytes: item.wire_bytes,
    }
}
