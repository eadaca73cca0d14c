//! Run-time compilation of the kernel families with NVRTC: where the CUDA headers
//! are, the options, and the one call that turns a family into PTX.

use crate::kernels::Precision;
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use tinylm_bpe::atomic::write_bytes;

/// The header prepended to every family: `floatX`, conversions, reductions.
pub const COMMON: &str = include_str!("common.cuh");

/// Every kernel family: its name (the file stem) and its CUDA C source.
pub const FAMILIES: &[(&str, &str)] = &[
    ("adamw", include_str!("adamw.cu")),
    ("attention", include_str!("attention.cu")),
    ("convert", include_str!("convert.cu")),
    ("cross_entropy", include_str!("cross_entropy.cu")),
    ("embedding", include_str!("embedding.cu")),
    ("global_norm", include_str!("global_norm.cu")),
    ("rmsnorm", include_str!("rmsnorm.cu")),
    ("rope", include_str!("rope.cu")),
    ("swiglu", include_str!("swiglu.cu")),
];

/// The NVRTC library cudarc loads (CUDA 13).
pub const NVRTC_LIBRARY: &str = "libnvrtc.so.13";

/// Where `cuda_bf16.h` may be, in the order searched: `$TINYLM_CUDA_INCLUDE`,
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, then the
/// `nvidia/cu13/include` of the active Python environment (`$VIRTUAL_ENV`, where
/// the `nvidia-cuda-runtime` wheel puts the headers).
pub fn include_dir_candidates() -> Vec<PathBuf> {
    let env = |name: &str| std::env::var_os(name).map(PathBuf::from);
    let mut dirs = Vec::new();
    dirs.extend(env("TINYLM_CUDA_INCLUDE"));
    dirs.extend(env("CUDA_HOME").map(|d| d.join("include")));
    dirs.extend(env("CUDA_PATH").map(|d| d.join("include")));
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    if let Some(venv) = env("VIRTUAL_ENV") {
        let lib = venv.join("lib");
        let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        pythons.sort();
        dirs.extend(
            pythons
                .into_iter()
                .map(|p| p.join("site-packages/nvidia/cu13/include")),
        );
    }
    dirs
}

/// The first candidate directory holding `cuda_bf16.h`, or an error listing them all.
pub fn cuda_include_dir() -> Result<PathBuf> {
    let candidates = include_dir_candidates();
    candidates
        .iter()
        .find(|d| d.join("cuda_bf16.h").is_file())
        .cloned()
        .ok_or_else(|| {
            let tried: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
            Error::Device(format!(
                "cuda_bf16.h not found (tried {}): set TINYLM_CUDA_INCLUDE to the CUDA \
                 include directory, or pip install \"nvidia-cuda-runtime==13.0.*\" into the \
                 active virtual environment",
                tried.join(", ")
            ))
        })
}

/// Whether cudarc can `dlopen` NVRTC.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to load the library (no symbol is called).
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The error for a missing library: its file name and the `LD_LIBRARY_PATH` hint.
pub fn missing_library(file: &str, what: &str) -> Error {
    Error::Device(format!(
        "{file} ({what}) could not be loaded: install it and put its directory on \
         LD_LIBRARY_PATH (the CUDA 13 libraries are in /usr/local/cuda/lib64, or in the \
         nvidia/cu13/lib of the pip wheels nvidia-cuda-nvrtc and nvidia-cublas)"
    ))
}

/// The full source NVRTC compiles for one family: the common header, then the family.
pub fn family_source(family: &str, source: &str) -> String {
    format!(
        "#line 1 \"common.cuh\"\n{}\n#line 1 \"{family}.cu\"\n{source}",
        COMMON
    )
}

/// The NVRTC options for `arch` (`compute_80`, `sm_90`, …) and `precision`; bf16
/// needs the directory of `cuda_bf16.h` (see [`cuda_include_dir`]).
pub fn compile_options(arch: &str, precision: Precision, include: Option<&Path>) -> Vec<String> {
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
    ];
    options.extend(include.map(|dir| format!("--include-path={}", dir.display())));
    if precision == Precision::Bf16 {
        options.push("-DTINYLM_BF16".to_string());
    }
    options
}

