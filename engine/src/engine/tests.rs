//! The engine's unit tests.

use super::effects::load_params;
use super::*;
use crate::state::Header;
use palisade_core::PromptRequest;

fn config() -> EngineConfig {
    let mut config = EngineConfig {
        cwd: "/tmp".into(),
        audit: true,
        ..EngineConfig::default()
    };
    config.core.recovery_delays_ms = vec![50];
    config
}

/// Test shorthands for the shell's side of [`Engine::poll_output`], without persistence.
impl Engine {
    /// The next action.
    fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front().map(|(_, action)| action)
    }

    /// The next event for the caller, delivered as it is taken.
    fn pop_event(&mut self) -> Option<SessionEvent> {
        self.ready.pop_released(u64::MAX)
    }
}

fn session(n: u64) -> SessionId {
    SessionId::new(n).unwrap()
}

/// The next spawn (kills and other chores before it are skipped).
fn spawn_action(engine: &mut Engine) -> (SessionId, AttemptId) {
    loop {
        match engine.poll_action() {
            Some(Action::Spawn { session, attempt }) => return (session, attempt),
            Some(Action::Kill { .. } | Action::Notify { .. }) => {}
            other => panic!("expected a spawn, got {other:?}"),
        }
    }
}

/// Starts the runtime the engine asks for next (as process `pid`) and answers its
/// `initialize` (with `loadSession`) and `session/new` (`c1`): a runtime ready for the
/// prompt.
fn ready_runtime(engine: &mut Engine, now: Timestamp, pid: u32) -> ExecutionId {
    let (s, attempt) = spawn_action(engine);
    let execution = engine.spawned(now, s, attempt, Ok(Some(pid)));
    answer(
        engine,
        now,
        execution,
        acp::INITIALIZE,
        json!({"agentCapabilities": {"loadSession": true}}),
    );
    answer(
        engine,
        now,
        execution,
        acp::SESSION_NEW,
        json!({"sessionId": "c1"}),
    );
    execution
}

/// Answers the next request, which must be `method`.
fn answer(
    engine: &mut Engine,
    now: Timestamp,
    execution: ExecutionId,
    method: &str,
    result: Value,
) {
    match engine.poll_action() {
        Some(Action::Request { op, method: m, .. }) if m == method => {
            engine.reply(now, execution, op, Ok(RawJson::from_value(&result)));
        }
        other => panic!("expected {method}, got {other:?}"),
    }
}

fn chunk(text: &str) -> AgentEvent {
    let params = json!({
        "sessionId": "c1",
        "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
    });
    AgentEvent::Notification {
        method: acp::SESSION_UPDATE.to_owned(),
        wire_bytes: params.to_string().len(),
        params: RawJson::from_value(&params),
    }
}

fn events(engine: &mut Engine) -> Vec<SessionEvent> {
    std::iter::from_fn(|| engine.pop_event()).collect()
}

/// An event handed out is undelivered for the state until the caller is done with
/// it: a restart before that hands it out again (stack-crash-caller-stalled found the
/// loss when the state counted it delivered at once).
#[test]
fn handed_events_stay_in_the_state_until_acknowledged() {
    let now = Timestamp::from_millis(1_000);
    let mut engine = Engine::new(EngineConfig {
        persistence: true,
        ..config()
    })
    .unwrap();
    // Drains what may leave, writing the state whenever asked; the events stay.
    let settle = |engine: &mut Engine| -> Vec<Action> {
        let mut actions = Vec::new();
        loop {
            match engine.poll_output(now) {
                Output::Persist => {
                    let image = engine.state_image(now);
                    engine.persisted(image.version);
                }
                Output::Action(action) => actions.push(action),
                Output::Event(event) => panic!("the caller has no room: {event:?}"),
                Output::Wait { .. } => return actions,
            }
        }
    };
    for n in 1..=3 {
        engine.prompt(now, session(n), "hello".into()).unwrap();
    }
    for (n, action) in (1..=3).zip(settle(&mut engine)) {
        let Action::Spawn {
            session: s,
            attempt,
        } = action
        else {
            panic!("expected a spawn, got {action:?}");
        };
        engine.spawned(now, s, attempt, Ok(Some(40 + n)));
    }
    settle(&mut engine);
    let names = |events: &[SessionEvent]| events.iter().map(SessionEvent::name).collect::<Vec<_>>();
    // What the state lists undelivered: the events a restart hands out first.
    let restored_events = |engine: &Engine| {
        let bytes = engine.encode_state(now);
        state::decode(&bytes).unwrap().header.undelivered
    };
    let before = restored_events(&engine);
    assert!(
        before.len() >= 3,
        "each runtime's start is an event: {before:?}"
    );
    // Handed out and not acknowledged: still there after a restart.
    engine.set_caller_room(1);
    let Output::Event(first) = engine.poll_output(now) else {
        panic!("an event for the caller");
    };
    assert_eq!(names(&restored_events(&engine)), names(&before));
    // Acknowledged: gone from the state; the rest still there.
    engine.acknowledge(1);
    let after = restored_events(&engine);
    assert_eq!(names(&after[..]), names(&before[1..]), "{first:?}");
}

#[test]
fn restore_reports_bound_runtimes_exited_and_restarts_unbound_attempts() {
    let now = Timestamp::from_millis(1_000);
    let mut engine = Engine::new(config()).unwrap();
    // Session 1 streams on a ready runtime.
    let turn = engine.prompt(now, session(1), "hello".into()).unwrap();
    let execution = ready_runtime(&mut engine, now, 42);
    assert!(matches!(
        engine.poll_action(),
        Some(Action::Request {
            op: Op::Prompt { .. },
            ..
        })
    ));
    engine.agent_event(now, execution, chunk("one"));
    engine.pump_outlets(now);
    // Session 2's runtime is being started when the process dies.
    engine.prompt(now, session(2), "other".into()).unwrap();
    let (_, unbound) = spawn_action(&mut engine);
    assert!(
        engine.audit_violations().is_empty(),
        "{:?}",
        engine.audit_violations()
    );
    let bytes = engine.encode_state(now);

    let later = now.plus_millis(10);
    let mut restored = Engine::restore(config(), &bytes, later).unwrap();
    assert_eq!(restored.epoch().get(), 2);
    assert_eq!(restored.conversation(session(1)).as_deref(), Some("c1"));
    // The unbound attempt gets its runtime now; the bound one's runtime is gone, and
    // the turn it carried is resumed: the restart, not the agent, took the runtime
    // down, so no recovery step is used up (issue 11).
    assert_eq!(
        restored.poll_action(),
        Some(Action::Spawn {
            session: session(2),
            attempt: unbound
        })
    );
    let after = events(&mut restored);
    assert!(
        !after
            .iter()
            .any(|e| matches!(e, SessionEvent::RecoveryStarted { .. })),
        "{after:?}"
    );
    let due = restored.poll_timeout().unwrap();
    restored.handle_timeout(due);
    let (s, attempt) = spawn_action(&mut restored);
    assert_eq!((s, attempt.epoch().get()), (session(1), 2));
    // The replacement loads the conversation and re-prompts with one replay block.
    let execution = restored.spawned(due, s, attempt, Ok(Some(43)));
    answer(
        &mut restored,
        due,
        execution,
        acp::INITIALIZE,
        json!({"agentCapabilities": {"loadSession": true}}),
    );
    answer(&mut restored, due, execution, acp::SESSION_LOAD, json!({}));
    match restored.poll_action() {
        Some(Action::Request {
            op: Op::Prompt { turn: t, .. },
            params,
            ..
        }) => {
            assert_eq!(t, turn);
            let text = params.prompt_text().unwrap();
            assert_eq!(text.matches(crate::replay::REPLAY_BLOCK_TAG).count(), 1);
            assert!(text.contains("delivered-through=\"1\""));
            assert!(text.ends_with("hello"));
        }
        other => panic!("expected the re-prompt, got {other:?}"),
    }
    restored.core().check_invariants().unwrap();
}

