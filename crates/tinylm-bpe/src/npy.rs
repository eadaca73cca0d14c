//! NumPy `.npy` files (format version 1.0), little-endian, C order.
//!
//! Token files are 1-D `uint16` (when the vocabulary has at most 65,536 entries)
//! or `uint32` arrays that `np.load(path, mmap_mode="r")` reads. [`NpyWriter`]
//! streams values of unknown count into a file written whole or not at all
//! ([`AtomicFile`]); [`MappedNpy`] memory-maps an array of any integer or `float32` dtype.

use crate::atomic::AtomicFile;
use crate::{invalid, Error, Result};
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"\x93NUMPY";
/// Header size used by [`NpyWriter`]: room for any shape, a multiple of 64.
const WRITER_HEADER_LEN: usize = 128;

/// Element types tinylm reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    U16,
    U32,
    I32,
    I64,
    F32,
}

impl Dtype {
    pub fn descr(self) -> &'static str {
        match self {
            Dtype::U16 => "<u2",
            Dtype::U32 => "<u4",
            Dtype::I32 => "<i4",
            Dtype::I64 => "<i8",
            Dtype::F32 => "<f4",
        }
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::U16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::I64 => 8,
        }
    }

    fn from_descr(descr: &str) -> Option<Dtype> {
        Some(match descr {
            "<u2" => Dtype::U16,
            "<u4" => Dtype::U32,
            "<i4" => Dtype::I32,
            "<i8" => Dtype::I64,
            "<f4" => Dtype::F32,
            _ => return None,
        })
    }

    /// The smallest unsigned dtype that holds ids below `vocab_size`.
    pub fn for_vocab(vocab_size: usize) -> Dtype {
        if vocab_size <= 1 << 16 {
            Dtype::U16
        } else {
            Dtype::U32
        }
    }
}

/// A parsed `.npy` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte offset of the data in the file.
    pub data_offset: usize,
}

