#![allow(missing_docs)] // criterion_group! generates undocumented items.
//! Throughput of the core's hot paths (`cargo bench -p palisade-core --bench core`).
//!
//! Targets (issue 2, figures in `reports/bench.md`):
//!
//! - `admission/*`: callback admission, at least 10 million decisions/s on one core with
//!   100,000 live sessions. Every session has a bound attempt on its own execution; half of
//!   them have a ready runtime running an accepted turn. The mix is accepted stream events
//!   (of ready runtimes) and `boot_ready` (of live attempts), plus stale-generation,
//!   cancelled-attempt and unknown-attempt rejections (10 of every 16 accepted). `uniform`
//!   picks the sessions of each decision uniformly at random among all 100,000, so nearly
//!   every decision misses the caches; `bursty` sends runs of 8 decisions to one pair of
//!   sessions, as a streaming runtime does; `hot_1k` spreads decisions uniformly over 1,024
//!   of the 100,000 sessions (the rest idle), so the hot state fits in cache and the figure
//!   is the core's own cost. Criterion's `thrpt` is decisions per second.
//! - `cycle/*`: begin + finish, at least 2 million cycles/s. `full` is the whole life of a
//!   resume: the ready runtime exits, `Resume` starts a new attempt, `Bound`, `AgentReady`,
//!   `Perform` of the load, `ConversationLoaded` settles it `Ready` (six inputs).
//!   `begin_cancel` is the minimal cycle: `Resume` then `Cancel` (two inputs). Each runs on
//!   one session and round-robin over 100,000 sessions. `thrpt` is cycles per second.
//!
//! Every input is followed by draining `poll_effect` until `None`, as the embed loop must;
//! that is part of the cost. Before measuring, one checked pass asserts every verdict.
//! Each fixture is built on first use, so a filtered run (`-- cycle/full`) skips the rest.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use palisade_core::{
    AttemptId, Callback, Config, ConversationToken, Core, Effect, Epoch, ErrorStamp, ExecutionId,
    Generation, Input, LeaseId, RejectReason, RuntimeEvent, SessionId, Timestamp, TurnId, Verdict,
};

/// Sessions in the populated core.
const SESSIONS: u64 = 100_000;
/// Decisions per measured admission iteration.
const DECISIONS_PER_ITER: usize = 100_000;
/// Cycles per measured cycle iteration.
const CYCLES_PER_ITER: u64 = 10_000;
/// Consecutive decisions per session pair in the bursty admission mix.
const BURST: usize = 8;
/// Sessions that receive callbacks in the `hot_1k` mix (the rest sit idle in the core).
const HOT_SESSIONS: u64 = 1_024;

const NOW: Timestamp = Timestamp::ZERO;

fn sid(n: u64) -> SessionId {
    SessionId::new(n).expect("session numbers start at 1")
}
fn eid(n: u64) -> ExecutionId {
    ExecutionId::new(n).expect("execution numbers start at 1")
}
fn turn1() -> TurnId {
    TurnId::new(1).expect("non-zero")
}

/// Drains every effect; returns the lease of the last leased effect, if any.
#[inline]
fn drain(core: &mut Core) -> Option<LeaseId> {
    let mut lease = None;
    while let Some(effect) = core.poll_effect() {
        match effect {
            Effect::LoadConversation { lease: l, .. }
            | Effect::NewConversation { lease: l, .. }
            | Effect::DispatchPrompt { lease: l, .. } => lease = Some(l),
            other => {
                black_box(other);
            }
        }
    }
    lease
}

/// Feeds one input and drains its effects.
#[inline]
fn step(core: &mut Core, input: Input) -> (Verdict, Option<LeaseId>) {
    let v = core.handle(NOW, input);
    let lease = drain(core);
    (v, lease)
}

fn cb(
    session: SessionId,
    execution: ExecutionId,
    attempt: AttemptId,
    generation: Generation,
    event: RuntimeEvent,
) -> Input {
    Input::Callback(Callback {
        session,
        execution,
        attempt: Some(attempt),
        generation,
        event,
    })
}

fn started(v: Verdict) -> AttemptId {
    match v {
        Verdict::Started { attempt } => attempt,
        other => panic!("expected Started, got {other:?}"),
    }
}

