//! The CUDA backend's [`Collective`] over NCCL (cargo feature `nccl`) on its
//! [`CudaBuf`] buffers: one communicator per rank on its GPU (its local rank's),
//! every collective queued on the backend's own stream, in order with the kernels
//! around it; the host never waits for one.
//!
//! MPI starts the ranks and carries NCCL's unique id from rank 0 to the others.
//! NCCL itself is loaded at run time, once per process, from `libnccl.so.2` (the name
//! NCCL's packages and its pip wheels ship; `libnccl.so`, the development link, is
//! tried after it): cudarc 0.19's own loader tries `libnccl.so` and
//! `libnccl.so.{13,12,11,10,9,1}` among others, never `.so.2`, and panics when it
//! finds none, so only cudarc's bindings (the types) are used here, and a missing
//! library is one error line.
//!
//! Shards ([`shard`]) are unequal when the number of ranks does not divide the
//! buffer, and NCCL's ReduceScatter and AllGather take equal counts per rank. So a
//! reduce-scatter is one ncclReduce per shard to the rank that owns it, and an
//! all-gather one ncclBroadcast per shard from its owner, each set queued as one
//! group (ncclGroupStart/End): in place, with no padding or staging copy, and with
//! the ring algorithm the same traffic per rank, `(R − 1)/R` of the buffer, as
//! ReduceScatter and AllGather.
//!
//! A collective that fails after its call returned (a rank died, the ranks called it
//! differently: NCCL's asynchronous error) fails the stream; while the communicator
//! lives, the backend explains its later errors by NCCL's
//! ([`super::context::CollectiveFailure`]).

use super::buffer::{CudaBuf, CudaStats, DType, Dev};
use super::context::{driver_error, CollectiveFailure, Cuda};
use crate::distributed::{shard, World};
use crate::kernels::{Collective, SpanMut};
use crate::{Error, Result};
use cudarc::driver::CudaStream;
use cudarc::nccl::sys::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ops::Range;
use std::sync::{Arc, OnceLock};

/// The NCCL library file loaded, as NCCL 2's packages and pip wheels name it.
const NCCL_LIBRARY: &str = "libnccl.so.2";

/// The file names tried, in order: [`NCCL_LIBRARY`], then the development link.
const LIBRARY_FILES: [&str; 2] = [NCCL_LIBRARY, "libnccl.so"];

/// What NCCL calls return on success (`ncclResult_t` is a C enum: an `int`, taken as
/// one, since a newer NCCL may return codes the bindings do not list).
const SUCCESS: c_int = ncclResult_t::ncclSuccess as c_int;

/// The oldest NCCL this module runs with, as `ncclGetVersion` writes it (`10000·major
/// + 100·minor + patch`): 2.13 brought `ncclGetLastError`.
const MIN_VERSION: c_int = 21300;

/// `ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)`.
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> c_int;
/// `ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream)`.
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> c_int;
/// `ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)`.
type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> c_int;

/// The NCCL functions this module calls, resolved from the loaded library, which
/// stays loaded (in a `static`) for as long as the process runs.
struct Library {
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> c_int,
    comm_abort: unsafe extern "C" fn(ncclComm_t) -> c_int,
    comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    all_reduce: AllReduceFn,
    reduce: ReduceFn,
    broadcast: BroadcastFn,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
    _library: libloading::Library,
}