/// Compiles kernel family `family` (its source from [`FAMILIES`]) to PTX for
/// `arch` in `precision`; a compile error carries NVRTC's log.
pub fn compile(family: &str, source: &str, arch: &str, precision: Precision) -> Result<String> {
    if !nvrtc_available() {
        return Err(missing_library(
            NVRTC_LIBRARY,
            "NVRTC, the CUDA run-time compiler",
        ));
    }
    let include = match precision {
        Precision::Bf16 => Some(cuda_include_dir()?),
        Precision::Fp32 | Precision::Auto | Precision::Q8_0 => None,
    };
    let options = cudarc::nvrtc::CompileOptions {
        options: compile_options(arch, precision, include.as_deref()),
        name: Some(format!("{family}.cu")),
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(family_source(family, source), options) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(Error::Device(format!(
            "NVRTC could not compile {family}.cu for {arch} ({}):\n{}",
            precision,
            log.to_string_lossy()
        ))),
        Err(e) => Err(Error::Device(format!(
            "NVRTC failed on {family}.cu for {arch} ({}): {e:?}",
            precision
        ))),
    }
}

/// The names of the `extern "C" __global__` kernels of a family's source
/// (`extern "C" __global__ void [__launch_bounds__(…)] NAME(`).
pub fn kernel_names(source: &str) -> Vec<&str> {
    source
        .split("extern \"C\" __global__ void ")
        .skip(1)
        .map(|rest| match rest.strip_prefix("__launch_bounds__(") {
            Some(bounded) => bounded.split_once(')').map_or("", |(_, name)| name),
            None => rest,
        })
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

/// The on-disk PTX cache: `$TINYLM_CUDA_CACHE`, else `$XDG_CACHE_HOME/tinylm/ptx`,
/// else `~/.cache/tinylm/ptx`.
pub fn cache_dir() -> Option<PathBuf> {
    let env = |name: &str| std::env::var_os(name).map(PathBuf::from);
    env("TINYLM_CUDA_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("tinylm/ptx")))
        .or_else(|| env("HOME").map(|d| d.join(".cache/tinylm/ptx")))
}

/// [`compile`] through the PTX cache in directory `cache` (`None`: no cache; the
/// backend passes [`cache_dir`]): the PTX of a family is stored under a key of its
/// full source, the architecture, the precision and the NVRTC version, so an edit
/// or another toolkit recompiles. The cache is best-effort: when it cannot be read
/// or written, the source is compiled. Each writer (thread or process) writes a
/// file of its own and renames it into place ([`write_bytes`]), so a reader sees a
/// whole file or none.
pub fn compile_cached(
    family: &str,
    source: &str,
    arch: &str,
    precision: Precision,
    cache: Option<&Path>,
) -> Result<String> {
    use std::hash::{Hash, Hasher};
    if !nvrtc_available() {
        return Err(missing_library(
            NVRTC_LIBRARY,
            "NVRTC, the CUDA run-time compiler",
        ));
    }
    let mut version = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); writes two ints.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut version.0, &mut version.1) };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        family_source(family, source),
        arch,
        precision.to_string(),
        version,
    )
        .hash(&mut hasher);
    let file = format!("{family}-{arch}-{}-{:016x}.ptx", precision, hasher.finish());
    let path = cache.map(|d| d.join(file));
    if let Some(ptx) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(ptx);
    }
    let ptx = compile(family, source, arch, precision)?;
    if let Some(path) = path {
        if path
            .parent()
            .is_none_or(|dir| std::fs::create_dir_all(dir).is_ok())
        {
            // Best-effort: a cache that cannot be written is compiled into next time.
            let _ = write_bytes(&path, ptx.as_bytes());
        }
    }
    Ok(ptx)
}
