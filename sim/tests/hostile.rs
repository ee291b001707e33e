//! Issue 14, hostile input: files, flags and state that a hostile or careless user hands
//! the command line never make it panic, hang, read or write outside the paths named, or
//! lie. Each case below failed before the issue was fixed (a panic at exit 101, a hang, a
//! read outside the report directory, a half-written report, a false verdict); now each
//! exits 2 within seconds, with a message naming the input (file, JSON path or TOML
//! line:col) and the bound it breaks.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{describe, palisade, read_json, Scratch};

/// Every hostile case must end within this.
const WITHIN: Duration = Duration::from_secs(5);

/// Runs `palisade ARGS` in `dir`, and checks it ended within [`WITHIN`]; one that does
/// not is killed (a hang fails the test instead of stalling it).
fn timed(dir: &Path, args: &[&str]) -> Output {
    let started = Instant::now();
    let mut child = Command::new(common::BIN)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run palisade");
    // Drain the pipes on threads, so a chatty child never blocks on a full pipe.
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > WITHIN * 2 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} hung: killed after {:?}", started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    let out = Output {
        status,
        stdout: out_reader.join().expect("stdout reader"),
        stderr: err_reader.join().expect("stderr reader"),
    };
    assert!(
        took < WITHIN,
        "{args:?} took {took:?}, more than {WITHIN:?}\n{}",
        describe(&out)
    );
    out
}

/// Asserts exit 2 and that stderr holds every needle (the input's name, the bound).
#[track_caller]
fn refused(out: &Output, what: &str, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {}", describe(out));
    for needle in needles {
        assert!(
            err.contains(needle),
            "{what}: stderr lacks {needle:?}\n{}",
            describe(out)
        );
    }
    assert!(
        !err.contains("panicked"),
        "{what}: a panic\n{}",
        describe(out)
    );
}

fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).expect("json")).expect("write");
}

// ----- 1. merge trusts nothing in its shards -----------------------------------------------

/// Two real shards of a small sweep in `dir/s0` and `dir/s1`; returns their summaries.
fn two_shards(dir: &Scratch, mutant: Option<&str>) -> (Value, Value) {
    for i in 0..2 {
        let shard = format!("{i}/2");
        let report = format!("s{i}");
        let mut args = vec![
            "sweep",
            "--scenario",
            "cancel-storm",
            "--seeds",
            "4",
            "--jobs",
            "2",
            "--shard",
            &shard,
            "--report-dir",
            &report,
        ];
        if let Some(m) = mutant {
            args.extend(["--mutant", m]);
        }
        let out = palisade(&dir.0, &args);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{}",
            describe(&out)
        );
    }
    (
        read_json(&dir.path("s0/summary.json")),
        read_json(&dir.path("s1/summary.json")),
    )
}

