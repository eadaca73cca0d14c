//! safetensors files, written and read: the writer every tinylm file of weights
//! goes through ([`write_safetensors`]: whole or not at all, tensors fetched one at a
//! time), and the reader of any float dtype ([`SafetensorsFile`]: mapped, a layout's
//! buffer assembled piece by piece, checked against the layout by name and shape).

use crate::config::ModelConfig;
use crate::files::write_file;
use crate::kernels::{Backend, Buffer, Cpu, HostBuf, ParamRead, ParamsInFile, Stored};
use crate::params::{layout_for_file, ParamLayout, Tensors};
use crate::{Error, Result};
use half::bf16;
use rayon::prelude::*;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{IoSlice, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Writes named `f32` tensors (row-major, `(name, shape, values)`) and string
/// metadata to a safetensors file that `safetensors.torch.load_file` reads, whole
/// or not at all ([`write_file`]).
pub fn save_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, &[f32])],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let tensors: Vec<(String, Vec<usize>, TensorData)> = tensors
        .iter()
        .map(|(name, shape, values)| (name.clone(), shape.clone(), TensorData::Host(values)))
        .collect();
    write_safetensors(path, &tensors, metadata, &mut [])
}

/// Where a tensor's values are when it is written: in host memory, written from
/// where they lie; or fetched (from a GPU) into host memory just before, one tensor
/// at a time, so that writing a model never holds a second copy of it.
pub enum TensorData<'a> {
    Host(&'a [f32]),
    /// Values rounded to bf16, in host memory: written as `BF16` (a weights file
    /// in bf16, [`crate::checkpoint::save_weights`]).
    HostBf16(&'a [bf16]),
    Fetch(Fetch<'a>),
}

/// Fills a buffer of a tensor's length with its values (a download from a GPU).
pub type Fetch<'a> = Box<dyn Fn(&mut [f32]) -> Result<()> + 'a>;

/// Where [`write_safetensors`] starts the data: a cache line. The weights a model
/// maps from the file are then as aligned as its own buffers, so that a vector
/// load of a weight row whose length is a multiple of 64 bytes never straddles two
/// cache lines. With the data 24 bytes past a line, as padding to 8 bytes left it,
/// the 134M model decoded in `f32` on one thread of Zen 5 at 76–85 tok/s against
/// 84–91 aligned; on two, as fast while the memory is what limits them.
pub const DATA_ALIGN: usize = 64;

/// [`save_safetensors`] for tensors wherever they are ([`TensorData`]). Host
/// tensors are written from where they lie; fetched ones are fetched into `staging`
/// (host memory at least as long as the longest of them), each written before the
/// next is fetched. The data is in the order given (the safetensors crate would sort
/// by name): a model's tensors in [`ParamLayout`] order are then the parameter
/// buffer as it is, which a CPU model in `f32` maps instead of reading
/// ([`FileBuffer::map`]). The header JSON (the crate's `Metadata`), its length
/// first as a little-endian u64 as the crate writes it, is padded with spaces so
/// that the data starts at a multiple of [`DATA_ALIGN`] bytes. Written whole or not
/// at all ([`write_file`]): a fetch or write that fails is the error, and no file
/// is left.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, TensorData)],
    metadata: &BTreeMap<String, String>,
    staging: &mut [f32],
) -> Result<()> {
    let mut end = 0;
    let infos = tensors
        .iter()
        .map(|(name, shape, data)| {
            let (dtype, size) = match data {
                TensorData::HostBf16(_) => (Dtype::BF16, 2),
                TensorData::Host(_) | TensorData::Fetch(_) => (Dtype::F32, 4),
            };
            let start = end;
            end += size * shape.iter().product::<usize>();
            let info = TensorInfo {
                dtype,
                shape: shape.clone(),
                data_offsets: (start, end),
            };
            (name.clone(), info)
        })
        .collect();
    let metadata = (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    let invalid = |e: &dyn std::fmt::Display| {
        Error::Invalid(format!("{}: cannot write safetensors: {e}", path.display()))
    };
    let header = Metadata::new(metadata, infos).map_err(|e| invalid(&e))?;
    let mut header = serde_json::to_vec(&header).map_err(|e| invalid(&e))?;
    header.resize((8 + header.len()).next_multiple_of(DATA_ALIGN) - 8, b' ');

    let (io, room) = (|e| Error::io(path, e), staging.len());
    write_file(path, |out| {
        out.write_all(&(header.len() as u64).to_le_bytes())
            .and_then(|()| out.write_all(&header))
            .map_err(io)?;
        // Host tensors one after the other are written in one call: the kernel
        // then caches the file in the largest pages it can (2 MiB, where it has
        // them), which a mapping of the parameters is backed by ([`HostBuf::map`]).
        let mut host: Vec<HostValues> = Vec::new();
        for (name, shape, data) in tensors {
            let len = shape.iter().product::<usize>();
            let check = |values: usize| match values == len {
                true => Ok(()),
                false => Err(invalid(&format!(
                    "tensor '{name}' has {values} values, its shape {shape:?} holds {len}"
                ))),
            };
            match data {
                TensorData::Host(values) => {
                    check(values.len())?;
                    host.push(HostValues::F32(values));
                }
                TensorData::HostBf16(values) => {
                    check(values.len())?;
                    host.push(HostValues::Bf16(values));
                }
                TensorData::Fetch(fetch) => {
                    write_values(out, &std::mem::take(&mut host)).map_err(io)?;
                    let values = staging.get_mut(..len).ok_or_else(|| {
                        invalid(&format!(
                            "tensor '{name}' of {len} values does not fit the staging memory of {room}"
                        ))
                    })?;
                    fetch(values)?;
                    check(values.len())?;
                    write_values(out, &[HostValues::F32(values)]).map_err(io)?;
                }
            }
        }
        write_values(out, &host).map_err(io)
    })
}

/// Host values to write, as the file stores them.
enum HostValues<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

/// Writes the values of `parts`, one after the other, little-endian: from where
/// they lie on a little-endian host (in as few vectored writes as the system
/// takes), converted a chunk at a time on a big-endian one.
fn write_values(out: &mut impl Write, parts: &[HostValues]) -> std::io::Result<()> {
    // The values' bytes as they lie, and the size of one.
    fn bytes<'a>(part: &HostValues<'a>) -> (&'a [u8], usize) {
        match *part {
            HostValues::F32(values) => (bytemuck::cast_slice(values), 4),
            HostValues::Bf16(values) => (bytemuck::cast_slice(values), 2),
        }
    }
    if cfg!(target_endian = "little") {
        let mut slices: Vec<IoSlice> = (parts.iter())
            .map(|part| bytes(part).0)
            .filter(|b| !b.is_empty())
            .map(IoSlice::new)
            .collect();
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            match out.write_vectored(slices) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        return Ok(());
    }
    parts.iter().map(bytes).try_for_each(|(bytes, size)| {
        bytes.chunks(CHUNK * size).try_for_each(|chunk| {
            let little: Vec<u8> = chunk
                .chunks(size)
                .flat_map(|x| x.iter().rev())
                .copied()
                .collect();
            out.write_all(&little)
        })
    })
}

/// Values converted at a time where a file's bytes are not `f32` as they lie.
const CHUNK: usize = 1 << 16;

/// `f32` values read by one task (8 MiB) where a file's bytes are.
const READ_BLOCK: usize = 1 << 21;

/// The string metadata of a safetensors file, without reading its tensors.
pub fn load_safetensors_metadata(path: &Path) -> Result<BTreeMap<String, String>> {
    Ok(SafetensorsFile::open(path)?.metadata)
}

/// Reads every tensor of a safetensors file as `f32` (`F32`; `F64`, `F16` and
/// `BF16` are converted) with the file's string metadata.
pub fn load_safetensors(path: &Path) -> Result<(Tensors, BTreeMap<String, String>)> {
    let file = SafetensorsFile::open(path)?;
    let mut tensors = Tensors::new();
    for (name, tensor) in &file.tensors {
        let mut values = vec![0.0; tensor.shape.iter().product()];
        file.read(name, 0..values.len(), &mut values)?;
        tensors.insert(name.clone(), (tensor.shape.clone(), values));
    }
    Ok((tensors, file.metadata))
}

/// A safetensors file opened to be read tensor by tensor: its header read and
/// checked (every tensor a float: `F32`, `F64`, `F16` or `BF16`), its values read
/// where they are wanted with positioned reads, so that no more of the file is
/// mapped into the process than a backend maps as its parameters
/// ([`FileBuffer::map`]): a file's mapped pages count as its resident memory.
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    tensors: BTreeMap<String, FileTensor>,
    metadata: BTreeMap<String, String>,
}