impl Library {
    /// NCCL, loaded on the first call; a missing library or function is one line
    /// naming it and how to install NCCL.
    fn get() -> Result<&'static Library> {
        static LIBRARY: OnceLock<std::result::Result<Library, String>> = OnceLock::new();
        LIBRARY
            .get_or_init(|| Library::load(&LIBRARY_FILES))
            .as_ref()
            .map_err(|message| Error::Device(message.clone()))
    }

    /// NCCL from the first of `files` that loads.
    fn load(files: &[&str]) -> std::result::Result<Library, String> {
        // SAFETY: loading NCCL runs its initializers, which only set up the library.
        let library = files
            .iter()
            .find_map(|file| unsafe { libloading::Library::new(*file) }.ok())
            .ok_or_else(|| {
                format!(
                    "{NCCL_LIBRARY} (NCCL, the GPUs' collectives for training on several \
                     ranks) could not be loaded: `pip install nvidia-nccl-cu13` and put its \
                     nvidia/nccl/lib on LD_LIBRARY_PATH, or install the system's NCCL 2 \
                     (libnccl2)"
                )
            })?;
        // Function `$name` of `library`, with the type of the field it fills.
        macro_rules! function {
            ($name:literal) => {
                // SAFETY: each field's type is the signature nccl.h declares for the
                // function of that name, and `library` outlives the pointer (both
                // are kept in the `Library`).
                *unsafe { library.get($name) }.map_err(|e| {
                    format!(
                        "{NCCL_LIBRARY} has no {}: NCCL 2.13 or newer is needed ({e})",
                        $name
                    )
                })?
            };
        }
        let get_version: unsafe extern "C" fn(*mut c_int) -> c_int = function!("ncclGetVersion");
        let mut version = 0;
        // SAFETY: writes one int.
        if unsafe { get_version(&mut version) } != SUCCESS {
            return Err(format!("{NCCL_LIBRARY}'s ncclGetVersion failed"));
        }
        check_version(version)?;
        Ok(Library {
            get_unique_id: function!("ncclGetUniqueId"),
            comm_init_rank: function!("ncclCommInitRank"),
            comm_abort: function!("ncclCommAbort"),
            comm_get_async_error: function!("ncclCommGetAsyncError"),
            group_start: function!("ncclGroupStart"),
            group_end: function!("ncclGroupEnd"),
            all_reduce: function!("ncclAllReduce"),
            reduce: function!("ncclReduce"),
            broadcast: function!("ncclBroadcast"),
            get_error_string: function!("ncclGetErrorString"),
            get_last_error: function!("ncclGetLastError"),
            _library: library,
        })
    }

    /// `code`, an NCCL call's result, as [`failed`] says it, with NCCL's name for
    /// the code and its last error message.
    fn check(&self, code: c_int, what: &str) -> Result<()> {
        if code == SUCCESS {
            return Ok(());
        }
        let text = |s: *const c_char| {
            if s.is_null() {
                return String::new();
            }
            // SAFETY: NCCL returns null or a NUL-terminated string it owns, which
            // lives until its next call on this thread.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        // SAFETY: both take any code or a null communicator (NCCL 2.13+).
        let (name, last) = unsafe {
            (
                text((self.get_error_string)(code)),
                text((self.get_last_error)(std::ptr::null_mut())),
            )
        };
        Err(failed(what, &name, &last))
    }

    /// `comm`'s asynchronous error (a queued collective that failed), as [`Library::check`]
    /// says it; `None` while it has none.
    fn async_error(&self, comm: ncclComm_t) -> Option<Error> {
        let mut code = SUCCESS;
        // SAFETY: `comm` is a live communicator (see `Failure`); writes one int. NCCL
        // lets any thread query it while others use it.
        let queried = unsafe { (self.comm_get_async_error)(comm, &mut code) };
        let what = "collective (ncclCommGetAsyncError)";
        self.check(queried, what).and(self.check(code, what)).err()
    }
}

/// NCCL call `what` failed with the code NCCL names `name` and its last error
/// message `last`: one line. This rank's device error, not one every rank meets
/// alike (`Error::Ranks`): the rank that meets it says it and ends every rank, where
/// one that finalized instead would leave the others waiting in their collective
/// and say nothing unless it is rank 0.
fn failed(what: &str, name: &str, last: &str) -> Error {
    let last = last.split_whitespace().collect::<Vec<_>>().join(" ");
    let detail = if last.is_empty() {
        String::new()
    } else {
        format!(" ({last})")
    };
    Error::Device(format!("NCCL {what} failed: {name}{detail}"))
}

