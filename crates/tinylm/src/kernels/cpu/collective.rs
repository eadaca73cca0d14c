//! The CPU backend's [`Collective`] over MPI (cargo feature `mpi`) on its `HostBuf<F>`
//! buffers. MPI's default error handler ends every rank on a failure, so no call
//! returns an error.

use crate::distributed::{shard, Mpi, MPI_CHUNK, MPI_CHUNK_ONE_NODE};
use crate::kernels::{Collective, Float, HostBuf, SpanMut, StepStats};
use crate::Result;
use mpi::collective::SystemOperation;
use mpi::ffi;
use mpi::traits::*;
use std::any::TypeId;
use std::cell::RefCell;
use std::os::raw::c_int;

/// The CPU backend's collectives over MPI, through a scratch buffer (MPI has no
/// portable in-place form here) of at most [`MPI_CHUNK`] values or one shard.
pub(super) struct MpiCollective<'w, F> {
    mpi: &'w Mpi,
    scratch: RefCell<Vec<F>>,
    /// Values per all-reduce call.
    chunk: usize,
}

impl<'w, F: Float> MpiCollective<'w, F> {
    pub(super) fn new(mpi: &'w Mpi) -> Self {
        MpiCollective {
            mpi,
            scratch: RefCell::new(Vec::new()),
            chunk: match mpi.one_node {
                true => MPI_CHUNK_ONE_NODE,
                false => MPI_CHUNK,
            },
        }
    }

    /// MPI's element type for `F` (the CPU backend's `f32` or `f64`).
    fn datatype() -> ffi::MPI_Datatype {
        // SAFETY: reading constants the MPI library initialized.
        unsafe {
            match TypeId::of::<F>() {
                t if t == TypeId::of::<f32>() => ffi::RSMPI_FLOAT,
                t if t == TypeId::of::<f64>() => ffi::RSMPI_DOUBLE,
                _ => unreachable!("the CPU backend's floats are f32 and f64"),
            }
        }
    }

    /// Each rank's shard of `n` values: counts and displacements, as MPI takes them.
    fn partition(&self, n: usize) -> (Vec<c_int>, Vec<c_int>) {
        let ranks = self.mpi.ranks();
        let shards = (0..ranks).map(|r| shard(n, ranks, r));
        let as_int = |x: usize| c_int::try_from(x).expect("a shard of under 2³¹ values");
        shards.map(|s| (as_int(s.len()), as_int(s.start))).unzip()
    }
}

impl<F: Float> Collective<HostBuf<F>, StepStats> for MpiCollective<'_, F> {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn ranks(&self) -> usize {
        self.mpi.ranks()
    }

    fn all_reduce_sum(&self, buf: SpanMut<HostBuf<F>>) -> Result<()> {
        let mut scratch = self.scratch.borrow_mut();
        for chunk in buf.slice().chunks_mut(self.chunk) {
            scratch.resize(chunk.len(), F::ZERO);
            // SAFETY: `chunk` and `scratch` are distinct buffers of `chunk.len()` values
            // of the datatype; every rank calls this with the same lengths.
            unsafe {
                ffi::MPI_Allreduce(
                    chunk.as_ptr().cast(),
                    scratch.as_mut_ptr().cast(),
                    chunk.len() as c_int,
                    Self::datatype(),
                    ffi::RSMPI_SUM,
                    self.mpi.world.as_raw(),
                );
            }
            chunk.copy_from_slice(&scratch);
        }
        Ok(())
    }

    fn reduce_scatter_sum(&self, buf: SpanMut<HostBuf<F>>) -> Result<()> {
        let buf = buf.slice();
        let (counts, _) = self.partition(buf.len());
        let mine = shard(buf.len(), self.ranks(), self.rank());
        let mut scratch = self.scratch.borrow_mut();
        scratch.resize(mine.len(), F::ZERO);
        // SAFETY: `buf` holds the sum of `counts` values, `scratch` this rank's count.
        unsafe {
            ffi::MPI_Reduce_scatter(
                buf.as_ptr().cast(),
                scratch.as_mut_ptr().cast(),
                counts.as_ptr(),
                Self::datatype(),
                ffi::RSMPI_SUM,
                self.mpi.world.as_raw(),
            );
        }
        buf[mine].copy_from_slice(&scratch);
        Ok(())
    }

    fn all_gather(&self, buf: SpanMut<HostBuf<F>>) -> Result<()> {
        let buf = buf.slice();
        let (counts, displs) = self.partition(buf.len());
        let mine = shard(buf.len(), self.ranks(), self.rank());
        let mut scratch = self.scratch.borrow_mut();
        scratch.clear();
        scratch.extend_from_slice(&buf[mine]);
        // SAFETY: `scratch` is this rank's count of values; `buf` holds all of them
        // at `displs`.
        unsafe {
            ffi::MPI_Allgatherv(
                scratch.as_ptr().cast(),
                scratch.len() as c_int,
                Self::datatype(),
                buf.as_mut_ptr().cast(),
                counts.as_ptr(),
                displs.as_ptr(),
                Self::datatype(),
                self.mpi.world.as_raw(),
            );
        }
        Ok(())
    }

    fn all_reduce_sum_squares(&self, stats: &mut StepStats) -> Result<()> {
        let mut sum = [stats.sum_squares];
        self.mpi.all_reduce(&mut sum, SystemOperation::sum());
        stats.sum_squares = sum[0];
        Ok(())
    }
}
