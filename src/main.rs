//! `allocsim`: replays allocation traces under GPU allocator policies, in simulation
//! and on real CUDA memory.
//!
//! This binary is thin glue: flags (`flags.rs`) become validated inputs (`load.rs`), and
//! each subcommand (`commands/`) calls the library crates; outputs go through
//! `output.rs` (a temporary file renamed over the target on success) and Ctrl-C through
//! `interrupt.rs`. `main` is the only place that prints errors and chooses exit codes,
//! from the one table in [`Exit`].

#![forbid(unsafe_code)]

mod commands;
mod flags;
mod interrupt;
mod load;
mod output;
mod progress;
#[cfg(unix)]
mod spool;
mod table;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use policies::DeviceError;

use crate::flags::{Cli, Command};

/// How a run of allocsim ends: the one table of exit codes (README and ARCHITECTURE.md
/// show the same table; `Exit::of` maps every error to a row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 0: it ran (an out-of-memory inside a replay is a result, not a failure).
    Ran,
    /// 2: bad input or usage: a trace, profile, flag or option value that cannot be used,
    /// an output path that would overwrite an input, traces with problems (`check`).
    BadInput,
    /// 3: no usable CUDA driver or device (`probe`, `validate`).
    NoDriver,
    /// 4: the CUDA driver failed during a run (an error other than out of memory).
    DriverFailed,
    /// 5: an output could not be written (the old file, if any, is left as it was).
    OutputFailed,
    /// 130: stopped by Ctrl-C (after freeing what it allocated on the GPU; no output
    /// written).
    Interrupted,
    /// 101: an internal error, a bug.
    Bug,
}

impl Exit {
    /// The process exit code.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Ran => 0,
            Exit::BadInput => 2,
            Exit::NoDriver => 3,
            Exit::DriverFailed => 4,
            Exit::OutputFailed => 5,
            Exit::Interrupted => 130,
            Exit::Bug => 101,
        }
    }

    /// The exit for an error: the first error in its chain that is a driver, output or
    /// interruption failure decides; anything else is bad input.
    pub fn of(err: &anyhow::Error) -> Exit {
        err.chain()
            .find_map(Exit::of_nested)
            .unwrap_or(Exit::BadInput)
    }

    /// The exit an error calls for, looking also into the errors an `io::Error` or a
    /// `csv::Error` carries (they hide them from `source()`).
    fn of_nested(e: &(dyn std::error::Error + 'static)) -> Option<Exit> {
        if let Some(exit) = Exit::of_one(e) {
            return Some(exit);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            return Exit::of_nested(inner);
        }
        match e.downcast_ref::<csv::Error>().map(csv::Error::kind) {
            Some(csv::ErrorKind::Io(io)) => Exit::of_nested(io),
            _ => None,
        }
    }

    /// The exit one error in a chain calls for, if it is not plain bad input.
    fn of_one(e: &(dyn std::error::Error + 'static)) -> Option<Exit> {
        use gpu_backend::{OpenError, ProbeError, ValidateError};
        use sim::ReplayError;
        let replay = |r: &ReplayError| match r {
            ReplayError::Interrupted { .. } => Some(Exit::Interrupted),
            ReplayError::Device {
                error: DeviceError::Driver { .. },
                ..
            } => Some(Exit::DriverFailed),
            _ => None,
        };
        let open = |o: &OpenError| match o {
            OpenError::NoDriver(_) => Exit::NoDriver,
            OpenError::Driver(_) => Exit::DriverFailed,
        };
        if e.is::<interrupt::Interrupted>() {
            return Some(Exit::Interrupted);
        }
        if e.is::<output::WriteFailed>() {
            return Some(Exit::OutputFailed);
        }
        if let Some(r) = e.downcast_ref::<ReplayError>() {
            return replay(r);
        }
        if let Some(DeviceError::Driver { .. }) = e.downcast_ref::<DeviceError>() {
            return Some(Exit::DriverFailed);
        }
        if let Some(o) = e.downcast_ref::<OpenError>() {
            return Some(open(o));
        }
        match e.downcast_ref::<ProbeError>() {
            Some(ProbeError::Open(o)) => return Some(open(o)),
            Some(ProbeError::Device(_)) => return Some(Exit::DriverFailed),
            None => {}
        }
        match e.downcast_ref::<ValidateError>() {
            Some(ValidateError::Replay { error, .. }) => replay(error),
            Some(ValidateError::Device(_)) => Some(Exit::DriverFailed),
            _ => None,
        }
    }
}

fn main() -> ExitCode {
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{}", usage_error(&e));
            return ExitCode::from(Exit::BadInput.code());
        }
    };
    cli.command.dash_means_stdout();
    if cli.command.stdin_inputs() > 1 {
        eprintln!(
            "error: - (standard input) is named more than once: it can be read once; save it \
             to a file to use it twice"
        );
        return ExitCode::from(Exit::BadInput.code());
    }
    // A piped trace reads as a file does (streamed, read again where needed).
    #[cfg(unix)]
    if let Err(e) = spool::pipes(cli.command.inputs_mut()) {
        eprintln!("error: {e}");
        return ExitCode::from(Exit::BadInput.code());
    }
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
    interrupt::install();
    let exit = finish(std::panic::catch_unwind(|| run(cli.command)));
    ExitCode::from(exit.code())
}

