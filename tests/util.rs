//! Helpers shared by the integration tests.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (`ALLOCSIM_TEST_ROOT` overrides it, for a test binary built
/// here and run in a copy of the tree elsewhere, as on the GPU machine).
pub fn root() -> PathBuf {
    std::env::var_os("ALLOCSIM_TEST_ROOT")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// Runs the built `allocsim` with `args`.
pub fn allocsim<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run allocsim")
}

/// Starts the built `allocsim` with `args` in `dir` and `input` written to its stdin (a
/// pipe) by a thread: the child and the writer, which ends when the input is written or
/// the child stops reading (the rest is not wanted).
pub fn spawn_fed(
    dir: &Path,
    args: &[&str],
    input: Vec<u8>,
) -> (std::process::Child, std::thread::JoinHandle<()>) {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run allocsim");
    let writer = feed(&mut child, input);
    (child, writer)
}

/// Writes `input` to `child`'s piped stdin on a thread, which ends when the input is
/// written or the child stops reading (the rest is not wanted), closing the pipe.
pub fn feed(child: &mut std::process::Child, input: Vec<u8>) -> std::thread::JoinHandle<()> {
    let mut pipe = child.stdin.take().expect("a piped stdin");
    std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut pipe, &input);
    })
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh temporary directory under `target/`, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = root()
            .join("target")
            .join("test-tmp")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to `name` in the directory and returns its path.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether this system has `mkfifo`; says the test is skipped where it has not.
/// Whether bash runs here (for process substitutions), saying so where it does not.
pub fn has_bash() -> bool {
    let found = std::process::Command::new("bash")
        .args(["-c", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipped: no bash on this system");
    }
    found
}

pub fn has_mkfifo() -> bool {
    let found = std::process::Command::new("mkfifo")
        .arg("--version")
        .output()
        .is_ok();
    if !found {
        eprintln!("skipped: no mkfifo on this system");
    }
    found
}

/// Makes a named pipe at `path`.
pub fn mkfifo(path: &Path) {
    assert!(std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success());
}

/// The CSV trace `csv` written as an RMM log (fake pointers, one per id).
pub fn rmm_log_of(csv: &Path, out: &Path) {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut log = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    let mut sizes = HashMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let id: u64 = f[1].parse().unwrap();
        let ptr = 0x7f00_0000_0000u64 + (id << 12);
        match f[0] {
            "alloc" => {
                sizes.insert(id, f[2].to_string());
                writeln!(log, "1,00:00:00.000000,allocate,{ptr:#x},{},0x0", f[2]).unwrap();
            }
            "free" => {
                let size = sizes.remove(&id).unwrap();
                writeln!(log, "1,00:00:00.000000,free,{ptr:#x},{size},0x0").unwrap();
            }
            other => panic!("unexpected row {other}"),
        }
    }
    std::fs::write(out, log).unwrap();
}
