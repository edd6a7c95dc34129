//! Opening a device on a machine without libcuda (this workspace's build machines).

use gpu_backend::{probe, CudaDevice, OpenError, ProbeError};

/// Without any libcuda, `CudaDevice::open(0)` returns `OpenError::NoDriver` with a
/// one-line message, and does not panic. Skipped where a driver is installed.
#[test]
fn open_without_driver_is_no_driver() {
    match CudaDevice::open(0) {
        Ok(_) => println!("skipped: a CUDA driver is present on this machine"),
        Err(OpenError::NoDriver(msg)) => {
            assert!(!msg.contains('\n'), "message spans lines: {msg}");
            assert!(msg.contains("libcuda"), "{msg}");
            let shown = OpenError::NoDriver(msg).to_string();
            assert!(
                shown.starts_with("no usable CUDA driver or device: "),
                "{shown}"
            );
        }
        Err(other) => panic!("expected OpenError::NoDriver, got {other:?}"),
    }
}

/// Without any libcuda, `probe` fails the same way, as `ProbeError::Open`.
#[test]
fn probe_without_driver_is_no_driver() {
    match probe(0) {
        Ok(_) => println!("skipped: a CUDA driver is present on this machine"),
        Err(ProbeError::Open(OpenError::NoDriver(msg))) => assert!(!msg.contains('\n')),
        Err(other) => panic!("expected ProbeError::Open(NoDriver), got {other:?}"),
    }
}
