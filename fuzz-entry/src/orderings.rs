//! `callback_orderings`: the core under every ordering of inputs a runtime, a client and a
//! clock can produce.
//!
//! An input is a 3-byte [`Header`] (recovery schedule, session limit, deadlines) followed
//! by [`Op`]s, one tag byte and a few argument bytes each. The harness plays the embedder:
//! it keeps, per session, the work the core asked for (start a runtime, load or create a
//! conversation, dispatch a prompt, cancel a prompt) as [`Todo`] items, and an
//! [`Op::React`] answers one of them — well, badly, twice, late, or never. Because the
//! items remember the attempt, execution and generation they were issued for, answering
//! an old one after a cancel, a replacement or a restart produces exactly the stale
//! callbacks of the reviewed races, without the fuzzer having to guess IDs. [`Op::Forge`]
//! adds callbacks with any attempt, execution, generation and event.
//!
//! After every input and every timer: `Core::check_invariants` and the independent
//! `Auditor` (which also checks every effect). After the last operation, a liveness phase
//! plays a well-behaved world (every runtime answers, every teardown finishes, time runs
//! out) and `Auditor::check_quiescent` must hold: every turn ended, no attempt live, no
//! teardown pending. Any violation is a [`Finding`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use arbitrary::{Arbitrary, Unstructured};
use palisade_core::audit::Checker;
use palisade_core::classify::{
    ErrorAnswer, LoadFailure, LoadOutcome, SessionListing, TransportState,
};
use palisade_core::driver::{Driver, LeaseCheck, Output};
use palisade_core::mutants::Mutant;
use palisade_core::*;

use crate::bytes::{byte, Writer};
use crate::Finding;

const TARGET: &str = "callback_orderings";

/// Operations decoded from one input at most (libFuzzer's default `-max_len` of 4,096
/// bytes holds about 700 of the shortest).
pub const MAX_OPS: usize = 512;
/// Inputs fed to the core by the operations of one fuzz input, at most. One operation
/// feeds at most [`STREAM_BURST`] (a burst) or 48 (a churn), so this keeps one execution
/// in the low milliseconds while still fitting a 1,100-notification burst.
pub const MAX_INPUTS: usize = 20_000;
/// Sessions the operations address: three gives cross-session mix-ups (foreign
/// executions, other sessions' attempts) while keeping same-session races likely.
pub const SESSIONS: u8 = 3;
/// Execution IDs the operations address: few, so a replacement reusing an execution ID
/// (the generation races) is common.
pub const EXECUTIONS: u8 = 4;
/// Stream events of a burst: compozy #454's 1,100 notifications against a 1,024 queue.
pub const STREAM_BURST: u64 = 1_100;
/// Rounds of the liveness phase; each answers every pending item and lets two minutes
/// pass, which is longer than every default deadline (start 60 s, stop 10 s, lease 5 s,
/// join 30 s, recovery 1 + 2 + 4 s).
const LIVENESS_ROUNDS: usize = 24;
const LIVENESS_STEP_MS: u64 = 120_000;
/// Items one session answers per liveness round at most; a chain of well-behaved answers
/// (start, boot, conversation, dispatch, completion) takes five.
const LIVENESS_ITEMS_PER_ROUND: usize = 64;
/// Earlier callbacks kept for [`Op::Replay`].
const CALLBACKS_KEPT: usize = 64;
/// Timer firings per advance, at most: each firing removes a due timer, so more means the
/// core keeps re-arming timers in the past (a loop).
const FIRINGS_PER_ADVANCE: usize = 100_000;

// ---------------------------------------------------------------------------------------
// The input format
// ---------------------------------------------------------------------------------------

/// The configuration an input runs under.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Recovery schedule: see the `SCHEDULE_*` constants (taken modulo 4).
    pub schedule: u8,
    /// 0: the default session limit; 1–3: that many sessions at most (taken modulo 4).
    pub sessions: u8,
    /// Even: default deadlines; odd: short ones, so small advances reach them. Bit 1 turns
    /// the idle rule on ([`Header::IDLE`]): an accepted turn silent that long is given up.
    pub deadlines: u8,
}

impl Header {
    /// The default schedule (1 s, 2 s, 4 s).
    pub const SCHEDULE_DEFAULT: u8 = 0;
    /// No recovery at all.
    pub const SCHEDULE_NONE: u8 = 1;
    /// One recovery after 500 ms: exhaustion is one runtime loss away.
    pub const SCHEDULE_ONE: u8 = 2;
    /// The longest schedule allowed (8 steps), starting with a zero delay.
    pub const SCHEDULE_EIGHT: u8 = 3;
    /// The `deadlines` bit that turns the idle rule on (`turn_idle_ms`: 20 s, or 300 ms
    /// with the short deadlines).
    pub const IDLE: u8 = 2;

    /// The core configuration this header stands for. The agent profile stays `Generic`:
    /// the auditor judges load fallbacks by the `Generic` table.
    pub fn config(self) -> Config {
        let mut c = Config::default();
        c.recovery_delays_ms = match self.schedule % 4 {
            Self::SCHEDULE_NONE => vec![],
            Self::SCHEDULE_ONE => vec![500],
            Self::SCHEDULE_EIGHT => vec![0, 100, 100, 200, 200, 400, 400, 800],
            _ => c.recovery_delays_ms,
        };
        if !self.sessions.is_multiple_of(4) {
            c.max_sessions = usize::from(self.sessions % 4);
        }
        if self.deadlines % 2 == 1 {
            c.join_wait_ms = 100;
            c.start_deadline_ms = 400;
            c.lease_ms = 50;
            c.stop_deadline_ms = 80;
        }
        if self.deadlines & Self::IDLE != 0 {
            c.turn_idle_ms = if self.deadlines % 2 == 1 { 300 } else { 20_000 };
        }
        c
    }

    /// Writes the header.
    pub fn encode(self, w: &mut Writer) {
        w.byte(self.schedule)
            .byte(self.sessions)
            .byte(self.deadlines);
    }
}

impl<'a> Arbitrary<'a> for Header {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Header {
            schedule: byte(u),
            sessions: byte(u),
            deadlines: byte(u),
        })
    }
}

/// How the embedder answers one piece of work the core asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// As a healthy runtime would (perform the leased effect, then report success).
    Good,
    /// The step fails: start failure, load failure (any outcome), prompt failure.
    Fail,
    /// The runtime process exits.
    Exit,
    /// Success, reported twice.
    Duplicate,
    /// The answer is lost; the item is forgotten.
    Drop,
    /// Not now: the item goes to the back of the queue.
    Defer,
    /// A running prompt streams events (a burst when the first detail byte is 255).
    Stream,
    /// Perform the leased effect but answer later: the "delayed load" of kandev #3636.
    Hold,
}

impl How {
    /// Every answer, in byte order.
    pub const ALL: [How; 8] = [
        How::Good,
        How::Fail,
        How::Exit,
        How::Duplicate,
        How::Drop,
        How::Defer,
        How::Stream,
        How::Hold,
    ];

