//! `snapshot_restore`: the durable state comes back from disk, whatever is on the disk.
//!
//! The first byte picks a mode:
//!
//! - [`MODE_RAW`]: the rest is handed to `Core::restore` as is. It must answer an error or
//!   a core that passes `check_invariants` and keeps passing it while it takes further
//!   inputs (a fixed script that resumes, prompts, cancels, answers teardowns and lets all
//!   time pass), and whose own snapshot restores again. Never a panic, never a loop.
//!   And the restored core stays live (see [`stays_live`]): after the embedder's restart
//!   protocol and a well-behaved world, no session is left busy.
//! - [`MODE_ROUND_TRIP`]: the rest is a `callback_orderings` input; the state after its
//!   last operation (work in flight) and the state after its liveness phase are each
//!   snapshotted and restored twice: the epoch advances by one each time; sessions and
//!   conversation tokens survive, and so do live attempts unless the restore settles
//!   them (with `AttemptSettled`); one snapshot always restores to the same state.
//! - [`MODE_MUTATED`]: a length byte, that many bytes of a `callback_orderings` input, then
//!   `(offset u16, kind u8, value u8)` edits (xor, set, set to 255, add) applied to the snapshot of the state after its last
//!   operation (before the liveness phase), restored as in [`MODE_RAW`]. Real snapshots
//!   with a few flipped bytes reach far deeper into the decoder than random bytes do.
//! - [`MODE_MUTATED_THEN_OPS`]: as [`MODE_MUTATED`], with an edit count byte before the
//!   edits, and the rest of the input is `callback_orderings` operations (without a
//!   header) fed to the restored core — any legal input — before the liveness check of
//!   [`stays_live`].
//!
//! The property, for any bytes: `Core::restore` fails with a typed error, or it yields a
//! core that passes `check_invariants` after every input and, after any operations, the
//! restart protocol (every runtime it knows reported exited, then stopped) and a liveness
//! phase, has no busy session. Built with overflow checks (`fuzz/run.sh`), so an
//! arithmetic overflow on restored values is a crash too.

use arbitrary::Unstructured;
use palisade_core::mutants::Mutant;
use palisade_core::*;

use crate::bytes::{byte, take, u16le};
use crate::orderings::{self, Op};
use crate::Finding;

const TARGET: &str = "snapshot_restore";

/// Restore arbitrary bytes.
pub const MODE_RAW: u8 = 0;
/// Round-trip the state a `callback_orderings` input leaves.
pub const MODE_ROUND_TRIP: u8 = 1;
/// Flip bytes of a real snapshot, then restore.
pub const MODE_MUTATED: u8 = 2;
/// Flip bytes of a real snapshot, restore, then feed operations to the restored core.
pub const MODE_MUTATED_THEN_OPS: u8 = 3;
/// Modes, taken modulo this.
const MODES: u8 = 4;
/// Byte edits applied to a snapshot, at most.
pub const MAX_EDITS: usize = 32;
/// Edit kinds (`kind % 4`): xor the byte with the value, set it, set it to 255, add.
pub const EDIT_XOR: u8 = 0;
/// See [`EDIT_XOR`].
pub const EDIT_SET: u8 = 1;
/// See [`EDIT_XOR`].
pub const EDIT_MAX: u8 = 2;
/// See [`EDIT_XOR`].
pub const EDIT_ADD: u8 = 3;
/// Sessions and executions the script addresses in a restored core of unknown content.
const SCRIPT_IDS: u64 = 4;

fn finding(rule: &str, detail: String) -> Finding {
    Finding::new(TARGET, rule, detail)
}