/// A platform whose runtimes outlive their orchestrator (a sidecar) still runs the
/// previous incarnation's after a restart: the restored engine kills them, fences what
/// they still write, and kills them again after every restart until the platform reports
/// them gone. Fails without the kill (mutant `restore-leaves-survivors-running`).
#[test]
fn a_restored_engine_kills_the_runtimes_it_inherited_until_they_are_reaped() {
    let now = Timestamp::from_millis(1_000);
    let mut engine = Engine::new(config()).unwrap();
    engine.prompt(now, session(1), "hello".into()).unwrap();
    let survivor = ready_runtime(&mut engine, now, 42);
    prompt_request(&mut engine);
    let kills = |engine: &mut Engine| -> Vec<ExecutionId> {
        std::iter::from_fn(|| engine.poll_action())
            .filter_map(|a| match a {
                Action::Kill { execution } => Some(execution),
                _ => None,
            })
            .collect()
    };

    let t1 = now.plus_millis(10);
    let mut first = Engine::restore(config(), &engine.encode_state(now), t1).unwrap();
    assert_eq!(kills(&mut first), [survivor]);
    events(&mut first);
    // It goes on streaming its turn, and answers it: none of it reaches the caller.
    first.agent_event(t1, survivor, chunk("late"));
    first.reply(
        t1,
        survivor,
        Op::Prompt {
            turn: TurnId::new(1).unwrap(),
            dispatch: 1,
        },
        Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
    );
    first.pump_outlets(t1);
    let late = events(&mut first);
    assert!(
        !late.iter().any(|e| matches!(
            e,
            SessionEvent::Output { .. } | SessionEvent::TurnEnded { .. }
        )),
        "{late:?}"
    );

    // A restart before the platform reported it gone kills it again ...
    let t2 = t1.plus_millis(10);
    let mut second = Engine::restore(config(), &first.encode_state(t1), t2).unwrap();
    assert!(kills(&mut second).contains(&survivor));
    // ... and once it is reported gone, no later restart does.
    second.reaped(t2, survivor, Some(ProcessExit::Signal(9)));
    let t3 = t2.plus_millis(10);
    let mut third = Engine::restore(config(), &second.encode_state(t2), t3).unwrap();
    assert!(!kills(&mut third).contains(&survivor));
}

#[test]
fn restore_during_a_load_fails_the_attempt_instead_of_loading_on_a_dead_runtime() {
    let now = Timestamp::from_millis(1_000);
    let mut engine = Engine::new(config()).unwrap();
    let first = engine.prompt(now, session(1), "first".into()).unwrap();
    let execution = ready_runtime(&mut engine, now, 1);
    let op = prompt_request(&mut engine);
    engine.reply(
        now,
        execution,
        op,
        Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
    );
    engine.agent_event(
        now,
        execution,
        AgentEvent::Closed(CloseReason::ProcessExited(ProcessExit::Code(0))),
    );
    engine.reaped(now, execution, Some(ProcessExit::Code(0)));
    // The next turn needs a runtime that loads the conversation; the supervisor dies
    // while the load is in flight.
    let second = engine.prompt(now, session(1), "second".into()).unwrap();
    let (s, attempt) = spawn_action(&mut engine);
    let loading = engine.spawned(now, s, attempt, Ok(Some(2)));
    answer(
        &mut engine,
        now,
        loading,
        acp::INITIALIZE,
        json!({"agentCapabilities": {"loadSession": true}}),
    );
    assert!(matches!(
        engine.poll_action(),
        Some(Action::Request {
            op: Op::Load { .. },
            ..
        })
    ));
    let ended: Vec<_> = events(&mut engine)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::TurnEnded { turn, .. } => Some(turn),
            _ => None,
        })
        .collect();
    assert_eq!(ended, [first]);
    let bytes = engine.encode_state(now);

    let mut restored = Engine::restore(config(), &bytes, now.plus_millis(5)).unwrap();
    let actions: Vec<Action> = std::iter::from_fn(|| restored.poll_action()).collect();
    assert_eq!(
        actions,
        [Action::Kill { execution: loading }],
        "nothing is sent to the dead runtime but its kill"
    );
    let after = events(&mut restored);
    assert!(
        after.iter().any(|e| matches!(
            e,
            SessionEvent::FailureReported {
                cause: FailureCause::SupervisorRestarted,
                ..
            }
        )),
        "{after:?}"
    );
    assert!(
        after.iter().any(|e| matches!(
            e,
            SessionEvent::TurnEnded { turn, outcome: palisade_core::TurnOutcome::RolledBack, .. }
                if *turn == second
        )),
        "{after:?}"
    );
    assert_eq!(restored.conversation(session(1)).as_deref(), Some("c1"));
    assert!(!restored.core().session_busy(session(1)));
    restored.core().check_invariants().unwrap();
}

#[test]
fn an_answer_from_a_runtime_that_died_changes_nothing() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(config()).unwrap();
    engine.prompt(now, session(1), "hello".into()).unwrap();
    let (s, attempt) = spawn_action(&mut engine);
    let execution = engine.spawned(now, s, attempt, Ok(Some(7)));
    engine.agent_event(
        now,
        execution,
        AgentEvent::Closed(CloseReason::StdoutClosed),
    );
    // The close is reported (the turn rolls back) and the process is killed.
    let events = events(&mut engine);
    assert!(events.iter().any(|e| matches!(
        e,
        SessionEvent::TurnEnded {
            outcome: palisade_core::TurnOutcome::RolledBack,
            ..
        }
    )));
    let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(actions.contains(&Action::Kill { execution }), "{actions:?}");
    // A late initialize answer is ignored; reaping ends the runtime.
    engine.reply(
        now,
        execution,
        Op::Initialize,
        Ok(RawJson::from_value(&json!({}))),
    );
    assert!(engine.poll_action().is_none());
    engine.reaped(now, execution, Some(ProcessExit::Signal(9)));
    assert_eq!(engine.runtime_count(), 0);
    assert!(
        engine.audit_violations().is_empty(),
        "{:?}",
        engine.audit_violations()
    );
    engine.core().check_invariants().unwrap();
}

