//! One test per rule, named after the behaviour. Each `case_*` returns `Err` when the
//! behaviour is broken; the real core must pass every case, and (feature `mutants`) each
//! mutant must make its case fail: that is the proof the case can see the bug.

mod common;
use common::*;
use palisade_core::classify::{
    ClassifyReason, ErrorAnswer, LoadFailure, LoadOutcome, SessionListing, TransportState,
};
use palisade_core::*;

type R = Result<(), String>;

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn clean(h: &H) -> R {
    match h.violation() {
        None => Ok(()),
        Some(v) => Err(v),
    }
}

fn load_failed(code: i64, message: &str) -> RuntimeEvent {
    RuntimeEvent::LoadFailed(LoadOutcome {
        load_capability: Some(true),
        requested_session: "sess-1".into(),
        result: LoadFailure::Rpc(ErrorAnswer {
            code,
            message: message.into(),
            data_details: None,
            data_present: false,
        }),
        transport: TransportState::Open,
        listing: SessionListing::Unknown,
    })
}

fn timed_out() -> RuntimeEvent {
    RuntimeEvent::LoadFailed(LoadOutcome {
        load_capability: Some(true),
        requested_session: "sess-1".into(),
        result: LoadFailure::TimedOut,
        transport: TransportState::Open,
        listing: SessionListing::Unknown,
    })
}

// ----- rule 1 -----------------------------------------------------------------------------

fn case_joiner_wait_is_bounded(mut h: H) -> R {
    check!(
        matches!(h.resume(1), Verdict::Started { .. }),
        "first resume starts"
    );
    let until = match h.resume(1) {
        Verdict::Joined { until, .. } => until,
        v => return Err(format!("second resume joins, got {v:?}")),
    };
    check!(
        until <= h.now.plus_millis(h.core().config().join_wait_ms),
        "join deadline {until} unbounded"
    );
    let wait = h.core().config().join_wait_ms;
    h.advance(wait);
    check!(
        h.count(|e| matches!(e, Effect::JoinTimedOut { .. })) == 1,
        "joiner was never answered"
    );
    clean(&h)
}

#[test]
fn second_resume_joins_the_live_attempt_with_a_bounded_wait() {
    assert_eq!(case_joiner_wait_is_bounded(H::default()), Ok(()));
}

/// Found by the sweep (reports/regressions/found/later-join-extends-earlier-wait.json):
/// a second joiner moved the attempt's one join timer out, so the first joiner waited past
/// the deadline it was promised.
#[test]
fn a_later_join_never_extends_an_earlier_joiners_wait() {
    let mut h = H::default();
    assert!(matches!(h.resume(1), Verdict::Started { .. }));
    let Verdict::Joined { until: first, .. } = h.resume(1) else {
        panic!("joins")
    };
    h.advance(h.core().config().join_wait_ms / 2);
    let Verdict::Joined { until: second, .. } = h.resume(1) else {
        panic!("joins again")
    };
    assert_eq!(
        second, first,
        "the later joiner gets the deadline already running"
    );
    let left = first.millis_since(h.now);
    h.advance(left);
    assert_eq!(
        h.count(|e| matches!(e, Effect::JoinTimedOut { .. })),
        1,
        "the first joiner is answered at its own deadline"
    );
    h.assert_clean();
}

#[test]
fn resume_after_cancel_retires_the_cancelled_attempt_and_starts_a_new_one() {
    let mut h = H::default();
    let Verdict::Started { attempt: a1 } = h.resume(1) else {
        panic!()
    };
    assert_eq!(h.cancel(1), Verdict::Accepted);
    let Verdict::Started { attempt: a2 } = h.resume(1) else {
        panic!()
    };
    assert!(a2 > a1);
    assert_eq!(
        h.count(|e| matches!(
            e,
            Effect::AttemptSettled {
                outcome: AttemptOutcome::Cancelled,
                ..
            }
        )),
        1
    );
    h.assert_clean();
}

// ----- rule 2 -----------------------------------------------------------------------------

#[test]
fn callback_of_a_cancelled_attempt_is_rejected() {
    let mut h = H::default();
    h.resume(1);
    let a = h.started(1);
    let Verdict::Bound { generation: g } = h.bind(1, a, 1) else {
        panic!()
    };
    h.cancel(1);
    assert_eq!(
        h.cb(1, 1, Some(a), g, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::AttemptCancelled)
    );
    h.assert_clean();
}

