//! The `qproxy` binary: Knative's queue-proxy, configured by its environment.
//!
//! ```text
//! qproxy            serve, configured by Knative's environment variables
//! qproxy demo       a hello app with qproxy in front of it, until Ctrl-C
//! qproxy --version  print the version
//! ```

use std::process::ExitCode;

use qproxy::Config;
use qproxy::config::Workers;

const USAGE: &str = "\
usage: qproxy [demo | --version | --help]

  (no argument)  serve as Knative's queue-proxy, configured by the environment
  demo           start a hello app with qproxy in front of it; Ctrl-C stops
  --version      print the version
";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    if let Some(extra) = args.next() {
        eprintln!("qproxy: unexpected argument {extra:?}\n{USAGE}");
        return ExitCode::from(2);
    }
    match command.as_deref() {
        None => serve(),
        Some("demo") => demo(),
        Some("--version" | "-V" | "version") => {
            println!("qproxy {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("--help" | "-h" | "help") => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("qproxy: unknown argument {other:?}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn serve() -> ExitCode {
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => return fail(&e),
    };
    qproxy::init_logging(&config);
    let runtime = match runtime(config.workers) {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    match runtime.block_on(qproxy::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Logging is up: the error is one log line, as Knative's is.
            tracing::error!(error = %e, "Failed to bring up queue-proxy, shutting down.");
            ExitCode::FAILURE
        }
    }
}

fn demo() -> ExitCode {
    // The demo's app shares the runtime with the proxy: give them a pool.
    let runtime = match runtime(Workers::Auto) {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    match runtime.block_on(qproxy::demo::run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// The runtime that serves: one thread, or a work-stealing pool.
fn runtime(workers: Workers) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match workers {
        Workers::One => tokio::runtime::Builder::new_current_thread(),
        Workers::Pool(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        Workers::Auto => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build()
}

/// One line on stderr, exit code 1: for failures before logging is up.
fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("qproxy: {e}");
    ExitCode::FAILURE
}