/// Where one tensor of a [`SafetensorsFile`] lies and how its values read as `f32`.
struct FileTensor {
    shape: Vec<usize>,
    dtype: Dtype,
    /// The file offset of its first value.
    start: u64,
    /// Bytes per value.
    size: usize,
    decode: Decode,
}

/// Little-endian values of a float dtype (`bytes`) to `f32` (`out`, as many).
type Decode = fn(&[u8], &mut [f32]);

impl SafetensorsFile {
    /// Opens `path` and checks its header (maps the file for that alone: only the
    /// header's pages are touched).
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: read-only map, dropped before this returns.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let (n, header) = SafeTensors::read_metadata(&map).map_err(|e| {
            Error::Invalid(format!(
                "{}: not a valid safetensors file: {e}",
                path.display()
            ))
        })?;
        drop(map);
        let data_start = 8 + n as u64;
        let mut tensors = BTreeMap::new();
        for (name, info) in header.tensors() {
            let (size, decode) = float_codec(info.dtype).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: tensor '{name}' has dtype {:?}; expected F32, F64, F16 or BF16",
                    path.display(),
                    info.dtype
                ))
            })?;
            let tensor = FileTensor {
                shape: info.shape.clone(),
                dtype: info.dtype,
                start: data_start + info.data_offsets.0 as u64,
                size,
                decode,
            };
            tensors.insert(name, tensor);
        }
        let metadata = header
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            file,
            tensors,
            metadata,
        })
    }

    /// The layout of `config` for this file ([`layout_for_file`]).
    pub fn layout(&self, config: &ModelConfig) -> Result<ParamLayout> {
        layout_for_file(config, self.tensors.len(), &self.path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's string metadata.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The flat buffer in `layout` that the tensors `select` names (it maps a
    /// file's tensor name to a layout name, e.g. by stripping a prefix, or to
    /// `None`) hold. Every tensor of the layout must be there with its exact shape
    /// and no other selected tensor may be: the errors of
    /// [`ParamLayout::load_buffer`], naming this file.
    pub fn buffer<'a>(
        &'a self,
        layout: &'a ParamLayout,
        select: impl Fn(&str) -> Option<&str>,
    ) -> Result<FileBuffer<'a>> {
        // Layout name -> file name.
        let selected: BTreeMap<&str, &str> = self
            .tensors
            .keys()
            .filter_map(|name| select(name).map(|base| (base, name.as_str())))
            .collect();
        let shapes = selected
            .iter()
            .map(|(&base, &name)| (base, self.tensors[name].shape.as_slice()))
            .collect();
        layout.check(&shapes, &self.path)?;
        Ok(FileBuffer {
            file: self,
            layout,
            names: (layout.specs.iter())
                .map(|spec| selected[spec.name.as_str()])
                .collect(),
        })
    }

    /// Values `elems` of tensor `name` (one of the file's) into `out` (as many).
    fn read(&self, name: &str, elems: Range<usize>, out: &mut [f32]) -> Result<()> {
        let tensor = &self.tensors[name];
        assert_eq!(
            elems.len(),
            out.len(),
            "a read's range and its output differ"
        );
        let at = tensor.start + (elems.start * tensor.size) as u64;
        let failed = |e: std::io::Error| {
            let e = std::io::Error::new(e.kind(), format!("reading tensor '{name}': {e}"));
            Error::io(&self.path, e)
        };
        if tensor.dtype == Dtype::F32 && cfg!(target_endian = "little") {
            // In parallel blocks: most of a read from the page cache is the kernel
            // giving the destination its fresh (zeroed) pages, which each thread
            // does for its own block.
            return out
                .par_chunks_mut(READ_BLOCK)
                .enumerate()
                .try_for_each(|(i, out)| {
                    // SAFETY: any 4 bytes are an f32; the bytes are `out`'s own.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 4)
                    };
                    let at = at + (i * READ_BLOCK * 4) as u64;
                    self.file.read_exact_at(bytes, at).map_err(failed)
                });
        }
        let mut bytes = vec![0u8; CHUNK.min(out.len()) * tensor.size];
        for (i, out) in out.chunks_mut(CHUNK).enumerate() {
            let bytes = &mut bytes[..out.len() * tensor.size];
            let at = at + (i * CHUNK * tensor.size) as u64;
            self.file.read_exact_at(bytes, at).map_err(failed)?;
            (tensor.decode)(bytes, out);
        }
        Ok(())
    }
}

