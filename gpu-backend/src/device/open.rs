//! Opening a device: loading libcuda, the primary context, what the device is.

use super::*;

/// Why [`CudaDevice::open`] failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// No usable driver or device: libcuda cannot be loaded or lacks symbols this crate
    /// needs, `cuInit` failed (no GPU, driver/library mismatch, ...), or the driver
    /// reports no device with this index. The message is one line; a command-line tool
    /// prints it and exits with status 3.
    #[error("no usable CUDA driver or device: {0}")]
    NoDriver(String),
    /// The driver is up but opening the device failed (retaining its primary context,
    /// reading its properties).
    #[error("opening the CUDA device failed: {0}")]
    Driver(DeviceError),
}

/// What [`CudaDevice::open`] learnt about the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The CUDA device ordinal that was opened.
    pub index: usize,
    /// `cuDeviceGetName`, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor, e.g. 12080 for CUDA 12.8.
    pub driver_version: i32,
    /// (major, minor) compute capability, e.g. (9, 0) for an H100.
    pub compute_capability: (i32, i32),
    /// Total device memory (`cuMemGetInfo` total).
    pub total_bytes: u64,
    /// Free device memory right after the primary context was made current (what this
    /// process's context and every other process left).
    pub free_at_open_bytes: u64,
    /// `cuMemGetAllocationGranularity(MINIMUM)` for a pinned device allocation; `None`
    /// when the device or driver has no virtual memory management.
    pub vmm_granularity_min_bytes: Option<u64>,
    /// `cuMemGetAllocationGranularity(RECOMMENDED)`; `None` like the minimum.
    pub vmm_granularity_recommended_bytes: Option<u64>,
}

impl CudaDevice {
    /// Opens CUDA device `device_index`: loads libcuda (at run time, see the crate
    /// docs), checks that it exports every symbol this crate calls, runs `cuInit`,
    /// retains the device's primary context and makes it current on the calling thread,
    /// then reads the device's name, compute capability, memory and VMM granularity.
    ///
    /// # Errors
    /// [`OpenError::NoDriver`] when there is no usable driver or no such device (never
    /// a panic, also when cudarc's loader panics: that is caught);
    /// [`OpenError::Driver`] for other driver failures.
    pub fn open(device_index: usize) -> Result<CudaDevice, OpenError> {
        match loader::guarded(|| CudaDevice::open_unguarded(device_index)) {
            Ok(result) => result,
            Err(panic) => Err(OpenError::NoDriver(format!(
                "the CUDA driver library cannot be used (cudarc's loader panicked: {panic})"
            ))),
        }
    }

    fn open_unguarded(device_index: usize) -> Result<CudaDevice, OpenError> {
        if !loader::library_present() {
            return Err(OpenError::NoDriver(
                "cannot load libcuda (tried libcuda.so, libcuda.so.1 and cudarc's other names): \
                 no NVIDIA driver installed, or its folder is not on the loader path \
                 (LD_LIBRARY_PATH)"
                    .to_owned(),
            ));
        }
        let missing = loader::missing_symbols(loader::CORE_SYMBOLS);
        if !missing.is_empty() {
            return Err(OpenError::NoDriver(format!(
                "the loaded libcuda lacks {}: driver too old, or not NVIDIA's libcuda",
                missing.join(", ")
            )));
        }
        let vmm_symbols = loader::missing_symbols(loader::VMM_SYMBOLS).is_empty();

        let mut driver_version: c_int = 0;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer; it needs
        // no cuInit.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(conv::no_driver("cuDriverGetVersion"))?;
        result::init().map_err(conv::no_driver("cuInit"))?;
        let count = result::device::get_count().map_err(conv::no_driver("cuDeviceGetCount"))?;
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(OpenError::NoDriver(
                "the CUDA driver reports no device".to_owned(),
            ));
        }
        let ordinal = match c_int::try_from(device_index) {
            Ok(o) if device_index < count => o,
            _ => {
                return Err(OpenError::NoDriver(format!(
                    "no CUDA device {device_index}: the driver reports {count} device(s), \
                     indices 0 to {}",
                    count - 1
                )))
            }
        };
        let cu_device = result::device::get(ordinal).map_err(conv::open_failed("cuDeviceGet"))?;
        // SAFETY: cu_device comes from cuDeviceGet; the retained context is released
        // exactly once, by CudaDevice's Drop (the device is built right below).
        let ctx = unsafe { result::primary_ctx::retain(cu_device) }
            .map_err(conv::open_failed("cuDevicePrimaryCtxRetain"))?;

