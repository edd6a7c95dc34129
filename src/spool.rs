//! Standard input from a pipe, kept in a temporary file so that it reads as a file does.
//!
//! `zstd -dc run.csv.zst | allocsim replay -` names standard input (`/dev/stdin`). A
//! pipe can be read once, but `replay`, `check` and `export` read a file more than once
//! (its first bytes to tell the format, then the whole as it streams, and the whole
//! again to explain an out-of-memory or list every problem). Given a pipe, they used
//! to read it whole into memory instead (about 40 bytes per event and 3–4× the time of
//! a file: 397 MB and 1.98 s against 6.8 MB and 0.53 s for 10⁷ events).
//!
//! [`pipes`] copies a piped standard input into an unnamed temporary file (`O_TMPFILE`
//! in `$TMPDIR`, gone when the process ends, however it ends) and puts that file on
//! file descriptor 0. Every later open of `/dev/stdin` then opens the file from its
//! start, as for `allocsim replay - < run.csv`: the commands stream it and read it
//! again as they do a file, their messages still name `/dev/stdin`, and their memory
//! follows the live allocations. The cost is the copy (the kernel's `splice`, about a
//! tenth of the replay's time) and the disk space of the input in `$TMPDIR`.
//!
//! Only a pipe or socket is copied: a regular file (`< run.csv`) already reads as a
//! file, and a terminal or device (`< /dev/zero`) is read as before (a device could
//! fill the disk).
//!
//! A process substitution (`allocsim replay <(zstd -dc run.csv.zst)`) names a pipe
//! `/dev/fd/N`: [`descriptor_pipes`] copies it the same way and names the copy instead
//! (`/dev/fd/M`, the copy's descriptor, kept open until the process ends), which
//! is what messages then name. A named pipe (`mkfifo`) keeps its name and is read once,
//! whole, as before.

use std::io;

/// Makes the piped inputs among `inputs` files: standard input where one of them names
/// it ([`stdin`]), and on Linux each named by a descriptor ([`descriptor_pipes`]).
///
/// # Errors
/// Reading a pipe or writing its copy (the disk full, say) failed after part of it was
/// read: it cannot be read again.
pub fn pipes(inputs: &mut [std::path::PathBuf]) -> Result<(), SpoolError> {
    if inputs.iter().any(|p| p.as_os_str() == crate::flags::STDIN) {
        stdin()?;
    }
    #[cfg(target_os = "linux")]
    descriptor_pipes(inputs)?;
    Ok(())
}

/// Copies standard input into a temporary file and puts the file on descriptor 0,
/// when standard input is a pipe or socket; nothing where it is not, or where no
/// temporary file can be made (nothing read yet: the command reads the pipe as before).
fn stdin() -> Result<(), SpoolError> {
    let stdin = io::stdin();
    if !is_pipe(&stdin) {
        return Ok(());
    }
    let name = "- (standard input)";
    let Some(file) = copy(&mut stdin.lock(), name)? else {
        return Ok(());
    };
    rustix::stdio::dup2_stdin(&file).map_err(|e| SpoolError {
        name: name.to_string(),
        dir: std::env::temp_dir(),
        e: e.into(),
    })
}

/// Copies each input named `/dev/fd/N` or `/proc/self/fd/N` that is a pipe or socket (a
/// process substitution) into a temporary file, and names the copy in its place
/// (`/dev/fd/M`); the copies stay open until the process ends. An input whose
/// copy cannot be made is left as it is (read once, whole).
#[cfg(target_os = "linux")]
fn descriptor_pipes(inputs: &mut [std::path::PathBuf]) -> Result<(), SpoolError> {
    use std::os::fd::IntoRawFd;
    for path in inputs {
        let by_descriptor = ["/dev/fd/", "/proc/self/fd/"]
            .iter()
            .any(|dir| path.to_str().is_some_and(|p| p.starts_with(dir)));
        if !by_descriptor {
            continue;
        }
        let Ok(mut pipe) = std::fs::File::open(&*path) else {
            continue;
        };
        if !is_pipe(&pipe) {
            continue;
        }
        let name = path.display().to_string();
        if let Some(file) = copy(&mut pipe, &name)? {
            // Kept open for the rest of the process: the path below names it.
            *path = std::path::PathBuf::from(format!("/dev/fd/{}", file.into_raw_fd()));
        }
    }
    Ok(())
}

/// Whether `fd` is a pipe or a socket.
fn is_pipe(fd: impl std::os::fd::AsFd) -> bool {
    use rustix::fs::FileType;
    rustix::fs::fstat(fd).is_ok_and(|st| {
        matches!(
            FileType::from_raw_mode(st.st_mode),
            FileType::Fifo | FileType::Socket
        )
    })
}

/// `from` copied whole into a new unnamed temporary file in `$TMPDIR`; `None` where no
/// temporary file can be made (nothing read then).
fn copy(from: &mut impl io::Read, name: &str) -> Result<Option<std::fs::File>, SpoolError> {
    let dir = std::env::temp_dir();
    let Ok(mut file) = tempfile::tempfile_in(&dir) else {
        return Ok(None);
    };
    let stage = crate::progress::Stage::start(format!("reading {name}"));
    // `io::copy` from a pipe to a file splices in the kernel.
    io::copy(from, &mut file).map_err(|e| SpoolError {
        name: name.to_string(),
        dir,
        e,
    })?;
    drop(stage);
    Ok(Some(file))
}

/// A piped input could not be kept: which, and what went wrong, in one line.
#[derive(Debug, thiserror::Error)]
#[error(
    "{name}: keeping the piped input in a temporary file in {} failed: {e}; set TMPDIR to \
     a directory with room, or save the input to a file and name it",
    dir.display()
)]
pub struct SpoolError {
    name: String,
    dir: std::path::PathBuf,
    e: io::Error,
}
