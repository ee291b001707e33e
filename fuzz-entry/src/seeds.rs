//! The checked-in seed corpus, built from the races the reviews found.
//!
//! Each seed is a meaningful sequence (the kandev cancel during a delayed load, tombstone
//! churn, recovery to exhaustion, the 1,100-notification burst, …) written in the
//! harnesses' own input format, so the fuzzer starts from inputs that reach deep states.
//! A seed lists the mutants it exposes; `cargo test` checks that the real core passes
//! every seed and that each listed mutant fails it, so the seed corpus alone (without
//! nightly) catches every mutant.
//!
//! `cargo run -p palisade-fuzz-entry --example make-seeds` writes them to
//! `fuzz/corpus/<target>/seed-<name>`; a test fails when the files on disk are stale.

use palisade_core::mutants::Mutant;

use crate::classify::{Case, Text};
use crate::delivery;
use crate::orderings::{self, APick, Adv, Ev, GPick, Header, How, Op};
use crate::snapshot;
use crate::Target;

/// One seed input.
#[derive(Clone, Debug)]
pub struct Seed {
    /// The target it feeds.
    pub target: Target,
    /// Its name; the file is `seed-<name>`.
    pub name: &'static str,
    /// The input.
    pub bytes: Vec<u8>,
    /// Mutants that make this seed fail.
    pub catches: &'static [Mutant],
}

impl Seed {
    /// The corpus file name.
    pub fn file_name(&self) -> String {
        format!("seed-{}", self.name)
    }
}

/// Session bytes (session 1, 2).
const S1: u8 = 0;
const S2: u8 = 1;

fn r(how: How) -> Op {
    Op::React {
        s: S1,
        how,
        pick: 0,
        d1: 0,
        d2: 0,
    }
}

fn rd(how: How, pick: u8, d1: u8, d2: u8) -> Op {
    Op::React {
        s: S1,
        how,
        pick,
        d1,
        d2,
    }
}

/// Start, boot, create a conversation, dispatch and accept: a prompt running on
/// execution 1 (the first `Prompt` must precede).
fn to_running() -> Vec<Op> {
    vec![r(How::Good), r(How::Good), r(How::Good), r(How::Good)]
}

/// A session whose conversation exists and whose runtime died: the next attempt loads.
fn to_load() -> Vec<Op> {
    vec![
        Op::Resume(S1),
        r(How::Good),
        r(How::Good),
        r(How::Good),
        Op::Forge {
            s: S1,
            exec: 0,
            attempt: APick::Newest,
            generation: GPick::Current,
            event: Ev::Exited(0),
        },
        Op::Resume(S1),
        // Execution 2 for the replacement.
        rd(How::Good, 0, 1, 0),
        r(How::Good),
    ]
}

fn orderings_seed(
    name: &'static str,
    header: Header,
    ops: Vec<Op>,
    catches: &'static [Mutant],
) -> Seed {
    Seed {
        target: Target::CallbackOrderings,
        name,
        bytes: orderings::encode(header, &ops),
        catches,
    }
}

fn cat(parts: &[Vec<Op>]) -> Vec<Op> {
    parts.concat()
}