/// The next prompt request; its op.
fn prompt_request(engine: &mut Engine) -> Op {
    loop {
        match engine.poll_action() {
            Some(Action::Request {
                op: op @ Op::Prompt { .. },
                ..
            }) => return op,
            Some(_) => {}
            None => panic!("no prompt dispatched"),
        }
    }
}

#[test]
fn a_late_answer_to_an_abandoned_dispatch_does_not_end_the_redispatched_turn() {
    let mut config = config();
    config.core.recovery_delays_ms = vec![50, 100];
    config.core.start_deadline_ms = 1_000;
    let mut now = Timestamp::from_millis(1_000);
    let mut engine = Engine::new(config).unwrap();
    let turn = engine.prompt(now, session(1), "hello".into()).unwrap();
    let first = ready_runtime(&mut engine, now, 1);
    prompt_request(&mut engine);
    engine.agent_event(now, first, chunk("one"));
    // The runtime dies under the accepted turn: recovery is scheduled.
    engine.agent_event(
        now,
        first,
        AgentEvent::Closed(CloseReason::ProcessExited(ProcessExit::Code(1))),
    );
    // Meanwhile a resume brings up a runtime that becomes the session's owner.
    assert!(matches!(
        engine.resume(now, session(1)),
        Verdict::Started { .. }
    ));
    let (s, attempt) = spawn_action(&mut engine);
    let second = engine.spawned(now, s, attempt, Ok(Some(2)));
    answer(
        &mut engine,
        now,
        second,
        acp::INITIALIZE,
        json!({"agentCapabilities": {"loadSession": true}}),
    );
    answer(&mut engine, now, second, acp::SESSION_LOAD, json!({}));
    // Recovery re-dispatches the turn to that runtime; the agent never takes it, so
    // the core's acceptance deadline abandons that dispatch and dispatches again, to
    // the same runtime.
    now = engine.poll_timeout().unwrap();
    engine.handle_timeout(now);
    let abandoned = prompt_request(&mut engine);
    // The re-dispatch waits: the agent has not answered the abandoned prompt yet, and
    // ACP runs one prompt at a time (its updates until then are that prompt's).
    while let Some(due) = engine.poll_timeout() {
        now = due;
        engine.handle_timeout(now);
        if engine
            .runtimes
            .get(&second)
            .is_some_and(|r| r.held.is_some())
        {
            break;
        }
    }
    assert!(
        !engine.actions.iter().any(|(_, a)| matches!(
            a,
            Action::Request {
                op: Op::Prompt { .. },
                ..
            }
        )),
        "{:?}",
        engine.actions
    );
    // The abandoned prompt answers late: nothing ends, and the held dispatch goes.
    engine.reply(
        now,
        second,
        abandoned,
        Ok(RawJson::from_value(&json!({"stopReason": "cancelled"}))),
    );
    let before = events(&mut engine);
    assert!(
        !before
            .iter()
            .any(|e| matches!(e, SessionEvent::TurnEnded { .. })),
        "{before:?}"
    );
    let current = prompt_request(&mut engine);
    assert_ne!(abandoned, current);
    // The current one ends the turn, once.
    engine.reply(
        now,
        second,
        current,
        Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
    );
    let ended: Vec<_> = events(&mut engine)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::TurnEnded {
                turn: t, outcome, ..
            } => Some((t, outcome)),
            _ => None,
        })
        .collect();
    assert_eq!(ended, [(turn, palisade_core::TurnOutcome::Completed)]);
    assert!(
        engine.audit_violations().is_empty(),
        "{:?}",
        engine.audit_violations()
    );
    engine.core().check_invariants().unwrap();
}

#[test]
fn load_capability_is_absent_false_or_worth_a_try() {
    let read = |v: Value| load_capability(acp::session_support(&RawJson::from_value(&v)));
    assert_eq!(
        read(json!({"agentCapabilities": {"loadSession": true}})),
        Some(true)
    );
    assert_eq!(
        read(json!({"agentCapabilities": {"loadSession": false}})),
        Some(false)
    );
    assert_eq!(read(json!({"agentCapabilities": {}})), None);
    assert_eq!(read(json!({})), None);
    // Malformed proves nothing: try the load, and let its answer decide.
    assert_eq!(
        read(json!({"agentCapabilities": {"loadSession": "yes"}})),
        Some(true)
    );
}

#[test]
fn rpc_errors_reach_the_classifier_exactly() {
    let error =
        RpcError::new(-32603, "Internal error").with_data(json!({"details": "Session not found"}));
    let projected = classify_error(&error);
    assert_eq!(projected.code, -32603);
    assert_eq!(projected.message, "Internal error");
    assert_eq!(projected.data_details.as_deref(), Some("Session not found"));
    assert!(projected.data_present);
    let bare = classify_error(&RpcError::new(-32002, "Resource not found"));
    assert_eq!((bare.data_details, bare.data_present), (None, false));
}

/// A session with a ready runtime (`c1`) and one completed turn; the runtime's
/// execution.
fn ready_session(engine: &mut Engine, now: Timestamp) -> ExecutionId {
    engine.prompt(now, session(1), "first".into()).unwrap();
    let execution = ready_runtime(engine, now, 1);
    let op = prompt_request(engine);
    engine.reply(
        now,
        execution,
        op,
        Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
    );
    events(engine);
    execution
}

fn update(kind: &str) -> AgentEvent {
    let params =
        json!({"sessionId": "c1", "update": {"sessionUpdate": kind, "availableCommands": []}});
    AgentEvent::Notification {
        method: acp::SESSION_UPDATE.to_owned(),
        wire_bytes: params.to_string().len(),
        params: RawJson::from_value(&params),
    }
}

#[test]
fn an_unprompted_session_state_update_is_neither_output_nor_acceptance() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(config()).unwrap();
    let execution = ready_session(&mut engine, now);
    let turn = engine.prompt(now, session(1), "second".into()).unwrap();
    prompt_request(&mut engine);
    // Written right after session/new, read after the prompt went out.
    engine.agent_event(now, execution, update("available_commands_update"));
    engine.agent_event(now, execution, update("current_mode_update"));
    engine.pump_outlets(now);
    engine.flush_output(now);
    let got = events(&mut engine);
    assert!(
        !got.iter().any(|e| matches!(e, SessionEvent::Output { .. })),
        "{got:?}"
    );
    // Not accepted: the core's accept deadline passes (an accepted turn has no such
    // deadline). The prompt was written and the agent may have read it, so the turn is
    // recovered on the schedule, not rolled back.
    let late = now.plus_millis(config().core.start_deadline_ms + 1);
    engine.handle_timeout(late);
    engine.pump_outlets(late);
    engine.flush_output(late);
    let got: Vec<_> = events(&mut engine)
        .into_iter()
        .filter(|e| {
            matches!(e, SessionEvent::TurnEnded { turn: t, .. }
                | SessionEvent::RecoveryStarted { turn: t, .. } if *t == turn)
        })
        .collect();
    assert!(
        matches!(got[..], [SessionEvent::RecoveryStarted { step: 1, .. }]),
        "{got:?}"
    );
    let _ = execution;
}

