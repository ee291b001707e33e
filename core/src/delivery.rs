//! Lossless delivery: a bounded queue that pushes back instead of dropping, a coalescer
//! that batches stream events under hard caps, and a receiver that proves the caller saw
//! every event once, in order (rule 9, `docs/design.md`).
//!
//! Compozy #454 is the reason this module exists. A burst of tool events overflowed the
//! ACP SDK's fixed queue of 1,024 notifications; the SDK closed the connection, the
//! provider later exited cleanly, and the session could not be recovered. The review of the
//! fix then found that its coalescer counted only text bytes, so tool and resource events
//! slipped past the 4,096-byte cap. Here:
//!
//! - [`NotificationQueue`] is bounded. When it is full it hands the item back as
//!   [`PushError::Backpressure`] and the producer waits; it never drops an item and only
//!   closes when told to ([`NotificationQueue::close`], e.g. the transport is gone). Every
//!   accepted item gets the next [`Seq`], starting at [`Seq::FIRST`], without gaps.
//! - [`Coalescer`] batches [`StreamEvent`]s. It measures every payload through
//!   [`Payload::byte_len`], whatever the [`EventKind`], so no kind can bypass the byte cap.
//!   A batch holds at most `max_events` events and `max_bytes` bytes (a single larger event
//!   goes alone), is due `max_delay_ms` after its first event, and a terminal event is
//!   never coalesced: the pending batch is flushed before it.
//! - [`InOrderReceiver`] sits at the caller. It delivers the next sequence number, drops a
//!   duplicate, and reports a gap without changing its state.
//!
//! Nothing here reads a clock or does I/O: time enters as `now`, and "waiting" means the
//! caller keeps the item it got back and offers it again after a [`NotificationQueue::pop`].
//!
//! # The embedder's toolkit, not the fence
//!
//! This module is not part of the fence. [`crate::Core`] neither uses nor knows it: the core
//! decides who may act and numbers the events it admits ([`crate::Effect::Deliver`]), and
//! keeping rule 9 — getting every event to the caller once, in order, under backpressure —
//! is the embedder's job, done with these parts (`palisade-embed`'s engine builds each
//! session's outlet from them). They share only [`Timestamp`] and the `mutants` switch
//! ([`crate::Core::active_mutant`] hands an embedder's queues the mutant in force) with
//! the core; they live in this crate so that a re-created delivery bug
//! (`queue-overflow-closes`, `backpressure-skips-seq`) sits behind the same feature as the
//! fence's.
//!
//! # Order of calls
//!
//! Producer: [`NotificationQueue::try_push`]; on `Backpressure` keep the item and retry
//! after the consumer pops. Consumer: [`NotificationQueue::pop`], then
//! [`Coalescer::push`] and drain the returned [`Batches`] (up to two) after every input;
//! arm a timer at [`Coalescer::poll_timeout`] and call [`Coalescer::handle_timeout`] when
//! it fires; call [`Coalescer::flush`] when the stream ends. Caller: feed each batch's
//! events to [`InOrderReceiver::accept`].
//!
//! ```
//! use std::collections::VecDeque;
//! use palisade_core::delivery::{
//!     Coalescer, CoalescerConfig, EventKind, InOrderReceiver, NotificationQueue, PayloadLen,
//!     PushError, Receipt, StreamEvent,
//! };
//! use palisade_core::time::Timestamp;
//!
//! // The agent emits ten tool calls and a final `Done` in one burst; the queue holds four.
//! let mut outbox: VecDeque<(EventKind, PayloadLen)> =
//!     (0..10).map(|_| (EventKind::ToolCall, PayloadLen(900))).collect();
//! outbox.push_back((EventKind::Done, PayloadLen(0)));
//! let mut queue = NotificationQueue::new(4);
//! let mut coalescer = Coalescer::new(CoalescerConfig::default());
//! let mut receiver = InOrderReceiver::new();
//! let mut shown = Vec::new();
//! let mut now = Timestamp::ZERO;
//!
//! while !outbox.is_empty() || !queue.is_empty() || coalescer.poll_timeout().is_some() {
//!     // Producer: push until the queue pushes back; a refused item is kept, never dropped.
//!     while let Some(item) = outbox.pop_front() {
//!         match queue.try_push(item) {
//!             Ok(_seq) => {}
//!             Err(PushError::Backpressure(item)) => {
//!                 outbox.push_front(item);
//!                 break;
//!             }
//!             Err(PushError::Closed(_)) => return, // The transport is gone.
//!         }
//!     }
//!     // Consumer: everything queued goes through the coalescer; drain after every input.
//!     let mut batches = Vec::new();
//!     while let Some((seq, (kind, payload))) = queue.pop() {
//!         batches.extend(coalescer.push(now, StreamEvent::new(seq, kind, payload)));
//!     }
//!     now = now.plus_millis(10);
//!     if coalescer.poll_timeout().is_some_and(|due| due <= now) {
//!         batches.extend(coalescer.handle_timeout(now));
//!     }
//!     // Caller: every event must be the next one.
//!     for batch in batches {
//!         assert!(batch.payload_bytes() <= 4_096); // 900-byte tool calls count too.
//!         for event in batch.into_events() {
//!             match receiver.accept(event.seq, event.kind) {
//!                 Receipt::Delivered(kind) => shown.push(kind),
//!                 other => panic!("lost or repeated: {other:?}"),
//!             }
//!         }
//!     }
//! }
//! assert_eq!(shown.len(), 11);
//! assert_eq!(shown.last(), Some(&EventKind::Done));
//! assert!(!queue.is_closed());
//! ```

use std::collections::VecDeque;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::mutants::{mutant_on, ActiveMutant};
use crate::time::Timestamp;

// ---------------------------------------------------------------------------------------
// Bounds
// ---------------------------------------------------------------------------------------

/// Default queue capacity: the ACP SDK's fixed queue in compozy #454, which the
/// overflow scenario bursts 1,100 notifications against.
pub const DEFAULT_QUEUE_CAPACITY: usize = 1_024;
/// Smallest queue capacity: a queue that holds nothing would push back forever.
pub const MIN_QUEUE_CAPACITY: usize = 1;
/// Largest queue capacity: caps one session's buffered notifications; a consumer that needs
/// more is stuck, and backpressure must make that visible rather than memory growth.
pub const MAX_QUEUE_CAPACITY: usize = 65_536;

/// Default coalescing delay (compozy's 25 ms): short enough that a reader sees no stall,
/// long enough to merge a burst of tokens.
pub const DEFAULT_COALESCE_DELAY_MS: u64 = 25;
/// Longest coalescing delay: output held back for more than a second no longer streams.
pub const MAX_COALESCE_DELAY_MS: u64 = 1_000;
/// Default events per batch (compozy's 64): one UI update per burst, not one per token.
pub const DEFAULT_COALESCE_EVENTS: usize = 64;
/// Most events per batch: a batch never holds more than a default queue's worth.
pub const MAX_COALESCE_EVENTS: usize = DEFAULT_QUEUE_CAPACITY;
/// Default payload bytes per batch (compozy's 4,096): one small frame per update.
pub const DEFAULT_COALESCE_BYTES: u64 = 4_096;
/// Most payload bytes per batch: one batch must fit one transport frame (1 MiB).
pub const MAX_COALESCE_BYTES: u64 = 1 << 20;
/// Batches one [`Coalescer::push`] can emit: the pending batch, then the one holding (or
/// being) the new event.
pub const BATCHES_PER_PUSH: usize = 2;

const _: () = assert!(MIN_QUEUE_CAPACITY >= 1);
const _: () = assert!(MIN_QUEUE_CAPACITY <= DEFAULT_QUEUE_CAPACITY);
const _: () = assert!(DEFAULT_QUEUE_CAPACITY <= MAX_QUEUE_CAPACITY);
const _: () = assert!(DEFAULT_COALESCE_DELAY_MS <= MAX_COALESCE_DELAY_MS);
const _: () =
    assert!(1 <= DEFAULT_COALESCE_EVENTS && DEFAULT_COALESCE_EVENTS <= MAX_COALESCE_EVENTS);
const _: () = assert!(1 <= DEFAULT_COALESCE_BYTES && DEFAULT_COALESCE_BYTES <= MAX_COALESCE_BYTES);

// ---------------------------------------------------------------------------------------
// Sequence numbers
// ---------------------------------------------------------------------------------------

/// The position of a notification in its stream: 1 for the first, then contiguous.
///
/// Zero is never a valid `Seq`; [`Seq::new`] and deserialization refuse it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Seq(u64);

impl Seq {
    /// The first sequence number of a stream.
    pub const FIRST: Seq = Seq(1);

    /// `raw` as a sequence number, or `None` for zero.
    pub const fn new(raw: u64) -> Option<Seq> {
        if raw == 0 {
            None
        } else {
            Some(Seq(raw))
        }
    }