fn orderings_seeds() -> Vec<Seed> {
    let d = Header::default();
    let one = Header {
        schedule: Header::SCHEDULE_ONE,
        ..d
    };
    vec![
        // A cancelled attempt's late bind claims the execution, then its successor binds the
        // same execution ID: the core rebinds it under a newer generation (rule 4's
        // history). The production embedding never does (its execution IDs are fresh per
        // process): `reports/reach.md` lists `Execution::rebind` as reached by the fuzzer
        // only, and this seed is what reaches it in the checked-in corpus.
        orderings_seed(
            "late-bind-then-successor-rebinds",
            d,
            vec![
                Op::Prompt(S1),
                Op::Cancel(S1),
                Op::Resume(S1),
                r(How::Good),
                r(How::Good),
            ],
            &[],
        ),
        orderings_seed(
            "happy-path",
            d,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![rd(How::Stream, 0, 4, 1), r(How::Good)],
            ]),
            &[],
        ),
        // kandev #3636 e2e: load delayed, cancel, retry; the late answer must not act.
        orderings_seed(
            "kandev-cancel-during-delayed-load",
            d,
            vec![
                Op::Prompt(S1),
                r(How::Good),
                r(How::Good),
                r(How::Hold),
                Op::Cancel(S1),
                Op::Prompt(S1),
                // The cancelled attempt's held answer arrives first.
                rd(How::Good, 0, 0, 0),
                // The retry gets execution 2 (1 is being torn down).
                rd(How::Good, 0, 1, 0),
                r(How::Good),
                r(How::Good),
                r(How::Good),
                r(How::Good),
                Op::StopAll,
            ],
            &[Mutant::StaleCallbackDispatches],
        ),
        orderings_seed(
            "tombstone-churn-late-callback",
            d,
            vec![
                Op::Resume(S1),
                r(How::Good),
                Op::Cancel(S1),
                // 17 more attempts: the first one's tombstone is evicted.
                Op::Churn(S1, 16),
                Op::Forge {
                    s: S1,
                    exec: 0,
                    attempt: APick::Nth(0),
                    generation: GPick::Current,
                    event: Ev::AgentReady(0),
                },
                rd(How::Good, 0, 0, 0),
                Op::Forge {
                    s: S1,
                    exec: 0,
                    attempt: APick::Nth(0),
                    generation: GPick::Current,
                    event: Ev::Exited(0),
                },
                Op::StopAll,
            ],
            &[Mutant::TombstoneEvictionReopens],
        ),
        orderings_seed(
            "replacement-reuses-execution-then-late-lease",
            d,
            vec![
                Op::Resume(S1),
                r(How::Good),
                r(How::Good),
                Op::Cancel(S1),
                Op::StopAll,
                Op::Resume(S1),
                // The replacement binds execution 1 again…
                rd(How::Good, 1, 0, 0),
                // …then the old attempt's load lease is performed.
                Op::Perform(0),
            ],
            &[Mutant::ToctouGeneration],
        ),
        orderings_seed(
            "recovery-exhausts",
            one,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![
                    rd(How::Stream, 0, 2, 1),
                    r(How::Exit),
                    Op::Advance(Adv::NextTimer),
                    rd(How::Good, 0, 1, 0),
                    r(How::Good),
                    r(How::Good),
                    r(How::Good),
                    rd(How::Stream, 0, 1, 1),
                    r(How::Exit),
                    Op::Advance(Adv::Far),
                ],
            ]),
            &[Mutant::ReplayRepeatsDelivered],
        ),
        // The schedule's last replacement exits before it is ready: exhaustion is recorded
        // once, not by both the replacement's failure and the turn's recovery.
        orderings_seed(
            "recovery-last-replacement-fails",
            one,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![
                    rd(How::Stream, 0, 2, 1),
                    r(How::Exit),
                    Op::Advance(Adv::NextTimer),
                    rd(How::Good, 0, 1, 0),
                    r(How::Exit),
                    Op::Advance(Adv::Far),
                ],
            ]),
            &[Mutant::ExhaustedTwice],
        ),
        // Two recoveries that both re-prompt: the second wraps the original request once.
        orderings_seed(
            "recovery-re-prompts-twice",
            d,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![
                    rd(How::Stream, 0, 2, 1),
                    r(How::Exit),
                    Op::Advance(Adv::NextTimer),
                    rd(How::Good, 0, 1, 0),
                    r(How::Good),
                    r(How::Good),
                    r(How::Good),
                    rd(How::Stream, 0, 1, 1),
                    r(How::Exit),
                    Op::Advance(Adv::NextTimer),
                    rd(How::Good, 0, 2, 0),
                    r(How::Good),
                    r(How::Good),
                    r(How::Good),
                    rd(How::Stream, 0, 1, 1),
                    r(How::Good),
                ],
            ]),
            &[
                Mutant::DoubleReplayBlock,
                Mutant::ReplayRepeatsDelivered,
                Mutant::ReplayGenerationStale,
            ],
        ),
        // An accepted turn whose agent then goes silent: the idle rule cancels the prompt,
        // stops the runtime and recovers the turn (nobody rescues it in the liveness phase).
        orderings_seed(
            "silent-agent-is-given-up",
            Header {
                deadlines: Header::IDLE,
                ..d
            },
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                // Two events, then the agent's every later word is lost.
                vec![
                    rd(How::Stream, 0, 1, 1),
                    r(How::Drop),
                    Op::Advance(Adv::Far),
                ],
            ]),
            &[Mutant::IdleDeadlineIgnored],
        ),
        // A second prompt while the first still waits for its runtime is refused.
        orderings_seed(
            "prompt-while-waiting-for-runtime",
            d,
            vec![Op::Prompt(S1), r(How::Good), Op::Prompt(S1)],
            &[Mutant::PromptClaimedTwice],
        ),
        orderings_seed(
            "recovery-default-schedule",
            d,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![
                    r(How::Exit),
                    Op::Advance(Adv::NextTimer),
                    rd(How::Good, 0, 1, 0),
                    r(How::Exit),
                    Op::Advance(Adv::NextTimer),
                    rd(How::Good, 0, 2, 0),
                    r(How::Good),
                    r(How::Good),
                    r(How::Good),
                    r(How::Good),
                ],
            ]),
            &[],
        ),
        orderings_seed(
            "no-recovery-schedule",
            Header {
                schedule: Header::SCHEDULE_NONE,
                ..d
            },
            cat(&[vec![Op::Prompt(S1)], to_running(), vec![r(How::Exit)]]),
            &[],
        ),
        orderings_seed(
            "eight-step-recovery",
            Header {
                schedule: Header::SCHEDULE_EIGHT,
                ..d
            },
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![
                    r(How::Exit),
                    Op::Advance(Adv::NextTimer),
                    rd(How::Exit, 0, 1, 0),
                    Op::Advance(Adv::NextTimer),
                    rd(How::Good, 0, 2, 0),
                    r(How::Fail),
                    Op::Advance(Adv::Tenths(30)),
                ],
            ]),
            &[],
        ),
        orderings_seed(
            "burst-1100-notifications",
            d,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![rd(How::Stream, 0, u8::MAX, 4), r(How::Good)],
            ]),
            &[],
        ),
        orderings_seed(
            "stream-duplicates-and-gaps",
            d,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![
                    rd(How::Stream, 0, 3, 1),
                    rd(How::Duplicate, 0, 0, 1),
                    rd(How::Duplicate, 0, 1, 1),
                    Op::Replay(0),
                    rd(How::Stream, 0, 0, 1),
                    r(How::Good),
                ],
            ]),
            &[],
        ),
        orderings_seed(
            "historical-error-then-new-failure",
            d,
            vec![
                Op::Resume(S1),
                r(How::Good),
                rd(How::Fail, 0, 0, 5),
                Op::StopAll,
                Op::Resume(S1),
                rd(How::Good, 0, 1, 0),
                rd(How::Fail, 0, 0, 5),
                Op::Dismiss(S1),
            ],
            &[
                Mutant::HistoricalErrorSuppresses,
                Mutant::FailureKeepsOldAttempt,
            ],
        ),
        orderings_seed(
            "early-exit-rolls-back-claim",
            d,
            vec![Op::Prompt(S1), r(How::Good), r(How::Exit), Op::Prompt(S1)],
            &[Mutant::ClaimNotRolledBack],
        ),
        orderings_seed(
            "late-bind-of-cancelled-attempt",
            d,
            vec![
                Op::Resume(S1),
                Op::Cancel(S1),
                Op::Resume(S1),
                // The successor binds execution 1, then the cancelled attempt's late bind
                // reports the same execution.
                rd(How::Good, 1, 0, 0),
                rd(How::Good, 0, 0, 0),
            ],
            &[Mutant::OldAttemptStopsSuccessor],
        ),
        orderings_seed(
            "cancel-bound-attempt-teardown",
            d,
            vec![
                Op::Resume(S1),
                r(How::Good),
                Op::Cancel(S1),
                Op::Advance(Adv::Far),
                Op::StopAll,
            ],
            &[Mutant::CleanupWithoutDeadline],
        ),
        orderings_seed(
            "cancel-after-accept",
            d,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![
                    rd(How::Stream, 0, 1, 1),
                    Op::Cancel(S1),
                    Op::Cancel(S1),
                    rd(How::Good, 1, 0, 0),
                ],
            ]),
            &[Mutant::CancelAfterAcceptTearsDown],
        ),
        orderings_seed(
            "join-hung-attempt",
            d,
            vec![
                Op::Resume(S1),
                Op::Resume(S1),
                Op::Advance(Adv::Tenths(200)),
                Op::Resume(S1),
                Op::Advance(Adv::Far),
            ],
            &[Mutant::UnboundedJoinWait],
        ),
        orderings_seed(
            "load-internal-error-substring",
            d,
            // −32603 "resource not found while resolving configuration".
            cat(&[to_load(), vec![rd(How::Fail, 0, 0, 2 * 16 + 3)]]),
            &[Mutant::SubstringFallback],
        ),
        orderings_seed(
            "load-timeout-keeps-token",
            d,
            cat(&[to_load(), vec![rd(How::Fail, 0, 0, 0)]]),
            &[Mutant::TimeoutFallback],
        ),
        // After a load timeout the next resume loads the same conversation again.
        orderings_seed(
            "load-timeout-then-resume-loads-again",
            d,
            cat(&[
                to_load(),
                vec![
                    rd(How::Fail, 0, 0, 0),
                    Op::Resume(S1),
                    rd(How::Good, 0, 2, 0),
                    r(How::Good),
                    r(How::Good),
                ],
            ]),
            &[Mutant::InconclusiveLoadDropsToken],
        ),
        orderings_seed(
            "load-unknown-session-falls-back",
            d,
            // −32002 "Resource not found: s".
            cat(&[to_load(), vec![rd(How::Fail, 0, 0, 2), r(How::Good)]]),
            &[],
        ),
        orderings_seed(
            "restart-with-attempts-in-flight",
            d,
            vec![
                Op::Prompt(S1),
                r(How::Good),
                r(How::Good),
                Op::Resume(S2),
                Op::React {
                    s: S2,
                    how: How::Good,
                    pick: 0,
                    d1: 2,
                    d2: 0,
                },
                Op::Restart,
                r(How::Good),
                Op::Forge {
                    s: S1,
                    exec: 0,
                    attempt: APick::Raw(200),
                    generation: GPick::Current,
                    event: Ev::Boot,
                },
                Op::Resume(S1),
                Op::Prompt(S2),
                Op::Restart,
                Op::Advance(Adv::Far),
            ],
            &[],
        ),
        orderings_seed(
            "attempt-ids-after-restart",
            d,
            vec![
                Op::Resume(S1),
                r(How::Good),
                Op::Cancel(S1),
                Op::Restart,
                // The new incarnation's first attempt must not take the old one's ID: the
                // cancelled attempt's late callbacks would pass for its.
                Op::Resume(S1),
                r(How::Good),
                r(How::Good),
            ],
            &[Mutant::RestoreReusesAttemptIds],
        ),
        orderings_seed(
            "forged-fence-attacks",
            d,
            cat(&[
                vec![Op::Prompt(S1)],
                to_running(),
                vec![
                    Op::Forge {
                        s: S1,
                        exec: 0,
                        attempt: APick::Unminted,
                        generation: GPick::Current,
                        event: Ev::Completed(0),
                    },
                    Op::Forge {
                        s: S1,
                        exec: 0,
                        attempt: APick::Missing,
                        generation: GPick::Current,
                        event: Ev::Exited(0),
                    },
                    Op::Forge {
                        s: S1,
                        exec: 0,
                        attempt: APick::Newest,
                        generation: GPick::Older(0),
                        event: Ev::Stream(0, 1),
                    },
                    Op::Forge {
                        s: S1,
                        exec: 0,
                        attempt: APick::Newest,
                        generation: GPick::Future(1),
                        event: Ev::Failed(0, 0),
                    },
                    Op::Forge {
                        s: S2,
                        exec: 0,
                        attempt: APick::OfExecution,
                        generation: GPick::Current,
                        event: Ev::Accepted(0),
                    },
                    Op::Bind {
                        s: S2,
                        attempt: APick::Nth(0),
                        exec: 0,
                    },
                    Op::ClockBack(200),
                    Op::Forge {
                        s: S1,
                        exec: 0,
                        attempt: APick::Newest,
                        generation: GPick::Current,
                        event: Ev::Stream(0, 1),
                    },
                    r(How::Good),
                ],
            ]),
            &[],
        ),
        orderings_seed(
            "cancel-storm",
            d,
            vec![
                Op::Prompt(S1),
                Op::Prompt(S2),
                Op::Cancel(S1),
                Op::Resume(S1),
                r(How::Good),
                Op::Cancel(S1),
                Op::Churn(S2, 5),
                Op::Prompt(S1),
                rd(How::Good, 2, 1, 0),
                Op::Cancel(S1),
                Op::Prompt(S1),
                Op::Cancel(S1),
                Op::Advance(Adv::Tenths(50)),
                Op::StopAll,
                Op::Cancel(S2),
            ],
            &[],
        ),
        orderings_seed(
            "short-deadlines-lease-expiry",
            Header {
                deadlines: 1,
                sessions: 2,
                ..d
            },
            vec![
                Op::Prompt(S1),
                r(How::Good),
                r(How::Good),
                Op::Advance(Adv::Ms(60)),
                r(How::Good),
                Op::Prompt(S2),
                Op::Prompt(2),
                Op::Advance(Adv::NextTimer),
                Op::Advance(Adv::NextTimer),
            ],
            &[],
        ),
    ]
}

