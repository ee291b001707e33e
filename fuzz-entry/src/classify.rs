//! `classify`: any failed `session/load`, under any agent profile.
//!
//! The classifier must never panic, must be deterministic, and must follow the documented
//! table of rule 6 (`docs/real-agents.md`), which [`reference`] (`palisade-reference`, a
//! crate that cannot see the core) restates independently: transport death first and only
//! from the transport's state; a cancelled load never falls back;
//! capability absent or false, −32601 and −32002 fall back; −32000 and −32800 never do;
//! otherwise only an *exact* projection falls back (never a substring), and a profile only
//! adds projections that its agent documents.
//!
//! Then the same outcome goes through a real core — a session with a conversation whose
//! runtime died, a new attempt that tries to load it — and the core must act on exactly
//! that verdict: `session/new` with the classifier's reason for an incompatible load;
//! otherwise a reported failure and the conversation token kept. This is how the two
//! classifier mutants (which the core carries into `classify`) are seen from outside.

use arbitrary::Unstructured;
use palisade_core::audit::Checker;
use palisade_core::classify::{
    classify, AgentProfile, ClassifyReason, ErrorAnswer, LoadFailure, LoadOutcome, LoadVerdict,
    Projection, SessionListing, TransportState,
};
use palisade_core::driver::{Driver, LeaseCheck, Output};
use palisade_core::mutants::Mutant;
use palisade_core::*;

use crate::bytes::{byte, take, u64le, Writer};
use crate::Finding;

const TARGET: &str = "classify";

/// Raw strings are at most this long (one length byte).
const MAX_RAW_TEXT: usize = 255;

const CODES: [i64; 12] = [
    ErrorAnswer::RESOURCE_NOT_FOUND,
    ErrorAnswer::METHOD_NOT_FOUND,
    ErrorAnswer::INTERNAL_ERROR,
    ErrorAnswer::AUTH_REQUIRED,
    ErrorAnswer::REQUEST_CANCELLED,
    ErrorAnswer::INVALID_PARAMS,
    ErrorAnswer::INVALID_REQUEST,
    1001,
    0,
    -32001,
    -32099,
    i64::MIN,
];

const SESSIONS: [&str; 4] = ["sess-1", "0199a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a6b", "", "s"];

const TEXTS: [&str; 12] = [
    "Resource not found",
    "resource not found while resolving configuration",
    "Internal error",
    "\"Method not found\": session/load",
    "Method not found",
    "Session not found",
    "not found",
    "Query closed before response received",
    "Authentication required",
    "Codex process has exited",
    "NOT FOUND",
    "",
];

const RESOURCE_PREFIX: &str = "Resource not found: ";
const CODEX_PREFIX: &str = "no rollout found for thread id ";
const METHOD_PROJECTION: &str = "\"Method not found\": session/load";

/// How a string field is made. Menu entries and prefix compositions make the exact
/// projections (and their near misses) one byte away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Text {
    /// `TEXTS[i % len]`.
    Menu(u8),
    /// A menu entry followed by raw bytes.
    MenuThen(u8, Vec<u8>),
    /// Raw bytes (lossy UTF-8).
    Raw(Vec<u8>),
    /// `"Resource not found: "` + the requested session.
    ResourcePrefix,
    /// `"no rollout found for thread id "` + the requested session.
    CodexPrefix,
}

impl Text {
    fn decode(u: &mut Unstructured<'_>) -> Text {
        match byte(u) % 5 {
            0 => Text::Menu(byte(u)),
            1 => {
                let i = byte(u);
                let len = usize::from(byte(u)).min(MAX_RAW_TEXT);
                Text::MenuThen(i, take(u, len).to_vec())
            }
            2 => {
                let len = usize::from(byte(u)).min(MAX_RAW_TEXT);
                Text::Raw(take(u, len).to_vec())
            }
            3 => Text::ResourcePrefix,
            _ => Text::CodexPrefix,
        }
    }

    fn encode(&self, w: &mut Writer) {
        match self {
            Text::Menu(i) => {
                w.byte(0).byte(*i);
            }
            Text::MenuThen(i, raw) => {
                w.byte(1).byte(*i).byte(raw.len() as u8).bytes(raw);
            }
            Text::Raw(raw) => {
                w.byte(2).byte(raw.len() as u8).bytes(raw);
            }
            Text::ResourcePrefix => {
                w.byte(3);
            }
            Text::CodexPrefix => {
                w.byte(4);
            }
        }
    }

