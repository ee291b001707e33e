//! Writes the seed corpus: `fuzz/corpus/<target>/seed-<name>`, one file per seed of
//! `palisade_fuzz_entry::seeds::all()`. Files the fuzzer added are left alone.
//!
//! ```text
//! cargo run -p palisade-fuzz-entry --example make-seeds
//! ```

use std::path::Path;

fn main() -> std::io::Result<()> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let seeds = palisade_fuzz_entry::seeds::all();
    for seed in &seeds {
        let dir = corpus.join(seed.target.name());
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(seed.file_name()), &seed.bytes)?;
    }
    println!("wrote {} seeds under {}", seeds.len(), corpus.display());
    Ok(())
}
