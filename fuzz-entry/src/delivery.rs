//! `delivery`: the notification queue, the coalescer and the in-order receiver, driven
//! together as producer, consumer and caller, against a model.
//!
//! An input is a 4-byte header (queue capacity, coalescing delay, events and bytes per
//! batch; each either the default or a small or extreme value, so clamping is exercised)
//! and then [`Op`]s. The model knows every item the producer made, in order. After every
//! operation: both components' `check_invariants`, the queue's length and memory against
//! its capacity, and every emitted batch against the caps and against the model. At the
//! end everything is pumped through and the caller must have received every item the
//! queue accepted, once and in order — and, unless the transport was closed, every item
//! the producer made. A full queue pushes back; it never drops and never closes
//! (compozy #454).

use std::collections::VecDeque;

use arbitrary::Unstructured;
use palisade_core::delivery::{
    Batch, Coalescer, CoalescerConfig, EventKind, InOrderReceiver, NotificationQueue, PayloadLen,
    Receipt, Seq, StreamEvent, DEFAULT_COALESCE_BYTES, DEFAULT_COALESCE_DELAY_MS,
    DEFAULT_COALESCE_EVENTS, DEFAULT_QUEUE_CAPACITY, MAX_COALESCE_BYTES, MAX_COALESCE_EVENTS,
    MAX_QUEUE_CAPACITY, MIN_QUEUE_CAPACITY,
};
use palisade_core::mutants::{ActiveMutant, Mutant};
use palisade_core::time::Timestamp;

use crate::bytes::{byte, u16le, Writer};
use crate::Finding;

const TARGET: &str = "delivery";

/// Items the producer makes per input, at most: enough for several 1,100-item bursts.
pub const MAX_ITEMS: u64 = 20_000;
/// Operations decoded per input, at most.
pub const MAX_OPS: usize = 512;
/// Items of a burst: compozy #454's 1,100 notifications.
pub const BURST: u64 = 1_100;

/// The configuration bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// `% 4 == 0`: the default 1,024; else `/ 4` (0–63, clamped to at least 1); 255: above
    /// the maximum.
    pub capacity: u8,
    /// `% 4 == 0`: the default 25 ms; else `/ 4` ms (0 sends at once); 255: above the max.
    pub delay: u8,
    /// `% 4 == 0`: the default 64; else `/ 4` (0 clamps to 1); 255: above the max.
    pub events: u8,
    /// `% 4`: 0 the default 4,096; 1 `/ 4` bytes; 2 above the max; 3 `/ 4 × 64` bytes.
    pub bytes: u8,
}

impl Header {
    fn capacity(self) -> usize {
        match self.capacity {
            255 => MAX_QUEUE_CAPACITY * 2,
            c if c % 4 == 0 => DEFAULT_QUEUE_CAPACITY,
            c => usize::from(c / 4),
        }
    }

    fn coalescer(self) -> CoalescerConfig {
        CoalescerConfig {
            max_delay_ms: match self.delay {
                255 => u64::MAX,
                d if d % 4 == 0 => DEFAULT_COALESCE_DELAY_MS,
                d => u64::from(d / 4),
            },
            max_events: match self.events {
                255 => usize::MAX,
                e if e % 4 == 0 => DEFAULT_COALESCE_EVENTS,
                e => usize::from(e / 4),
            },
            max_bytes: match self.bytes % 4 {
                0 => DEFAULT_COALESCE_BYTES,
                1 => u64::from(self.bytes / 4),
                2 => u64::MAX,
                _ => u64::from(self.bytes / 4) * 64,
            },
        }
    }

    /// Writes the header.
    pub fn encode(self, w: &mut Writer) {
        w.byte(self.capacity)
            .byte(self.delay)
            .byte(self.events)
            .byte(self.bytes);
    }
}