/// The exit of a command's outcome, after printing its error (one line) if any.
fn finish(outcome: std::thread::Result<anyhow::Result<Exit>>) -> Exit {
    match outcome {
        Ok(Ok(exit)) => exit,
        // The reader went away (`allocsim ... | head`): stop quietly, as cat does.
        Ok(Err(err)) if is_broken_pipe(&err) => Exit::Ran,
        Ok(Err(err)) => {
            eprintln!("error: {}", message(&err));
            Exit::of(&err)
        }
        // The panic hook printed it.
        Err(_) => Exit::Bug,
    }
}

fn run(command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::Replay(a) => commands::replay::run(a),
        Command::Compare(a) => commands::compare::run(a),
        Command::Fit(a) => commands::fit::run(a),
        Command::Sweep(a) => commands::sweep::run(a),
        Command::Merge(a) => commands::sweep::merge(a),
        Command::Diff(a) => commands::diff::run(a),
        Command::Generate(a) => commands::generate::run(a),
        Command::Check(a) => commands::check::run(a),
        Command::Policies(a) => commands::policies::run(a),
        Command::Convert(a) => commands::convert::run(a),
        Command::Fidelity(a) => commands::fidelity::run(a),
        Command::Gpus(a) => commands::gpus::run(a),
        Command::Probe(a) => commands::gpu::probe(a),
        Command::Validate(a) => commands::gpu::validate(a),
        Command::Plot(a) => commands::plot::run(a),
        Command::Export(a) => commands::export::run(a),
        Command::Bench(a) => commands::bench::run(a),
    }
}

/// A usage error of the argument parser on one line: clap's message, tip, usage and
/// hint joined (`error: ...; tip: ...; Usage: ...; For more information, try '--help'.`). Without a command, the commands are
/// listed instead of the whole help.
fn usage_error(e: &clap::Error) -> String {
    if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let cli = Cli::command();
        let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        return format!(
            "error: no command given; Usage: allocsim <COMMAND> ({}); `allocsim --help` \
             says what each does",
            names.join(", ")
        );
    }
    e.render()
        .to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(one_line)
        .collect::<Vec<_>>()
        .join("; ")
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

