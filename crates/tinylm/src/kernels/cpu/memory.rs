//! Memory of the CPU kernels: the CPU backends' buffers ([`HostBuf`]: zeroed on huge
//! pages, or a file's values mapped where they lie), a pointer parallel tasks
//! share to write disjoint parts of one buffer, per-thread scratch (and the size of
//! the parts a host write converts in it), a blocked transpose, and prefetches.

/// Values a task converts at a time where a buffer's values are written from the
/// host in parts ([`Backend::write_host`](crate::kernels::Backend::write_host)):
/// 256 KiB of `f32` in a thread's scratch, whole Q8_0 blocks.
pub(crate) const WRITE_CHUNK: usize = 1 << 16;

/// A zeroed buffer of `len` elements, from the allocator's zeroed memory: a large
/// one is fresh pages that nothing touches before the buffer's first writes (so
/// values never written cost no memory). On Linux a buffer of several MiB asks
/// for transparent huge pages before that first touch (`madvise`; a no-op where
/// the kernel has them off): a fault then brings 2 MiB at a time, several times
/// faster than 4 KiB ones, and the products' packing and attention, which walk
/// rows that lie kilobytes apart, are spared most of their TLB misses.
pub fn zeroed<T: bytemuck::Zeroable>(len: usize) -> Vec<T> {
    let buf = bytemuck::zeroed_vec::<T>(len);
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        let (start, end) = (
            buf.as_ptr() as usize,
            buf.as_ptr() as usize + len * size_of::<T>(),
        );
        let first = start.next_multiple_of(HUGE_PAGE);
        let last = end / HUGE_PAGE * HUGE_PAGE;
        if last > first {
            // SAFETY: the range lies inside `buf`'s allocation; the advice changes
            // how its pages are backed, never their contents.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                )
            };
        }
    }
    buf
}

/// A buffer of the CPU backends: values they own ([`zeroed`] ones), or a file's
/// values mapped where they lie ([`HostBuf::map`]). Either reads and writes as a
/// slice.
pub enum HostBuf<T> {
    Owned(Vec<T>),
    Mapped(Mapped<T>),
}

/// `len` values of `T` as a file holds them, mapped private (copy-on-write): the
/// file's pages in the page cache become the buffer's, with no fresh memory and no
/// copy, and a write copies only the page it falls in, which the file never sees.
pub struct Mapped<T> {
    map: memmap2::MmapMut,
    len: usize,
    values: std::marker::PhantomData<T>,
}

impl<T: bytemuck::Pod> HostBuf<T> {
    /// `len` values of `T` as they lie in `file` (native byte order) from byte
    /// `offset` on; `None` where that is not a whole, aligned run of the file, or
    /// the file cannot be mapped (the caller then reads it).
    ///
    /// A mapping sees what the file holds, so the file must not be changed in place
    /// while the buffer lives (tinylm's own writers replace a file whole, which a
    /// mapping of the old one does not see).
    pub fn map(file: &std::fs::File, offset: u64, len: usize) -> Option<Self> {
        let bytes = len * size_of::<T>();
        let fits = file.metadata().ok()?.len() >= offset + bytes as u64;
        if !fits || !offset.is_multiple_of(align_of::<T>() as u64) || bytes == 0 {
            return None;
        }
        // SAFETY: a private mapping of a file that nothing here writes; see above for
        // what its callers promise. Its start lies `offset % page` bytes into a
        // page, so it is aligned for `T` as `offset` is.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(bytes)
                .map_copy(file)
                .ok()?
        };
        // A hint, where the kernel takes it: pages the cache does not hold yet come
        // in 2 MiB at a time, and the mapping maps whole 2 MiB pages of the cache
        // where it has them (as for a file tinylm wrote, `safetensors_io::write_safetensors`):
        // a decoding step that streams every weight then misses the TLB 512 times
        // less (on a 512 MiB model a mapping of 4 KiB pages decoded 10% slower
        // than memory of its own). The page tables fill at the first touches (the
        // prompt's pass), which costs less there than filling them all first.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Some(HostBuf::Mapped(Mapped {
            map,
            len,
            values: std::marker::PhantomData,
        }))
    }
}

