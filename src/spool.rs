//! Standard input from a pipe, kept in a temporary file so that it reads as a file does.
//!
//! `zstd -dc run.csv.zst | allocsim replay -` names standard input (`/dev/stdin`). A
//! pipe can be read once, but `replay`, `check` and `export` read a file more than once
//! (its first bytes to tell the format, then the whole as it streams, and the whole
//! again to explain an out-of-memory or list every problem). Given a pipe, they used
//! to read it whole into memory instead (about 40 bytes per event and 3–4× the time of
//! a file: 397 MB and 1.98 s against 6.8 MB and 0.53 s for 10⁷ events).
//!
//! [`stdin`] copies a piped standard input into an unnamed temporary file (`O_TMPFILE`
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

use std::io;

/// Copies standard input into a temporary file and puts the file on descriptor 0,
/// when standard input is a pipe or socket. `Ok(false)` where nothing was done: not a
/// pipe, or no temporary file could be made (nothing read yet: the caller reads the
/// pipe as before).
///
/// # Errors
/// Reading the pipe or writing the file failed (the disk full, say) after part of the
/// input was read: it cannot be read again.
pub fn stdin() -> Result<bool, SpoolError> {
    let stdin = io::stdin();
    use rustix::fs::FileType;
    let piped = rustix::fs::fstat(&stdin).is_ok_and(|st| {
        matches!(
            FileType::from_raw_mode(st.st_mode),
            FileType::Fifo | FileType::Socket
        )
    });
    if !piped {
        return Ok(false);
    }
    let dir = std::env::temp_dir();
    let Ok(mut file) = tempfile::tempfile_in(&dir) else {
        return Ok(false);
    };
    let stage = crate::progress::Stage::start("reading standard input".to_string());
    // `io::copy` from a pipe to a file splices in the kernel.
    io::copy(&mut stdin.lock(), &mut file).map_err(|e| SpoolError {
        dir: dir.clone(),
        e,
    })?;
    drop(stage);
    rustix::stdio::dup2_stdin(&file).map_err(|e| SpoolError { dir, e: e.into() })?;
    Ok(true)
}

/// Standard input could not be kept: what [`stdin`] was doing, in one line.
#[derive(Debug, thiserror::Error)]
#[error(
    "- (standard input): keeping the piped input in a temporary file in {} failed: {e}; \
     set TMPDIR to a directory with room, or save the input to a file and name it",
    dir.display()
)]
pub struct SpoolError {
    dir: std::path::PathBuf,
    e: io::Error,
}
