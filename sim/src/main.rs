//! `palisade`: see [`palisade_sim::cli`].

fn main() -> std::process::ExitCode {
    palisade_sim::cli::main()
}
