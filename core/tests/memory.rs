//! Memory of the core, measured with a counting global allocator (this test binary's own).
//!
//! Targets (issue 2): a session at rest costs at most 512 bytes, and one session's memory
//! is constant however many attempts it has had (the tombstone ring, the generation
//! history and every queue are bounded). Figures are the bytes the core asked the
//! allocator for, net of what it freed: everything the core holds (its maps' tables, the
//! boxed sessions, the execution records, timers, leases, the effect queue), excluding
//! the allocator's own per-block overhead. The figures it prints go in `reports/bench.md`.
//!
//! The counters are process-wide, so this binary has no test harness (`harness = false`):
//! a harness thread allocating beside a measurement (its "running for over 60 seconds"
//! notice, for one) would show up as core memory. `main` runs the checks one after the
//! other and panics, failing `cargo test`, when a bound is broken.

use std::alloc::System;

use palisade_core::*;
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Sessions measured at once; the per-session figure includes the maps' load-factor slack.
const SESSIONS: u64 = 100_000;
/// The bound for a session at rest.
const MAX_BYTES_PER_SESSION_AT_REST: i64 = 512;
/// A session whose tombstone ring is full also holds the ring's own bounded storage,
/// [`TOMBSTONES_PER_SESSION`] slots of 16 bytes, which the figure does not cover.
const MAX_BYTES_PER_SESSION_FULL_RING: i64 =
    MAX_BYTES_PER_SESSION_AT_REST + 16 * TOMBSTONES_PER_SESSION as i64;