/// A flat buffer in the parameter layout as a [`SafetensorsFile`] holds it,
/// checked against the layout ([`SafetensorsFile::buffer`]).
pub struct FileBuffer<'a> {
    file: &'a SafetensorsFile,
    layout: &'a ParamLayout,
    /// The file's name of each tensor of the layout, in layout order.
    names: Vec<&'a str>,
}

/// The part of a flat buffer that one tensor of a file holds.
struct Piece<'a> {
    /// The tensor's name in the file.
    tensor: &'a str,
    /// Which of its values (row-major).
    elems: Range<usize>,
    /// Where those are in the flat buffer.
    at: Range<usize>,
    /// How a forward pass reads the tensor ([`ParamLayout::read`]).
    read: ParamRead,
}

impl<'a> FileBuffer<'a> {
    /// The pieces of values `range` of the buffer, in order, one per tensor.
    fn pieces(&self, range: Range<usize>) -> impl Iterator<Item = Piece<'a>> + '_ {
        (self.layout.specs.iter().zip(&self.names)).filter_map(move |(spec, &tensor)| {
            let at = spec.offset.max(range.start)..(spec.offset + spec.len()).min(range.end);
            (at.start < at.end).then(|| Piece {
                tensor,
                elems: at.start - spec.offset..at.end - spec.offset,
                at,
                read: self.layout.read(spec),
            })
        })
    }

