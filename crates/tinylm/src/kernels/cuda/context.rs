//! [`Cuda`]: one device's context and stream, the compiled kernels, the cuBLASLt
//! handle, the kernels' work space, and the first error of queued work.

use super::blas::Blas;
use super::buffer::{DType, Dev, DeviceBuffer, HostElement};
use super::nvrtc::{self, FAMILIES};
use crate::kernels::workspace::Scratch;
use crate::kernels::Precision;
use crate::{Error, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, DriverError, LaunchArgs, LaunchConfig,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The CUDA driver library cudarc loads.
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";
/// The cuBLASLt library cudarc loads (CUDA 13).
pub const CUBLASLT_LIBRARY: &str = "libcublasLt.so.13";
/// The oldest CUDA version the driver must support, as `cuDriverGetVersion` writes
/// it (`1000·major + 10·minor`): NVRTC and cuBLASLt are CUDA 13's.
const MIN_DRIVER_CUDA: i32 = 13000;

/// What explains the failures of a rank's queued work when the ranks' collectives
/// failed: a collective that fails after its call returned (a rank died, the ranks
/// called it differently) fails the stream, and every launch and wait after it with
/// the driver's "launch failure" alone. Set by the ranks' communicator while it
/// lives ([`Cuda::explained`] asks it).
pub(super) type CollectiveFailure = Arc<Mutex<Option<Box<dyn Fn() -> Option<Error> + Send>>>>;

/// The CUDA backend on one device: context and stream, the compiled kernels, the
/// cuBLASLt handle and workspace, and the first error of queued work (sticky:
/// kernels return nothing, the first failure is kept and reported by
/// [`Cuda::take_error`] at the next synchronization).
pub struct Cuda {
    pub(super) ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    precision: Precision,
    kernels: HashMap<&'static str, CudaFunction>,
    pub(super) blas: Blas,
    error: Mutex<Option<Error>>,
    pub(super) collective_failure: CollectiveFailure,
    /// Work space of the kernels that need it ([`Scratch`]), grown on first use.
    pub(super) scratch: Mutex<HashMap<Scratch, DeviceBuffer>>,
    device_name: String,
    capability: (i32, i32),
}

impl Cuda {
    /// Opens device `ordinal` for `precision` (fp32 or bf16: what `auto` is,
    /// [`backend_kind`](crate::device::backend_kind) decides): loads the driver and
    /// cuBLASLt, compiles (or reads from the cache) every kernel family for its
    /// architecture. A missing library, a driver older than CUDA 13.0, no device,
    /// or a GPU without bf16 (compute capability < 8.0) is one clear error.
    pub fn new(ordinal: usize, precision: Precision) -> Result<Cuda> {
        if !matches!(precision, Precision::Fp32 | Precision::Bf16) {
            return Err(Error::Device(format!(
                "a GPU computes in fp32 or bf16, not {precision} \
                 (tinylm::device::backend_kind says what auto is)"
            )));
        }
        // SAFETY: only tries to load the libraries.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(nvrtc::missing_library(
                DRIVER_LIBRARY,
                "the NVIDIA driver: is a GPU and its driver installed?",
            ));
        }
        // Before NVRTC and cuBLASLt are loaded: CUDA 13's libraries on an older
        // driver fail later, in less clear ways.
        check_driver_version(driver_cuda_version()?)?;
        if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
            return Err(nvrtc::missing_library(CUBLASLT_LIBRARY, "cuBLASLt"));
        }
        let count = CudaContext::device_count().map_err(|e| {
            Error::Device(format!("no CUDA device: the driver could not start ({e})"))
        })?;
        if count == 0 {
            return Err(Error::Device("no CUDA device found".into()));
        }
        if ordinal >= count as usize {
            return Err(Error::Device(format!(
                "cuda:{ordinal} does not exist: this machine has {count} CUDA device(s), \
                 cuda:0 to cuda:{}",
                count - 1
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error("opening the device", e))?;
        // One stream, in order: no cross-stream events needed.
        // SAFETY: every buffer, kernel, copy, event and cuBLASLt call of this backend
        // uses `stream` only.
        unsafe { ctx.disable_event_tracking() };
        // A stream of its own, non-blocking: the legacy NULL stream would serialize
        // with every other stream in the process.
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error("creating a stream", e))?;
        let device_name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let capability = ctx
            .compute_capability()
            .map_err(|e| driver_error("reading the compute capability", e))?;
        if precision == Precision::Bf16 && capability.0 < 8 {
            return Err(Error::Device(format!(
                "{device_name} (cuda:{ordinal}) has compute capability {}.{}: bf16 needs 8.0 \
                 (Ampere) or newer; use --precision fp32",
                capability.0, capability.1
            )));
        }
        let arch = format!("compute_{}{}", capability.0, capability.1);
        let mut kernels = HashMap::new();
        let cache = nvrtc::cache_dir();
        for (family, source) in FAMILIES {
            let ptx = nvrtc::compile_cached(family, source, &arch, precision, cache.as_deref())?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(|e| driver_error(&format!("loading {family}.cu for {arch}"), e))?;
            for name in nvrtc::kernel_names(source) {
                let function = module
                    .load_function(name)
                    .map_err(|e| driver_error(&format!("finding kernel {name}"), e))?;
                kernels.insert(name, function);
            }
        }
        let blas = Blas::new(&stream, capability)?;
        Ok(Cuda {
            ctx,
            stream,
            precision,
            kernels,
            blas,
            error: Mutex::new(None),
            collective_failure: CollectiveFailure::default(),
            scratch: Mutex::new(HashMap::new()),
            device_name,
            capability,
        })
    }

    /// Whether a CUDA device can be opened: the driver loads and supports CUDA 13,
    /// NVRTC and cuBLASLt load, and at least one GPU is present (the bf16 headers
    /// are checked by [`Cuda::new`]).
    pub fn is_available() -> bool {
        // SAFETY: only tries to load the library.
        let driver = unsafe { cudarc::driver::sys::is_culib_present() }
            && driver_cuda_version().is_ok_and(|v| check_driver_version(v).is_ok());
        // SAFETY: only tries to load the library.
        let libraries = driver
            && unsafe { cudarc::cublaslt::sys::is_culib_present() }
            && nvrtc::nvrtc_available();
        libraries && CudaContext::device_count().is_ok_and(|n| n > 0)
    }

    /// Free and total memory of GPU `ordinal`, in bytes (opening its context).
    pub fn device_memory(ordinal: usize) -> Result<(u64, u64)> {
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error("opening the device", e))?;
        let (free, total) = ctx
            .mem_get_info()
            .map_err(|e| driver_error("reading the device's memory", e))?;
        Ok((free as u64, total as u64))
    }

    /// The compute capability of GPU `ordinal` (opening its context).
    pub fn compute_capability(ordinal: usize) -> Result<(i32, i32)> {
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error("opening the device", e))?;
        ctx.compute_capability()
            .map_err(|e| driver_error("reading the compute capability", e))
    }

    /// The precision it runs in: fp32 or bf16.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The activation and matmul-operand type.
    pub fn float_x(&self) -> DType {
        match self.precision {
            Precision::Bf16 => DType::Bf16,
            _ => DType::F32,
        }
    }

    /// "NVIDIA H100 80GB HBM3 (compute capability 9.0)".
    pub fn describe(&self) -> String {
        format!(
            "{} (compute capability {}.{})",
            self.device_name, self.capability.0, self.capability.1
        )
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A zeroed buffer of `len` elements; `what` names it in an out-of-memory error
    /// ("activations for batch 64 x 256: logits").
    /// An empty buffer holds no memory.
    pub fn alloc(&self, len: usize, dtype: DType, what: &str) -> Result<DeviceBuffer> {
        let size = len * dtype.size();
        if size == 0 {
            return Ok(DeviceBuffer {
                memory: None,
                ptr: 0,
                len,
                dtype,
            });
        }
        let bytes = self.stream.alloc_zeros::<u8>(size).map_err(|e| {
            let free = self.ctx.mem_get_info().map(|(free, _)| free).unwrap_or(0);
            Error::Device(format!(
                "{what}: could not allocate {:.1} MiB on {} ({} MiB free): {e}",
                size as f64 / (1 << 20) as f64,
                self.describe(),
                free >> 20
            ))
        })?;
        let ptr = bytes.device_ptr(&self.stream).0;
        Ok(DeviceBuffer {
            ptr,
            memory: Some(bytes),
            len,
            dtype,
        })
    }

    /// Queues a copy of `src` into `dst` (f32 or u32 on both sides). Returns when
    /// `src` may be reused (pageable memory is staged by the driver).
    pub fn upload<T: HostElement>(&self, dst: Dev, src: &[T]) {
        assert_eq!((dst.len, dst.dtype), (src.len(), T::DTYPE), "upload size");
        if src.is_empty() {
            return;
        }
        self.bind();
        // SAFETY: `dst` points into a live buffer of this backend of `src.len()` T.
        let result = unsafe {
            cudarc::driver::result::memcpy_htod_async(dst.ptr, src, self.stream.cu_stream())
        };
        self.check("copy to the device", result);
    }

    /// Copies `src` to the host, waiting for queued work; the first error of that
    /// work, if any.
    pub fn download<T: HostElement>(&self, src: Dev, dst: &mut [T]) -> Result<()> {
        assert_eq!((src.len, src.dtype), (dst.len(), T::DTYPE), "download size");
        if dst.is_empty() {
            return self.synchronize();
        }
        self.bind();
        // SAFETY: `src` points into a live buffer of this backend of `dst.len()` T.
        let result = unsafe {
            cudarc::driver::result::memcpy_dtoh_async(dst, src.ptr, self.stream.cu_stream())
        };
        self.check("copy to the host", result);
        self.synchronize()
    }

    /// Queues `dst = src` (same length and type).
    pub fn copy(&self, dst: Dev, src: Dev) {
        assert_eq!((dst.len, dst.dtype), (src.len, src.dtype), "copy size");
        if src.len == 0 {
            return;
        }
        self.bind();
        // SAFETY: both point into live buffers of this backend of that size.
        let result = unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.ptr,
                src.ptr,
                src.len * src.dtype.size(),
                self.stream.cu_stream(),
            )
        };
        self.check("device copy", result);
    }

    /// Queues `dst = 0`.
    pub fn zero(&self, dst: Dev) {
        if dst.len == 0 {
            return;
        }
        self.bind();
        // SAFETY: `dst` points into a live buffer of this backend of that size.
        let result = unsafe {
            cudarc::driver::result::memset_d8_async(
                dst.ptr,
                0,
                dst.len * dst.dtype.size(),
                self.stream.cu_stream(),
            )
        };
        self.check("memset", result);
    }

    /// Makes the device's context current on this thread (the model may be driven
    /// from another thread than the one that opened it); kernel launches do this
    /// themselves, the raw copies and cuBLASLt calls need it.
    pub(crate) fn bind(&self) {
        self.check("binding the context", self.ctx.bind_to_thread());
    }

    /// Waits for queued work; the first error of that work, if any.
    pub fn synchronize(&self) -> Result<()> {
        let synced = self.stream.synchronize();
        self.take_error()?;
        synced.map_err(|e| self.wait_error("running kernels", e))
    }

    /// The first error recorded since the last call (sticky until taken), explained.
    pub fn take_error(&self) -> Result<()> {
        match self.error.lock().expect("error lock").take() {
            Some(e) => Err(self.explained(e)),
            None => Ok(()),
        }
    }

    /// `e`, an error of queued work, or what explains it: the ranks' collectives'
    /// failure ([`CollectiveFailure`]) when they failed.
    fn explained(&self, e: Error) -> Error {
        let failure = self
            .collective_failure
            .lock()
            .expect("collective failure lock");
        failure.as_ref().and_then(|failure| failure()).unwrap_or(e)
    }

    /// The error of a failed wait for queued work (`what`), explained.
    pub(super) fn wait_error(&self, what: &str, e: DriverError) -> Error {
        self.explained(driver_error(what, e))
    }

    /// Records `result`'s error unless an earlier one is pending.
    pub(crate) fn check<T, E: std::fmt::Display>(
        &self,
        what: &str,
        result: std::result::Result<T, E>,
    ) {
        if let Err(e) = result {
            let mut slot = self.error.lock().expect("error lock");
            if slot.is_none() {
                *slot = Some(Error::Device(format!("CUDA {what}: {e}")));
            }
        }
    }

    /// A launch of kernel `name`: push its arguments in order, then [`Cuda::run`].
    pub(crate) fn kernel(&self, name: &str) -> LaunchArgs<'_> {
        let function = self
            .kernels
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not in any family"));
        self.stream.launch_builder(function)
    }

    /// Queues a launch built by [`Cuda::kernel`]; a failure is recorded (sticky).
    pub(crate) fn run(&self, name: &str, mut args: LaunchArgs, cfg: LaunchConfig) {
        // SAFETY: each wrapper passes the arguments its kernel declares, pointers
        // into live buffers of the sizes the kernel's shape arguments say.
        let launched = unsafe { args.launch(cfg) };
        self.check(name, launched);
    }
}