/// One line naming the loaded and the needed NCCL when NCCL `version`
/// (`ncclGetVersion`'s encoding) is too old.
fn check_version(version: c_int) -> std::result::Result<(), String> {
    // 2.9 and later: 10000·major + 100·minor + patch; before, 1000·major + 100·minor + patch.
    let name = |v: c_int| match v {
        10000.. => format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100),
        _ => format!("{}.{}.{}", v / 1000, v / 100 % 10, v % 100),
    };
    if version >= MIN_VERSION {
        return Ok(());
    }
    Err(format!(
        "{NCCL_LIBRARY} is NCCL {}; tinylm needs NCCL {} or newer: `pip install \
         nvidia-nccl-cu13` and put its nvidia/nccl/lib first on LD_LIBRARY_PATH",
        name(version),
        name(MIN_VERSION)
    ))
}

/// A communicator as the backend's [`CollectiveFailure`] holds it: it is cleared
/// before the communicator is aborted, and NCCL lets any thread query it.
struct Failure {
    nccl: &'static Library,
    comm: ncclComm_t,
}

// SAFETY: see `Failure`: only `ncclCommGetAsyncError` is called through it, which NCCL
// allows from any thread, and never after the communicator is aborted.
unsafe impl Send for Failure {}

impl Failure {
    fn error(&self) -> Option<Error> {
        self.nccl.async_error(self.comm)
    }
}

/// The values of `span` and, for parameters under bf16, the same elements of their
/// bf16 copy: what a collective moves between ranks.
fn views(span: SpanMut<CudaBuf>) -> (Dev, Option<Dev>) {
    let range = span.start..span.start + span.len;
    let copy = span.buf.shadow.as_ref().map(|s| s.slice(range.clone()));
    (span.buf.data.slice(range), copy)
}

/// NCCL's element type for a buffer's.
fn data_type(dtype: DType) -> ncclDataType_t {
    match dtype {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::Bf16 => ncclDataType_t::ncclBfloat16,
        DType::F64 => ncclDataType_t::ncclFloat64,
        DType::U32 => ncclDataType_t::ncclUint32,
    }
}

/// One rank's NCCL communicator on its GPU, and the stream of that GPU's backend
/// that every collective is queued on. It holds the stream (and so the device's
/// context) for as long as the communicator lives.
pub(super) struct Nccl {
    nccl: &'static Library,
    comm: ncclComm_t,
    stream: Arc<CudaStream>,
    /// The backend's, set to this communicator's asynchronous error while it lives.
    failure: CollectiveFailure,
    rank: usize,
    ranks: usize,
}