impl<T: Clone> HostBuf<T> {
    /// The values as a `Vec`: an owned buffer's own, a mapped one's copied.
    pub fn into_vec(self) -> Vec<T> {
        match self {
            HostBuf::Owned(values) => values,
            HostBuf::Mapped(_) => self.to_vec(),
        }
    }
}

impl<T> From<Vec<T>> for HostBuf<T> {
    fn from(values: Vec<T>) -> Self {
        HostBuf::Owned(values)
    }
}

impl<T> std::ops::Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            HostBuf::Owned(values) => values,
            // SAFETY: `map` holds `len` values of `T`, aligned, and any bytes are a
            // `T` (`Pod`): the only way to a `Mapped` is [`HostBuf::map`].
            HostBuf::Mapped(m) => unsafe {
                std::slice::from_raw_parts(m.map.as_ptr().cast(), m.len)
            },
        }
    }
}

impl<T> std::ops::DerefMut for HostBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            HostBuf::Owned(values) => values,
            // SAFETY: as for `deref`, and the mapping is private and writable.
            HostBuf::Mapped(m) => unsafe {
                std::slice::from_raw_parts_mut(m.map.as_mut_ptr().cast(), m.len)
            },
        }
    }
}

/// A raw pointer that parallel tasks may share to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<F>(pub *mut F);
// SAFETY: used only where each task writes a disjoint region (argued at each use).
unsafe impl<F> Send for SharedMut<F> {}
unsafe impl<F> Sync for SharedMut<F> {}

impl<F> SharedMut<F> {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    pub fn get(&self) -> *mut F {
        self.0
    }
}

thread_local! {
    /// One worker thread's scratch buffers (see [`with_scratch`]), a `Vec<T>` for
    /// each element type asked for.
    static SCRATCH: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's scratch of `len` elements of `T` (contents
/// unspecified). The buffer grows to the largest size asked for and is kept, one per
/// element type, so once a shape has run, later calls allocate nothing — for work
/// inside a rayon task that needs a few KiB of its own (attention's transposed
/// head in `f32`, a bf16 product's packed blocks in `u32`, both in one step under
/// bf16). A nested call for the same type gets a fresh buffer.
pub(crate) fn with_scratch<T: Copy + Default + 'static, R>(
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let mut slot = SCRATCH
        .with_borrow_mut(|kept| {
            let at = kept.iter().position(|b| b.is::<Vec<T>>())?;
            Some(kept.swap_remove(at))
        })
        .unwrap_or_else(|| Box::new(Vec::<T>::new()));
    let buf = slot
        .downcast_mut::<Vec<T>>()
        .expect("a Vec<T>, checked above");
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    let out = f(&mut buf[..len]);
    SCRATCH.with_borrow_mut(|kept| {
        // A nested call's buffer of the same type gives way to this one.
        kept.retain(|b| !b.is::<Vec<T>>());
        kept.push(slot);
    });
    out
}

/// `dst (cols, rows)` = the transpose of `src (rows, cols)` (row stride `src_rs`),
/// in blocks of rows so each block's source cache lines are read once.
pub(crate) fn transpose<T: Copy>(
    dst: &mut [T],
    src: &[T],
    rows: usize,
    cols: usize,
    src_rs: usize,
) {
    const BLOCK: usize = 16;
    assert_eq!(dst.len(), rows * cols, "transpose destination size");
    for r0 in (0..rows).step_by(BLOCK) {
        let r1 = (r0 + BLOCK).min(rows);
        for (j, dst_row) in dst.chunks_exact_mut(rows).enumerate() {
            for (r, x) in (r0..r1).zip(&mut dst_row[r0..r1]) {
                *x = src[r * src_rs + j];
            }
        }
    }
}