#[test]
fn a_prompt_waits_for_the_agent_to_answer_the_cancelled_one_before_it() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(config()).unwrap();
    let execution = ready_session(&mut engine, now);
    let cancelled = engine.prompt(now, session(1), "second".into()).unwrap();
    let old = prompt_request(&mut engine);
    // Cancelled before the agent showed any sign of it: the turn ends at once.
    engine.cancel(now, session(1));
    let third = engine.prompt(now, session(1), "third".into()).unwrap();
    let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(
        !actions.iter().any(|a| matches!(
            a,
            Action::Request {
                op: Op::Prompt { .. },
                ..
            }
        )),
        "the third prompt must wait for the agent's answer to the second: {actions:?}"
    );
    // The agent streams the cancelled prompt's output, then answers it.
    engine.agent_event(now, execution, chunk("late output of the cancelled prompt"));
    engine.reply(
        now,
        execution,
        old,
        Ok(RawJson::from_value(&json!({"stopReason": "cancelled"}))),
    );
    let new = prompt_request(&mut engine);
    engine.agent_event(now, execution, chunk("third's output"));
    engine.reply(
        now,
        execution,
        new,
        Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
    );
    let got = events(&mut engine);
    let outputs: Vec<(TurnId, String)> = got
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Output { turn, events, .. } => Some(events.iter().map(|o| {
                (
                    *turn,
                    o.update.parse::<Value>().unwrap()["content"]["text"].to_string(),
                )
            })),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        outputs,
        [(third, "\"third's output\"".to_owned())],
        "{got:?}"
    );
    assert!(got.iter().any(|e| matches!(
        e,
        SessionEvent::TurnEnded { turn, outcome: TurnOutcome::Completed, .. } if *turn == third
    )));
    let cancelled_ends: Vec<_> = got
        .iter()
        .filter_map(|e| match e {
            SessionEvent::TurnEnded { turn, outcome, .. } if *turn == cancelled => Some(*outcome),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled_ends, [TurnOutcome::Cancelled]);
}

#[test]
fn a_failed_prompt_ends_its_turn_with_the_agents_error() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(config()).unwrap();
    let execution = ready_session(&mut engine, now);
    let turn = engine.prompt(now, session(1), "second".into()).unwrap();
    let op = prompt_request(&mut engine);
    let error = RpcError::new(-32000, "Authentication required");
    engine.reply(now, execution, op, Err(RpcFailure::Rpc(error.clone())));
    let ended: Vec<_> = events(&mut engine)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::TurnEnded {
                turn: t,
                outcome,
                cause,
                ..
            } if t == turn => Some((outcome, cause)),
            _ => None,
        })
        .collect();
    assert_eq!(
        ended,
        [(
            TurnOutcome::Failed,
            Some(FailureCause::Prompt(RpcFailure::Rpc(error)))
        )]
    );
}

/// The (turn, seq) of every output event the engine hands out now, in order.
fn output_seqs(engine: &mut Engine) -> Vec<(TurnId, u64)> {
    events(engine)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::Output { turn, events, .. } => {
                Some(events.into_iter().map(move |o| (turn, o.seq)))
            }
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn output_admitted_but_not_yet_handed_out_survives_a_restart() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(config()).unwrap();
    let execution = ready_session(&mut engine, now);
    let turn = engine.prompt(now, session(1), "second".into()).unwrap();
    prompt_request(&mut engine);
    engine.agent_event(now, execution, chunk("one"));
    engine.agent_event(now, execution, chunk("two"));
    // Both admitted (the core counted them delivered), still batching for the caller.
    engine.pump_outlets(now);
    assert_eq!(engine.backlog().0, 2);
    let bytes = engine.encode_state(now);
    let mut restored = Engine::restore(config(), &bytes, now.plus_millis(5)).unwrap();
    restored.flush_output(now.plus_millis(5));
    let outputs = output_seqs(&mut restored);
    assert_eq!(outputs, [(turn, 1), (turn, 2)]);
}

/// Found by the sweep (`reports/regressions/found/restored-output-beyond-queue-capacity.json`):
/// with a queue of one, the coalescer's batch and the queue together hold more than the
/// queue does; a restart used to push them all back into the queue and drop what did
/// not fit, so the caller never got event 2.
#[test]
fn output_beyond_the_queue_capacity_survives_a_restart() {
    let now = Timestamp::from_millis(1);
    let mut config = config();
    config.delivery_queue_capacity = 1;
    let mut engine = Engine::new(config.clone()).unwrap();
    let execution = ready_session(&mut engine, now);
    let turn = engine.prompt(now, session(1), "second".into()).unwrap();
    prompt_request(&mut engine);
    for text in ["one", "two", "three"] {
        engine.agent_event(now, execution, chunk(text));
        engine.pump_outlets(now);
    }
    // Three admitted: at most one in the queue, the rest batching for the caller.
    assert_eq!(engine.backlog().0, 3);
    let bytes = engine.encode_state(now);
    let later = now.plus_millis(5);
    let mut restored = Engine::restore(config, &bytes, later).unwrap();
    restored.pump_outlets(later);
    restored.flush_output(later);
    let outputs = output_seqs(&mut restored);
    assert_eq!(outputs, [(turn, 1), (turn, 2), (turn, 3)]);
}

/// The engine's side of the core driver's finding
/// (`fuzz/regressions/callback_orderings/restore-at-a-later-time-then-a-clock-reading-earlier`):
/// restored at a time its core never saw, then handed a clock that reads earlier, an
/// engine must not count a new deadline from the earlier reading.
#[test]
fn a_restore_raises_the_clock_so_an_earlier_reading_cannot_shorten_a_deadline() {
    let config = config();
    let bytes = Engine::new(config.clone())
        .unwrap()
        .encode_state(Timestamp::from_millis(1));
    let restart = Timestamp::from_millis(120_000);
    let mut restored = Engine::restore(config.clone(), &bytes, restart).unwrap();
    let earlier = Timestamp::from_millis(119_530);
    assert!(matches!(
        restored.resume(earlier, session(1)),
        Verdict::Started { .. }
    ));
    assert_eq!(
        restored.poll_timeout(),
        Some(restart.plus_millis(config.core.start_deadline_ms))
    );
}