    /// The raw number (at least 1).
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The following sequence number, or `None` once the 64-bit space is used up.
    pub const fn next(self) -> Option<Seq> {
        match self.0.checked_add(1) {
            Some(raw) => Some(Seq(raw)),
            None => None,
        }
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl From<Seq> for u64 {
    fn from(seq: Seq) -> u64 {
        seq.0
    }
}

impl TryFrom<u64> for Seq {
    type Error = ZeroSeq;

    fn try_from(raw: u64) -> Result<Seq, ZeroSeq> {
        Seq::new(raw).ok_or(ZeroSeq)
    }
}

/// A zero was offered as a [`Seq`]; sequence numbers start at 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroSeq;

impl fmt::Display for ZeroSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sequence numbers start at 1; 0 is not valid")
    }
}

impl std::error::Error for ZeroSeq {}

// ---------------------------------------------------------------------------------------
// Notification queue
// ---------------------------------------------------------------------------------------

/// Why [`NotificationQueue::try_push`] did not take an item. The item always comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError<T> {
    /// The queue is full. Keep the item and offer it again after the consumer pops: this is
    /// backpressure, not an error of the stream, and the queue stays open.
    Backpressure(T),
    /// The queue was closed (the transport is gone); nothing more will be accepted. Stop
    /// producing; items already accepted can still be popped.
    Closed(T),
}

impl<T> PushError<T> {
    /// The item that was not accepted.
    pub fn into_inner(self) -> T {
        match self {
            PushError::Backpressure(item) | PushError::Closed(item) => item,
        }
    }

    /// True when the queue was merely full and the push should be retried later.
    pub const fn is_backpressure(&self) -> bool {
        matches!(self, PushError::Backpressure(_))
    }
}

impl<T> fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Backpressure(_) => f.write_str("notification queue full; retry after a pop"),
            PushError::Closed(_) => f.write_str("notification queue closed"),
        }
    }
}

impl<T: fmt::Debug> std::error::Error for PushError<T> {}

/// Counters of a [`NotificationQueue`] since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Items accepted (each got a sequence number).
    pub pushed: u64,
    /// Items handed to the consumer.
    pub popped: u64,
    /// Pushes refused because the queue was full (each retry counts again).
    pub backpressure_events: u64,
    /// Pushes refused because the queue was closed.
    pub closed_rejections: u64,
    /// The most items the queue ever held at once; never above the capacity.
    pub high_water: usize,
}

/// A bounded FIFO of notifications that applies backpressure and never loses one.
///
/// A full queue refuses a push with [`PushError::Backpressure`], handing the item back;
/// it neither drops it nor closes. Only [`NotificationQueue::close`] closes the queue, and
/// items accepted before that can still be popped. Storage for `capacity` items is
/// reserved up front and never grows, so memory is bounded by the capacity.
#[derive(Debug)]
pub struct NotificationQueue<T> {
    items: VecDeque<(Seq, T)>,
    capacity: usize,
    /// The number the next accepted item gets; `None` once the 64-bit space is used up.
    next_seq: Option<Seq>,
    closed: bool,
    stats: QueueStats,
    mutant: ActiveMutant,
}

impl<T> Default for NotificationQueue<T> {
    fn default() -> Self {
        NotificationQueue::new(DEFAULT_QUEUE_CAPACITY)
    }
}

impl<T> NotificationQueue<T> {
    /// An empty, open queue holding at most `capacity` items, numbered from [`Seq::FIRST`].
    ///
    /// `capacity` is clamped to `MIN_QUEUE_CAPACITY..=MAX_QUEUE_CAPACITY`; see
    /// [`NotificationQueue::capacity`] for the value in force.
    pub fn new(capacity: usize) -> Self {
        NotificationQueue::starting_at(capacity, Seq::FIRST)
    }

    /// Like [`NotificationQueue::new`], but the first accepted item gets `first`.
    ///
    /// For a stream that continues after recovery: numbering carries on where the caller's
    /// [`InOrderReceiver`] expects it, so nothing is mistaken for a duplicate.
    pub fn starting_at(capacity: usize, first: Seq) -> Self {
        let capacity = capacity.clamp(MIN_QUEUE_CAPACITY, MAX_QUEUE_CAPACITY);
        NotificationQueue {
            items: VecDeque::with_capacity(capacity),
            capacity,
            next_seq: Some(first),
            closed: false,
            stats: QueueStats::default(),
            mutant: ActiveMutant::NONE,
        }
    }

    /// Test-only: a queue with a re-created bug switched on (feature `mutants`). With
    /// `QueueOverflowCloses`, a push into a full queue closes the queue and the item is
    /// refused as [`PushError::Closed`], as the ACP SDK did in compozy #454. Production
    /// code uses [`NotificationQueue::new`].
    pub fn with_mutant(capacity: usize, mutant: ActiveMutant) -> Self {
        NotificationQueue {
            mutant,
            ..NotificationQueue::new(capacity)
        }
    }

    /// The same queue with `mutant` in force (feature `mutants`; without it the queue is
    /// unchanged): how an embedder's queue carries its core's re-created bug.
    #[must_use]
    pub fn mutated(mut self, mutant: ActiveMutant) -> Self {
        self.mutant = mutant;
        self
    }

    /// Offers `item` to the queue; on success returns its sequence number.
    ///
    /// A full queue returns [`PushError::Backpressure`] with the item and stays open; the
    /// producer must keep the item and retry after a pop. A closed queue returns
    /// [`PushError::Closed`]. A refused push changes nothing but the counters.
    pub fn try_push(&mut self, item: T) -> Result<Seq, PushError<T>> {
        if self.closed {
            self.stats.closed_rejections = self.stats.closed_rejections.saturating_add(1);
            return Err(PushError::Closed(item));
        }
        if self.items.len() >= self.capacity {
            if mutant_on!(self.mutant, QueueOverflowCloses) {
                // Compozy #454: the SDK closed the connection when its queue was full, so
                // this notification and every later one never reached the client.
                self.closed = true;
                self.stats.closed_rejections = self.stats.closed_rejections.saturating_add(1);
                return Err(PushError::Closed(item));
            }
            self.stats.backpressure_events = self.stats.backpressure_events.saturating_add(1);
            return Err(PushError::Backpressure(item));
        }
        let Some(seq) = self.next_seq else {
            // Only reachable after 2^64 - 1 items (or `starting_at` near the top). Reusing a
            // number would make the receiver drop the item as a duplicate, so the stream
            // ends here instead; this is exhaustion, not fullness.
            self.closed = true;
            self.stats.closed_rejections = self.stats.closed_rejections.saturating_add(1);
            return Err(PushError::Closed(item));
        };
        self.next_seq = seq.next();
        self.items.push_back((seq, item));
        if self.items.len() >= self.capacity && mutant_on!(self.mutant, BackpressureSkipsSeq) {
            // The bug: the push that fills the queue (backpressure starts) numbers the next
            // item in advance for the producer it will refuse, and that number is lost, so
            // the first item after backpressure comes one number late.
            self.next_seq = self.next_seq.and_then(Seq::next);
        }
        self.stats.pushed = self.stats.pushed.saturating_add(1);
        self.stats.high_water = self.stats.high_water.max(self.items.len());
        Ok(seq)
    }

    /// The oldest item and its sequence number, or `None` when empty.
    ///
    /// Popping makes room: a producer holding a refused item should retry now.
    #[must_use]
    pub fn pop(&mut self) -> Option<(Seq, T)> {
        let entry = self.items.pop_front()?;
        self.stats.popped = self.stats.popped.saturating_add(1);
        Some(entry)
    }

    /// The queued items, oldest first, with their sequence numbers (to persist them).
    pub fn iter(&self) -> impl Iterator<Item = (Seq, &T)> {
        self.items.iter().map(|(seq, item)| (*seq, item))
    }

    /// Closes the queue: later pushes get [`PushError::Closed`]; queued items can still
    /// be popped. Call it when the transport is gone, never because the queue is full.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// True once [`NotificationQueue::close`] was called (or the sequence space ran out).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Items waiting to be popped.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing waits to be popped.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// True when a push would meet backpressure.
    pub fn is_full(&self) -> bool {
        // Compozy #454's queue never pushed back: it looked ready until it overflowed, and
        // then it closed.
        self.items.len() >= self.capacity && !mutant_on!(self.mutant, QueueOverflowCloses)
    }

    /// The most items the queue holds (after clamping).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Item slots allocated. Reserved at construction and never grown: memory stays
    /// bounded by [`NotificationQueue::capacity`].
    pub fn reserved_slots(&self) -> usize {
        self.items.capacity()
    }

    /// The sequence number the next accepted item will get; `None` once used up.
    pub fn next_seq(&self) -> Option<Seq> {
        self.next_seq
    }

