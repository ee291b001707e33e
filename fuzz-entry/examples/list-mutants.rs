//! Prints every mutant and the fuzz target that exercises it, one `NAME TARGET` a line
//! (for `fuzz/measure-mutants.sh`).

use palisade_fuzz_entry::{Mutant, Target};

fn main() {
    for m in Mutant::ALL {
        println!("{} {}", m.name(), Target::for_mutant(m).name());
    }
}
