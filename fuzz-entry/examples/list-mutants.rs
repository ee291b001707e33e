//! Prints every mutant of the core and the fuzz target that exercises it, one
//! `NAME TARGET` a line (for `fuzz/measure-mutants.sh`). The engine's mutants
//! ([`Mutant::in_core`] false: its reading of the wire, its restore, its output to the
//! caller) are left out: no fuzz target reaches the engine; the sweep catches them.

use palisade_fuzz_entry::{Mutant, Target};

fn main() {
    for m in Mutant::ALL.into_iter().filter(|m| m.in_core()) {
        println!("{} {}", m.name(), Target::for_mutant(m).name());
    }
}
