//! The engine's state image: the core's snapshot plus what the engine itself must
//! remember across a restart. The shell writes it atomically (`palisade_embed::state_file`).
//!
//! The core snapshots its own state ([`Core::snapshot`](palisade_core::Core::snapshot)).
//! The engine adds what only it knows: which ACP session id each conversation token
//! stands for, the text of each turn in flight (a recovery re-prompt needs it), which
//! executions it had bound (their processes died with it, and the restored core must hear
//! so), and its ID counters (so no ID is ever reused).
//!
//! Layout, all integers little-endian:
//!
//! ```text
//! "PLSV" | version: u16 = 2 | crc32: u32 | saved_at_ms: u64 | header_len: u32 | header (JSON) | core snapshot
//! ```
//!
//! `crc32` (CRC-32/ISO-HDLC, the one of zip and PNG) covers every byte after it. The shell
//! writes the file with write-temp, fsync, rename, fsync-directory: after a crash the file
//! is either the old state or the new one, never a mix; the checksum refuses what the disk
//! or anything else changed since (issue 28, item 5: 15 of 909 single-bit flips of a state
//! file were accepted and hung the restart). Version 1 files (the same without `crc32`) are
//! still read.

use std::io;

use palisade_core::{
    AttemptId, ConversationToken, ExecutionId, Generation, RestoreError, SessionId, TurnId,
};
use serde::{Deserialize, Serialize};

/// The file's magic bytes.
pub const STATE_MAGIC: &[u8; 4] = b"PLSV";
/// Bump on any change to the layout or the header.
pub const STATE_VERSION: u16 = 2;
/// The version before the checksum, still read.
const STATE_VERSION_1: u16 = 1;
/// Bytes before `saved_at_ms`: magic, version and checksum.
const PREFIX_LEN: usize = 10;
/// Where the checksum is.
const CRC_AT: usize = 6;
/// Bytes before the header: prefix, `saved_at_ms`, `header_len`.
const FIXED_LEN: usize = PREFIX_LEN + 8 + 4;
/// Where the part that is compared to decide whether anything changed begins: right after
/// `saved_at_ms`, which changes with every write.
pub const BODY_OFFSET: usize = PREFIX_LEN + 8;
/// The latest `saved_at_ms` a state file may carry: 9999-12-31T23:59:59.999Z in Unix
/// milliseconds. The supervisor's clock is Unix milliseconds and resumes from this time;
/// a later one leaves no room for the core's deadlines (they saturate at the end of time
/// and fire at once), so every attempt would fail on every start.
pub const MAX_SAVED_AT_MS: u64 = 253_402_300_799_999;

/// The supervisor's own state, beside the core's snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Header {
    pub(crate) next_execution: u64,
    pub(crate) next_turn: u64,
    pub(crate) next_stamp: u64,
    pub(crate) next_token: u64,
    pub(crate) sessions: Vec<SessionRecord>,
    pub(crate) executions: Vec<ExecutionRecord>,
    /// Events the caller had not taken yet, in order: they are handed out first after a
    /// restart (write-ahead: a step's state is written before its events leave).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) undelivered: Vec<crate::events::SessionEvent>,
    /// The client's `initialize` params, which every runtime is initialized with (a
    /// proxy's client): a restart's runtimes start before the client is back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_hello: Option<palisade_wire::RawJson>,
    /// The params of the client's successful `authenticate`, which every runtime gets
    /// after `initialize` (agents that authenticate per process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_auth: Option<palisade_wire::RawJson>,
    /// Runtimes of earlier incarnations whose kill the platform has not confirmed (a
    /// sidecar's runtimes outlive their orchestrator): a restart kills them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) survivors: Vec<ExecutionId>,
}

/// What the supervisor remembers of one session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub(crate) session: SessionId,
    /// The conversation token the core holds, and the ACP session id it stands for.
    pub(crate) conversation: Option<(ConversationToken, String)>,
    /// The turn in flight and the caller's original prompt.
    pub(crate) turn: Option<(TurnId, crate::events::PromptContent)>,
    /// The caller's name for the session (a proxy's upstream session id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) label: Option<String>,
    /// The params of the client's `session/new` its conversations are made with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) params: Option<palisade_wire::RawJson>,
    /// Output the core admitted for the caller that was still queued or being batched:
    /// the turn, and each event's seq, update and wire size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) queued_output: Option<(TurnId, Vec<QueuedOutput>)>,
}

