//! Data parallelism over ranks: processes started by an MPI launcher (`mpirun`,
//! Slurm's `srun`), each with a replica of the model and a share of every batch.
//!
//! [`World`] is the process's place among the ranks and the host-side collectives
//! the training loop needs (the loss averaged over ranks, rank 0's decisions
//! broadcast, optimizer shards gathered for a checkpoint): MPI in builds with the
//! cargo feature `mpi`, one rank otherwise. The per-step part on the backend's own
//! buffers — the gradient's all-reduce, or under ZeRO-1 its reduce-scatter and the
//! parameters' all-gather, which [`crate::Model::optimizer_step`] queues between
//! backward and AdamW — is the kernel interface's [`crate::kernels::Collective`]:
//! MPI's on the CPU, NCCL's on GPUs (feature `nccl`).
//!
//! Shards are contiguous ranges of the flat buffer, rank `r` holding [`shard`]`(n,
//! R, r)`: the ranks' shards in rank order are the whole buffer.

#[cfg(feature = "mpi")]
mod mpi;

#[cfg(feature = "mpi")]
pub(crate) use mpi::Mpi;

use crate::{Error, Result};
use std::ops::Range;

/// Values per all-reduce call of the CPU's MPI collectives when the ranks span
/// several machines: a larger buffer goes through their scratch in pieces this long,
/// long enough for MPI to pipeline each over the network and to pay a message's
/// latency rarely. The most the scratch holds.
pub const MPI_CHUNK: usize = 1 << 22;

/// Values per all-reduce call when every rank is on one machine. There the
/// all-reduce is memory traffic between the ranks' cores, fastest in pieces that
/// stay in a core's cache with MPI's own buffers and the scratch: on a 2-core Xeon
/// with 2 MiB-per-core L2, 2 ranks sum a 20 MiB gradient in 4.4 ms in pieces of 2¹⁷
/// values (512 KiB) against 7–8 ms in pieces of 2²² (16 MiB).
pub const MPI_CHUNK_ONE_NODE: usize = 1 << 17;

/// Rank `rank`'s part of `n` values split over `ranks`: contiguous, in rank order,
/// the first `n % ranks` ranks one value longer.
pub fn shard(n: usize, ranks: usize, rank: usize) -> Range<usize> {
    let (base, extra) = (n / ranks, n % ranks);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// How [`World::all_reduce`] combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Min,
    Max,
}

/// This process's place among the ranks of a run, and the host-side collectives
/// over them. Rank 0 is the root: it alone prints, logs and writes.
pub struct World {
    rank: usize,
    ranks: usize,
    local_rank: usize,
    /// Ranks on this machine.
    local_ranks: usize,
    #[cfg(feature = "mpi")]
    mpi: Option<mpi::Mpi>,
}

/// Environment variables by which launchers tell a process the number of ranks:
/// Open MPI's `mpirun`, MPICH's and Intel MPI's Hydra, and Slurm's `srun`.
const LAUNCHER_SIZE_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"];

/// The number of ranks a launcher started, when this process was started by one.
fn launched_ranks() -> Option<usize> {
    LAUNCHER_SIZE_VARS
        .iter()
        .find_map(|var| std::env::var(var).ok()?.trim().parse().ok())
}

impl World {
    /// A run of one rank.
    pub fn single() -> World {
        World {
            rank: 0,
            ranks: 1,
            local_rank: 0,
            local_ranks: 1,
            #[cfg(feature = "mpi")]
            mpi: None,
        }
    }

    /// The ranks this process's launcher started (`mpirun`, `srun`), through MPI;
    /// one rank when no launcher started it (or started it alone). A build without
    /// the `mpi` feature started as one of several ranks is an error saying so.
    pub fn from_launcher() -> Result<World> {
        match launched_ranks() {
            None | Some(0 | 1) => Ok(World::single()),
            Some(ranks) => World::init_mpi(ranks),
        }
    }

    #[cfg(feature = "mpi")]
    fn init_mpi(_: usize) -> Result<World> {
        let mpi = mpi::Mpi::init()?;
        Ok(World {
            rank: mpi.rank(),
            ranks: mpi.ranks(),
            local_rank: mpi.local_rank(),
            local_ranks: mpi.local_ranks(),
            mpi: Some(mpi),
        })
    }

