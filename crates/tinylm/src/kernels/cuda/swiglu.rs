//! Launches of `swiglu.cu`.

use super::buffer::{Dev, NULL};
use super::context::Cuda;
use super::launch::{expect, packing, per_element};
use cudarc::driver::PushKernelArg;

impl Cuda {
    /// `out (N, F) = SiLU(a) ⊙ b`, or `SiLU(a)` when `b` is `None`.
    pub fn swiglu_forward(&self, out: Dev, a: Dev, b: Option<Dev>) {
        let n = out.len;
        expect(a, n, self.float_x(), "swiglu a");
        if let Some(b) = b {
            expect(b, n, self.float_x(), "swiglu b");
        }
        let b_ptr = b.map_or(NULL, |b| b.ptr);
        let n_ = n as u64;
        let operands = [Some(out), Some(a), b].into_iter().flatten();
        let (packed, width) = packing(n, self.float_x(), operands);
        let mut args = self.kernel("swiglu_forward");
        args.arg(&out.ptr)
            .arg(&a.ptr)
            .arg(&b_ptr)
            .arg(&n_)
            .arg(&packed);
        self.run("swiglu_forward", args, per_element(n.div_ceil(width)));
    }

    /// `da`, `db` (overwritten) from `dout`; `db` and `b` are `None` together (SiLU).
    pub fn swiglu_backward(&self, da: Dev, db: Option<Dev>, dout: Dev, a: Dev, b: Option<Dev>) {
        let n = da.len;
        assert_eq!(
            db.is_some(),
            b.is_some(),
            "swiglu_backward: b and db go together"
        );
        for x in [Some(dout), Some(a), db, b].into_iter().flatten() {
            expect(x, n, self.float_x(), "swiglu operand");
        }
        let (db_ptr, b_ptr) = (db.map_or(NULL, |x| x.ptr), b.map_or(NULL, |x| x.ptr));
        let n_ = n as u64;
        let operands = [Some(da), db, Some(dout), Some(a), b].into_iter().flatten();
        let (packed, width) = packing(n, self.float_x(), operands);
        let mut args = self.kernel("swiglu_backward");
        args.arg(&da.ptr)
            .arg(&db_ptr)
            .arg(&dout.ptr)
            .arg(&a.ptr)
            .arg(&b_ptr)
            .arg(&n_)
            .arg(&packed);
        self.run("swiglu_backward", args, per_element(n.div_ceil(width)));
    }
}