fn case_evicted_attempt_fails_closed(mut h: H) -> R {
    h.resume(1);
    let first = h.started(1);
    let g = match h.bind(1, first, 1) {
        Verdict::Bound { generation } => generation,
        v => return Err(format!("bind: {v:?}")),
    };
    h.cancel(1);
    h.input(Input::Stopped { execution: e(1) });
    for _ in 0..(TOMBSTONES_PER_SESSION + 1) {
        h.resume(1);
        h.cancel(1);
    }
    let v = h.cb(
        1,
        1,
        Some(first),
        g,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    check!(
        v == Verdict::Reject(RejectReason::AttemptEvicted),
        "very late callback of an evicted attempt: {v:?}"
    );
    clean(&h)
}

#[test]
fn very_late_callback_after_tombstone_eviction_fails_closed() {
    assert_eq!(case_evicted_attempt_fails_closed(H::default()), Ok(()));
}

/// The very late ready callback of an evicted attempt (its agent ignored the EOF of its
/// teardown and its stdout stalled) arrives while a prompt waits for the replacement's
/// runtime, still starting: it must not send the prompt anywhere (kandev's legacy path sent
/// it to the session's current runtime, before that runtime was ready).
fn case_evicted_ready_callback_leaves_the_waiting_turn(mut h: H) -> R {
    h.resume(1);
    let first = h.started(1);
    let g = match h.bind(1, first, 1) {
        Verdict::Bound { generation } => generation,
        v => return Err(format!("bind: {v:?}")),
    };
    h.cancel(1);
    for _ in 0..(TOMBSTONES_PER_SESSION + 1) {
        h.resume(1);
        h.cancel(1);
    }
    h.resume(1);
    let last = h.started(1);
    if !matches!(h.bind(1, last, 99), Verdict::Bound { .. }) {
        return Err("the replacement did not bind".into());
    }
    check!(
        h.prompt(1, 1) == Verdict::Claimed,
        "the prompt waits for the replacement"
    );
    let dispatches = |h: &H| h.count(|e| matches!(e, Effect::DispatchPrompt { .. }));
    let before = dispatches(&h);
    let v = h.cb(
        1,
        1,
        Some(first),
        g,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    check!(
        v == Verdict::Reject(RejectReason::AttemptEvicted),
        "very late ready callback of an evicted attempt: {v:?}"
    );
    check!(
        dispatches(&h) == before,
        "the evicted attempt's ready callback dispatched the waiting turn"
    );
    clean(&h)
}

#[test]
fn very_late_ready_callback_after_tombstone_eviction_dispatches_nothing() {
    assert_eq!(
        case_evicted_ready_callback_leaves_the_waiting_turn(H::default()),
        Ok(())
    );
}

#[test]
fn callback_without_attempt_is_accepted_only_before_the_first_attempt() {
    let mut h = H::default();
    let g = Generation::new(1).unwrap();
    // No attempt yet: legacy traffic passes the attempt fence (and finds no execution).
    assert_eq!(
        h.cb(1, 1, None, g, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::UnknownSession)
    );
    h.resume(1);
    assert_eq!(
        h.cb(1, 1, None, g, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::MissingAttempt)
    );
    h.assert_clean();
}

#[test]
fn attempt_ids_of_other_sessions_and_future_epochs_are_rejected() {
    let mut h = H::default();
    h.resume(1);
    let a1 = h.started(1);
    let Verdict::Bound { generation: g } = h.bind(1, a1, 1) else {
        panic!()
    };
    h.resume(2);
    let a2 = h.started(2);
    assert_eq!(
        h.cb(1, 1, Some(a2), g, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::UnknownAttempt)
    );
    let future = AttemptId::new(Epoch::FIRST.next().unwrap(), 1).unwrap();
    assert_eq!(
        h.cb(1, 1, Some(future), g, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::FutureEpoch)
    );
    let unminted = AttemptId::new(Epoch::FIRST, 999).unwrap();
    assert_eq!(
        h.cb(1, 1, Some(unminted), g, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::UnknownAttempt)
    );
    assert_eq!(
        h.cb(1, 1, Some(a1), g, RuntimeEvent::BootReady),
        Verdict::Accepted
    );
    h.assert_clean();
}

/// kandev #3636: a cancelled resume's late callback must not dispatch the stale prompt.
fn case_stale_ready_does_not_dispatch(mut h: H) -> R {
    h.prompt(1, 1);
    let a1 = h.started(1);
    let g1 = match h.bind(1, a1, 1) {
        Verdict::Bound { generation } => generation,
        v => return Err(format!("bind: {v:?}")),
    };
    h.cb(
        1,
        1,
        Some(a1),
        g1,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    let lease = h.last_lease();
    h.perform(lease);
    // The load is slow; the user cancels and retries.
    h.cancel(1);
    h.prompt(1, 2);
    let a2 = h.started(1);
    check!(a2 > a1, "retry starts a new attempt");
    // The cancelled attempt's load finally answers.
    let v = h.cb(
        1,
        1,
        Some(a1),
        g1,
        RuntimeEvent::ConversationCreated { token: token(9) },
    );
    check!(
        v.is_reject(),
        "late ready of the cancelled attempt accepted: {v:?}"
    );
    let stale = h.count(
        |e| matches!(e, Effect::DispatchPrompt { execution, .. } if *execution == common::e(1)),
    );
    check!(
        stale == 0,
        "the stale prompt was dispatched to the cancelled attempt's runtime"
    );
    clean(&h)
}

#[test]
fn stale_agent_ready_of_a_cancelled_attempt_does_not_dispatch_its_prompt() {
    assert_eq!(case_stale_ready_does_not_dispatch(H::default()), Ok(()));
}

// ----- rule 3 -----------------------------------------------------------------------------

#[test]
fn retiring_is_idempotent_one_tombstone_per_attempt() {
    let mut h = H::default();
    h.resume(1);
    assert_eq!(h.cancel(1), Verdict::Accepted);
    assert_eq!(h.cancel(1), Verdict::Ignored);
    assert_eq!(h.count(|e| matches!(e, Effect::AttemptSettled { .. })), 1);
    h.assert_clean();
}

// ----- rule 4 -----------------------------------------------------------------------------

#[test]
fn stale_generation_after_a_replacement_on_the_same_execution_is_rejected() {
    let mut h = H::default();
    h.resume(1);
    let a1 = h.started(1);
    let Verdict::Bound { generation: g1 } = h.bind(1, a1, 1) else {
        panic!()
    };
    h.cancel(1);
    assert_eq!(
        h.input(Input::Stopped { execution: e(1) }),
        Verdict::Accepted
    );
    h.resume(1);
    let a2 = h.started(1);
    let Verdict::Bound { generation: g2 } = h.bind(1, a2, 1) else {
        panic!()
    };
    assert!(g2 > g1);
    assert_eq!(
        h.cb(1, 1, Some(a2), g1, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::StaleGeneration)
    );
    let future = Generation::new(g2.get() + 5).unwrap();
    assert_eq!(
        h.cb(1, 1, Some(a2), future, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::FutureGeneration)
    );
    assert_eq!(
        h.cb(1, 1, Some(a2), g2, RuntimeEvent::BootReady),
        Verdict::Accepted
    );
    h.assert_clean();
}

/// A replacement startup slips between a callback's validation and its effect.
fn case_late_effect_after_replacement_is_dropped(mut h: H) -> R {
    h.resume(1);
    let a1 = h.started(1);
    let g1 = match h.bind(1, a1, 1) {
        Verdict::Bound { generation } => generation,
        v => return Err(format!("bind: {v:?}")),
    };
    h.cb(
        1,
        1,
        Some(a1),
        g1,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    let lease = h.last_lease();
    // Before the embedder performs the load, the attempt is cancelled and a replacement
    // reuses the execution.
    h.cancel(1);
    h.input(Input::Stopped { execution: e(1) });
    h.resume(1);
    let a2 = h.started(1);
    h.bind(1, a2, 1);
    let v = h.perform(lease);
    check!(
        v == Verdict::Reject(RejectReason::LeaseRevoked),
        "late effect performed on the replacement: {v:?}"
    );
    clean(&h)
}

#[test]
fn late_effect_after_a_replacement_startup_is_dropped() {
    assert_eq!(
        case_late_effect_after_replacement_is_dropped(H::default()),
        Ok(())
    );
}

#[test]
fn expired_lease_is_revoked_and_its_effect_dropped() {
    let mut h = H::default();
    h.resume(1);
    let a = h.started(1);
    let Verdict::Bound { generation: g } = h.bind(1, a, 1) else {
        panic!()
    };
    h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    let lease = h.last_lease();
    h.now = h.now.plus_millis(h.core().config().lease_ms + 1);
    assert_eq!(
        h.perform(lease),
        Verdict::Reject(RejectReason::LeaseExpired)
    );
    // The attempt could not progress: it failed and its failure was reported.
    assert_eq!(h.count(|e| matches!(e, Effect::FailureReported { .. })), 1);
    h.assert_clean();
}

// ----- rule 5 -----------------------------------------------------------------------------

#[test]
fn cancel_stops_the_cancelled_attempts_execution_exactly_once_with_a_deadline() {
    let mut h = H::default();
    h.resume(1);
    let a = h.started(1);
    h.bind(1, a, 1);
    h.cancel(1);
    let stops: Vec<_> = h
        .log()
        .iter()
        .filter(|e| matches!(e, Effect::StopExecution { .. }))
        .cloned()
        .collect();
    assert_eq!(stops.len(), 1);
    let Effect::StopExecution { deadline, .. } = stops[0] else {
        unreachable!()
    };
    assert_eq!(
        deadline,
        h.now.plus_millis(h.core().config().stop_deadline_ms)
    );
    h.cancel(1);
    assert_eq!(h.count(|e| matches!(e, Effect::StopExecution { .. })), 1);
    assert!(h.core().session_busy(s(1)), "teardown pending");
    assert_eq!(
        h.input(Input::Stopped { execution: e(1) }),
        Verdict::Accepted
    );
    assert!(!h.core().session_busy(s(1)));
    h.assert_clean();
}

fn case_old_attempt_spares_reused_execution(mut h: H) -> R {
    h.resume(1);
    let a1 = h.started(1);
    h.cancel(1); // cancelled before its runtime was bound
    h.resume(1);
    let a2 = h.started(1);
    check!(
        matches!(h.bind(1, a2, 1), Verdict::Bound { .. }),
        "successor binds execution 1"
    );
    // The cancelled attempt's late bind reports the same execution ID.
    let v = h.bind(1, a1, 1);
    check!(
        v == Verdict::Reject(RejectReason::AttemptCancelled),
        "late bind: {v:?}"
    );
    let stops =
        h.count(|x| matches!(x, Effect::StopExecution { execution, .. } if *execution == e(1)));
    check!(
        stops == 0,
        "the old attempt stopped the execution its successor reused"
    );
    clean(&h)
}

#[test]
fn old_attempt_never_stops_an_execution_its_successor_reused() {
    assert_eq!(
        case_old_attempt_spares_reused_execution(H::default()),
        Ok(())
    );
}

#[test]
fn late_bind_of_a_cancelled_attempt_is_stopped_once_the_successor_settles() {
    let mut h = H::default();
    h.resume(1);
    let a1 = h.started(1);
    h.cancel(1);
    h.resume(1);
    let _a2 = h.started(1);
    assert_eq!(
        h.bind(1, a1, 7),
        Verdict::Reject(RejectReason::AttemptCancelled)
    );
    assert_eq!(
        h.count(|x| matches!(x, Effect::StopExecution { .. })),
        0,
        "deferred while a later attempt is live"
    );
    h.cancel(1);
    assert_eq!(
        h.count(|x| matches!(x, Effect::StopExecution { execution, .. } if *execution == e(7))),
        1
    );
    h.assert_clean();
}

#[test]
fn rejected_stale_failure_from_an_owning_predecessor_tears_its_execution_down() {
    let mut h = H::default();
    h.resume(1);
    let a1 = h.started(1);
    h.cancel(1);
    h.resume(1);
    h.bind(1, a1, 7); // late bind: a1 owns execution 7, stop deferred
    let g = Generation::new(1).unwrap();
    let v = h.cb(
        1,
        7,
        Some(a1),
        g,
        RuntimeEvent::StartFailed { stamp: stamp(3) },
    );
    assert_eq!(v, Verdict::Reject(RejectReason::AttemptCancelled));
    assert_eq!(
        h.count(|x| matches!(x, Effect::StopExecution { execution, .. } if *execution == e(7))),
        1
    );
    h.assert_clean();
}

fn case_hung_teardown_is_abandoned(mut h: H) -> R {
    h.resume(1);
    let a = h.started(1);
    h.bind(1, a, 1);
    h.cancel(1);
    let deadline = h.core().config().stop_deadline_ms;
    h.advance(deadline + 1);
    check!(
        h.count(|x| matches!(x, Effect::KillExecution { .. })) == 1,
        "no kill after the stop deadline"
    );
    check!(
        !h.core().session_busy(s(1)),
        "a hung teardown holds the session"
    );
    clean(&h)
}

#[test]
fn teardown_that_hangs_is_abandoned_at_its_deadline() {
    assert_eq!(case_hung_teardown_is_abandoned(H::default()), Ok(()));
}

fn case_cancel_after_accept_keeps_runtime(mut h: H) -> R {
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    h.cancel(1);
    check!(
        h.count(|x| matches!(x, Effect::CancelPrompt { .. })) == 1,
        "session/cancel not sent"
    );
    check!(
        h.count(|x| matches!(x, Effect::StopExecution { .. })) == 0,
        "cancel after acceptance tore the runtime down"
    );
    let v = h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::PromptCompleted { turn: t(1) },
    );
    check!(v == Verdict::Accepted, "completion after cancel: {v:?}");
    check!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::Cancelled,
                ..
            }
        )) == 1,
        "turn not ended cancelled"
    );
    clean(&h)
}

