//! Runs one input through a target on stable, without libFuzzer, and prints the finding
//! (for reading a crash artifact; set `PALISADE_FUZZ_TRACE=1` to see every step):
//!
//! ```text
//! cargo run -p palisade-fuzz-entry --example run-input -- TARGET INPUT
//! ```

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, input] = args.as_slice() else {
        eprintln!("usage: run-input TARGET INPUT");
        std::process::exit(2);
    };
    let Some(target) = palisade_fuzz_entry::Target::from_name(target) else {
        eprintln!("unknown target {target:?}");
        std::process::exit(2);
    };
    let data = std::fs::read(input).expect("readable input");
    match target.run(&data, palisade_fuzz_entry::mutant_from_env()) {
        Ok(()) => println!("passed"),
        Err(finding) => {
            println!("{finding}");
            std::process::exit(1);
        }
    }
}
