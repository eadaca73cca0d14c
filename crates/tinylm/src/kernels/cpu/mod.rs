//! The CPU backend: every kernel multi-threaded with rayon (the global pool, sized
//! by `--threads`), matrix products through the `gemm` crate, or under bf16 mixed
//! precision through the hand-written bf16 products of [`bf16`].
//!
//! One file per kernel family, forward and backward side by side with their
//! derivations; [`backend`] implements the [`Backend`](crate::kernels::Backend)
//! over them in `f32` (or `f64`), [`mixed`] in bf16 mixed precision, [`simd`] holds
//! the vector code they share and [`memory`] the buffers.

pub mod adamw;
pub mod attention;
pub mod backend;
pub mod bf16;
#[cfg(feature = "mpi")]
mod collective;
pub mod cross_entropy;
pub mod embedding;
mod few_dots;
pub mod global_norm;
pub mod linear;
pub mod memory;
pub mod mixed;
pub mod q8;
pub mod rmsnorm;
pub mod rope;
pub mod simd;
pub mod softmax;
pub mod swiglu;

pub use backend::Cpu;
pub use memory::HostBuf;
pub use mixed::CpuMixed;

/// Runs `work` on a thread of rayon's global pool: what calls the CPU backend's
/// kernels from elsewhere (a command's main thread, a server's model thread,
/// Python) should run on. The kernels' parallel loops then share their work with
/// the pool's other threads (a `join`) instead of handing all of it over from
/// outside the pool and sleeping until it is done — two thread wake-ups per loop,
/// which decoding, dozens of small loops per token, spent much of its time on.
pub fn on_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| work())
}

#[cfg(test)]
mod tests {
    use super::on_pool;

    /// `on_pool` runs its work on one of the pool's threads (whose parallel loops
    /// then join there), from a thread outside the pool, and gives its result back.
    #[test]
    fn on_pool_runs_on_a_thread_of_the_pool() {
        let outside = std::thread::spawn(|| {
            assert_eq!(rayon::current_thread_index(), None);
            on_pool(rayon::current_thread_index)
        });
        assert!(outside.join().unwrap().is_some());
    }
}
