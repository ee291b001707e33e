#![allow(missing_docs)] // criterion_group! generates undocumented items.
//! Throughput of the load-fallback classifier (`cargo bench --bench classify`).
//!
//! `realistic_mix` is one failed `session/load` of each kind the table of real agents'
//! answers lists (`docs/real-agents.md`), plus the rule-6 traps (a substring "not found", a
//! timeout, a dead transport) and two answers that carry a mebibyte of agent stderr.
//! Criterion's `thrpt` line is classifications per second. `mebibyte_messages` isolates
//! the huge answers: they must cost what a short one does, since the classifier compares
//! lengths before bytes and never searches.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use palisade_core::classify::{
    classify, AgentProfile, ErrorAnswer, LoadFailure, LoadOutcome, SessionListing, TransportState,
};

const SESSION: &str = "0199a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a6b";
const MIB: usize = 1 << 20;

fn answer(code: i64, message: &str, details: Option<&str>) -> LoadOutcome {
    LoadOutcome {
        load_capability: Some(true),
        requested_session: SESSION.to_owned(),
        result: LoadFailure::Rpc(ErrorAnswer {
            code,
            message: message.to_owned(),
            data_details: details.map(str::to_owned),
            data_present: details.is_some(),
        }),
        transport: TransportState::Open,
        listing: SessionListing::Unknown,
    }
}

fn with(result: LoadFailure, transport: TransportState) -> LoadOutcome {
    LoadOutcome {
        load_capability: Some(true),
        requested_session: SESSION.to_owned(),
        result,
        transport,
        listing: SessionListing::Unknown,
    }
}

fn huge_answers() -> Vec<(LoadOutcome, AgentProfile)> {
    let stderr = "error: failed to resolve provider config; retrying\n".repeat(MIB / 51);
    vec![
        (
            answer(
                -32603,
                &format!("Resource not found: {SESSION}{stderr}"),
                None,
            ),
            AgentProfile::Generic,
        ),
        (
            answer(-32603, "Internal error", Some(&stderr)),
            AgentProfile::CodexAcpTs,
        ),
    ]
}

fn realistic_mix() -> Vec<(LoadOutcome, AgentProfile)> {
    let mut without_load = answer(-32601, "\"Method not found\": session/load", None);
    without_load.load_capability = None;
    let mut mix = vec![
        (
            answer(-32002, &format!("Resource not found: {SESSION}"), None),
            AgentProfile::ClaudeAgentAcp,
        ),
        (
            answer(-32603, "Internal error", Some("Session not found")),
            AgentProfile::ClaudeCodeAcp,
        ),
        (
            answer(-32002, "Resource not found", None),
            AgentProfile::CodexAcpRust,
        ),
        (
            answer(
                -32603,
                "Internal error",
                Some(&format!("no rollout found for thread id {SESSION}")),
            ),
            AgentProfile::CodexAcpTs,
        ),
        (
            answer(
                -32603,
                "Internal error",
                Some(&format!(
                    "Invalid session identifier \"{SESSION}\".\n  Searched for sessions in \
                     /home/u/.gemini/tmp/abc/chats."
                )),
            ),
            AgentProfile::GeminiCli,
        ),
        (answer(-32602, "Invalid params", None), AgentProfile::Goose),
        (
            answer(-32603, "Internal error", None),
            AgentProfile::Opencode,
        ),
        (without_load, AgentProfile::Generic),
        (
            answer(
                -32603,
                "resource not found while resolving configuration",
                None,
            ),
            AgentProfile::Generic,
        ),
        (
            answer(-32000, "Authentication required", None),
            AgentProfile::Generic,
        ),
        (
            with(LoadFailure::TimedOut, TransportState::Open),
            AgentProfile::Generic,
        ),
        (
            with(LoadFailure::Cancelled, TransportState::Open),
            AgentProfile::Generic,
        ),
        (
            with(LoadFailure::TimedOut, TransportState::ProcessExited),
            AgentProfile::Generic,
        ),
        (
            answer(1001, "Codex process has exited with code 1", None),
            AgentProfile::CodexAcpTs,
        ),
    ];
    mix.extend(huge_answers());
    mix
}

fn run(mix: &[(LoadOutcome, AgentProfile)]) {
    for (outcome, profile) in mix {
        black_box(classify(black_box(outcome), black_box(*profile)));
    }
}

fn bench_classify(c: &mut Criterion) {
    let mut group = c.benchmark_group("classify");
    for (name, mix) in [
        ("realistic_mix", realistic_mix()),
        ("mebibyte_messages", huge_answers()),
    ] {
        group.throughput(Throughput::Elements(mix.len() as u64));
        group.bench_function(name, |b| b.iter(|| run(&mix)));
    }
    group.finish();
}

criterion_group!(benches, bench_classify);
criterion_main!(benches);