    fn render(&self, session: &str) -> String {
        let menu = |i: u8| TEXTS[usize::from(i) % TEXTS.len()];
        match self {
            Text::Menu(i) => menu(*i).to_owned(),
            Text::MenuThen(i, raw) => format!("{}{}", menu(*i), String::from_utf8_lossy(raw)),
            Text::Raw(raw) => String::from_utf8_lossy(raw).into_owned(),
            Text::ResourcePrefix => format!("{RESOURCE_PREFIX}{session}"),
            Text::CodexPrefix => format!("{CODEX_PREFIX}{session}"),
        }
    }
}

/// One decoded input: a profile and a load outcome, described so seeds can be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    /// `AgentProfile::ALL[profile % 8]`.
    pub profile: u8,
    /// 1: closed, 2: process exited, else open (modulo 4).
    pub transport: u8,
    /// 0: true, 1: absent, 2: false (modulo 3).
    pub capability: u8,
    /// 0 and 1: an RPC error, 2: timed out, 3: cancelled (modulo 4).
    pub result: u8,
    /// Below 240: `CODES[code % len]`; else the next 8 bytes are the code.
    pub code: u8,
    /// The raw code, when `code >= 240`.
    pub raw_code: i64,
    /// `SESSIONS[i % len]`, or raw text.
    pub session: Text,
    /// The message.
    pub message: Text,
    /// `data.details`, when present.
    pub details: Option<Text>,
    /// Whether `data` was present.
    pub data_present: bool,
    /// The agent's `session/list` about the session: 1 listed, 2 not listed, else unknown
    /// (modulo 3; the last byte, so inputs written before it decode as before).
    pub listing: u8,
}

impl Case {
    /// Decodes an input.
    pub fn decode(data: &[u8]) -> Case {
        let mut u = Unstructured::new(data);
        let profile = byte(&mut u);
        let transport = byte(&mut u);
        let capability = byte(&mut u);
        let result = byte(&mut u);
        let code = byte(&mut u);
        let raw_code = if code >= 240 { u64le(&mut u) as i64 } else { 0 };
        let session = Text::decode(&mut u);
        let message = Text::decode(&mut u);
        let details = (byte(&mut u) % 2 == 1).then(|| Text::decode(&mut u));
        let data_present = byte(&mut u) % 2 == 1;
        let listing = byte(&mut u);
        Case {
            profile,
            transport,
            capability,
            result,
            code,
            raw_code,
            session,
            message,
            details,
            data_present,
            listing,
        }
    }

    /// Writes the input that decodes to this case.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.byte(self.profile)
            .byte(self.transport)
            .byte(self.capability)
            .byte(self.result)
            .byte(self.code);
        if self.code >= 240 {
            w.u64le(self.raw_code as u64);
        }
        self.session.encode(&mut w);
        self.message.encode(&mut w);
        match &self.details {
            Some(d) => {
                w.byte(1);
                d.encode(&mut w);
            }
            None => {
                w.byte(0);
            }
        }
        w.byte(u8::from(self.data_present));
        if self.listing != 0 {
            w.byte(self.listing);
        }
        w.into_bytes()
    }

    /// The agent profile.
    pub fn agent_profile(&self) -> AgentProfile {
        AgentProfile::ALL[usize::from(self.profile) % AgentProfile::ALL.len()]
    }

    /// The load outcome.
    pub fn outcome(&self) -> LoadOutcome {
        let session = match &self.session {
            Text::Menu(i) => SESSIONS[usize::from(*i) % SESSIONS.len()].to_owned(),
            other => other.render(""),
        };
        let result = match self.result % 4 {
            2 => LoadFailure::TimedOut,
            3 => LoadFailure::Cancelled,
            _ => LoadFailure::Rpc(ErrorAnswer {
                code: if self.code >= 240 {
                    self.raw_code
                } else {
                    CODES[usize::from(self.code) % CODES.len()]
                },
                message: self.message.render(&session),
                data_details: self.details.as_ref().map(|d| d.render(&session)),
                data_present: self.data_present || self.details.is_some(),
            }),
        };
        LoadOutcome {
            load_capability: match self.capability % 3 {
                1 => None,
                2 => Some(false),
                _ => Some(true),
            },
            requested_session: session,
            result,
            transport: match self.transport % 4 {
                1 => TransportState::Closed,
                2 => TransportState::ProcessExited,
                _ => TransportState::Open,
            },
            listing: match self.listing % 3 {
                1 => SessionListing::Listed,
                2 => SessionListing::NotListed,
                _ => SessionListing::Unknown,
            },
        }
    }
}