fn classify_seed(name: &'static str, case: Case, catches: &'static [Mutant]) -> Seed {
    Seed {
        target: Target::Classify,
        name,
        bytes: case.encode(),
        catches,
    }
}

/// An RPC error under the Generic profile, transport open, capability true, session
/// `"sess-1"`.
fn rpc(code: u8, message: Text) -> Case {
    Case {
        profile: 0,
        transport: 0,
        capability: 0,
        result: 0,
        code,
        raw_code: 0,
        session: Text::Menu(0),
        message,
        details: None,
        data_present: false,
        listing: 0,
    }
}

fn classify_seeds() -> Vec<Seed> {
    // Indexes into the classify target's code table.
    const RESOURCE_NOT_FOUND: u8 = 0;
    const INTERNAL_ERROR: u8 = 2;
    const AUTH_REQUIRED: u8 = 3;
    const CODEX_EXITED: u8 = 7;
    vec![
        classify_seed(
            "resource-not-found-for-session",
            Case {
                data_present: true,
                ..rpc(RESOURCE_NOT_FOUND, Text::ResourcePrefix)
            },
            &[],
        ),
        classify_seed(
            // claude-agent-acp 0.23 after its Claude subprocess closed early: "not found"
            // for a session its own session/list has.
            "resource-not-found-for-a-listed-session",
            Case {
                profile: 1,
                data_present: true,
                listing: 1,
                ..rpc(RESOURCE_NOT_FOUND, Text::ResourcePrefix)
            },
            &[Mutant::ListedConversationReplaced],
        ),
        classify_seed(
            "internal-error-with-not-found-substring",
            rpc(INTERNAL_ERROR, Text::Menu(1)),
            &[Mutant::SubstringFallback],
        ),
        classify_seed(
            "load-timed-out",
            Case {
                result: 2,
                ..rpc(0, Text::Menu(2))
            },
            &[Mutant::TimeoutFallback],
        ),
        classify_seed(
            "claude-session-not-found-details",
            Case {
                profile: 1,
                details: Some(Text::Menu(5)),
                ..rpc(INTERNAL_ERROR, Text::Menu(2))
            },
            &[],
        ),
        classify_seed(
            "claude-details-under-generic",
            Case {
                details: Some(Text::Menu(5)),
                ..rpc(INTERNAL_ERROR, Text::Menu(2))
            },
            &[],
        ),
        classify_seed(
            "codex-no-rollout-for-thread",
            Case {
                profile: 4,
                ..rpc(INTERNAL_ERROR, Text::CodexPrefix)
            },
            &[],
        ),
        classify_seed(
            "method-not-found-projection",
            rpc(CODEX_EXITED, Text::Menu(3)),
            &[],
        ),
        classify_seed(
            "auth-required-naming-the-session",
            rpc(AUTH_REQUIRED, Text::ResourcePrefix),
            &[],
        ),
        classify_seed(
            "transport-closed-with-resource-not-found",
            Case {
                transport: 1,
                ..rpc(RESOURCE_NOT_FOUND, Text::ResourcePrefix)
            },
            &[],
        ),
        classify_seed(
            "capability-absent",
            Case {
                capability: 1,
                ..rpc(INTERNAL_ERROR, Text::Menu(2))
            },
            &[],
        ),
        classify_seed(
            "cancelled-with-capability-false",
            Case {
                capability: 2,
                result: 3,
                ..rpc(0, Text::Menu(2))
            },
            &[],
        ),
        classify_seed(
            "resource-not-found-other-session",
            rpc(INTERNAL_ERROR, Text::MenuThen(0, b": other".to_vec())),
            &[Mutant::SubstringFallback],
        ),
        classify_seed(
            "empty-requested-session",
            Case {
                session: Text::Menu(2),
                ..rpc(INTERNAL_ERROR, Text::ResourcePrefix)
            },
            &[Mutant::SubstringFallback],
        ),
        classify_seed(
            "raw-code-and-bytes",
            Case {
                code: 250,
                raw_code: i64::MAX,
                session: Text::Raw(b"thread-\xff\x00".to_vec()),
                ..rpc(0, Text::Raw(b"NOT\tFOUND \xe2\x80".to_vec()))
            },
            &[],
        ),
    ]
}

