echo "::group::fuzz"
# cargo-fuzz on the core (fuzz/run.sh): every target for 30 s, two at a time, failing on
# any crash. Needs nightly; without it the corpus was still replayed by `cargo test`
# (palisade-fuzz-entry's tests/corpus.rs). Budget (reports/fuzz.md): installing
# cargo-fuzz when missing ~1 min (a debug build: half the CPU of a release one, and its
# speed does not matter), building the targets ~1-2.5 min, fuzzing 1 min.
if cargo +nightly --version >/dev/null 2>&1; then
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        cargo install cargo-fuzz --locked --debug
    fi
    fuzz/run.sh all 30
else
    echo "fuzz: no nightly toolchain; skipped (the corpus was replayed by cargo test)"
fi
echo "::endgroup::"