/// One operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The agent emits `n % 32 + 1` events (255: a burst of [`BURST`]) of kind
    /// `EventKind::ALL[kind % 9]`, each `size` payload bytes.
    Produce {
        /// Count.
        n: u8,
        /// Kind.
        kind: u8,
        /// Payload bytes per event.
        size: u16,
    },
    /// The producer pushes until the queue pushes back.
    PushAll,
    /// The producer pushes `n % 8 + 1` items.
    Push(u8),
    /// The consumer pops `n % 32 + 1` items (255: all) into the coalescer.
    Pop(u8),
    /// Time passes by `ms`; a due batch is emitted.
    Advance(u8),
    /// The stream ends: the pending batch is flushed.
    Flush,
    /// The transport is gone: the queue is closed.
    Close,
    /// The caller sees an already delivered item again (`k` back from the last).
    Duplicate(u8),
    /// The caller sees an item `k + 1` past the next one.
    Gap(u8),
}

impl Op {
    const KINDS: u8 = 9;

    fn decode(u: &mut Unstructured<'_>) -> Op {
        match byte(u) % Op::KINDS {
            0 => Op::Produce {
                n: byte(u),
                kind: byte(u),
                size: u16le(u),
            },
            1 => Op::PushAll,
            2 => Op::Push(byte(u)),
            3 => Op::Pop(byte(u)),
            4 => Op::Advance(byte(u)),
            5 => Op::Flush,
            6 => Op::Close,
            7 => Op::Duplicate(byte(u)),
            _ => Op::Gap(byte(u)),
        }
    }

    /// Writes the operation in the format the decoder reads.
    pub fn encode(self, w: &mut Writer) {
        match self {
            Op::Produce { n, kind, size } => {
                w.byte(0).byte(n).byte(kind).u16le(size);
            }
            Op::PushAll => {
                w.byte(1);
            }
            Op::Push(n) => {
                w.byte(2).byte(n);
            }
            Op::Pop(n) => {
                w.byte(3).byte(n);
            }
            Op::Advance(ms) => {
                w.byte(4).byte(ms);
            }
            Op::Flush => {
                w.byte(5);
            }
            Op::Close => {
                w.byte(6);
            }
            Op::Duplicate(k) => {
                w.byte(7).byte(k);
            }
            Op::Gap(k) => {
                w.byte(8).byte(k);
            }
        }
    }
}

/// Decodes an input.
pub fn decode(data: &[u8]) -> (Header, Vec<Op>) {
    let mut u = Unstructured::new(data);
    let header = Header {
        capacity: byte(&mut u),
        delay: byte(&mut u),
        events: byte(&mut u),
        bytes: byte(&mut u),
    };
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < MAX_OPS {
        ops.push(Op::decode(&mut u));
    }
    (header, ops)
}

/// Encodes a header and operations.
pub fn encode(header: Header, ops: &[Op]) -> Vec<u8> {
    let mut w = Writer::new();
    header.encode(&mut w);
    for op in ops {
        op.encode(&mut w);
    }
    w.into_bytes()
}

/// What the producer made: an ID (its position), a kind and a size.
type Item = (u64, EventKind, PayloadLen);

struct Harness {
    queue: NotificationQueue<Item>,
    coalescer: Coalescer<PayloadLen>,
    receiver: InOrderReceiver,
    config: CoalescerConfig,
    capacity: usize,
    reserved: usize,
    now: Timestamp,
    /// Items made and not yet accepted by the queue, oldest first.
    outbox: VecDeque<Item>,
    made: u64,
    /// The model of the queue: what it must hold.
    queued: VecDeque<(Seq, Item)>,
    /// Items accepted by the queue so far (the next one gets `accepted + 1`).
    accepted: u64,
    /// Arrival time of each event in the coalescer, by sequence number (index seq − 1).
    arrivals: Vec<Timestamp>,
    /// Items handed to the caller, in order.
    delivered: Vec<Item>,
    /// Sequence number of the last event the coalescer emitted.
    emitted: u64,
    closed: bool,
    op: Option<usize>,
}

impl Harness {
    fn fail(&self, rule: &str, detail: String) -> Finding {
        Finding {
            step: self.op,
            ..Finding::new(TARGET, rule, detail)
        }
    }

    fn produce(&mut self, n: u64, kind: EventKind, size: u16) {
        for _ in 0..n.min(MAX_ITEMS - self.made) {
            self.outbox
                .push_back((self.made, kind, PayloadLen(u32::from(size))));
            self.made += 1;
        }
    }