fn bound(v: Verdict) -> Generation {
    match v {
        Verdict::Bound { generation } => generation,
        other => panic!("expected Bound, got {other:?}"),
    }
}

// ----- admission ------------------------------------------------------------------------

/// What the fixture knows about one session.
#[derive(Clone, Copy)]
struct Fixture {
    session: SessionId,
    execution: ExecutionId,
    /// The first attempt, cancelled after binding generation `g1` of the execution.
    cancelled: AttemptId,
    g1: Generation,
    /// The second attempt, bound to generation `g2` of the same execution: still live, or
    /// finished and owning a ready runtime with an accepted turn (even session numbers).
    current: AttemptId,
    g2: Generation,
}

/// Builds a core with `SESSIONS` sessions: odd ones have a live attempt bound to their
/// execution, even ones a ready runtime streaming an accepted turn. Every session also has
/// a cancelled predecessor on the same execution (an older generation).
fn populated() -> (Core, Vec<Fixture>) {
    let mut core = Core::new(Config::default(), Epoch::FIRST).expect("default config is valid");
    let mut fixtures = Vec::with_capacity(SESSIONS as usize);
    for n in 1..=SESSIONS {
        let (session, execution) = (sid(n), eid(n));
        let cancelled = started(step(&mut core, Input::Resume { session }).0);
        let g1 = bound(
            step(
                &mut core,
                Input::Bound {
                    session,
                    attempt: cancelled,
                    execution,
                },
            )
            .0,
        );
        assert_eq!(
            step(&mut core, Input::Cancel { session }).0,
            Verdict::Accepted
        );
        assert_eq!(
            step(&mut core, Input::Stopped { execution }).0,
            Verdict::Accepted
        );
        let current = started(step(&mut core, Input::Resume { session }).0);
        let g2 = bound(
            step(
                &mut core,
                Input::Bound {
                    session,
                    attempt: current,
                    execution,
                },
            )
            .0,
        );
        let ready = n % 2 == 0;
        if ready {
            let ev = RuntimeEvent::AgentReady {
                load_capability: Some(true),
            };
            let (v, lease) = step(&mut core, cb(session, execution, current, g2, ev));
            assert_eq!(v, Verdict::Accepted);
            let lease = lease.expect("agent_ready leases session/new");
            assert_eq!(
                step(&mut core, Input::Perform { lease }).0,
                Verdict::Accepted
            );
            let token = ConversationToken::new(n).expect("non-zero");
            let ev = RuntimeEvent::ConversationCreated { token };
            assert_eq!(
                step(&mut core, cb(session, execution, current, g2, ev)).0,
                Verdict::Accepted
            );
            let (v, lease) = step(
                &mut core,
                Input::Prompt {
                    session,
                    turn: turn1(),
                },
            );
            assert_eq!(v, Verdict::Claimed);
            let lease = lease.expect("a ready runtime gets the prompt at once");
            assert_eq!(
                step(&mut core, Input::Perform { lease }).0,
                Verdict::Accepted
            );
            let ev = RuntimeEvent::PromptAccepted { turn: turn1() };
            assert_eq!(
                step(&mut core, cb(session, execution, current, g2, ev)).0,
                Verdict::Accepted
            );
        }
        fixtures.push(Fixture {
            session,
            execution,
            cancelled,
            g1,
            current,
            g2,
        });
    }
    assert_eq!(core.session_count(), SESSIONS as usize);
    (core, fixtures)
}

/// One decision of the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The next stream event of a ready runtime's accepted turn: accepted.
    Stream,
    /// `boot_ready` of a live attempt: accepted.
    BootReady,
    /// The current attempt with its execution's previous generation.
    StaleGeneration,
    /// The cancelled predecessor's late `boot_ready`.
    Cancelled,
    /// Another session's attempt ID.
    ForeignAttempt,
    /// An attempt ID the core never minted.
    FutureAttempt,
}

/// Sixteen decisions: 10 accepted, 6 rejected.
const MIX: [Kind; 16] = [
    Kind::Stream,
    Kind::BootReady,
    Kind::Stream,
    Kind::StaleGeneration,
    Kind::Stream,
    Kind::BootReady,
    Kind::Cancelled,
    Kind::Stream,
    Kind::ForeignAttempt,
    Kind::BootReady,
    Kind::Stream,
    Kind::StaleGeneration,
    Kind::Stream,
    Kind::Cancelled,
    Kind::BootReady,
    Kind::FutureAttempt,
];