#[test]
fn cancel_after_the_provider_accepted_does_not_tear_the_runtime_down() {
    assert_eq!(case_cancel_after_accept_keeps_runtime(H::default()), Ok(()));
}

#[test]
fn cancellation_never_aborts_a_claimed_teardown() {
    let mut h = H::default();
    h.resume(1);
    let a = h.started(1);
    h.bind(1, a, 1);
    h.cancel(1);
    h.resume(1);
    h.cancel(1);
    assert_eq!(
        h.count(|x| matches!(x, Effect::StopExecution { execution, .. } if *execution == e(1))),
        1
    );
    assert_eq!(h.count(|x| matches!(x, Effect::KillExecution { .. })), 0);
    assert_eq!(
        h.input(Input::Stopped { execution: e(1) }),
        Verdict::Accepted
    );
    h.assert_clean();
}

#[test]
fn a_replacement_cannot_bind_an_execution_being_torn_down() {
    let mut h = H::default();
    h.resume(1);
    let a1 = h.started(1);
    h.bind(1, a1, 1);
    h.cancel(1);
    h.resume(1);
    let a2 = h.started(1);
    assert_eq!(
        h.bind(1, a2, 1),
        Verdict::Reject(RejectReason::ExecutionStopping)
    );
    assert!(matches!(h.bind(1, a2, 2), Verdict::Bound { .. }));
    h.assert_clean();
}

// ----- rule 6 -----------------------------------------------------------------------------

fn resumed_with_token(h: &mut H) -> Result<(AttemptId, Generation), String> {
    // First life: a conversation is created, then the runtime exits.
    h.resume(1);
    let (a, g) = h.ready(1, 1);
    h.cb(1, 1, Some(a), g, RuntimeEvent::Exited { stamp: stamp(1) });
    check!(h.core().conversation(s(1)).is_some(), "token kept");
    h.resume(1);
    let a2 = h.started(1);
    let g2 = match h.bind(1, a2, 2) {
        Verdict::Bound { generation } => generation,
        v => return Err(format!("bind: {v:?}")),
    };
    h.cb(
        1,
        2,
        Some(a2),
        g2,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    check!(
        matches!(h.last().first(), Some(Effect::LoadConversation { .. })),
        "load requested: {:?}",
        h.last()
    );
    let lease = h.last_lease();
    h.perform(lease);
    Ok((a2, g2))
}

fn case_timeout_keeps_identity(mut h: H) -> R {
    let (a, g) = resumed_with_token(&mut h)?;
    let before = h.core().conversation(s(1));
    h.cb(1, 2, Some(a), g, timed_out());
    check!(
        h.count(|x| matches!(
            x,
            Effect::NewConversation {
                reason: NewConversationReason::Fallback(_),
                ..
            }
        )) == 0,
        "a load timeout fell back to session/new"
    );
    check!(h.core().conversation(s(1)) == before, "token changed");
    check!(
        h.count(|x| matches!(x, Effect::FailureReported { .. })) == 1,
        "failure not reported"
    );
    // What the agent sees next: the next resume loads the same conversation again.
    h.resume(1);
    let a3 = h.started(1);
    let Verdict::Bound { generation: g3 } = h.bind(1, a3, 3) else {
        return Err(format!("bind: {:?}", h.last()));
    };
    h.cb(1, 3, Some(a3), g3, RuntimeEvent::BootReady);
    h.cb(
        1,
        3,
        Some(a3),
        g3,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    check!(
        matches!(h.last().first(), Some(Effect::LoadConversation { .. })),
        "the resume after a load timeout did not load the conversation: {:?}",
        h.last()
    );
    clean(&h)
}

#[test]
fn load_timeout_keeps_the_conversation_token_and_reports_failure() {
    assert_eq!(case_timeout_keeps_identity(H::default()), Ok(()));
}

fn case_substring_is_inconclusive(mut h: H) -> R {
    let (a, g) = resumed_with_token(&mut h)?;
    h.cb(
        1,
        2,
        Some(a),
        g,
        load_failed(-32603, "resource not found while resolving configuration"),
    );
    check!(
        h.count(|x| matches!(
            x,
            Effect::NewConversation {
                reason: NewConversationReason::Fallback(_),
                ..
            }
        )) == 0,
        "a substring match fell back to session/new"
    );
    clean(&h)
}

#[test]
fn not_found_substring_in_an_internal_error_is_inconclusive() {
    assert_eq!(case_substring_is_inconclusive(H::default()), Ok(()));
}

/// claude-agent-acp 0.23 answers −32002 for a session it has when its Claude subprocess
/// closed early (issue 13); the embedder asked the agent's `session/list`, which has the
/// session: the conversation is kept and the failure reported.
fn case_listed_conversation_is_kept(mut h: H) -> R {
    let (a, g) = resumed_with_token(&mut h)?;
    let before = h.core().conversation(s(1));
    let RuntimeEvent::LoadFailed(mut outcome) = load_failed(-32002, "Resource not found: sess-1")
    else {
        unreachable!("load_failed builds a LoadFailed")
    };
    outcome.listing = SessionListing::Listed;
    h.cb(1, 2, Some(a), g, RuntimeEvent::LoadFailed(outcome));
    check!(
        h.count(|x| matches!(
            x,
            Effect::NewConversation {
                reason: NewConversationReason::Fallback(_),
                ..
            }
        )) == 0,
        "a conversation the agent lists was replaced"
    );
    check!(h.core().conversation(s(1)) == before, "token changed");
    check!(
        h.count(|x| matches!(x, Effect::FailureReported { .. })) == 1,
        "failure not reported"
    );
    clean(&h)
}

#[test]
fn a_not_found_for_a_session_the_agent_lists_keeps_the_conversation() {
    assert_eq!(case_listed_conversation_is_kept(H::default()), Ok(()));
}

#[test]
fn unknown_session_resource_not_found_falls_back_to_session_new() {
    let mut h = H::default();
    let (a, g) = resumed_with_token(&mut h).unwrap();
    h.cb(
        1,
        2,
        Some(a),
        g,
        load_failed(-32002, "Resource not found: sess-1"),
    );
    assert_eq!(
        h.count(|x| matches!(
            x,
            Effect::NewConversation {
                reason: NewConversationReason::Fallback(_),
                ..
            }
        )),
        1
    );
    let lease = h.last_lease();
    assert_eq!(h.perform(lease), Verdict::Accepted);
    assert_eq!(
        h.cb(
            1,
            2,
            Some(a),
            g,
            RuntimeEvent::ConversationCreated { token: token(77) }
        ),
        Verdict::Accepted
    );
    assert_eq!(h.core().conversation(s(1)), Some(token(77)));
    h.assert_clean();
}

/// A replacement whose agent says `loadSession: false` (or says nothing) gets
/// `session/new` at once, and the reason names which of the two it was.
fn capability_fallback_reason(load_capability: Option<bool>) -> Vec<NewConversationReason> {
    let mut h = H::default();
    h.resume(1);
    let (a, g) = h.ready(1, 1);
    h.cb(1, 1, Some(a), g, RuntimeEvent::Exited { stamp: stamp(1) });
    h.resume(1);
    let a2 = h.started(1);
    let Verdict::Bound { generation: g2 } = h.bind(1, a2, 2) else {
        panic!("bind refused: {:?}", h.last())
    };
    let verdict = h.cb(
        1,
        2,
        Some(a2),
        g2,
        RuntimeEvent::AgentReady { load_capability },
    );
    assert_eq!(verdict, Verdict::Accepted);
    h.last()
        .iter()
        .filter_map(|effect| match effect {
            Effect::NewConversation { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

#[test]
fn load_capability_false_and_absent_fall_back_with_their_own_reasons() {
    assert_eq!(
        capability_fallback_reason(Some(false)),
        [NewConversationReason::Fallback(
            ClassifyReason::CapabilityFalse
        )]
    );
    assert_eq!(
        capability_fallback_reason(None),
        [NewConversationReason::Fallback(
            ClassifyReason::CapabilityAbsent
        )]
    );
    assert_eq!(capability_fallback_reason(Some(true)), []);
}

// ----- rule 7 -----------------------------------------------------------------------------

fn case_early_exit_rolls_back(mut h: H) -> R {
    h.prompt(1, 1);
    let a = h.started(1);
    let g = match h.bind(1, a, 1) {
        Verdict::Bound { generation } => generation,
        v => return Err(format!("bind: {v:?}")),
    };
    h.cb(1, 1, Some(a), g, RuntimeEvent::Exited { stamp: stamp(5) });
    check!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::RolledBack,
                ..
            }
        )) == 1,
        "claim not rolled back"
    );
    check!(
        !h.core().session_busy(s(1)),
        "session left busy with nothing running"
    );
    check!(h.prompt(1, 2) == Verdict::Claimed, "the user can resend");
    clean(&h)
}

#[test]
fn early_exit_after_claiming_a_prompt_rolls_the_claim_back() {
    assert_eq!(case_early_exit_rolls_back(H::default()), Ok(()));
}

fn case_prompt_while_busy_is_refused(mut h: H) -> R {
    check!(
        h.prompt(1, 1) == Verdict::Claimed,
        "first prompt not claimed"
    );
    // The first turn still waits for its runtime when the second prompt comes.
    let second = h.prompt(1, 2);
    check!(
        second == Verdict::Reject(RejectReason::SessionBusy),
        "a second prompt while the first waits for its runtime: {second:?}"
    );
    check!(
        h.prompt(1, 1) == Verdict::Reject(RejectReason::SessionBusy),
        "the same prompt claimed twice"
    );
    clean(&h)
}

#[test]
fn prompt_while_a_turn_is_active_is_reported_not_dropped() {
    assert_eq!(case_prompt_while_busy_is_refused(H::default()), Ok(()));
}

// ----- rule 8 -----------------------------------------------------------------------------

/// A turn accepted on execution 1 whose runtime dies; recovery runs on `execs` in turn.
fn case_recovery(mut h: H, deaths: u64) -> Result<H, String> {
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::Stream {
            turn: t(1),
            seq: 1,
            bytes: 10,
        },
    );
    h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::Stream {
            turn: t(1),
            seq: 2,
            bytes: 10,
        },
    );
    let mut cur = (1u64, a, g);
    for d in 0..deaths {
        h.cb(
            1,
            cur.0,
            Some(cur.1),
            cur.2,
            RuntimeEvent::Exited {
                stamp: stamp(10 + d),
            },
        );
        let before = h.log().len();
        h.advance(10_000);
        let restarted = h.log()[before..]
            .iter()
            .any(|x| matches!(x, Effect::StartRuntime { .. }));
        if !restarted {
            break;
        }
        let exec = 2 + d;
        let (a2, g2) = h.ready(1, exec);
        let lease = h.last_lease();
        h.perform(lease);
        h.cb(
            1,
            exec,
            Some(a2),
            g2,
            RuntimeEvent::PromptAccepted { turn: t(1) },
        );
        h.cb(
            1,
            exec,
            Some(a2),
            g2,
            RuntimeEvent::Stream {
                turn: t(1),
                seq: 1,
                bytes: 3,
            },
        );
        cur = (exec, a2, g2);
    }
    Ok(h)
}

