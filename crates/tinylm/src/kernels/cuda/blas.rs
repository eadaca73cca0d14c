//! Matrix products through cuBLASLt: `floatX` operands, f32 accumulation, output in
//! `floatX` (activations) or f32 (parameter gradients). The CPU twin is
//! `kernels/cpu/linear.rs`; shapes are the same row-major [`MatMul`].
//!
//! cuBLASLt is column-major: a row-major `out (m, n) = a (m, k) · b (k, n)` is the
//! column-major `outᵀ (n, m) = bᵀ · aᵀ`, so `b` is cuBLAS's `A` and `a` its `B`, and
//! a stored transpose is an `op = T` at no cost.

use super::buffer::{DType, Dev};
use crate::kernels::workspace::cublaslt_workspace_bytes;
use crate::kernels::MatMul;
use crate::{Error, Result};
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The cuBLASLt handle, its workspace and the algorithm chosen for each shape.
pub struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    algos: Mutex<HashMap<Key, sys::cublasLtMatmulAlgo_t>>,
}

// SAFETY: the handle is used from one thread at a time (the backend's stream is
// in-order and `Cuda` is used from the thread that drives the model).
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

/// `(m, k, n, a_transposed, b_transposed)`, the operand and output types, and the
/// alignments of `b`, `a`, `out` (cuBLAS's A, B, C = D).
type Key = ((usize, usize, usize, bool, bool), DType, DType, [u32; 3]);

