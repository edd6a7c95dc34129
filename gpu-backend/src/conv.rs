//! Driver error mapping: the one place where a `CUresult` becomes a [`DeviceError`] or an
//! [`OpenError`].
//!
//! - `CUDA_ERROR_OUT_OF_MEMORY` → [`DeviceError::OutOfMemory`] with the size of the
//!   refused request (policies react to it; it is not a failure of the run);
//! - anything else → [`DeviceError::Driver`] with the numeric code and a one-line message
//!   `CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered (in
//!   cuMemFree_v2)`: the error's name, code, the driver's description and the call that
//!   failed.
//!
//! The name comes from cudarc's `CUresult` enum (no driver call); the description from
//! `cuGetErrorString`, which is only reached once libcuda is loaded (a `DriverError`
//! exists only after a driver call returned one).

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::CUresult;
use policies::DeviceError;

use crate::device::OpenError;

/// `CUDA_ERROR_INVALID_VALUE`: the code given to misuse the backend refuses before it
/// reaches the driver (see [`refused`]).
const CUDA_ERROR_INVALID_VALUE: u32 = 1;

/// The one-line message: `NAME (code): description (in call)`. Pure, so it is testable
/// without a driver. Newlines in the description are flattened.
pub(crate) fn format_message(
    name: &str,
    code: u32,
    description: Option<&str>,
    call: &str,
) -> String {
    let text = description
        .map(|d| d.trim().replace(['\n', '\r'], " "))
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "no description from the driver".to_owned());
    format!("{name} ({code}): {text} (in {call})")
}

/// The error's name as the CUDA headers spell it, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn error_name(code: CUresult) -> String {
    format!("{code:?}")
}

/// The driver's numeric code of an error.
pub(crate) fn error_code(code: CUresult) -> u32 {
    code as u32
}

/// The one-line message for a failed driver call (asks the driver for the description).
pub(crate) fn message(call: &str, e: DriverError) -> String {
    let description = e
        .error_string()
        .ok()
        .map(|s| s.to_string_lossy().into_owned());
    format_message(
        &error_name(e.0),
        error_code(e.0),
        description.as_deref(),
        call,
    )
}

/// Whether a driver error is `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn is_out_of_memory(e: DriverError) -> bool {
    e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Maps a failed driver call to a [`DeviceError`]; `requested_bytes` is the size an
/// out-of-memory error reports.
pub(crate) fn device_error(call: &str, requested_bytes: u64, e: DriverError) -> DeviceError {
    if is_out_of_memory(e) {
        DeviceError::OutOfMemory { requested_bytes }
    } else {
        DeviceError::Driver {
            code: error_code(e.0),
            message: message(call, e),
        }
    }
}

/// `map_err` adaptor for a call whose every failure stops the run, out of memory
/// included ([`DeviceError::Driver`]): mapping, unmapping, releasing.
pub(crate) fn driver_failure(call: &'static str) -> impl Fn(DriverError) -> DeviceError {
    move |e| DeviceError::Driver {
        code: error_code(e.0),
        message: message(call, e),
    }
}

/// `map_err` adaptor for [`device_error`].
pub(crate) fn at(call: &'static str, requested_bytes: u64) -> impl Fn(DriverError) -> DeviceError {
    move |e| device_error(call, requested_bytes, e)
}

/// A failure that means "no usable driver or device" (cuInit, device count):
/// [`OpenError::NoDriver`].
pub(crate) fn no_driver(call: &'static str) -> impl Fn(DriverError) -> OpenError {
    move |e| OpenError::NoDriver(message(call, e))
}

/// Any other failure while opening: [`OpenError::Driver`].
pub(crate) fn open_failed(call: &'static str) -> impl Fn(DriverError) -> OpenError {
    move |e| OpenError::Driver(device_error(call, 0, e))
}

/// A request the backend refuses before calling the driver, because the driver would
/// reject it or misbehave (e.g. freeing an address range that still has mapped pages).
/// Reported as `CUDA_ERROR_INVALID_VALUE`, the code the driver itself would give.
pub(crate) fn refused(call: &str, why: &str) -> DeviceError {
    DeviceError::Driver {
        code: CUDA_ERROR_INVALID_VALUE,
        message: format_message(
            "CUDA_ERROR_INVALID_VALUE",
            CUDA_ERROR_INVALID_VALUE,
            Some(&format!(
                "refused by gpu-backend before calling the driver: {why}"
            )),
            call,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message carries the name, code, description and failing call on one line.
    #[test]
    fn message_format() {
        let m = format_message(
            &error_name(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            error_code(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            Some("an illegal memory access\nwas encountered"),
            "cuMemFree_v2",
        );
        assert_eq!(
            m,
            "CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered (in cuMemFree_v2)"
        );
    }

    /// Without a description the message still names the error and the call.
    #[test]
    fn message_without_description() {
        let m = format_message("CUDA_ERROR_UNKNOWN", 999, None, "cuInit");
        assert_eq!(
            m,
            "CUDA_ERROR_UNKNOWN (999): no description from the driver (in cuInit)"
        );
    }

    /// Out of memory is recognised from the code alone, without asking the driver.
    #[test]
    fn out_of_memory_maps_without_driver() {
        let e = DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(is_out_of_memory(e));
        assert_eq!(
            device_error("cuMemAlloc_v2", 42, e),
            DeviceError::OutOfMemory {
                requested_bytes: 42
            }
        );
        assert_eq!(error_code(CUresult::CUDA_ERROR_OUT_OF_MEMORY), 2);
    }

    /// Refusals read like driver errors and say they never reached the driver.
    #[test]
    fn refusal_is_invalid_value() {
        match refused("cuMemAddressFree", "2 pages still mapped") {
            DeviceError::Driver { code, message } => {
                assert_eq!(code, 1);
                assert!(message.starts_with("CUDA_ERROR_INVALID_VALUE (1): refused by gpu-backend"));
                assert!(message.ends_with("(in cuMemAddressFree)"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