/// Rule 8 (silence): a core whose idle rule gives a turn 5 s of silence.
fn idle_core() -> H {
    H::new(Config {
        turn_idle_ms: 5_000,
        ..Config::default()
    })
}

/// An accepted turn whose agent streams, then goes silent: each event starts the idle
/// deadline again; once it passes, the prompt is cancelled, the runtime stopped (and killed
/// when its teardown hangs) and the turn recovered on a new runtime, as if it had died.
fn case_silent_turn_is_given_up(mut h: H) -> R {
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    let stream = |seq| RuntimeEvent::Stream {
        turn: t(1),
        seq,
        bytes: 5,
    };
    h.advance(4_000);
    h.cb(1, 1, Some(a), g, stream(1));
    h.advance(4_000);
    check!(
        h.count(|x| matches!(x, Effect::CancelPrompt { .. })) == 0,
        "an agent heard from 4 s ago was given up"
    );
    h.advance(1_000);
    check!(
        h.count(|x| matches!(x, Effect::CancelPrompt { execution, turn, .. } if *execution == e(1) && *turn == t(1))) == 1,
        "a turn silent for 5 s was not cancelled"
    );
    check!(
        h.count(|x| matches!(x, Effect::StopExecution { execution, .. } if *execution == e(1)))
            == 1,
        "the silent runtime was not stopped"
    );
    check!(
        h.count(|x| matches!(x, Effect::RecoveryStarted { step: 1, .. })) == 1,
        "the silent turn was not recovered"
    );
    // The agent's late word is its dead runtime's: refused.
    let late = h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::PromptCompleted { turn: t(1) },
    );
    check!(
        late.is_reject(),
        "a late answer of the given-up runtime: {late:?}"
    );
    // The teardown hangs: the kill follows at the stop deadline; recovery starts a runtime.
    let stop_ms = h.core().config().stop_deadline_ms;
    h.advance(stop_ms);
    check!(
        h.count(|x| matches!(x, Effect::KillExecution { execution, .. } if *execution == e(1)))
            == 1,
        "the hung teardown of the silent runtime was not killed"
    );
    check!(
        h.count(|x| matches!(x, Effect::StartRuntime { .. })) == 2,
        "recovery started no replacement"
    );
    let (a2, g2) = h.ready(1, 2);
    let lease = h.last_lease();
    h.perform(lease);
    h.cb(
        1,
        2,
        Some(a2),
        g2,
        RuntimeEvent::PromptAccepted { turn: t(1) },
    );
    h.cb(
        1,
        2,
        Some(a2),
        g2,
        RuntimeEvent::PromptCompleted { turn: t(1) },
    );
    check!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::Completed,
                ..
            }
        )) == 1,
        "the recovered turn did not complete"
    );
    clean(&h)
}

#[test]
fn a_silent_agent_s_turn_is_cancelled_stopped_and_recovered() {
    assert_eq!(case_silent_turn_is_given_up(idle_core()), Ok(()));
}

/// Found by the fuzz corpus (callback_orderings regression
/// `capability-absent-after-an-earlier-inconclusive-load`, run with the idle rule on): a
/// stream event in the same millisecond as the acceptance re-armed the same deadline, and
/// removing the old timer after inserting the new one dropped both.
#[test]
fn an_event_in_the_same_millisecond_keeps_the_idle_deadline_armed() {
    let mut h = idle_core();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    let event = RuntimeEvent::Stream {
        turn: t(1),
        seq: 1,
        bytes: 1,
    };
    assert_eq!(h.cb(1, 1, Some(a), g, event), Verdict::Accepted);
    h.assert_clean();
    h.advance(5_000);
    assert_eq!(h.count(|x| matches!(x, Effect::CancelPrompt { .. })), 1);
    h.assert_clean();
}