/// Restores `bytes`; a valid core must stay valid under further inputs.
fn restore_any(bytes: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    let trace = crate::trace_enabled();
    let mut core = match Core::restore(bytes) {
        Ok(core) => core,
        Err(e) => {
            if trace {
                eprintln!("restore: {e}");
            }
            return Ok(());
        }
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
    let drain = |core: &mut Core| {
        let mut effects = Vec::new();
        while let Some(e) = core.poll_effect() {
            effects.push(e);
        }
        effects
    };
    drain(&mut core);
    let mut now = Timestamp::ZERO;
    let id = |n: u64| n.max(1);
    let step = |core: &mut Core, now: Timestamp, input: Input| {
        let v = core.handle(now, input.clone());
        let effects = drain(core);
        if trace {
            eprintln!("  {input:?}\n    -> {v:?}");
            for e in &effects {
                eprintln!("    effect {e:?}");
            }
        }
        check(core, &format!("{input:?}")).map(|()| (v, effects))
    };
    let lease = |effects: &[Effect]| {
        effects.iter().find_map(|e| match e {
            Effect::LoadConversation { lease, .. } => Some((*lease, true)),
            Effect::NewConversation { lease, .. } | Effect::DispatchPrompt { lease, .. } => {
                Some((*lease, false))
            }
            _ => None,
        })
    };
    for n in 1..=SCRIPT_IDS {
        let session = SessionId::new(id(n)).expect("non-zero");
        // A turn ID above any the snapshot can hold, so the prompt is new.
        let turn = TurnId::new(u64::MAX - SCRIPT_IDS + n).expect("non-zero");
        step(&mut core, now, Input::Resume { session })?;
        step(&mut core, now, Input::Prompt { session, turn })?;
        // A healthy runtime on an execution the snapshot may know: rebinds restored
        // execution records, then takes the turn to its end.
        if let Some(attempt) = core.live_attempt(session) {
            // The first execution ID that takes the bind: one the snapshot holds for this
            // session (a rebind of a restored record) or a new one.
            let mut bound = None;
            for e in 0..SCRIPT_IDS {
                let execution = ExecutionId::new((n - 1 + e) % SCRIPT_IDS + 1).expect("non-zero");
                let bind = Input::Bound {
                    session,
                    attempt,
                    execution,
                };
                if let (Verdict::Bound { generation }, _) = step(&mut core, now, bind)? {
                    bound = Some((execution, generation));
                    break;
                }
            }
            if let Some((execution, generation)) = bound {
                let cb = |event| {
                    Input::Callback(Callback {
                        session,
                        execution,
                        attempt: Some(attempt),
                        generation,
                        event,
                    })
                };
                step(&mut core, now, cb(RuntimeEvent::BootReady))?;
                let ready = RuntimeEvent::AgentReady {
                    load_capability: Some(true),
                };
                let (_, mut effects) = step(&mut core, now, cb(ready))?;
                // The conversation (load or new), then the prompt's dispatch.
                if let Some((lease, load)) = lease(&effects) {
                    step(&mut core, now, Input::Perform { lease })?;
                    let token = ConversationToken::new(id(n)).expect("non-zero");
                    let answer = if load {
                        RuntimeEvent::ConversationLoaded
                    } else {
                        RuntimeEvent::ConversationCreated { token }
                    };
                    effects = step(&mut core, now, cb(answer))?.1;
                }
                if let Some((lease, _)) = lease(&effects) {
                    step(&mut core, now, Input::Perform { lease })?;
                    step(&mut core, now, cb(RuntimeEvent::PromptAccepted { turn }))?;
                }
                let seq = 1;
                let bytes = 8;
                step(
                    &mut core,
                    now,
                    cb(RuntimeEvent::Stream { turn, seq, bytes }),
                )?;
                step(&mut core, now, cb(RuntimeEvent::PromptCompleted { turn }))?;
            }
        }
        step(&mut core, now, Input::DismissFailure { session })?;
        step(&mut core, now, Input::Cancel { session })?;
    }
    for round in 0..3u64 {
        for n in 1..=SCRIPT_IDS {
            let execution = ExecutionId::new(id(n)).expect("non-zero");
            step(&mut core, now, Input::Stopped { execution })?;
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

/// Restores `bytes` and drains what the restore queued.
fn restore_drained(bytes: &[u8], what: &str) -> Result<(Core, Vec<Effect>), Finding> {
    let mut core = Core::restore(bytes).map_err(|e| {
        finding(
            "restore-own-snapshot",
            format!("{what}: the core's own snapshot does not restore: {e}"),
        )
    })?;
    let mut effects = Vec::new();
    while let Some(e) = core.poll_effect() {
        effects.push(e);
    }
    Ok((core, effects))
}

fn round_trip(core: &Core) -> Result<(), Finding> {
    let snap = core.snapshot();
    let (r1, e1) = restore_drained(&snap, "first restart")?;
    if restore_drained(&snap, "first restart")?.0.snapshot() != r1.snapshot() {
        return Err(finding(
            "snapshot-deterministic",
            "one snapshot restored twice gives different states".to_owned(),
        ));
    }
    let (r2, e2) = restore_drained(&r1.snapshot(), "second restart")?;
    for (before, after, effects, what) in [(core, &r1, e1, "first"), (&r1, &r2, e2, "second")] {
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
        // Sessions and conversation tokens survive. A live attempt survives too, unless
        // the restart settles it (its only pending prompt was rolled back): then the
        // restored core says so with `AttemptSettled`. It never becomes another attempt.
        let settled = |a: AttemptId| {
            effects
                .iter()
                .any(|e| matches!(e, Effect::AttemptSettled { attempt, .. } if *attempt == a))
        };
        let kept = view(before).into_iter().zip(view(after)).all(
            |((_, live_b, token_b), (_, live_a, token_a))| {
                token_b == token_a
                    && (live_b == live_a || (live_a.is_none() && live_b.is_some_and(settled)))
            },
        );
        if before.session_count() != after.session_count() || !kept {
            return Err(finding(
                "restore-keeps-state",
                format!(
                    "{what} restart: {} sessions {:?} became {} sessions {:?} (effects {effects:?})",
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
    Ok(split(data, mutant)?.map(|(bytes, _)| bytes))
}

/// The snapshot bytes an input restores, and the operations that follow the restore.
type Restored = (Vec<u8>, Vec<Op>);

/// The snapshot bytes an input restores and the operations that follow the restore.
fn split(data: &[u8], mutant: Option<Mutant>) -> Result<Option<Restored>, Finding> {
    let Some((&mode, rest)) = data.split_first() else {
        return Ok(None);
    };
    match mode % MODES {
        MODE_RAW => Ok(Some((rest.to_vec(), Vec::new()))),
        MODE_ROUND_TRIP => Ok(None),
        m => {
            let mut u = Unstructured::new(rest);
            let len = usize::from(byte(&mut u));
            let ops = take(&mut u, len);
            let mut snap = Vec::new();
            orderings::run_world(ops, mutant, &mut |core| {
                snap = core.snapshot();
                Ok(())
            })?;
            let edits = if m == MODE_MUTATED {
                MAX_EDITS
            } else {
                usize::from(byte(&mut u)) % (MAX_EDITS + 1)
            };
            for _ in 0..edits {
                if u.is_empty() || snap.is_empty() {
                    break;
                }
                let at = usize::from(u16le(&mut u)) % snap.len();
                let (kind, value) = (byte(&mut u), byte(&mut u));
                snap[at] = match kind % 4 {
                    EDIT_XOR => snap[at] ^ value,
                    EDIT_SET => value,
                    // The extremes directly: a length or a counter at its top.
                    EDIT_MAX => u8::MAX,
                    _ => snap[at].wrapping_add(value),
                };
            }
            let after = if m == MODE_MUTATED {
                Vec::new()
            } else {
                let n = u.len();
                orderings::decode_ops(take(&mut u, n))
            };
            Ok(Some((snap, after)))
        }
    }
}

/// The liveness half of the property: if `bytes` restore, the core takes `ops` (any
/// legal input, checked after every one), then the embedder's restart protocol (every
/// runtime the core knows is reported exited by its owner, then stopped) and a liveness
/// phase (every runtime answers well, every teardown finishes, time runs out); then no
/// session may be busy. A restored core that points a turn at another session's
/// execution, say, would keep that session busy forever.
pub fn stays_live(bytes: &[u8], ops: &[Op], mutant: Option<Mutant>) -> Result<(), Finding> {
    let Ok(core) = Core::restore(bytes) else {
        return Ok(());
    };
    let mut world = orderings::World::restored(core, mutant);
    world.checked(&|| "restore".to_owned())?;
    for (i, op) in ops.iter().enumerate() {
        if !world.budget_left() {
            break;
        }
        world.at_op(i);
        world.apply(*op)?;
    }
    world.report_restart()?;
    world.settle()
}

/// The `snapshot_restore` entry point.
pub fn run(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    match split(data, mutant)? {
        Some((bytes, ops)) => {
            restore_any(&bytes, mutant)?;
            stays_live(&bytes, &ops, mutant)
        }
        None if data.is_empty() => Ok(()),
        None => {
            // Mid-flight (live attempts, leases, timers), then settled.
            let world = orderings::run_world(&data[1..], mutant, &mut |core| round_trip(core))?;
            round_trip(world.driver.core())
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
