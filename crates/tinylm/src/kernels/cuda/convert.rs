//! Launches of `convert.cu`.

use super::buffer::{DType, Dev};
use super::context::Cuda;
use super::launch::{expect, per_element};
use cudarc::driver::PushKernelArg;

impl Cuda {
    /// `dst (n) floatX = src (n) f32`.
    pub fn to_float_x(&self, dst: Dev, src: Dev) {
        expect(dst, src.len, self.float_x(), "convert dst");
        expect(src, dst.len, DType::F32, "convert src");
        let n = src.len as u64;
        let mut args = self.kernel("convert_f32_to_x");
        args.arg(&dst.ptr).arg(&src.ptr).arg(&n);
        self.run("convert_f32_to_x", args, per_element(src.len));
    }

    /// `dst (n) f32 = src (n) floatX`.
    pub fn to_f32(&self, dst: Dev, src: Dev) {
        expect(dst, src.len, DType::F32, "convert dst");
        expect(src, dst.len, self.float_x(), "convert src");
        let n = src.len as u64;
        let mut args = self.kernel("convert_x_to_f32");
        args.arg(&dst.ptr).arg(&src.ptr).arg(&n);
        self.run("convert_x_to_f32", args, per_element(src.len));
    }

    /// `dst (n) floatX = value`.
    pub fn fill(&self, dst: Dev, value: f32) {
        expect(dst, dst.len, self.float_x(), "fill dst");
        let n = dst.len as u64;
        let mut args = self.kernel("fill");
        args.arg(&dst.ptr).arg(&value).arg(&n);
        self.run("fill", args, per_element(dst.len));
    }
}