    fn from_byte(b: u8) -> How {
        How::ALL[usize::from(b % 8)]
    }

    fn to_byte(self) -> u8 {
        How::ALL
            .iter()
            .position(|h| *h == self)
            .expect("every How is in ALL") as u8
    }
}

/// Which attempt ID a forged callback or a bind carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum APick {
    /// The session's newest attempt.
    Newest,
    /// The attempt last bound to the callback's execution.
    OfExecution,
    /// The n-th attempt started, over all sessions.
    Nth(u8),
    /// An attempt this epoch never minted.
    Unminted,
    /// No attempt (a legacy component).
    Missing,
    /// A raw sequence number: `< 128` in this epoch, else in the next one (the future).
    Raw(u8),
}

impl APick {
    fn decode(k: u8, a: u8) -> APick {
        match k % 8 {
            0..=2 => APick::Newest,
            3 => APick::OfExecution,
            4 => APick::Nth(a),
            5 => APick::Unminted,
            6 => APick::Missing,
            _ => APick::Raw(a),
        }
    }

    fn encode(self, w: &mut Writer) {
        let (k, a) = match self {
            APick::Newest => (0, 0),
            APick::OfExecution => (3, 0),
            APick::Nth(a) => (4, a),
            APick::Unminted => (5, 0),
            APick::Missing => (6, 0),
            APick::Raw(a) => (7, a),
        };
        w.byte(k).byte(a);
    }
}

/// Which generation a forged callback carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GPick {
    /// The generation last bound to the callback's execution.
    Current,
    /// That minus 1–4.
    Older(u8),
    /// That plus 1–4.
    Future(u8),
    /// A raw generation, 1–256.
    Raw(u8),
}

impl GPick {
    fn decode(k: u8, a: u8) -> GPick {
        match k % 8 {
            0..=4 => GPick::Current,
            5 => GPick::Older(a),
            6 => GPick::Future(a),
            _ => GPick::Raw(a),
        }
    }

    fn encode(self, w: &mut Writer) {
        let (k, a) = match self {
            GPick::Current => (0, 0),
            GPick::Older(a) => (5, a),
            GPick::Future(a) => (6, a),
            GPick::Raw(a) => (7, a),
        };
        w.byte(k).byte(a);
    }
}

/// A forged runtime event. Turn bytes: `p % 4 != 3` means the session's latest turn,
/// else turn `p / 4 + 1`. Stamp bytes: 0 means a fresh stamp, else that value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ev {
    /// `boot_ready`.
    Boot,
    /// `agent_ready` with a capability byte (6: absent, 7: false, else true).
    AgentReady(u8),
    /// `session/new` succeeded with token `p + 1`.
    Created(u8),
    /// `session/load` succeeded.
    Loaded,
    /// `session/load` failed with the outcome of [`load_outcome`]`(p, q)`.
    LoadFailed(u8, u8),
    /// Startup failed.
    StartFailed(u8),
    /// The provider accepted the turn.
    Accepted(u8),
    /// A stream event of the turn with runtime sequence number `q`.
    Stream(u8, u8),
    /// The turn completed.
    Completed(u8),
    /// The turn failed.
    Failed(u8, u8),
    /// The runtime exited.
    Exited(u8),
}

impl Ev {
    fn decode(t: u8, p: u8, q: u8) -> Ev {
        match t % 11 {
            0 => Ev::Boot,
            1 => Ev::AgentReady(p),
            2 => Ev::Created(p),
            3 => Ev::Loaded,
            4 => Ev::LoadFailed(p, q),
            5 => Ev::StartFailed(p),
            6 => Ev::Accepted(p),
            7 => Ev::Stream(p, q),
            8 => Ev::Completed(p),
            9 => Ev::Failed(p, q),
            _ => Ev::Exited(p),
        }
    }

    fn encode(self, w: &mut Writer) {
        let (t, p, q) = match self {
            Ev::Boot => (0, 0, 0),
            Ev::AgentReady(p) => (1, p, 0),
            Ev::Created(p) => (2, p, 0),
            Ev::Loaded => (3, 0, 0),
            Ev::LoadFailed(p, q) => (4, p, q),
            Ev::StartFailed(p) => (5, p, 0),
            Ev::Accepted(p) => (6, p, 0),
            Ev::Stream(p, q) => (7, p, q),
            Ev::Completed(p) => (8, p, 0),
            Ev::Failed(p, q) => (9, p, q),
            Ev::Exited(p) => (10, p, 0),
        };
        w.byte(t).byte(p).byte(q);
    }
}

/// How far the clock moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adv {
    /// By 0–255 ms.
    Ms(u8),
    /// By 0–25.5 s, in tenths.
    Tenths(u8),
    /// To the core's next deadline.
    NextTimer,
    /// By two minutes: past every default deadline.
    Far,
}

impl Adv {
    fn decode(k: u8, a: u8) -> Adv {
        match k % 4 {
            0 => Adv::Ms(a),
            1 => Adv::Tenths(a),
            2 => Adv::NextTimer,
            _ => Adv::Far,
        }
    }

    fn encode(self, w: &mut Writer) {
        let (k, a) = match self {
            Adv::Ms(a) => (0, a),
            Adv::Tenths(a) => (1, a),
            Adv::NextTimer => (2, 0),
            Adv::Far => (3, 0),
        };
        w.byte(k).byte(a);
    }
}

/// One operation. Session bytes are taken modulo [`SESSIONS`], execution bytes modulo
/// [`EXECUTIONS`], both counted from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A client resumes the session.
    Resume(u8),
    /// A client sends a prompt with the session's next turn ID.
    Prompt(u8),
    /// A client sends a prompt with turn ID `t + 1` (old, duplicate or skipping).
    PromptTurn(u8, u8),
    /// The user cancels.
    Cancel(u8),
    /// The embedder answers the session's pending item number `pick` (modulo the queue).
    React {
        /// Session.
        s: u8,
        /// How.
        how: How,
        /// Which pending item.
        pick: u8,
        /// First detail: the execution to bind, the agent's capability, a load outcome,
        /// a stream length.
        d1: u8,
        /// Second detail: an error stamp, a load outcome, stream payload size.
        d2: u8,
    },
    /// A bind with any attempt on any execution.
    Bind {
        /// Session.
        s: u8,
        /// Attempt.
        attempt: APick,
        /// Execution.
        exec: u8,
    },
    /// A callback with any attempt, execution, generation and event.
    Forge {
        /// Session.
        s: u8,
        /// Execution.
        exec: u8,
        /// Attempt.
        attempt: APick,
        /// Generation.
        generation: GPick,
        /// Event.
        event: Ev,
    },
    /// Re-delivers the `k`-th most recent callback (duplicates and reordering).
    Replay(u8),
    /// Performs the `k`-th most recent lease.
    Perform(u8),
    /// Reports an execution stopped.
    Stopped(u8),
    /// The user dismisses the session's stored failure.
    Dismiss(u8),
    /// Resume and cancel `n % 24 + 1` times: churns the tombstone ring.
    Churn(u8, u8),
    /// Time passes.
    Advance(Adv),
    /// The orchestrator restarts: snapshot, then restore.
    Restart,
    /// The clock jumps back by `10 × ms` milliseconds.
    ClockBack(u8),
    /// Every pending teardown finishes.
    StopAll,
    /// The embedder answers the session's oldest pending item well, `n % 8 + 1` times in
    /// a row (fewer when the queue empties; `n / 8` is the first detail byte, e.g. the
    /// execution a start binds): one operation takes a prompt from claim to a running
    /// turn, so the fuzzer spends its bytes on the faults between the steps.
    Drive(u8, u8),
}