#[test]
fn merge_refuses_shards_that_no_sweep_wrote() {
    let dir = Scratch::new("hostile-merge");
    let (s0, s1) = two_shards(&dir, None);
    let merge = |out: &str| {
        let args = [
            "merge",
            "s0/summary.json",
            "s1/summary.json",
            "--report-dir",
            out,
        ];
        timed(&dir.0, &args)
    };
    // Sanity: the real shards merge.
    let out = merge("m");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    // Summaries written before `strategy` existed were uniform sweeps, and merge as such.
    let (mut a, mut b) = (s0.clone(), s1.clone());
    for s in [&mut a, &mut b] {
        s.as_object_mut().expect("summary").remove("strategy");
    }
    write_json(&dir.path("s0/summary.json"), &a);
    write_json(&dir.path("s1/summary.json"), &b);
    let out = merge("m-old");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let merged: Value = serde_json::from_slice(
        &std::fs::read(dir.path("m-old/summary.json")).expect("merged summary"),
    )
    .expect("json");
    assert_eq!(merged["strategy"], "uniform");

    type Edit = fn(&mut Value, &mut Value);
    let cases: &[(&str, Edit, &[&str])] = &[
        (
            "shard 5 of 2",
            |a, _| a["shard"] = json!({"index": 5, "count": 2}),
            &["shard.index", "shard 5 of 2"],
        ),
        (
            "shard 0 of 0",
            |a, _| a["shard"] = json!({"index": 0, "count": 0}),
            &["shard.count", "MAX_SHARDS"],
        ),
        (
            "shard 2^30 of 2^40",
            |a, _| a["shard"] = json!({"index": 1u64 << 30, "count": 1u64 << 40}),
            &["shard.count", "4096"],
        ),
        (
            "u64::MAX seeds in two shards",
            |a, b| {
                for s in [a, b] {
                    s["seeds"] = json!(u64::MAX);
                    s["scenarios"][0]["seeds"] = json!(u64::MAX);
                }
            },
            &["scenarios[0].seeds", "holds"],
        ),
        (
            "no scenarios",
            |a, b| {
                for s in [a, b] {
                    s["scenarios"] = json!([]);
                    s["seeds"] = json!(0);
                }
            },
            &["scenarios", "no scenarios"],
        ),
        (
            "events that overflow when added",
            |a, b| {
                for s in [a, b] {
                    s["events"] = json!(u64::MAX - 1);
                    s["scenarios"][0]["events"] = json!(u64::MAX - 1);
                }
            },
            &["scenarios[0].events", "overflows"],
        ),
        (
            "a failure file outside the shard's directory",
            |a, _| {
                a["failed"] = json!(1);
                a["scenarios"][0]["failed"] = json!(1);
                a["failures"] = json!([{
                    "scenario": "cancel-storm", "seed": 0, "invariant": "x",
                    "message": "x", "trace_hash": "none", "file": "../secret.txt",
                    "repro": "x"
                }]);
            },
            &[
                "failures[0].file",
                "../secret.txt",
                "inside the report directory",
            ],
        ),
        (
            "a failing seed the shard never ran",
            |a, _| {
                a["failed"] = json!(1);
                a["scenarios"][0]["failed"] = json!(1);
                a["failures"] = json!([{
                    "scenario": "cancel-storm", "seed": 1, "invariant": "x",
                    "message": "x", "trace_hash": "none", "file": null, "repro": "x"
                }]);
            },
            &["failures[0].seed", "shard 0/2"],
        ),
        (
            "an unknown strategy",
            |a, _| a["strategy"] = json!("telepathy"),
            &["strategy", "telepathy"],
        ),
        (
            "shards of two strategies",
            |a, _| a["strategy"] = json!("coverage"),
            &["\"coverage\"", "\"uniform\""],
        ),
    ];
    std::fs::write(dir.path("secret.txt"), "do not copy me").expect("write");
    for (what, edit, needles) in cases {
        let (mut a, mut b) = (s0.clone(), s1.clone());
        edit(&mut a, &mut b);
        write_json(&dir.path("s0/summary.json"), &a);
        write_json(&dir.path("s1/summary.json"), &b);
        let report = dir.path("out");
        let _ = std::fs::remove_dir_all(&report);
        let out = merge("out");
        refused(&out, what, needles);
        assert!(
            !report.join("summary.json").exists(),
            "{what}: a refused merge wrote a report"
        );
        assert!(!dir.path("secret.txt.json").exists() && !report.join("../secret.txt").exists());
    }

    // Reading until memory runs out: refused at once.
    let out = timed(&dir.0, &["merge", "/dev/zero", "--report-dir", "out"]);
    refused(
        &out,
        "merge /dev/zero",
        &["/dev/zero", "not a regular file"],
    );
}

#[test]
fn merge_reads_failure_files_only_inside_each_shard() {
    let dir = Scratch::new("hostile-merge-link");
    // stale-callback-dispatches fails cancel-storm seed 0 (in shard 0/2): it lists a file.
    let (s0, _) = two_shards(&dir, Some("stale-callback-dispatches"));
    let listed: Vec<&Value> = s0["failures"]
        .as_array()
        .expect("failures")
        .iter()
        .filter(|f| f["file"].is_string())
        .collect();
    assert!(
        !listed.is_empty(),
        "the mutant must fail a seed of shard 0: {s0}"
    );
    let rel = listed[0]["file"].as_str().expect("file").to_string();
    // The failure file becomes a link to a file outside the shard's directory.
    std::fs::write(dir.path("outside.json"), "{}").expect("write");
    let target = dir.path(&format!("s0/{rel}"));
    std::fs::remove_file(&target).expect("remove");
    std::os::unix::fs::symlink(dir.path("outside.json"), &target).expect("symlink");
    let out = timed(
        &dir.0,
        &[
            "merge",
            "s0/summary.json",
            "s1/summary.json",
            "--report-dir",
            "out",
        ],
    );
    refused(
        &out,
        "a linked failure file",
        &[&rel, "leads out of its shard's directory"],
    );
    assert!(!dir.path("out/summary.json").exists());
}