fn snapshot_seeds() -> Vec<Seed> {
    let state = |name: &str| {
        orderings_seeds()
            .into_iter()
            .find(|s| s.name == name)
            .expect("a named orderings seed")
            .bytes
    };
    // The state after the last operation, with its work in flight.
    let snapshot_of = |ops: &[u8]| {
        let mut snap = Vec::new();
        orderings::run_world(ops, None, &mut |core| {
            snap = core.snapshot();
            Ok(())
        })
        .expect("orderings seeds pass");
        snap
    };
    let with_mode = |mode: u8, rest: &[u8]| {
        let mut v = vec![mode];
        v.extend_from_slice(rest);
        v
    };
    let raw = |name: &'static str, bytes: Vec<u8>| Seed {
        target: Target::SnapshotRestore,
        name,
        bytes: with_mode(snapshot::MODE_RAW, &bytes),
        catches: &[],
    };
    let running = state("burst-1100-notifications");
    let kandev = state("kandev-cancel-during-delayed-load");
    // Stop before the liveness phase settles everything: a state with work in flight.
    let in_flight = orderings::encode(
        Header::default(),
        &[
            Op::Prompt(S1),
            r(How::Good),
            r(How::Good),
            Op::Resume(S2),
            Op::Churn(S2, 17),
        ],
    );
    // A restart while the first prompt is dispatched but not performed: the restore rolls
    // the prompt back and settles the attempt that waited for it.
    let dispatched = orderings::encode(
        Header::default(),
        &[Op::Prompt(S1), r(How::Good), r(How::Good), r(How::Good)],
    );
    let mut mutated = vec![snapshot::MODE_MUTATED, in_flight.len() as u8];
    mutated.extend_from_slice(&in_flight);
    for (at, kind, value) in [
        (6u16, snapshot::EDIT_XOR, 0x01u8),
        (40, snapshot::EDIT_SET, 0x80),
        (90, snapshot::EDIT_MAX, 0),
        (100, snapshot::EDIT_ADD, 1),
    ] {
        mutated.extend_from_slice(&at.to_le_bytes());
        mutated.extend([kind, value]);
    }
    // The in-flight churn state, one byte of its stamp counter raised, then legal input to
    // the restored core (a prompt driven to a running turn, time) before the liveness
    // check.
    let mut then_ops = vec![snapshot::MODE_MUTATED_THEN_OPS, in_flight.len() as u8];
    then_ops.extend_from_slice(&in_flight);
    then_ops.push(1);
    then_ops.extend_from_slice(&30u16.to_le_bytes());
    then_ops.extend([snapshot::EDIT_ADD, 1]);
    let mut w = crate::Writer::new();
    for op in [Op::Prompt(S1), Op::Drive(S1, 7), Op::Advance(Adv::Far)] {
        op.encode(&mut w);
    }
    then_ops.extend(w.into_bytes());
    let real = snapshot_of(&kandev);
    let mut truncated = real.clone();
    truncated.truncate(real.len() / 2);
    // The version after the current one (2), which this core cannot know.
    let mut future = real.clone();
    future[4] = 3;
    vec![
        raw("kandev-state", real),
        raw("recovery-state", snapshot_of(&state("recovery-exhausts"))),
        raw("truncated", truncated),
        raw("future-version", future),
        raw("bad-magic", b"PLSX\x01\x00".to_vec()),
        Seed {
            target: Target::SnapshotRestore,
            name: "round-trip-running-turn",
            bytes: with_mode(snapshot::MODE_ROUND_TRIP, &running),
            catches: &[],
        },
        Seed {
            target: Target::SnapshotRestore,
            name: "round-trip-dispatched-prompt",
            bytes: with_mode(snapshot::MODE_ROUND_TRIP, &dispatched),
            catches: &[],
        },
        Seed {
            target: Target::SnapshotRestore,
            name: "round-trip-churn",
            bytes: with_mode(snapshot::MODE_ROUND_TRIP, &in_flight),
            catches: &[],
        },
        Seed {
            target: Target::SnapshotRestore,
            name: "flipped-bytes-in-flight",
            bytes: mutated,
            catches: &[],
        },
        Seed {
            target: Target::SnapshotRestore,
            name: "flipped-then-legal-input",
            bytes: then_ops,
            catches: &[],
        },
    ]
}

