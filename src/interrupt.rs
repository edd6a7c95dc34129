//! Ctrl-C. Outside the sections that stop in order, Ctrl-C ends the process at once
//! with exit 130: nothing is being written then (outputs are written only at the end,
//! to a temporary file). Inside them, Ctrl-C raises a flag instead, which the replay
//! engine checks before every event (`ReplayOptions::interrupt`) and an output checks
//! before it replaces its target; the command then returns [`Interrupted`], main exits
//! with 130, and the GPU memory of `validate` is freed on the way. A second Ctrl-C ends
//! the process at once (temporary output files are removed first).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Raised by the first Ctrl-C.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How many sections that stop in order are running. The handler holds the lock while
/// it decides to end the process, so no section starts (and creates a temporary file)
/// in between.
static IN_ORDER: Mutex<usize> = Mutex::new(0);

/// Exit code of an interruption (128 + SIGINT).
const EXIT_INTERRUPTED: i32 = crate::Exit::Interrupted.code() as i32;

/// The command stopped at Ctrl-C; nothing was written.
#[derive(Debug, thiserror::Error)]
#[error("interrupted (Ctrl-C); no output was written and everything allocated was freed")]
pub struct Interrupted;

/// Installs the Ctrl-C handler (once, at start).
pub fn install() {
    if let Err(e) = ctrlc::set_handler(on_ctrl_c) {
        eprintln!("warning: cannot install the Ctrl-C handler ({e}); Ctrl-C ends allocsim at once");
    }
}

fn on_ctrl_c() {
    let again = INTERRUPTED.swap(true, Ordering::SeqCst);
    let sections = IN_ORDER.lock().unwrap_or_else(|e| e.into_inner());
    if again || *sections == 0 {
        crate::output::remove_temporary_files();
        eprintln!("error: interrupted (Ctrl-C)");
        std::process::exit(EXIT_INTERRUPTED);
    }
}

/// The flag the first Ctrl-C raises, for `ReplayOptions::interrupt`.
pub fn flag() -> &'static AtomicBool {
    &INTERRUPTED
}

/// `Err(Interrupted)` once Ctrl-C was pressed.
pub fn check() -> Result<(), Interrupted> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err(Interrupted)
    } else {
        Ok(())
    }
}

/// A section in which Ctrl-C raises the flag instead of ending the process; it ends
/// when dropped.
pub struct InOrder(());

/// Starts a section that stops in order at Ctrl-C.
pub fn in_order() -> InOrder {
    *IN_ORDER.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    InOrder(())
}

impl Drop for InOrder {
    fn drop(&mut self) {
        *IN_ORDER.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
    }
}
