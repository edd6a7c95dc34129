//! Finding libcuda at run time without letting cudarc panic.
//!
//! cudarc (feature `dynamic-loading`) loads libcuda lazily, on the first driver call,
//! and resolves each symbol on its first use. Both failures are panics inside cudarc:
//! "Unable to dynamically load the \"cuda\" shared library" and "Missing symbol cuX".
//! This module keeps them from happening:
//!
//! 1. [`library_present`] asks cudarc to try its candidate names without panicking;
//! 2. [`missing_symbols`] checks every symbol this crate will call, up front, so an old
//!    or partial driver is reported at open time, by name, instead of panicking in the
//!    middle of a replay;
//! 3. [`guarded`] is the second line of defence: it runs the open path under
//!    `catch_unwind` and turns a loader panic into an error message.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys;

/// Driver symbols every [`crate::CudaDevice`] needs (open, segments, accounting, errors).
pub(crate) const CORE_SYMBOLS: &[&str] = &[
    "cuDriverGetVersion",
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// Driver symbols of virtual memory management (CUDA 10.2+). Without them the device
/// still works, with [`policies::Device::virtual_memory`] returning `None`.
pub(crate) const VMM_SYMBOLS: &[&str] = &[
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// Whether libcuda can be loaded under one of cudarc's candidate names (`libcuda.so`,
/// ..., `libcuda.so.1`). Never panics.
pub(crate) fn library_present() -> bool {
    // SAFETY: is_culib_present only calls libloading::Library::new on cudarc's candidate
    // names and drops the result; loading libcuda runs its initialisers, which is what
    // using the driver at all requires.
    unsafe { sys::is_culib_present() }
}

/// The names in `symbols` that the loaded libcuda does not export. Call only after
/// [`library_present`] returned true (otherwise cudarc's loader panics, which
/// [`guarded`] catches).
pub(crate) fn missing_symbols(symbols: &[&'static str]) -> Vec<&'static str> {
    // SAFETY: culib() loads (once) and returns the process-wide libcuda handle; it is
    // only reached after library_present() succeeded.
    let lib = unsafe { sys::culib() };
    symbols
        .iter()
        .copied()
        // SAFETY: the symbol is only looked up, never called or dereferenced through
        // this (deliberately generic) function-pointer type.
        .filter(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
        .collect()
}

/// Serialises swaps of the process-wide panic hook (see [`guarded`]).
static HOOK_LOCK: Mutex<()> = Mutex::new(());

type Hook = Box<dyn Fn(&PanicHookInfo<'_>) + Sync + Send + 'static>;

/// Whether a panic payload comes from cudarc's library loader.
pub(crate) fn is_loader_panic(payload: &(dyn Any + Send)) -> bool {
    let msg = panic_message(payload);
    msg.contains("Missing symbol") || msg.contains("dynamically load")
}

/// A panic payload as one line of text.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("<non-string panic payload>")
        .replace(['\n', '\r'], " ")
}

/// Runs `f`; a panic from cudarc's loader becomes `Err(message)`, silently (the default
/// panic hook would print several lines on stderr; the caller reports one). Any other
/// panic is a bug: it is reported by the previous hook and resumed.
///
/// While `f` runs, the process-wide panic hook is replaced by one that filters loader
/// panics and forwards everything else to the previous hook; the previous hook is put
/// back afterwards. Swaps are serialised, so concurrent calls are safe. Needs
/// `panic = "unwind"` (the default); with `panic = "abort"` a loader panic aborts.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let _lock = HOOK_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let previous: Arc<Hook> = Arc::new(panic::take_hook());
    let forward = Arc::clone(&previous);
    panic::set_hook(Box::new(move |info| {
        if !is_loader_panic(info.payload()) {
            forward(info);
        }
    }));
    let outcome = panic::catch_unwind(AssertUnwindSafe(f));
    // Drop our hook (and with it `forward`), then put the original back.
    drop(panic::take_hook());
    match Arc::try_unwrap(previous) {
        Ok(hook) => panic::set_hook(hook),
        Err(shared) => panic::set_hook(Box::new(move |info| shared(info))),
    }
    match outcome {
        Ok(value) => Ok(value),
        Err(payload) if is_loader_panic(payload.as_ref()) => Err(panic_message(payload.as_ref())),
        Err(payload) => panic::resume_unwind(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A "Missing symbol" panic inside the guard becomes an error message, not a crash.
    #[test]
    fn loader_panic_becomes_error() {
        let r: Result<(), String> =
            guarded(|| panic!("Missing symbol cuMemCreate: undefined symbol"));
        let msg = r.unwrap_err();
        assert!(msg.contains("Missing symbol cuMemCreate"), "{msg}");
    }

    /// A library-not-found panic (multi-line safe) is caught as well, on one line.
    #[test]
    fn no_library_panic_becomes_error() {
        let r: Result<(), String> =
            guarded(|| panic!("Unable to dynamically load the \"cuda\" shared library\nsearched"));
        let msg = r.unwrap_err();
        assert!(!msg.contains('\n'));
    }

    /// Any other panic is a bug and keeps unwinding.
    #[test]
    fn other_panics_resume() {
        let r = panic::catch_unwind(|| guarded(|| panic!("index out of bounds")));
        let payload = r.unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "index out of bounds");
    }

    /// Without a panic the value passes through.
    #[test]
    fn value_passes_through() {
        assert_eq!(guarded(|| 7), Ok(7));
    }
}