/// The largest power of two (at most 256) dividing a device address: cuBLASLt
/// picks only algorithms that work at that alignment (its default assumes 256).
fn alignment(ptr: u64) -> u32 {
    1 << ptr.trailing_zeros().min(8)
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn blas_error(what: &str, e: lt::CublasError) -> Error {
    Error::Device(format!("cuBLASLt error {what}: {e}"))
}

fn data_type(dtype: DType) -> sys::cudaDataType {
    match dtype {
        DType::F32 => sys::cudaDataType_t::CUDA_R_32F,
        DType::Bf16 => sys::cudaDataType_t::CUDA_R_16BF,
        DType::U32 | DType::F64 => panic!("matmul operands are f32 or bf16"),
    }
}

/// A column-major matrix layout, destroyed on drop.
struct Layout(sys::cublasLtMatrixLayout_t);

impl Layout {
    fn new(dtype: DType, rows: usize, cols: usize) -> Result<Self> {
        lt::create_matrix_layout(data_type(dtype), rows as u64, cols as u64, rows as i64)
            .map(Layout)
            .map_err(|e| blas_error("creating a layout", e))
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

/// A matmul description (f32 compute and scale, the two transposes), destroyed on drop.
struct Desc(sys::cublasLtMatmulDesc_t);

impl Desc {
    fn new(transa: bool, transb: bool) -> Result<Self> {
        let handle = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(|e| blas_error("creating a matmul description", e))?;
        let desc = Desc(handle);
        for (attr, trans) in [
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                transa,
            ),
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                transb,
            ),
        ] {
            // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
            let op = trans as i32;
            // SAFETY: a cublasOperation_t (an int) attribute of its size.
            unsafe { lt::set_matmul_desc_attribute(handle, attr, (&op as *const i32).cast(), 4) }
                .map_err(|e| blas_error("setting a transpose", e))?;
        }
        Ok(desc)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

impl Blas {
    /// A handle and NVIDIA's recommended workspace ([`cublaslt_workspace_bytes`]).
    pub fn new(stream: &Arc<CudaStream>, capability: (i32, i32)) -> Result<Blas> {
        let handle = lt::create_handle().map_err(|e| blas_error("creating a handle", e))?;
        let size = cublaslt_workspace_bytes(capability.0);
        let workspace = stream
            .alloc_zeros::<u8>(size)
            .map_err(|e| Error::Device(format!("cuBLASLt workspace of {} MiB: {e}", size >> 20)))?;
        Ok(Blas {
            handle,
            workspace,
            algos: Mutex::new(HashMap::new()),
        })
    }

    /// Bytes of the workspace.
    pub fn workspace_bytes(&self) -> u64 {
        self.workspace.len() as u64
    }

    /// Queues `out (+)= a · b` (see [`Cuda::matmul`](super::context::Cuda::matmul))
    /// on `stream`, choosing the algorithm for the shape, types and alignments once.
    pub fn matmul(
        &self,
        stream: &Arc<CudaStream>,
        out: Dev,
        a: Dev,
        b: Dev,
        shape: MatMul,
    ) -> Result<()> {
        let MatMul { m, k, n, .. } = shape;
        let (transa, transb) = (shape.b_transposed, shape.a_transposed);
        // cuBLAS's A is our b, stored (k, n) col-major as (n, k), or (k, n) when transposed.
        let (a_rows, a_cols) = if transa { (k, n) } else { (n, k) };
        let (b_rows, b_cols) = if transb { (m, k) } else { (k, m) };
        let layout_a = Layout::new(b.dtype, a_rows, a_cols)?;
        let layout_b = Layout::new(a.dtype, b_rows, b_cols)?;
        let layout_c = Layout::new(out.dtype, n, m)?;
        let desc = Desc::new(transa, transb)?;
        let blas = self;
        let aligned = [alignment(b.ptr), alignment(a.ptr), alignment(out.ptr)];
        let key = (
            (m, k, n, shape.a_transposed, shape.b_transposed),
            a.dtype,
            out.dtype,
            aligned,
        );
        let cached = blas.algos.lock().expect("algo cache").get(&key).copied();
        let algo = match cached {
            Some(algo) => algo,
            None => {
                let pref = lt::create_matmul_pref().map_err(|e| blas_error("preference", e))?;
                let size = blas.workspace.len();
                use sys::cublasLtMatmulPreferenceAttributes_t as Pref;
                let set_alignment = |attr, bytes: &u32| {
                    // SAFETY: a uint32 attribute of its size on a live preference.
                    unsafe {
                        lt::set_matmul_pref_attribute(pref, attr, (bytes as *const u32).cast(), 4)
                    }
                };
                // SAFETY: every handle is live; the attribute is a usize.
                let heuristic = unsafe {
                    lt::set_matmul_pref_attribute(
                        pref,
                        Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                        (&size as *const usize).cast(),
                        std::mem::size_of::<usize>(),
                    )
                    .and_then(|()| {
                        [
                            (
                                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                &aligned[0],
                            ),
                            (
                                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                &aligned[1],
                            ),
                            (
                                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                &aligned[2],
                            ),
                            (
                                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                &aligned[2],
                            ),
                        ]
                        .into_iter()
                        .try_for_each(|(attr, bytes)| set_alignment(attr, bytes))
                    })
                    .and_then(|()| {
                        lt::get_matmul_algo_heuristic(
                            blas.handle,
                            desc.0,
                            layout_a.0,
                            layout_b.0,
                            layout_c.0,
                            layout_c.0,
                            pref,
                        )
                    })
                };
                // SAFETY: created above.
                let _ = unsafe { lt::destroy_matmul_pref(pref) };
                let algo = heuristic
                    .map_err(|e| blas_error(&format!("no algorithm for {shape:?}"), e))?
                    .algo;
                blas.algos.lock().expect("algo cache").insert(key, algo);
                algo
            }
        };
        let (alpha, beta): (f32, f32) = (1.0, if shape.accumulate { 1.0 } else { 0.0 });
        let (workspace, _sync) = blas.workspace.device_ptr(stream);
        // SAFETY: the pointers address live buffers at least as large as the layouts
        // (asserted by the caller); C and D are the same matrix.
        unsafe {
            lt::matmul(
                blas.handle,
                desc.0,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                b.ptr as *const c_void,
                layout_a.0,
                a.ptr as *const c_void,
                layout_b.0,
                out.ptr as *const c_void,
                layout_c.0,
                out.ptr as *mut c_void,
                layout_c.0,
                &algo,
                workspace as *mut c_void,
                blas.workspace.len(),
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| blas_error(&format!("{shape:?}"), e))
    }
}