    /// Counters since the queue was made.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Checks the queue's invariants; cheap (constant time), so a simulator can call it
    /// after every step.
    pub fn check_invariants(&self) -> Result<(), DeliveryViolation> {
        let len = self.items.len();
        if len > self.capacity || self.capacity > MAX_QUEUE_CAPACITY {
            return Err(DeliveryViolation::QueueOverCapacity);
        }
        if self.stats.high_water > self.capacity || self.stats.high_water < len {
            return Err(DeliveryViolation::QueueHighWaterWrong);
        }
        let popped_plus_len = u128::from(self.stats.popped) + len as u128;
        if popped_plus_len != u128::from(self.stats.pushed) {
            return Err(DeliveryViolation::QueueCountsDisagree);
        }
        // Numbers are contiguous: the queue holds exactly the `len` numbers before `next_seq`.
        let next = self
            .next_seq
            .map_or(u128::from(u64::MAX) + 1, |s| u128::from(s.get()));
        let front_ok = self
            .items
            .front()
            .is_none_or(|(seq, _)| u128::from(seq.get()) + len as u128 == next);
        let back_ok = self
            .items
            .back()
            .is_none_or(|(seq, _)| u128::from(seq.get()) + 1 == next);
        if !front_ok || !back_ok {
            return Err(DeliveryViolation::QueueSeqNotContiguous);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Stream events
// ---------------------------------------------------------------------------------------

/// What a stream event carries, as the agent reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// Assistant text.
    Text,
    /// Assistant reasoning.
    Thought,
    /// A tool call started.
    ToolCall,
    /// A tool call progressed or finished.
    ToolUpdate,
    /// A resource (file, link, embedded content).
    Resource,
    /// The agent's plan.
    Plan,
    /// Anything else the agent sent during the turn.
    Other,
    /// The turn finished. Terminal: never coalesced.
    Done,
    /// The turn failed. Terminal: never coalesced.
    Failed,
}

impl EventKind {
    /// Every kind, in a fixed order.
    pub const ALL: [EventKind; 9] = [
        EventKind::Text,
        EventKind::Thought,
        EventKind::ToolCall,
        EventKind::ToolUpdate,
        EventKind::Resource,
        EventKind::Plan,
        EventKind::Other,
        EventKind::Done,
        EventKind::Failed,
    ];

    /// True for events that end the turn; the coalescer flushes before them and sends
    /// them alone.
    pub const fn is_terminal(self) -> bool {
        matches!(self, EventKind::Done | EventKind::Failed)
    }
}

/// A payload the coalescer can measure. Every kind of event is measured the same way, so
/// no kind can slip past the byte cap (the compozy #454 review finding).
pub trait Payload {
    /// The payload's size in bytes, as it will count against
    /// [`CoalescerConfig::max_bytes`].
    fn byte_len(&self) -> usize;
}

/// A payload known only by its size: for the simulator and benchmarks, where the bytes
/// themselves do not matter.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct PayloadLen(pub u32);

impl Payload for PayloadLen {
    fn byte_len(&self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl Payload for Vec<u8> {
    fn byte_len(&self) -> usize {
        self.len()
    }
}

impl Payload for Box<[u8]> {
    fn byte_len(&self) -> usize {
        self.len()
    }
}

impl Payload for String {
    fn byte_len(&self) -> usize {
        self.len()
    }
}

impl Payload for Box<str> {
    fn byte_len(&self) -> usize {
        self.len()
    }
}

/// One event of a turn's output stream, numbered by the [`NotificationQueue`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamEvent<P> {
    /// Its position in the stream.
    pub seq: Seq,
    /// What it carries.
    pub kind: EventKind,
    /// The content; its whole size counts toward the batch byte cap.
    pub payload: P,
}

impl<P: Payload> StreamEvent<P> {
    /// An event at `seq`.
    pub fn new(seq: Seq, kind: EventKind, payload: P) -> Self {
        StreamEvent { seq, kind, payload }
    }

    /// The bytes this event counts toward a batch, whatever its kind.
    pub fn payload_bytes(&self) -> u64 {
        u64::try_from(self.payload.byte_len()).unwrap_or(u64::MAX)
    }
}

// ---------------------------------------------------------------------------------------
// Coalescer
// ---------------------------------------------------------------------------------------

/// Limits on one batch. Values out of range are clamped by [`CoalescerConfig::clamped`]
/// when a [`Coalescer`] is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoalescerConfig {
    /// A batch is due this long after its first event (`0..=MAX_COALESCE_DELAY_MS`; zero
    /// sends every event at once).
    pub max_delay_ms: u64,
    /// Most events in a batch (`1..=MAX_COALESCE_EVENTS`).
    pub max_events: usize,
    /// Most payload bytes in a batch, every kind counted (`1..=MAX_COALESCE_BYTES`). A
    /// single larger event goes alone.
    pub max_bytes: u64,
}

impl Default for CoalescerConfig {
    fn default() -> Self {
        CoalescerConfig {
            max_delay_ms: DEFAULT_COALESCE_DELAY_MS,
            max_events: DEFAULT_COALESCE_EVENTS,
            max_bytes: DEFAULT_COALESCE_BYTES,
        }
    }
}

impl CoalescerConfig {
    /// This config with every field brought into its documented range.
    #[must_use]
    pub fn clamped(self) -> Self {
        CoalescerConfig {
            max_delay_ms: self.max_delay_ms.min(MAX_COALESCE_DELAY_MS),
            max_events: self.max_events.clamp(1, MAX_COALESCE_EVENTS),
            max_bytes: self.max_bytes.clamp(1, MAX_COALESCE_BYTES),
        }
    }
}

/// Why a batch was emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FlushReason {
    /// It reached `max_delay_ms` after its first event.
    Deadline,
    /// It reached `max_events`, or the next event would have exceeded it.
    MaxEvents,
    /// It reached `max_bytes`, or the next event would have exceeded it; or it is one
    /// event larger than the cap.
    MaxBytes,
    /// A terminal event arrived; the pending events go first.
    BeforeTerminal,
    /// The terminal event itself, alone.
    Terminal,
    /// The caller asked ([`Coalescer::flush`]).
    Explicit,
}

/// Events emitted together, in stream order. Never empty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Batch<P> {
    events: Vec<StreamEvent<P>>,
    payload_bytes: u64,
    opened_at: Timestamp,
    reason: FlushReason,
}

impl<P> Batch<P> {
    /// The events, in stream order.
    pub fn events(&self) -> &[StreamEvent<P>] {
        &self.events
    }

    /// The events, by value.
    pub fn into_events(self) -> Vec<StreamEvent<P>> {
        self.events
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Always false: an empty batch is never emitted.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Sum of every event's payload bytes, whatever its kind.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }

    /// When the first event entered the coalescer.
    pub fn opened_at(&self) -> Timestamp {
        self.opened_at
    }

    /// Why it was emitted.
    pub fn reason(&self) -> FlushReason {
        self.reason
    }

    /// The first event's sequence number.
    pub fn first_seq(&self) -> Option<Seq> {
        self.events.first().map(|e| e.seq)
    }

    /// The last event's sequence number.
    pub fn last_seq(&self) -> Option<Seq> {
        self.events.last().map(|e| e.seq)
    }
}

/// The batches one [`Coalescer::push`] emitted, at most [`BATCHES_PER_PUSH`], in order.
/// Iterate it and send each batch before the next input.
#[derive(Debug)]
#[must_use = "emitted batches must be sent, or their events are lost"]
pub struct Batches<P> {
    /// The pending batch, flushed to make way for the new event.
    earlier: Option<Batch<P>>,
    /// The batch that holds (or is) the new event, when it is complete.
    latest: Option<Batch<P>>,
}

impl<P> Batches<P> {
    /// True when nothing was emitted.
    pub fn is_empty(&self) -> bool {
        self.earlier.is_none() && self.latest.is_none()
    }
}

impl<P> Iterator for Batches<P> {
    type Item = Batch<P>;

    fn next(&mut self) -> Option<Batch<P>> {
        self.earlier.take().or_else(|| self.latest.take())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::from(self.earlier.is_some()) + usize::from(self.latest.is_some());
        (n, Some(n))
    }
}

impl<P> ExactSizeIterator for Batches<P> {}

/// Counters of a [`Coalescer`] since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoalescerStats {
    /// Events given to [`Coalescer::push`].
    pub events_in: u64,
    /// Events emitted in batches.
    pub events_out: u64,
    /// Batches emitted.
    pub batches: u64,
}

/// Batches stream events for the caller, under hard caps.
///
/// Drain the [`Batches`] returned by every [`Coalescer::push`]; arm a timer at
/// [`Coalescer::poll_timeout`] and call [`Coalescer::handle_timeout`] when it fires;
/// [`Coalescer::flush`] at the end of the stream. Guarantees, for every config:
///
/// - events come out in the order they went in, each exactly once;
/// - a batch holds at most `max_events` events, and at most `max_bytes` payload bytes
///   counting every kind, unless it is one event larger than the cap;
/// - a batch never takes an event that arrives after its deadline (first event +
///   `max_delay_ms`), and is due then;
/// - a terminal event ([`EventKind::is_terminal`]) goes alone, after the pending batch.
#[derive(Debug)]
pub struct Coalescer<P> {
    config: CoalescerConfig,
    pending: Vec<StreamEvent<P>>,
    /// Sum of the pending events' payload bytes; always below `config.max_bytes`.
    pending_bytes: u64,
    /// When the first pending event arrived; meaningless while `pending` is empty.
    opened_at: Timestamp,
    stats: CoalescerStats,
}

