//! Nothing lost: outputs are checked before anything is touched, written to a temporary
//! file renamed on success, never an input, and Ctrl-C leaves them as they were.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::{allocsim, has_mkfifo, mkfifo, root, stderr, TempDir};

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs allocsim with `args` and checks it refused with exit `code` and one line
/// containing `needle`.
fn refused(args: &[&OsStr], code: i32, needle: &str) {
    let o = allocsim(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: '{needle}' missing from {err}"
    );
}

fn os<'a>(items: &'a [&'a dyn AsRef<OsStr>]) -> Vec<&'a OsStr> {
    items.iter().map(|i| i.as_ref()).collect()
}

/// An output that is an input, by the same path, another spelling of it, a symbolic
/// link or a hard link, is refused before anything is touched: the input is intact
/// (`compare r.csv -o r.csv` and `replay r.csv --timeline r.csv` overwrote the trace).
#[test]
fn output_equal_to_an_input_is_refused() {
    let dir = TempDir::new("out-same");
    let text = std::fs::read_to_string(root().join("examples/random_small.csv")).unwrap();
    let trace = dir.file("r.csv", &text);
    let respelled = dir.path().join(".").join("r.csv");
    let symlink = dir.path().join("link.csv");
    let hardlink = dir.path().join("hard.csv");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&trace, &symlink).unwrap();
    std::fs::hard_link(&trace, &hardlink).unwrap();
    let mut outputs: Vec<&PathBuf> = vec![&trace, &respelled, &hardlink];
    if cfg!(unix) {
        outputs.push(&symlink);
    }
    for out in outputs {
        refused(
            &os(&[&"compare", &trace, &"-o", out]),
            2,
            "that is the input",
        );
        refused(
            &os(&[&"replay", &trace, &"--timeline", out]),
            2,
            "that is the input",
        );
        refused(
            &os(&[&"convert", &trace, &"-o", out]),
            2,
            "that is the input",
        );
        assert_eq!(std::fs::read_to_string(&trace).unwrap(), text);
    }
    let profile = dir.file(
        "card.yaml",
        &std::fs::read_to_string(root().join("sim/profiles/h100.yaml")).unwrap(),
    );
    refused(
        &os(&[
            &"compare",
            &trace,
            &"--gpu-profile",
            &profile,
            &"-o",
            &profile,
        ]),
        2,
        "that is the input",
    );
}

/// The extension of an output is checked before anything is touched: `generate -o
/// run.json` refuses and leaves the recorded run as it was (it emptied it, then
/// failed), and a CSV output named like another trace format is refused.
#[test]
fn output_extension_is_checked_first() {
    let dir = TempDir::new("out-ext");
    let run = dir.file("run.json", "{\"events\": []}\n");
    let timeline = dir.file("t.yaml", "events: []\n");
    refused(
        &os(&[&"generate", &"random", &"--events", &"10", &"-o", &run]),
        2,
        "allocsim reads json traces but does not write them",
    );
    refused(
        &os(&[&"convert", &"examples/seed000.yaml", &"-o", &run]),
        2,
        "does not write them",
    );
    refused(
        &os(&[
            &"replay",
            &"examples/seed000.yaml",
            &"--timeline",
            &timeline,
        ]),
        2,
        "this writes CSV, but the extension names yaml traces",
    );
    refused(
        &os(&[&"compare", &"examples/seed000.yaml", &"-o", &dir.path()]),
        2,
        "is a directory",
    );
    refused(
        &os(&[
            &"compare",
            &"examples/seed000.yaml",
            &"-o",
            &dir.path().join("no/x.csv"),
        ]),
        2,
        "does not exist",
    );
    assert_eq!(std::fs::read_to_string(&run).unwrap(), "{\"events\": []}\n");
    assert_eq!(std::fs::read_to_string(&timeline).unwrap(), "events: []\n");
    assert_eq!(names(dir.path()), ["run.json", "t.yaml"]);
}