#[test]
fn without_the_idle_rule_a_silent_turn_waits_for_its_runtime() {
    let mut h = H::default();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    h.advance(24 * 60 * 60 * 1000);
    assert_eq!(h.count(|x| matches!(x, Effect::CancelPrompt { .. })), 0);
    assert_eq!(h.count(|x| matches!(x, Effect::StopExecution { .. })), 0);
    assert!(h.core().session_busy(s(1)));
    h.assert_clean();
}

#[test]
fn silence_while_the_embedder_does_not_listen_does_not_count() {
    let mut h = idle_core();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    h.advance(3_000);
    h.listening(false);
    h.advance(60_000);
    assert_eq!(h.count(|x| matches!(x, Effect::CancelPrompt { .. })), 0);
    // Listening again, the turn gets a whole idle period.
    h.listening(true);
    h.advance(4_999);
    assert_eq!(h.count(|x| matches!(x, Effect::CancelPrompt { .. })), 0);
    h.advance(1);
    assert_eq!(h.count(|x| matches!(x, Effect::CancelPrompt { .. })), 1);
    assert_eq!(h.count(|x| matches!(x, Effect::RecoveryStarted { .. })), 1);
    h.assert_clean();
}

#[test]
fn a_silent_turn_the_user_cancelled_ends_cancelled() {
    let mut h = idle_core();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    h.cancel(1);
    h.advance(5_000);
    assert_eq!(h.count(|x| matches!(x, Effect::StopExecution { .. })), 1);
    assert_eq!(h.count(|x| matches!(x, Effect::RecoveryStarted { .. })), 0);
    assert_eq!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::Cancelled,
                ..
            }
        )),
        1
    );
    h.assert_clean();
}

#[test]
fn a_silent_turn_survives_a_restart_with_its_deadline() {
    let mut h = idle_core();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    h.advance(1_000);
    let snap = h.core().snapshot();
    let restored = Core::restore(&snap).expect("restores");
    assert!(restored
        .poll_timeout()
        .is_some_and(|at| at <= h.now.plus_millis(4_000)));
}

fn case_recovers_once_with_one_replay_block(h: H) -> R {
    let h = case_recovery(h, 1)?;
    let prompts: Vec<PromptRequest> = h
        .log()
        .iter()
        .filter_map(|x| match x {
            Effect::DispatchPrompt { request, .. } => Some(*request),
            _ => None,
        })
        .collect();
    check!(
        prompts.len() == 2,
        "expected first dispatch and one re-prompt, got {prompts:?}"
    );
    check!(prompts[0].replay_blocks == 0, "first dispatch wrapped");
    check!(
        prompts[1].replay_blocks == 1 && prompts[1].replay_generation == 1,
        "re-prompt: {:?}",
        prompts[1]
    );
    check!(
        prompts[1].delivered_through == 2,
        "partial output lost: {:?}",
        prompts[1]
    );
    check!(
        h.count(|x| matches!(x, Effect::RecoveryStarted { .. })) == 1,
        "one recovery"
    );
    let seqs: Vec<u64> = h
        .log()
        .iter()
        .filter_map(|x| match x {
            Effect::Deliver { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect();
    check!(seqs == vec![1, 2, 3], "caller sequence {seqs:?}");
    clean(&h)
}

#[test]
fn provider_exit_mid_prompt_recovers_and_re_prompts_with_one_replay_block() {
    assert_eq!(
        case_recovers_once_with_one_replay_block(H::default()),
        Ok(())
    );
}

fn case_exhausts_once(h: H) -> R {
    let h = case_recovery(h, 4)?;
    check!(
        h.count(|x| matches!(x, Effect::RecoveryStarted { .. })) == 3,
        "three recoveries"
    );
    check!(
        h.count(|x| matches!(x, Effect::RecoveryExhausted { .. })) == 1,
        "exhausted exactly once"
    );
    check!(
        h.count(|x| matches!(x, Effect::TurnEnded { .. })) == 1,
        "exactly one terminal"
    );
    let replays: Vec<u8> = h
        .log()
        .iter()
        .filter_map(|x| match x {
            Effect::DispatchPrompt { request, .. } => Some(request.replay_blocks),
            _ => None,
        })
        .collect();
    check!(
        replays == vec![0, 1, 1, 1],
        "replay blocks per dispatch {replays:?}"
    );
    // Each re-prompt restates its own recovery: generations 1, 2, 3 (rule 8).
    let generations: Vec<u32> = h
        .log()
        .iter()
        .filter_map(|x| match x {
            Effect::DispatchPrompt { request, .. } => Some(request.replay_generation),
            _ => None,
        })
        .collect();
    check!(
        generations == vec![0, 1, 2, 3],
        "replay generation per dispatch {generations:?}"
    );
    clean(&h)
}

#[test]
fn recovery_exhausts_once_after_the_schedule() {
    assert_eq!(case_exhausts_once(H::default()), Ok(()));
}

/// A one-step recovery schedule: the replacement is the schedule's last.
fn one_step_schedule() -> H {
    H::new(Config {
        recovery_delays_ms: vec![1_000],
        ..Config::default()
    })
}

/// The schedule's last replacement fails before it runs: exhaustion is recorded once, by
/// the turn's recovery path, and the turn ends once.
fn case_exhausts_once_when_the_last_replacement_fails(mut h: H) -> R {
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    h.cb(1, 1, Some(a), g, RuntimeEvent::Exited { stamp: stamp(1) });
    h.advance(10_000);
    let a2 = h.started(1);
    check!(a2 != a, "no replacement was started");
    let Verdict::Bound { generation: g2 } = h.bind(1, a2, 2) else {
        return Err(format!("bind: {:?}", h.last()));
    };
    h.cb(
        1,
        2,
        Some(a2),
        g2,
        RuntimeEvent::StartFailed { stamp: stamp(2) },
    );
    h.advance(60_000);
    check!(
        h.count(|x| matches!(x, Effect::RecoveryStarted { .. })) == 1,
        "one recovery"
    );
    let exhausted = h.count(|x| matches!(x, Effect::RecoveryExhausted { .. }));
    check!(exhausted == 1, "recovery_exhausted {exhausted} times");
    check!(
        h.count(|x| matches!(x, Effect::TurnEnded { .. })) == 1,
        "exactly one terminal"
    );
    clean(&h)
}

#[test]
fn recovery_exhausts_once_when_the_last_replacement_fails() {
    assert_eq!(
        case_exhausts_once_when_the_last_replacement_fails(one_step_schedule()),
        Ok(())
    );
}

#[test]
fn empty_schedule_disables_recovery_entirely() {
    let h = case_recovery(
        H::new(Config {
            recovery_delays_ms: vec![],
            ..Config::default()
        }),
        1,
    )
    .unwrap();
    assert_eq!(
        h.count(|x| matches!(
            x,
            Effect::RecoveryStarted { .. } | Effect::RecoveryExhausted { .. }
        )),
        0
    );
    assert_eq!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::Failed,
                ..
            }
        )),
        1
    );
    h.assert_clean();
}

#[test]
fn no_recovery_after_the_user_cancelled() {
    let mut h = H::default();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    h.cancel(1);
    h.cb(1, 1, Some(a), g, RuntimeEvent::Exited { stamp: stamp(1) });
    h.advance(60_000);
    assert_eq!(h.count(|x| matches!(x, Effect::RecoveryStarted { .. })), 0);
    assert_eq!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::Cancelled,
                ..
            }
        )),
        1
    );
    h.assert_clean();
}

// ----- rule 9 -----------------------------------------------------------------------------

