//! Every single-bit flip of real snapshots: `Core::restore` refuses it with a typed error,
//! or the core it restores passes `check_invariants` after every input and stays live
//! (the `snapshot_restore` property, see `palisade_fuzz_entry::snapshot`). Before the
//! restore checks of issue 14, a few flips restored a turn pointing at another session's
//! execution, which then kept its session busy forever.

use palisade_fuzz_entry::{seeds, snapshot, Target};

/// The in-flight state (after the last operation, before the liveness phase) of every
/// `callback_orderings` seed short enough to be wrapped in a mutation input.
fn real_snapshots() -> Vec<(String, Vec<u8>)> {
    seeds::all()
        .into_iter()
        .filter(|s| s.target == Target::CallbackOrderings && s.bytes.len() <= 255)
        .map(|s| {
            let mut data = vec![snapshot::MODE_MUTATED, s.bytes.len() as u8];
            data.extend_from_slice(&s.bytes);
            let snap = snapshot::restored_bytes(&data, None)
                .expect("the seed passes")
                .expect("a mutation input restores bytes");
            (s.name.to_string(), snap)
        })
        .collect()
}

#[test]
fn every_single_bit_flip_of_a_real_snapshot_is_refused_or_stays_live() {
    let mut failures = Vec::new();
    let (mut flips, mut restored) = (0usize, 0usize);
    let mut refused = std::collections::BTreeMap::<String, usize>::new();
    for (name, snap) in real_snapshots() {
        for bit in 0..snap.len() * 8 {
            let mut bytes = snap.clone();
            bytes[bit / 8] ^= 1 << (bit % 8);
            flips += 1;
            match palisade_core::Core::restore(&bytes) {
                Ok(_) => restored += 1,
                Err(palisade_core::RestoreError::Inconsistent { rule, .. }) => {
                    *refused.entry(rule.to_string()).or_default() += 1
                }
                Err(e) => {
                    let kind = format!("{e:?}");
                    let kind = kind.split(['(', ' ']).next().unwrap_or("?").to_string();
                    *refused.entry(kind).or_default() += 1
                }
            }
            let mut input = vec![snapshot::MODE_RAW];
            input.extend_from_slice(&bytes);
            if let Err(finding) = Target::SnapshotRestore.run(&input, None) {
                failures.push(format!("{name}, bit {bit}: {finding}"));
            }
        }
    }
    println!("{flips} single-bit flips, {restored} restored; refused: {refused:?}");
    assert!(flips > 5_000, "too few flips to mean anything: {flips}");
    assert!(
        failures.is_empty(),
        "{} of {flips} flips:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn trailing_bytes_after_a_snapshot_are_refused() {
    for (name, mut snap) in real_snapshots() {
        assert!(palisade_core::Core::restore(&snap).is_ok(), "{name}");
        snap.push(0);
        assert_eq!(
            palisade_core::Core::restore(&snap).err(),
            Some(palisade_core::RestoreError::TrailingBytes(1)),
            "{name}"
        );
    }
}
