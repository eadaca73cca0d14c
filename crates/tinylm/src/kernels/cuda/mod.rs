//! The CUDA backend (cargo feature `cuda`): CUDA C kernels in this directory, one
//! file per kernel family with forward and backward side by side (the CPU twins are
//! in `kernels/cpu/`) and a launch wrapper beside each (`rmsnorm.cu` and
//! `rmsnorm.rs`, like llm.c's `.cuh`), compiled at run time by NVRTC for the
//! device's architecture and cached on disk; matrix products through cuBLASLt.
//! cudarc loads the driver, NVRTC and cuBLASLt with `dlopen`, so building needs no
//! CUDA toolkit, and a machine without them gets a clear error, not a panic.
//!
//! Precision ([`Precision`]): activations and matmul operands are `floatX` (bf16 or
//! f32); master parameters, their gradients, AdamW moments, RMSNorm statistics,
//! RoPE tables and losses are f32.

pub mod adamw;
pub mod attention;
pub mod backend;
pub mod convert;
pub mod cross_entropy;
pub mod embedding;
pub mod global_norm;
pub mod matmul;
pub mod nvrtc;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

pub use backend::CudaBuf;
pub use nvrtc::Precision;

use crate::{Error, Result};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchArgs,
    LaunchConfig,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The header prepended to every family: `floatX`, conversions, reductions.
pub const COMMON: &str = include_str!("common.cuh");

/// Every kernel family: its name (the file stem) and its CUDA C source.
pub const FAMILIES: &[(&str, &str)] = &[
    ("adamw", include_str!("adamw.cu")),
    ("attention", include_str!("attention.cu")),
    ("convert", include_str!("convert.cu")),
    ("cross_entropy", include_str!("cross_entropy.cu")),
    ("embedding", include_str!("embedding.cu")),
    ("global_norm", include_str!("global_norm.cu")),
    ("rmsnorm", include_str!("rmsnorm.cu")),
    ("rope", include_str!("rope.cu")),
    ("swiglu", include_str!("swiglu.cu")),
];

/// The CUDA driver library cudarc loads.
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";
/// The cuBLASLt library cudarc loads (CUDA 13).
pub const CUBLASLT_LIBRARY: &str = "libcublasLt.so.13";

/// Threads per block of the one-thread-per-element and one-warp-per-row kernels.
pub(crate) const BLOCK: u32 = 256;

/// Element type of a device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    Bf16,
    /// Token ids.
    U32,
    /// Reductions.
    F64,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::Bf16 => 2,
            DType::F64 => 8,
        }
    }
}

/// A device allocation of `len` elements of `dtype`, freed on drop.
pub struct DeviceBuffer {
    /// The allocation, freed (stream-ordered) when the buffer is dropped.
    _memory: CudaSlice<u8>,
    ptr: CUdeviceptr,
    len: usize,
    dtype: DType,
}

impl DeviceBuffer {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The whole buffer as a kernel argument.
    pub fn view(&self) -> Dev {
        self.slice(0..self.len)
    }

    /// Elements `range` as a kernel argument.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Dev {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "device slice {range:?} out of a buffer of {}",
            self.len
        );
        Dev {
            ptr: self.ptr + (range.start * self.dtype.size()) as CUdeviceptr,
            len: range.end - range.start,
            dtype: self.dtype,
        }
    }
}

/// A device pointer with its length and element type: what kernel wrappers take.
/// It borrows nothing, so the caller keeps the buffer alive while work is queued
/// (the backend owns every buffer for the whole run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dev {
    pub ptr: CUdeviceptr,
    pub len: usize,
    pub dtype: DType,
}

impl Dev {
    /// Elements `start..start + len` of this view.
    pub fn sub(self, start: usize, len: usize) -> Dev {
        assert!(start + len <= self.len, "device sub-slice out of range");
        Dev {
            ptr: self.ptr + (start * self.dtype.size()) as CUdeviceptr,
            len,
            dtype: self.dtype,
        }
    }
}

/// A null pointer argument (an absent optional buffer).
pub(crate) const NULL: CUdeviceptr = 0;

/// The CUDA backend on one device: context and stream, the compiled kernels, the
/// cuBLASLt handle and workspace, and the first error of queued work (sticky:
/// kernels return nothing, the first failure is kept and reported by
/// [`Cuda::take_error`] at the next synchronization).
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    precision: Precision,
    kernels: HashMap<&'static str, CudaFunction>,
    blas: matmul::Blas,
    error: Mutex<Option<Error>>,
    /// Work space of the kernels that need it, grown on first use.
    scratch: Mutex<HashMap<backend::Scratch, DeviceBuffer>>,
    device_name: String,
    capability: (i32, i32),
}