#[test]
fn stream_events_reach_the_caller_in_order_without_gaps_or_duplicates() {
    let mut h = H::default();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    let ev = |seq| RuntimeEvent::Stream {
        turn: t(1),
        seq,
        bytes: 1,
    };
    assert_eq!(h.cb(1, 1, Some(a), g, ev(1)), Verdict::Accepted);
    assert_eq!(
        h.cb(1, 1, Some(a), g, ev(1)),
        Verdict::Reject(RejectReason::DuplicateEvent)
    );
    assert_eq!(
        h.cb(1, 1, Some(a), g, ev(3)),
        Verdict::Reject(RejectReason::SequenceGap)
    );
    assert_eq!(h.cb(1, 1, Some(a), g, ev(2)), Verdict::Accepted);
    let seqs: Vec<u64> = h
        .log()
        .iter()
        .filter_map(|x| match x {
            Effect::Deliver { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, vec![1, 2]);
    h.assert_clean();
}

// ----- rule 10 ----------------------------------------------------------------------------

fn case_new_failure_is_shown(mut h: H) -> R {
    let mut failed = Vec::new();
    for n in 0..2u64 {
        h.resume(1);
        let a = h.started(1);
        failed.push(a);
        let g = match h.bind(1, a, 10 + n) {
            Verdict::Bound { generation } => generation,
            v => return Err(format!("bind: {v:?}")),
        };
        h.cb(
            1,
            10 + n,
            Some(a),
            g,
            RuntimeEvent::StartFailed { stamp: stamp(1) },
        );
    }
    check!(
        h.count(|x| matches!(x, Effect::FailureReported { .. })) == 2,
        "the second failure was hidden by the first"
    );
    let named: Vec<AttemptId> = h
        .log()
        .iter()
        .filter_map(|x| match x {
            Effect::FailureReported { failure, .. } => Some(failure.attempt),
            _ => None,
        })
        .collect();
    check!(
        named == failed,
        "failures name attempts {named:?}, but {failed:?} failed"
    );
    clean(&h)
}

#[test]
fn historical_failure_never_hides_a_new_one() {
    assert_eq!(case_new_failure_is_shown(H::default()), Ok(()));
}

#[test]
fn dismissing_a_failure_is_typed() {
    let mut h = H::default();
    assert_eq!(
        h.input(Input::DismissFailure { session: s(1) }),
        Verdict::Reject(RejectReason::UnknownSession)
    );
    h.resume(1);
    assert_eq!(
        h.input(Input::DismissFailure { session: s(1) }),
        Verdict::Reject(RejectReason::NothingToDismiss)
    );
}

// ----- snapshot / restore -----------------------------------------------------------------

#[test]
fn restart_bumps_the_epoch_and_keeps_vouched_attempts() {
    let mut h = H::default();
    h.resume(1);
    let a = h.started(1);
    let Verdict::Bound { generation: g } = h.bind(1, a, 1) else {
        panic!()
    };
    h.restart();
    assert_eq!(h.core().epoch(), Epoch::FIRST.next().unwrap());
    // The snapshot vouches for the live attempt: its runtime keeps talking.
    assert_eq!(
        h.cb(1, 1, Some(a), g, RuntimeEvent::BootReady),
        Verdict::Accepted
    );
    let Verdict::Started { attempt } = h.resume(2) else {
        panic!()
    };
    assert_eq!(attempt.epoch(), h.core().epoch());
    h.assert_clean();
}

#[test]
fn after_restart_attempts_the_snapshot_does_not_vouch_for_are_rejected() {
    let mut h = H::default();
    h.resume(1);
    let snap = h.core().snapshot();
    // The old incarnation mints more attempts after the snapshot, then crashes.
    h.cancel(1);
    h.resume(1);
    let lost = h.started(1);
    let Verdict::Bound { generation: g } = h.bind(1, lost, 3) else {
        panic!()
    };
    let mut core = Core::restore(&snap).unwrap();
    let v = core.handle(
        h.now,
        Input::Callback(Callback {
            session: s(1),
            execution: e(3),
            attempt: Some(lost),
            generation: g,
            event: RuntimeEvent::BootReady,
        }),
    );
    assert!(v.is_reject(), "{v:?}");
    core.check_invariants().unwrap();
}

/// A snapshot written by format version 1 (before the live attempt's state and recovery
/// flag, the execution's published flag and the fixed-array encodings of the tombstone
/// ring and binding history were dropped): the state of the `kandev-state` fuzz seed as
/// version 1 encoded it. No one deployed version 1, so it is refused, not converted.
#[test]
fn a_version_1_snapshot_is_refused_with_a_clear_error() {
    let old = include_bytes!("data/snapshot-v1.bin");
    assert_eq!(&old[..6], b"PLSD\x01\x00");
    let err = Core::restore(old).unwrap_err();
    assert_eq!(err, RestoreError::UnsupportedVersion(1));
    assert_eq!(err.to_string(), "snapshot version 1, expected 3");
    // The same state as the current version writes it restores.
    let mut h = H::default();
    h.prompt(1, 1);
    let snap = h.core().snapshot();
    assert_eq!(&snap[..6], b"PLSD\x03\x00");
    assert!(Core::restore(&snap).is_ok());
}

#[test]
fn truncated_or_corrupted_snapshots_are_typed_errors() {
    let mut h = H::default();
    h.prompt(1, 1);
    h.resume(2);
    let snap = h.core().snapshot();
    for cut in 0..snap.len() {
        assert!(
            Core::restore(&snap[..cut]).is_err(),
            "prefix of {cut} bytes restored"
        );
    }
    assert_eq!(
        Core::restore(b"NOPE\x01\x00").unwrap_err(),
        RestoreError::BadMagic
    );
    assert!(matches!(
        Core::restore(b"PLSD\x09\x00").unwrap_err(),
        RestoreError::UnsupportedVersion(9)
    ));
    for i in 6..snap.len() {
        let mut bad = snap.clone();
        bad[i] ^= 0xff;
        let _ = Core::restore(&bad); // any answer but a panic
    }
}

#[test]
fn equal_states_snapshot_to_equal_bytes() {
    let mk = || {
        let mut h = H::default();
        for n in [5, 3, 9, 1] {
            h.prompt(n, 1);
        }
        h.core().snapshot()
    };
    assert_eq!(mk(), mk());
}

// ----- bad input --------------------------------------------------------------------------

#[test]
fn unknown_session_execution_and_attempt_leave_state_untouched() {
    let mut h = H::default();
    h.resume(1);
    let a = h.started(1);
    let before = h.core().snapshot();
    let g = Generation::new(1).unwrap();
    assert_eq!(
        h.cb(9, 1, Some(a), g, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::UnknownSession)
    );
    assert_eq!(
        h.cb(1, 5, Some(a), g, RuntimeEvent::BootReady),
        Verdict::Reject(RejectReason::UnknownExecution)
    );
    assert_eq!(
        h.bind(9, a, 1),
        Verdict::Reject(RejectReason::UnknownSession)
    );
    assert_eq!(
        h.input(Input::Stopped { execution: e(4) }),
        Verdict::Reject(RejectReason::UnknownExecution)
    );
    assert_eq!(
        h.input(Input::Perform {
            lease: LeaseId::new(u64::MAX).unwrap()
        }),
        Verdict::Reject(RejectReason::UnknownLease)
    );
    assert_eq!(h.cancel(9), Verdict::Reject(RejectReason::UnknownSession));
    assert_eq!(h.core().snapshot(), before);
    h.assert_clean();
}

#[test]
fn session_limit_is_a_typed_rejection() {
    let mut h = H::new(Config {
        max_sessions: 2,
        ..Config::default()
    });
    assert!(matches!(h.resume(1), Verdict::Started { .. }));
    assert!(matches!(h.resume(2), Verdict::Started { .. }));
    assert_eq!(h.resume(3), Verdict::Reject(RejectReason::TooManySessions));
    assert_eq!(
        h.prompt(3, 1),
        Verdict::Reject(RejectReason::TooManySessions)
    );
}

#[test]
fn clock_jumping_backwards_does_not_revive_or_fire_anything() {
    let mut h = H::default();
    h.resume(1);
    h.now = Timestamp::from_millis(10_000);
    h.resume(1);
    h.now = Timestamp::ZERO;
    let v = h.resume(1);
    let Verdict::Joined { until, .. } = v else {
        panic!()
    };
    assert!(until >= Timestamp::from_millis(10_000));
    h.assert_clean();
}

// ----- the mutants, each caught by its case -----------------------------------------------

#[cfg(feature = "mutants")]
mod mutants {
    use super::*;
    use palisade_core::mutants::Mutant;

    fn caught(m: Mutant, case: fn(H) -> R) {
        assert_eq!(
            case(H::default()),
            Ok(()),
            "{} case fails on the real core",
            m.name()
        );
        assert!(
            case(H::default().mutant(m)).is_err(),
            "mutant {} survived its case",
            m.name()
        );
    }

    #[test]
    fn tombstone_eviction_reopens() {
        caught(
            Mutant::TombstoneEvictionReopens,
            case_evicted_attempt_fails_closed,
        );
    }
    #[test]
    fn tombstone_eviction_reopens_dispatches_to_the_replacement() {
        caught(
            Mutant::TombstoneEvictionReopens,
            case_evicted_ready_callback_leaves_the_waiting_turn,
        );
    }
    #[test]
    fn toctou_generation() {
        caught(
            Mutant::ToctouGeneration,
            case_late_effect_after_replacement_is_dropped,
        );
    }
    #[test]
    fn substring_fallback() {
        caught(Mutant::SubstringFallback, case_substring_is_inconclusive);
    }
    #[test]
    fn timeout_fallback() {
        caught(Mutant::TimeoutFallback, case_timeout_keeps_identity);
    }
    #[test]
    fn claim_not_rolled_back() {
        caught(Mutant::ClaimNotRolledBack, case_early_exit_rolls_back);
    }
    #[test]
    fn old_attempt_stops_successor() {
        caught(
            Mutant::OldAttemptStopsSuccessor,
            case_old_attempt_spares_reused_execution,
        );
    }
    #[test]
    fn stale_callback_dispatches() {
        caught(
            Mutant::StaleCallbackDispatches,
            case_stale_ready_does_not_dispatch,
        );
    }
    #[test]
    fn historical_error_suppresses() {
        caught(Mutant::HistoricalErrorSuppresses, case_new_failure_is_shown);
    }
    #[test]
    fn exhausted_twice() {
        assert_eq!(
            case_exhausts_once_when_the_last_replacement_fails(one_step_schedule()),
            Ok(())
        );
        assert!(
            case_exhausts_once_when_the_last_replacement_fails(
                one_step_schedule().mutant(Mutant::ExhaustedTwice)
            )
            .is_err(),
            "mutant exhausted-twice survived its case"
        );
    }
    #[test]
    fn double_replay_block() {
        caught(Mutant::DoubleReplayBlock, case_exhausts_once);
    }
    #[test]
    fn replay_repeats_delivered() {
        caught(
            Mutant::ReplayRepeatsDelivered,
            case_recovers_once_with_one_replay_block,
        );
    }
    #[test]
    fn inconclusive_load_drops_token() {
        caught(
            Mutant::InconclusiveLoadDropsToken,
            case_timeout_keeps_identity,
        );
    }
    #[test]
    fn failure_keeps_old_attempt() {
        caught(Mutant::FailureKeepsOldAttempt, case_new_failure_is_shown);
    }
    #[test]
    fn prompt_claimed_twice() {
        caught(
            Mutant::PromptClaimedTwice,
            case_prompt_while_busy_is_refused,
        );
    }
    #[test]
    fn backpressure_skips_seq() {
        use palisade_core::delivery::{InOrderReceiver, NotificationQueue, Receipt};
        use palisade_core::mutants::ActiveMutant;
        // One slot: every item after the first meets backpressure, is retried after a pop,
        // and the receiver must see every one in order with no gap.
        let run = |mutant| -> R {
            let mut q = NotificationQueue::with_mutant(1, mutant);
            let mut r = InOrderReceiver::new();
            let mut got = Vec::new();
            for item in ['a', 'b', 'c'] {
                let mut item = item;
                loop {
                    match q.try_push(item) {
                        Ok(_) => break,
                        Err(e) if e.is_backpressure() => {
                            item = e.into_inner();
                            let (seq, x) = q.pop().expect("a full queue has an item");
                            got.push(r.accept(seq, x));
                        }
                        Err(e) => return Err(format!("closed: {e}")),
                    }
                }
            }
            while let Some((seq, x)) = q.pop() {
                got.push(r.accept(seq, x));
            }
            check!(
                got.iter().all(|g| matches!(g, Receipt::Delivered(_))),
                "the receiver saw {got:?}"
            );
            Ok(())
        };
        assert_eq!(run(ActiveMutant::NONE), Ok(()));
        assert!(
            run(ActiveMutant::on(Mutant::BackpressureSkipsSeq)).is_err(),
            "mutant backpressure-skips-seq survived its case"
        );
    }
    #[test]
    fn cleanup_without_deadline() {
        caught(
            Mutant::CleanupWithoutDeadline,
            case_hung_teardown_is_abandoned,
        );
    }
    #[test]
    fn cancel_after_accept_tears_down() {
        caught(
            Mutant::CancelAfterAcceptTearsDown,
            case_cancel_after_accept_keeps_runtime,
        );
    }
    #[test]
    fn unbounded_join_wait() {
        caught(Mutant::UnboundedJoinWait, case_joiner_wait_is_bounded);
    }
    #[test]
    fn listed_conversation_replaced() {
        caught(
            Mutant::ListedConversationReplaced,
            case_listed_conversation_is_kept,
        );
    }
    #[test]
    fn replay_generation_stale() {
        caught(Mutant::ReplayGenerationStale, case_exhausts_once);
    }
    #[test]
    fn idle_deadline_ignored() {
        assert_eq!(case_silent_turn_is_given_up(idle_core()), Ok(()));
        assert!(
            case_silent_turn_is_given_up(idle_core().mutant(Mutant::IdleDeadlineIgnored)).is_err(),
            "mutant idle-deadline-ignored survived its case"
        );
    }
    #[test]
    fn restore_reuses_attempt_ids() {
        caught(
            Mutant::RestoreReusesAttemptIds,
            case_attempt_ids_are_never_reused_across_restarts,
        );
    }
    // queue-overflow-closes lives in `delivery` and is caught by its own unit test.
}

/// Attempt IDs are never reused across restarts: a runtime that outlived the orchestrator
/// (a sidecar) may still call back with its attempt's ID, which must not name any attempt
/// of the new incarnation.
fn case_attempt_ids_are_never_reused_across_restarts(mut h: H) -> R {
    h.resume(1);
    let before = h.started(1);
    h.restart();
    h.resume(2);
    let after = h.started(2);
    check!(
        after != before && after.epoch() > before.epoch(),
        "attempt {after} of the new incarnation, after {before} of the previous one"
    );
    Ok(())
}

#[test]
fn attempt_ids_are_never_reused_across_restarts() {
    assert_eq!(
        case_attempt_ids_are_never_reused_across_restarts(H::default()),
        Ok(())
    );
}

// ----- regressions found by the sim -------------------------------------------------------

/// Sim swarm seed 3 (before the fix): a duplicated `load_failed` arrived after the fallback
/// conversation was created and replaced it again.
#[test]
fn duplicate_load_failure_after_the_fallback_does_not_replace_the_new_conversation() {
    let mut h = H::default();
    let (a, g) = resumed_with_token(&mut h).unwrap();
    h.prompt(1, 1);
    let failed = load_failed(-32002, "Resource not found: sess-1");
    assert_eq!(h.cb(1, 2, Some(a), g, failed.clone()), Verdict::Accepted);
    let lease = h.last_lease();
    h.perform(lease);
    assert_eq!(
        h.cb(
            1,
            2,
            Some(a),
            g,
            RuntimeEvent::ConversationCreated { token: token(50) }
        ),
        Verdict::Accepted
    );
    assert_eq!(
        h.cb(1, 2, Some(a), g, failed),
        Verdict::Reject(RejectReason::UnexpectedEvent)
    );
    assert_eq!(h.core().conversation(s(1)), Some(token(50)));
    h.assert_clean();
}

/// Sim swarm seed 97 (before the fix): a restart rolled back a dispatched prompt but left
/// its attempt live with a ready conversation, so the next prompt waited forever.
#[test]
fn restart_with_a_dispatched_prompt_rolls_it_back_and_the_runtime_serves_the_next() {
    let mut h = H::default();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    assert!(matches!(
        h.last().first(),
        Some(Effect::DispatchPrompt { .. })
    ));
    h.restart();
    assert_eq!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::RolledBack,
                ..
            }
        )),
        1
    );
    assert_eq!(h.core().runtime(s(1)), Some(e(1)));
    assert_eq!(h.prompt(1, 2), Verdict::Claimed);
    assert!(
        matches!(h.last().first(), Some(Effect::DispatchPrompt { .. })),
        "{:?}",
        h.last()
    );
    let _ = (a, g);
    h.assert_clean();
}