// ----- 2. scenario values that validate but break the run -----------------------------------

#[test]
fn scenario_values_past_their_bounds_are_refused_with_file_line_and_column() {
    let dir = Scratch::new("hostile-scenario");
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "sessions",
            "[workload]\nsessions = 4294967295\n",
            &[":3:12:", "MAX_SESSIONS", "64"],
        ),
        (
            "sessions-1e6",
            "[workload]\nsessions = 1000000\n",
            &[":3:12:", "MAX_SESSIONS"],
        ),
        (
            "window",
            "[limits]\nfault_window_ms = 18446744073709551615\nquiesce_ms = 18446744073709551615\n",
            &[":3:19:", "MAX_FAULT_WINDOW_MS", "600000"],
        ),
        (
            "recovery-steps",
            "[core]\nrecovery_delays_ms = [1, 1, 1, 1, 1, 1, 1, 1, 1]\n",
            &[":3:22:", "Config::validate", "at most 8"],
        ),
        (
            "join-wait",
            "[core]\njoin_wait_ms = 0\n",
            &[":3:16:", "Config::validate", "at least 1 ms"],
        ),
        (
            "max-delay",
            "[faults]\ndelay = [0.5, 0.5]\nmax_delay_ms = 18446744073709551615\n",
            &[":4:16:", "quiesce_ms"],
        ),
        (
            "notifications",
            "[workload]\nnotifications_per_turn = [4000000000, 4000000000]\n",
            &[":3:26:", "MAX_NOTIFICATIONS_PER_TURN"],
        ),
        (
            "burst",
            "[faults]\nburst = [1.0, 1.0]\nburst_size = [4000000000, 4000000000]\n",
            &[":4:14:", "MAX_BURST"],
        ),
        (
            "burst-step",
            "[[steps]]\nat_ms = 0\naction = \"burst\"\ncount = 4000000000\n",
            &[":5:9:", "MAX_BURST"],
        ),
        (
            "repeats",
            "[[steps]]\nat_ms = 0\naction = \"cancel\"\ncount = 4000000000\n",
            &[":5:9:", "MAX_STEP_REPEATS"],
        ),
        (
            "late-callback",
            "[[steps]]\nat_ms = 0\naction = \"late_callback\"\ndelay_ms = 18446744073709551615\n",
            &[":5:12:", "arrives"],
        ),
        (
            "count-ignored",
            "[[steps]]\nat_ms = 0\naction = \"resume\"\ncount = 3\n",
            &[":5:9:", "means nothing"],
        ),
        (
            "queue",
            "[core]\nqueue_capacity = 4000000000\n",
            &[":3:18:", "MAX_QUEUE_CAPACITY"],
        ),
        (
            "stop-deadline",
            "[core]\nstop_deadline_ms = 100000000\n",
            &[":3:20:", "quiesce_ms"],
        ),
        (
            "events",
            "[limits]\nmax_events = 18446744073709551615\n",
            &[":3:14:", "MAX_EVENTS"],
        ),
    ];
    for (name, body, needles) in cases {
        let file = format!("{name}.toml");
        std::fs::write(dir.path(&file), format!("name = \"x\"\n{body}")).expect("write");
        let path = format!("./{file}");
        for args in [
            &[
                "sweep",
                "--scenario",
                &path,
                "--seeds",
                "1",
                "--report-dir",
                "r",
            ][..],
            &["run", "--scenario", &path, "--seed", "1"][..],
        ] {
            let out = timed(&dir.0, args);
            let mut all = vec![file.as_str()];
            all.extend_from_slice(needles);
            refused(&out, name, &all);
        }
    }
    assert!(!dir.path("r").exists(), "a refused scenario wrote a report");
}

// ----- 3. failure files with impossible plans -----------------------------------------------