        let mut dev = CudaDevice {
            info: DeviceInfo {
                index: device_index,
                name: String::new(),
                driver_version,
                compute_capability: (0, 0),
                total_bytes: 0,
                free_at_open_bytes: 0,
                vmm_granularity_min_bytes: None,
                vmm_granularity_recommended_bytes: None,
            },
            cu_device,
            ctx,
            vmm: None,
            next_id: 1,
            segments: BTreeMap::new(),
            vm: PageTable::new("CudaDevice"),
            ballast: Vec::new(),
            ballast_bytes: 0,
            baseline_free: 0,
            segment_bytes: 0,
            charged_bytes: 0,
            charged_bytes_peak: 0,
            allocate_count: 0,
            free_count: 0,
            alloc_times: CallTimes::default(),
            free_times: CallTimes::default(),
            create_times: CallTimes::default(),
            release_times: CallTimes::default(),
            map_times: CallTimes::default(),
            unmap_times: CallTimes::default(),
            cleanup_errors: 0,
        };
        // From here on an early return drops `dev`, which releases the context.
        dev.bind().map_err(OpenError::Driver)?;
        dev.info.name = device_name(cu_device).map_err(conv::open_failed("cuDeviceGetName"))?;
        let attribute = |a: sys::CUdevice_attribute| {
            // SAFETY: cu_device comes from cuDeviceGet.
            unsafe { result::device::get_attribute(cu_device, a) }
                .map_err(conv::open_failed("cuDeviceGetAttribute"))
        };
        dev.info.compute_capability = (
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let vmm_supported = vmm_symbols
            && attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            )? != 0;
        if vmm_supported {
            let prop = pinned_device_prop(cu_device);
            let g_min = granularity(
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
            .map_err(conv::open_failed("cuMemGetAllocationGranularity(MINIMUM)"))?;
            let g_rec = granularity(
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
            .map_err(conv::open_failed(
                "cuMemGetAllocationGranularity(RECOMMENDED)",
            ))?;
            if g_min > 0 {
                dev.info.vmm_granularity_min_bytes = Some(g_min);
                dev.info.vmm_granularity_recommended_bytes = Some(g_rec);
                dev.vmm = Some(Vmm {
                    granularity: g_min,
                    prop,
                    access: sys::CUmemAccessDesc {
                        location: prop.location,
                        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                    },
                });
            }
        }
        let (free, total) = result::mem_get_info().map_err(conv::open_failed("cuMemGetInfo_v2"))?;
        dev.info.total_bytes = u64_of(total);
        dev.info.free_at_open_bytes = u64_of(free);
        dev.baseline_free = u64_of(free);
        Ok(dev)
    }
}

/// A pinned allocation on device `dev`, no export handle: what `cuMemCreate` and the
/// granularity query take.
fn pinned_device_prop(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    // Layout of the cuda-12080 bindings (the workspace's cudarc feature): `location.id`
    // is a plain field. From cuda-13020 on it sits in a union and this stops compiling,
    // which is the wanted outcome (the change needs a look, not a guess).
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The device's name, read as cudarc's `get_name` reads it but with a buffer the driver
/// is told is one byte shorter than it is, so a name that fills it (a driver that writes
/// no terminating NUL) is cut there instead of panicking inside cudarc.
fn device_name(cu_device: sys::CUdevice) -> Result<String, DriverError> {
    const BUF_SIZE: usize = 256;
    let mut buf = [0u8; BUF_SIZE];
    // SAFETY: the driver writes at most BUF_SIZE - 1 bytes into `buf`, which is BUF_SIZE
    // bytes long; cu_device comes from cuDeviceGet.
    unsafe { sys::cuDeviceGetName(buf.as_mut_ptr().cast(), (BUF_SIZE - 1) as c_int, cu_device) }
        .result()?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(BUF_SIZE - 1);
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn granularity(
    prop: &sys::CUmemAllocationProp,
    option: sys::CUmemAllocationGranularity_flags,
) -> Result<u64, DriverError> {
    let mut g: usize = 0;
    // SAFETY: g is a valid out-pointer and prop a fully initialised property struct.
    unsafe { sys::cuMemGetAllocationGranularity(&mut g, prop, option) }.result()?;
    Ok(u64_of(g))
}
