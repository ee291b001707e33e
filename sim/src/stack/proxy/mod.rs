//! The proxy world: `palisade-proxy`'s loop ([`palisade_embed::proxy::run`]) in the stack
//! world, in front of the whole production supervisor stack, on the same seams
//! ([`SimPlatform`], [`SimDisk`]) with in-memory pipes for its stdin and stdout, driven by
//! a simulated ACP client ([`client`]).
//!
//! Faults: an agent's exit at any point (`provider_exit`), right after it answers a prompt
//! (`exit_after_turn`), an agent that ignores stdin EOF (`hang_teardown`), a client that
//! stops reading (`caller_stall`), disk faults, and crash-restarts of the proxy itself: its
//! tasks are aborted, the watchdog takes down its agents, its pipes close; a new
//! incarnation starts from the state file and the client reconnects (`initialize`,
//! `session/load` of its session) and sends again the prompts it never got an answer for.
//! The agents ask permission in the middle of their prompts (half of them), and their
//! successful loads replay history. The oracle ([`oracle`]) judges from what the client
//! read and wrote and from what each agent wrote and received.

mod client;
mod oracle;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_core::mutants::Mutant;
use palisade_embed::proxy::{self, Io, Options};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::env::{self, lock, Env, EnvState, ProxyTruth};
use super::{apply_to_env, Stage, ToCaller, MAX_INCARNATIONS, RESTART_AFTER_MS, STATE_PATH};
use crate::logbook::{lock as lock_logbook, Finished, Logbook};
use crate::mix::{chance, mix};
use crate::plan::{Fault, FaultPlan};
use crate::scenario::Scenario;
use client::ClientLog;

/// Bytes of the proxy's stdin and stdout pipes.
const PIPE_BYTES: usize = 64 * 1024;
/// History updates each successful `session/load` of an agent replays.
const LOAD_REPLAY: u32 = 2;