/// One admitted output event not yet batched for the caller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct QueuedOutput {
    pub(crate) seq: u64,
    pub(crate) update: palisade_wire::RawJson,
    pub(crate) wire_bytes: usize,
}

/// A [`Header`] as the engine writes it: borrowed from the engine instead of copied (a
/// write covers every queued output and every event not yet taken, hundreds of kilobytes
/// under a burst). It serializes exactly as a `Header` of the same values does (a
/// reference serializes as what it points to); [`decode`] reads it back as a `Header`.
#[derive(Serialize)]
pub(crate) struct HeaderOut<'a> {
    pub(crate) next_execution: u64,
    pub(crate) next_turn: u64,
    pub(crate) next_stamp: u64,
    pub(crate) next_token: u64,
    pub(crate) sessions: Vec<SessionRecordOut<'a>>,
    pub(crate) executions: Vec<ExecutionRecord>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) undelivered: Vec<&'a crate::events::SessionEvent>,
    #[serde(skip_serializing_if = "is_none")]
    pub(crate) client_hello: &'a Option<palisade_wire::RawJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) client_auth: Option<&'a palisade_wire::RawJson>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) survivors: Vec<ExecutionId>,
}

/// A [`SessionRecord`] borrowed (see [`HeaderOut`]).
#[derive(Serialize)]
pub(crate) struct SessionRecordOut<'a> {
    pub(crate) session: SessionId,
    pub(crate) conversation: &'a Option<(ConversationToken, String)>,
    pub(crate) turn: &'a Option<(TurnId, crate::events::PromptContent)>,
    #[serde(skip_serializing_if = "is_none")]
    pub(crate) label: &'a Option<String>,
    #[serde(skip_serializing_if = "is_none")]
    pub(crate) params: &'a Option<palisade_wire::RawJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queued_output: Option<(TurnId, Vec<QueuedOutputOut<'a>>)>,
}

/// A [`QueuedOutput`] borrowed (see [`HeaderOut`]).
#[derive(Serialize)]
pub(crate) struct QueuedOutputOut<'a> {
    pub(crate) seq: u64,
    pub(crate) update: &'a palisade_wire::RawJson,
    pub(crate) wire_bytes: usize,
}

#[allow(clippy::ref_option)] // serde's `skip_serializing_if` passes the field by reference.
fn is_none<T>(value: &&Option<T>) -> bool {
    value.is_none()
}

/// An execution that was bound when the state was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExecutionRecord {
    pub(crate) execution: ExecutionId,
    pub(crate) session: SessionId,
    pub(crate) attempt: AttemptId,
    pub(crate) generation: Generation,
}

/// Why a state file could not be used. A supervisor never starts fresh over a state file
/// it cannot read: that would restart the epoch and could reuse attempt IDs.
#[derive(Debug)]
pub enum StateError {
    /// Reading the file failed.
    Io(io::Error),
    /// Shorter than its header says.
    Truncated,
    /// Not a supervisor state file.
    BadMagic,
    /// The bytes are not the ones written: the checksum does not match.
    Checksum {
        /// The checksum the file carries.
        stored: u32,
        /// The checksum of its bytes.
        computed: u32,
    },
    /// Written by another version.
    UnsupportedVersion(u16),
    /// `saved_at_ms` is past [`MAX_SAVED_AT_MS`]: no clock of ours wrote it.
    ImpossibleSavedAt(u64),
    /// The supervisor's header does not decode.
    Header(String),
    /// The core's snapshot was refused.
    Core(RestoreError),
    /// The header and the core's snapshot disagree (a writer that was not ours, or a bug):
    /// a turn in flight, a bound execution or its generation that one has and the other
    /// does not. Used as it is, the restart would hang or never resume the turn.
    Contradiction(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Io(error) => write!(f, "state file: {error}"),
            StateError::Truncated => f.write_str("state file truncated"),
            StateError::BadMagic => f.write_str("not a palisade supervisor state file"),
            StateError::Checksum { stored, computed } => write!(
                f,
                "state file damaged: its checksum is {stored:08x}, its bytes' is {computed:08x} (the file changed after it was written)"
            ),
            StateError::UnsupportedVersion(v) => {
                write!(f, "state file version {v}, expected {STATE_VERSION}")
            }
            StateError::ImpossibleSavedAt(ms) => write!(
                f,
                "state file saved at {ms} ms, past the latest time a state file may carry ({MAX_SAVED_AT_MS} ms, the year 9999)"
            ),
            StateError::Header(error) => write!(f, "state file header: {error}"),
            StateError::Core(error) => write!(f, "core snapshot: {error}"),
            StateError::Contradiction(what) => {
                write!(f, "state file contradicts itself: {what}")
            }
        }
    }
}