/// A fixed pseudo-random sequence (splitmix64), so every run measures the same schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A session index of the given readiness, among the first `hot` sessions.
    fn session(&mut self, ready: bool, hot: u64) -> u32 {
        // Even session numbers (odd indices) are ready.
        let k = self.next() % (hot / 2);
        (2 * k + u64::from(ready)) as u32
    }
}

/// A precomputed decision: which session, what kind, and for a foreign attempt whose ID.
#[derive(Clone, Copy)]
struct Decision {
    index: u32,
    kind: Kind,
    other: u32,
}

/// The schedule of one iteration, over the first `hot` sessions. `burst` decisions in a row
/// go to one pair of sessions (stream events to a ready one, `boot_ready` to a live one).
fn schedule(burst: usize, hot: u64) -> Vec<Decision> {
    let mut rng = Rng(0x5eed);
    let mut out = Vec::with_capacity(DECISIONS_PER_ITER);
    let (mut ready_idx, mut live_idx) = (0, 0);
    for i in 0..DECISIONS_PER_ITER {
        if i % burst == 0 {
            ready_idx = rng.session(true, hot);
            live_idx = rng.session(false, hot);
        }
        let kind = MIX[i % MIX.len()];
        let index = match kind {
            Kind::Stream => ready_idx,
            Kind::BootReady => live_idx,
            // Rejections hit either kind of session.
            _ if i % 2 == 0 => ready_idx,
            _ => live_idx,
        };
        let other = (u64::from(index) + 1 + rng.next() % (SESSIONS - 1)) % SESSIONS;
        out.push(Decision {
            index,
            kind,
            other: other as u32,
        });
    }
    out
}

/// Runs one schedule; returns (accepted, rejected) and checks reasons when `check`.
#[inline(never)]
fn admit(
    core: &mut Core,
    fixtures: &[Fixture],
    next_seq: &mut [u64],
    schedule: &[Decision],
    future: AttemptId,
    check: bool,
) -> (u64, u64) {
    let (mut accepted, mut rejected) = (0u64, 0u64);
    for d in schedule {
        let f = &fixtures[d.index as usize];
        let input = match d.kind {
            Kind::Stream => {
                let seq = &mut next_seq[d.index as usize];
                *seq += 1;
                cb(
                    f.session,
                    f.execution,
                    f.current,
                    f.g2,
                    RuntimeEvent::Stream {
                        turn: turn1(),
                        seq: *seq,
                        bytes: 120,
                    },
                )
            }
            Kind::BootReady => cb(
                f.session,
                f.execution,
                f.current,
                f.g2,
                RuntimeEvent::BootReady,
            ),
            Kind::StaleGeneration => cb(
                f.session,
                f.execution,
                f.current,
                f.g1,
                RuntimeEvent::BootReady,
            ),
            Kind::Cancelled => cb(
                f.session,
                f.execution,
                f.cancelled,
                f.g1,
                RuntimeEvent::BootReady,
            ),
            Kind::ForeignAttempt => cb(
                f.session,
                f.execution,
                fixtures[d.other as usize].current,
                f.g2,
                RuntimeEvent::BootReady,
            ),
            Kind::FutureAttempt => cb(
                f.session,
                f.execution,
                future,
                f.g2,
                RuntimeEvent::BootReady,
            ),
        };
        let v = core.handle(NOW, input);
        while let Some(effect) = core.poll_effect() {
            black_box(effect);
        }
        if check {
            let want = match d.kind {
                Kind::Stream | Kind::BootReady => Verdict::Accepted,
                Kind::StaleGeneration => Verdict::Reject(RejectReason::StaleGeneration),
                Kind::Cancelled => Verdict::Reject(RejectReason::AttemptCancelled),
                Kind::ForeignAttempt | Kind::FutureAttempt => {
                    Verdict::Reject(RejectReason::UnknownAttempt)
                }
            };
            assert_eq!(v, want, "{:?} on session {}", d.kind, f.session);
        }
        if v == Verdict::Accepted {
            accepted += 1;
        } else {
            rejected += 1;
        }
    }
    (accepted, rejected)
}

