#![allow(missing_docs)] // criterion_group! generates undocumented items.
//! Supervision overhead per notification: what the supervisor adds between an agent's
//! `session/update` (already parsed by the connection) and the caller's event.
//!
//! The measured path is exactly the driver's per-notification work, on the real
//! [`Engine`]: find the runtime and its prompt, number the update, core admission (the
//! `Stream` callback through the fence: attempt, execution, generation, turn, sequence),
//! the core's `Deliver`, the session's bounded delivery queue, the coalescer, and handing
//! the finished batches to the caller. The agent, the pipe and JSON parsing are not in it;
//! a second benchmark adds the JSON-RPC framing of the line for comparison.
//!
//! Run: `CARGO_TARGET_DIR=/work/targets/embed cargo bench -p palisade-engine --bench supervision`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use palisade_core::{SessionId, Timestamp};
use palisade_engine::{Action, Engine, EngineConfig, Op, Output};
use palisade_wire::jsonrpc::{parse_frame, Frame};
use palisade_wire::{acp, AgentEvent};
use serde_json::{json, Value};

const CONVERSATION: &str = "bench-session";

/// The next action, the events before it handed to nobody (`None` once the engine waits).
fn next_action(engine: &mut Engine, now: Timestamp) -> Option<Action> {
    loop {
        match engine.poll_output(now) {
            Output::Action(action) => return Some(action),
            Output::Event(_) | Output::Persist => {}
            Output::Wait { .. } => return None,
        }
    }
}

/// Everything the engine has for the caller now (the shell's loop, minus the I/O).
fn drain(engine: &mut Engine, now: Timestamp) {
    loop {
        match engine.poll_output(now) {
            Output::Event(event) => {
                black_box(event);
            }
            Output::Action(action) => {
                black_box(action);
            }
            Output::Persist => {}
            Output::Wait { .. } => return,
        }
    }
}

/// An engine with one session whose prompt is in flight on a ready runtime.
fn streaming_engine(now: Timestamp) -> (Engine, palisade_core::ExecutionId) {
    let config = EngineConfig {
        cwd: "/tmp".into(),
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(config).expect("default config is valid");
    engine.set_caller_room(usize::MAX);
    let session = SessionId::new(1).expect("1 is not zero");
    engine
        .prompt(now, session, "bench".to_owned())
        .expect("a fresh session takes a prompt");
    let Some(Action::Spawn { session, attempt }) = next_action(&mut engine, now) else {
        panic!("the prompt starts a runtime");
    };
    let execution = engine.spawned(now, session, attempt, Ok(Some(1)));
    let answer = |engine: &mut Engine, expected: &str, result: Value| loop {
        match next_action(engine, now) {
            Some(Action::Request { op, method, .. }) if method == expected => {
                engine.reply(
                    now,
                    execution,
                    op,
                    Ok(palisade_wire::RawJson::from_value(&result)),
                );
                return op;
            }
            Some(_) => {}
            None => panic!("no {expected} request"),
        }
    };
    answer(
        &mut engine,
        acp::INITIALIZE,
        json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": true}}),
    );
    answer(
        &mut engine,
        acp::SESSION_NEW,
        json!({"sessionId": CONVERSATION}),
    );
    loop {
        match next_action(&mut engine, now) {
            Some(Action::Request {
                op: Op::Prompt { .. },
                ..
            }) => break,
            Some(_) => {}
            None => panic!("the prompt was not dispatched"),
        }
    }
    drain(&mut engine, now);
    (engine, execution)
}

fn update_line(i: u64) -> String {
    let params = json!({
        "sessionId": CONVERSATION,
        "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": format!("chunk {i} of a streamed answer")}
        }
    });
    json!({"jsonrpc": "2.0", "method": acp::SESSION_UPDATE, "params": params}).to_string()
}

fn bench(c: &mut Criterion) {
    let now = Timestamp::from_millis(1);
    let line = update_line(7);
    let Ok(Frame::Notification { method, params }) = parse_frame(line.as_bytes()) else {
        panic!("a valid notification");
    };
    let wire_bytes = line.len() + 1;

    let mut group = c.benchmark_group("supervision");
    group.throughput(Throughput::Elements(1));

    let (mut engine, execution) = streaming_engine(now);
    group.bench_function("per_notification", |b| {
        b.iter_batched(
            || AgentEvent::Notification {
                method: method.clone(),
                params: params.clone(),
                wire_bytes,
            },
            |event| {
                engine.agent_event(now, execution, event);
                engine.set_caller_room(usize::MAX);
                drain(&mut engine, now);
            },
            BatchSize::SmallInput,
        );
    });
    let stats = engine.stats();
    assert_eq!(stats.outputs_rejected, 0, "every notification was admitted");
    assert!(stats.outputs_delivered > 0);

    let (mut engine, execution) = streaming_engine(now);
    group.bench_function("per_notification_with_framing", |b| {
        b.iter_batched(
            || line.clone(),
            |line| {
                let Ok(Frame::Notification { method, params }) = parse_frame(line.as_bytes())
                else {
                    unreachable!("the line is a notification");
                };
                engine.agent_event(
                    now,
                    execution,
                    AgentEvent::Notification {
                        method,
                        params,
                        wire_bytes: line.len() + 1,
                    },
                );
                engine.set_caller_room(usize::MAX);
                drain(&mut engine, now);
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