impl Nccl {
    /// The communicator of `world`'s ranks, this one on `cuda`'s device (each rank's
    /// is its local rank's GPU): rank 0 creates NCCL's unique id, MPI broadcasts it,
    /// and every rank joins (ncclCommInitRank returns when all have).
    pub(super) fn new(cuda: &Cuda, world: &World) -> Result<Nccl> {
        let nccl = Library::get()?;
        let (rank, ranks) = (world.rank(), world.ranks());
        let mut id = ncclUniqueId { internal: [0; 128] };
        if world.is_root() {
            // SAFETY: writes one `ncclUniqueId`.
            let code = unsafe { (nccl.get_unique_id)(&mut id) };
            nccl.check(code, "ncclGetUniqueId (the id of the ranks' communicator)")?;
        }
        let mut bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        world.broadcast(&mut bytes, 0);
        let received = bytes.len();
        let bytes: [u8; 128] = bytes.try_into().map_err(|_| {
            Error::Ranks(format!(
                "rank 0 sent an NCCL id of {received} bytes, not 128"
            ))
        })?;
        id.internal = bytes.map(|b| b as c_char);
        let stream = cuda.stream().clone();
        bind(&stream)?;
        let as_int = |n: usize| c_int::try_from(n).expect("under 2³¹ ranks");
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` receives the communicator; the device is the current one
        // (bound above), as ncclCommInitRank takes it.
        let code = unsafe { (nccl.comm_init_rank)(&mut comm, as_int(ranks), id, as_int(rank)) };
        let what = format!("ncclCommInitRank (joining the communicator of {ranks} ranks)");
        nccl.check(code, &what)?;
        let failure = cuda.collective_failure.clone();
        let probe = Failure { nccl, comm };
        *failure.lock().expect("collective failure lock") = Some(Box::new(move || probe.error()));
        Ok(Nccl {
            nccl,
            comm,
            stream,
            failure,
            rank,
            ranks,
        })
    }

    /// The stream, as NCCL takes it.
    fn cu_stream(&self) -> cudaStream_t {
        self.stream.cu_stream().cast()
    }

    /// Each rank's non-empty [`shard`] of `len` values, with that rank (empty ones
    /// are skipped alike on every rank: all call with the same length).
    fn shards(&self, len: usize) -> impl Iterator<Item = (c_int, Range<usize>)> {
        let ranks = self.ranks;
        (0..ranks)
            .map(move |r| (r as c_int, shard(len, ranks, r)))
            .filter(|(_, s)| !s.is_empty())
    }

    /// Queues `values` ← their sum over ranks (`values`, a view of one buffer).
    fn all_reduce_in_place(&self, values: Dev, what: &str) -> Result<()> {
        bind(&self.stream)?;
        // SAFETY: `values` points into a live device buffer of `values.len` elements
        // of its type, summed in place (send = receive); queued on the backend's
        // stream, after the kernels that wrote it.
        let code = unsafe {
            (self.nccl.all_reduce)(
                values.ptr as *const c_void,
                values.ptr as *mut c_void,
                values.len,
                data_type(values.dtype),
                ncclRedOp_t::ncclSum,
                self.comm,
                self.cu_stream(),
            )
        };
        self.nccl.check(code, what)
    }

    /// Queues `queue`'s NCCL calls as one group (one launch on the stream). The
    /// group is closed even when a call fails; the first error is returned.
    fn grouped(&self, what: &str, queue: impl FnOnce() -> Result<()>) -> Result<()> {
        bind(&self.stream)?;
        // SAFETY: opens a group on this thread, closed below.
        let code = unsafe { (self.nccl.group_start)() };
        self.nccl.check(code, what)?;
        let queued = queue();
        // SAFETY: closes the group opened above, queuing its calls.
        let code = unsafe { (self.nccl.group_end)() };
        queued.and(self.nccl.check(code, what))
    }

    /// Queues shard `range` of `values` from rank `root` to every rank, in place.
    fn broadcast_shard(&self, values: Dev, root: c_int, range: &Range<usize>) -> Result<()> {
        let part = values.sub(range.start, range.len());
        // SAFETY: `part` points into a live device buffer of `part.len` elements of
        // its type, sent from `root` and received in place (send = receive) on the
        // others; queued on the backend's stream.
        let code = unsafe {
            (self.nccl.broadcast)(
                part.ptr as *const c_void,
                part.ptr as *mut c_void,
                part.len,
                data_type(part.dtype),
                root,
                self.comm,
                self.cu_stream(),
            )
        };
        self.nccl.check(code, "ncclBroadcast (all-gather)")
    }
}

impl Collective<CudaBuf, CudaStats> for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    /// In place on the values (the gradient: f32, without a bf16 copy).
    fn all_reduce_sum(&self, buf: SpanMut<CudaBuf>) -> Result<()> {
        let (values, copy) = views(buf);
        debug_assert!(copy.is_none(), "a summed buffer has no bf16 copy");
        if values.len == 0 {
            return Ok(());
        }
        self.all_reduce_in_place(values, "ncclAllReduce (all-reduce of the gradient)")
    }

    /// One ncclReduce per shard, in place, to the rank that owns it (see the
    /// module's documentation); the other shards are undefined afterwards.
    fn reduce_scatter_sum(&self, buf: SpanMut<CudaBuf>) -> Result<()> {
        let (values, copy) = views(buf);
        debug_assert!(copy.is_none(), "a summed buffer has no bf16 copy");
        let what = "ncclReduce (reduce-scatter of the gradient)";
        self.grouped(what, || {
            for (root, range) in self.shards(values.len) {
                let part = values.sub(range.start, range.len());
                // SAFETY: `part` points into a live device buffer of `part.len`
                // elements of its type, summed in place (send = receive) into rank
                // `root`'s; queued on the backend's stream, after the backward pass.
                let code = unsafe {
                    (self.nccl.reduce)(
                        part.ptr as *const c_void,
                        part.ptr as *mut c_void,
                        part.len,
                        data_type(part.dtype),
                        ncclRedOp_t::ncclSum,
                        root,
                        self.comm,
                        self.cu_stream(),
                    )
                };
                self.nccl.check(code, what)?;
            }
            Ok(())
        })
    }

    /// One ncclBroadcast per shard from the rank that owns it, of the values and,
    /// for parameters under bf16, of their bf16 copy: AdamW updated both on the
    /// owner alone (the f32 master values, which the checkpoint, the embedding and
    /// the norms read, and the copy the matrix products read).
    fn all_gather(&self, buf: SpanMut<CudaBuf>) -> Result<()> {
        let (values, copy) = views(buf);
        self.grouped("ncclBroadcast (all-gather)", || {
            for (root, range) in self.shards(values.len) {
                self.broadcast_shard(values, root, &range)?;
                if let Some(copy) = copy {
                    self.broadcast_shard(copy, root, &range)?;
                }
            }
            Ok(())
        })
    }

    /// In place on the device's f64 slot, before AdamW reads it there.
    fn all_reduce_sum_squares(&self, stats: &mut CudaStats) -> Result<()> {
        let what = "ncclAllReduce (sum of the gradient's squares)";
        self.all_reduce_in_place(stats.sum_squares(), what)
    }
}

impl Drop for Nccl {
    /// Aborts the communicator rather than destroying it: ncclCommDestroy first
    /// finalizes, which waits for the other ranks, so a rank ending with an error
    /// could hang here instead of reaching MPI_Abort, which ends them all.
    /// ncclCommAbort is local. A run that ends normally has already waited for its
    /// queued work: it ends after reading its last step's statistics.
    fn drop(&mut self) {
        *self.failure.lock().expect("collective failure lock") = None;
        // Best-effort teardown: a failure to bind leaves NCCL to set the device.
        let _ = bind(&self.stream);
        // SAFETY: `comm` came from ncclCommInitRank and is not used after this.
        let _ = unsafe { (self.nccl.comm_abort)(self.comm) };
    }
}

/// Makes `stream`'s device context current on this thread: NCCL works on the
/// current device (the model may be driven from another thread than the one that
/// opened it).
fn bind(stream: &CudaStream) -> Result<()> {
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| driver_error("binding the context for NCCL", e))
}

#[cfg(test)]
mod tests {
    use super::{check_version, failed, Library};
    use crate::Error;

    #[test]
    fn a_failed_nccl_call_is_one_line_and_this_ranks_own_error() {
        let e = failed(
            "ncclAllReduce (all-reduce of the gradient)",
            "remote process exited or there was a network error",
            "rank 0 (pid 7, cuda:0)\nexited",
        );
        assert!(matches!(e, Error::Device(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "NCCL ncclAllReduce (all-reduce of the gradient) failed: remote process exited or \
             there was a network error (rank 0 (pid 7, cuda:0) exited)"
        );
    }

    #[test]
    fn an_nccl_older_than_2_13_is_one_line_naming_both_versions() {
        for (version, named) in [(21212, "NCCL 2.12.12;"), (2804, "NCCL 2.8.4;")] {
            let e = check_version(version).unwrap_err();
            assert!(
                e.contains(named) && e.contains("NCCL 2.13.0 or newer") && !e.contains('\n'),
                "{e}"
            );
        }
        assert!(check_version(21300).is_ok());
        assert!(check_version(22803).is_ok());
    }

    #[test]
    fn a_missing_nccl_is_one_line_saying_how_to_install_it() {
        // A file no machine has, so that the test is the same with or without NCCL.
        let Err(e) = Library::load(&["libnccl-missing.so.2"]) else {
            panic!("a library that does not exist loaded");
        };
        assert!(
            e.contains("libnccl.so.2")
                && e.contains("pip install nvidia-nccl-cu13")
                && e.contains("LD_LIBRARY_PATH")
                && !e.contains('\n'),
            "{e}"
        );
    }
}
