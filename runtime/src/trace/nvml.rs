//! Accelerator utilization and memory through NVML, loaded at run time with
//! `libloading` from `libnvidia-ml.so.1` (the driver's library), so the binary
//! neither links against nor requires it: where it is missing, [`Nvml::load`]
//! returns the reason and the sampler records no accelerator counters.
//!
//! Only five entry points are used (`nvmlInit_v2`, `nvmlDeviceGetCount_v2`,
//! `nvmlDeviceGetHandleByIndex_v2`, `nvmlDeviceGetUtilizationRates`,
//! `nvmlDeviceGetMemoryInfo`, plus `nvmlShutdown` and the optional
//! `nvmlErrorString`), which is why this is a few lines of FFI rather than the
//! `nvml-wrapper` crate and its dependency tree.
//!
//! Devices are numbered in NVML order (PCI bus order; CUDA uses the same order
//! under `CUDA_DEVICE_ORDER=PCI_BUS_ID`), and all of them are sampled.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, OsStr};

use libloading::Library;

/// `nvmlReturn_t`; 0 is `NVML_SUCCESS`.
type NvmlReturn = c_int;
/// `nvmlDevice_t`, an opaque handle.
type DeviceHandle = *mut c_void;

/// `nvmlUtilization_t`: percent of the last sample period the GPU (and memory
/// controller) was busy.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlMemory_t` (v1), bytes.
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
type HandleFn = unsafe extern "C" fn(c_uint, *mut DeviceHandle) -> NvmlReturn;
type UtilFn = unsafe extern "C" fn(DeviceHandle, *mut Utilization) -> NvmlReturn;
type MemFn = unsafe extern "C" fn(DeviceHandle, *mut Memory) -> NvmlReturn;
type ErrStrFn = unsafe extern "C" fn(NvmlReturn) -> *const c_char;

/// Most devices sampled.
const MAX_DEVICES: c_uint = 64;

/// `error: cause: cause…` (libloading puts the `dlerror` text in the source).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// One reading of one accelerator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AccSample {
    /// NVML device index.
    pub(crate) index: u32,
    /// Percent of the last sample period a kernel was running.
    pub(crate) util_percent: Option<f64>,
    /// Device memory in use, bytes.
    pub(crate) mem_used: Option<u64>,
    /// Device memory in all, bytes.
    pub(crate) mem_total: Option<u64>,
}

/// An initialized NVML with the handles of every device.
pub(crate) struct Nvml {
    shutdown: InitFn,
    utilization: UtilFn,
    memory: MemFn,
    devices: Vec<DeviceHandle>,
    /// Keeps the function pointers above valid; dropped last.
    _lib: Library,
}

// SAFETY: NVML is documented thread-safe, and the device handles are plain
// pointers into the library's state that stay valid until `nvmlShutdown`, which
// only `Drop` calls (with `&mut self`, so no other call is in flight).
unsafe impl Send for Nvml {}

impl Nvml {
    /// Loads `libnvidia-ml.so.1` (then `libnvidia-ml.so`), initializes NVML and
    /// finds the devices; the error says why not.
    pub(crate) fn load() -> Result<Self, String> {
        let first = match Self::load_from("libnvidia-ml.so.1".as_ref()) {
            Ok(n) => return Ok(n),
            Err(e) => e,
        };
        Self::load_from("libnvidia-ml.so".as_ref()).map_err(|_| first)
    }

