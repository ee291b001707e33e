//! Delivery outlets: a turn's admitted output waits in its session's bounded queue, then
//! goes through the coalescer to the events waiting for the caller (rule 9).

use super::*;

/// One `session/update` in flight to the caller; every wire byte counts toward the
/// coalescer's byte cap, whatever its kind.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OutputItem {
    pub(super) update: RawJson,
    pub(super) wire_bytes: usize,
    /// The state version that admitted it (the core's `Deliver`): the state image of that
    /// version lists it (queued, or undelivered once it moved on), so with persistence it
    /// may leave once a write of that version is durable.
    pub(super) admitted: u64,
}

impl Payload for OutputItem {
    fn byte_len(&self) -> usize {
        self.wire_bytes
    }
}

/// A turn's delivery path: admitted output waits in the bounded queue (whose fullness
/// stops the engine from reading agents), then goes through the coalescer.
#[derive(Debug)]
pub(super) struct Outlet {
    pub(super) turn: TurnId,
    pub(super) queue: NotificationQueue<(EventKind, OutputItem)>,
    pub(super) coalescer: Coalescer<OutputItem>,
}

#[derive(Debug)]
pub(super) struct PendingOutput {
    pub(super) session: SessionId,
    pub(super) turn: TurnId,
    pub(super) kind: EventKind,
    pub(super) item: OutputItem,
}

/// Events waiting for the caller, and how many output events their batches hold: the
/// engine stops moving output out of the delivery queues when either reaches
/// [`READY_EVENTS`], so backpressure starts when the caller stops reading, not 64 full
/// batches later.
///
/// Each event carries a state version: with persistence, it leaves only once a write
/// covering that version is durable. An event's version is the one it entered at; a batch
/// of output's is the latest that admitted any of it (`OutputItem::admitted`), so one
/// write releases every output it covers.
#[derive(Debug, Default)]
pub(super) struct Ready {
    pub(super) events: VecDeque<(u64, SessionEvent)>,
    pub(super) outputs: usize,
    /// The engine's state version now (what an event pushed now is tagged with).
    pub(super) version: u64,
}

impl Ready {
    pub(super) fn push(&mut self, event: SessionEvent) {
        self.push_at(self.version, event);
    }

    /// A batch of a turn's admitted output, tagged with the latest version that admitted
    /// any of it: moving output from the delivery queue to here changes nothing a restart
    /// would see differently (the state lists it either way), so it waits for no write of
    /// its own. Events still leave in order: a batch behind a later-tagged event waits.
    pub(super) fn push_output(
        &mut self,
        session: SessionId,
        turn: TurnId,
        batch: Batch<OutputItem>,
    ) {
        let admitted = batch
            .events()
            .iter()
            .map(|e| e.payload.admitted)
            .max()
            .unwrap_or(self.version);
        self.push_at(
            admitted.min(self.version),
            output_event(session, turn, batch),
        );
    }

    fn push_at(&mut self, version: u64, event: SessionEvent) {
        if let SessionEvent::Output { events, .. } = &event {
            self.outputs += events.len();
        }
        self.events.push_back((version, event));
    }

    /// The oldest event, if it entered at or before `durable`.
    pub(super) fn pop_released(&mut self, durable: u64) -> Option<SessionEvent> {
        if self.events.front().is_none_or(|(tag, _)| *tag > durable) {
            return None;
        }
        let (_, event) = self.events.pop_front()?;
        if let SessionEvent::Output { events, .. } = &event {
            self.outputs = self.outputs.saturating_sub(events.len());
        }
        Some(event)
    }
}

impl Engine {
    /// Moves admitted output towards the caller: queue → coalescer → events, while fewer
    /// than [`READY_EVENTS`] wait; emits batches that are due. Runs on every
    /// [`Engine::poll_output`]: a full delivery queue stops [`Engine::can_accept`], and only
    /// this drains it.
    pub(super) fn pump_outlets(&mut self, now: Timestamp) {
        let Engine { outlets, ready, .. } = self;
        let room =
            |ready: &Ready| ready.events.len() < READY_EVENTS && ready.outputs < READY_EVENTS;
        // `can_accept` as it stands after the pass, gathered on the way (a later outlet's
        // turn leaves an earlier one's queue alone).
        let mut accept = true;
        for (session, outlet) in outlets.iter_mut() {
            if let Some(batch) = outlet.coalescer.handle_timeout(now) {
                ready.push_output(*session, outlet.turn, batch);
            }
            while room(ready) {
                let Some((seq, (kind, item))) = outlet.queue.pop() else {
                    break;
                };
                for batch in outlet
                    .coalescer
                    .push(now, StreamEvent::new(seq, kind, item))
                {
                    ready.push_output(*session, outlet.turn, batch);
                }
            }
            accept &= !outlet.queue.is_full();
        }
        debug_assert_eq!(accept, self.can_accept());
        let gated = !accept;
        if gated != self.gated {
            // While the engine does not read the agents, their silence proves nothing: the
            // core's idle rule waits until it listens again.
            self.gated = gated;
            self.driver.set_listening(now, !gated);
        }
    }

    /// Moves every admitted output to the caller's events now, due or not (shutdown).
    pub fn flush_output(&mut self, now: Timestamp) {
        let sessions: Vec<SessionId> = self.outlets.keys().copied().collect();
        for session in sessions {
            self.flush_outlet(now, session);
        }
    }

    /// Whether the shell may read more from the agents: every delivery queue has room for
    /// what one more agent event can add.
    #[must_use]
    pub fn can_accept(&self) -> bool {
        self.outlets.values().all(|o| !o.queue.is_full())
    }

