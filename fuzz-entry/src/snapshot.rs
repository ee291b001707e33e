//! `snapshot_restore`: the durable state comes back from disk, whatever is on the disk.
//!
//! The first byte picks a mode:
//!
//! - [`MODE_RAW`]: the rest is handed to `Core::restore` as is. It must answer an error or
//!   a core that passes `check_invariants` and keeps passing it while it takes further
//!   inputs (a fixed script that resumes, prompts, cancels, answers teardowns and lets all
//!   time pass), and whose own snapshot restores again. Never a panic, never a loop.
//! - [`MODE_ROUND_TRIP`]: the rest is a `callback_orderings` input; the state it leaves is
//!   snapshotted and restored twice: the epoch advances by one each time, and sessions,
//!   live attempts and conversation tokens survive; equal states give equal bytes.
//! - [`MODE_MUTATED`]: a length byte, that many bytes of a `callback_orderings` input, then
//!   `(offset u16, xor u8)` edits applied to the snapshot of the resulting state before it
//!   is restored as in [`MODE_RAW`]. Real snapshots with a few flipped bytes reach far
//!   deeper into the decoder than random bytes do.

use arbitrary::Unstructured;
use palisade_core::mutants::Mutant;
use palisade_core::*;

use crate::bytes::{byte, take, u16le};
use crate::orderings;
use crate::Finding;

const TARGET: &str = "snapshot_restore";

/// Restore arbitrary bytes.
pub const MODE_RAW: u8 = 0;
/// Round-trip the state a `callback_orderings` input leaves.
pub const MODE_ROUND_TRIP: u8 = 1;
/// Flip bytes of a real snapshot, then restore.
pub const MODE_MUTATED: u8 = 2;
/// Byte edits applied to a snapshot, at most.
pub const MAX_EDITS: usize = 32;
/// Sessions and executions the script addresses in a restored core of unknown content.
const SCRIPT_IDS: u64 = 4;

fn finding(rule: &str, detail: String) -> Finding {
    Finding::new(TARGET, rule, detail)
}

/// Restores `bytes`; a valid core must stay valid under further inputs.
fn restore_any(bytes: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    let mut core = match Core::restore(bytes) {
        Ok(core) => core,
        Err(_) => return Ok(()),
    };
    core.set_mutant(mutant);
    let check = |core: &Core, after: &str| {
        core.check_invariants().map_err(|v| {
            finding(
                &format!("invariant {}", v.rule),
                format!("a restored core after {after}: {}", v.detail),
            )
        })
    };
    check(&core, "restore")?;
    let drain = |core: &mut Core| while core.poll_effect().is_some() {};
    drain(&mut core);
    let mut now = Timestamp::ZERO;
    let id = |n: u64| n.max(1);
    for n in 1..=SCRIPT_IDS {
        let session = SessionId::new(id(n)).expect("non-zero");
        // A turn ID above any the snapshot can hold, so the prompt is new.
        let turn = TurnId::new(u64::MAX - SCRIPT_IDS + n).expect("non-zero");
        for input in [
            Input::Resume { session },
            Input::Prompt { session, turn },
            Input::DismissFailure { session },
            Input::Cancel { session },
        ] {
            let _ = core.handle(now, input.clone());
            drain(&mut core);
            check(&core, &format!("{input:?}"))?;
        }
    }
    for round in 0..3u64 {
        for n in 1..=SCRIPT_IDS {
            let execution = ExecutionId::new(id(n)).expect("non-zero");
            let _ = core.handle(now, Input::Stopped { execution });
            drain(&mut core);
            check(&core, &format!("Stopped({execution})"))?;
        }
        now = match round {
            0 => now.plus_millis(120_000),
            1 => Timestamp::from_millis(u64::MAX / 2),
            _ => Timestamp::MAX,
        };
        core.handle_timeout(now);
        drain(&mut core);
        check(&core, &format!("the timers due at {now}"))?;
    }
    let again = core.snapshot();
    match Core::restore(&again) {
        Ok(restored) => check(&restored, "a second restore"),
        Err(RestoreError::EpochExhausted) => Ok(()),
        Err(e) => Err(finding(
            "restore-own-snapshot",
            format!("a restored core's own snapshot does not restore: {e}"),
        )),
    }
}