    /// As [`Nvml::load`], from a given library file or name.
    pub(crate) fn load_from(lib: &OsStr) -> Result<Self, String> {
        let shown = lib.to_string_lossy();
        // SAFETY: loading a shared library runs its initializers. The name is that
        // of the NVIDIA driver's management library (or one a test chose), whose
        // initializers have no preconditions.
        let library =
            unsafe { Library::new(lib) }.map_err(|e| format!("{shown}: {}", chain(&e)))?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                // SAFETY: `$ty` is the C signature nvml.h declares for `$name`; the
                // pointer is used only while `library` is loaded (it is stored
                // beside the pointers and dropped after them).
                let s = unsafe { library.get::<$ty>($name) }
                    .map_err(|e| format!("{shown}: no `{}`: {}", $name, chain(&e)))?;
                *s
            }};
        }
        let init = sym!("nvmlInit_v2", InitFn);
        let shutdown = sym!("nvmlShutdown", InitFn);
        let count = sym!("nvmlDeviceGetCount_v2", CountFn);
        let handle = sym!("nvmlDeviceGetHandleByIndex_v2", HandleFn);
        let utilization = sym!("nvmlDeviceGetUtilizationRates", UtilFn);
        let memory = sym!("nvmlDeviceGetMemoryInfo", MemFn);
        // SAFETY: as above, for nvmlErrorString's declared signature.
        let err_str: Option<ErrStrFn> = unsafe { library.get::<ErrStrFn>("nvmlErrorString") }
            .ok()
            .map(|s| *s);
        let describe = |rc: NvmlReturn| -> String {
            let text = err_str.and_then(|f| {
                // SAFETY: nvmlErrorString takes any return code and returns a
                // pointer to a static NUL-terminated string (or null).
                let p = unsafe { f(rc) };
                // SAFETY: non-null results point to static C strings.
                (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            });
            match text {
                Some(t) => format!("{t} (NVML error {rc})"),
                None => format!("NVML error {rc}"),
            }
        };
        // SAFETY: nvmlInit_v2 takes no arguments; it may be called from any thread.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(format!("{shown}: nvmlInit_v2 failed: {}", describe(rc)));
        }
        // From here on, dropping `nvml` calls nvmlShutdown, balancing the init.
        let mut nvml = Nvml {
            shutdown,
            utilization,
            memory,
            devices: Vec::new(),
            _lib: library,
        };
        let mut n: c_uint = 0;
        // SAFETY: NVML is initialized; `n` is a valid out-pointer.
        let rc = unsafe { count(&mut n) };
        if rc != 0 {
            return Err(format!(
                "{shown}: nvmlDeviceGetCount_v2 failed: {}",
                describe(rc)
            ));
        }
        for i in 0..n.min(MAX_DEVICES) {
            let mut h: DeviceHandle = std::ptr::null_mut();
            // SAFETY: NVML is initialized, `i` < the device count, `h` is a valid
            // out-pointer.
            let rc = unsafe { handle(i, &mut h) };
            if rc != 0 {
                return Err(format!(
                    "{shown}: nvmlDeviceGetHandleByIndex_v2({i}) failed: {}",
                    describe(rc)
                ));
            }
            nvml.devices.push(h);
        }
        if nvml.devices.is_empty() {
            return Err(format!("{shown}: NVML sees no devices"));
        }
        Ok(nvml)
    }

    /// Reads every device's utilization and memory; a failed call leaves that
    /// value `None`.
    pub(crate) fn sample(&self) -> Vec<AccSample> {
        self.devices
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                let mut u = Utilization::default();
                let mut m = Memory::default();
                // SAFETY: NVML is initialized and `h` is a handle it returned (valid
                // until shutdown, which needs `&mut self`); `u` is a valid
                // out-pointer of the declared layout.
                let util_ok = unsafe { (self.utilization)(h, &mut u) } == 0;
                // SAFETY: as above, for the memory query and `m`.
                let mem_ok = unsafe { (self.memory)(h, &mut m) } == 0;
                AccSample {
                    index: i as u32,
                    util_percent: util_ok.then_some(f64::from(u.gpu)),
                    mem_used: mem_ok.then_some(m.used),
                    mem_total: mem_ok.then_some(m.total),
                }
            })
            .collect()
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: NVML was initialized by `load_from` (an `Nvml` exists only after
        // a successful nvmlInit_v2), and this balances that init; no other call can
        // be in flight (`&mut self`), and the handles are not used afterwards.
        let _ = unsafe { (self.shutdown)() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        let e = Nvml::load_from("/nonexistent/libnvidia-ml.so.1".as_ref())
            .err()
            .unwrap();
        assert!(e.contains("/nonexistent/libnvidia-ml.so.1"), "{e}");
    }

    #[test]
    fn a_library_without_nvml_symbols_is_an_error() {
        // libc is always there and has no NVML entry points.
        match Nvml::load_from("libc.so.6".as_ref()) {
            Err(e) => assert!(e.contains("no `nvmlInit_v2`"), "{e}"),
            Ok(_) => panic!("libc.so.6 loaded as NVML"),
        }
    }

    #[test]
    fn loading_on_this_machine_either_works_or_says_why() {
        match Nvml::load() {
            Ok(n) => {
                let s = n.sample();
                assert!(!s.is_empty());
                eprintln!("NVML: {s:?}");
            }
            Err(e) => {
                assert!(!e.is_empty());
                eprintln!("NVML not available here: {e}");
            }
        }
    }
}
