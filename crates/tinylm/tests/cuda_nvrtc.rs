//! Every CUDA kernel family compiles with NVRTC to PTX for sm_80 and sm_90 in both
//! precisions (no GPU needed: NVRTC and the CUDA headers only; `.ci/run` installs
//! them from PyPI).
#![cfg(feature = "cuda")]

use std::collections::BTreeSet;
use tinylm::kernels::cuda::{nvrtc, FAMILIES};
use tinylm::kernels::Precision;

const ARCHS: [&str; 2] = ["compute_80", "compute_90"];

#[test]
fn every_cu_file_is_a_registered_family() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/kernels/cuda");
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let registered: BTreeSet<String> = FAMILIES.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(on_disk, registered);
    for (name, source) in FAMILIES {
        let file = std::fs::read_to_string(format!("{dir}/{name}.cu")).unwrap();
        assert_eq!(&file, source, "{name}.cu differs from the embedded source");
    }
}

#[test]
fn every_family_compiles_for_sm80_and_sm90_in_both_precisions() {
    let mut failures = Vec::new();
    let mut compiled = 0;
    for (family, source) in FAMILIES {
        for arch in ARCHS {
            for precision in [Precision::Bf16, Precision::Fp32] {
                match nvrtc::compile(family, source, arch, precision) {
                    Ok(ptx) => {
                        // Every `extern "C" __global__` kernel is in the PTX.
                        for kernel in nvrtc::kernel_names(source) {
                            assert!(
                                ptx.contains(&format!(".entry {kernel}(")),
                                "{family}.cu {arch} {precision:?}: no entry {kernel} in the PTX"
                            );
                        }
                        compiled += 1;
                    }
                    Err(e) => failures.push(e.to_string()),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!(compiled, FAMILIES.len() * ARCHS.len() * 2);
    println!(
        "{compiled} compilations: {} families x {ARCHS:?} x bf16/fp32",
        FAMILIES.len()
    );
}

#[test]
fn a_syntax_error_reports_the_nvrtc_log() {
    let err = nvrtc::compile(
        "broken",
        "extern \"C\" __global__ void k(floatX* x) { x[0] = }",
        ARCHS[0],
        Precision::Fp32,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("broken.cu") && err.contains("error"), "{err}");
}

/// Opening a device is one clear error when something is missing (CI has no driver
/// and no GPU), and works where everything is there.
#[test]
fn opening_a_device_names_what_is_missing() {
    use tinylm::kernels::cuda::Cuda;
    let opened = Cuda::new(0, Precision::Bf16);
    if Cuda::is_available() {
        let cuda = opened.expect("a usable GPU opens");
        let err = Cuda::new(1000, Precision::Fp32).err().expect("no GPU 1000");
        assert!(
            err.to_string().contains("cuda:1000 does not exist"),
            "{err}"
        );
        println!("opened {}", cuda.describe());
    } else {
        let err = opened.err().expect("no usable GPU").to_string();
        let names_it = [
            "libcuda.so.1",
            "needs CUDA 13.0",
            "libcublasLt.so.13",
            "no CUDA device",
        ]
        .iter()
        .any(|missing| err.contains(missing));
        assert!(names_it && !err.contains('\n'), "{err}");
        println!("{err}");
    }
}

/// The PTX cache: one file per family, architecture and precision, read back
/// instead of compiling again.
#[test]
fn compiled_ptx_is_cached_per_family_architecture_and_precision() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Some(dir.path());
    let (family, source) = FAMILIES[0];
    let ptx = nvrtc::compile_cached(family, source, ARCHS[0], Precision::Fp32, cache).unwrap();
    let cached = files(dir.path());
    assert_eq!(cached.len(), 1);
    let name = cached[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with(&format!("{family}-{}-fp32-", ARCHS[0])),
        "{name}"
    );
    assert_eq!(std::fs::read_to_string(&cached[0]).unwrap(), ptx);
    // A second request reads the file.
    std::fs::write(&cached[0], "// from the cache").unwrap();
    let again = nvrtc::compile_cached(family, source, ARCHS[0], Precision::Fp32, cache).unwrap();
    assert_eq!(again, "// from the cache");
    // Another precision or architecture is another entry.
    nvrtc::compile_cached(family, source, ARCHS[0], Precision::Bf16, cache).unwrap();
    nvrtc::compile_cached(family, source, ARCHS[1], Precision::Fp32, cache).unwrap();
    assert_eq!(files(dir.path()).len(), 3);
}

/// Threads compiling one family into one cache each write a file of their own and
/// rename it into place: every thread gets the whole PTX, the cache holds one whole
/// file and no temporary is left behind.
#[test]
fn threads_compiling_one_family_publish_one_whole_cache_file() {
    let dir = tempfile::tempdir().unwrap();
    let (family, source) = FAMILIES[0];
    let want = nvrtc::compile(family, source, ARCHS[0], Precision::Fp32).unwrap();
    let compiled: Vec<String> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    nvrtc::compile_cached(
                        family,
                        source,
                        ARCHS[0],
                        Precision::Fp32,
                        Some(dir.path()),
                    )
                    .unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(compiled.iter().all(|ptx| *ptx == want));
    let cached = files(dir.path());
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert_eq!(std::fs::read_to_string(&cached[0]).unwrap(), want);
}

/// The files of `dir`, sorted.
fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    all.sort();
    all
}