/// The populated core and what the admission benchmark keeps between iterations.
struct Admission {
    core: Core,
    fixtures: Vec<Fixture>,
    next_seq: Vec<u64>,
    future: AttemptId,
}

impl Admission {
    fn new() -> Admission {
        let (core, fixtures) = populated();
        let next_seq = vec![0u64; fixtures.len()];
        let future = AttemptId::new(Epoch::FIRST, 1 << 40).expect("in range");
        Admission {
            core,
            fixtures,
            next_seq,
            future,
        }
    }

    fn run(&mut self, schedule: &[Decision], check: bool) -> (u64, u64) {
        admit(
            &mut self.core,
            &self.fixtures,
            &mut self.next_seq,
            schedule,
            self.future,
            check,
        )
    }
}

fn admission(c: &mut Criterion) {
    // Built on first use, so a filtered run (`--bench ... cycle`) does not pay for it.
    let mut state: Option<Admission> = None;
    let mut group = c.benchmark_group("admission");
    group.throughput(Throughput::Elements(DECISIONS_PER_ITER as u64));
    for (name, burst, hot) in [
        ("uniform", 1, SESSIONS),
        ("bursty", BURST, SESSIONS),
        ("hot_1k", 1, HOT_SESSIONS),
    ] {
        let sched = schedule(burst, hot);
        group.bench_function(BenchmarkId::new("100k_sessions", name), |b| {
            let st = state.get_or_insert_with(|| {
                let mut st = Admission::new();
                for burst in [1, BURST] {
                    for hot in [SESSIONS, HOT_SESSIONS] {
                        let (acc, rej) = st.run(&schedule(burst, hot), true);
                        assert_eq!(acc * 16, 10 * DECISIONS_PER_ITER as u64, "10 of 16");
                        assert_eq!(acc + rej, DECISIONS_PER_ITER as u64);
                    }
                }
                st
            });
            b.iter(|| black_box(st.run(&sched, false)))
        });
    }
    group.finish();
    // No `check_invariants` here: it is meant for small simulated cores, and its per-session
    // scan of the executions is quadratic at 100,000 sessions. The checked passes above
    // asserted every verdict instead.
}

// ----- begin + finish ---------------------------------------------------------------------

/// A session at rest with a ready runtime.
#[derive(Clone, Copy)]
struct AtRest {
    session: SessionId,
    execution: ExecutionId,
    owner: AttemptId,
    generation: Generation,
}

/// Exit of the ready runtime, then a full resume to a ready runtime: six inputs.
#[inline]
fn full_cycle(core: &mut Core, r: &mut AtRest, stamp: &mut u64) {
    let AtRest {
        session, execution, ..
    } = *r;
    *stamp += 1;
    let exited = RuntimeEvent::Exited {
        stamp: ErrorStamp::new(*stamp).expect("non-zero"),
    };
    let v = step(core, cb(session, execution, r.owner, r.generation, exited)).0;
    debug_assert_eq!(v, Verdict::Accepted);
    let attempt = started(step(core, Input::Resume { session }).0);
    let generation = bound(
        step(
            core,
            Input::Bound {
                session,
                attempt,
                execution,
            },
        )
        .0,
    );
    let ev = RuntimeEvent::AgentReady {
        load_capability: Some(true),
    };
    let (v, lease) = step(core, cb(session, execution, attempt, generation, ev));
    debug_assert_eq!(v, Verdict::Accepted);
    let lease = lease.expect("agent_ready leases the conversation");
    let v = step(core, Input::Perform { lease }).0;
    debug_assert_eq!(v, Verdict::Accepted);
    let v = step(
        core,
        cb(
            session,
            execution,
            attempt,
            generation,
            RuntimeEvent::ConversationLoaded,
        ),
    )
    .0;
    debug_assert_eq!(v, Verdict::Accepted);
    r.owner = attempt;
    r.generation = generation;
}

/// `Resume` then `Cancel` before a runtime was bound: two inputs.
#[inline]
fn begin_cancel(core: &mut Core, session: SessionId) {
    let v = step(core, Input::Resume { session }).0;
    debug_assert!(matches!(v, Verdict::Started { .. }), "{v:?}");
    black_box(v);
    let v = step(core, Input::Cancel { session }).0;
    debug_assert_eq!(v, Verdict::Accepted);
}

