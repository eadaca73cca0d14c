//! [`MixedBuf`], the buffer of the bf16 backend: its values in `f32` or bf16 as its
//! kind says, the parameters' copy that products multiply (bf16, or Q8_0 blocks),
//! and how a kernel sees a span of it.

use crate::kernels::cpu::memory::{zeroed, HostBuf};
use crate::kernels::cpu::q8;
use crate::kernels::cpu::simd::CHUNK;
use crate::kernels::float::Element;
use crate::kernels::{Allocation, Buffer, Span, SpanMut, ValueType};
use half::bf16;
use rayon::prelude::*;

/// A buffer of [`CpuMixed`](super::CpuMixed): its values, `f32` or bf16 as its [`BufKind`](crate::kernels::BufKind) says,
/// and for the parameters their copy, the products' operand.
pub struct MixedBuf {
    pub(super) values: Values,
    /// The parameters' values rounded to bf16 or quantized, refreshed by every
    /// write (upload, AdamW, a gather over ranks); none for every other buffer.
    pub(super) copy: ParamCopy,
}

/// A [`MixedBuf`]'s copy of its values.
pub(super) enum ParamCopy {
    None,
    Bf16(Vec<bf16>),
    /// (Boxed: every buffer's struct stays the size of a bf16 copy's.)
    Q8(Box<q8::Q8Buffer>),
}

impl ParamCopy {
    /// A zeroed copy of `len` values stored as `copy` says (none for `None`).
    pub(super) fn new(copy: Option<ValueType>, len: usize) -> ParamCopy {
        match copy {
            None => ParamCopy::None,
            Some(ValueType::Bf16) => ParamCopy::Bf16(zeroed(len)),
            Some(ValueType::Q8_0) => ParamCopy::Q8(Box::new(q8::Q8Buffer::new(len))),
            Some(ValueType::F32) => unreachable!("a copy in f32 would be the values again"),
        }
    }
}

/// A [`MixedBuf`]'s values: `f32`, or bf16 — activations that only products read,
/// a KV cache, and the parameters of a forward-only model mapped from a bf16 file
/// (the very values it multiplies; [`Backend::map_params`](crate::kernels::Backend::map_params)).
pub enum Values {
    F32(HostBuf<f32>),
    Bf16(HostBuf<bf16>),
}

impl Buffer for MixedBuf {
    fn len(&self) -> usize {
        match &self.values {
            Values::F32(v) => v.len(),
            Values::Bf16(v) => v.len(),
        }
    }
}

/// The values and, for parameters, their copy.
impl Allocation for MixedBuf {
    fn bytes(&self) -> u64 {
        let values = match &self.values {
            Values::F32(v) => v.bytes(),
            Values::Bf16(v) => v.bytes(),
        };
        values
            + match &self.copy {
                ParamCopy::None => 0,
                ParamCopy::Bf16(copy) => copy.bytes(),
                ParamCopy::Q8(copy) => copy.bytes(),
            }
    }
}

/// Values `start..start + len` of a buffer as a kernel reads or writes them.
pub(super) fn f32s<'a>(span: Span<'a, MixedBuf>) -> Span<'a, HostBuf<f32>> {
    match &span.buf.values {
        Values::F32(buf) => Span {
            buf,
            start: span.start,
            len: span.len,
        },
        Values::Bf16(_) => panic!("an f32 kernel was given a bf16 buffer"),
    }
}

pub(super) fn f32s_mut<'a>(span: SpanMut<'a, MixedBuf>) -> SpanMut<'a, HostBuf<f32>> {
    match &mut span.buf.values {
        Values::F32(buf) => SpanMut {
            buf,
            start: span.start,
            len: span.len,
        },
        Values::Bf16(_) => panic!("an f32 kernel was given a bf16 buffer"),
    }
}

/// Values `start..start + len` of a buffer as they are stored: the parameters' of
/// a forward-only model mapped from a bf16 file are bf16 (read as such by the
/// embedding and RMSNorm kernels).
pub(super) enum ValuesRef<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

pub(super) fn values_ref<'a>(span: Span<'a, MixedBuf>) -> ValuesRef<'a> {
    let range = span.start..span.start + span.len;
    match &span.buf.values {
        Values::F32(v) => ValuesRef::F32(&v[range]),
        Values::Bf16(v) => ValuesRef::Bf16(&v[range]),
    }
}

/// A buffer's values to write, in the type it stores.
pub(super) enum Out<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
}

pub(super) fn out<'a>(span: SpanMut<'a, MixedBuf>) -> Out<'a> {
    let range = span.start..span.start + span.len;
    match &mut span.buf.values {
        Values::F32(v) => Out::F32(&mut v[range]),
        Values::Bf16(v) => Out::Bf16(&mut v[range]),
    }
}

/// A matrix product's operand: the parameters' copy, else the values.
pub(super) enum Operand<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    /// Q8_0 blocks from value `start` on.
    Q8(&'a q8::Q8Buffer, usize),
}

pub(super) fn operand<'a>(span: Span<'a, MixedBuf>) -> Operand<'a> {
    let range = span.start..span.start + span.len;
    match (&span.buf.copy, &span.buf.values) {
        (ParamCopy::Bf16(copy), _) => Operand::Bf16(&copy[range]),
        (ParamCopy::Q8(copy), _) => Operand::Q8(copy, span.start),
        (ParamCopy::None, Values::F32(v)) => Operand::F32(&v[range]),
        (ParamCopy::None, Values::Bf16(v)) => Operand::Bf16(&v[range]),
    }
}

/// `dst = src` stored as `T` ([`Element::store_slice`]: in vectors), in parallel chunks.
pub(crate) fn store<T: Element<f32>>(dst: &mut [T], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "copy size");
    (dst.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)))
        .for_each(|(dst, src)| T::store_slice(dst, src));
}

/// `dst = src`'s values, in parallel chunks.
pub(super) fn load<T: Element<f32>>(dst: &mut [f32], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy size");
    (dst.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)))
        .for_each(|(dst, src)| dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s.load()));
}

impl MixedBuf {
    /// Where its values lie (for tests of what a model maps).
    #[cfg(test)]
    pub(crate) fn values_addr(&self) -> usize {
        match &self.values {
            Values::F32(v) => v.as_ptr() as usize,
            Values::Bf16(v) => v.as_ptr() as usize,
        }
    }

    /// Rounds (or quantizes) parameters `start..start + len` into their copy
    /// (none for other buffers).
    pub(super) fn refresh_copy(&mut self, start: usize, len: usize) {
        let range = start..start + len;
        match (&mut self.copy, &self.values) {
            (ParamCopy::Bf16(copy), Values::F32(values)) => {
                store(&mut copy[range.clone()], &values[range])
            }
            (ParamCopy::Q8(copy), Values::F32(values)) => copy.refresh(values, range),
            _ => {}
        }
    }
}