/// Outputs replace the old file only when complete: a write that fails midway (the
/// file-size limit standing in for a full disk) exits 5 and leaves the old file and
/// no temporary file; a successful write replaces it, keeping its permissions.
#[test]
fn failed_write_leaves_the_old_file() {
    let dir = TempDir::new("out-fail");
    let old = dir.file("trace.csv", "OLD\n");
    // sh: ignore SIGXFSZ so that writing past the limit is an error (EFBIG), not death.
    let o = Command::new("sh")
        .args([
            "-c".as_ref(),
            "trap '' XFSZ; ulimit -f 4; exec \"$0\" \"$@\"".as_ref(),
            env!("CARGO_BIN_EXE_allocsim").as_ref(),
            "generate".as_ref(),
            "random".as_ref(),
            "--events".as_ref(),
            "20000".as_ref(),
            "-o".as_ref(),
            old.as_os_str(),
        ])
        .current_dir(root())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("cannot write"), "{err}");
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "OLD\n");
    assert_eq!(names(dir.path()), ["trace.csv"]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o640)).unwrap();
        let o = allocsim(os(&[
            &"generate",
            &"random",
            &"--events",
            &"10",
            &"-o",
            &old,
        ]));
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(std::fs::read_to_string(&old)
            .unwrap()
            .starts_with("op,id,bytes,stream\n"));
        let mode = std::fs::metadata(&old).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        assert_eq!(names(dir.path()), ["trace.csv"]);
    }
}

/// Ctrl-C on `compare` and `replay` stops with exit 130 and one line, leaving the old
/// output as it was and no temporary file (it killed the process, or wrote a partial
/// file). The trace is a named pipe that allocsim is still reading when Ctrl-C comes.
#[test]
fn ctrl_c_leaves_outputs_untouched() {
    if !has_mkfifo() {
        return;
    }
    let dir = TempDir::new("out-ctrl-c");
    let trace_text = std::fs::read_to_string(root().join("examples/random_small.csv")).unwrap();
    for (i, command) in ["compare", "replay"].into_iter().enumerate() {
        let old = dir.file(&format!("old{i}.csv"), "OLD\n");
        let fifo = dir.path().join(format!("pipe{i}.csv"));
        mkfifo(&fifo);
        let flag = if command == "compare" {
            "-o"
        } else {
            "--timeline"
        };
        let child = Command::new(env!("CARGO_BIN_EXE_allocsim"))
            .args([
                command.as_ref(),
                fifo.as_os_str(),
                flag.as_ref(),
                old.as_os_str(),
            ])
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Opening the pipe returns once allocsim opened it to read: past its start,
        // where the Ctrl-C handler is installed.
        let mut pipe = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        let sent = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        // allocsim is blocked reading the pipe: Ctrl-C must end it without the data.
        // Give it time to (the handler runs on a thread of its own), then send the
        // trace anyway, so that a missed Ctrl-C shows as a replay that ran.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut child = child;
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = std::io::Write::write_all(&mut pipe, trace_text.as_bytes());
        drop(pipe);
        let o = child.wait_with_output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(130), "{command}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{command}: {err}");
        assert!(err.contains("interrupted"), "{command}: {err}");
        assert!(o.stdout.is_empty(), "{command}: no partial output");
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "OLD\n");
    }
    assert_eq!(
        names(dir.path()),
        ["old0.csv", "old1.csv", "pipe0.csv", "pipe1.csv"]
    );
}