impl std::error::Error for StateError {}

/// Checks the header against the restored core (issue 28, item 5): every turn the core
/// has in flight is the header's turn of that session, with its text (a recovery re-prompt
/// needs it), and every execution the core believes exists is one the header records as
/// bound, under the same session and generation (its exit is reported from the header:
/// one left out would never be, and the session would wait for it forever).
pub(crate) fn cross_check(header: &Header, core: &palisade_core::Core) -> Result<(), StateError> {
    for session in core.known_sessions() {
        let Some(turn) = core.active_turn(session) else {
            continue;
        };
        let recorded = header
            .sessions
            .iter()
            .find(|r| r.session == session)
            .and_then(|r| r.turn.as_ref())
            .map(|(t, _)| *t);
        if recorded != Some(turn) {
            return Err(StateError::Contradiction(format!(
                "the core has turn {turn} of session {session} in flight, the header {}",
                match recorded {
                    Some(t) => format!("turn {t}"),
                    None => "no turn".into(),
                }
            )));
        }
    }
    for known in core.known_executions() {
        let recorded = header
            .executions
            .iter()
            .find(|r| r.execution == known.execution);
        match recorded {
            Some(r) if r.session == known.session && r.generation == known.generation => {}
            Some(r) => {
                return Err(StateError::Contradiction(format!(
                    "execution {} is session {}'s at generation {} in the core, session {}'s at generation {} in the header",
                    known.execution, known.session, known.generation, r.session, r.generation
                )))
            }
            None => {
                return Err(StateError::Contradiction(format!(
                    "execution {} (session {}, generation {}) is in the core and not in the header",
                    known.execution, known.session, known.generation
                )))
            }
        }
    }
    Ok(())
}

/// Encodes a state image; `header` is a [`HeaderOut`] (or, in tests, a [`Header`]).
pub(crate) fn encode<H: Serialize>(saved_at_ms: u64, header: &H, core_snapshot: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FIXED_LEN + core_snapshot.len());
    out.extend_from_slice(STATE_MAGIC);
    out.extend_from_slice(&STATE_VERSION.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&saved_at_ms.to_le_bytes());
    // The header's length, once it is written in place.
    out.extend_from_slice(&[0; 4]);
    serde_json::to_writer(&mut out, header)
        .expect("the header has string keys and plain values only, so it always serializes");
    let header_len = u32::try_from(out.len() - FIXED_LEN)
        .expect("the header is bounded far below 4 GiB (see Header)");
    out[FIXED_LEN - 4..FIXED_LEN].copy_from_slice(&header_len.to_le_bytes());
    out.extend_from_slice(core_snapshot);
    let crc = crc32(&out[PREFIX_LEN..]);
    out[CRC_AT..PREFIX_LEN].copy_from_slice(&crc.to_le_bytes());
    out
}

/// CRC-32/ISO-HDLC (reflected, polynomial 0x04C11DB7), by `crc32fast`. It covers the
/// whole image, whose queued output can be hundreds of kilobytes, once per group commit: a
/// byte-at-a-time table was a fifth of the proxy's time with `--state`.
fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// When the state image in `bytes` was saved (Unix milliseconds): the clock a restarted
/// shell resumes from. Checks the prefix only; the restore checks the rest.
pub fn saved_at_ms(bytes: &[u8]) -> Result<u64, StateError> {
    decode(bytes).map(|decoded| decoded.saved_at_ms)
}

/// A decoded state image: when it was saved, the supervisor's header, the core's bytes.
pub(crate) struct Decoded<'a> {
    pub(crate) saved_at_ms: u64,
    pub(crate) header: Header,
    pub(crate) core_snapshot: &'a [u8],
}