/// Attempts on one session for the constant-memory check, and where it is measured.
const CHECKPOINTS: [u64; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// Bytes allocated and not yet freed. `stats_alloc` books a realloc's growth into
/// `bytes_allocated` (and its shrinkage into `bytes_deallocated`) already.
fn live_bytes() -> i64 {
    let s = GLOBAL.stats();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

const NOW: Timestamp = Timestamp::ZERO;

fn sid(n: u64) -> SessionId {
    SessionId::new(n).unwrap()
}
fn eid(n: u64) -> ExecutionId {
    ExecutionId::new(n).unwrap()
}

/// Feeds one input, drains its effects, and returns the verdict and the last lease.
fn step(core: &mut Core, input: Input) -> (Verdict, Option<LeaseId>) {
    let v = core.handle(NOW, input);
    let mut lease = None;
    while let Some(effect) = core.poll_effect() {
        if let Effect::LoadConversation { lease: l, .. }
        | Effect::NewConversation { lease: l, .. }
        | Effect::DispatchPrompt { lease: l, .. } = effect
        {
            lease = Some(l);
        }
    }
    (v, lease)
}

fn cb(s: SessionId, e: ExecutionId, a: AttemptId, g: Generation, event: RuntimeEvent) -> Input {
    Input::Callback(Callback {
        session: s,
        execution: e,
        attempt: Some(a),
        generation: g,
        event,
    })
}

fn begin(core: &mut Core, session: SessionId) -> AttemptId {
    match step(core, Input::Resume { session }).0 {
        Verdict::Started { attempt } => attempt,
        v => panic!("expected Started, got {v:?}"),
    }
}

fn bind(core: &mut Core, session: SessionId, attempt: AttemptId, e: ExecutionId) -> Generation {
    match step(
        core,
        Input::Bound {
            session,
            attempt,
            execution: e,
        },
    )
    .0
    {
        Verdict::Bound { generation } => generation,
        v => panic!("expected Bound, got {v:?}"),
    }
}

/// Starts an attempt and brings it to a ready runtime on `e`; returns (attempt, generation).
fn ready(
    core: &mut Core,
    session: SessionId,
    e: ExecutionId,
    token: u64,
) -> (AttemptId, Generation) {
    let a = begin(core, session);
    let g = bind(core, session, a, e);
    let ev = RuntimeEvent::AgentReady {
        load_capability: Some(true),
    };
    let (v, lease) = step(core, cb(session, e, a, g, ev));
    assert_eq!(v, Verdict::Accepted);
    assert_eq!(
        step(
            core,
            Input::Perform {
                lease: lease.unwrap()
            }
        )
        .0,
        Verdict::Accepted
    );
    let ev = match core.conversation(session) {
        Some(_) => RuntimeEvent::ConversationLoaded,
        None => RuntimeEvent::ConversationCreated {
            token: ConversationToken::new(token).unwrap(),
        },
    };
    assert_eq!(step(core, cb(session, e, a, g, ev)).0, Verdict::Accepted);
    assert_eq!(core.live_attempt(session), None);
    (a, g)
}

/// Live bytes per session of a core holding `SESSIONS` sessions set up by `setup`.
fn per_session(setup: impl Fn(&mut Core, u64)) -> f64 {
    let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
    let before = live_bytes();
    for n in 1..=SESSIONS {
        setup(&mut core, n);
    }
    let after = live_bytes();
    // Not `check_invariants`: it is quadratic in sessions (meant for small simulated
    // cores). The setup asserted every verdict.
    assert_eq!(core.session_count(), SESSIONS as usize);
    (after - before) as f64 / SESSIONS as f64
}

fn a_session_at_rest_costs_at_most_512_bytes() {
    // Idle after one finished attempt: a ready runtime, its execution record, the
    // attempt's tombstone, the conversation token.
    let at_rest = per_session(|core, n| {
        ready(core, sid(n), eid(n), n);
    });
    // A fresh session: one live attempt waiting for its runtime (and its start timer).
    let fresh = per_session(|core, n| {
        begin(core, sid(n));
    });
    // Idle after a full ring: 20 attempts (cancelled, failed, finished), then ready.
    let full_ring = per_session(|core, n| {
        let s = sid(n);
        for k in 0..19u64 {
            let a = begin(core, s);
            if k % 2 == 0 {
                let g = bind(core, s, a, eid(n));
                let stamp = ErrorStamp::new(k + 1).unwrap();
                let ev = RuntimeEvent::StartFailed { stamp };
                assert_eq!(step(core, cb(s, eid(n), a, g, ev)).0, Verdict::Accepted);
                assert_eq!(
                    step(core, Input::Stopped { execution: eid(n) }).0,
                    Verdict::Accepted
                );
            } else {
                assert_eq!(
                    step(core, Input::Cancel { session: s }).0,
                    Verdict::Accepted
                );
            }
        }
        ready(core, s, eid(n), n);
    });
    println!(
        "memory: bytes per session ({SESSIONS} sessions): at rest after one finished attempt \
         {at_rest:.1}; fresh (live attempt, unbound) {fresh:.1}; at rest after 20 attempts \
         (full tombstone ring) {full_ring:.1}"
    );
    for (what, bytes, bound) in [
        ("at rest", at_rest, MAX_BYTES_PER_SESSION_AT_REST),
        ("fresh", fresh, MAX_BYTES_PER_SESSION_AT_REST),
        (
            "at rest, full ring",
            full_ring,
            MAX_BYTES_PER_SESSION_FULL_RING,
        ),
    ] {
        assert!(
            bytes <= bound as f64,
            "{what}: {bytes:.1} bytes per session, bound {bound}"
        );
    }
}

/// One attempt of a rotating mix, so every path that keeps per-session state is used:
/// ready then the runtime exits; cancel before binding; bind then cancel and stop; start
/// failure; ready, a turn streams and completes, then the runtime exits.
fn one_attempt(core: &mut Core, k: u64, turn: &mut u64) {
    let (s, e) = (sid(1), eid(1 + k % 3));
    match k % 5 {
        0 | 4 => {
            let (a, g) = ready(core, s, e, 1);
            if k % 5 == 4 {
                *turn += 1;
                let t = TurnId::new(*turn).unwrap();
                let (v, lease) = step(
                    core,
                    Input::Prompt {
                        session: s,
                        turn: t,
                    },
                );
                assert_eq!(v, Verdict::Claimed);
                assert_eq!(
                    step(
                        core,
                        Input::Perform {
                            lease: lease.unwrap()
                        }
                    )
                    .0,
                    Verdict::Accepted
                );
                let ev = RuntimeEvent::PromptAccepted { turn: t };
                assert_eq!(step(core, cb(s, e, a, g, ev)).0, Verdict::Accepted);
                for seq in 1..=4 {
                    let ev = RuntimeEvent::Stream {
                        turn: t,
                        seq,
                        bytes: 100,
                    };
                    assert_eq!(step(core, cb(s, e, a, g, ev)).0, Verdict::Accepted);
                }
                let ev = RuntimeEvent::PromptCompleted { turn: t };
                assert_eq!(step(core, cb(s, e, a, g, ev)).0, Verdict::Accepted);
            }
            let stamp = ErrorStamp::new(k + 1).unwrap();
            let ev = RuntimeEvent::Exited { stamp };
            assert_eq!(step(core, cb(s, e, a, g, ev)).0, Verdict::Accepted);
        }
        1 => {
            begin(core, s);
            assert_eq!(
                step(core, Input::Cancel { session: s }).0,
                Verdict::Accepted
            );
        }
        2 => {
            let a = begin(core, s);
            bind(core, s, a, e);
            assert_eq!(
                step(core, Input::Cancel { session: s }).0,
                Verdict::Accepted
            );
            assert_eq!(
                step(core, Input::Stopped { execution: e }).0,
                Verdict::Accepted
            );
        }
        _ => {
            let a = begin(core, s);
            let g = bind(core, s, a, e);
            let stamp = ErrorStamp::new(k + 1).unwrap();
            let ev = RuntimeEvent::StartFailed { stamp };
            assert_eq!(step(core, cb(s, e, a, g, ev)).0, Verdict::Accepted);
            assert_eq!(
                step(core, Input::Stopped { execution: e }).0,
                Verdict::Accepted
            );
        }
    }
    assert!(!core.session_busy(s), "attempt {k} left the session busy");
}

fn memory_is_constant_over_a_million_attempts_on_one_session() {
    // Allocated before the baseline, so the test's own bookkeeping is not counted.
    let mut at = Vec::with_capacity(CHECKPOINTS.len());
    let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
    let base = live_bytes();
    let mut turn = 0;
    let mut k = 0;
    for checkpoint in CHECKPOINTS {
        while k < checkpoint {
            one_attempt(&mut core, k, &mut turn);
            k += 1;
        }
        core.check_invariants().unwrap();
        at.push((checkpoint, live_bytes() - base));
    }
    let shown: Vec<String> = at
        .iter()
        .map(|(n, b)| format!("{n} attempts: {b} B"))
        .collect();
    println!("memory: one session, live bytes after {}", shown.join("; "));
    let first = at[0].1;
    for (n, bytes) in &at {
        assert_eq!(
            *bytes, first,
            "live bytes after {n} attempts differ from after 1,000"
        );
    }
}

fn main() {
    let checks: [(&str, fn()); 2] = [
        (
            "a_session_at_rest_costs_at_most_512_bytes",
            a_session_at_rest_costs_at_most_512_bytes,
        ),
        (
            "memory_is_constant_over_a_million_attempts_on_one_session",
            memory_is_constant_over_a_million_attempts_on_one_session,
        ),
    ];
    let mut failed = 0;
    for (name, check) in checks {
        let ok = std::panic::catch_unwind(check).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        failed += usize::from(!ok);
    }
    assert_eq!(failed, 0, "{failed} memory check(s) failed");
}