    #[cfg(not(feature = "mpi"))]
    fn init_mpi(ranks: usize) -> Result<World> {
        Err(Error::Ranks(format!(
            "this process is one of {ranks} ranks started by mpirun or srun, but this tinylm \
             was built without MPI: rebuild it with `cargo build --release --features mpi`"
        )))
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The rank among those on this machine (which GPU a rank takes).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The ranks on this machine (which share its memory).
    pub fn local_ranks(&self) -> usize {
        self.local_ranks
    }

    /// Rank 0, the one that prints, logs and writes.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// Ends every rank with exit status `code` (MPI_Abort), or this process alone.
    pub fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = self.mpi() {
            mpi.abort(code);
        }
        std::process::exit(code)
    }

    /// The MPI ranks, when there are several.
    #[cfg(feature = "mpi")]
    pub(crate) fn mpi(&self) -> Option<&Mpi> {
        self.mpi.as_ref()
    }

    /// `values` ← their combination by `op` over the ranks (element by element).
    #[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
    pub fn all_reduce(&self, values: &mut [f64], op: Reduce) {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = self.mpi() {
            use ::mpi::collective::SystemOperation;
            let op = match op {
                Reduce::Sum => SystemOperation::sum(),
                Reduce::Min => SystemOperation::min(),
                Reduce::Max => SystemOperation::max(),
            };
            mpi.all_reduce(values, op);
        }
    }

    /// Rank `root`'s `bytes` to every rank (resized to its length).
    #[cfg_attr(not(feature = "mpi"), allow(unused_variables, clippy::ptr_arg))]
    pub fn broadcast(&self, bytes: &mut Vec<u8>, root: usize) {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = self.mpi() {
            mpi.broadcast(bytes, root);
        }
    }

    /// Rank 0's `values` to every rank.
    #[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
    pub fn broadcast_f64(&self, values: &mut [f64]) {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = self.mpi() {
            mpi.broadcast_f64(values);
        }
    }

    /// Rank 0's `flags`, on every rank: a decision that reads the clock or a signal.
    pub fn root_flags<const N: usize>(&self, flags: [bool; N]) -> [bool; N] {
        let mut values = flags.map(|f| f64::from(u8::from(f)));
        self.broadcast_f64(&mut values);
        values.map(|v| v > 0.0)
    }

    /// Every rank's `values` in rank order, at rank 0 (`None` on the others).
    pub fn gather(&self, values: Vec<f32>) -> Option<Vec<f32>> {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = self.mpi() {
            return mpi.gather(&values);
        }
        Some(values)
    }

    /// Checks that every rank was started with the same `description` (its
    /// configuration and data, as `(name, value)` pairs): otherwise every rank
    /// fails with an error naming the first rank that differs and how.
    pub fn check_same(&self, description: &[(String, String)]) -> Result<()> {
        if self.ranks == 1 {
            return Ok(());
        }
        let mut root = serde_json::to_vec(description).expect("serializes");
        self.broadcast(&mut root, 0);
        let root: Vec<(String, String)> = serde_json::from_slice(&root).expect("rank 0 sent JSON");
        let difference = description
            .iter()
            .zip(&root)
            .find(|(mine, theirs)| mine != theirs);
        let mut first = [match difference {
            Some(_) => self.rank as f64,
            None => self.ranks as f64,
        }];
        self.all_reduce(&mut first, Reduce::Min);
        let first = first[0] as usize;
        if first == self.ranks {
            return Ok(());
        }
        let mut message = match difference {
            Some(((name, mine), (_, theirs))) if first == self.rank => format!(
                "the ranks were started differently: rank {first} has {name} = {mine}, rank 0 has {theirs}"
            )
            .into_bytes(),
            _ => Vec::new(),
        };
        self.broadcast(&mut message, first);
        Err(Error::Ranks(String::from_utf8_lossy(&message).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_tile_the_buffer_in_rank_order() {
        for n in [0, 1, 7, 64, 1001] {
            for ranks in 1..=5 {
                let mut next = 0;
                for rank in 0..ranks {
                    let s = shard(n, ranks, rank);
                    assert_eq!(s.start, next, "n {n}, ranks {ranks}, rank {rank}");
                    assert!(s.len() == n / ranks || s.len() == n / ranks + 1);
                    next = s.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn a_single_world_is_rank_zero_of_one() {
        let world = World::single();
        assert_eq!((world.rank(), world.ranks(), world.is_root()), (0, 1, true));
        let mut v = [1.5, 2.0];
        world.all_reduce(&mut v, Reduce::Sum);
        assert_eq!(v, [1.5, 2.0]);
        assert_eq!(world.gather(vec![1.0, 2.0]), Some(vec![1.0, 2.0]));
        world.check_same(&[("a".into(), "1".into())]).unwrap();
    }
}
