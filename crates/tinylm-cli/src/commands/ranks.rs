//! Commands that run as one rank of many (`train`, `bench`): the ranks a launcher
//! started, and what a rank does when it fails.

use anyhow::Result;
use tinylm::distributed::World;

/// Runs `command` as one rank of the ranks this process's launcher (`mpirun`,
/// `srun`) started, or alone. With several ranks, a rank that fails prints its error
/// and ends every rank (MPI_Abort), so that none waits for it; an error every rank
/// meets alike (ranks started differently) is said by rank 0, and every rank leaves
/// with exit status 2 after MPI_Finalize.
pub fn as_rank(command: impl FnOnce(&World) -> Result<()>) -> Result<()> {
    {
        let world = World::from_launcher()?;
        let result = command(&world);
        let (Err(err), 2..) = (&result, world.ranks()) else {
            return result;
        };
        let shared = matches!(err.downcast_ref(), Some(tinylm::Error::Ranks(_)));
        if world.is_root() || !shared {
            eprintln!("error: rank {}: {err:#}", world.rank());
        }
        if !shared {
            world.abort(2);
        }
    } // every rank reaches MPI_Finalize here
    std::process::exit(2);
}