#[test]
fn oversized_prompts_are_refused_before_the_core_sees_them() {
    let mut engine = Engine::new(config()).unwrap();
    let text = "x".repeat(MAX_PROMPT_BYTES + 1);
    assert_eq!(
        engine.prompt(Timestamp::ZERO, session(1), text),
        Err(PromptError::TooLarge {
            bytes: MAX_PROMPT_BYTES + 1
        })
    );
    assert!(engine.poll_action().is_none());
}

/// Runtime reuse over one cancelled resume: the user cancels while the first attempt's
/// process is still starting and prompts again; the second attempt takes that process
/// over when it is up (no second spawn), the first attempt's late bind is reported and
/// refused, and the turn completes on the reused runtime. `Err` names what went wrong.
fn reuse_serves_the_successor(mutant: Option<&str>) -> Result<(), String> {
    let now = Timestamp::from_millis(1_000);
    let mut config = config();
    config.reuse_runtimes = true;
    let mut engine = Engine::new(config).unwrap();
    #[cfg(feature = "mutants")]
    engine.set_mutant(mutant.map(|m| palisade_core::mutants::Mutant::from_name(m).unwrap()));
    #[cfg(not(feature = "mutants"))]
    assert!(mutant.is_none(), "mutants need the feature");
    engine.prompt(now, session(1), "first".into()).unwrap();
    let (s, first) = spawn_action(&mut engine);
    // Cancelled while its process starts; the retry waits for that process.
    engine.cancel(now, session(1));
    let turn = engine.prompt(now, session(1), "second".into()).unwrap();
    let second = engine
        .core()
        .live_attempt(session(1))
        .expect("a live attempt");
    assert_ne!(second, first);
    let pending: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(
        !pending.iter().any(|a| matches!(a, Action::Spawn { .. })),
        "no second spawn while the first process starts: {pending:?}"
    );
    let _ = events(&mut engine);
    let execution = engine.spawned(now, s, first, Ok(Some(7)));
    let started: Vec<_> = events(&mut engine)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::RuntimeStarted { attempt, .. } => Some(attempt),
            _ => None,
        })
        .collect();
    assert_eq!(started, [second], "the process serves the live attempt");
    let mut answered = 0;
    while let Some(action) = engine.poll_action() {
        match action {
            Action::Request { op, method, .. } => {
                let result = match method.as_ref() {
                    acp::INITIALIZE => json!({"agentCapabilities": {"loadSession": true}}),
                    acp::SESSION_NEW => json!({"sessionId": "c1"}),
                    acp::SESSION_PROMPT => {
                        engine.agent_event(now, execution, chunk("hello"));
                        json!({"stopReason": "end_turn"})
                    }
                    other => return Err(format!("unexpected request {other}")),
                };
                answered += 1;
                engine.reply(now, execution, op, Ok(RawJson::from_value(&result)));
            }
            Action::Stop { .. } | Action::Kill { .. } => {
                return Err(format!(
                    "the reused runtime was torn down under its new attempt: {action:?}"
                ))
            }
            other => return Err(format!("unexpected action {other:?}")),
        }
    }
    engine.flush_output(now);
    let ended: Vec<_> = events(&mut engine)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::TurnEnded { turn, outcome, .. } => Some((turn, outcome)),
            _ => None,
        })
        .collect();
    if ended != [(turn, palisade_core::TurnOutcome::Completed)] {
        return Err(format!(
            "after {answered} answers the turns ended {ended:?}"
        ));
    }
    if engine.runtime_count() != 1 {
        return Err(format!("{} runtimes", engine.runtime_count()));
    }
    if mutant.is_none() && !engine.audit_violations().is_empty() {
        return Err(format!("{:?}", engine.audit_violations()));
    }
    Ok(())
}

#[test]
fn a_retry_takes_over_the_process_its_cancelled_predecessor_started() {
    assert_eq!(reuse_serves_the_successor(None), Ok(()));
}

/// The same flow with the core's `old-attempt-stops-successor` bug: the retired
/// attempt's late bind stops the process its successor took over.
#[cfg(feature = "mutants")]
#[test]
fn the_old_attempt_stops_successor_mutant_breaks_reuse() {
    let err = reuse_serves_the_successor(Some("old-attempt-stops-successor")).unwrap_err();
    assert!(err.contains("torn down"), "{err}");
}

/// Without reuse the retry spawns a process of its own and the first one is killed.
#[test]
fn without_reuse_a_retry_spawns_its_own_process() {
    let now = Timestamp::from_millis(1_000);
    let mut engine = Engine::new(config()).unwrap();
    engine.prompt(now, session(1), "first".into()).unwrap();
    let (s, first) = spawn_action(&mut engine);
    engine.cancel(now, session(1));
    engine.prompt(now, session(1), "second".into()).unwrap();
    let (_, second) = spawn_action(&mut engine);
    assert_ne!(second, first);
    let late = engine.spawned(now, s, first, Ok(Some(7)));
    assert!(
        std::iter::from_fn(|| engine.poll_action()).any(|a| a == Action::Kill { execution: late })
    );
}

/// An engine with reuse on, whose session 1 has a cancelled attempt's process still
/// starting and a retry waiting for it: (engine, session, first attempt, retry).
fn waiting_for_a_cancelled_start(now: Timestamp) -> (Engine, SessionId, AttemptId, AttemptId) {
    let mut config = config();
    config.reuse_runtimes = true;
    let mut engine = Engine::new(config).unwrap();
    engine.prompt(now, session(1), "first".into()).unwrap();
    let (s, first) = spawn_action(&mut engine);
    engine.cancel(now, session(1));
    engine.prompt(now, session(1), "second".into()).unwrap();
    let retry = engine
        .core()
        .live_attempt(session(1))
        .expect("a live attempt");
    let _: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    let _ = events(&mut engine);
    (engine, s, first, retry)
}

/// The predecessor's start failed: the waiting retry gets a spawn of its own.
#[test]
fn a_retry_spawns_when_the_start_it_waited_for_fails() {
    let now = Timestamp::from_millis(1_000);
    let (mut engine, s, first, retry) = waiting_for_a_cancelled_start(now);
    engine.spawned(now, s, first, Err("no such file".into()));
    let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(
        actions.contains(&Action::Spawn {
            session: s,
            attempt: retry
        }),
        "{actions:?}"
    );
    let own = engine.spawned(now, s, retry, Ok(Some(8)));
    let started: Vec<_> = events(&mut engine)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::RuntimeStarted {
                attempt, execution, ..
            } => Some((attempt, execution)),
            _ => None,
        })
        .collect();
    assert_eq!(started, [(retry, own)]);
    assert!(
        engine.audit_violations().is_empty(),
        "{:?}",
        engine.audit_violations()
    );
}

