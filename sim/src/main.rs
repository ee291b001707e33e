//! `palisade`: see [`palisade_sim::cli`].

/// The binary's allocator: mimalloc, for the sweep's many short-lived strings and JSON trees
/// (see `Cargo.toml`). Only this binary sets it; the library and its embedders do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    palisade_sim::cli::main()
}