fn delivery_seed(
    name: &'static str,
    header: delivery::Header,
    ops: Vec<delivery::Op>,
    catches: &'static [Mutant],
) -> Seed {
    Seed {
        target: Target::Delivery,
        name,
        bytes: delivery::encode(header, &ops),
        catches,
    }
}

fn delivery_seeds() -> Vec<Seed> {
    use delivery::Op as D;
    const TEXT: u8 = 0;
    const TOOL_CALL: u8 = 2;
    const RESOURCE: u8 = 4;
    const DONE: u8 = 7;
    let defaults = delivery::Header::default();
    let pump = |rounds: usize| {
        let mut v = Vec::new();
        for _ in 0..rounds {
            v.extend([D::PushAll, D::Pop(u8::MAX), D::Advance(10)]);
        }
        v
    };
    vec![
        // Compozy #454: 1,100 notifications against the ACP SDK's 1,024 queue.
        delivery_seed(
            "burst-1100-against-1024",
            defaults,
            cat_d(&[
                vec![
                    D::Produce {
                        n: u8::MAX,
                        kind: TEXT,
                        size: 16,
                    },
                    D::PushAll,
                ],
                pump(2),
                vec![D::Flush],
            ]),
            &[Mutant::QueueOverflowCloses, Mutant::BackpressureSkipsSeq],
        ),
        // The module's doc example: tool calls count against the byte cap too.
        delivery_seed(
            "tool-calls-small-queue",
            delivery::Header {
                capacity: 4 * 4 + 1,
                ..defaults
            },
            cat_d(&[
                vec![
                    D::Produce {
                        n: 9,
                        kind: TOOL_CALL,
                        size: 900,
                    },
                    D::Produce {
                        n: 0,
                        kind: DONE,
                        size: 0,
                    },
                ],
                pump(4),
            ]),
            &[Mutant::QueueOverflowCloses],
        ),
        delivery_seed(
            "zero-delay-one-event-batches",
            delivery::Header {
                capacity: 2 * 4 + 1,
                delay: 1,
                events: 4 + 1,
                bytes: 1,
            },
            cat_d(&[
                vec![D::Produce {
                    n: 20,
                    kind: RESOURCE,
                    size: 3,
                }],
                pump(3),
            ]),
            &[Mutant::QueueOverflowCloses],
        ),
        delivery_seed(
            "close-mid-stream",
            defaults,
            vec![
                D::Produce {
                    n: 20,
                    kind: TEXT,
                    size: 100,
                },
                D::Push(4),
                D::Close,
                D::Push(3),
                D::Pop(u8::MAX),
                D::Flush,
            ],
            &[],
        ),
        delivery_seed(
            "receiver-duplicates-and-gaps",
            defaults,
            vec![
                D::Produce {
                    n: 4,
                    kind: TEXT,
                    size: 1,
                },
                D::PushAll,
                D::Pop(u8::MAX),
                D::Flush,
                D::Duplicate(0),
                D::Duplicate(3),
                D::Gap(0),
                D::Gap(200),
            ],
            &[],
        ),
        delivery_seed(
            "extreme-config",
            delivery::Header {
                capacity: 255,
                delay: 255,
                events: 255,
                bytes: 2,
            },
            vec![
                D::Produce {
                    n: u8::MAX,
                    kind: 5,
                    size: u16::MAX,
                },
                D::PushAll,
                D::Pop(100),
                D::Advance(255),
                D::Advance(255),
                D::Advance(255),
                D::Advance(255),
                D::Pop(u8::MAX),
            ],
            &[],
        ),
        delivery_seed(
            "terminals-between-batches",
            delivery::Header {
                bytes: 3 + 4 * 10,
                ..defaults
            },
            vec![
                D::Produce {
                    n: 5,
                    kind: TEXT,
                    size: 200,
                },
                D::Produce {
                    n: 0,
                    kind: DONE,
                    size: 0,
                },
                D::Produce {
                    n: 3,
                    kind: 3,
                    size: 700,
                },
                D::Produce {
                    n: 0,
                    kind: 8,
                    size: 5,
                },
                D::PushAll,
                D::Pop(3),
                D::Advance(30),
                D::Pop(u8::MAX),
            ],
            &[],
        ),
    ]
}

fn cat_d(parts: &[Vec<delivery::Op>]) -> Vec<delivery::Op> {
    parts.concat()
}

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut v = orderings_seeds();
    v.extend(classify_seeds());
    v.extend(snapshot_seeds());
    v.extend(delivery_seeds());
    v
}