/// Sim swarm seed 104 (before the fix): a restart lost the lease of a pending
/// `session/new`, and the attempt stalled until its start deadline.
#[test]
fn restart_re_requests_a_conversation_whose_lease_died_with_the_process() {
    let mut h = H::default();
    h.resume(1);
    let a = h.started(1);
    let Verdict::Bound { generation: g } = h.bind(1, a, 1) else {
        panic!()
    };
    h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    h.restart();
    assert!(
        matches!(h.last().first(), Some(Effect::NewConversation { .. })),
        "{:?}",
        h.last()
    );
    let lease = h.last_lease();
    assert_eq!(h.perform(lease), Verdict::Accepted);
    assert_eq!(
        h.cb(
            1,
            1,
            Some(a),
            g,
            RuntimeEvent::ConversationCreated { token: token(3) }
        ),
        Verdict::Accepted
    );
    assert!(!h.core().session_busy(s(1)));
    h.assert_clean();
}

/// Found by the model test: a prompt performed on a ready runtime whose agent never
/// accepts it must not keep the session busy forever. It was written, so the agent may have
/// read it (ACP has no acknowledgement): the turn is recovered on the schedule with its
/// replay block, never rolled back for the caller to send the same text again bare (issue
/// 28, item 4; the stack world's `S-prompt-sent-bare-twice`, scenario `stack-mute-agent`).
#[test]
fn a_prompt_the_provider_never_accepts_is_recovered_at_its_deadline() {
    let mut h = H::default();
    h.resume(1);
    let (a, g) = h.ready(1, 1);
    assert_eq!(h.core().runtime(s(1)), Some(e(1)));
    assert_eq!(h.prompt(1, 1), Verdict::Claimed);
    let lease = h.last_lease();
    assert_eq!(h.perform(lease), Verdict::Accepted);
    let deadline = h.core().config().start_deadline_ms;
    h.advance(deadline + 1);
    assert_eq!(h.count(|x| matches!(x, Effect::CancelPrompt { .. })), 1);
    assert_eq!(h.count(|x| matches!(x, Effect::TurnEnded { .. })), 0);
    assert_eq!(
        h.count(|x| matches!(x, Effect::RecoveryStarted { step: 1, .. })),
        1
    );
    assert!(h.core().session_busy(s(1)));
    // The runtime, alive and ready, gets the prompt again on the schedule, wrapped in its
    // replay block.
    for _ in 0..100 {
        if h.count(|x| matches!(x, Effect::DispatchPrompt { .. })) == 2 {
            break;
        }
        h.advance(100);
    }
    assert_eq!(h.perform(h.last_lease()), Verdict::Accepted);
    let prompts: Vec<PromptRequest> = h
        .log()
        .iter()
        .filter_map(|x| match x {
            Effect::DispatchPrompt { request, .. } => Some(*request),
            _ => None,
        })
        .collect();
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    assert_eq!(prompts[0].replay_blocks, 0);
    assert_eq!(
        (prompts[1].replay_blocks, prompts[1].replay_generation),
        (1, 1)
    );
    h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::PromptAccepted { turn: t(1) },
    );
    h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::PromptCompleted { turn: t(1) },
    );
    assert_eq!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::Completed,
                ..
            }
        )),
        1
    );
    assert!(!h.core().session_busy(s(1)));
    h.assert_clean();
}