/// A retry cancelled while it waited takes nothing over: the late process is the
/// cancelled attempt's and goes away.
#[test]
fn a_cancelled_retry_does_not_take_the_process_over() {
    let now = Timestamp::from_millis(1_000);
    let (mut engine, s, first, _retry) = waiting_for_a_cancelled_start(now);
    engine.cancel(now, session(1));
    let late = engine.spawned(now, s, first, Ok(Some(7)));
    let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(
        actions.iter().any(|a| matches!(a,
            Action::Kill { execution } | Action::Stop { execution, .. } if *execution == late)),
        "{actions:?}"
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Spawn { .. } | Action::Request { .. })),
        "{actions:?}"
    );
    assert!(!events(&mut engine)
        .iter()
        .any(|e| matches!(e, SessionEvent::RuntimeStarted { .. })));
    assert!(
        engine.audit_violations().is_empty(),
        "{:?}",
        engine.audit_violations()
    );
}

/// Issue 28, item 12: an agent answering `initialize` with `protocolVersion: 999` was
/// accepted. ACP v1: a client that does not support the version the agent answers
/// with closes the connection and tells the user. The start fails, saying so, and
/// the runtime goes; an answer with version 1 (or, as old test doubles write it,
/// none) is accepted.
#[test]
fn an_agent_answering_another_protocol_version_fails_its_start() {
    let now = Timestamp::from_millis(1_000);
    for (version, refused) in [
        (json!(999), true),
        (json!(0), true),
        (json!("1"), true),
        (json!(1.5), true),
        (json!(1), false),
        (Value::Null, false),
    ] {
        let mut engine = Engine::new(config()).unwrap();
        engine.prompt(now, session(1), "hello".into()).unwrap();
        let (s, attempt) = spawn_action(&mut engine);
        let execution = engine.spawned(now, s, attempt, Ok(Some(7)));
        let mut answer_json = json!({"agentCapabilities": {"loadSession": true}});
        if !version.is_null() {
            answer_json["protocolVersion"] = version.clone();
        }
        answer(&mut engine, now, execution, acp::INITIALIZE, answer_json);
        let events = events(&mut engine);
        let failure = events.iter().find_map(|e| match e {
            SessionEvent::FailureReported { cause, .. } => Some(cause.to_string()),
            _ => None,
        });
        if refused {
            let failure = failure.unwrap_or_else(|| panic!("{version}: {events:?}"));
            assert!(
                failure.contains(&format!("ACP protocol version {version}")),
                "{failure}"
            );
            let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
            assert!(
                actions.iter().any(|a| matches!(a,
                    Action::Kill { execution: e } | Action::Stop { execution: e, .. }
                        if *e == execution)),
                "{version}: {actions:?}"
            );
            assert!(
                !actions.iter().any(|a| matches!(a, Action::Request { .. })),
                "{version}: {actions:?}"
            );
        } else {
            assert_eq!(failure, None, "{version}");
            assert!(
                matches!(
                    engine.poll_action(),
                    Some(Action::Request { method, .. }) if method == acp::SESSION_NEW
                ),
                "{version}"
            );
        }
        assert!(
            engine.audit_violations().is_empty(),
            "{:?}",
            engine.audit_violations()
        );
    }
}

/// An engine with a client behind its caller (`palisade-proxy`'s).
fn client_config() -> EngineConfig {
    EngineConfig {
        client: ClientSide::Forward,
        ..config()
    }
}

fn permission_request(id: i64) -> AgentEvent {
    AgentEvent::Request {
        id: RequestId::Number(id),
        method: acp::SESSION_REQUEST_PERMISSION.to_owned(),
        params: RawJson::from_value(&json!({"sessionId": "c1", "toolCall": {"toolCallId": "t"}})),
    }
}

/// The ticket of the client request the engine shows next.
fn client_ticket(engine: &mut Engine) -> u64 {
    events(engine)
        .into_iter()
        .find_map(|e| match e {
            SessionEvent::ClientRequest { ticket, method, .. } => {
                assert_eq!(method, acp::SESSION_REQUEST_PERMISSION);
                Some(ticket)
            }
            _ => None,
        })
        .expect("the request is shown to the client")
}

#[test]
fn without_a_client_a_permission_request_is_declined() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(config()).unwrap();
    let execution = ready_session(&mut engine, now);
    engine.agent_event(now, execution, permission_request(7));
    assert!(!events(&mut engine)
        .iter()
        .any(|e| matches!(e, SessionEvent::ClientRequest { .. })));
    let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(
        matches!(&actions[..], [Action::Respond { id: RequestId::Number(7), outcome: Ok(answer), .. }]
            if answer["outcome"]["outcome"] == "cancelled"),
        "{actions:?}"
    );
}

/// Issue 27: the client's answer reaches only the execution that asked, and an answer
/// that comes after that execution was retired is dropped and counted, never delivered to
/// its successor.
#[test]
fn a_client_answer_reaches_only_the_execution_that_asked() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(client_config()).unwrap();
    let execution = ready_session(&mut engine, now);
    engine.agent_event(now, execution, permission_request(7));
    let ticket = client_ticket(&mut engine);
    let allow = json!({"outcome": {"outcome": "selected", "optionId": "allow"}});
    assert!(engine.answer_client_request(ticket, Ok(RawJson::from_value(&allow))));
    let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(
        matches!(&actions[..], [Action::Respond { execution: e, id: RequestId::Number(7), outcome: Ok(answer) }]
            if *e == execution && *answer == allow),
        "{actions:?}"
    );
    // A second answer to the same ticket goes nowhere.
    assert!(!engine.answer_client_request(ticket, Ok(RawJson::from_value(&allow))));

    // The agent asks again, then dies before the client answers.
    engine.agent_event(now, execution, permission_request(8));
    let late = client_ticket(&mut engine);
    engine.agent_event(
        now,
        execution,
        AgentEvent::Closed(CloseReason::ProcessExited(ProcessExit::Code(1))),
    );
    while engine.poll_action().is_some() {}
    assert!(!engine.answer_client_request(late, Ok(RawJson::from_value(&allow))));
    assert!(
        !std::iter::from_fn(|| engine.poll_action()).any(|a| matches!(a, Action::Respond { .. })),
        "a late answer reaches no process"
    );
    assert_eq!(engine.stats().client_answers_dropped, 2);
}

/// A request of an execution the engine already stopped is refused, not shown.
#[test]
fn a_retired_executions_request_is_not_shown_to_the_client() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(client_config()).unwrap();
    let execution = ready_session(&mut engine, now);
    engine.agent_event(
        now,
        execution,
        AgentEvent::Closed(CloseReason::StdoutClosed),
    );
    events(&mut engine);
    while engine.poll_action().is_some() {}
    engine.agent_event(now, execution, permission_request(9));
    assert!(!events(&mut engine)
        .iter()
        .any(|e| matches!(e, SessionEvent::ClientRequest { .. })));
}