pub(crate) fn driver_error(what: &str, e: DriverError) -> Error {
    Error::Device(format!("CUDA error {what}: {e}"))
}

/// The CUDA version the loaded driver supports, as `cuDriverGetVersion` writes it
/// (`1000·major + 10·minor`: 12080 is CUDA 12.8).
fn driver_cuda_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: the caller has checked that the driver library loads; writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| driver_error("reading the driver's CUDA version", e))?;
    Ok(version)
}

/// One line naming the installed and the needed CUDA version when a driver that
/// supports CUDA `version` (`cuDriverGetVersion`'s encoding) is too old.
fn check_driver_version(version: i32) -> Result<()> {
    let name = |v: i32| format!("{}.{}", v / 1000, v % 1000 / 10);
    if version >= MIN_DRIVER_CUDA {
        return Ok(());
    }
    Err(Error::Device(format!(
        "the NVIDIA driver supports CUDA {}; tinylm's CUDA backend needs CUDA {} or newer \
         (driver 580+): update the NVIDIA driver",
        name(version),
        name(MIN_DRIVER_CUDA)
    )))
}

#[cfg(test)]
mod tests {
    use super::check_driver_version;

    #[test]
    fn a_driver_older_than_cuda_13_is_one_line_naming_both_versions() {
        let err = check_driver_version(12080).unwrap_err().to_string();
        assert!(
            err.contains("CUDA 12.8;") && err.contains("CUDA 13.0 or newer") && !err.contains('\n'),
            "{err}"
        );
        assert!(check_driver_version(13000).is_ok());
        assert!(check_driver_version(13020).is_ok());
    }
}
