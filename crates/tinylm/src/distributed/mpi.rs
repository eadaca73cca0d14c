//! The ranks over MPI (cargo feature `mpi`): the host-side collectives of
//! [`super::World`] and the CPU backend's [`Collective`] on its `Vec<F>` buffers.
//! MPI's default error handler ends every rank on a failure, and a launcher ends
//! the others when one rank dies, so none of these calls returns an error.

use super::{shard, Collective, Reduce};
use crate::kernels::{Float, SpanMut, StepStats};
use crate::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;
use std::any::TypeId;
use std::cell::RefCell;
use std::os::raw::c_int;

/// An initialized MPI (finalized when dropped) and its world communicator.
pub(super) struct Mpi {
    world: SimpleCommunicator,
    local_rank: usize,
    _universe: Universe,
}

impl Mpi {
    /// MPI for calls from any one thread at a time (a training run calls it from
    /// the thread pool its kernels run on).
    pub(super) fn init() -> Result<Mpi> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| Error::Ranks("MPI was initialized already in this process".into()))?;
        if threading < Threading::Serialized {
            return Err(Error::Ranks(format!(
                "the MPI library offers thread level {threading:?}; tinylm needs Serialized"
            )));
        }
        let world = universe.world();
        let local_rank = world.split_shared(world.rank()).rank() as usize;
        Ok(Mpi {
            world,
            local_rank,
            _universe: universe,
        })
    }

    pub(super) fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    pub(super) fn ranks(&self) -> usize {
        self.world.size() as usize
    }

    pub(super) fn local_rank(&self) -> usize {
        self.local_rank
    }

    pub(super) fn all_reduce(&self, values: &mut [f64], op: Reduce) {
        let send = values.to_vec();
        let op = match op {
            Reduce::Sum => SystemOperation::sum(),
            Reduce::Min => SystemOperation::min(),
            Reduce::Max => SystemOperation::max(),
        };
        self.world.all_reduce_into(&send[..], values, op);
    }

    pub(super) fn broadcast(&self, bytes: &mut Vec<u8>, root: usize) {
        let root = self.world.process_at_rank(root as i32);
        let mut len = bytes.len() as u64;
        root.broadcast_into(&mut len);
        bytes.resize(len as usize, 0);
        root.broadcast_into(&mut bytes[..]);
    }

    pub(super) fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    pub(super) fn broadcast_f64(&self, values: &mut [f64]) {
        self.world.process_at_rank(0).broadcast_into(values);
    }

    pub(super) fn gather(&self, values: &[f32]) -> Option<Vec<f32>> {
        let root = self.world.process_at_rank(0);
        let count = values.len() as c_int;
        if self.rank() != 0 {
            root.gather_into(&count);
            root.gather_varcount_into(values);
            return None;
        }
        let mut counts = vec![0 as c_int; self.ranks()];
        root.gather_into_root(&count, &mut counts[..]);
        let displs: Vec<c_int> = counts
            .iter()
            .scan(0, |at, &c| {
                let start = *at;
                *at += c;
                Some(start)
            })
            .collect();
        let mut all = vec![0.0f32; counts.iter().map(|&c| c as usize).sum()];
        let mut partition = PartitionMut::new(&mut all[..], counts, displs);
        root.gather_varcount_into_root(values, &mut partition);
        Some(all)
    }
}

// SAFETY: MPI runs at thread level Serialized (checked by `Mpi::init`), and a run
// makes its calls from one thread at a time: its loop's.
unsafe impl Sync for Mpi {}
unsafe impl Send for Mpi {}

/// Values per MPI call: large buffers go through the scratch in chunks this long.
const CHUNK: usize = 1 << 22;

/// The CPU backend's collectives over MPI, through a scratch buffer (MPI has no
/// portable in-place form here) of at most [`CHUNK`] values or one shard.
pub(super) struct MpiCollective<'w, F> {
    mpi: &'w Mpi,
    scratch: RefCell<Vec<F>>,
}

impl<'w, F: Float> MpiCollective<'w, F> {
    pub(super) fn new(mpi: &'w Mpi) -> Self {
        MpiCollective {
            mpi,
            scratch: RefCell::new(Vec::new()),
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

impl<F: Float> Collective<Vec<F>, StepStats> for MpiCollective<'_, F> {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn ranks(&self) -> usize {
        self.mpi.ranks()
    }

    fn all_reduce_sum(&self, buf: SpanMut<Vec<F>>) -> Result<()> {
        let mut scratch = self.scratch.borrow_mut();
        for chunk in buf.slice().chunks_mut(CHUNK) {
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

    fn reduce_scatter_sum(&self, buf: SpanMut<Vec<F>>) -> Result<()> {
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

    fn all_gather(&self, buf: SpanMut<Vec<F>>) -> Result<()> {
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
        self.mpi.all_reduce(&mut sum, Reduce::Sum);
        stats.sum_squares = sum[0];
        Ok(())
    }
}