/// An output that is a named pipe (or a device: `-o /dev/null`, `-o /dev/stdout`) is
/// written into, not replaced: renaming the finished temporary file over it turned the
/// pipe into a plain file, left its reader waiting for ever, and as root replaced
/// `/dev/null` itself.
#[test]
fn output_to_a_named_pipe_is_written_into_it() {
    if !has_mkfifo() {
        return;
    }
    let dir = TempDir::new("out-fifo");
    let fifo = dir.path().join("rows.csv");
    mkfifo(&fifo);
    // Opening the pipe to read blocks until allocsim opens it to write; a pipe that was
    // replaced leaves this thread blocked, which the test does not wait for.
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let args = [
        "compare",
        "examples/random_small.csv",
        "--policies",
        "caching",
    ];
    let o = allocsim(os(&[&args[0], &args[1], &args[2], &args[3], &"-o", &fifo]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(kind.is_fifo(), "the pipe was replaced by a {kind:?}");
    }
    let expected = allocsim(args);
    assert_eq!(reader.join().unwrap(), expected.stdout);
    assert_eq!(names(dir.path()), ["rows.csv"]);
}

/// `check` of a named pipe reads it once, whole: a clean CSV is read as it goes only
/// from a file that can be read again (a problem found sends it to the whole-file
/// read), so a pipe's double free is listed with its lines, not lost with the content
/// the first read took.
#[test]
fn check_reads_a_pipe_once() {
    if !has_mkfifo() {
        return;
    }
    let dir = TempDir::new("check-fifo");
    let fifo = dir.path().join("pipe.csv");
    mkfifo(&fifo);
    let child = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(["check".as_ref(), fifo.as_os_str()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let text = "op,id,bytes,stream\nalloc,1,100,0\nfree,1,,\nfree,1,,\n";
    let mut pipe = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    std::io::Write::write_all(&mut pipe, text.as_bytes()).unwrap();
    drop(pipe);
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(2), "{out}{}", stderr(&o));
    assert!(
        out.contains("line 4: free of already-freed id 1 (freed at line 3)")
            && out.contains("3 events, 1 error, 0 warnings"),
        "{out}"
    );
}

/// `replay --timeline` writes the same timeline whether the trace streams (a CSV trace)
/// or is held (`--iterations` holds it): the rows of an RMM log, whose stream numbers a
/// freed pointer's next allocation with the old id, came out with other ids when it
/// streamed.
#[test]
fn streamed_and_held_timelines_agree() {
    let dir = TempDir::new("timeline-paths");
    for trace in ["examples/random_small.csv", "examples/rmm_log.csv"] {
        let streamed = dir.path().join("streamed.csv");
        let held = dir.path().join("held.csv");
        for (out, extra) in [(&streamed, None), (&held, Some("--iterations"))] {
            let mut args: Vec<&OsStr> = vec![
                "replay".as_ref(),
                trace.as_ref(),
                "--timeline".as_ref(),
                out.as_os_str(),
            ];
            args.extend(extra.map(OsStr::new));
            let o = allocsim(args);
            assert_eq!(o.status.code(), Some(0), "{trace}: {}", stderr(&o));
        }
        let (a, b) = (
            std::fs::read(&streamed).unwrap(),
            std::fs::read(&held).unwrap(),
        );
        assert!(a.len() > 100 && a == b, "{trace}: the timelines differ");
    }
}

/// `-` is standard input as a trace and standard output as `-o`: `generate -o -`
/// wrote a file named `-`, `replay -` looked for one; `-o -` of a command whose `-o` is
/// optional is the same as leaving it out, and `--timeline -` (beside the summary) is
/// refused.
#[test]
fn dash_is_standard_input_and_output() {
    let dir = TempDir::new("dash");
    // Runs allocsim in `dir` with `input` on its standard input.
    let run = |args: &[&str], input: &[u8]| {
        let (child, writer) = crate::util::spawn_fed(dir.path(), args, input.to_vec());
        let o = child.wait_with_output().unwrap();
        writer.join().unwrap();
        o
    };
    let generate = ["generate", "random", "--seed", "1", "--events", "300"];
    let o = run(&[&generate[..], &["-o", "t.csv"]].concat(), b"");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let csv = std::fs::read(dir.path().join("t.csv")).unwrap();
    let o = run(
        &[&generate[..], &["-o", "-", "--format", "csv"]].concat(),
        b"",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        o.stdout, csv,
        "generate -o - wrote other bytes than to a file"
    );
    // Without a format flag, stdout has no extension to take it from.
    let o = run(&[&generate[..], &["-o", "-"]].concat(), b"");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("standard output"), "{}", stderr(&o));

    let o = run(&["convert", "-", "-o", "-", "--to", "csv"], &csv);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(o.stdout, csv, "convert - -o - changed the trace");

    let from_file = run(&["replay", "t.csv"], b"");
    let from_stdin = run(&["replay", "-"], &csv);
    assert_eq!(from_stdin.status.code(), Some(0), "{}", stderr(&from_stdin));
    let numbers = |o: &std::process::Output| {
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        text.lines()
            .skip_while(|l| !l.starts_with("peak requested"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(!numbers(&from_file).is_empty());
    assert_eq!(numbers(&from_stdin), numbers(&from_file));

    let compare = [
        "compare",
        "-",
        "--policies",
        "caching,buddy",
        "--format",
        "csv",
    ];
    let plain = run(&compare, &csv);
    let dashed = run(&[&compare[..], &["-o", "-"]].concat(), &csv);
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    assert_eq!(dashed.status.code(), Some(0), "{}", stderr(&dashed));
    assert_eq!(dashed.stdout, plain.stdout, "compare -o - is not compare");

    // Standard input twice: refused before anything is read (the second read found it
    // empty, "cannot tell the trace format").
    let o = run(&["compare", "-", "-"], &csv);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("named more than once"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o).trim_end().lines().count(), 1, "{}", stderr(&o));

    let o = run(&["replay", "t.csv", "--timeline", "-"], b"");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--timeline -"), "{}", stderr(&o));
    assert_eq!(names(dir.path()), ["t.csv"], "a file named - was written");
}