    /// The caller is done with the oldest `count` events [`Output::Event`] handed out: with
    /// persistence they leave the state at the next write (until then a restart hands them
    /// out again: at least once, never lost).
    pub fn acknowledge(&mut self, count: u64) {
        for _ in 0..count {
            if self.handed.pop_front().is_none() {
                break;
            }
        }
    }

    /// Rebuilds a session's delivery path from the output it held when the state was
    /// written: the caller gets it, under the seqs the core already counted.
    pub(super) fn restore_outlet(
        &mut self,
        now: Timestamp,
        session: SessionId,
        turn: TurnId,
        items: Vec<QueuedOutput>,
    ) {
        // The image lists the coalescer's batch, then the queue, in seq order. The batch
        // had left the queue, so the two together may hold more than the queue's capacity:
        // the earliest go back to the coalescer, the last `capacity` to the queue, and none
        // is dropped (found by the sweep: swarm, a queue of 1, a crash with two events in
        // the coalescer lost the second).
        let capacity = self.config.delivery_queue_capacity;
        let version = self.version;
        let to_coalescer = items.len().saturating_sub(capacity);
        let mut items = items.into_iter().filter_map(|item| {
            let seq = Seq::new(item.seq)?;
            let kind = kind_of(&UpdateHead::of(item.update.raw()));
            Some((
                seq,
                kind,
                OutputItem {
                    update: item.update,
                    wire_bytes: item.wire_bytes,
                    admitted: version,
                },
            ))
        });
        let mut coalescer = Coalescer::new(self.config.coalescer);
        for (seq, kind, item) in items.by_ref().take(to_coalescer) {
            for batch in coalescer.push(now, StreamEvent::new(seq, kind, item)) {
                self.ready.push_output(session, turn, batch);
            }
        }
        let mut rest = items.peekable();
        let Some(first) = rest
            .peek()
            .map(|(seq, _, _)| *seq)
            .or_else(|| coalescer.pending().last().and_then(|e| e.seq.next()))
        else {
            return;
        };
        let mut queue = NotificationQueue::starting_at(capacity, first);
        for (_, kind, item) in rest {
            if queue.try_push((kind, item)).is_err() {
                // Cannot happen: at most `capacity` items are left for the queue.
                self.stats.anomalies += 1;
            }
        }
        self.outlets.insert(
            session,
            Outlet {
                turn,
                queue,
                coalescer,
            },
        );
    }

    pub(super) fn flush_outlet(&mut self, now: Timestamp, session: SessionId) {
        let Some(outlet) = self.outlets.get_mut(&session) else {
            return;
        };
        while let Some((seq, (kind, item))) = outlet.queue.pop() {
            for batch in outlet
                .coalescer
                .push(now, StreamEvent::new(seq, kind, item))
            {
                self.ready.push_output(session, outlet.turn, batch);
            }
        }
        if let Some(batch) = outlet.coalescer.flush() {
            self.ready.push_output(session, outlet.turn, batch);
        }
    }

    pub(super) fn deliver(&mut self, now: Timestamp, session: SessionId, turn: TurnId, seq: u64) {
        let Some(pending) = self
            .pending_output
            .take()
            .filter(|p| p.session == session && p.turn == turn)
        else {
            // A Deliver without the output that caused it: a core bug, reported as an
            // anomaly rather than a panic.
            self.stats.anomalies += 1;
            return;
        };
        let Some(first) = Seq::new(seq) else {
            self.stats.anomalies += 1;
            return;
        };
        if self.outlets.get(&session).is_some_and(|o| o.turn != turn) {
            self.flush_outlet(now, session);
            self.outlets.remove(&session);
        }
        let capacity = self.config.delivery_queue_capacity;
        let coalescer = self.config.coalescer;
        let mutant = self.driver.core().active_mutant();
        let outlet = self.outlets.get_or_insert_with(session, || Outlet {
            turn,
            queue: NotificationQueue::starting_at(capacity, first).mutated(mutant),
            coalescer: Coalescer::new(coalescer),
        });
        // Admitted now: the state of this version counts it.
        let admitted = self.version;
        let mut item = (
            pending.kind,
            OutputItem {
                admitted,
                ..pending.item
            },
        );
        loop {
            match outlet.queue.try_push(item) {
                Ok(queued) => {
                    debug_assert_eq!(queued.get(), seq, "queue and core number alike");
                    self.stats.outputs_delivered += 1;
                    return;
                }
                Err(PushError::Backpressure(back) | PushError::Closed(back)) => {
                    // The shell reads no agent event while a queue is full, so this does
                    // not happen; if it ever did, the output goes to the caller now rather
                    // than being lost.
                    item = back;
                    self.stats.anomalies += 1;
                    let outlet_turn = outlet.turn;
                    while let Some((s, (k, i))) = outlet.queue.pop() {
                        for batch in outlet.coalescer.push(now, StreamEvent::new(s, k, i)) {
                            self.ready.push_output(session, outlet_turn, batch);
                        }
                    }
                    if outlet.queue.is_closed() {
                        return;
                    }
                }
            }
        }
    }

    pub(super) fn emit(&mut self, event: SessionEvent) {
        self.ready.push(event);
    }

    /// An event that must follow the session's output so far.
    pub(super) fn emit_after_output(&mut self, now: Timestamp, event: SessionEvent) {
        self.flush_outlet(now, event.session());
        self.ready.push(event);
    }
}

pub(super) fn output_event(
    session: SessionId,
    turn: TurnId,
    batch: Batch<OutputItem>,
) -> SessionEvent {
    SessionEvent::Output {
        session,
        turn,
        events: batch
            .into_events()
            .into_iter()
            .map(|e| OutputEvent {
                seq: e.seq.get(),
                kind: e.kind,
                update: e.payload.update,
            })
            .collect(),
    }
}