impl Op {
    const KINDS: u8 = 17;

    /// Writes the operation in the format [`Op::arbitrary`] reads.
    pub fn encode(self, w: &mut Writer) {
        match self {
            Op::Resume(s) => {
                w.byte(0).byte(s);
            }
            Op::Prompt(s) => {
                w.byte(1).byte(s);
            }
            Op::PromptTurn(s, t) => {
                w.byte(2).byte(s).byte(t);
            }
            Op::Cancel(s) => {
                w.byte(3).byte(s);
            }
            Op::React {
                s,
                how,
                pick,
                d1,
                d2,
            } => {
                w.byte(4)
                    .byte(s)
                    .byte(how.to_byte())
                    .byte(pick)
                    .byte(d1)
                    .byte(d2);
            }
            Op::Bind { s, attempt, exec } => {
                w.byte(5).byte(s);
                attempt.encode(w);
                w.byte(exec);
            }
            Op::Forge {
                s,
                exec,
                attempt,
                generation,
                event,
            } => {
                w.byte(6).byte(s).byte(exec);
                attempt.encode(w);
                generation.encode(w);
                event.encode(w);
            }
            Op::Replay(k) => {
                w.byte(7).byte(k);
            }
            Op::Perform(k) => {
                w.byte(8).byte(k);
            }
            Op::Stopped(e) => {
                w.byte(9).byte(e);
            }
            Op::Dismiss(s) => {
                w.byte(10).byte(s);
            }
            Op::Churn(s, n) => {
                w.byte(11).byte(s).byte(n);
            }
            Op::Advance(a) => {
                w.byte(12);
                a.encode(w);
            }
            Op::Restart => {
                w.byte(13);
            }
            Op::ClockBack(ms) => {
                w.byte(14).byte(ms);
            }
            Op::StopAll => {
                w.byte(15);
            }
            Op::Drive(s, n) => {
                w.byte(16).byte(s).byte(n);
            }
        }
    }
}

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let op = match byte(u) % Op::KINDS {
            0 => Op::Resume(byte(u)),
            1 => Op::Prompt(byte(u)),
            2 => Op::PromptTurn(byte(u), byte(u)),
            3 => Op::Cancel(byte(u)),
            4 => Op::React {
                s: byte(u),
                how: How::from_byte(byte(u)),
                pick: byte(u),
                d1: byte(u),
                d2: byte(u),
            },
            5 => Op::Bind {
                s: byte(u),
                attempt: APick::decode(byte(u), byte(u)),
                exec: byte(u),
            },
            6 => Op::Forge {
                s: byte(u),
                exec: byte(u),
                attempt: APick::decode(byte(u), byte(u)),
                generation: GPick::decode(byte(u), byte(u)),
                event: Ev::decode(byte(u), byte(u), byte(u)),
            },
            7 => Op::Replay(byte(u)),
            8 => Op::Perform(byte(u)),
            9 => Op::Stopped(byte(u)),
            10 => Op::Dismiss(byte(u)),
            11 => Op::Churn(byte(u), byte(u)),
            12 => Op::Advance(Adv::decode(byte(u), byte(u))),
            13 => Op::Restart,
            14 => Op::ClockBack(byte(u)),
            15 => Op::StopAll,
            _ => Op::Drive(byte(u), byte(u)),
        };
        Ok(op)
    }
}