/// Sim swarm seed 12749 (before the fix): after a restart re-issued `session/new`, the
/// first request's conversation arrived; performing the re-issued request then would have
/// replaced it. A conversation effect is revoked once it is no longer awaited.
#[test]
fn a_conversation_request_no_longer_awaited_is_revoked() {
    let mut h = H::default();
    h.resume(1);
    let a = h.started(1);
    let Verdict::Bound { generation: g } = h.bind(1, a, 1) else {
        panic!()
    };
    h.cb(
        1,
        1,
        Some(a),
        g,
        RuntimeEvent::AgentReady {
            load_capability: Some(true),
        },
    );
    let first = h.last_lease();
    assert_eq!(h.perform(first), Verdict::Accepted);
    h.restart();
    let reissued = h.last_lease();
    assert_ne!(reissued, first);
    // The old incarnation's request is answered first.
    assert_eq!(
        h.cb(
            1,
            1,
            Some(a),
            g,
            RuntimeEvent::ConversationCreated { token: token(8) }
        ),
        Verdict::Accepted
    );
    assert_eq!(
        h.perform(reissued),
        Verdict::Reject(RejectReason::LeaseRevoked)
    );
    assert_eq!(h.core().conversation(s(1)), Some(token(8)));
    assert!(!h.core().session_busy(s(1)));
    h.assert_clean();
}

/// Issue 11, found by the stack world (`stack-crash-restart` seed 4 before the fix): each
/// restart of the orchestrator under an accepted turn used up one of the turn's recovery
/// steps, so restarts alone, with no provider failure, exhausted it. A restart now resumes
/// the turn at once with the replay block and no `recovery_started`; the schedule stays
/// whole for the provider's own failures.
#[test]
fn restarts_under_an_accepted_turn_do_not_use_up_its_recovery_steps() {
    let mut h = H::default();
    let steps = h.core().config().recovery_delays_ms.len();
    assert!(steps >= 1);
    assert_eq!(h.prompt(1, 1), Verdict::Claimed);
    let (mut a, mut g) = h.ready(1, 1);
    h.accept(1, 1, a, g, 1);
    let mut exec = 1;
    for k in 0..=steps as u64 {
        h.restart();
        // The runtime died with the previous incarnation; the embedder reports it.
        assert_eq!(
            h.cb(
                1,
                exec,
                Some(a),
                g,
                RuntimeEvent::Exited {
                    stamp: stamp(50 + k)
                }
            ),
            Verdict::Accepted
        );
        h.advance(1);
        exec += 1;
        (a, g) = h.ready(1, exec);
        let blocks = h.last().iter().find_map(|x| match x {
            Effect::DispatchPrompt { request, .. } => Some(request.replay_blocks),
            _ => None,
        });
        assert_eq!(
            blocks,
            Some(1),
            "the resumed turn's re-prompt: {:?}",
            h.last()
        );
        h.accept(1, exec, a, g, 1);
    }
    assert_eq!(h.count(|x| matches!(x, Effect::RecoveryStarted { .. })), 0);
    assert_eq!(h.count(|x| matches!(x, Effect::TurnEnded { .. })), 0);
    // The provider's own failure still takes the first step of the schedule.
    assert_eq!(
        h.cb(
            1,
            exec,
            Some(a),
            g,
            RuntimeEvent::Exited { stamp: stamp(99) }
        ),
        Verdict::Accepted
    );
    assert_eq!(
        h.count(|x| matches!(x, Effect::RecoveryStarted { step: 1, .. })),
        1
    );
    h.assert_clean();
}

/// Issue 28, item 4: a prompt written to the agent (performed) whose runtime then died
/// before any sign of it (no update, no answer) may have been read: the loss is recovered
/// on the schedule, the re-prompt carrying the replay block once, never rolled back for
/// the caller to send again outside the schedule.
#[test]
fn exit_after_the_prompt_was_written_is_recovered_not_rolled_back() {
    let mut h = H::default();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    let lease = h.last_lease();
    assert_eq!(h.perform(lease), Verdict::Accepted);
    h.cb(1, 1, Some(a), g, RuntimeEvent::Exited { stamp: stamp(5) });
    assert_eq!(
        h.count(|x| matches!(x, Effect::TurnEnded { .. })),
        0,
        "{:?}",
        h.log()
    );
    assert_eq!(
        h.count(|x| matches!(x, Effect::RecoveryStarted { step: 1, .. })),
        1
    );
    h.assert_clean();
}

/// The same exit before the prompt was written (dispatched, not performed) rolls it back:
/// it never reached the agent.
#[test]
fn exit_before_the_prompt_was_written_rolls_it_back() {
    let mut h = H::default();
    h.prompt(1, 1);
    let (a, g) = h.ready(1, 1);
    h.cb(1, 1, Some(a), g, RuntimeEvent::Exited { stamp: stamp(5) });
    assert_eq!(
        h.count(|x| matches!(
            x,
            Effect::TurnEnded {
                outcome: TurnOutcome::RolledBack,
                ..
            }
        )),
        1
    );
    assert_eq!(h.count(|x| matches!(x, Effect::RecoveryStarted { .. })), 0);
    h.assert_clean();
}
