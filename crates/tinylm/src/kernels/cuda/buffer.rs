//! Device memory: [`DeviceBuffer`] (an allocation that frees itself), [`Dev`] (a
//! pointer, length and element type: what kernel wrappers take), pinned host
//! memory with its copy event ([`Pinned`]), and the model's buffers as the
//! [`Backend`](crate::kernels::Backend) sees them ([`CudaBuf`], [`CudaIds`],
//! [`CudaStats`]).

use crate::kernels::{Allocation, Buffer, Span, SpanMut, ValueType};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice};

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
    /// The element type of values a [`BackendKind`](crate::kernels::BackendKind)'s
    /// storage names (the GPU has no 8-bit weights).
    pub fn of(values: ValueType) -> DType {
        match values {
            ValueType::F32 => DType::F32,
            ValueType::Bf16 => DType::Bf16,
            ValueType::Q8_0 => unreachable!("no GPU backend stores Q8_0 blocks"),
        }
    }

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
    /// The allocation, freed (stream-ordered) when the buffer is dropped; none for
    /// an empty buffer (whose pointer is null).
    pub(super) memory: Option<CudaSlice<u8>>,
    pub(super) ptr: CUdeviceptr,
    pub(super) len: usize,
    pub(super) dtype: DType,
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

/// A model buffer on the device. Parameters and full-precision buffers are f32;
/// activations are `floatX`. Under bf16, parameters also keep a bf16 copy, the
/// operand of the matrix products, refreshed by every write (upload, AdamW).
pub struct CudaBuf {
    pub(super) data: DeviceBuffer,
    pub(super) shadow: Option<DeviceBuffer>,
}

impl Buffer for CudaBuf {
    fn len(&self) -> usize {
        self.data.len()
    }
}

impl Allocation for DeviceBuffer {
    fn bytes(&self) -> u64 {
        (self.len * self.dtype.size()) as u64
    }
}

/// The values and, under bf16, their copy.
impl Allocation for CudaBuf {
    fn bytes(&self) -> u64 {
        self.data.bytes() + self.shadow.as_ref().map_or(0, Allocation::bytes)
    }
}

/// Page-locked host memory that the stream copies to or from asynchronously, and
/// the event recorded after the last such copy. The context runs without cudarc's
/// own event tracking, so the slice's accessors do not wait: whoever reads or
/// overwrites `memory` first waits for `copied`.
pub struct Pinned<T> {
    pub(super) memory: PinnedHostSlice<T>,
    pub(super) copied: CudaEvent,
}

impl<T> Drop for Pinned<T> {
    /// A copy still in flight finishes before its host memory is freed.
    fn drop(&mut self) {
        let _ = self.copied.synchronize();
    }
}

/// Token ids `(N)` u32 on the device and the pinned host memory they are staged in
/// on their way there ([`Backend::upload_ids`](crate::kernels::Backend::upload_ids)):
/// a copy from pageable memory would be staged by the driver, synchronously.
pub struct CudaIds {
    pub(super) device: DeviceBuffer,
    pub(super) staging: Pinned<u32>,
}

/// The ids on the device (their pinned staging is host memory).
impl Allocation for CudaIds {
    fn bytes(&self) -> u64 {
        self.device.bytes()
    }
}

impl CudaIds {
    /// The ids as a kernel argument.
    pub fn view(&self) -> Dev {
        self.device.view()
    }
}

/// A training step's statistics on the device — bytes `0..4` the loss (f32), `8..16`
/// the gradient's sum of squares (f64) — and the pinned host memory they are
/// copied to, asynchronously, by
/// [`Backend::send_stats`](crate::kernels::Backend::send_stats); `read_stats` waits
/// for that copy.
pub struct CudaStats {
    pub(super) device: DeviceBuffer,
    pub(super) host: Pinned<u8>,
}

pub(super) use crate::kernels::backend::STATS_BYTES;

/// The statistics on the device (their pinned host copy is host memory).
impl Allocation for CudaStats {
    fn bytes(&self) -> u64 {
        self.device.bytes()
    }
}

impl CudaStats {
    pub(super) fn loss(&self) -> Dev {
        Dev {
            dtype: DType::F32,
            ..self.device.slice(0..1)
        }
    }

    pub(super) fn sum_squares(&self) -> Dev {
        self.device.slice(1..2)
    }
}

pub(super) fn view(span: Span<CudaBuf>) -> Dev {
    span.buf.data.slice(span.start..span.start + span.len)
}

pub(super) fn view_mut(span: SpanMut<CudaBuf>) -> Dev {
    span.buf.data.slice(span.start..span.start + span.len)
}

/// A matrix-product operand: the bf16 copy of parameters, else the values.
pub(super) fn operand(span: Span<CudaBuf>) -> Dev {
    let buf = span.buf.shadow.as_ref().unwrap_or(&span.buf.data);
    buf.slice(span.start..span.start + span.len)
}
