//! `palisade-watchdog --marker M`: started by `palisade-embed` beside each agent it runs;
//! takes the agent's whole process tree down when the supervisor dies, however it dies
//! (see `palisade_embed::process`). Not meant to be run by hand.

use std::process::ExitCode;

fn main() -> ExitCode {
    palisade_embed::process::watchdog_main(std::env::args_os().skip(1))
}