impl Cuda {
    /// Opens device `ordinal` for `precision`: loads the driver and cuBLASLt,
    /// compiles (or reads from the cache) every kernel family for its architecture.
    /// A missing library, no device, or a GPU without bf16 (compute capability < 8.0)
    /// is one clear error.
    pub fn new(ordinal: usize, precision: Precision) -> Result<Cuda> {
        // SAFETY: only tries to load the libraries.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(nvrtc::missing_library(
                DRIVER_LIBRARY,
                "the NVIDIA driver: is a GPU and its driver installed?",
            ));
        }
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
        // SAFETY: every buffer and kernel of this backend uses `stream` only.
        unsafe { ctx.disable_event_tracking() };
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
        let stream = ctx.default_stream();
        let arch = format!("compute_{}{}", capability.0, capability.1);
        let mut kernels = HashMap::new();
        for (family, source) in FAMILIES {
            let ptx = nvrtc::compile_cached(family, source, &arch, precision)?;
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
        let blas = matmul::Blas::new(&stream, capability)?;
        Ok(Cuda {
            ctx,
            stream,
            precision,
            kernels,
            blas,
            error: Mutex::new(None),
            scratch: Mutex::new(HashMap::new()),
            device_name,
            capability,
        })
    }

    /// Whether a CUDA device can be opened: the driver, NVRTC and cuBLASLt load and
    /// at least one GPU is present (the bf16 headers are checked by [`Cuda::new`]).
    pub fn is_available() -> bool {
        // SAFETY: only tries to load the libraries.
        let libraries = unsafe {
            cudarc::driver::sys::is_culib_present() && cudarc::cublaslt::sys::is_culib_present()
        } && nvrtc::nvrtc_available();
        libraries && CudaContext::device_count().is_ok_and(|n| n > 0)
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The activation and matmul-operand type.
    pub fn float_x(&self) -> DType {
        match self.precision {
            Precision::Bf16 => DType::Bf16,
            Precision::Fp32 => DType::F32,
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
    pub fn alloc(&self, len: usize, dtype: DType, what: &str) -> Result<DeviceBuffer> {
        let size = len * dtype.size();
        let bytes = self.stream.alloc_zeros::<u8>(size.max(1)).map_err(|e| {
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
            _memory: bytes,
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
        synced.map_err(|e| driver_error("running kernels", e))
    }

    /// The first error recorded since the last call (sticky until taken).
    pub fn take_error(&self) -> Result<()> {
        match self.error.lock().expect("error lock").take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
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

    /// The stream's raw handle for cuBLASLt.
    pub(crate) fn cu_stream(&self) -> cudarc::driver::sys::CUstream {
        self.stream.cu_stream()
    }
}

/// A one-dimensional launch of `blocks` blocks of [`BLOCK`] threads.
pub(crate) fn grid(blocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread per element of `n`.
pub(crate) fn per_element(n: usize) -> LaunchConfig {
    grid(n.div_ceil(BLOCK as usize))
}

/// One warp per row of `rows`.
pub(crate) fn per_row_warp(rows: usize) -> LaunchConfig {
    grid(rows.div_ceil(BLOCK as usize / 32))
}

/// Asserts that `x` holds at least `len` elements of `dtype`.
pub(crate) fn expect(x: Dev, len: usize, dtype: DType, what: &str) {
    assert!(
        x.len >= len && x.dtype == dtype,
        "{what}: {:?} x {} given, {dtype:?} x {len} needed",
        x.dtype,
        x.len
    );
}

/// Asserts that a kernel indexing `len` elements with 32-bit arithmetic can.
pub(crate) fn expect_u32(len: usize, what: &str) {
    assert!(
        u32::try_from(len).is_ok(),
        "{what}: {len} elements exceed the kernel's 32-bit indexing"
    );
}

/// A shape argument as the kernels' `int`.
pub(crate) fn int(x: usize) -> i32 {
    i32::try_from(x).expect("shape fits a CUDA int")
}

fn driver_error(what: &str, e: DriverError) -> Error {
    Error::Device(format!("CUDA error {what}: {e}"))
}

/// A host element type that crosses to the device as is.
pub trait HostElement: Copy {
    const DTYPE: DType;
}

impl HostElement for f32 {
    const DTYPE: DType = DType::F32;
}

impl HostElement for u32 {
    const DTYPE: DType = DType::U32;
}

impl HostElement for f64 {
    const DTYPE: DType = DType::F64;
}