    /// The whole buffer mapped where the file holds it, by a backend that
    /// multiplies the values as they lie ([`Backend::map_params`]), when the file
    /// holds it as one run: every tensor `F32` (or every one `BF16`), in layout
    /// order, one after the other (as tinylm writes them, [`write_safetensors`]).
    /// `None` otherwise: the buffer is then read ([`FileBuffer::read_into`]).
    pub fn map<B: Backend<f32>>(&self, backend: &B) -> Option<B::Buf> {
        let first = &self.file.tensors[*self.names.first()?];
        let (stored, size) = match first.dtype {
            Dtype::F32 => (Stored::F32, 4),
            Dtype::BF16 => (Stored::Bf16, 2),
            _ => return None,
        };
        let one_run = (self.layout.specs.iter().zip(&self.names)).all(|(spec, name)| {
            let tensor = &self.file.tensors[*name];
            tensor.dtype == first.dtype && tensor.start == first.start + size * spec.offset as u64
        });
        let reads: Vec<_> = (self.layout.specs.iter())
            .map(|spec| (spec.range(), self.layout.read(spec)))
            .collect();
        let params = ParamsInFile {
            file: &self.file.file,
            offset: first.start,
            len: self.layout.total,
            stored,
            reads: &reads,
        };
        one_run.then(|| backend.map_params(&params))?
    }

    /// Values `range` of the buffer into `dst`, a backend's buffer of
    /// `range.len()` values, one tensor at a time: on the CPU straight into the
    /// buffer's memory; on a GPU through `staging` (allocated at first use for the
    /// longest tensor, then reused) and an upload.
    pub fn read_into<B: Backend<f32>>(
        &self,
        backend: &B,
        range: Range<usize>,
        dst: &mut B::Buf,
        staging: &mut Option<B::Staging>,
    ) -> Result<()> {
        for piece in self.pieces(range.clone()) {
            let at = piece.at.start - range.start..piece.at.end - range.start;
            let read = |offset: usize, out: &mut [f32]| {
                let start = piece.elems.start + offset;
                self.file.read(piece.tensor, start..start + out.len(), out)
            };
            if let Some(written) = backend.write_host(dst.at_mut(at.clone()), piece.read, &read) {
                written?;
                continue;
            }
            let staging = match staging {
                Some(staging) => staging,
                None => {
                    let longest = self.pieces(range.clone()).map(|p| p.at.len()).max();
                    staging.insert(backend.alloc_staging(longest.unwrap_or(0))?)
                }
            };
            let values = &mut backend.staged(staging)?[..at.len()];
            read(0, values)?;
            backend.upload(dst.at_mut(at), values)?;
        }
        Ok(())
    }