    /// Offers the oldest waiting item; `false` when the queue did not take it.
    fn push_one(&mut self) -> Result<bool, Finding> {
        let Some(item) = self.outbox.pop_front() else {
            return Ok(false);
        };
        let full = self.queued.len() >= self.capacity;
        match self.queue.try_push(item) {
            Ok(seq) => {
                if self.closed || full {
                    return Err(self.fail(
                        "delivery-no-loss",
                        format!(
                            "a push into a {} queue ({} of {}) answered Ok({seq}): the item is lost",
                            if self.closed { "closed" } else { "full" },
                            self.queued.len(),
                            self.capacity
                        ),
                    ));
                }
                if seq.get() != self.accepted + 1 {
                    return Err(self.fail(
                        "delivery-contiguous",
                        format!("item {} got {seq}, expected #{}", item.0, self.accepted + 1),
                    ));
                }
                self.accepted += 1;
                self.queued.push_back((seq, item));
                Ok(true)
            }
            Err(e) => {
                let backpressure = e.is_backpressure();
                let back = e.into_inner();
                if back != item {
                    return Err(self.fail(
                        "delivery-no-loss",
                        format!("a refused push handed back {back:?}, not {item:?}"),
                    ));
                }
                self.outbox.push_front(back);
                match (backpressure, self.closed, full) {
                    (true, false, true) => Ok(false),
                    (false, true, _) => Ok(false),
                    (false, false, true) => Err(self.fail(
                        "delivery-never-closes-when-full",
                        format!(
                            "the queue closed because it was full ({} of {}): compozy #454",
                            self.queued.len(),
                            self.capacity
                        ),
                    )),
                    _ => Err(self.fail(
                        "delivery-refusal",
                        format!(
                            "push refused ({}) with {} of {} queued, closed: {}",
                            if backpressure {
                                "backpressure"
                            } else {
                                "closed"
                            },
                            self.queued.len(),
                            self.capacity,
                            self.closed
                        ),
                    )),
                }
            }
        }
    }

    fn pop_one(&mut self) -> Result<bool, Finding> {
        let got = self.queue.pop();
        let want = self.queued.pop_front();
        if got != want {
            return Err(self.fail(
                "delivery-fifo",
                format!("popped {got:?}, the model holds {want:?}"),
            ));
        }
        let Some((seq, (_, kind, payload))) = got else {
            return Ok(false);
        };
        self.arrivals.push(self.now);
        let batches = self
            .coalescer
            .push(self.now, StreamEvent::new(seq, kind, payload));
        for b in batches {
            self.deliver(b)?;
        }
        Ok(true)
    }