/// A core with `n` sessions at rest, each with a ready runtime (conversation created once).
fn at_rest(n: u64) -> (Core, Vec<AtRest>) {
    let mut core = Core::new(Config::default(), Epoch::FIRST).expect("default config is valid");
    let mut out = Vec::with_capacity(n as usize);
    for k in 1..=n {
        let (session, execution) = (sid(k), eid(k));
        let attempt = started(step(&mut core, Input::Resume { session }).0);
        let generation = bound(
            step(
                &mut core,
                Input::Bound {
                    session,
                    attempt,
                    execution,
                },
            )
            .0,
        );
        let ev = RuntimeEvent::AgentReady {
            load_capability: Some(true),
        };
        let lease = step(&mut core, cb(session, execution, attempt, generation, ev))
            .1
            .expect("leased");
        assert_eq!(
            step(&mut core, Input::Perform { lease }).0,
            Verdict::Accepted
        );
        let token = ConversationToken::new(k).expect("non-zero");
        let ev = RuntimeEvent::ConversationCreated { token };
        assert_eq!(
            step(&mut core, cb(session, execution, attempt, generation, ev)).0,
            Verdict::Accepted
        );
        out.push(AtRest {
            session,
            execution,
            owner: attempt,
            generation,
        });
    }
    (core, out)
}

/// One checked full cycle: every verdict and effect as the embed loop expects.
fn check_full_cycle(core: &mut Core, r: &mut AtRest) {
    let before = r.owner;
    let mut stamp = 1 << 32;
    full_cycle(core, r, &mut stamp);
    assert!(r.owner > before);
    assert_eq!(core.live_attempt(r.session), None, "the attempt settled");
    assert_eq!(
        core.handle(NOW, Input::Resume { session: r.session }),
        Verdict::AlreadyReady,
        "the runtime is ready"
    );
    assert!(core.poll_effect().is_none());
    if core.session_count() == 1 {
        core.check_invariants().expect("sound after a cycle");
    }
}

/// A core with `n` sessions that each had one cancelled attempt (no runtime).
fn cancelled_once(n: u64) -> Core {
    let mut core = Core::new(Config::default(), Epoch::FIRST).expect("valid");
    for k in 1..=n {
        let v = step(&mut core, Input::Resume { session: sid(k) }).0;
        assert!(matches!(v, Verdict::Started { .. }), "{v:?}");
        let v = step(&mut core, Input::Cancel { session: sid(k) }).0;
        assert_eq!(v, Verdict::Accepted);
    }
    if n == 1 {
        core.check_invariants().expect("sound");
    }
    core
}

fn cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("cycle");
    group.throughput(Throughput::Elements(CYCLES_PER_ITER));

    for sessions in [1, SESSIONS] {
        let label = if sessions == 1 {
            "one_session"
        } else {
            "100k_sessions"
        };
        // Built on first use, so a filtered run does not pay for the setups it skips.
        let mut full: Option<(Core, Vec<AtRest>, u64, usize)> = None;
        group.bench_function(BenchmarkId::new("full", label), |b| {
            let (core, rest, stamp, next) = full.get_or_insert_with(|| {
                let (mut core, mut rest) = at_rest(sessions);
                check_full_cycle(&mut core, &mut rest[0]);
                (core, rest, 0, 0)
            });
            b.iter(|| {
                for _ in 0..CYCLES_PER_ITER {
                    full_cycle(core, &mut rest[*next], stamp);
                    *next += 1;
                    if *next == rest.len() {
                        *next = 0;
                    }
                }
            })
        });
        if let Some((core, ..)) = &full {
            if sessions == 1 {
                core.check_invariants()
                    .expect("sound after the full cycles");
            }
        }

        let mut minimal: Option<(Core, u64)> = None;
        group.bench_function(BenchmarkId::new("begin_cancel", label), |b| {
            let (core, k) = minimal.get_or_insert_with(|| (cancelled_once(sessions), 0));
            b.iter(|| {
                for _ in 0..CYCLES_PER_ITER {
                    begin_cancel(core, sid(*k % sessions + 1));
                    *k += 1;
                }
            })
        });
        if let Some((core, _)) = &minimal {
            if sessions == 1 {
                core.check_invariants()
                    .expect("sound after the begin/cancel cycles");
            }
        }
    }
    group.finish();
}

criterion_group!(benches, admission, cycle);
criterion_main!(benches);