impl<P: Payload> Default for Coalescer<P> {
    fn default() -> Self {
        Coalescer::new(CoalescerConfig::default())
    }
}

impl<P: Payload> Coalescer<P> {
    /// An empty coalescer; `config` is [clamped](CoalescerConfig::clamped).
    pub fn new(config: CoalescerConfig) -> Self {
        let config = config.clamped();
        Coalescer {
            config,
            pending: Vec::with_capacity(config.max_events),
            pending_bytes: 0,
            opened_at: Timestamp::ZERO,
            stats: CoalescerStats::default(),
        }
    }

    /// Adds `event`, arriving at `now`; returns the batches now complete (up to
    /// [`BATCHES_PER_PUSH`]). Drain them before the next input.
    ///
    /// The pending batch is emitted first when it is already due, when the event is
    /// terminal, or when the event would push it past `max_events` or `max_bytes`. The
    /// batch holding the event is emitted at once when it is full, when the event is
    /// terminal or larger than the cap, or when `max_delay_ms` is zero.
    pub fn push(&mut self, now: Timestamp, event: StreamEvent<P>) -> Batches<P> {
        self.stats.events_in = self.stats.events_in.saturating_add(1);
        let event_bytes = event.payload_bytes();
        let earlier = if self.is_due(now) {
            // The caller's timer was late; a late event must not join an overdue batch.
            self.take(FlushReason::Deadline)
        } else if event.kind.is_terminal() {
            self.take(FlushReason::BeforeTerminal)
        } else if self.pending.len() >= self.config.max_events {
            // Unreachable while full batches are emitted eagerly; kept so the cap holds
            // even if that ever changes.
            self.take(FlushReason::MaxEvents)
        } else if !self.pending.is_empty()
            && self.pending_bytes.saturating_add(event_bytes) > self.config.max_bytes
        {
            self.take(FlushReason::MaxBytes)
        } else {
            None
        };
        let latest = if event.kind.is_terminal() {
            Some(self.emit_alone(now, event, event_bytes, FlushReason::Terminal))
        } else {
            if self.pending.is_empty() {
                self.opened_at = now;
            }
            self.pending.push(event);
            self.pending_bytes = self.pending_bytes.saturating_add(event_bytes);
            // Emit as soon as the batch can take nothing more, or is already due (a zero
            // delay, or `now` at the top of time).
            if self.pending.len() >= self.config.max_events {
                self.take(FlushReason::MaxEvents)
            } else if self.pending_bytes >= self.config.max_bytes {
                self.take(FlushReason::MaxBytes)
            } else if self.is_due(now) {
                self.take(FlushReason::Deadline)
            } else {
                None
            }
        };
        Batches { earlier, latest }
    }

    /// When the pending batch is due, or `None` when nothing is pending.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        if self.pending.is_empty() {
            None
        } else {
            Some(self.deadline())
        }
    }

    /// Emits the pending batch if it is due at `now`; an early call emits nothing.
    #[must_use]
    pub fn handle_timeout(&mut self, now: Timestamp) -> Option<Batch<P>> {
        if self.is_due(now) {
            self.take(FlushReason::Deadline)
        } else {
            None
        }
    }

    /// Emits whatever is pending, due or not (end of stream, shutdown).
    #[must_use]
    pub fn flush(&mut self) -> Option<Batch<P>> {
        self.take(FlushReason::Explicit)
    }

    /// The limits in force (after clamping).
    pub fn config(&self) -> CoalescerConfig {
        self.config
    }

    /// The events of the pending batch, in order (to persist them).
    pub fn pending(&self) -> &[StreamEvent<P>] {
        &self.pending
    }

    /// Events waiting in the pending batch.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Payload bytes waiting in the pending batch.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Counters since the coalescer was made.
    pub fn stats(&self) -> CoalescerStats {
        self.stats
    }

    /// Checks the coalescer's invariants; linear in the pending batch (at most
    /// `MAX_COALESCE_EVENTS`), so a simulator can call it after every step.
    pub fn check_invariants(&self) -> Result<(), DeliveryViolation> {
        if self.config != self.config.clamped() {
            return Err(DeliveryViolation::ConfigOutOfRange);
        }
        if self.pending.len() >= self.config.max_events {
            return Err(DeliveryViolation::PendingOverEvents);
        }
        if self.pending_bytes >= self.config.max_bytes {
            return Err(DeliveryViolation::PendingOverBytes);
        }
        let counted = self
            .pending
            .iter()
            .fold(0u64, |sum, e| sum.saturating_add(e.payload_bytes()));
        if counted != self.pending_bytes {
            return Err(DeliveryViolation::PendingBytesDrift);
        }
        if self.pending.iter().any(|e| e.kind.is_terminal()) {
            return Err(DeliveryViolation::TerminalCoalesced);
        }
        let out_plus_pending = u128::from(self.stats.events_out) + self.pending.len() as u128;
        if out_plus_pending != u128::from(self.stats.events_in) {
            return Err(DeliveryViolation::CoalescerCountsDisagree);
        }
        Ok(())
    }

    fn deadline(&self) -> Timestamp {
        self.opened_at.plus_millis(self.config.max_delay_ms)
    }

    fn is_due(&self, now: Timestamp) -> bool {
        !self.pending.is_empty() && now >= self.deadline()
    }

    /// Emits the pending batch, if any, and starts an empty one.
    fn take(&mut self, reason: FlushReason) -> Option<Batch<P>> {
        if self.pending.is_empty() {
            return None;
        }
        // The next batch gets room for as many events as this one held: a batch of one
        // (no coalescing, the proxy's case) costs a small allocation, not one of
        // `max_events`, and a stream of full batches still fills its batch without growing.
        let room = self.pending.len();
        let events = std::mem::replace(&mut self.pending, Vec::with_capacity(room));
        let payload_bytes = std::mem::take(&mut self.pending_bytes);
        Some(self.record(Batch {
            events,
            payload_bytes,
            opened_at: self.opened_at,
            reason,
        }))
    }

    fn emit_alone(
        &mut self,
        now: Timestamp,
        event: StreamEvent<P>,
        bytes: u64,
        reason: FlushReason,
    ) -> Batch<P> {
        self.record(Batch {
            events: vec![event],
            payload_bytes: bytes,
            opened_at: now,
            reason,
        })
    }

    fn record(&mut self, batch: Batch<P>) -> Batch<P> {
        self.stats.batches = self.stats.batches.saturating_add(1);
        self.stats.events_out = self
            .stats
            .events_out
            .saturating_add(batch.events.len() as u64);
        batch
    }
}

// ---------------------------------------------------------------------------------------
// In-order receiver
// ---------------------------------------------------------------------------------------

/// What [`InOrderReceiver::accept`] did with an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receipt<T> {
    /// The next item in order: hand it on.
    Delivered(T),
    /// Already delivered; the copy was dropped and nothing changed.
    Duplicate {
        /// The repeated sequence number.
        seq: Seq,
    },
    /// Items are missing before this one. Nothing changed; the item comes back so the
    /// caller can hold it until the missing ones arrive, or ask for a replay from
    /// `expected`.
    Gap {
        /// The sequence number the receiver is waiting for.
        expected: Seq,
        /// The sequence number that arrived.
        got: Seq,
        /// The item that arrived, undelivered.
        item: T,
    },
}

/// Counters of an [`InOrderReceiver`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiverStats {
    /// Items delivered in order.
    pub delivered: u64,
    /// Copies dropped as duplicates.
    pub duplicates: u64,
    /// Items refused because some before them were missing.
    pub gaps: u64,
}

/// The caller's side of delivery: proves every item arrives once, in order, without gaps.
///
/// Serializable, so the caller can persist it beside the output it has shown; after a
/// recovery the stream resumes at [`InOrderReceiver::next_expected`] and a replay of old
/// output is dropped as duplicates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InOrderReceiver {
    /// The last sequence number delivered; 0 before the first.
    last_delivered: u64,
    stats: ReceiverStats,
}

impl InOrderReceiver {
    /// A receiver waiting for [`Seq::FIRST`].
    pub fn new() -> Self {
        InOrderReceiver::default()
    }

    /// A receiver waiting for `first` (a stream resumed after recovery).
    pub fn starting_at(first: Seq) -> Self {
        InOrderReceiver {
            last_delivered: first.get().saturating_sub(1),
            stats: ReceiverStats::default(),
        }
    }