/// The public view of a core that a restart must keep.
fn view(core: &Core) -> Vec<(u64, Option<AttemptId>, Option<ConversationToken>)> {
    (1..=u64::from(orderings::SESSIONS))
        .map(|n| {
            let s = SessionId::new(n).expect("non-zero");
            (n, core.live_attempt(s), core.conversation(s))
        })
        .collect()
}

fn round_trip(core: &Core) -> Result<(), Finding> {
    let snap = core.snapshot();
    let restore = |bytes: &[u8], what: &str| {
        Core::restore(bytes).map_err(|e| {
            finding(
                "restore-own-snapshot",
                format!("{what}: the core's own snapshot does not restore: {e}"),
            )
        })
    };
    let r1 = restore(&snap, "first restart")?;
    if restore(&snap, "first restart")?.snapshot() != r1.snapshot() {
        return Err(finding(
            "snapshot-deterministic",
            "one snapshot restored twice gives different states".to_owned(),
        ));
    }
    let r2 = restore(&r1.snapshot(), "second restart")?;
    for (before, after, what) in [(core, &r1, "first"), (&r1, &r2, "second")] {
        after.check_invariants().map_err(|v| {
            finding(
                &format!("invariant {}", v.rule),
                format!("after the {what} restart: {}", v.detail),
            )
        })?;
        if before.epoch().next() != Some(after.epoch()) {
            return Err(finding(
                "restore-bumps-epoch",
                format!(
                    "{what} restart: epoch {:?} then {:?}",
                    before.epoch(),
                    after.epoch()
                ),
            ));
        }
        if before.session_count() != after.session_count() || view(before) != view(after) {
            return Err(finding(
                "restore-keeps-state",
                format!(
                    "{what} restart: {} sessions {:?} became {} sessions {:?}",
                    before.session_count(),
                    view(before),
                    after.session_count(),
                    view(after)
                ),
            ));
        }
        if before.config() != after.config() {
            return Err(finding(
                "restore-keeps-state",
                format!("{what} restart changed the config"),
            ));
        }
    }
    Ok(())
}

/// The snapshot bytes an input hands to `Core::restore` ([`MODE_RAW`] and
/// [`MODE_MUTATED`]; `None` for [`MODE_ROUND_TRIP`]): for turning a crash input into a
/// plain `Core::restore(&bytes)` reproduction.
pub fn restored_bytes(data: &[u8], mutant: Option<Mutant>) -> Result<Option<Vec<u8>>, Finding> {
    let Some((&mode, rest)) = data.split_first() else {
        return Ok(None);
    };
    match mode % 3 {
        MODE_RAW => Ok(Some(rest.to_vec())),
        MODE_ROUND_TRIP => Ok(None),
        _ => {
            let mut u = Unstructured::new(rest);
            let len = usize::from(byte(&mut u));
            let ops = take(&mut u, len);
            let world = orderings::run_world(ops, mutant)?;
            let mut snap = world.core.snapshot();
            for _ in 0..MAX_EDITS {
                if u.is_empty() || snap.is_empty() {
                    break;
                }
                let at = usize::from(u16le(&mut u)) % snap.len();
                snap[at] ^= byte(&mut u);
            }
            Ok(Some(snap))
        }
    }
}

/// The `snapshot_restore` entry point.
pub fn run(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    match restored_bytes(data, mutant)? {
        Some(bytes) => restore_any(&bytes, mutant),
        None if data.is_empty() => Ok(()),
        None => {
            let world = orderings::run_world(&data[1..], mutant)?;
            round_trip(&world.core)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_inputs_are_valid() {
        for data in [
            &[][..],
            &[0],
            &[1],
            &[2],
            &[0, b'P', b'L', b'S', b'D', 1, 0],
        ] {
            assert_eq!(run(data, None), Ok(()));
        }
    }
}