/// An error's message on one line: the errors of its chain joined by `: `, each said
/// once (an error whose text already ends with its cause's, as a failed replay of a
/// batch or a failed write does, is not followed by the cause again).
fn message(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for e in err.chain() {
        let part = e.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    one_line(&text)
}

/// Collapses a message onto one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use policies::DeviceError;
    use sim::ReplayError;

    fn driver_error() -> DeviceError {
        DeviceError::Driver {
            code: 700,
            message: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        }
    }

    /// Each row of the exit-code table is reached by the errors it names, through
    /// context and wrapping (a compare error around a replay error, an io error around
    /// a write failure), and anything else is bad input.
    #[test]
    fn every_error_maps_to_its_exit_code() {
        let interrupted = anyhow::Error::new(sim::CompareError::Replay {
            trace: "t".into(),
            policy: "caching".into(),
            source: ReplayError::Interrupted { event_index: 3 },
        })
        .context("comparing");
        let driver = anyhow::Error::new(sim::CompareError::Replay {
            trace: "t".into(),
            policy: "caching".into(),
            source: ReplayError::Device {
                event_index: 3,
                error: driver_error(),
            },
        });
        let unsupported = anyhow::Error::new(ReplayError::Device {
            event_index: 0,
            error: DeviceError::Unsupported { what: "vmm" },
        });
        let write = anyhow::Error::new(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            output::WriteFailed::new("out.csv", std::io::ErrorKind::StorageFull.into()),
        ))
        .context("writing the CSV");
        let write_in_csv = anyhow::Error::new(std::io::Error::other(csv::Error::from(
            std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                output::WriteFailed::new("t.csv", std::io::ErrorKind::StorageFull.into()),
            ),
        )))
        .context("writing t.csv");
        let cases = [
            (anyhow::anyhow!("x.csv: line 2: bad"), Exit::BadInput, 2),
            (
                anyhow::Error::new(gpu_backend::OpenError::NoDriver("none".into())),
                Exit::NoDriver,
                3,
            ),
            (
                anyhow::Error::new(gpu_backend::ProbeError::Open(
                    gpu_backend::OpenError::NoDriver("none".into()),
                )),
                Exit::NoDriver,
                3,
            ),
            (driver, Exit::DriverFailed, 4),
            (
                anyhow::Error::new(gpu_backend::ValidateError::Device(driver_error())),
                Exit::DriverFailed,
                4,
            ),
            (unsupported, Exit::BadInput, 2),
            (write, Exit::OutputFailed, 5),
            (write_in_csv, Exit::OutputFailed, 5),
            (interrupted, Exit::Interrupted, 130),
            (
                anyhow::Error::new(interrupt::Interrupted),
                Exit::Interrupted,
                130,
            ),
        ];
        for (err, exit, code) in cases {
            assert_eq!(Exit::of(&err), exit, "{err:#}");
            assert_eq!(exit.code(), code);
        }
        assert_eq!(Exit::Bug.code(), 101);
        assert_eq!(Exit::Ran.code(), 0);
    }

    /// A panic in a command is exit 101; a command's own exit and an error's exit come
    /// through `finish`.
    #[test]
    fn finish_maps_outcomes() {
        let panicked = std::panic::catch_unwind(|| -> anyhow::Result<Exit> { panic!("a bug") });
        assert_eq!(finish(panicked), Exit::Bug);
        assert_eq!(finish(Ok(Ok(Exit::BadInput))), Exit::BadInput);
        assert_eq!(
            finish(Ok(Err(anyhow::Error::new(interrupt::Interrupted)))),
            Exit::Interrupted
        );
        let pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert_eq!(finish(Ok(Err(anyhow::Error::new(pipe)))), Exit::Ran);
    }

    /// An error's line says each error of its chain once, context first: a cause the
    /// error's own text ends with is not repeated.
    #[test]
    fn messages_say_each_cause_once() {
        let replay = ReplayError::Rejected {
            event_index: 1,
            message: "Unrecognized key".into(),
        };
        let batch = anyhow::Error::new(sim::CompareError::Replay {
            trace: "t".into(),
            policy: "caching".into(),
            source: replay,
        })
        .context("replaying t");
        assert_eq!(
            message(&batch),
            "replaying t: t under caching: event 1: Unrecognized key"
        );
        let write = anyhow::Error::new(output::WriteFailed::new(
            "out.csv",
            std::io::Error::other("disk full"),
        ));
        assert_eq!(message(&write), "cannot write out.csv: disk full");
    }

    /// Usage errors of the argument parser come out as one line with the usage.
    #[test]
    fn usage_errors_are_one_line() {
        for args in [
            &["allocsim", "replay", "t.yaml", "--frobnicate"][..],
            &["allocsim", "compare"],
            &["allocsim", "replay", "t.yaml", "--capacity", "16"],
            &["allocsim"],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err();
            let line = usage_error(&e);
            assert!(!line.contains('\n'), "{line}");
            assert!(line.starts_with("error: "), "{line}");
            assert!(
                line.contains("'--help'") || line.contains("`allocsim --help`"),
                "{line}"
            );
        }
    }

    /// The clap definition is consistent (no duplicate flags, defaults parse).
    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
    }
}