/// Cancelling a turn answers its open permission requests `cancelled`, as ACP asks.
#[test]
fn cancelling_a_turn_answers_its_open_permission_requests_cancelled() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(client_config()).unwrap();
    let execution = ready_session(&mut engine, now);
    engine
        .prompt(now, session(1), "second".into())
        .expect("the session is free");
    prompt_request(&mut engine);
    engine.agent_event(now, execution, chunk("working"));
    engine.agent_event(now, execution, permission_request(11));
    let ticket = client_ticket(&mut engine);
    engine.cancel(now, session(1));
    let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(
        actions.iter().any(|a| matches!(a,
            Action::Respond { id: RequestId::Number(11), outcome: Ok(answer), .. }
                if answer["outcome"]["outcome"] == "cancelled")),
        "{actions:?}"
    );
    assert!(!engine.answer_client_request(ticket, Ok(RawJson::null())));
}

/// A client's prompt blocks reach the agent as they came; a recovery re-prompt puts the
/// replay block in front of them as a text block of its own.
#[test]
fn prompt_blocks_pass_through_with_the_replay_block_in_front() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(client_config()).unwrap();
    let blocks = json!([{"type": "text", "text": "look"}, {"type": "resource_link", "uri": "file:///a", "name": "a"}]);
    engine
        .prompt_content(
            now,
            session(1),
            PromptContent::Blocks(RawJson::from_value(&blocks)),
        )
        .unwrap();
    ready_runtime(&mut engine, now, 1);
    let Some(Action::Request { params, .. }) = engine.poll_action() else {
        panic!("the prompt is dispatched");
    };
    assert_eq!(
        params.to_value(),
        json!({"sessionId": "c1", "prompt": blocks})
    );

    let request = PromptRequest {
        replay_blocks: 1,
        replay_generation: 2,
        delivered_through: 3,
    };
    let params = super::effects::prompt_blocks("c2", &RawJson::from_value(&blocks), &request)
        .expect("blocks are an array");
    let params: Value = params.parse().unwrap();
    let prompt = params["prompt"].as_array().unwrap();
    assert_eq!(prompt.len(), 3);
    assert!(prompt[0]["text"]
        .as_str()
        .unwrap()
        .starts_with(crate::replay::REPLAY_BLOCK_TAG));
    assert_eq!(prompt[1..], blocks.as_array().unwrap()[..]);
}

/// A client's session: `session/new` is sent with the client's own params, a load with
/// their `cwd` and `mcpServers`, and updates outside a turn reach the client.
#[test]
fn a_client_session_is_made_with_the_clients_params() {
    let now = Timestamp::from_millis(1);
    let mut engine = Engine::new(client_config()).unwrap();
    let new_params = json!({"cwd": "/home/u/p", "mcpServers": [{"name": "x", "command": "y", "args": [], "env": []}]});
    engine.set_client_hello(RawJson::from_value(
        &json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true}}}),
    ));
    let verdict = engine.open(
        now,
        session(1),
        SessionSetup {
            label: Some("pls_1".into()),
            params: Some(RawJson::from_value(&new_params)),
            history: false,
        },
    );
    assert!(!verdict.is_reject(), "{verdict:?}");
    let (s, attempt) = spawn_action(&mut engine);
    let execution = engine.spawned(now, s, attempt, Ok(Some(1)));
    let Some(Action::Request { params, .. }) = engine.poll_action() else {
        panic!("initialize");
    };
    assert_eq!(
        params.to_value()["clientCapabilities"]["fs"]["readTextFile"],
        true
    );
    engine.reply(
        now,
        execution,
        Op::Initialize,
        Ok(RawJson::from_value(
            &json!({"agentCapabilities": {"loadSession": true}}),
        )),
    );
    let Some(Action::Request { op, params, .. }) = engine.poll_action() else {
        panic!("session/new");
    };
    assert_eq!(params.to_value(), new_params);
    let modes = json!({"sessionId": "c1", "modes": {"currentModeId": "ask", "availableModes": []}});
    engine.reply(now, execution, op, Ok(RawJson::from_value(&modes)));
    engine.agent_event(now, execution, update("available_commands_update"));
    let got = events(&mut engine);
    let ready = got
        .iter()
        .find_map(|e| match e {
            SessionEvent::ConversationReady { answer, .. } => answer.clone(),
            _ => None,
        })
        .expect("the conversation is ready, with the agent's answer");
    assert_eq!(ready.parse::<Value>().unwrap(), modes);
    assert!(
        got.iter().any(|e| matches!(e, SessionEvent::Update { .. })),
        "{got:?}"
    );
    assert_eq!(
        load_params(&RawJson::from_value(&new_params), "c1")
            .unwrap()
            .parse::<Value>()
            .unwrap(),
        json!({"sessionId": "c1", "cwd": "/home/u/p", "mcpServers": new_params["mcpServers"]})
    );
    let labels: Vec<_> = engine
        .sessions()
        .map(|(s, setup)| (s, setup.label.clone()))
        .collect();
    assert_eq!(labels, vec![(session(1), Some("pls_1".into()))]);
}

/// Group commit: a write releases every output admitted before it, however many wait in
/// the delivery queue (more than [`READY_EVENTS`] here); moving output out of the queue
/// needs no write of its own, since the state lists it either way. Output admitted while
/// the write is under way waits for the next one. (Before, each write let at most
/// `READY_EVENTS` outputs out, and `palisade-proxy --state` streamed at 0.07× the direct
/// rate.)
#[test]
fn one_write_releases_all_the_output_it_covers() {
    let now = Timestamp::from_millis(1);
    let mut config = EngineConfig {
        persistence: true,
        ..config()
    };
    // Each output its own batch, as palisade-proxy has it.
    config.coalescer.max_delay_ms = 0;
    let mut engine = Engine::new(config).unwrap();
    let execution = ready_session(&mut engine, now);
    engine.prompt(now, session(1), "second".into()).unwrap();
    prompt_request(&mut engine);
    engine.set_caller_room(usize::MAX);
    let mut seqs = Vec::new();
    let settle = |engine: &mut Engine, seqs: &mut Vec<u64>| -> Option<u64> {
        let mut writing = None;
        loop {
            match engine.poll_output(now) {
                Output::Persist => writing = Some(engine.state_image(now).version),
                Output::Event(SessionEvent::Output { events, .. }) => {
                    seqs.extend(events.iter().map(|e| e.seq));
                }
                Output::Event(_) | Output::Action(_) => {}
                Output::Wait { .. } => return writing,
            }
        }
    };
    let first = settle(&mut engine, &mut seqs).expect("the prompt's claim is written");
    engine.persisted(first);
    settle(&mut engine, &mut seqs);
    let covered = 3 * READY_EVENTS as u64;
    for n in 1..=covered {
        engine.agent_event(now, execution, chunk(&format!("chunk {n}")));
    }
    let write = settle(&mut engine, &mut seqs).expect("a write covers them");
    engine.agent_event(now, execution, chunk("late"));
    engine.persisted(write);
    let next = settle(&mut engine, &mut seqs).expect("the late output needs a write");
    assert_eq!(
        seqs,
        (1..=covered).collect::<Vec<_>>(),
        "one write, all of them"
    );
    engine.persisted(next);
    settle(&mut engine, &mut seqs);
    assert_eq!(seqs.last(), Some(&(covered + 1)));
}