    /// Takes `item` numbered `seq`: delivers it if it is the next one, drops it if it was
    /// already delivered, and reports a gap (returning it, state untouched) otherwise.
    pub fn accept<T>(&mut self, seq: Seq, item: T) -> Receipt<T> {
        if seq.get() <= self.last_delivered {
            self.stats.duplicates = self.stats.duplicates.saturating_add(1);
            return Receipt::Duplicate { seq };
        }
        match self.next_expected() {
            Some(expected) if expected == seq => {
                self.last_delivered = seq.get();
                self.stats.delivered = self.stats.delivered.saturating_add(1);
                Receipt::Delivered(item)
            }
            Some(expected) => {
                self.stats.gaps = self.stats.gaps.saturating_add(1);
                Receipt::Gap {
                    expected,
                    got: seq,
                    item,
                }
            }
            // Everything up to `u64::MAX` was delivered, so `seq <= last_delivered` above
            // already matched; kept total rather than asserted.
            None => {
                self.stats.duplicates = self.stats.duplicates.saturating_add(1);
                Receipt::Duplicate { seq }
            }
        }
    }

    /// The sequence number that will be delivered next; `None` once `u64::MAX` was.
    pub fn next_expected(&self) -> Option<Seq> {
        self.last_delivered.checked_add(1).and_then(Seq::new)
    }

    /// The last sequence number delivered, `None` before the first.
    pub fn last_delivered(&self) -> Option<Seq> {
        Seq::new(self.last_delivered)
    }

    /// Counters since the receiver was made.
    pub fn stats(&self) -> ReceiverStats {
        self.stats
    }
}

// ---------------------------------------------------------------------------------------
// Invariants
// ---------------------------------------------------------------------------------------

/// A broken invariant of this module: always a bug here, never the caller's fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryViolation {
    /// The queue holds more than its capacity, or the capacity is out of range.
    QueueOverCapacity,
    /// The high-water mark is above the capacity or below the current length.
    QueueHighWaterWrong,
    /// `pushed` is not `popped` plus the items queued.
    QueueCountsDisagree,
    /// Queued sequence numbers are not the contiguous run before `next_seq`.
    QueueSeqNotContiguous,
    /// The coalescer's limits are outside their documented range.
    ConfigOutOfRange,
    /// The pending batch is at `max_events` but was not emitted.
    PendingOverEvents,
    /// The pending batch is at `max_bytes` but was not emitted.
    PendingOverBytes,
    /// The pending byte count differs from the sum of the pending payloads.
    PendingBytesDrift,
    /// A terminal event is waiting in a batch with others.
    TerminalCoalesced,
    /// Events in are not events out plus events pending.
    CoalescerCountsDisagree,
}

