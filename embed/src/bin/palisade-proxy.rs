//! `palisade-proxy`: an ACP agent that runs another ACP agent under Palisade's fence.
//!
//! ```text
//! palisade-proxy --agent-cmd "npx @zed-industries/claude-code-acp" --state /var/lib/p.state
//! ```
//!
//! A client that launches agents by command launches this one instead: it speaks ACP on its
//! stdio as the agent would (see [`palisade_embed::proxy`]). `--help` lists the flags and
//! the exit codes.
//!
//! This file is the shell: the loop is [`palisade_embed::proxy::run`]. Here it runs on a
//! real tokio runtime, with real processes, the real filesystem, stdin/stdout and
//! SIGINT/SIGTERM.

use std::process::ExitCode;

use palisade_embed::proxy::{self, real};

fn main() -> ExitCode {
    let options = match proxy::parse_args(std::env::args_os().skip(1)) {
        Ok(options) => options,
        Err(error) => return ExitCode::from(proxy::usage_exit(&error)),
    };
    if let Err(message) = palisade_embed::logging::init(options.log_format) {
        eprintln!("palisade-proxy: {message}");
        return ExitCode::from(2);
    }
    let config = match proxy::config_for(&options) {
        Ok(config) => config,
        Err((code, message)) => {
            eprintln!("palisade-proxy: {message}");
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("palisade-proxy: cannot start the runtime: {error}");
            return ExitCode::from(1);
        }
    };
    ExitCode::from(runtime.block_on(async {
        let io = real::io(&options);
        proxy::run(options, config, io).await
    }))
}