/// Issue 28, item 5: a state file whose header disagrees with its core snapshot (written
/// by something else, or a bug; its checksum right) was used as it was: the restart hung
/// or never resumed the turn. Each disagreement is refused on load, and the state as
/// written is used.
#[test]
fn a_state_whose_header_contradicts_its_core_snapshot_is_refused() {
    let now = Timestamp::from_millis(1_000);
    let mut engine = Engine::new(config()).unwrap();
    let turn = engine.prompt(now, session(1), "hello".into()).unwrap();
    let execution = ready_runtime(&mut engine, now, 42);
    engine.agent_event(now, execution, chunk("one"));
    engine.pump_outlets(now);
    let bytes = engine.encode_state(now);
    let decoded = state::decode(&bytes).unwrap();
    let (header, snapshot) = (decoded.header, decoded.core_snapshot);
    assert_eq!(
        header.sessions[0].turn.as_ref().map(|(t, _)| *t),
        Some(turn)
    );
    assert_eq!(header.executions.len(), 1);
    let restore = |header: &Header| {
        Engine::restore(
            config(),
            &state::encode(now.as_millis(), header, snapshot),
            now,
        )
    };
    assert!(restore(&header).is_ok(), "the state as written is used");
    let refused = |header: Header, what: &str| match restore(&header) {
        Err(StateError::Contradiction(said)) => said,
        Err(other) => panic!("{what}: refused for another reason: {other}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    // The turn in flight left out of the header.
    let mut h = header.clone();
    h.sessions[0].turn = None;
    let said = refused(h, "turn left out");
    assert!(said.contains("in flight"), "{said}");
    // Another turn id in the header.
    let mut h = header.clone();
    if let Some((t, _)) = h.sessions[0].turn.as_mut() {
        *t = TurnId::new(turn.get() + 1).unwrap();
    }
    refused(h, "another turn");
    // The session left out altogether.
    let mut h = header.clone();
    h.sessions.clear();
    refused(h, "session left out");
    // The bound execution left out.
    let mut h = header.clone();
    h.executions.clear();
    let said = refused(h, "execution left out");
    assert!(said.contains("not in the header"), "{said}");
    // Its generation another.
    let mut h = header.clone();
    h.executions[0].generation = Generation::new(h.executions[0].generation.get() + 7).unwrap();
    let said = refused(h, "another generation");
    assert!(said.contains("generation"), "{said}");
    // Another session's.
    let mut h = header.clone();
    h.executions[0].session = session(2);
    refused(h, "another session");
}

/// The idle rule is the core's (issue 27): an accepted prompt whose agent says nothing for
/// `turn_idle_ms` gets `session/cancel`, its process is stopped, and the turn goes to
/// recovery; the engine has no timer of its own, and the turn's cause is recorded.
#[test]
fn a_silent_prompt_is_cancelled_stopped_and_recovered_on_the_core_s_word() {
    let now = Timestamp::from_millis(1);
    let mut config = config();
    config.core.turn_idle_ms = 1_000;
    let mut engine = Engine::new(config).unwrap();
    let execution = ready_session(&mut engine, now);
    engine.prompt(now, session(1), "second".into()).unwrap();
    let _op = prompt_request(&mut engine);
    let later = now.plus_millis(400);
    engine.agent_event(later, execution, chunk("working"));
    // Heard from at 401 ms: nothing is given up at 1,001 ms.
    engine.handle_timeout(now.plus_millis(1_000));
    assert!(engine.poll_action().is_none());
    assert_eq!(engine.stats().turns_silent, 0);
    engine.handle_timeout(later.plus_millis(1_000));
    let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Notify { method, .. }, Action::Stop { execution: e, .. }]
                if *method == acp::SESSION_CANCEL && *e == execution
        ),
        "{actions:?}"
    );
    assert_eq!(engine.stats().turns_silent, 1);
    assert_eq!(engine.core().runtime(session(1)), None);
    assert!(engine.core().session_busy(session(1)), "the turn recovers");
    // The recovery step starts a new process.
    engine.reaped(later.plus_millis(1_010), execution, None);
    engine.handle_timeout(later.plus_millis(1_060));
    let (s, _) = spawn_action(&mut engine);
    assert_eq!(s, session(1));
    assert_eq!(engine.stats().audit_violations, 0);
}

/// The client's `initialize` and `authenticate` params outlive a restart: the runtime a
/// restored engine starts before the client is back is initialized with them and
/// authenticated (an agent that authenticates per process refused the restored runtime's
/// `session/load` before; `found/restarted-proxy-authenticates-its-runtimes.json`).
#[test]
fn a_restored_engine_initializes_and_authenticates_as_the_client_did() {
    let now = Timestamp::from_millis(1_000);
    let mut engine = Engine::new(client_config()).unwrap();
    let hello = json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true}}});
    let auth = json!({"methodId": "agent-token"});
    engine.set_client_hello(RawJson::from_value(&hello));
    engine.set_client_auth(RawJson::from_value(&auth));
    engine.prompt(now, session(1), "hello".into()).unwrap();
    let (s, attempt) = spawn_action(&mut engine);
    let bytes = engine.encode_state(now);

    let mut restored = Engine::restore(client_config(), &bytes, now.plus_millis(10)).unwrap();
    // The spawn in flight when the previous incarnation died is asked for again.
    assert_eq!(
        restored.poll_action(),
        Some(Action::Spawn {
            session: s,
            attempt
        })
    );
    let execution = restored.spawned(now.plus_millis(11), s, attempt, Ok(Some(7)));
    let Some(Action::Request {
        op: Op::Initialize,
        params,
        ..
    }) = restored.poll_action()
    else {
        panic!("initialize first");
    };
    assert_eq!(
        params.to_value()["clientCapabilities"],
        hello["clientCapabilities"]
    );
    restored.reply(
        now.plus_millis(12),
        execution,
        Op::Initialize,
        Ok(RawJson::from_value(
            &json!({"agentCapabilities": {"loadSession": true}}),
        )),
    );
    let Some(Action::Request {
        op: Op::Authenticate,
        method,
        params,
        ..
    }) = restored.poll_action()
    else {
        panic!("authenticate after initialize");
    };
    assert_eq!(method, acp::AUTHENTICATE);
    assert_eq!(params.to_value(), auth);
}
