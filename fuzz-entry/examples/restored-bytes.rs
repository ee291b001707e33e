//! Turns a `snapshot_restore` input (a crash artifact) into the plain snapshot bytes it
//! hands to `Core::restore`, for a reproduction without the harness:
//!
//! ```text
//! cargo run -p palisade-fuzz-entry --example restored-bytes -- INPUT OUTPUT
//! ```

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: restored-bytes INPUT OUTPUT");
        std::process::exit(2);
    };
    let data = std::fs::read(input).expect("readable input");
    match palisade_fuzz_entry::snapshot::restored_bytes(&data, None) {
        Ok(Some(bytes)) => {
            std::fs::write(output, &bytes).expect("writable output");
            println!("{} snapshot bytes written to {output}", bytes.len());
        }
        Ok(None) => println!("a round-trip input: it restores the core's own snapshots"),
        Err(finding) => println!("the input fails before restoring: {finding}"),
    }
}
