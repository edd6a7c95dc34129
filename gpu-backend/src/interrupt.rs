//! Ctrl-C during a replay on a real GPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// Exit status of a second Ctrl-C (128 + SIGINT, as shells report it).
const EXIT_SECOND_INTERRUPT: i32 = 130;

/// Installs a Ctrl-C (SIGINT) handler that sets the returned flag, and returns the flag.
/// Idempotent: later calls install nothing and return the same flag.
///
/// The contract: a replay loop checks the flag (`load(Ordering::Relaxed)` is enough)
/// before each event and, once it is set, stops and returns normally, so that the
/// [`crate::CudaDevice`] is dropped (or [`crate::CudaDevice::release_all`] called) on
/// its own thread and everything is freed in order. A second Ctrl-C while the flag is
/// already set ends the process at once with status 130, without that cleanup; the
/// driver still reclaims a process's device memory when it exits.
///
/// If a handler cannot be installed (another one is already registered in this
/// process), a one-line warning goes to stderr and the flag is never set: Ctrl-C then
/// does whatever the other handler does.
pub fn install_interrupt_flag() -> &'static AtomicBool {
    INSTALL.call_once(|| {
        let installed = ctrlc::set_handler(|| {
            if INTERRUPTED.swap(true, Ordering::SeqCst) {
                std::process::exit(EXIT_SECOND_INTERRUPT);
            }
        });
        if let Err(e) = installed {
            eprintln!(
                "warning: cannot install the Ctrl-C handler ({e}); Ctrl-C will not stop the replay in order"
            );
        }
    });
    &INTERRUPTED
}
