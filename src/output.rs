//! Where results go: stdout, or a file (`-o`, `--timeline`). Nothing is lost: outputs
//! are checked before anything is read ([`check`]: not an input, not a directory, an
//! extension that fits), and a file is written to a temporary file in its directory
//! that replaces it only when everything was written ([`Output::finish`]); on an error
//! or Ctrl-C the old file is left as it was and the temporary file is removed. A named
//! pipe or a device (`-o /dev/null`) is written into, never replaced. `-o -` is
//! standard output: for a command whose `-o` is optional, the same as leaving it out
//! ([`crate::flags::Command::dash_means_stdout`]).

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::bail;
use workloads::Format;

use crate::interrupt;

/// An output that could not be written (exit 5). Write errors of an [`Output`] carry
/// it inside their `io::Error`, so it survives the CSV writer's wrapping.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {target}: {source}")]
pub struct WriteFailed {
    target: String,
    #[source]
    source: io::Error,
}

impl WriteFailed {
    /// Writing `target` failed with `source`.
    pub fn new(target: impl Into<String>, source: io::Error) -> WriteFailed {
        WriteFailed {
            target: target.into(),
            source,
        }
    }
}

/// What an output file holds, which its extension must not contradict.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// A CSV table: any extension but another trace format's.
    Csv,
    /// A YAML device profile: any extension but another trace format's.
    Profile,
    /// A trace in this format (already chosen from `--to`/`--format` or the extension).
    Trace,
    /// A picture (`.svg` or `.png`, already checked).
    Image,
    /// A PyTorch memory snapshot (`.pickle`, `.pkl` or `.json`, already checked).
    Snapshot,
}

/// An output a command will write, named by its flag.
pub struct Planned<'a> {
    /// The flag, for messages (`-o`, `--timeline`).
    pub flag: &'static str,
    /// The file.
    pub path: &'a Path,
    /// What it will hold.
    pub kind: Kind,
}

