//! `palisade-supervise`: runs any ACP agent under the Palisade core's recovery and prints
//! every session event as one JSON line on stdout.
//!
//! ```text
//! palisade-supervise --agent-cmd "npx @zed-industries/claude-code-acp" \
//!     --state /tmp/claude.state --prompt "list the files here" --prompt "and now count them"
//! ```
//!
//! Each prompt waits for the previous turn to end. Without `--prompt`, prompts are read
//! from stdin, one per line. Exit code: 0 when every turn completed, 1 when one did not (or
//! the supervisor could not run), 2 on bad usage or an unusable or busy state file, 130 /
//! 143 after SIGINT / SIGTERM (the agents were stopped first). `--help` lists the flags,
//! the bounds on what the program is given, and the exit codes.
//!
//! Every agent runs in its own process group with a watchdog (`palisade-watchdog`, looked
//! for beside this program): when this program exits, however it exits, no process of
//! any agent tree it started is left.
//!
//! This file is the shell: the loop is [`palisade_embed::supervise`], which the simulator
//! drives too. Here it runs on a real tokio runtime, with real processes, the real
//! filesystem, stdout/stderr, stdin and SIGINT/SIGTERM — never on a simulated runtime.

use std::process::ExitCode;

use palisade_embed::supervise::{self, real};

fn main() -> ExitCode {
    // `args_os`: an argument need not be UTF-8 (a file name); the parser says which one
    // must be and is not.
    let options = match supervise::parse_args(std::env::args_os().skip(1)) {
        Ok(options) => options,
        Err(error) => return ExitCode::from(supervise::usage_exit(&error)),
    };
    if let Err(message) = palisade_embed::logging::init(options.log_format) {
        eprintln!("palisade-supervise: {message}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("palisade-supervise: cannot start the runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(async {
        match supervise::config_for(&options) {
            Ok(config) => {
                let io = real::io(&options);
                supervise::run(options, config, io).await
            }
            Err((code, message)) => {
                eprintln!("palisade-supervise: {message}");
                code
            }
        }
    });
    ExitCode::from(code)
}