/// Runs one seed of a proxy scenario inside the current madsim runtime.
pub(crate) async fn run(
    scenario: Rc<Scenario>,
    seed: u64,
    plan: FaultPlan,
    mutant: Option<Mutant>,
    capture: bool,
) -> Finished {
    let config = plan.run_config(&scenario).engine();
    let logbook = Logbook::shared(&config, capture);
    let start = madsim::time::TimeHandle::current().elapsed();
    let base = Instant::now();
    let env: Env = Arc::new(Mutex::new(EnvState::default()));
    {
        let mut e = lock(&env);
        e.proxy = Some(ProxyTruth::default());
        e.load_replay = LOAD_REPLAY;
    }
    let log = Arc::new(Mutex::new(ClientLog::default()));
    let (workload, expect) = (scenario.workload.clone(), scenario.expect.clone());
    let drawn = plan.environment.clone();
    // The shared behaviour table, and half the processes ask permission mid-prompt.
    let behaviour: env::BehaviourTable = Arc::new(move |process| {
        let mut b =
            crate::plan::agents::behaviour(&workload, &expect, drawn.as_ref(), seed, process);
        b.asks_permission |= chance(mix(seed, process, 0x9e12, 0), 0.5);
        b
    });
    let window = scenario.limits.fault_window_ms;
    let end = window + scenario.limits.quiesce_ms;
    let prompts = plan.workload.turns(scenario.workload.turns_per_session) as usize;
    let think = (scenario.workload.think_ms.lo, scenario.workload.think_ms.hi);
    let set_mode = f64::from(scenario.workload.set_mode_per_mille) / 1000.0;
    let stray = f64::from(scenario.workload.stray_per_mille) / 1000.0;
    let mut faults: VecDeque<Fault> = plan.faults.iter().copied().collect();
    let mut finished = false;
    let mut exits: Vec<(u32, u8, Vec<u32>, u64)> = Vec::new();
    let mut incarnation = 0;

    'incarnations: while incarnation < MAX_INCARNATIONS {
        incarnation += 1;
        let (platform, crashed, embedding) = Stage {
            env: &env,
            seed,
            behaviour: &behaviour,
            start,
            base,
            logbook: &logbook,
            config: &config,
            mutant,
        }
        .incarnation(incarnation, "proxy_started");
        let options = Options {
            agent: vec!["sim-agent".into()],
            state: Some(PathBuf::from(STATE_PATH)),
            recovery_delays_ms: None,
            profile: None,
            log_format: Default::default(),
            initialize_timeout_ms: None,
            turn_idle_ms: None,
        };
        // The proxy's own settings (a client behind it, updates not held back), on the
        // seed's engine configuration.
        let proxy_config = proxy::config_for(&options).expect("the options are valid");
        let mut engine = config.clone();
        engine.client = proxy_config.engine.client;
        engine.coalescer.max_delay_ms = proxy_config.engine.coalescer.max_delay_ms;
        let supervisor_config = palisade_embed::SupervisorConfig {
            engine,
            connection: proxy_config.connection.clone(),
            ..palisade_embed::SupervisorConfig::default()
        };
        let (client_out, proxy_in) = tokio::io::duplex(PIPE_BYTES);
        let (proxy_out, client_in) = tokio::io::duplex(PIPE_BYTES);
        let io = Io {
            embedding,
            upstream: Box::new(proxy_in),
            downstream: Box::new(proxy_out),
            stop: Box::pin(std::future::pending()),
            nonce: format!("sim{incarnation}"),
        };
        let ctx = client::Ctx {
            seed,
            incarnation,
            prompts,
            think,
            set_mode,
            stray,
            reinitialize: scenario.workload.auth_required,
            log: log.clone(),
            logbook: logbook.clone(),
            start,
        };
        // The client is not the proxy's task: a crash does not abort it (its pipes close).
        madsim::task::spawn(client::run(ctx, client_out, client_in));
        let (done_tx, mut done_rx) = oneshot::channel();
        use palisade_embed::Platform as _;
        let _ = platform.spawn(Box::pin(async move {
            let code = proxy::run(options, supervisor_config, io).await;
            let _ = done_tx.send(code);
        }));

        // Until the loop exits, a fault crashes it, or the run's time is up.
        let crash = loop {
            let now = env::now_ms(start);
            let next = faults.front().map_or(end, |f| f.at_ms.min(end));
            let nap = madsim::time::sleep(Duration::from_millis(next.saturating_sub(now)));
            tokio::select! {
                biased;
                code = &mut done_rx => {
                    if lock(&env).crash_requested {
                        break true;
                    }
                    let code = code.unwrap_or(255);
                    let now = env::now_ms(start);
                    let line = lock_logbook(&logbook).tracer.note(
                        now,
                        "world",
                        "proxy_exited",
                        &[("incarnation", u64::from(incarnation)), ("code", u64::from(code))],
                    );
                    let alive = lock(&env).alive();
                    exits.push((incarnation, code, alive, line));
                    // A platform starts a failed proxy again while its client still waits.
                    if code != 0 && client::lock(&log).unfinished(prompts) {
                        break true;
                    }
                    finished = true;
                    break false;
                }
                () = crashed.notified() => break true,
                () = nap => {
                    let now = env::now_ms(start);
                    if now >= end {
                        break 'incarnations;
                    }
                    let mut crash = false;
                    while faults.front().is_some_and(|f| f.at_ms <= now) {
                        let f = faults.pop_front().expect("peeked");
                        lock_logbook(&logbook).tracer.fault(now, &f);
                        if apply(&env, &log, &f, now) {
                            // The remaining due faults hit the next incarnation.
                            crash = true;
                            break;
                        }
                    }
                    if crash {
                        break true;
                    }
                }
            }
        };
        if !crash {
            break;
        }
        // The proxy process is gone: its tasks stop (its pipes close with them); the
        // watchdog takes down the agent trees it guarded.
        platform.crash();
        {
            let mut e = lock(&env);
            e.last_disruption_ms = env::now_ms(start);
            let guarded: Vec<u32> = e
                .procs
                .iter()
                .filter(|(_, p)| p.alive && p.guarded && p.incarnation == incarnation)
                .map(|(pid, _)| *pid)
                .collect();
            for pid in guarded {
                if let Some(p) = e.procs.get_mut(&pid) {
                    p.died_with_supervisor = true;
                }
                e.kill(pid);
            }
        }
        let now = env::now_ms(start);
        lock_logbook(&logbook).tracer.note(
            now,
            "world",
            "proxy_crashed",
            &[("incarnation", u64::from(incarnation))],
        );
        madsim::time::sleep(Duration::from_millis(RESTART_AFTER_MS)).await;
    }

    let mut violation = lock_logbook(&logbook).found.take();
    if violation.is_none() {
        let now = env::now_ms(start);
        let idx = lock_logbook(&logbook)
            .tracer
            .note(now, "oracle", "judge", &[]);
        let e = lock(&env);
        let l = client::lock(&log);
        violation = oracle::judge(
            &e,
            &l,
            prompts,
            &exits,
            finished,
            config.core.agent_profile,
            idx,
        )
        .err();
    }
    if let Some(v) = &violation {
        let now = env::now_ms(start);
        lock_logbook(&logbook).tracer.line(
            now,
            "oracle",
            "violation",
            &[("invariant", &v.invariant), ("message", &v.message)],
        );
    }
    let turns = client::lock(&log).answered.len() as u32;
    let mut w = lock_logbook(&logbook);
    Finished {
        tracer: std::mem::take(&mut w.tracer),
        marks: std::mem::take(&mut w.marks),
        turns,
        violation,
    }
}

/// Carries out a planned fault; true if it crashes the proxy now. (A caller that goes
/// away is not this world's: its client runs until everything is answered.)
fn apply(env: &Env, log: &Arc<Mutex<ClientLog>>, f: &Fault, now: u64) -> bool {
    match apply_to_env(env, f, now) {
        ToCaller::Nothing | ToCaller::Gone => false,
        ToCaller::Stall { ms } => {
            let mut l = client::lock(log);
            l.stall_until = l.stall_until.max(now + ms);
            false
        }
        ToCaller::Crash => true,
    }
}
