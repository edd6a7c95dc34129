//! `allocsim`: replays allocation traces under GPU allocator policies, in simulation
//! and on real CUDA memory.
//!
//! This binary is thin glue: flags (`flags.rs`) become validated inputs (`load.rs`), and
//! each subcommand (`commands/`) calls the library crates. `main` is the only place that
//! prints errors and chooses exit codes: 0 ran (an out-of-memory inside a replay is a
//! result), 2 bad input or usage, 3 no usable CUDA driver, 101 an internal error (a bug),
//! 130 stopped by Ctrl-C (after freeing what it allocated on the GPU).

mod commands;
mod flags;
mod load;
mod output;

use std::process::ExitCode;

use clap::Parser;

use crate::flags::{Cli, Command};

/// Exit code for bad input or usage.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit code when a GPU command finds no usable CUDA driver.
const EXIT_NO_DRIVER: u8 = 3;
/// Exit code for an internal error (a panic: a bug).
const EXIT_BUG: u8 = 101;
/// Exit code after Ctrl-C (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

/// Marks an error as "no usable CUDA driver" (exit 3).
#[derive(Debug)]
pub struct NoDriver(pub String);

impl std::fmt::Display for NoDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no usable CUDA driver: {}", self.0)
    }
}

impl std::error::Error for NoDriver {}

/// Marks an error as "stopped by Ctrl-C" (exit 130), after cleaning up.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted; everything allocated on the GPU was freed")
    }
}

impl std::error::Error for Interrupted {}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_BAD_INPUT } else { 0 });
        }
    };
    // A panic is a bug: report it on one line, not as a backtrace dump.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error (a bug in allocsim, please report it): {}{at}",
            one_line(msg)
        );
    }));
    match std::panic::catch_unwind(|| run(cli.command)) {
        Ok(Ok(code)) => code,
        Ok(Err(err)) if is_broken_pipe(&err) => {
            // The reader went away (`allocsim ... | head`): stop quietly, as cat does.
            ExitCode::SUCCESS
        }
        Ok(Err(err)) => {
            eprintln!("error: {}", one_line(&format!("{err:#}")));
            if err.downcast_ref::<NoDriver>().is_some() {
                ExitCode::from(EXIT_NO_DRIVER)
            } else if err.downcast_ref::<Interrupted>().is_some() {
                ExitCode::from(EXIT_INTERRUPTED)
            } else {
                ExitCode::from(EXIT_BAD_INPUT)
            }
        }
        Err(_) => ExitCode::from(EXIT_BUG),
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Replay(a) => commands::replay::run(a),
        Command::Compare(a) => commands::compare::run(a),
        Command::Generate(a) => commands::generate::run(a),
        Command::Check(a) => commands::check::run(a),
        Command::Policies(a) => commands::policies::run(a),
        Command::Convert(a) => commands::convert::run(a),
        Command::Fidelity(a) => commands::fidelity::run(a),
        Command::Probe(a) => commands::gpu::probe(a),
        Command::Validate(a) => commands::gpu::validate(a),
    }
}

/// Whether the error comes from writing to a closed pipe.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || e.downcast_ref::<csv::Error>().is_some_and(|c| {
                matches!(c.kind(), csv::ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
            })
    })
}

/// Collapses a message onto one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