/// Rule 6 as the independent reference states it (`palisade-reference`, which does not
/// depend on `palisade-core`), as a verdict of the core's type.
pub fn reference(o: &LoadOutcome, profile: AgentProfile) -> LoadVerdict {
    use palisade_reference::rule6 as r6;
    let agent = match profile {
        AgentProfile::Generic => r6::Agent::Generic,
        AgentProfile::ClaudeAgentAcp => r6::Agent::ClaudeAgentAcp,
        AgentProfile::ClaudeCodeAcp => r6::Agent::ClaudeCodeAcp,
        AgentProfile::CodexAcpRust => r6::Agent::CodexAcpRust,
        AgentProfile::CodexAcpTs => r6::Agent::CodexAcpTs,
        AgentProfile::GeminiCli => r6::Agent::GeminiCli,
        AgentProfile::Goose => r6::Agent::Goose,
        AgentProfile::Opencode => r6::Agent::Opencode,
    };
    let answer = match &o.result {
        LoadFailure::Rpc(e) => r6::Answer::Error {
            code: e.code,
            message: &e.message,
            details: e.data_details.as_deref(),
        },
        LoadFailure::TimedOut => r6::Answer::NoAnswer,
        LoadFailure::Cancelled => r6::Answer::Cancelled,
    };
    let load = r6::FailedLoad {
        agent,
        capability: match o.load_capability {
            Some(true) => r6::Capability::True,
            Some(false) => r6::Capability::False,
            None => r6::Capability::Absent,
        },
        requested: &o.requested_session,
        answer,
        listing: match o.listing {
            SessionListing::Unknown => r6::Listing::Unknown,
            SessionListing::Listed => r6::Listing::Listed,
            SessionListing::NotListed => r6::Listing::NotListed,
        },
        transport: match o.transport {
            TransportState::Open => r6::Transport::Open,
            TransportState::Closed => r6::Transport::Closed,
            TransportState::ProcessExited => r6::Transport::ProcessExited,
        },
    };
    match r6::judge(&load) {
        r6::Judgement::Replace => LoadVerdict::Incompatible,
        r6::Judgement::Keep => LoadVerdict::Inconclusive,
        r6::Judgement::Respawn => LoadVerdict::TransportDead,
    }
}

fn finding(rule: &str, detail: String) -> Finding {
    Finding::new(TARGET, rule, detail)
}

/// The pure checks on the classifier.
fn check_table(o: &LoadOutcome, profile: AgentProfile) -> Result<(), Finding> {
    let c = classify(o, profile);
    if classify(o, profile) != c {
        return Err(finding("classify-deterministic", format!("{o:?}")));
    }
    if c.verdict != c.reason.verdict() {
        return Err(finding(
            "classify-reason",
            format!("{c:?} pairs a reason with another verdict, for {o:?}"),
        ));
    }
    let dead = o.transport != TransportState::Open;
    if (c.verdict == LoadVerdict::TransportDead) != dead {
        return Err(finding(
            "R6-transport-state",
            format!(
                "{c:?} with transport {:?}: TransportDead iff not Open",
                o.transport
            ),
        ));
    }
    let expected = reference(o, profile);
    if c.verdict != expected {
        return Err(finding(
            "R6-table",
            format!("{profile:?}: {c:?}, the table says {expected:?}, for {o:?}"),
        ));
    }
    // Profiles only add proof: whatever Generic replaces, every profile replaces.
    let generic = classify(o, AgentProfile::Generic);
    if generic.verdict == LoadVerdict::Incompatible && c.verdict != LoadVerdict::Incompatible {
        return Err(finding(
            "R6-profiles-add",
            format!("{profile:?}: {c:?} but Generic says {generic:?}, for {o:?}"),
        ));
    }
    if c.verdict == LoadVerdict::Incompatible && generic.verdict != LoadVerdict::Incompatible {
        let profile_projection = matches!(
            (profile, c.reason),
            (
                AgentProfile::ClaudeAgentAcp | AgentProfile::ClaudeCodeAcp,
                ClassifyReason::ExactProjection(Projection::ClaudeSessionNotFound)
            ) | (
                AgentProfile::CodexAcpTs,
                ClassifyReason::ExactProjection(Projection::CodexNoRolloutForSession)
            )
        );
        if !profile_projection {
            return Err(finding(
                "R6-profiles-add",
                format!("{profile:?} falls back with {c:?}, which is not its own projection"),
            ));
        }
    }
    // The rows the reviews were about, spelled out for the Generic profile: with the
    // transport open, a cancelled load, a timed-out load, −32000, −32800, and −32603
    // without an exact projection never replace the conversation.
    if !dead && generic.verdict == LoadVerdict::Incompatible {
        let proves_nothing = match &o.result {
            LoadFailure::Cancelled => true,
            LoadFailure::TimedOut => o.load_capability == Some(true),
            LoadFailure::Rpc(e) => {
                o.load_capability == Some(true)
                    && (e.code == ErrorAnswer::AUTH_REQUIRED
                        || e.code == ErrorAnswer::REQUEST_CANCELLED
                        || (e.code == ErrorAnswer::INTERNAL_ERROR
                            && !reference_projection(o, &e.message)))
            }
        };
        if proves_nothing {
            return Err(finding(
                "R6-inconclusive",
                format!("Generic replaces the conversation on {o:?}, which proves nothing"),
            ));
        }
    }
    Ok(())
}

