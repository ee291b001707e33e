#![allow(missing_docs)] // criterion_group! generates undocumented items.
//! Throughput of the lossless delivery path: producer → `NotificationQueue` (1,024, with
//! backpressure) → `Coalescer` (25 ms / 64 events / 4,096 bytes) → `InOrderReceiver`.
//!
//! Target (rule 9 of `docs/design.md`; `reports/bench.md`): at least 2 million events/s, with memory bounded by
//! the queue capacity. The producer always bursts until the queue pushes back, so the
//! queue runs full; before measuring, one run checks that the queue's storage never grew
//! and that every event arrived once, in order.
//!
//! Run: `cargo bench -p palisade-core --bench delivery`.

use std::collections::VecDeque;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use palisade_core::delivery::{
    Coalescer, CoalescerConfig, EventKind, InOrderReceiver, NotificationQueue, Payload, PayloadLen,
    PushError, Receipt, Seq, StreamEvent, DEFAULT_QUEUE_CAPACITY,
};
use palisade_core::time::Timestamp;

/// Events per measured iteration: enough for many full queues and many batches.
const EVENTS_PER_ITER: u64 = 100_000;

/// Kinds in the stream, tool and resource events included (they count toward the byte cap).
const KINDS: [EventKind; 5] = [
    EventKind::Text,
    EventKind::Thought,
    EventKind::ToolCall,
    EventKind::ToolUpdate,
    EventKind::Resource,
];

/// What one run saw, for the bounded-memory and losslessness checks.
struct Outcome {
    delivered: u64,
    batches: u64,
    high_water: usize,
    reserved_before: usize,
    reserved_after: usize,
    backpressure_events: u64,
}

/// Pushes `events` notifications (the last one `Done`) through queue, coalescer and
/// receiver in virtual time; `payload(i)` makes the i-th payload.
fn run<P: Payload>(events: u64, payload: &impl Fn(u64) -> P) -> Outcome {
    let mut queue: NotificationQueue<(EventKind, P)> =
        NotificationQueue::new(DEFAULT_QUEUE_CAPACITY);
    let mut coalescer: Coalescer<P> = Coalescer::new(CoalescerConfig::default());
    let mut receiver = InOrderReceiver::new();
    let reserved_before = queue.reserved_slots();
    let mut parked: Option<(EventKind, P)> = None;
    let mut produced = 0u64;
    let mut now = Timestamp::ZERO;
    let mut delivered = 0u64;
    let mut batches = 0u64;
    let mut ready = VecDeque::new();

    while delivered < events {
        // Producer: burst until the queue pushes back; the refused item waits, never dropped.
        loop {
            let item = match parked.take() {
                Some(item) => item,
                None if produced < events => {
                    produced += 1;
                    let kind = if produced == events {
                        EventKind::Done
                    } else {
                        KINDS[(produced % KINDS.len() as u64) as usize]
                    };
                    (kind, payload(produced))
                }
                None => break,
            };
            match queue.try_push(item) {
                Ok(_) => {}
                Err(PushError::Backpressure(item)) => {
                    parked = Some(item);
                    break;
                }
                Err(PushError::Closed(_)) => panic!("the queue closed under load"),
            }
        }
        // Consumer: drain the queue through the coalescer.
        while let Some((seq, (kind, p))) = queue.pop() {
            ready.extend(coalescer.push(now, StreamEvent::new(seq, kind, p)));
        }
        now = now.plus_millis(1);
        if coalescer.poll_timeout().is_some_and(|due| due <= now) {
            ready.extend(coalescer.handle_timeout(now));
        }
        // Caller: every event must be the next one.
        for batch in ready.drain(..) {
            batches += 1;
            for event in batch.into_events() {
                match receiver.accept(event.seq, event.payload) {
                    Receipt::Delivered(p) => {
                        black_box(p);
                        delivered += 1;
                    }
                    other => panic!(
                        "lost or repeated at {}: {:?}",
                        event.seq,
                        receipt_name(&other)
                    ),
                }
            }
        }
    }
    assert_eq!(
        receiver.next_expected(),
        Seq::new(events + 1),
        "every event exactly once, in order"
    );
    Outcome {
        delivered,
        batches,
        high_water: queue.stats().high_water,
        reserved_before,
        reserved_after: queue.reserved_slots(),
        backpressure_events: queue.stats().backpressure_events,
    }
}

fn receipt_name<T>(receipt: &Receipt<T>) -> &'static str {
    match receipt {
        Receipt::Delivered(_) => "delivered",
        Receipt::Duplicate { .. } => "duplicate",
        Receipt::Gap { .. } => "gap",
    }
}

/// Payload sizes 0..=299 bytes, so batches close on the byte cap as well as the event cap.
fn size_of_event(i: u64) -> u32 {
    (i.wrapping_mul(37) % 300) as u32
}

fn check_bounded_memory<P: Payload>(name: &str, payload: &impl Fn(u64) -> P) {
    let out = run(EVENTS_PER_ITER, payload);
    assert_eq!(out.delivered, EVENTS_PER_ITER);
    assert!(out.high_water <= DEFAULT_QUEUE_CAPACITY);
    assert_eq!(
        out.reserved_before, out.reserved_after,
        "queue storage grew"
    );
    let slot = std::mem::size_of::<(Seq, (EventKind, P))>();
    eprintln!(
        "delivery/{name}: {} events, {} batches ({:.1} events/batch), queue high water {} of {}, \
         {} backpressure events, queue storage {} slots x {slot} B = {} KiB, unchanged",
        out.delivered,
        out.batches,
        out.delivered as f64 / out.batches as f64,
        out.high_water,
        DEFAULT_QUEUE_CAPACITY,
        out.backpressure_events,
        out.reserved_after,
        out.reserved_after * slot / 1024,
    );
}

fn delivery(c: &mut Criterion) {
    let sized = |i: u64| PayloadLen(size_of_event(i));
    let owned = |i: u64| vec![0u8; size_of_event(i) as usize];
    check_bounded_memory("payload_len", &sized);
    check_bounded_memory("vec_u8", &owned);

    let mut group = c.benchmark_group("delivery");
    group.throughput(Throughput::Elements(EVENTS_PER_ITER));
    group.bench_function(
        BenchmarkId::new("queue_coalescer_receiver", "payload_len"),
        |b| b.iter(|| black_box(run(EVENTS_PER_ITER, &sized).delivered)),
    );
    group.bench_function(
        BenchmarkId::new("queue_coalescer_receiver", "vec_u8"),
        |b| b.iter(|| black_box(run(EVENTS_PER_ITER, &owned).delivered)),
    );
    group.finish();
}

criterion_group!(benches, delivery);
criterion_main!(benches);