    /// Checks a batch against the caps and the model, then hands it to the caller.
    fn deliver(&mut self, b: Batch<PayloadLen>) -> Result<(), Finding> {
        let events = b.events();
        if events.is_empty() {
            return Err(self.fail("coalescer-batch", "an empty batch".to_owned()));
        }
        if events.len() > self.config.max_events {
            return Err(self.fail(
                "coalescer-max-events",
                format!("{} events, cap {}", events.len(), self.config.max_events),
            ));
        }
        let sum: u64 = events.iter().map(|e| u64::from(e.payload.0)).sum();
        if sum != b.payload_bytes() {
            return Err(self.fail(
                "coalescer-bytes-counted",
                format!(
                    "batch says {} bytes, its events hold {sum}",
                    b.payload_bytes()
                ),
            ));
        }
        if events.len() > 1 && sum > self.config.max_bytes {
            return Err(self.fail(
                "coalescer-max-bytes",
                format!(
                    "{} events with {sum} bytes, cap {}",
                    events.len(),
                    self.config.max_bytes
                ),
            ));
        }
        if events.len() > 1 && events.iter().any(|e| e.kind.is_terminal()) {
            return Err(self.fail(
                "coalescer-terminal-alone",
                format!(
                    "a terminal event coalesced with {} others",
                    events.len() - 1
                ),
            ));
        }
        let opened = b.opened_at();
        let deadline = opened.plus_millis(self.config.max_delay_ms);
        for e in events {
            if e.seq.get() != self.emitted + 1 {
                return Err(self.fail(
                    "coalescer-order",
                    format!("emitted {} after #{}", e.seq, self.emitted),
                ));
            }
            self.emitted += 1;
            let arrived = usize::try_from(e.seq.get() - 1)
                .ok()
                .and_then(|i| self.arrivals.get(i).copied());
            if arrived.is_none_or(|t| t < opened || t > deadline) {
                return Err(self.fail(
                    "coalescer-deadline",
                    format!(
                        "{} arrived at {arrived:?}, in a batch opened at {opened} and due at {deadline}",
                        e.seq
                    ),
                ));
            }
            let expected = self.receiver.next_expected();
            match self.receiver.accept(e.seq, e.kind) {
                Receipt::Delivered(kind) if kind == e.kind => {
                    let index = e.seq.get() - 1;
                    self.delivered.push((index, kind, e.payload));
                }
                other => {
                    return Err(self.fail(
                        "delivery-in-order",
                        format!(
                            "the caller expected {expected:?} and got {} as {other:?}",
                            e.seq
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), Finding> {
        self.queue
            .check_invariants()
            .map_err(|v| self.fail("queue-invariant", v.to_string()))?;
        self.coalescer
            .check_invariants()
            .map_err(|v| self.fail("coalescer-invariant", v.to_string()))?;
        if self.queue.len() != self.queued.len() || self.queue.len() > self.capacity {
            return Err(self.fail(
                "queue-bounded",
                format!(
                    "the queue holds {}, the model {}, capacity {}",
                    self.queue.len(),
                    self.queued.len(),
                    self.capacity
                ),
            ));
        }
        if self.queue.reserved_slots() != self.reserved {
            return Err(self.fail(
                "queue-memory",
                format!(
                    "storage grew from {} to {} slots",
                    self.reserved,
                    self.queue.reserved_slots()
                ),
            ));
        }
        if self.queue.is_closed() != self.closed {
            return Err(self.fail(
                "delivery-never-closes-when-full",
                format!(
                    "the queue is {} but the transport is {}",
                    if self.queue.is_closed() {
                        "closed"
                    } else {
                        "open"
                    },
                    if self.closed { "gone" } else { "up" }
                ),
            ));
        }
        if self.coalescer.poll_timeout().is_some() != (self.coalescer.pending_len() > 0) {
            return Err(self.fail(
                "coalescer-timer",
                "a pending batch without a timer, or a timer without one".to_owned(),
            ));
        }
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), Finding> {
        match op {
            Op::Produce { n, kind, size } => {
                let n = if n == u8::MAX {
                    BURST
                } else {
                    u64::from(n % 32) + 1
                };
                let kind = EventKind::ALL[usize::from(kind) % EventKind::ALL.len()];
                self.produce(n, kind, size);
            }
            Op::PushAll => while self.push_one()? {},
            Op::Push(n) => {
                for _ in 0..=(n % 8) {
                    self.push_one()?;
                }
            }
            Op::Pop(n) => {
                let n = if n == u8::MAX {
                    usize::MAX
                } else {
                    usize::from(n % 32) + 1
                };
                for _ in 0..n {
                    if !self.pop_one()? {
                        break;
                    }
                }
            }
            Op::Advance(ms) => {
                self.now = self.now.plus_millis(u64::from(ms));
                if self.coalescer.poll_timeout().is_some_and(|t| t <= self.now) {
                    match self.coalescer.handle_timeout(self.now) {
                        Some(b) => self.deliver(b)?,
                        None => {
                            return Err(self.fail(
                                "coalescer-timer",
                                format!("a batch due at or before {} was not emitted", self.now),
                            ))
                        }
                    }
                }
            }
            Op::Flush => {
                if let Some(b) = self.coalescer.flush() {
                    self.deliver(b)?;
                }
            }
            Op::Close => {
                self.queue.close();
                self.closed = true;
            }
            Op::Duplicate(k) => {
                let last = self.receiver.last_delivered().map_or(0, |s| s.get());
                if let Some(seq) = last.checked_sub(u64::from(k)).and_then(Seq::new) {
                    let before = self.receiver.next_expected();
                    let got = self.receiver.accept(seq, ());
                    if got != (Receipt::Duplicate { seq })
                        || self.receiver.next_expected() != before
                    {
                        return Err(self.fail(
                            "receiver-duplicate",
                            format!("{seq} again after #{last}: {got:?}"),
                        ));
                    }
                }
            }
            Op::Gap(k) => {
                if let Some(expected) = self.receiver.next_expected() {
                    if let Some(seq) = expected
                        .get()
                        .checked_add(u64::from(k) + 1)
                        .and_then(Seq::new)
                    {
                        let got = self.receiver.accept(seq, ());
                        let gap = Receipt::Gap {
                            expected,
                            got: seq,
                            item: (),
                        };
                        if got != gap || self.receiver.next_expected() != Some(expected) {
                            return Err(self.fail(
                                "receiver-gap",
                                format!("{seq} while expecting {expected}: {got:?}"),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Pumps everything through and checks nothing was lost.
    fn finish(&mut self) -> Result<(), Finding> {
        self.op = None;
        // Each round either moves an item or ends: at most one round per item, plus one.
        for _ in 0..=MAX_ITEMS {
            let pushed = self.push_one()?;
            let popped = self.pop_one()?;
            if !pushed && !popped {
                break;
            }
        }
        while self.pop_one()? {}
        if let Some(b) = self.coalescer.flush() {
            self.deliver(b)?;
        }
        self.check()?;
        if self.delivered.len() as u64 != self.accepted {
            return Err(self.fail(
                "delivery-no-loss",
                format!(
                    "the queue accepted {} items, the caller got {}",
                    self.accepted,
                    self.delivered.len()
                ),
            ));
        }
        if !self.closed && (self.accepted != self.made || !self.outbox.is_empty()) {
            return Err(self.fail(
                "delivery-no-loss",
                format!(
                    "the producer made {} items, the queue accepted {}",
                    self.made, self.accepted
                ),
            ));
        }
        for (i, item) in self.delivered.iter().enumerate() {
            if item.0 != i as u64 {
                return Err(self.fail(
                    "delivery-in-order",
                    format!("position {i} holds item {}", item.0),
                ));
            }
        }
        Ok(())
    }
}

/// The `delivery` entry point.
pub fn run(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    let (header, ops) = decode(data);
    let active = mutant.map_or(ActiveMutant::NONE, ActiveMutant::on);
    let queue = NotificationQueue::with_mutant(header.capacity(), active);
    let capacity = header
        .capacity()
        .clamp(MIN_QUEUE_CAPACITY, MAX_QUEUE_CAPACITY);
    let asked = header.coalescer();
    let coalescer = Coalescer::new(asked);
    let config = coalescer.config();
    let mut h = Harness {
        reserved: queue.reserved_slots(),
        queue,
        coalescer,
        receiver: InOrderReceiver::new(),
        config,
        capacity,
        now: Timestamp::ZERO,
        outbox: VecDeque::new(),
        made: 0,
        queued: VecDeque::new(),
        accepted: 0,
        arrivals: Vec::new(),
        delivered: Vec::new(),
        emitted: 0,
        closed: false,
        op: None,
    };
    if h.queue.capacity() != capacity {
        return Err(h.fail(
            "queue-capacity",
            format!("asked {}, got {capacity}", h.queue.capacity()),
        ));
    }
    if config.max_events > MAX_COALESCE_EVENTS
        || config.max_bytes > MAX_COALESCE_BYTES
        || config.max_events == 0
        || config.max_bytes == 0
    {
        return Err(h.fail(
            "coalescer-config",
            format!("{asked:?} was clamped to {config:?}"),
        ));
    }
    if h.reserved < capacity {
        return Err(h.fail(
            "queue-memory",
            format!("{} slots reserved for a capacity of {capacity}", h.reserved),
        ));
    }
    for (i, op) in ops.into_iter().enumerate() {
        h.op = Some(i);
        if crate::trace_enabled() {
            eprintln!("op {op:?}");
        }
        h.apply(op)?;
        h.check()?;
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_round_trip_through_their_encoding() {
        let header = Header {
            capacity: 17,
            delay: 255,
            events: 6,
            bytes: 3,
        };
        let ops = vec![
            Op::Produce {
                n: 255,
                kind: 2,
                size: 900,
            },
            Op::PushAll,
            Op::Push(3),
            Op::Pop(255),
            Op::Advance(30),
            Op::Flush,
            Op::Close,
            Op::Duplicate(2),
            Op::Gap(0),
        ];
        assert_eq!(decode(&encode(header, &ops)), (header, ops));
    }
}
