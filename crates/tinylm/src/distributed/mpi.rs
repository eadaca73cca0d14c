//! The ranks over MPI (cargo feature `mpi`): the host-side collectives of
//! [`super::World`]. MPI's default error handler ends every rank on a failure, and a
//! launcher ends the others when one rank dies, so none of these calls returns an
//! error.

use crate::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;
use std::os::raw::c_int;

/// An initialized MPI (finalized when dropped) and its world communicator.
pub(crate) struct Mpi {
    pub(crate) world: SimpleCommunicator,
    local_rank: usize,
    local_ranks: usize,
    /// Every rank runs on this machine (the all-reduce's pieces are cut to suit).
    pub(crate) one_node: bool,
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
        let node = world.split_shared(world.rank());
        Ok(Mpi {
            local_rank: node.rank() as usize,
            local_ranks: node.size() as usize,
            one_node: node.size() == world.size(),
            world,
            _universe: universe,
        })
    }

    pub(crate) fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    pub(crate) fn ranks(&self) -> usize {
        self.world.size() as usize
    }

    pub(super) fn local_rank(&self) -> usize {
        self.local_rank
    }

    pub(super) fn local_ranks(&self) -> usize {
        self.local_ranks
    }

    pub(crate) fn all_reduce(&self, values: &mut [f64], op: SystemOperation) {
        let send = values.to_vec();
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