#[test]
fn failure_files_with_impossible_plans_are_refused_with_the_json_path() {
    let dir = Scratch::new("hostile-plan");
    // stale-callback-dispatches fails cancel-storm seed 0 (see tests/cli.rs).
    let out = palisade(
        &dir.0,
        &[
            "sweep",
            "--strategy",
            "uniform",
            "--scenario",
            "cancel-storm",
            "--seed-range",
            "0..1",
            "--mutant",
            "stale-callback-dispatches",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let original = read_json(&dir.path("reports/failures/cancel-storm-0.json"));
    let n = original["plan"]["faults"].as_array().expect("faults").len();
    let fault = |extra: Value| {
        let mut f = json!({"at_ms": 10, "session": 1, "fault": "cancel"});
        for (k, v) in extra.as_object().expect("object") {
            f[k] = v.clone();
        }
        f
    };
    let jitter = |p: f64| {
        fault(json!({"fault": "jitter", "until_ms": 100, "delay_p": p,
                     "duplicate_p": 0.0, "reorder_p": 0.0, "max_delay_ms": 10}))
    };
    let cases: Vec<(&str, Value, String)> = vec![
        (
            "session 0",
            fault(json!({"session": 0})),
            format!("plan.faults[{n}].session"),
        ),
        (
            "session 999",
            fault(json!({"session": 999})),
            format!("plan.faults[{n}].session"),
        ),
        (
            "at u64::MAX",
            fault(json!({"at_ms": u64::MAX})),
            format!("plan.faults[{n}].at_ms"),
        ),
        (
            "late callback at u64::MAX",
            fault(json!({"fault": "late_callback", "delay_ms": u64::MAX})),
            format!("plan.faults[{n}].delay_ms"),
        ),
        (
            "jitter p = 5",
            jitter(5.0),
            format!("plan.faults[{n}].delay_p"),
        ),
        (
            "jitter p = -3",
            jitter(-3.0),
            format!("plan.faults[{n}].delay_p"),
        ),
        (
            "clock jump i64::MIN",
            fault(json!({"fault": "clock_jump", "ms": i64::MIN})),
            format!("plan.faults[{n}].ms"),
        ),
        (
            "clock jump i64::MAX",
            fault(json!({"fault": "clock_jump", "ms": i64::MAX})),
            format!("plan.faults[{n}].ms"),
        ),
        (
            "burst of u32::MAX",
            fault(json!({"fault": "burst", "count": u32::MAX})),
            format!("plan.faults[{n}].count"),
        ),
    ];
    for (what, bad, path) in cases {
        let mut file = original.clone();
        file["plan"]["faults"]
            .as_array_mut()
            .expect("faults")
            .push(bad);
        write_json(&dir.path("bad.json"), &file);
        for cmd in ["replay", "minimize"] {
            let out = timed(&dir.0, &[cmd, "bad.json"]);
            refused(&out, &format!("{cmd}: {what}"), &["bad.json", &path]);
        }
        assert!(!dir.path("bad.min.json").exists());
    }
}

// ----- 4. sizes and counts ------------------------------------------------------------------

#[test]
fn sizes_and_counts_past_their_caps_are_refused() {
    let dir = Scratch::new("hostile-caps");
    for args in [
        &["sweep", "--seeds", "18446744073709551615"][..],
        &[
            "sweep",
            "--seed-range",
            "0..18446744073709551615",
            "--shard",
            "3/4096",
        ][..],
        &["mutants", "--seeds", "18446744073709551615"][..],
    ] {
        let out = timed(&dir.0, args);
        refused(
            &out,
            &format!("{args:?}"),
            &["MAX_SEEDS_PER_RUN", "4000000"],
        );
    }
    let out = timed(&dir.0, &["sweep", "--shard", "0/5000"]);
    refused(&out, "5000 shards", &["bad shard", "4096"]);
    assert!(!dir.path("reports").exists(), "nothing was written");

    // A file past the size cap is refused without being read (a sparse file: no disk). The
    // cap holds the longest trace the memory budget admits: 1 GiB and 256 MiB.
    let big = dir.path("big.jsonl");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len((1 << 30) + (256 << 20) + 1))
        .expect("sparse file");
    let out = timed(&dir.0, &["diagram", "big.jsonl"]);
    refused(
        &out,
        "diagram of a huge file",
        &["big.jsonl", "at most 1342177280 bytes"],
    );
    for cmd in ["replay", "minimize"] {
        let out = timed(&dir.0, &[cmd, "big.jsonl"]);
        refused(&out, cmd, &["big.jsonl", "at most 1342177280 bytes"]);
    }
    let out = timed(&dir.0, &["merge", "big.jsonl"]);
    refused(
        &out,
        "merge of a huge file",
        &["big.jsonl", "at most 67108864 bytes"],
    );
    let big_toml = dir.path("big.toml");
    std::fs::File::create(&big_toml)
        .and_then(|f| f.set_len((1 << 20) + 1))
        .expect("sparse file");
    let out = timed(&dir.0, &["run", "--scenario", "big.toml", "--seed", "1"]);
    refused(
        &out,
        "a huge scenario",
        &["big.toml", "at most 1048576 bytes"],
    );

    // `diagram --all` of a trace longer than a diagram can show.
    let line = r#"{"t":0,"actor":"client","kind":"resume","session":1}"#;
    let trace = vec![line; 10_001].join("\n");
    std::fs::write(dir.path("long.jsonl"), trace).expect("write");
    let out = timed(&dir.0, &["diagram", "--all", "long.jsonl"]);
    refused(
        &out,
        "diagram --all",
        &["long.jsonl", "MAX_DIAGRAM_EVENTS", "10001"],
    );
    // Without --all, the window around the end is drawn.
    let out = timed(&dir.0, &["diagram", "long.jsonl"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

// ----- 5. reports are all or nothing --------------------------------------------------------

#[test]
fn a_report_that_cannot_be_written_whole_is_not_written_at_all() {
    let dir = Scratch::new("hostile-report");
    let reports = dir.path("reports");
    std::fs::create_dir_all(reports.join("junit.xml")).expect("junit.xml as a directory");
    std::fs::write(reports.join("summary.json"), "old summary").expect("write");
    std::fs::write(reports.join("summary.md"), "old markdown").expect("write");
    let out = timed(
        &dir.0,
        &[
            "sweep",
            "--scenario",
            "cancel-storm",
            "--seeds",
            "2",
            "--jobs",
            "2",
        ],
    );
    refused(
        &out,
        "junit.xml is a directory",
        &["junit.xml", "is a directory"],
    );
    assert_eq!(
        std::fs::read_to_string(reports.join("summary.json")).expect("read"),
        "old summary"
    );
    assert_eq!(
        std::fs::read_to_string(reports.join("summary.md")).expect("read"),
        "old markdown"
    );
    let names: Vec<String> = std::fs::read_dir(&reports)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with('.')),
        "temporary files left: {names:?}"
    );
}

// ----- 6. bounds that hold jointly (issue 28) -----------------------------------------------

/// Every value below is inside its own bound; together they would hold more than a seed may
/// (`MAX_SEED_MEMORY_BYTES`): before the joint bound, the first aborted with an allocation
/// failure (exit 134) or ran for minutes on tens of gigabytes.
#[test]
fn streams_within_each_bound_but_past_the_memory_budget_are_refused() {
    let dir = Scratch::new("hostile-budget");
    let cases: &[(&str, &str, &[&str])] = &[
        (
            // 10,000 notifications of 1 MiB in one turn: every one of them is in memory at
            // once (about 11 GiB measured), though each bound holds alone.
            "stream",
            "[workload]\nnotifications_per_turn = [10000, 10000]\nnotification_bytes = [1048576, 1048576]\n[limits]\nquiesce_ms = 40000\n",
            &[":3:26:", "MAX_SEED_MEMORY_BYTES", "notifications_per_turn", "notification_bytes"],
        ),
        (
            // Bursts of 16,384 events of 64 KiB on 64 sessions.
            "bursts",
            "[workload]\nsessions = 64\nnotification_bytes = [16, 65536]\n[faults]\nburst = [0.1, 0.2]\nburst_size = [16384, 16384]\n",
            &[":7:14:", "MAX_SEED_MEMORY_BYTES", "burst_size"],
        ),
        (
            // A burst step of 16,384 events of 1 MiB.
            "burst-step",
            "[workload]\nnotification_bytes = [1048576, 1048576]\n[limits]\nmax_events = 1000\n[[steps]]\nat_ms = 0\naction = \"burst\"\ncount = 16384\n",
            &[":9:9:", "MAX_SEED_MEMORY_BYTES", "steps[0].count"],
        ),
        (
            // 64 KiB events and the default 200,000 trace events: a seed that runs to its
            // livelock guard keeps every event's text in its trace.
            "trace",
            "[workload]\nnotification_bytes = [65536, 65536]\n",
            &[":3:22:", "MAX_SEED_MEMORY_BYTES", "max_events", "200000"],
        ),
    ];
    for (name, body, needles) in cases {
        let file = format!("{name}.toml");
        std::fs::write(dir.path(&file), format!("name = \"x\"\n{body}")).expect("write");
        let path = format!("./{file}");
        for args in [
            &[
                "sweep",
                "--scenario",
                &path,
                "--seeds",
                "1",
                "--report-dir",
                "r",
            ][..],
            &["run", "--scenario", &path, "--seed", "1"][..],
        ] {
            let out = timed(&dir.0, args);
            let mut all = vec![file.as_str()];
            all.extend_from_slice(needles);
            refused(&out, name, &all);
        }
    }
    assert!(!dir.path("r").exists(), "a refused scenario wrote a report");

    // The same through a failure file's plan: its drawn environment (2,500 events of 1 MiB
    // per prompt), or a burst of 16,384 events of 16 KiB.
    // stale-callback-dispatches fails cancel-storm seed 0 (see tests/cli.rs).
    let out = palisade(
        &dir.0,
        &[
            "sweep",
            "--strategy",
            "uniform",
            "--scenario",
            "cancel-storm",
            "--seed-range",
            "0..1",
            "--mutant",
            "stale-callback-dispatches",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let original = read_json(&dir.path("reports/failures/cancel-storm-0.json"));
    let n = original["plan"]["faults"].as_array().expect("faults").len();
    let environment = |events: u32, bytes: u32| {
        json!({"agent": "codex-acp", "events_per_prompt": [events, events],
               "event_bytes": [bytes, bytes], "tool_call_per_mille": 0,
               "resource_per_mille": 0})
    };
    let mut huge_stream = original.clone();
    huge_stream["plan"]["environment"] = environment(2_500, 1 << 20);
    let mut huge_burst = original.clone();
    huge_burst["plan"]["environment"] = environment(4, 1 << 14);
    huge_burst["plan"]["faults"]
        .as_array_mut()
        .expect("faults")
        .push(json!({"at_ms": 10, "session": 1, "fault": "burst", "count": 16_384}));
    let burst_path = format!("plan.faults[{n}].count");
    for (what, file, path) in [
        (
            "2,500 events of 1 MiB",
            huge_stream,
            "plan.environment.events_per_prompt",
        ),
        (
            "a burst of 16,384 of 16 KiB",
            huge_burst,
            burst_path.as_str(),
        ),
    ] {
        write_json(&dir.path("bad.json"), &file);
        for cmd in ["replay", "minimize"] {
            let out = timed(&dir.0, &[cmd, "bad.json"]);
            refused(
                &out,
                &format!("{cmd}: {what}"),
                &["bad.json", path, "MAX_SEED_MEMORY_BYTES"],
            );
        }
        assert!(!dir.path("bad.min.json").exists());
    }
}

// ----- 7. an output that cannot be written is refused first (issue 28) ----------------------

/// `/proc` is a directory nobody, root included, can create a file in. Every command that
/// writes checks its destination by creating a file there, before any seed runs: before,
/// `sweep --report-dir /proc` ran the whole sweep and only then exited 2, its results lost.
#[test]
fn an_output_that_cannot_be_written_is_refused_before_anything_runs() {
    let dir = Scratch::new("hostile-unwritable");
    // A failure file to minimise, and a shard summary to merge.
    let out = palisade(
        &dir.0,
        &[
            "sweep",
            "--strategy",
            "uniform",
            "--scenario",
            "cancel-storm",
            "--seed-range",
            "0..1",
            "--mutant",
            "stale-callback-dispatches",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let cases: &[&[&str]] = &[
        // Thousands of seeds: minutes of work that used to be thrown away.
        &["sweep", "--report-dir", "/proc"],
        &["sweep", "--report-dir", "/proc/palisade-reports"],
        &["mutants", "--seeds", "40", "--report-dir", "/proc"],
        &["merge", "reports/summary.json", "--report-dir", "/proc"],
        &["corpus", "--seeds", "200", "-o", "/proc/corpus.json"],
        &[
            "minimize",
            "reports/failures/cancel-storm-0.json",
            "-o",
            "/proc/min.json",
        ],
        &[
            "run",
            "--scenario",
            "swarm",
            "--seed",
            "1",
            "--trace",
            "/proc/trace.jsonl",
        ],
    ];
    for args in cases {
        let out = timed(&dir.0, args);
        refused(&out, &format!("{args:?}"), &["/proc", "cannot write"]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            !said.contains("sweep:") && !said.contains("mutants:") && !said.contains("minimized:"),
            "{args:?} ran before it refused:\n{}",
            describe(&out)
        );
    }
}
