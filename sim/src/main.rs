//! `palisade`: see [`palisade_sim::cli`].

/// The binary's allocator: mimalloc, for the sweep's many short-lived strings and JSON trees
/// (see `Cargo.toml`). Only this binary sets it; the library and its embedders do not.
/// mimalloc reads its options from the environment (`MIMALLOC_PURGE_DELAY` and the rest of
/// its documented `MIMALLOC_*` variables); this binary sets none.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    palisade_sim::cli::main()
}