impl fmt::Display for DeliveryViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for DeliveryViolation {}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn seq(raw: u64) -> Seq {
        Seq::new(raw).expect("test sequence numbers are non-zero")
    }

    fn ev(raw: u64, kind: EventKind, len: u32) -> StreamEvent<PayloadLen> {
        StreamEvent::new(seq(raw), kind, PayloadLen(len))
    }

    fn seqs(batch: &Batch<PayloadLen>) -> Vec<u64> {
        batch.events().iter().map(|e| e.seq.get()).collect()
    }

    /// The burst from compozy #454: `n` notifications produced at once into `queue`. The
    /// producer keeps every refused item and retries after the consumer drains; it gives up
    /// only if the queue closes. Returns the first broken promise of rule 9, if any.
    fn deliver_burst(queue: &mut NotificationQueue<u32>, n: u32) -> Result<(), String> {
        let mut receiver = InOrderReceiver::new();
        let mut outbox: VecDeque<u32> = (0..n).collect();
        let mut rounds = 0u32;
        while !outbox.is_empty() || !queue.is_empty() {
            rounds += 1;
            if rounds > n + 2 {
                return Err("no progress".into());
            }
            while let Some(item) = outbox.pop_front() {
                match queue.try_push(item) {
                    Ok(_) => {}
                    Err(PushError::Backpressure(item)) => {
                        outbox.push_front(item);
                        break;
                    }
                    Err(PushError::Closed(item)) => {
                        return Err(format!(
                            "queue closed at item {item} with {} queued; {} delivered of {n}",
                            queue.len(),
                            receiver.stats().delivered
                        ));
                    }
                }
            }
            while let Some((s, item)) = queue.pop() {
                match receiver.accept(s, item) {
                    Receipt::Delivered(got) if u64::from(got) + 1 == s.get() => {}
                    other => return Err(format!("at {s}: {other:?}")),
                }
            }
            queue.check_invariants().map_err(|v| v.to_string())?;
        }
        if receiver.stats().delivered != u64::from(n) {
            return Err(format!("{} of {n} delivered", receiver.stats().delivered));
        }
        if queue.is_closed() {
            return Err("queue closed".into());
        }
        Ok(())
    }

    // ---- queue ----

    #[test]
    fn pushes_get_contiguous_seqs_from_one() {
        let mut queue = NotificationQueue::new(8);
        for i in 1..=8 {
            assert_eq!(queue.try_push(i), Ok(seq(i)));
        }
        for i in 1..=8 {
            assert_eq!(queue.pop(), Some((seq(i), i)));
        }
        assert_eq!(queue.pop(), None);
        assert_eq!(queue.try_push(9), Ok(seq(9)));
    }

    #[test]
    fn burst_of_1100_through_1024_queue_arrives_in_order_without_loss_or_close() {
        let mut queue = NotificationQueue::new(DEFAULT_QUEUE_CAPACITY);
        assert_eq!(deliver_burst(&mut queue, 1_100), Ok(()));
        let stats = queue.stats();
        assert_eq!(stats.pushed, 1_100);
        assert_eq!(stats.popped, 1_100);
        assert_eq!(stats.high_water, 1_024);
        assert!(
            stats.backpressure_events >= 1,
            "the burst must have met backpressure"
        );
        assert_eq!(stats.closed_rejections, 0);
        assert!(!queue.is_closed());
    }

    #[test]
    fn full_queue_hands_the_item_back_and_stays_open() {
        let mut queue = NotificationQueue::new(2);
        assert!(queue.try_push("a").is_ok());
        assert!(queue.try_push("b").is_ok());
        assert!(queue.is_full());
        for _ in 0..3 {
            assert_eq!(queue.try_push("c"), Err(PushError::Backpressure("c")));
        }
        assert!(!queue.is_closed());
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.stats().backpressure_events, 3);
        assert_eq!(
            queue.next_seq(),
            Some(seq(3)),
            "a refused push uses no number"
        );
        assert_eq!(queue.pop(), Some((seq(1), "a")));
        assert_eq!(queue.try_push("c"), Ok(seq(3)));
        assert_eq!(queue.check_invariants(), Ok(()));
    }

    #[test]
    fn explicit_close_refuses_pushes_but_drains_accepted_items() {
        let mut queue = NotificationQueue::new(4);
        assert!(queue.try_push(1).is_ok());
        assert!(queue.try_push(2).is_ok());
        queue.close();
        assert!(queue.is_closed());
        assert_eq!(queue.try_push(3), Err(PushError::Closed(3)));
        assert_eq!(queue.pop(), Some((seq(1), 1)));
        assert_eq!(queue.pop(), Some((seq(2), 2)));
        assert_eq!(queue.pop(), None);
        assert_eq!(queue.stats().closed_rejections, 1);
    }

    #[test]
    fn capacity_is_clamped_into_range() {
        let mut zero = NotificationQueue::new(0);
        assert_eq!(zero.capacity(), MIN_QUEUE_CAPACITY);
        assert!(
            zero.try_push(()).is_ok(),
            "a clamped queue still makes progress"
        );
        assert_eq!(
            NotificationQueue::<()>::new(usize::MAX).capacity(),
            MAX_QUEUE_CAPACITY
        );
        assert_eq!(
            NotificationQueue::<()>::default().capacity(),
            DEFAULT_QUEUE_CAPACITY
        );
    }

    #[test]
    fn storage_is_reserved_once_and_never_grows() {
        let mut queue = NotificationQueue::new(DEFAULT_QUEUE_CAPACITY);
        let reserved = queue.reserved_slots();
        assert!(reserved >= DEFAULT_QUEUE_CAPACITY);
        for round in 0..3u32 {
            // Bounded loops: a queue that wrongly accepted past its capacity must not hang.
            for _ in 0..=DEFAULT_QUEUE_CAPACITY {
                if queue.try_push(round).is_err() {
                    break;
                }
            }
            assert!(queue.is_full());
            assert_eq!(queue.len(), DEFAULT_QUEUE_CAPACITY);
            for _ in 0..=DEFAULT_QUEUE_CAPACITY {
                if queue.pop().is_none() {
                    break;
                }
            }
            assert!(queue.is_empty());
            assert_eq!(queue.reserved_slots(), reserved);
        }
    }

    #[test]
    fn exhausted_seq_space_closes_rather_than_reusing_a_number() {
        let mut queue = NotificationQueue::starting_at(4, seq(u64::MAX));
        assert_eq!(queue.try_push('a'), Ok(seq(u64::MAX)));
        assert_eq!(queue.next_seq(), None);
        assert_eq!(queue.check_invariants(), Ok(()));
        assert_eq!(queue.try_push('b'), Err(PushError::Closed('b')));
        assert!(queue.is_closed());
        assert_eq!(queue.pop(), Some((seq(u64::MAX), 'a')));
        assert_eq!(queue.check_invariants(), Ok(()));
    }

    #[test]
    fn resumed_queue_continues_where_the_receiver_expects() {
        let mut receiver = InOrderReceiver::new();
        let mut first = NotificationQueue::new(4);
        for i in 0..3 {
            assert!(first.try_push(i).is_ok());
        }
        while let Some((s, item)) = first.pop() {
            assert_eq!(receiver.accept(s, item), Receipt::Delivered(item));
        }
        let resume = receiver
            .next_expected()
            .expect("three of 2^64 numbers used");
        let mut second = NotificationQueue::starting_at(4, resume);
        assert_eq!(second.try_push(3), Ok(seq(4)));
        let (s, item) = second.pop().expect("just pushed");
        assert_eq!(receiver.accept(s, item), Receipt::Delivered(3));
    }

    #[test]
    fn push_error_returns_the_item() {
        assert_eq!(PushError::Backpressure(7).into_inner(), 7);
        assert_eq!(PushError::Closed(8).into_inner(), 8);
        assert!(PushError::Backpressure(()).is_backpressure());
        assert!(!PushError::Closed(()).is_backpressure());
        assert!(!PushError::Closed(()).to_string().is_empty());
    }

    // ---- seq ----

    #[test]
    fn zero_is_not_a_seq_even_from_serde() {
        assert_eq!(Seq::new(0), None);
        assert_eq!(Seq::try_from(0u64), Err(ZeroSeq));
        assert!(serde_json::from_str::<Seq>("0").is_err());
        assert_eq!(serde_json::from_str::<Seq>("5").ok(), Some(seq(5)));
        assert_eq!(seq(u64::MAX).next(), None);
        assert_eq!(Seq::FIRST.next(), Some(seq(2)));
    }

    // ---- coalescer ----

    #[test]
    fn tool_and_resource_events_count_toward_the_byte_cap() {
        // The compozy #454 review: 64 large non-text events bypassed the 4,096-byte cap.
        let mut c = Coalescer::new(CoalescerConfig::default());
        let kinds = [
            EventKind::ToolCall,
            EventKind::ToolUpdate,
            EventKind::Resource,
            EventKind::Plan,
            EventKind::Other,
        ];
        let mut batches = Vec::new();
        for i in 1..=64u64 {
            let kind = kinds[(i as usize) % kinds.len()];
            batches.extend(c.push(t(0), ev(i, kind, 1_000)));
        }
        batches.extend(c.flush());
        assert!(
            batches.len() >= 16,
            "64 KB of tool output is at least 16 batches"
        );
        for b in &batches {
            assert!(
                b.payload_bytes() <= 4_096,
                "batch of {} bytes",
                b.payload_bytes()
            );
            assert_eq!(b.payload_bytes(), b.len() as u64 * 1_000);
        }
        let all: Vec<u64> = batches.iter().flat_map(seqs).collect();
        assert_eq!(all, (1..=64).collect::<Vec<_>>());
    }

    #[test]
    fn every_kind_is_measured_the_same_way() {
        for kind in EventKind::ALL.into_iter().filter(|k| !k.is_terminal()) {
            let mut c = Coalescer::new(CoalescerConfig::default());
            assert!(c.push(t(0), ev(1, kind, 4_000)).is_empty());
            let out: Vec<_> = c.push(t(0), ev(2, kind, 97)).collect();
            assert_eq!(out.len(), 1, "{kind:?} must not bypass the byte cap");
            assert_eq!(out[0].reason(), FlushReason::MaxBytes);
            assert_eq!(seqs(&out[0]), [1]);
            assert_eq!(c.pending_bytes(), 97);
        }
    }

    #[test]
    fn owned_payloads_are_measured_by_their_real_length() {
        let mut c: Coalescer<Vec<u8>> = Coalescer::new(CoalescerConfig::default());
        assert!(c
            .push(
                t(0),
                StreamEvent::new(seq(1), EventKind::ToolCall, vec![0; 3_000])
            )
            .is_empty());
        let out: Vec<_> = c
            .push(
                t(0),
                StreamEvent::new(seq(2), EventKind::Resource, vec![0; 3_000]),
            )
            .collect();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].payload_bytes(), 3_000);
        assert_eq!("héllo".to_string().byte_len(), 6);
    }

    #[test]
    fn a_batch_that_reaches_the_byte_cap_exactly_is_sent_at_once() {
        let mut c = Coalescer::new(CoalescerConfig::default());
        assert!(c.push(t(0), ev(1, EventKind::Text, 4_000)).is_empty());
        let out: Vec<_> = c.push(t(0), ev(2, EventKind::Text, 96)).collect();
        assert_eq!(out.len(), 1);
        assert_eq!(seqs(&out[0]), [1, 2]);
        assert_eq!(out[0].payload_bytes(), 4_096);
        assert_eq!(c.poll_timeout(), None);
    }

    #[test]
    fn batch_is_sent_when_it_reaches_max_events() {
        let mut c = Coalescer::new(CoalescerConfig::default());
        for i in 1..64 {
            assert!(c.push(t(0), ev(i, EventKind::Text, 1)).is_empty());
        }
        let out: Vec<_> = c.push(t(0), ev(64, EventKind::Text, 1)).collect();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].len(), 64);
        assert_eq!(out[0].reason(), FlushReason::MaxEvents);
        assert_eq!(c.pending_len(), 0);
    }

    #[test]
    fn oversized_event_goes_alone_after_the_pending_batch() {
        let mut c = Coalescer::new(CoalescerConfig::default());
        assert!(c.push(t(0), ev(1, EventKind::Text, 10)).is_empty());
        let out: Vec<_> = c.push(t(1), ev(2, EventKind::Resource, 50_000)).collect();
        assert_eq!(out.len(), 2);
        assert_eq!(seqs(&out[0]), [1]);
        assert_eq!(seqs(&out[1]), [2]);
        assert_eq!(out[1].payload_bytes(), 50_000);
        assert_eq!(out[1].reason(), FlushReason::MaxBytes);
        assert_eq!(c.poll_timeout(), None);
    }

    #[test]
    fn terminal_event_flushes_pending_then_goes_alone() {
        for terminal in [EventKind::Done, EventKind::Failed] {
            let mut c = Coalescer::new(CoalescerConfig::default());
            assert!(c.push(t(0), ev(1, EventKind::Text, 10)).is_empty());
            assert!(c.push(t(1), ev(2, EventKind::ToolCall, 10)).is_empty());
            let out: Vec<_> = c.push(t(2), ev(3, terminal, 0)).collect();
            assert_eq!(out.len(), 2);
            assert_eq!(
                (seqs(&out[0]), out[0].reason()),
                (vec![1, 2], FlushReason::BeforeTerminal)
            );
            assert_eq!(
                (seqs(&out[1]), out[1].reason()),
                (vec![3], FlushReason::Terminal)
            );
            assert_eq!(c.poll_timeout(), None);
        }
    }

    #[test]
    fn terminal_event_on_an_idle_coalescer_goes_alone_at_once() {
        let mut c = Coalescer::new(CoalescerConfig::default());
        let out: Vec<_> = c.push(t(5), ev(1, EventKind::Done, 0)).collect();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].reason(), FlushReason::Terminal);
    }

    #[test]
    fn batch_is_due_max_delay_after_its_first_event() {
        let mut c = Coalescer::new(CoalescerConfig::default());
        assert!(c.push(t(100), ev(1, EventKind::Text, 1)).is_empty());
        assert!(c.push(t(120), ev(2, EventKind::Text, 1)).is_empty());
        assert_eq!(
            c.poll_timeout(),
            Some(t(125)),
            "due from the first event, not the last"
        );
        assert_eq!(
            c.handle_timeout(t(124)),
            None,
            "an early timer emits nothing"
        );
        let batch = c.handle_timeout(t(125)).expect("due at 125");
        assert_eq!(
            (seqs(&batch), batch.reason(), batch.opened_at()),
            (vec![1, 2], FlushReason::Deadline, t(100))
        );
        assert_eq!(c.poll_timeout(), None);
        assert_eq!(c.handle_timeout(t(200)), None);
    }

    #[test]
    fn late_event_does_not_join_an_overdue_batch() {
        let mut c = Coalescer::new(CoalescerConfig::default());
        assert!(c.push(t(0), ev(1, EventKind::Text, 1)).is_empty());
        let out: Vec<_> = c.push(t(500), ev(2, EventKind::Text, 1)).collect();
        assert_eq!(out.len(), 1);
        assert_eq!(
            (seqs(&out[0]), out[0].reason()),
            (vec![1], FlushReason::Deadline)
        );
        assert_eq!(c.poll_timeout(), Some(t(525)));
    }

    #[test]
    fn zero_delay_sends_every_event_at_once() {
        let mut c = Coalescer::new(CoalescerConfig {
            max_delay_ms: 0,
            ..CoalescerConfig::default()
        });
        for i in 1..=3 {
            let out: Vec<_> = c.push(t(i), ev(i, EventKind::Text, 1)).collect();
            assert_eq!(out.len(), 1);
            assert_eq!(seqs(&out[0]), [i]);
        }
    }

    #[test]
    fn flush_sends_pending_and_nothing_when_idle() {
        let mut c = Coalescer::new(CoalescerConfig::default());
        assert_eq!(c.flush(), None);
        assert!(c.push(t(0), ev(1, EventKind::Thought, 3)).is_empty());
        let batch = c.flush().expect("one pending");
        assert_eq!(batch.reason(), FlushReason::Explicit);
        assert_eq!(c.flush(), None);
        assert_eq!(c.check_invariants(), Ok(()));
    }

    #[test]
    fn out_of_range_config_is_clamped() {
        let c: Coalescer<PayloadLen> = Coalescer::new(CoalescerConfig {
            max_delay_ms: u64::MAX,
            max_events: 0,
            max_bytes: 0,
        });
        assert_eq!(
            c.config(),
            CoalescerConfig {
                max_delay_ms: MAX_COALESCE_DELAY_MS,
                max_events: 1,
                max_bytes: 1
            }
        );
        assert_eq!(
            CoalescerConfig {
                max_events: usize::MAX,
                max_bytes: u64::MAX,
                ..CoalescerConfig::default()
            }
            .clamped(),
            CoalescerConfig {
                max_events: MAX_COALESCE_EVENTS,
                max_bytes: MAX_COALESCE_BYTES,
                ..CoalescerConfig::default()
            }
        );
    }

    #[test]
    fn time_at_the_top_of_the_range_does_not_overflow() {
        let mut c = Coalescer::new(CoalescerConfig::default());
        let out: Vec<_> = c.push(Timestamp::MAX, ev(1, EventKind::Text, 1)).collect();
        assert_eq!(out.len(), 1, "a batch opened at MAX is due at once");
        assert!(
            c.push(t(3), ev(2, EventKind::Text, 1)).is_empty(),
            "time going back is tolerated"
        );
        assert_eq!(c.poll_timeout(), Some(t(28)));
    }

    // ---- receiver ----

    #[test]
    fn receiver_delivers_in_order() {
        let mut r = InOrderReceiver::new();
        assert_eq!(r.next_expected(), Some(Seq::FIRST));
        assert_eq!(r.last_delivered(), None);
        for i in 1..=5 {
            assert_eq!(r.accept(seq(i), i), Receipt::Delivered(i));
        }
        assert_eq!(r.next_expected(), Some(seq(6)));
        assert_eq!(r.stats().delivered, 5);
    }

    #[test]
    fn duplicate_is_dropped_without_changing_state() {
        let mut r = InOrderReceiver::new();
        assert_eq!(r.accept(seq(1), 'a'), Receipt::Delivered('a'));
        assert_eq!(r.accept(seq(2), 'b'), Receipt::Delivered('b'));
        let before = r.next_expected();
        assert_eq!(r.accept(seq(1), 'a'), Receipt::Duplicate { seq: seq(1) });
        assert_eq!(r.accept(seq(2), 'b'), Receipt::Duplicate { seq: seq(2) });
        assert_eq!(r.next_expected(), before);
        assert_eq!(r.stats().duplicates, 2);
    }

    #[test]
    fn gap_is_reported_and_leaves_state_untouched() {
        let mut r = InOrderReceiver::new();
        assert_eq!(r.accept(seq(1), 'a'), Receipt::Delivered('a'));
        assert_eq!(
            r.accept(seq(3), 'c'),
            Receipt::Gap {
                expected: seq(2),
                got: seq(3),
                item: 'c'
            }
        );
        assert_eq!(r.next_expected(), Some(seq(2)));
        assert_eq!(r.accept(seq(2), 'b'), Receipt::Delivered('b'));
        assert_eq!(r.accept(seq(3), 'c'), Receipt::Delivered('c'));
        assert_eq!(r.stats().gaps, 1);
    }

    #[test]
    fn receiver_survives_a_restart_through_serde() {
        let mut r = InOrderReceiver::new();
        for i in 1..=3 {
            assert_eq!(r.accept(seq(i), ()), Receipt::Delivered(()));
        }
        let json = serde_json::to_string(&r).expect("plain struct serializes");
        let mut back: InOrderReceiver = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, r);
        assert_eq!(
            back.accept(seq(3), ()),
            Receipt::Duplicate { seq: seq(3) },
            "replayed output is dropped"
        );
        assert_eq!(back.accept(seq(4), ()), Receipt::Delivered(()));
    }

    #[test]
    fn receiver_at_the_top_of_the_seq_space_stays_total() {
        let mut r = InOrderReceiver::starting_at(seq(u64::MAX));
        assert_eq!(r.accept(seq(u64::MAX), ()), Receipt::Delivered(()));
        assert_eq!(r.next_expected(), None);
        assert_eq!(
            r.accept(seq(u64::MAX), ()),
            Receipt::Duplicate { seq: seq(u64::MAX) }
        );
        assert_eq!(
            r.accept(Seq::FIRST, ()),
            Receipt::Duplicate { seq: Seq::FIRST }
        );
    }

    // ---- mutant ----

    /// The queue-overflow-closes mutant re-creates compozy #454; the burst oracle that
    /// passes on the real queue must catch it.
    #[cfg(feature = "mutants")]
    #[test]
    fn queue_overflow_closes_mutant_is_caught_by_the_burst_oracle() {
        use crate::mutants::Mutant;

        let mut real = NotificationQueue::with_mutant(DEFAULT_QUEUE_CAPACITY, ActiveMutant::NONE);
        assert_eq!(deliver_burst(&mut real, 1_100), Ok(()));

        let mut buggy = NotificationQueue::with_mutant(
            DEFAULT_QUEUE_CAPACITY,
            ActiveMutant::on(Mutant::QueueOverflowCloses),
        );
        let verdict = deliver_burst(&mut buggy, 1_100);
        assert!(verdict.is_err(), "the oracle missed the mutant");
        assert!(buggy.is_closed(), "the mutant closes when full");
        assert_eq!(
            buggy.stats().pushed,
            1_024,
            "item 1,025 and everything after is lost"
        );
        assert_eq!(buggy.stats().backpressure_events, 0);
    }

    // ---- properties ----

    fn kind_strategy() -> impl Strategy<Value = EventKind> {
        prop_oneof![
            8 => prop::sample::select(EventKind::ALL[..7].to_vec()),
            1 => prop::sample::select(vec![EventKind::Done, EventKind::Failed]),
        ]
    }

    fn len_strategy() -> impl Strategy<Value = u32> {
        prop_oneof![
            6 => 0u32..200,
            3 => 200u32..5_000,
            1 => 5_000u32..100_000,
        ]
    }

    fn config_strategy() -> impl Strategy<Value = CoalescerConfig> {
        (0u64..80, 1usize..80, 1u64..10_000).prop_map(|(max_delay_ms, max_events, max_bytes)| {
            CoalescerConfig {
                max_delay_ms,
                max_events,
                max_bytes,
            }
        })
    }

    #[derive(Clone, Debug)]
    enum QueueOp {
        Push,
        Pop,
    }

    #[derive(Clone, Debug)]
    enum PipeOp {
        /// The agent emits up to this many notifications.
        Produce(u8),
        /// The consumer pops up to this many into the coalescer.
        Consume(u8),
        /// Virtual time moves on, firing every timer on the way.
        Advance(u16),
        /// The caller flushes.
        Flush,
    }

    fn pipe_op() -> impl Strategy<Value = PipeOp> {
        prop_oneof![
            (1u8..40).prop_map(PipeOp::Produce),
            (1u8..40).prop_map(PipeOp::Consume),
            (0u16..60).prop_map(PipeOp::Advance),
            Just(PipeOp::Flush),
        ]
    }

    type Item = (EventKind, PayloadLen);

    /// Producer → queue → coalescer → receiver, in virtual time, checking every batch.
    struct Pipeline {
        queue: NotificationQueue<Item>,
        coalescer: Coalescer<PayloadLen>,
        receiver: InOrderReceiver,
        config: CoalescerConfig,
        now: Timestamp,
        outbox: VecDeque<Item>,
        /// Entry time into the coalescer, indexed by `seq - 1`.
        arrived_at: Vec<Timestamp>,
    }

    impl Pipeline {
        fn new(capacity: usize, config: CoalescerConfig, items: Vec<Item>) -> Self {
            Pipeline {
                queue: NotificationQueue::new(capacity),
                coalescer: Coalescer::new(config),
                receiver: InOrderReceiver::new(),
                config: config.clamped(),
                now: Timestamp::ZERO,
                outbox: items.into(),
                arrived_at: Vec::new(),
            }
        }

        fn produce(&mut self, n: usize) -> Result<(), TestCaseError> {
            for _ in 0..n {
                let Some(item) = self.outbox.pop_front() else {
                    break;
                };
                match self.queue.try_push(item) {
                    Ok(_) => {}
                    Err(PushError::Backpressure(item)) => {
                        prop_assert!(self.queue.is_full());
                        self.outbox.push_front(item);
                        break;
                    }
                    Err(PushError::Closed(_)) => prop_assert!(false, "the queue closed"),
                }
            }
            Ok(())
        }

        fn consume(&mut self, n: usize) -> Result<(), TestCaseError> {
            for _ in 0..n {
                let Some((s, (kind, payload))) = self.queue.pop() else {
                    break;
                };
                prop_assert_eq!(s.get(), self.arrived_at.len() as u64 + 1);
                self.arrived_at.push(self.now);
                let batches: Vec<_> = self
                    .coalescer
                    .push(self.now, StreamEvent::new(s, kind, payload))
                    .collect();
                for b in batches {
                    self.on_batch(b)?;
                }
            }
            Ok(())
        }

        /// Jumps from wake-up to wake-up up to `now + ms`, as an embedder's timer would.
        fn advance(&mut self, ms: u64) -> Result<(), TestCaseError> {
            let target = self.now.plus_millis(ms);
            while let Some(due) = self.coalescer.poll_timeout().filter(|due| *due <= target) {
                self.now = self.now.max(due);
                let batch = self.coalescer.handle_timeout(self.now);
                prop_assert!(batch.is_some(), "a due timeout emitted nothing");
                if let Some(b) = batch {
                    self.on_batch(b)?;
                }
            }
            self.now = target;
            Ok(())
        }

        fn flush(&mut self) -> Result<(), TestCaseError> {
            if let Some(b) = self.coalescer.flush() {
                self.on_batch(b)?;
            }
            Ok(())
        }

        fn on_batch(&mut self, batch: Batch<PayloadLen>) -> Result<(), TestCaseError> {
            let cfg = self.config;
            prop_assert!(!batch.is_empty());
            prop_assert!(batch.len() <= cfg.max_events);
            let sum: u64 = batch.events().iter().map(|e| e.payload_bytes()).sum();
            prop_assert_eq!(sum, batch.payload_bytes(), "every payload byte is counted");
            prop_assert!(
                sum <= cfg.max_bytes || batch.len() == 1,
                "{} bytes in {} events",
                sum,
                batch.len()
            );
            let terminal = batch.events().iter().any(|e| e.kind.is_terminal());
            prop_assert!(
                !terminal || batch.len() == 1,
                "a terminal event was coalesced"
            );
            // Sent no later than first event + max_delay; no event joined after the deadline.
            let deadline = batch.opened_at().plus_millis(cfg.max_delay_ms);
            prop_assert!(
                self.now <= deadline,
                "sent at {} after deadline {}",
                self.now,
                deadline
            );
            for e in batch.events() {
                let arrived = self.arrived_at[(e.seq.get() - 1) as usize];
                prop_assert!(batch.opened_at() <= arrived && arrived <= deadline);
            }
            for e in batch.into_events() {
                let s = e.seq;
                match self.receiver.accept(s, e) {
                    Receipt::Delivered(_) => {}
                    other => prop_assert!(false, "at {}: {:?}", s, other),
                }
            }
            Ok(())
        }

        fn check(&self) -> Result<(), TestCaseError> {
            prop_assert_eq!(self.queue.check_invariants(), Ok(()));
            prop_assert_eq!(self.coalescer.check_invariants(), Ok(()));
            prop_assert!(!self.queue.is_closed());
            Ok(())
        }

        /// Faults over: keep going until everything is delivered, within a bound.
        fn settle(&mut self, total: usize) -> Result<(), TestCaseError> {
            let mut rounds = 0usize;
            while !self.outbox.is_empty()
                || !self.queue.is_empty()
                || self.coalescer.poll_timeout().is_some()
            {
                rounds += 1;
                prop_assert!(rounds <= total + 2, "no progress while settling");
                self.produce(usize::MAX)?;
                self.consume(usize::MAX)?;
                self.advance(MAX_COALESCE_DELAY_MS)?;
                self.check()?;
            }
            prop_assert_eq!(self.receiver.stats().delivered, total as u64);
            prop_assert_eq!(
                self.receiver.stats().duplicates + self.receiver.stats().gaps,
                0
            );
            prop_assert_eq!(self.queue.stats().pushed, total as u64);
            prop_assert_eq!(self.queue.stats().popped, total as u64);
            let cs = self.coalescer.stats();
            prop_assert_eq!((cs.events_in, cs.events_out), (total as u64, total as u64));
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn queue_keeps_order_and_bounds_and_loses_nothing(
            capacity in 1usize..40,
            ops in prop::collection::vec(
                prop_oneof![3 => Just(QueueOp::Push), 2 => Just(QueueOp::Pop)],
                0..400,
            ),
        ) {
            let mut queue = NotificationQueue::new(capacity);
            let mut next_item = 0u64;
            let mut expected_out = 1u64;
            for op in ops {
                match op {
                    QueueOp::Push => {
                        let was_full = queue.is_full();
                        match queue.try_push(next_item) {
                            Ok(s) => {
                                prop_assert!(!was_full);
                                prop_assert_eq!(s.get(), next_item + 1);
                                next_item += 1;
                            }
                            Err(e) => {
                                prop_assert!(was_full);
                                prop_assert_eq!(e, PushError::Backpressure(next_item));
                            }
                        }
                    }
                    QueueOp::Pop => {
                        if let Some((s, item)) = queue.pop() {
                            prop_assert_eq!((s.get(), item), (expected_out, expected_out - 1));
                            expected_out += 1;
                        }
                    }
                }
                prop_assert!(queue.len() <= capacity);
                prop_assert!(!queue.is_closed());
                prop_assert_eq!(queue.check_invariants(), Ok(()));
            }
            while let Some((s, _)) = queue.pop() {
                prop_assert_eq!(s.get(), expected_out);
                expected_out += 1;
            }
            prop_assert_eq!(expected_out - 1, next_item, "every accepted item came out once");
        }

        #[test]
        fn every_seq_crosses_queue_and_coalescer_once_in_order_within_bounds(
            capacity in 1usize..48,
            config in config_strategy(),
            items in prop::collection::vec(
                (kind_strategy(), len_strategy().prop_map(PayloadLen)),
                0..300,
            ),
            ops in prop::collection::vec(pipe_op(), 0..200),
        ) {
            let total = items.len();
            let mut pipe = Pipeline::new(capacity, config, items);
            for op in ops {
                match op {
                    PipeOp::Produce(n) => pipe.produce(n.into())?,
                    PipeOp::Consume(n) => pipe.consume(n.into())?,
                    PipeOp::Advance(ms) => pipe.advance(ms.into())?,
                    PipeOp::Flush => pipe.flush()?,
                }
                pipe.check()?;
            }
            pipe.settle(total)?;
        }

        #[test]
        fn coalescer_at_arbitrary_times_loses_nothing_and_keeps_caps(
            config in config_strategy(),
            steps in prop::collection::vec(
                (any::<u64>(), kind_strategy(), len_strategy(), any::<bool>()),
                0..200,
            ),
        ) {
            // Times jump anywhere, backwards included; timers fire whenever the caller likes.
            let mut c = Coalescer::new(config);
            let cfg = c.config();
            let mut out = Vec::new();
            for (i, (now, kind, len, fire)) in steps.iter().enumerate() {
                let now = Timestamp::from_millis(*now);
                out.extend(c.push(now, ev(i as u64 + 1, *kind, *len)));
                if *fire {
                    out.extend(c.handle_timeout(now));
                }
                prop_assert_eq!(c.check_invariants(), Ok(()));
            }
            out.extend(c.flush());
            let mut all = Vec::new();
            for b in &out {
                prop_assert!(b.len() <= cfg.max_events);
                prop_assert!(b.payload_bytes() <= cfg.max_bytes || b.len() == 1);
                prop_assert!(!b.events().iter().any(|e| e.kind.is_terminal()) || b.len() == 1);
                all.extend(seqs(b));
            }
            prop_assert_eq!(all, (1..=steps.len() as u64).collect::<Vec<_>>());
        }

        #[test]
        fn receiver_delivers_exactly_the_contiguous_prefix(
            arrivals in prop::collection::vec(1u64..40, 0..300),
        ) {
            let mut r = InOrderReceiver::new();
            let mut delivered = Vec::new();
            for raw in arrivals {
                let before = r;
                match r.accept(seq(raw), raw) {
                    Receipt::Delivered(item) => {
                        prop_assert_eq!(item, before.next_expected().map_or(0, Seq::get));
                        delivered.push(item);
                    }
                    Receipt::Duplicate { seq: s } => {
                        prop_assert!(s.get() < before.next_expected().map_or(u64::MAX, Seq::get));
                        prop_assert_eq!(r.next_expected(), before.next_expected());
                    }
                    Receipt::Gap { expected, got, item } => {
                        prop_assert_eq!(Some(expected), before.next_expected());
                        prop_assert!(got > expected);
                        prop_assert_eq!(item, raw);
                        prop_assert_eq!(r.next_expected(), before.next_expected());
                    }
                }
            }
            prop_assert_eq!(delivered.clone(), (1..=delivered.len() as u64).collect::<Vec<_>>());
        }
    }
}