    /// Values `range` of the buffer in host memory.
    pub fn to_vec(&self, range: Range<usize>) -> Result<Vec<f32>> {
        let mut out = HostBuf::from(vec![0.0; range.len()]);
        self.read_into(&Cpu, range, &mut out, &mut None)?;
        Ok(out.into_vec())
    }
}

/// Bytes per value of a float dtype and the conversion of its little-endian
/// values to `f32`; `None` for a dtype that is not a float.
fn float_codec(dtype: Dtype) -> Option<(usize, Decode)> {
    fn convert<const N: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
        for (x, c) in out.iter_mut().zip(bytes.chunks_exact(N)) {
            *x = f(c.try_into().expect("N bytes"));
        }
    }
    Some(match dtype {
        Dtype::F32 => (4, |b, out| convert(b, out, f32::from_le_bytes)),
        Dtype::F64 => (8, |b, out| {
            convert(b, out, |c| f64::from_le_bytes(c) as f32)
        }),
        Dtype::F16 => (2, |b, out| {
            convert(b, out, |c| half::f16::from_le_bytes(c).to_f32())
        }),
        Dtype::BF16 => (2, |b, out| {
            convert(b, out, |c| half::bf16::from_le_bytes(c).to_f32())
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::tests::{mismatched, small};

    #[test]
    fn safetensors_round_trip_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let layout = ParamLayout::new(&small());
        let params = layout.init(3);
        let meta = BTreeMap::from([("step".to_string(), "7".to_string())]);
        save_safetensors(&path, &layout.tensors(&params), &meta).unwrap();
        let (tensors, read_meta) = load_safetensors(&path).unwrap();
        assert_eq!(read_meta, meta);
        assert_eq!(tensors.len(), layout.specs.len());
        let (shape, values) = &tensors["layers.1.ffn.w2.weight"];
        assert_eq!(shape, &vec![8, 12]);
        assert_eq!(values[..], params[layout.layers[1].w2.clone()]);
        assert_eq!(layout.load_buffer(&tensors, &path).unwrap(), params);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temp file left"
        );
    }

    #[test]
    fn other_float_dtypes_are_converted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixed.safetensors");
        let want = [1.5f32, -0.25, 3.0];
        let f64s: Vec<u8> = want
            .iter()
            .flat_map(|&x| (x as f64).to_le_bytes())
            .collect();
        let f16s: Vec<u8> = want
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        let bf16s: Vec<u8> = want
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let i32s: Vec<u8> = [1i32, 2, 3].iter().flat_map(|x| x.to_le_bytes()).collect();
        let view = |dtype, bytes| safetensors::tensor::TensorView::new(dtype, vec![3], bytes);
        let floats = [
            ("a", view(Dtype::F64, &f64s).unwrap()),
            ("b", view(Dtype::F16, &f16s).unwrap()),
            ("c", view(Dtype::BF16, &bf16s).unwrap()),
        ];
        safetensors::serialize_to_file(floats, None, &path).unwrap();
        let (tensors, meta) = load_safetensors(&path).unwrap();
        assert!(meta.is_empty());
        for name in ["a", "b", "c"] {
            assert_eq!(tensors[name], (vec![3], want.to_vec()), "{name}");
        }
        let ints = [("ids", view(Dtype::I32, &i32s).unwrap())];
        safetensors::serialize_to_file(ints, None, &path).unwrap();
        let err = load_safetensors(&path).unwrap_err().to_string();
        assert!(err.contains("'ids' has dtype I32"), "{err}");
        std::fs::write(&path, b"garbage").unwrap();
        let err = load_safetensors(&path).unwrap_err().to_string();
        assert!(
            err.contains("mixed.safetensors: not a valid safetensors"),
            "{err}"
        );
    }

    #[test]
    fn our_writer_writes_what_the_safetensors_crate_reads_in_the_order_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let values: Vec<Vec<f32>> = (0..4)
            .map(|t| {
                (0..6 * (t + 1))
                    .map(|i| (t * 100 + i) as f32 * 0.5)
                    .collect()
            })
            .collect();
        let shapes = [vec![6], vec![3, 4], vec![2, 3, 3], vec![24]];
        // Not in name order; on the host but for one fetched between them.
        let names = ["b.weight", "a.weight", "layers.10.x", "layers.2.x"];
        let values = &values;
        let data = |t: usize| match t {
            0 | 2 | 3 => TensorData::Host(&values[t]),
            _ => TensorData::Fetch(Box::new(move |out: &mut [f32]| {
                out.copy_from_slice(&values[t]);
                Ok(())
            })),
        };
        let tensors: Vec<_> = (0..4)
            .map(|t| (names[t].to_string(), shapes[t].clone(), data(t)))
            .collect();
        let meta = BTreeMap::from([
            ("format".to_string(), "\"tinylm\"".to_string()),
            ("step".to_string(), "7".to_string()),
        ]);
        for meta in [meta, BTreeMap::new()] {
            write_safetensors(&path, &tensors, &meta, &mut [0.0; 24]).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let ours = SafeTensors::deserialize(&bytes).unwrap();
            let (n, header) = SafeTensors::read_metadata(&bytes).unwrap();
            assert_eq!((8 + n) % DATA_ALIGN, 0, "the data starts on a cache line");
            let want_meta = (!meta.is_empty()).then(|| meta.clone().into_iter().collect());
            assert_eq!(header.metadata(), &want_meta);
            let mut data = Vec::new();
            for t in 0..4 {
                let tensor = ours.tensor(names[t]).unwrap();
                let le: Vec<u8> = values[t].iter().flat_map(|x| x.to_le_bytes()).collect();
                assert_eq!(tensor.dtype(), Dtype::F32);
                assert_eq!((tensor.shape(), tensor.data()), (&shapes[t][..], &le[..]));
                data.extend(le);
            }
            assert_eq!(bytes[8 + n..], data, "the data in the order given");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_layouts_buffer_reads_from_any_float_dtype_piece_by_piece() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixed.safetensors");
        let layout = ParamLayout::new(&small());
        // Multiples of 1/8 below 16: exact in every float dtype.
        let params: Vec<f32> = (0..layout.total).map(|i| (i % 128) as f32 / 8.0).collect();
        let dtypes = [Dtype::F32, Dtype::F64, Dtype::F16, Dtype::BF16];
        let encoded: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = (layout.specs.iter())
            .enumerate()
            .map(|(i, spec)| {
                let values = &params[spec.range()];
                let dtype = dtypes[i % 4];
                let bytes = match dtype {
                    Dtype::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    Dtype::F64 => values
                        .iter()
                        .flat_map(|&x| (x as f64).to_le_bytes())
                        .collect(),
                    Dtype::F16 => (values.iter())
                        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                        .collect(),
                    _ => (values.iter())
                        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                        .collect(),
                };
                (
                    format!("model.{}", spec.name),
                    dtype,
                    spec.shape.clone(),
                    bytes,
                )
            })
            .collect();
        let views = encoded.iter().map(|(name, dtype, shape, bytes)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes);
            (name.as_str(), view.unwrap())
        });
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        let buffer = file
            .buffer(&layout, |name| name.strip_prefix("model."))
            .unwrap();
        assert_eq!(buffer.to_vec(0..layout.total).unwrap(), params);
        // A range that starts and ends inside tensors (a ZeRO-1 shard's).
        let shard = 5..layout.total - 7;
        assert_eq!(buffer.to_vec(shard.clone()).unwrap(), params[shard]);
    }

    #[test]
    fn a_files_buffer_is_checked_with_load_buffers_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let (layout, tensors) = mismatched();
        let named: Vec<_> = (tensors.iter())
            .map(|(n, (s, v))| (n.clone(), s.clone(), v.as_slice()))
            .collect();
        save_safetensors(&path, &named, &BTreeMap::new()).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        let err = file
            .buffer(&layout, |name| Some(name))
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            err,
            layout.load_buffer(&tensors, &path).unwrap_err().to_string()
        );
        assert!(err.starts_with(&format!("{}: ", path.display())), "{err}");
        assert!(!err.contains('\n'), "{err}");
        // A file cut short is refused when opened, naming it.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let err = SafetensorsFile::open(&path).err().unwrap().to_string();
        assert!(
            err.starts_with(&format!("{}: not a valid safetensors file", path.display())),
            "{err}"
        );
    }
}