/// Asks the CPU to fetch `rows` rows of `bytes` bytes each, `stride` bytes apart,
/// from `start` into the cache (a hint: nothing happens where the architecture has
/// no stable prefetch instruction).
pub(crate) fn prefetch_rows<T>(start: *const T, rows: usize, stride: usize, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for r in 0..rows {
        let row = start.cast::<i8>().wrapping_add(r * stride);
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch is a hint; it never faults, whatever the address.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    row.wrapping_add(line),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, rows, stride, bytes);
}

#[cfg(test)]
mod tests {
    use super::{transpose, with_scratch};

    /// Field `key` (e.g. `VmFlags:`) of the mapping that holds `addr`, from
    /// `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn smaps_field(addr: usize, key: &str) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((start, end)) = range.split_once('-') {
                if let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                ) {
                    inside = (start..end).contains(&addr);
                    continue;
                }
            }
            if let Some(value) = line.strip_prefix(key).filter(|_| inside) {
                return value.to_string();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_ask_for_huge_pages_and_are_zero() {
        use super::zeroed;
        let buf: Vec<f32> = zeroed(8 << 20);
        let aligned = (buf.as_ptr() as usize).next_multiple_of(2 << 20);
        let flags = smaps_field(aligned, "VmFlags:");
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "32 MiB buffer without MADV_HUGEPAGE: VmFlags{flags}"
        );
        assert!(buf.iter().all(|&x| x == 0.0));
        let small: Vec<f64> = zeroed(100);
        assert_eq!(small, vec![0.0; 100]);
    }

    /// A forward-only model never writes its weights' `f32` values: they must cost
    /// no memory, in every element type (`zeroed` asks the allocator for zeroed
    /// memory rather than relying on the compiler to turn a fill into `calloc`).
    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_are_untouched_until_written() {
        use super::zeroed;
        fn resident_kib<T>(buf: &[T]) -> u64 {
            let aligned = (buf.as_ptr() as usize).next_multiple_of(2 << 20);
            let rss = smaps_field(aligned, "Rss:");
            let kib = rss.trim().trim_end_matches("kB").trim();
            kib.parse().expect("Rss in kB")
        }
        let values: Vec<f32> = zeroed(8 << 20);
        let copy: Vec<half::bf16> = zeroed(16 << 20);
        let quantized: Vec<i8> = zeroed(32 << 20);
        assert_eq!(resident_kib(&values), 0, "32 MiB of f32");
        assert_eq!(resident_kib(&copy), 0, "32 MiB of bf16");
        assert_eq!(resident_kib(&quantized), 0, "32 MiB of i8");
        let mut copy = copy;
        copy[(4 << 20) + 1] = half::bf16::ONE;
        assert!(resident_kib(&copy) > 0, "a written page is resident");
    }

    #[test]
    fn transpose_handles_strides_and_partial_blocks() {
        let (rows, cols, rs) = (37, 5, 9);
        let src: Vec<f32> = (0..rows * rs).map(|i| i as f32).collect();
        let mut dst = vec![f32::NAN; rows * cols];
        transpose(&mut dst, &src, rows, cols, rs);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(dst[c * rows + r], src[r * rs + c], "({r}, {c})");
            }
        }
    }

    #[test]
    fn scratch_is_kept_per_thread_and_per_float_type() {
        let first = with_scratch::<f32, _>(1000, |s| {
            s.fill(1.0);
            s.as_ptr()
        });
        // Smaller requests reuse the same buffer; a nested call gets its own.
        let again = with_scratch::<f32, _>(10, |s| {
            let nested = with_scratch::<f32, _>(10, |n| n.as_ptr());
            assert_ne!(nested, s.as_ptr());
            s.as_ptr()
        });
        assert_eq!(first, again);
        assert_eq!(with_scratch::<f64, _>(3, |s| s.len()), 3);
        // Another type in between keeps the first type's buffer.
        with_scratch::<u32, _>(1000, |s| s.fill(7));
        assert_eq!(with_scratch::<f32, _>(1000, |s| s.as_ptr()), first);
    }
}