impl Header {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The header bytes for an array, padded with spaces to `total` bytes (a multiple of
/// 64), or `None` when the shape's description does not fit in `total`.
fn header_bytes(dtype: Dtype, shape: &[usize], total: usize) -> Option<Vec<u8>> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        shape
    );
    if 10 + dict.len() + 1 > total {
        return None;
    }
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&((total - 10) as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    Some(out)
}

/// Writes a whole array to `path` (whole or not at all).
pub fn write<T: NpyElement>(path: &Path, shape: &[usize], data: &[T]) -> Result<()> {
    assert_eq!(shape.iter().product::<usize>(), data.len());
    let mut w = NpyWriter::create(path, T::DTYPE)?;
    w.set_shape(shape.to_vec());
    w.write_all(data)?;
    w.finish()
}

/// Plain-old-data element types that have an `.npy` dtype.
pub trait NpyElement: Copy {
    const DTYPE: Dtype;
    fn write_le(self, out: &mut Vec<u8>);
}

macro_rules! npy_element {
    ($t:ty, $d:expr) => {
        impl NpyElement for $t {
            const DTYPE: Dtype = $d;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}
npy_element!(u16, Dtype::U16);
npy_element!(u32, Dtype::U32);
npy_element!(i32, Dtype::I32);
npy_element!(i64, Dtype::I64);
npy_element!(f32, Dtype::F32);

/// Streams elements to a `.npy` whose length is known only at the end: they go
/// to an [`AtomicFile`] after room for the header, which [`NpyWriter::finish`]
/// writes before committing the file. A writer dropped unfinished (an error midway)
/// leaves nothing behind.
pub struct NpyWriter {
    file: AtomicFile,
    dtype: Dtype,
    count: usize,
    shape: Option<Vec<usize>>,
    scratch: Vec<u8>,
}

impl NpyWriter {
    pub fn create(path: &Path, dtype: Dtype) -> Result<Self> {
        let mut file = AtomicFile::create(path)?;
        file.write_all(&[0u8; WRITER_HEADER_LEN])
            .map_err(|e| Error::io(path, e))?;
        Ok(NpyWriter {
            file,
            dtype,
            count: 0,
            shape: None,
            scratch: Vec::new(),
        })
    }

    /// Sets a multi-dimensional shape (default: 1-D of the written count).
    pub fn set_shape(&mut self, shape: Vec<usize>) {
        self.shape = Some(shape);
    }

    /// Appends elements; `T`'s dtype must be the writer's.
    pub fn write_all<T: NpyElement>(&mut self, values: &[T]) -> Result<()> {
        assert_eq!(
            T::DTYPE,
            self.dtype,
            "element type differs from the file's dtype"
        );
        self.scratch.clear();
        for &v in values {
            v.write_le(&mut self.scratch);
        }
        self.file
            .write_all(&self.scratch)
            .map_err(|e| Error::io(self.file.target(), e))?;
        self.count += values.len();
        Ok(())
    }

    /// Appends token ids, narrowing them to the writer's dtype (`U16` or `U32`).
    pub fn write_ids(&mut self, ids: &[u32]) -> Result<()> {
        match self.dtype {
            Dtype::U32 => self.write_all(ids),
            Dtype::U16 => {
                if let Some(&bad) = ids.iter().find(|&&id| id > u16::MAX as u32) {
                    return Err(invalid!(
                        "{}: token id {bad} does not fit the file's uint16 dtype",
                        self.file.target().display()
                    ));
                }
                let narrow: Vec<u16> = ids.iter().map(|&id| id as u16).collect();
                self.write_all(&narrow)
            }
            other => Err(invalid!("token ids cannot be written as {other:?}")),
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Writes the header and commits the file.
    pub fn finish(mut self) -> Result<()> {
        let path = self.file.target().to_path_buf();
        let shape = self.shape.take().unwrap_or_else(|| vec![self.count]);
        if shape.iter().product::<usize>() != self.count {
            return Err(invalid!(
                "{}: shape {shape:?} does not hold the {} elements written",
                path.display(),
                self.count
            ));
        }
        let header = header_bytes(self.dtype, &shape, WRITER_HEADER_LEN).ok_or_else(|| {
            invalid!(
                "{}: shape {shape:?} has too many dimensions for the .npy writer",
                path.display()
            )
        })?;
        (self.file.seek(SeekFrom::Start(0)))
            .and_then(|_| self.file.write_all(&header))
            .map_err(|e| Error::io(&path, e))?;
        self.file.commit()
    }
}

/// Parses the header at the start of `bytes` (`path` names the file in errors).
pub fn parse_header(bytes: &[u8], path: &Path) -> Result<Header> {
    let bad = |what: &str| invalid!("{}: not a valid .npy file: {what}", path.display());
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("missing the \\x93NUMPY magic"));
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(bad(&format!("unsupported format version {v}"))),
    };
    let dict = bytes
        .get(start..start + len)
        .ok_or_else(|| bad("truncated header"))?;
    let dict = std::str::from_utf8(dict).map_err(|_| bad("header is not text"))?;
    let field = |key: &str| -> Option<&str> {
        let at = dict.find(&format!("'{key}'"))? + key.len() + 2;
        Some(dict[at..].trim_start().strip_prefix(':')?.trim_start())
    };
    let descr = field("descr")
        .and_then(|v| v.strip_prefix('\''))
        .and_then(|v| v.split('\'').next())
        .ok_or_else(|| bad("no 'descr'"))?;
    let descr = descr.replace('|', "<");
    let dtype = Dtype::from_descr(&descr).ok_or_else(|| {
        invalid!(
            "{}: unsupported dtype '{descr}' (expected uint16, uint32, int32, int64 or float32, little-endian)",
            path.display()
        )
    })?;
    if field("fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err(bad("Fortran-ordered arrays are not supported"));
    }
    let shape = field("shape")
        .and_then(|v| v.strip_prefix('('))
        .and_then(|v| v.split(')').next())
        .ok_or_else(|| bad("no 'shape'"))?;
    let shape = shape
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.parse::<usize>()
                .map_err(|_| bad(&format!("bad dimension '{d}'")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Header {
        dtype,
        shape,
        data_offset: start + len,
    })
}

/// A memory-mapped `.npy` array.
pub struct MappedNpy {
    pub header: Header,
    pub path: PathBuf,
    map: memmap2::Mmap,
}

impl MappedNpy {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only; a file changed underneath gives wrong values, not UB in safe code that copies them out.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let header = parse_header(&map, path)?;
        let need = header
            .shape
            .iter()
            .try_fold(header.dtype.size(), |acc, &d| acc.checked_mul(d))
            .and_then(|bytes| bytes.checked_add(header.data_offset))
            .ok_or_else(|| {
                invalid!(
                    "{}: the header's shape {:?} is too large",
                    path.display(),
                    header.shape
                )
            })?;
        if map.len() < need {
            return Err(invalid!(
                "{}: truncated .npy: {} bytes, the header's shape {:?} needs {need}",
                path.display(),
                map.len(),
                header.shape
            ));
        }
        Ok(MappedNpy {
            header,
            path: path.to_path_buf(),
            map,
        })
    }

    pub fn len(&self) -> usize {
        self.header.len()
    }

    pub fn is_empty(&self) -> bool {
        self.header.is_empty()
    }

    /// The raw little-endian data bytes.
    pub fn data(&self) -> &[u8] {
        let start = self.header.data_offset;
        &self.map[start..start + self.len() * self.header.dtype.size()]
    }

    /// Element `i` of an integer array, as `i64` (float arrays are not token arrays).
    #[inline]
    pub fn int_at(&self, i: usize) -> i64 {
        let size = self.header.dtype.size();
        let b = &self.data()[i * size..(i + 1) * size];
        match self.header.dtype {
            Dtype::U16 => u16::from_le_bytes([b[0], b[1]]) as i64,
            Dtype::U32 => u32::from_le_bytes(b.try_into().unwrap()) as i64,
            Dtype::I32 => i32::from_le_bytes(b.try_into().unwrap()) as i64,
            Dtype::I64 => i64::from_le_bytes(b.try_into().unwrap()),
            Dtype::F32 => f32::from_le_bytes(b.try_into().unwrap()) as i64,
        }
    }

    /// Element `i` of a `float32` array.
    #[inline]
    pub fn f32_at(&self, i: usize) -> f32 {
        let b = &self.data()[i * 4..(i + 1) * 4];
        f32::from_le_bytes(b.try_into().unwrap())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        write(&p, &[2, 3], &[1u16, 2, 3, 4, 5, 65535]).unwrap();
        let m = MappedNpy::open(&p).unwrap();
        assert_eq!(m.header.shape, vec![2, 3]);
        assert_eq!(m.header.dtype, Dtype::U16);
        assert_eq!(
            (0..6).map(|i| m.int_at(i)).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5, 65535]
        );
        write(&p, &[3], &[-1i64, 0, 1 << 40]).unwrap();
        let m = MappedNpy::open(&p).unwrap();
        assert_eq!(
            (0..3).map(|i| m.int_at(i)).collect::<Vec<_>>(),
            vec![-1, 0, 1 << 40]
        );
        write(&p, &[2], &[1.5f32, -2.0]).unwrap();
        let m = MappedNpy::open(&p).unwrap();
        assert_eq!((m.f32_at(0), m.f32_at(1)), (1.5, -2.0));
        assert_eq!(m.header.data_offset % 64, 0);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn header_matches_numpy_layout() {
        let h = header_bytes(Dtype::U16, &[7], 128).unwrap();
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(text.starts_with("{'descr': '<u2', 'fortran_order': False, 'shape': (7,), }"));
        assert!(text.ends_with('\n'));
        let parsed = parse_header(&h, Path::new("x.npy")).unwrap();
        assert_eq!(parsed.shape, vec![7]);
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.npy");
        std::fs::write(&p, b"hello").unwrap();
        let err = MappedNpy::open(&p).err().unwrap().to_string();
        assert!(err.contains("bad.npy") && err.contains("magic"), "{err}");
        let mut h = header_bytes(Dtype::U32, &[100], 128).unwrap();
        h.extend_from_slice(&[0; 8]);
        std::fs::write(&p, &h).unwrap();
        let err = MappedNpy::open(&p).err().unwrap().to_string();
        assert!(err.contains("truncated"), "{err}");
        let h = header_bytes(Dtype::U16, &[1], 128).unwrap();
        let at = h.windows(3).position(|w| w == b"<u2").unwrap();
        let mut h = h;
        h[at..at + 3].copy_from_slice(b"<f8");
        std::fs::write(&p, &h).unwrap();
        let err = MappedNpy::open(&p).err().unwrap().to_string();
        assert!(err.contains("unsupported dtype '<f8'"), "{err}");
        assert!(NpyWriter::create(&dir.path().join("no/such/dir.npy"), Dtype::U16).is_err());
        let mut w = NpyWriter::create(&dir.path().join("half.npy"), Dtype::U16).unwrap();
        w.write_ids(&[1, 2]).unwrap();
        assert!(w.write_ids(&[70_000]).is_err());
        drop(w);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "only bad.npy: {names:?}");
    }
}