/// Whether the message is one of the profile-independent exact projections.
fn reference_projection(o: &LoadOutcome, message: &str) -> bool {
    let s = o.requested_session.as_str();
    message == METHOD_PROJECTION || (!s.is_empty() && message == format!("{RESOURCE_PREFIX}{s}"))
}

/// Drives a core to a `session/load` that fails with `o`, and checks what it does.
fn through_core(
    o: &LoadOutcome,
    profile: AgentProfile,
    mutant: Option<Mutant>,
) -> Result<(), Finding> {
    let config = Config {
        agent_profile: profile,
        ..Config::default()
    };
    // The auditor judges fallbacks by the Generic table.
    let checker = (profile == AgentProfile::Generic).then(|| Checker::new(&config));
    let mut core = Core::new(config, Epoch::FIRST).expect("the default config is valid");
    core.set_mutant(mutant);
    let mut core = Driver::with_observer(core, checker).lease_check(LeaseCheck::ByCaller);
    let now = Timestamp::ZERO;
    let s = SessionId::new(1).expect("non-zero");
    let (e1, e2) = (
        ExecutionId::new(1).expect("non-zero"),
        ExecutionId::new(2).expect("non-zero"),
    );
    let token = ConversationToken::new(7).expect("non-zero");
    let step = |core: &mut Driver<Option<Checker>>,
                input: Input|
     -> Result<(Verdict, Vec<Effect>), Finding> {
        let v = core.handle(now, input);
        let mut effects = Vec::new();
        while let Output::Effect(e) = core.poll_output(now) {
            effects.push(e);
        }
        core.core()
            .check_invariants()
            .map_err(|e| finding(&format!("invariant {}", e.rule), e.detail))?;
        if let Some(found) = core.observer_mut().as_mut().and_then(Checker::take_found) {
            return Err(finding(found.violation.rule, found.violation.detail));
        }
        Ok((v, effects))
    };
    let setup = |what: &str, got: &dyn std::fmt::Debug| {
        finding(
            "classify-core-setup",
            format!("the happy path to a load broke at {what}: {got:?}"),
        )
    };
    let lease_of = |effects: &[Effect]| {
        effects.iter().find_map(|e| match e {
            Effect::LoadConversation { lease, token, .. } => Some((*lease, Some(*token))),
            Effect::NewConversation { lease, .. } => Some((*lease, None)),
            _ => None,
        })
    };
    let cb = |attempt, execution, generation, event| {
        Input::Callback(Callback {
            session: s,
            execution,
            attempt: Some(attempt),
            generation,
            event,
        })
    };

    // A first runtime creates the conversation.
    let (v, _) = step(&mut core, Input::Resume { session: s })?;
    let Verdict::Started { attempt: a1 } = v else {
        return Err(setup("resume", &v));
    };
    let (v, _) = step(
        &mut core,
        Input::Bound {
            session: s,
            attempt: a1,
            execution: e1,
        },
    )?;
    let Verdict::Bound { generation: g1 } = v else {
        return Err(setup("bind", &v));
    };
    let ready = RuntimeEvent::AgentReady {
        load_capability: Some(true),
    };
    let (_, effects) = step(&mut core, cb(a1, e1, g1, ready.clone()))?;
    let Some((lease, None)) = lease_of(&effects) else {
        return Err(setup("session/new", &effects));
    };
    step(&mut core, Input::Perform { lease })?;
    step(
        &mut core,
        cb(a1, e1, g1, RuntimeEvent::ConversationCreated { token }),
    )?;
    // Its runtime dies; a new attempt must load the conversation.
    let stamp = ErrorStamp::new(3).expect("non-zero");
    step(&mut core, cb(a1, e1, g1, RuntimeEvent::Exited { stamp }))?;
    let (v, _) = step(&mut core, Input::Resume { session: s })?;
    let Verdict::Started { attempt: a2 } = v else {
        return Err(setup("second resume", &v));
    };
    let (v, _) = step(
        &mut core,
        Input::Bound {
            session: s,
            attempt: a2,
            execution: e2,
        },
    )?;
    let Verdict::Bound { generation: g2 } = v else {
        return Err(setup("second bind", &v));
    };
    let (_, effects) = step(&mut core, cb(a2, e2, g2, ready))?;
    let Some((lease, Some(loaded))) = lease_of(&effects) else {
        return Err(setup("session/load", &effects));
    };
    if loaded != token {
        return Err(setup("the token to load", &loaded));
    }
    step(&mut core, Input::Perform { lease })?;
    let (v, effects) = step(
        &mut core,
        cb(a2, e2, g2, RuntimeEvent::LoadFailed(o.clone())),
    )?;
    if v != Verdict::Accepted {
        return Err(setup("load failure", &v));
    }

    let c = classify(o, profile);
    let fallback = effects.iter().find_map(|e| match e {
        Effect::NewConversation {
            reason: NewConversationReason::Fallback(r),
            ..
        } => Some(*r),
        _ => None,
    });
    let failed = effects.iter().any(|e| {
        matches!(e, Effect::AttemptSettled { attempt, outcome: AttemptOutcome::Failed, .. } if *attempt == a2)
    });
    match c.verdict {
        LoadVerdict::Incompatible => {
            if fallback != Some(c.reason) || failed {
                return Err(finding(
                    "R6-core-acts",
                    format!("{profile:?} classifies {o:?} as {c:?}, the core did {effects:?}"),
                ));
            }
        }
        LoadVerdict::Inconclusive | LoadVerdict::TransportDead => {
            if let Some(r) = fallback {
                return Err(finding(
                    "R6-fallback-proof",
                    format!("session/new ({r:?}) after {o:?}, which the classifier calls {c:?} under {profile:?}"),
                ));
            }
            if !failed || core.core().conversation(s) != Some(token) {
                return Err(finding(
                    "R6-keep-token",
                    format!(
                        "after an inconclusive load the attempt must fail and keep the token; effects {effects:?}, token {:?}",
                        core.core().conversation(s)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The `classify` entry point.
pub fn run(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    let case = Case::decode(data);
    let outcome = case.outcome();
    let profile = case.agent_profile();
    if crate::trace_enabled() {
        eprintln!(
            "classify {profile:?} {outcome:?} -> {:?}",
            classify(&outcome, profile)
        );
    }
    check_table(&outcome, profile)?;
    through_core(&outcome, profile, mutant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_round_trip_through_their_encoding() {
        let case = Case {
            profile: 4,
            transport: 0,
            capability: 0,
            result: 0,
            code: 250,
            raw_code: -32603,
            session: Text::Raw(b"thread-9".to_vec()),
            message: Text::CodexPrefix,
            details: Some(Text::MenuThen(5, b"!".to_vec())),
            data_present: true,
            listing: 1,
        };
        assert_eq!(Case::decode(&case.encode()), case);
    }

    #[test]
    fn the_reference_agrees_with_the_documented_examples() {
        let o = |code, message: &str| LoadOutcome {
            load_capability: Some(true),
            requested_session: "sess-1".into(),
            result: LoadFailure::Rpc(ErrorAnswer::new(code, message)),
            transport: TransportState::Open,
            listing: SessionListing::Unknown,
        };
        let g = AgentProfile::Generic;
        assert_eq!(
            reference(
                &o(-32603, "resource not found while resolving configuration"),
                g
            ),
            LoadVerdict::Inconclusive
        );
        assert_eq!(
            reference(&o(-32603, "Resource not found: sess-1"), g),
            LoadVerdict::Incompatible
        );
        assert_eq!(reference(&o(-32002, "x"), g), LoadVerdict::Incompatible);
        assert_eq!(
            reference(&o(-32000, "Resource not found: sess-1"), g),
            LoadVerdict::Inconclusive
        );
    }
}