/// Decodes a whole input: the header, then operations until the data ends (at most
/// [`MAX_OPS`]).
pub fn decode(data: &[u8]) -> (Header, Vec<Op>) {
    let mut u = Unstructured::new(data);
    let header = Header::arbitrary(&mut u).unwrap_or_default();
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < MAX_OPS {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    (header, ops)
}

/// Decodes operations alone (no header), until the data ends (at most [`MAX_OPS`]).
pub fn decode_ops(data: &[u8]) -> Vec<Op> {
    let mut u = Unstructured::new(data);
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < MAX_OPS {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    ops
}

/// Encodes a header and operations.
pub fn encode(header: Header, ops: &[Op]) -> Vec<u8> {
    let mut w = Writer::new();
    header.encode(&mut w);
    for op in ops {
        op.encode(&mut w);
    }
    w.into_bytes()
}

const CODES: [i64; 16] = [
    ErrorAnswer::RESOURCE_NOT_FOUND,
    ErrorAnswer::METHOD_NOT_FOUND,
    ErrorAnswer::INTERNAL_ERROR,
    ErrorAnswer::INTERNAL_ERROR,
    ErrorAnswer::INTERNAL_ERROR,
    ErrorAnswer::AUTH_REQUIRED,
    ErrorAnswer::REQUEST_CANCELLED,
    ErrorAnswer::INVALID_PARAMS,
    ErrorAnswer::INVALID_REQUEST,
    1001,
    0,
    -1,
    404,
    ErrorAnswer::RESOURCE_NOT_FOUND,
    ErrorAnswer::INTERNAL_ERROR,
    i64::MIN,
];

/// The session ID every harness load asks for.
pub const REQUESTED_SESSION: &str = "s";

const MESSAGES: [&str; 14] = [
    "Resource not found: s",
    "resource not found while resolving configuration",
    "Internal error",
    "\"Method not found\": session/load",
    "Method not found",
    "Session not found",
    "not found",
    "Resource not found",
    "Resource not found: other",
    "no rollout found for thread id s",
    "Authentication required",
    "Request cancelled",
    "",
    "Codex process has exited",
];

/// The load outcome two bytes stand for: `p` picks transport (`p % 16`: 14 closed, 15
/// exited, else open; 13 also says the agent's `session/list` has the session), capability (`p / 16 % 8`: 6 absent, 7 false, else true) and
/// `data.details`; `q` picks the failure (`q % 16`: 0 timeout, 1 cancelled, else an RPC
/// error with code `q / 16` and message `q % 16 - 2` of fixed tables that hold every row
/// of rule 6 and the look-alikes that must not fall back).
pub fn load_outcome(p: u8, q: u8) -> LoadOutcome {
    let transport = match p % 16 {
        14 => TransportState::Closed,
        15 => TransportState::ProcessExited,
        _ => TransportState::Open,
    };
    let load_capability = match (p / 16) % 8 {
        6 => None,
        7 => Some(false),
        _ => Some(true),
    };
    let result = match q % 16 {
        0 => LoadFailure::TimedOut,
        1 => LoadFailure::Cancelled,
        m => LoadFailure::Rpc(ErrorAnswer {
            code: CODES[usize::from(q / 16)],
            message: MESSAGES[usize::from(m - 2)].to_owned(),
            data_details: ((p / 16) % 8 == 5).then(|| "Session not found".to_owned()),
            data_present: (p / 16) % 8 == 5,
        }),
    };
    LoadOutcome {
        load_capability,
        requested_session: REQUESTED_SESSION.to_owned(),
        result,
        transport,
        listing: if p % 16 == 13 {
            SessionListing::Listed
        } else {
            SessionListing::Unknown
        },
    }
}

// ---------------------------------------------------------------------------------------
// The world: the embedder around the core
// ---------------------------------------------------------------------------------------

/// Work the core asked the embedder for, with the identity it was asked under.
#[derive(Clone, Copy, Debug)]
enum Todo {
    Start {
        attempt: AttemptId,
    },
    Boot {
        attempt: AttemptId,
        execution: ExecutionId,
        generation: Generation,
    },
    Conversation {
        attempt: Option<AttemptId>,
        lease: LeaseId,
        execution: ExecutionId,
        generation: Generation,
        load: bool,
        performed: bool,
    },
    Dispatch {
        attempt: Option<AttemptId>,
        lease: LeaseId,
        execution: ExecutionId,
        generation: Generation,
        turn: TurnId,
        performed: bool,
    },
    Running {
        attempt: Option<AttemptId>,
        execution: ExecutionId,
        generation: Generation,
        turn: TurnId,
        next: u64,
    },
    CancelTurn {
        attempt: Option<AttemptId>,
        execution: ExecutionId,
        generation: Generation,
        turn: TurnId,
    },
}

fn sid(s: u8) -> SessionId {
    SessionId::new(u64::from(s % SESSIONS) + 1).expect("1..=SESSIONS is non-zero")
}

fn eid(e: u8) -> ExecutionId {
    ExecutionId::new(u64::from(e % EXECUTIONS) + 1).expect("1..=EXECUTIONS is non-zero")
}

fn capability(b: u8) -> Option<bool> {
    match b % 8 {
        6 => None,
        7 => Some(false),
        _ => Some(true),
    }
}

/// The core, the auditor, and the embedder's memory of what it was asked.
pub(crate) struct World {
    /// The core behind the one driver; the harness performs leases itself
    /// (`LeaseCheck::ByCaller`), whenever [`Op::Perform`] says, so the gap a lease guards
    /// is open to the fuzzer.
    pub(crate) driver: Driver<Checker>,
    mutant: Option<Mutant>,
    pub(crate) now: Timestamp,
    inputs: usize,
    op: Option<usize>,
    trace: bool,
    started: Vec<(SessionId, AttemptId)>,
    leases: Vec<LeaseId>,
    callbacks: VecDeque<Input>,
    todo: BTreeMap<SessionId, VecDeque<Todo>>,
    stops: BTreeSet<ExecutionId>,
    /// The latest (attempt, generation) bound to each execution.
    bindings: BTreeMap<ExecutionId, (AttemptId, Generation)>,
    /// Who each (execution, generation) was bound to.
    bound_to: BTreeMap<(ExecutionId, Generation), AttemptId>,
    /// Claimed turns not yet ended, per session.
    active: BTreeMap<SessionId, TurnId>,
    /// The latest turn ID a client used, per session.
    last_turn: BTreeMap<SessionId, TurnId>,
    next_turn: BTreeMap<SessionId, u64>,
    /// Where each turn was last dispatched.
    dispatched: BTreeMap<(SessionId, TurnId), (ExecutionId, Generation)>,
    next_stamp: u64,
    next_token: u64,
}

impl World {
    pub(crate) fn new(config: Config, mutant: Option<Mutant>) -> World {
        let checker = Checker::new(&config);
        let mut core = Core::new(config, Epoch::FIRST).expect("header configs are valid");
        core.set_mutant(mutant);
        World {
            driver: Driver::with_observer(core, checker).lease_check(LeaseCheck::ByCaller),
            mutant,
            now: Timestamp::ZERO,
            inputs: 0,
            op: None,
            trace: crate::trace_enabled(),
            started: Vec::new(),
            leases: Vec::new(),
            callbacks: VecDeque::new(),
            todo: BTreeMap::new(),
            stops: BTreeSet::new(),
            bindings: BTreeMap::new(),
            bound_to: BTreeMap::new(),
            active: BTreeMap::new(),
            last_turn: BTreeMap::new(),
            next_turn: BTreeMap::new(),
            dispatched: BTreeMap::new(),
            next_stamp: 1_000,
            next_token: 1_000,
        }
    }

    fn finding(&self, rule: impl Into<String>, detail: String) -> Finding {
        Finding {
            step: self.op,
            ..Finding::new(TARGET, rule, detail)
        }
    }

    /// Pulls every output of the step just taken (nothing is carried out here: the
    /// harness answers effects later, from its to-do queues).
    fn drain(&mut self) -> Vec<Effect> {
        let mut effects = Vec::new();
        while let Output::Effect(e) = self.driver.poll_output(self.now) {
            effects.push(e);
        }
        effects
    }

    /// The checker's first finding, if the last step broke a rule.
    pub(crate) fn checked(&mut self, what: &dyn Fn() -> String) -> Result<(), Finding> {
        match self.driver.observer_mut().take_found() {
            None => Ok(()),
            Some(found) => {
                let v = found.violation;
                let rule = match v.detail.strip_prefix("core invariant: ") {
                    Some(_) => format!("invariant {}", v.rule),
                    None => v.rule.to_owned(),
                };
                Err(self.finding(rule, format!("{} after {}", v.detail, what())))
            }
        }
    }

    /// Feeds one input, drains its effects, checks everything.
    fn input(&mut self, input: Input) -> Result<Verdict, Finding> {
        self.inputs += 1;
        let verdict = self.driver.handle(self.now, input.clone());
        let effects = self.drain();
        if self.trace {
            eprintln!("  {} {input:?}\n    -> {verdict:?}", self.now);
            for e in &effects {
                eprintln!("    effect {e:?}");
            }
        }
        self.checked(&|| format!("{input:?} (verdict {verdict:?})"))?;
        self.record(Some((&input, &verdict)), &effects);
        Ok(verdict)
    }

    fn cb(
        &mut self,
        session: SessionId,
        attempt: Option<AttemptId>,
        execution: ExecutionId,
        generation: Generation,
        event: RuntimeEvent,
    ) -> Result<Verdict, Finding> {
        let input = Input::Callback(Callback {
            session,
            execution,
            attempt,
            generation,
            event,
        });
        if self.callbacks.len() == CALLBACKS_KEPT {
            self.callbacks.pop_front();
        }
        self.callbacks.push_back(input.clone());
        self.input(input)
    }

    fn queue(&mut self, s: SessionId) -> &mut VecDeque<Todo> {
        self.todo.entry(s).or_default()
    }

    fn record(&mut self, step: Option<(&Input, &Verdict)>, effects: &[Effect]) {
        match step {
            Some((
                Input::Bound {
                    attempt, execution, ..
                },
                Verdict::Bound { generation },
            )) => {
                self.bindings.insert(*execution, (*attempt, *generation));
                self.bound_to.insert((*execution, *generation), *attempt);
            }
            Some((Input::Prompt { session, turn }, Verdict::Claimed)) => {
                self.active.insert(*session, *turn);
            }
            Some((Input::Stopped { execution }, _)) => {
                self.stops.remove(execution);
            }
            _ => {}
        }
        for e in effects {
            match *e {
                Effect::StartRuntime {
                    session, attempt, ..
                } => {
                    self.started.push((session, attempt));
                    self.queue(session).push_back(Todo::Start { attempt });
                }
                Effect::LoadConversation {
                    lease,
                    session,
                    execution,
                    generation,
                    ..
                }
                | Effect::NewConversation {
                    lease,
                    session,
                    execution,
                    generation,
                    ..
                } => {
                    self.leases.push(lease);
                    let attempt = self.bound_to.get(&(execution, generation)).copied();
                    let load = matches!(e, Effect::LoadConversation { .. });
                    self.queue(session).push_back(Todo::Conversation {
                        attempt,
                        lease,
                        execution,
                        generation,
                        load,
                        performed: false,
                    });
                }
                Effect::DispatchPrompt {
                    lease,
                    session,
                    execution,
                    generation,
                    turn,
                    ..
                } => {
                    self.leases.push(lease);
                    let attempt = self.bound_to.get(&(execution, generation)).copied();
                    self.dispatched
                        .insert((session, turn), (execution, generation));
                    self.queue(session).push_back(Todo::Dispatch {
                        attempt,
                        lease,
                        execution,
                        generation,
                        turn,
                        performed: false,
                    });
                }
                Effect::CancelPrompt {
                    session,
                    execution,
                    turn,
                } => {
                    if let Some(&(attempt, generation)) = self.bindings.get(&execution) {
                        self.queue(session).push_back(Todo::CancelTurn {
                            attempt: Some(attempt),
                            execution,
                            generation,
                            turn,
                        });
                    }
                }
                Effect::StopExecution { execution, .. } => {
                    self.stops.insert(execution);
                }
                Effect::KillExecution { execution, .. } => {
                    self.stops.remove(&execution);
                }
                Effect::TurnEnded { session, turn, .. } => {
                    if self.active.get(&session) == Some(&turn) {
                        self.active.remove(&session);
                    }
                }
                Effect::AttemptSettled { .. }
                | Effect::JoinTimedOut { .. }
                | Effect::Deliver { .. }
                | Effect::RecoveryStarted { .. }
                | Effect::RecoveryExhausted { .. }
                | Effect::FailureReported { .. }
                | Effect::TurnSilent { .. } => {}
            }
        }
    }

    /// Lets time run to `target`, firing every timer due on the way.
    fn advance_to(&mut self, target: Timestamp) -> Result<(), Finding> {
        let mut firings = 0;
        while let Some(at) = self.driver.poll_timeout() {
            if at > target {
                break;
            }
            firings += 1;
            if firings > FIRINGS_PER_ADVANCE {
                return Err(self.finding(
                    "timers-progress",
                    format!("{firings} timer firings before {target}: the core re-arms timers in the past"),
                ));
            }
            self.now = self.now.max(at);
            self.driver.handle_timeout(self.now);
            let effects = self.drain();
            if self.trace {
                eprintln!("  {} timeout", self.now);
                for e in &effects {
                    eprintln!("    effect {e:?}");
                }
            }
            let now = self.now;
            self.checked(&|| format!("the timers due at {now}"))?;
            self.record(None, &effects);
            if self.driver.poll_timeout().is_some_and(|t| t <= at) {
                return Err(self.finding(
                    "timers-progress",
                    format!("handle_timeout({now}) left a timer due at or before {at}"),
                ));
            }
        }
        self.now = self.now.max(target);
        Ok(())
    }

    fn restart(&mut self) -> Result<(), Finding> {
        let snap = self.driver.core().snapshot();
        let mut core = Core::restore(&snap).map_err(|e| {
            self.finding(
                "restore-own-snapshot",
                format!("the core's own snapshot does not restore: {e}"),
            )
        })?;
        core.set_mutant(self.mutant);
        self.driver.restore(self.now, core);
        let effects = self.drain();
        if self.trace {
            eprintln!(
                "  {} restart into epoch {:?}",
                self.now,
                self.driver.core().epoch()
            );
            for e in &effects {
                eprintln!("    effect {e:?}");
            }
        }
        self.checked(&|| "a restart".to_owned())?;
        self.record(None, &effects);
        Ok(())
    }

    fn stamp(&mut self, b: u8) -> ErrorStamp {
        let raw = if b == 0 {
            self.next_stamp += 1;
            self.next_stamp
        } else {
            u64::from(b)
        };
        ErrorStamp::new(raw).expect("stamps are non-zero")
    }

    fn token(&mut self) -> ConversationToken {
        self.next_token += 1;
        ConversationToken::new(self.next_token).expect("tokens are non-zero")
    }

    fn turn_of(&self, s: SessionId, p: u8) -> TurnId {
        if p % 4 != 3 {
            if let Some(t) = self.last_turn.get(&s) {
                return *t;
            }
        }
        TurnId::new(u64::from(p / 4) + 1).expect("non-zero")
    }

    fn pick_attempt(&self, s: SessionId, e: ExecutionId, pick: APick) -> Option<AttemptId> {
        let epoch = self.driver.core().epoch();
        match pick {
            APick::Newest => self
                .started
                .iter()
                .rev()
                .find(|(ss, _)| *ss == s)
                .map(|(_, a)| *a),
            APick::OfExecution => self.bindings.get(&e).map(|(a, _)| *a),
            APick::Nth(k) => {
                if self.started.is_empty() {
                    None
                } else {
                    Some(self.started[usize::from(k) % self.started.len()].1)
                }
            }
            APick::Unminted => AttemptId::new(epoch, MAX_ATTEMPT_SEQ),
            APick::Missing => None,
            APick::Raw(k) if k < 128 => AttemptId::new(epoch, u64::from(k) + 1),
            APick::Raw(k) => epoch
                .next()
                .and_then(|next| AttemptId::new(next, u64::from(k - 127))),
        }
    }

    fn pick_generation(&self, e: ExecutionId, pick: GPick) -> Generation {
        let current = self.bindings.get(&e).map_or(1, |(_, g)| g.get());
        let raw = match pick {
            GPick::Current => current,
            GPick::Older(k) => current.saturating_sub(u64::from(k % 4) + 1).max(1),
            GPick::Future(k) => current + u64::from(k % 4) + 1,
            GPick::Raw(k) => u64::from(k) + 1,
        };
        Generation::new(raw).expect("at least 1")
    }

    fn event(&mut self, s: SessionId, ev: Ev) -> RuntimeEvent {
        match ev {
            Ev::Boot => RuntimeEvent::BootReady,
            Ev::AgentReady(p) => RuntimeEvent::AgentReady {
                load_capability: capability(p),
            },
            Ev::Created(p) => RuntimeEvent::ConversationCreated {
                token: ConversationToken::new(u64::from(p) + 1).expect("non-zero"),
            },
            Ev::Loaded => RuntimeEvent::ConversationLoaded,
            Ev::LoadFailed(p, q) => RuntimeEvent::LoadFailed(load_outcome(p, q)),
            Ev::StartFailed(p) => RuntimeEvent::StartFailed {
                stamp: self.stamp(p),
            },
            Ev::Accepted(p) => RuntimeEvent::PromptAccepted {
                turn: self.turn_of(s, p),
            },
            Ev::Stream(p, q) => RuntimeEvent::Stream {
                turn: self.turn_of(s, p),
                seq: u64::from(q),
                bytes: 64,
            },
            Ev::Completed(p) => RuntimeEvent::PromptCompleted {
                turn: self.turn_of(s, p),
            },
            Ev::Failed(p, q) => RuntimeEvent::PromptFailed {
                turn: self.turn_of(s, p),
                stamp: self.stamp(q),
            },
            Ev::Exited(p) => RuntimeEvent::Exited {
                stamp: self.stamp(p),
            },
        }
    }

    fn next_turn(&mut self, s: SessionId) -> TurnId {
        let n = self.next_turn.entry(s).or_insert(0);
        *n += 1;
        TurnId::new(*n).expect("non-zero")
    }

    /// Applies one operation.
    pub(crate) fn apply(&mut self, op: Op) -> Result<(), Finding> {
        if self.trace {
            eprintln!("op {op:?}");
        }
        match op {
            Op::Resume(s) => {
                self.input(Input::Resume { session: sid(s) })?;
            }
            Op::Prompt(s) => {
                let session = sid(s);
                let turn = self.next_turn(session);
                self.last_turn.insert(session, turn);
                self.input(Input::Prompt { session, turn })?;
            }
            Op::PromptTurn(s, t) => {
                let session = sid(s);
                let turn = TurnId::new(u64::from(t) + 1).expect("non-zero");
                let n = self.next_turn.entry(session).or_insert(0);
                *n = (*n).max(turn.get());
                self.last_turn.insert(session, turn);
                self.input(Input::Prompt { session, turn })?;
            }
            Op::Cancel(s) => {
                self.input(Input::Cancel { session: sid(s) })?;
            }
            Op::React {
                s,
                how,
                pick,
                d1,
                d2,
            } => self.react(sid(s), how, pick, d1, d2)?,
            Op::Bind { s, attempt, exec } => {
                let session = sid(s);
                let execution = eid(exec);
                if let Some(attempt) = self.pick_attempt(session, execution, attempt) {
                    self.input(Input::Bound {
                        session,
                        attempt,
                        execution,
                    })?;
                }
            }
            Op::Forge {
                s,
                exec,
                attempt,
                generation,
                event,
            } => {
                let session = sid(s);
                let execution = eid(exec);
                let attempt = self.pick_attempt(session, execution, attempt);
                let generation = self.pick_generation(execution, generation);
                let event = self.event(session, event);
                self.cb(session, attempt, execution, generation, event)?;
            }
            Op::Replay(k) => {
                if !self.callbacks.is_empty() {
                    let i = self.callbacks.len() - 1 - usize::from(k) % self.callbacks.len();
                    let input = self.callbacks[i].clone();
                    self.input(input)?;
                }
            }
            Op::Perform(k) => {
                if !self.leases.is_empty() {
                    let i = self.leases.len() - 1 - usize::from(k) % self.leases.len();
                    let lease = self.leases[i];
                    self.input(Input::Perform { lease })?;
                }
            }
            Op::Stopped(e) => {
                self.input(Input::Stopped { execution: eid(e) })?;
            }
            Op::Dismiss(s) => {
                self.input(Input::DismissFailure { session: sid(s) })?;
            }
            Op::Churn(s, n) => {
                let session = sid(s);
                for _ in 0..=(n % 24) {
                    self.input(Input::Resume { session })?;
                    self.input(Input::Cancel { session })?;
                }
            }
            Op::Advance(a) => {
                let target = match a {
                    Adv::Ms(ms) => self.now.plus_millis(u64::from(ms)),
                    Adv::Tenths(t) => self.now.plus_millis(u64::from(t) * 100),
                    Adv::NextTimer => match self.driver.poll_timeout() {
                        Some(t) => t.max(self.now),
                        None => self.now,
                    },
                    Adv::Far => self.now.plus_millis(LIVENESS_STEP_MS),
                };
                self.advance_to(target)?;
            }
            Op::Restart => self.restart()?,
            Op::ClockBack(ms) => {
                self.now =
                    Timestamp::from_millis(self.now.as_millis().saturating_sub(u64::from(ms) * 10));
            }
            Op::StopAll => self.answer_stops()?,
            Op::Drive(s, n) => {
                let session = sid(s);
                for _ in 0..=(n % 8) {
                    let Some(item) = self.queue(session).pop_front() else {
                        break;
                    };
                    self.answer(session, item, How::Good, n / 8, 0, 0, None)?;
                }
            }
        }
        Ok(())
    }

    fn answer_stops(&mut self) -> Result<(), Finding> {
        let stops: Vec<ExecutionId> = self.stops.iter().copied().collect();
        for execution in stops {
            self.input(Input::Stopped { execution })?;
        }
        self.stops.clear();
        Ok(())
    }

    fn react(&mut self, s: SessionId, how: How, pick: u8, d1: u8, d2: u8) -> Result<(), Finding> {
        let q = self.queue(s);
        if q.is_empty() {
            return Ok(());
        }
        let idx = usize::from(pick) % q.len();
        let item = q.remove(idx).expect("index within the queue");
        match how {
            How::Drop => Ok(()),
            How::Defer => {
                self.queue(s).push_back(item);
                Ok(())
            }
            _ => self.answer(s, item, how, d1, d2, idx, None),
        }
    }

    /// Answers one item. `requeue_at` is where an item that stays (a running prompt) goes
    /// back; `exec` overrides the execution a start binds (the liveness phase uses fresh
    /// ones).
    #[allow(clippy::too_many_arguments)]
    fn answer(
        &mut self,
        s: SessionId,
        item: Todo,
        how: How,
        d1: u8,
        d2: u8,
        requeue_at: usize,
        exec: Option<ExecutionId>,
    ) -> Result<(), Finding> {
        match item {
            Todo::Start { attempt } => {
                let execution = exec.unwrap_or_else(|| eid(d1));
                let bind = Input::Bound {
                    session: s,
                    attempt,
                    execution,
                };
                let mut v = self.input(bind.clone())?;
                if how == How::Duplicate {
                    let again = self.input(bind)?;
                    if let Verdict::Bound { .. } = again {
                        v = again;
                    }
                }
                if let Verdict::Bound { generation } = v {
                    match how {
                        How::Fail => {
                            let stamp = self.stamp(d2);
                            self.cb(
                                s,
                                Some(attempt),
                                execution,
                                generation,
                                RuntimeEvent::StartFailed { stamp },
                            )?;
                        }
                        How::Exit => {
                            let stamp = self.stamp(d2);
                            self.cb(
                                s,
                                Some(attempt),
                                execution,
                                generation,
                                RuntimeEvent::Exited { stamp },
                            )?;
                        }
                        _ => self.queue(s).push_back(Todo::Boot {
                            attempt,
                            execution,
                            generation,
                        }),
                    }
                }
            }
            Todo::Boot {
                attempt,
                execution,
                generation,
            } => {
                let a = Some(attempt);
                match how {
                    How::Fail => {
                        let stamp = self.stamp(d2);
                        self.cb(
                            s,
                            a,
                            execution,
                            generation,
                            RuntimeEvent::StartFailed { stamp },
                        )?;
                    }
                    How::Exit => {
                        let stamp = self.stamp(d2);
                        self.cb(s, a, execution, generation, RuntimeEvent::Exited { stamp })?;
                    }
                    _ => {
                        self.cb(s, a, execution, generation, RuntimeEvent::BootReady)?;
                        let ready = RuntimeEvent::AgentReady {
                            load_capability: capability(d1),
                        };
                        self.cb(s, a, execution, generation, ready.clone())?;
                        if how == How::Duplicate {
                            self.cb(s, a, execution, generation, ready)?;
                        }
                    }
                }
            }
            Todo::Conversation {
                attempt,
                lease,
                execution,
                generation,
                load,
                performed,
            } => {
                if how == How::Exit {
                    let stamp = self.stamp(d2);
                    self.cb(
                        s,
                        attempt,
                        execution,
                        generation,
                        RuntimeEvent::Exited { stamp },
                    )?;
                    return Ok(());
                }
                let ok = performed || self.input(Input::Perform { lease })? == Verdict::Accepted;
                if !ok {
                    return Ok(());
                }
                if how == How::Hold {
                    self.queue(s).push_back(Todo::Conversation {
                        attempt,
                        lease,
                        execution,
                        generation,
                        load,
                        performed: true,
                    });
                    return Ok(());
                }
                let event = match (how, load) {
                    (How::Fail, true) => RuntimeEvent::LoadFailed(load_outcome(d1, d2)),
                    (How::Fail, false) => RuntimeEvent::StartFailed {
                        stamp: self.stamp(d2),
                    },
                    (_, true) => RuntimeEvent::ConversationLoaded,
                    (_, false) => RuntimeEvent::ConversationCreated {
                        token: self.token(),
                    },
                };
                self.cb(s, attempt, execution, generation, event.clone())?;
                if how == How::Duplicate {
                    self.cb(s, attempt, execution, generation, event)?;
                }
            }
            Todo::Dispatch {
                attempt,
                lease,
                execution,
                generation,
                turn,
                performed,
            } => {
                if how == How::Exit {
                    let stamp = self.stamp(d2);
                    self.cb(
                        s,
                        attempt,
                        execution,
                        generation,
                        RuntimeEvent::Exited { stamp },
                    )?;
                    return Ok(());
                }
                let ok = performed || self.input(Input::Perform { lease })? == Verdict::Accepted;
                if !ok {
                    return Ok(());
                }
                match how {
                    How::Hold => self.queue(s).push_back(Todo::Dispatch {
                        attempt,
                        lease,
                        execution,
                        generation,
                        turn,
                        performed: true,
                    }),
                    How::Fail => {
                        let stamp = self.stamp(d2);
                        self.cb(
                            s,
                            attempt,
                            execution,
                            generation,
                            RuntimeEvent::PromptFailed { turn, stamp },
                        )?;
                    }
                    _ => {
                        let accepted = RuntimeEvent::PromptAccepted { turn };
                        let v = self.cb(s, attempt, execution, generation, accepted.clone())?;
                        if how == How::Duplicate {
                            self.cb(s, attempt, execution, generation, accepted)?;
                        }
                        if v == Verdict::Accepted {
                            self.queue(s).push_back(Todo::Running {
                                attempt,
                                execution,
                                generation,
                                turn,
                                next: 1,
                            });
                        }
                    }
                }
            }
            Todo::Running {
                attempt,
                execution,
                generation,
                turn,
                next,
            } => match how {
                How::Stream | How::Hold | How::Duplicate => {
                    let (first, count) = match how {
                        How::Stream if d1 == u8::MAX => (next, STREAM_BURST),
                        How::Stream => (next, u64::from(d1 % 16) + 1),
                        How::Hold => (next, 1),
                        // A repeat of the last event, or (odd d1) one after a gap.
                        _ if d1.is_multiple_of(2) && next > 1 => (next - 1, 1),
                        _ => (next + 1, 1),
                    };
                    let mut sent = 0;
                    for i in 0..count {
                        let event = RuntimeEvent::Stream {
                            turn,
                            seq: first + i,
                            bytes: u32::from(d2) * 16,
                        };
                        if self.cb(s, attempt, execution, generation, event)? != Verdict::Accepted {
                            break;
                        }
                        sent += 1;
                    }
                    let next = if first == next { next + sent } else { next };
                    let q = self.queue(s);
                    let at = requeue_at.min(q.len());
                    q.insert(
                        at,
                        Todo::Running {
                            attempt,
                            execution,
                            generation,
                            turn,
                            next,
                        },
                    );
                }
                _ => {
                    let event = match how {
                        How::Fail => RuntimeEvent::PromptFailed {
                            turn,
                            stamp: self.stamp(d2),
                        },
                        How::Exit => RuntimeEvent::Exited {
                            stamp: self.stamp(d2),
                        },
                        _ => RuntimeEvent::PromptCompleted { turn },
                    };
                    self.cb(s, attempt, execution, generation, event)?;
                }
            },
            Todo::CancelTurn {
                attempt,
                execution,
                generation,
                turn,
            } => {
                let event = match how {
                    How::Fail => RuntimeEvent::PromptFailed {
                        turn,
                        stamp: self.stamp(d2),
                    },
                    How::Exit => RuntimeEvent::Exited {
                        stamp: self.stamp(d2),
                    },
                    // The provider acknowledges a cancel by ending the turn.
                    _ => RuntimeEvent::PromptCompleted { turn },
                };
                self.cb(s, attempt, execution, generation, event)?;
            }
        }
        Ok(())
    }

    fn quiet(&self) -> bool {
        let asked = self.stops.is_empty()
            && self.active.is_empty()
            && self.todo.values().all(|q| q.is_empty());
        // Work this embedder no longer tracks (an answer it dropped, or a restored core's
        // work it was never asked for) still keeps the core busy: only the core knows
        // whether it is settled.
        asked
            && self
                .driver
                .core()
                .known_sessions()
                .into_iter()
                .all(|s| !self.driver.core().session_busy(s))
    }

    /// The liveness phase: faults stop, every runtime answers well, every teardown
    /// finishes, time runs out; then nothing may be left hanging.
    pub(crate) fn settle(&mut self) -> Result<(), Finding> {
        self.op = None;
        if self.trace {
            eprintln!("liveness phase");
        }
        for _ in 0..LIVENESS_ROUNDS {
            self.answer_stops()?;
            let sessions: Vec<SessionId> = self.todo.keys().copied().collect();
            for s in sessions {
                for _ in 0..LIVENESS_ITEMS_PER_ROUND {
                    let Some(item) = self.queue(s).pop_front() else {
                        break;
                    };
                    // A fresh execution per attempt: a healthy world does not reuse an ID
                    // that may still be tearing down.
                    let fresh = match item {
                        Todo::Start { attempt } => ExecutionId::new(attempt.raw()),
                        _ => None,
                    };
                    self.answer(s, item, How::Good, 0, 0, 0, fresh)?;
                }
            }
            // A turn whose runtime's last word was lost: the provider finishes it. With the
            // idle rule on, the core must give such a turn up by itself: its runtime stays
            // silent, as a wedged agent's would.
            let idle_rule = self.driver.core().config().turn_idle_ms > 0;
            let active: Vec<(SessionId, TurnId)> = if idle_rule {
                Vec::new()
            } else {
                self.active.iter().map(|(s, t)| (*s, *t)).collect()
            };
            for (s, turn) in active {
                if let Some(&(execution, generation)) = self.dispatched.get(&(s, turn)) {
                    let attempt = self.bound_to.get(&(execution, generation)).copied();
                    self.cb(
                        s,
                        attempt,
                        execution,
                        generation,
                        RuntimeEvent::PromptCompleted { turn },
                    )?;
                }
            }
            let mut target = self.now.plus_millis(LIVENESS_STEP_MS);
            if !self.quiet() {
                // Time runs out: on to the core's next deadline when it is further than a
                // round, as it is when the embedder's clock went back behind the core's
                // (`Op::ClockBack`), or for a restored core's own configuration.
                if let Some(next) = self.driver.poll_timeout() {
                    target = target.max(next);
                }
            }
            self.advance_to(target)?;
            if self.quiet() {
                break;
            }
        }
        self.answer_stops()?;
        match self.driver.observer().auditor() {
            Some(audit) => audit.check_quiescent().map_err(|v| {
                self.finding(v.rule, format!("{} (after the liveness phase)", v.detail))
            }),
            None => self.check_no_session_busy(),
        }
    }

    /// A world around a core restored from `bytes` of unknown history: no reference
    /// model, and the embedder knows of the restored executions only what the core tells
    /// it ([`Core::known_executions`]), as an embedder that lost its own records would.
    pub(crate) fn restored(core: Core, mutant: Option<Mutant>) -> World {
        let mut world = World::new(core.config().clone(), mutant);
        let checker = Checker::without_model(core.config());
        world.driver = Driver::with_observer(core, checker).lease_check(LeaseCheck::ByCaller);
        world.driver.set_mutant(mutant);
        for k in world.driver.core().known_executions() {
            world.bindings.insert(k.execution, (k.owner, k.generation));
            world.bound_to.insert((k.execution, k.generation), k.owner);
        }
        let effects = world.drain();
        world.record(None, &effects);
        world
    }

    /// What an embedder does after a restart: every runtime the core knows died with the
    /// previous incarnation, so each is reported exited by its owner, then stopped.
    pub(crate) fn report_restart(&mut self) -> Result<(), Finding> {
        self.op = None;
        let known = self.driver.core().known_executions();
        for k in &known {
            let stamp = self.stamp(0);
            self.cb(
                k.session,
                Some(k.owner),
                k.execution,
                k.generation,
                RuntimeEvent::Exited { stamp },
            )?;
        }
        for k in &known {
            self.input(Input::Stopped {
                execution: k.execution,
            })?;
        }
        Ok(())
    }

    /// The liveness judgement without a reference model: no session is left busy (a live
    /// attempt, a turn, or a teardown) once the world has been well behaved for long
    /// enough.
    fn check_no_session_busy(&self) -> Result<(), Finding> {
        let core = self.driver.core();
        for session in core.known_sessions() {
            if core.session_busy(session) {
                return Err(self.finding(
                    "liveness-restored",
                    format!(
                        "session {session} still busy after the liveness phase (live attempt {:?}, runtime {:?})",
                        core.live_attempt(session),
                        core.runtime(session)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether the operation budget is used up.
    pub(crate) fn budget_left(&self) -> bool {
        self.inputs < MAX_INPUTS
    }

    pub(crate) fn at_op(&mut self, i: usize) {
        self.op = Some(i);
    }
}

/// Runs a whole input and returns the world after the liveness phase. `in_flight` sees
/// the core after the last operation, before the liveness phase settles everything.
pub(crate) fn run_world(
    data: &[u8],
    mutant: Option<Mutant>,
    in_flight: &mut dyn FnMut(&Core) -> Result<(), Finding>,
) -> Result<World, Finding> {
    let (header, ops) = decode(data);
    let mut world = World::new(header.config(), mutant);
    for (i, op) in ops.into_iter().enumerate() {
        if !world.budget_left() {
            break;
        }
        world.at_op(i);
        world.apply(op)?;
    }
    in_flight(world.driver.core())?;
    world.settle()?;
    Ok(world)
}

/// The `callback_orderings` entry point.
pub fn run(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    run_world(data, mutant, &mut |_| Ok(())).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_round_trip_through_their_encoding() {
        let ops = vec![
            Op::Resume(1),
            Op::Prompt(2),
            Op::PromptTurn(0, 9),
            Op::Cancel(1),
            Op::React {
                s: 0,
                how: How::Hold,
                pick: 3,
                d1: 255,
                d2: 7,
            },
            Op::Bind {
                s: 1,
                attempt: APick::Nth(4),
                exec: 2,
            },
            Op::Forge {
                s: 2,
                exec: 3,
                attempt: APick::Raw(200),
                generation: GPick::Future(2),
                event: Ev::LoadFailed(14, 33),
            },
            Op::Replay(5),
            Op::Perform(1),
            Op::Stopped(3),
            Op::Dismiss(0),
            Op::Churn(0, 16),
            Op::Advance(Adv::Tenths(10)),
            Op::Advance(Adv::NextTimer),
            Op::Restart,
            Op::ClockBack(9),
            Op::StopAll,
            Op::Drive(2, 7),
        ];
        let header = Header {
            schedule: Header::SCHEDULE_ONE,
            sessions: 2,
            deadlines: 1,
        };
        assert_eq!(decode(&encode(header, &ops)), (header, ops));
    }

    #[test]
    fn every_header_gives_a_valid_config() {
        for schedule in 0..4 {
            for sessions in 0..4 {
                for deadlines in 0..4 {
                    let h = Header {
                        schedule,
                        sessions,
                        deadlines,
                    };
                    assert_eq!(h.config().validate(), Ok(()), "{h:?}");
                }
            }
        }
    }

    #[test]
    fn empty_and_short_inputs_are_valid() {
        for data in [&[][..], &[0], &[0, 0, 0], &[255, 255, 255, 255]] {
            assert_eq!(run(data, None), Ok(()));
        }
    }
}