/// Checks the outputs of a command before anything is read or written: none is one of
/// `inputs` (the same path, or the same file through another name or a link), none is
/// another output, a directory, or in a directory that does not exist, and each
/// extension fits what is written.
///
/// # Errors
/// The first problem, naming the flag and the file (bad usage: exit 2).
pub fn check(outputs: &[Planned<'_>], inputs: &[&Path]) -> anyhow::Result<()> {
    for (i, out) in outputs.iter().enumerate() {
        let (flag, path) = (out.flag, out.path);
        if is_stdout(path) {
            if flag != "-o" {
                bail!(
                    "{flag} -: standard output has the command's own report; write {flag} to \
                     a file"
                );
            }
            continue;
        }
        for input in inputs {
            if path == *input || same_file(path, input) {
                bail!(
                    "{flag} {}: that is the input {}; write to another file (allocsim never \
                     overwrites its input)",
                    path.display(),
                    input.display()
                );
            }
        }
        for other in &outputs[..i] {
            if path == other.path || same_file(path, other.path) {
                bail!(
                    "{flag} {} and {} {} are the same file",
                    path.display(),
                    other.flag,
                    other.path.display()
                );
            }
        }
        if path.is_dir() {
            bail!("{flag} {}: is a directory", path.display());
        }
        let dir = parent(path);
        if !dir.is_dir() {
            bail!(
                "{flag} {}: the directory {} does not exist",
                path.display(),
                dir.display()
            );
        }
        let wrong = |what: &str, named: Format| -> anyhow::Result<()> {
            bail!(
                "{flag} {}: this writes {what}, but the extension names {named} traces",
                path.display()
            )
        };
        match (out.kind, Format::from_extension(path)) {
            (Kind::Csv, Some(f)) if f != Format::Csv => wrong("CSV", f)?,
            (Kind::Profile, Some(f)) if f != Format::Yaml => wrong("a YAML device profile", f)?,
            _ => {}
        }
    }
    Ok(())
}

/// Whether `path` is `-`, standard output (`-o -`).
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Whether `a` and `b` name the same existing file, through links or other spellings.
/// From the file's identity (`stat`), without opening either: an input may be a named
/// pipe, which opening would block on or disturb.
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        match (fs::metadata(a), fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        match (fs::canonicalize(a), fs::canonicalize(b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }
}

/// The directory a file is in (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Temporary files being written, removed if Ctrl-C ends the process at once.
static TEMPORARY: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes the temporary files of outputs being written (on a second Ctrl-C).
pub fn remove_temporary_files() {
    let files = TEMPORARY.lock().unwrap_or_else(|e| e.into_inner());
    for f in files.iter() {
        let _ = fs::remove_file(f);
    }
}

/// A buffered writer to stdout or to a file's temporary stand-in. Write errors carry
/// [`WriteFailed`]. Call [`Output::finish`]: dropped without it, a file output leaves
/// the old file as it was.
pub struct Output {
    target: String,
    writer: BufWriter<Box<dyn Write>>,
    file: Option<Pending>,
}

/// A file output until it is finished.
struct Pending {
    /// The file to replace (a link's target, so the link stays).
    target: PathBuf,
    /// The temporary file beside it (removed when dropped).
    temp: Option<tempfile::TempPath>,
    /// Ctrl-C waits for `finish` to decide while this is held.
    _in_order: interrupt::InOrder,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(temp) = &self.temp {
            let mut files = TEMPORARY.lock().unwrap_or_else(|e| e.into_inner());
            files.retain(|f| f.as_path() != &**temp);
        }
    }
}

/// An output to `path` (a temporary file beside it until [`Output::finish`]), or to
/// stdout (no path, or `-`).
///
/// # Errors
/// [`WriteFailed`] when the temporary file cannot be created.
pub fn create(path: Option<&Path>) -> anyhow::Result<Output> {
    let Some(path) = path.filter(|p| !is_stdout(p)) else {
        return Ok(Output {
            target: "stdout".into(),
            writer: BufWriter::new(Box::new(io::stdout().lock())),
            file: None,
        });
    };
    let shown = path.display().to_string();
    let failed = |e: io::Error| WriteFailed::new(shown.clone(), e);
    // Write through a link to its target, so the link stays a link.
    let target = match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => fs::canonicalize(path).unwrap_or(path.into()),
        _ => path.to_path_buf(),
    };
    // A named pipe or a device (`-o /dev/null`, `-o /dev/stdout`) is written into as it
    // is: a file renamed over it would replace it (as root, `/dev/null` itself), and
    // what it passes on is not kept, so there is no old content to protect.
    if fs::metadata(&target).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .map_err(failed)?;
        return Ok(Output {
            target: shown,
            writer: BufWriter::new(Box::new(file)),
            file: None,
        });
    }
    let in_order = interrupt::in_order();
    let prefix = format!(
        ".{}.",
        target.file_name().unwrap_or_default().to_string_lossy()
    );
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        // As a plain create would: 0666 less the umask.
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    let temp = {
        let mut files = TEMPORARY.lock().unwrap_or_else(|e| e.into_inner());
        let temp = builder.tempfile_in(parent(&target)).map_err(failed)?;
        files.push(temp.path().to_path_buf());
        temp
    };
    let (file, temp) = temp.into_parts();
    Ok(Output {
        target: shown,
        writer: BufWriter::new(Box::new(file)),
        file: Some(Pending {
            target,
            temp: Some(temp),
            _in_order: in_order,
        }),
    })
}

impl Output {
    /// Flushes and, for a file, replaces the target with what was written (with the
    /// old file's permissions), unless Ctrl-C was pressed meanwhile.
    ///
    /// # Errors
    /// [`WriteFailed`]; [`interrupt::Interrupted`] after Ctrl-C (the old file is then
    /// left as it was).
    pub fn finish(mut self) -> anyhow::Result<()> {
        self.flush()?;
        let Some(mut pending) = self.file.take() else {
            return Ok(());
        };
        let failed = |e: io::Error| WriteFailed::new(self.target.clone(), e);
        let temp = pending.temp.as_deref().expect("taken only here");
        // The data is on disk before the name points to it.
        File::open(temp)
            .and_then(|f| f.sync_all())
            .map_err(failed)?;
        interrupt::check()?;
        if let Ok(old) = fs::metadata(&pending.target) {
            fs::set_permissions(temp, old.permissions()).map_err(failed)?;
        }
        let temp = pending.temp.take().expect("taken only here");
        let registered = temp.to_path_buf();
        let result = temp.persist(&pending.target);
        TEMPORARY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|f| *f != registered);
        result.map_err(|e| failed(e.error))?;
        Ok(())
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let target = &self.target;
        self.writer.write(buf).map_err(|e| tag(target, e))
    }

    fn flush(&mut self) -> io::Result<()> {
        let target = &self.target;
        self.writer.flush().map_err(|e| tag(target, e))
    }
}

/// `e` with the [`WriteFailed`] tag, keeping its kind (a broken pipe stays one).
fn tag(target: &str, e: io::Error) -> io::Error {
    if e.get_ref().is_some_and(|inner| inner.is::<WriteFailed>()) {
        return e;
    }
    io::Error::new(e.kind(), WriteFailed::new(target, e))
}
