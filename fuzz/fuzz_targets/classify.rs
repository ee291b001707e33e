//! `classify`: see `palisade_fuzz_entry::classify`. `PALISADE_MUTANT=<name>` switches a mutant on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_fuzz_entry::{fuzz, Target};

fuzz_target!(|data: &[u8]| fuzz(Target::Classify, data));
