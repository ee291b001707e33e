//! The `#[madsim::test]` entry: `cargo test` runs the swarm world under madsim's own test
//! harness, honouring its environment.
//!
//! `MADSIM_TEST_SEED=N cargo test -p palisade-sim --test madsim_entry` runs seed N, and
//! `MADSIM_TEST_NUM=K` the K seeds from N. Without `MADSIM_TEST_SEED`, madsim would pick a
//! seed from the wall clock; this entry runs the fixed [`DEFAULT_SEED`] instead, so a
//! plain `cargo test` is reproducible.
//!
//! [`runner::run_seed`] builds its own madsim `Runtime` for the seed. madsim lets a runtime
//! be entered from inside another on the same thread (the outer one stays idle while the
//! inner one runs), so the seed's trace is exactly the one a sweep gets; the second test
//! checks that.

use palisade_sim::{runner, scenario};

/// The seed run when `MADSIM_TEST_SEED` is not set.
const DEFAULT_SEED: u64 = 1;

fn swarm() -> scenario::Scenario {
    scenario::resolve_one("swarm")
        .expect("the shipped swarm scenario loads")
        .scenario
}

#[madsim::test]
async fn swarm_holds_for_the_madsim_seed() {
    let seed = if std::env::var_os("MADSIM_TEST_SEED").is_some() {
        madsim::runtime::Handle::current().seed()
    } else {
        DEFAULT_SEED
    };
    let outcome = runner::run_seed(&swarm(), seed, None, None);
    if let Some(v) = outcome.violation {
        panic!(
            "swarm seed {seed}: {}: {}\nrepro: palisade run --scenario swarm --seed {seed}",
            v.invariant, v.message
        );
    }
}

#[test]
fn a_seed_run_inside_a_madsim_runtime_matches_the_sweep() {
    let scenario = swarm();
    let outer = madsim::runtime::Runtime::with_seed_and_config(7, madsim::Config::default());
    let nested = outer.block_on({
        let scenario = scenario.clone();
        async move {
            runner::run_seed(&scenario, DEFAULT_SEED, None, None)
                .trace
                .hash
        }
    });
    let isolated = match runner::run_isolated(&scenario, DEFAULT_SEED, None, None).run {
        runner::SeedRun::Done(outcome) => outcome.trace.hash,
        runner::SeedRun::Panicked { message } => panic!("seed panicked: {message}"),
    };
    assert_eq!(nested, isolated);
}