/// Decodes a state image; never panics on bad bytes.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded<'_>, StateError> {
    if bytes.len() < FIXED_LEN {
        return Err(StateError::Truncated);
    }
    if &bytes[..4] != STATE_MAGIC {
        return Err(StateError::BadMagic);
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version == STATE_VERSION_1 {
        // The same layout without the checksum: what follows the version moves up.
        let mut current = Vec::with_capacity(bytes.len() + 4);
        current.extend_from_slice(&bytes[..CRC_AT]);
        current.extend_from_slice(&[0; 4]);
        current.extend_from_slice(&bytes[CRC_AT..]);
        return decode_checked(&current).map(|decoded| Decoded {
            saved_at_ms: decoded.saved_at_ms,
            header: decoded.header,
            core_snapshot: &bytes[bytes.len() - decoded.core_snapshot.len()..],
        });
    }
    if version != STATE_VERSION {
        return Err(StateError::UnsupportedVersion(version));
    }
    let stored = u32::from_le_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]);
    let computed = crc32(&bytes[PREFIX_LEN..]);
    if stored != computed {
        return Err(StateError::Checksum { stored, computed });
    }
    decode_checked(bytes)
}

/// Decodes a state image of the current layout whose checksum was checked (or that had
/// none).
fn decode_checked(bytes: &[u8]) -> Result<Decoded<'_>, StateError> {
    if bytes.len() < FIXED_LEN {
        return Err(StateError::Truncated);
    }
    let mut saved_at = [0u8; 8];
    saved_at.copy_from_slice(&bytes[PREFIX_LEN..PREFIX_LEN + 8]);
    let saved_at_ms = u64::from_le_bytes(saved_at);
    if saved_at_ms > MAX_SAVED_AT_MS {
        return Err(StateError::ImpossibleSavedAt(saved_at_ms));
    }
    let mut header_len = [0u8; 4];
    header_len.copy_from_slice(&bytes[BODY_OFFSET..FIXED_LEN]);
    let header_len = usize::try_from(u32::from_le_bytes(header_len)).unwrap_or(usize::MAX);
    let header_end = FIXED_LEN
        .checked_add(header_len)
        .filter(|end| *end <= bytes.len())
        .ok_or(StateError::Truncated)?;
    let header: Header = serde_json::from_slice(&bytes[FIXED_LEN..header_end])
        .map_err(|error| StateError::Header(error.to_string()))?;
    Ok(Decoded {
        saved_at_ms,
        header,
        core_snapshot: &bytes[header_end..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            next_execution: 3,
            next_turn: 9,
            next_stamp: 2,
            next_token: 4,
            sessions: vec![SessionRecord {
                session: SessionId::new(1).unwrap(),
                conversation: Some((ConversationToken::new(3).unwrap(), "s-1".into())),
                turn: Some((
                    TurnId::new(8).unwrap(),
                    crate::events::PromptContent::Text("hello".into()),
                )),
                label: None,
                params: None,
                queued_output: None,
            }],
            executions: Vec::new(),
            undelivered: Vec::new(),
            client_hello: None,
            client_auth: None,
            survivors: Vec::new(),
        }
    }

    /// What the engine writes (borrowed) is byte for byte what the same `Header` would be,
    /// every optional member present and absent, and reads back as that `Header`.
    #[test]
    fn the_borrowed_header_writes_what_the_header_would() {
        let update = palisade_wire::RawJson::from_text(r#"{"sessionUpdate":"plan"}"#).unwrap();
        let mut full = header();
        full.sessions.push(SessionRecord {
            session: SessionId::new(2).unwrap(),
            conversation: None,
            turn: None,
            label: Some("pls_n_2".into()),
            params: Some(palisade_wire::RawJson::from_text(r#"{"cwd":"/w"}"#).unwrap()),
            queued_output: Some((
                TurnId::new(5).unwrap(),
                vec![QueuedOutput {
                    seq: 7,
                    update: update.clone(),
                    wire_bytes: 61,
                }],
            )),
        });
        full.undelivered.push(crate::events::SessionEvent::Update {
            session: SessionId::new(2).unwrap(),
            update,
        });
        full.client_hello =
            Some(palisade_wire::RawJson::from_text(r#"{"protocolVersion":1}"#).unwrap());
        full.client_auth =
            Some(palisade_wire::RawJson::from_text(r#"{"methodId":"token"}"#).unwrap());
        full.survivors = vec![ExecutionId::new(2).unwrap()];
        for header in [header(), full] {
            let borrowed = HeaderOut {
                next_execution: header.next_execution,
                next_turn: header.next_turn,
                next_stamp: header.next_stamp,
                next_token: header.next_token,
                sessions: header
                    .sessions
                    .iter()
                    .map(|r| SessionRecordOut {
                        session: r.session,
                        conversation: &r.conversation,
                        turn: &r.turn,
                        label: &r.label,
                        params: &r.params,
                        queued_output: r.queued_output.as_ref().map(|(turn, items)| {
                            let items = items
                                .iter()
                                .map(|q| QueuedOutputOut {
                                    seq: q.seq,
                                    update: &q.update,
                                    wire_bytes: q.wire_bytes,
                                })
                                .collect();
                            (*turn, items)
                        }),
                    })
                    .collect(),
                executions: header.executions.clone(),
                undelivered: header.undelivered.iter().collect(),
                client_hello: &header.client_hello,
                client_auth: header.client_auth.as_ref(),
                survivors: header.survivors.clone(),
            };
            let bytes = encode(1234, &borrowed, b"core");
            assert_eq!(bytes, encode(1234, &header, b"core"));
            assert_eq!(decode(&bytes).unwrap().header, header);
        }
    }

    #[test]
    fn state_round_trips_and_bad_bytes_are_errors() {
        let bytes = encode(1234, &header(), b"core");
        let decoded = decode(&bytes).unwrap();
        assert_eq!(decoded.saved_at_ms, 1234);
        assert_eq!(decoded.header, header());
        assert_eq!(decoded.core_snapshot, b"core");

        assert!(matches!(decode(&bytes[..10]), Err(StateError::Truncated)));
        // Cut inside the header: its checksum no longer matches.
        assert!(matches!(
            decode(&bytes[..FIXED_LEN + 3]),
            Err(StateError::Checksum { .. })
        ));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(matches!(decode(&bad), Err(StateError::BadMagic)));
        let mut bad = bytes.clone();
        bad[4] = 9;
        assert!(matches!(
            decode(&bad),
            Err(StateError::UnsupportedVersion(9))
        ));
        let mut bad = bytes;
        bad[FIXED_LEN] = b'!';
        assert!(matches!(decode(&bad), Err(StateError::Checksum { .. })));
        // A bad header with a checksum that matches it: what was written does not decode.
        let crc = crc32(&bad[PREFIX_LEN..]);
        bad[CRC_AT..PREFIX_LEN].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&bad), Err(StateError::Header(_))));
    }

    #[test]
    fn every_single_bit_flip_is_refused() {
        // Issue 28, item 5: 15 of 909 single-bit flips of a crashed run's state file were
        // accepted (a header that disagrees with the snapshot) and hung the restart.
        let bytes = encode(1234, &header(), b"core snapshot bytes");
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&flipped).is_err(), "bit {bit} flipped was accepted");
        }
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926, "the standard check value");
    }

    #[test]
    fn a_version_1_file_is_still_read() {
        let current = encode(1234, &header(), b"core");
        // Version 1: the same bytes without the checksum.
        let mut old = Vec::new();
        old.extend_from_slice(STATE_MAGIC);
        old.extend_from_slice(&STATE_VERSION_1.to_le_bytes());
        old.extend_from_slice(&current[PREFIX_LEN..]);
        let decoded = decode(&old).unwrap();
        assert_eq!(decoded.saved_at_ms, 1234);
        assert_eq!(decoded.header, header());
        assert_eq!(decoded.core_snapshot, b"core");
    }

    #[test]
    fn a_saved_at_no_clock_wrote_is_refused_at_decode() {
        let ok = encode(MAX_SAVED_AT_MS, &header(), b"core");
        assert_eq!(decode(&ok).unwrap().saved_at_ms, MAX_SAVED_AT_MS);
        for saved_at in [MAX_SAVED_AT_MS + 1, u64::MAX] {
            let bytes = encode(saved_at, &header(), b"core");
            assert!(
                matches!(decode(&bytes), Err(StateError::ImpossibleSavedAt(ms)) if ms == saved_at),
                "saved_at {saved_at}"
            );
        }
    }
}
