//! Every run-time kernel choice is the one the CPU's features call for, and a test
//! fails where it is not: a detection that fell back to a slower kernel (a feature
//! misspelled, a kernel left out of the build, an emulator that hides an
//! instruction) cannot pass for the native kernel. The features are what the CPU
//! says of itself (`/proc/cpuinfo`, or `TINYLM_CPU_FEATURES` for a CPU emulated by
//! qemu-user: CI's Haswell, Cortex-A72 and `-cpu max`), apart from the program's
//! own detection. Each choice prints what ran.

// Each test file uses some of the shared helpers.
#[allow(dead_code)]
mod cpu;

use cpu::{cpu_has, expected_native_bf16};
use tinylm::device::{backend_kind, Device};
use tinylm::kernels::cpu::bf16::Bf16Kernel;
use tinylm::kernels::cpu::linear::matmul_isa;
use tinylm::kernels::cpu::q8;
use tinylm::kernels::Precision;

/// f32 products: gemm's widest FMA kernels (AVX-512 built with the `avx512`
/// feature, AVX2+FMA, NEON), the scalar ones on a CPU without FMA.
#[test]
fn f32_products_run_the_widest_kernels_the_cpu_has() {
    let want = if cfg!(target_arch = "aarch64") {
        "NEON (128-bit FMA)"
    } else if cfg!(feature = "avx512") && cpu_has("avx512f") {
        "AVX-512F (512-bit FMA)"
    } else if cpu_has("fma") {
        "AVX2+FMA (256-bit FMA)"
    } else {
        "scalar (no FMA)"
    };
    eprintln!("f32 products: {}", matmul_isa());
    assert_eq!(matmul_isa(), want);
}

/// bf16 products: the native kernel where the CPU has its instructions, and then
/// `--precision auto` is bf16 on the CPU; the portable kernel and fp32 elsewhere.
#[test]
fn bf16_products_run_the_native_kernel_where_the_cpu_has_one() {
    let want = expected_native_bf16();
    eprintln!("bf16 products: {}", Bf16Kernel::best().name());
    assert_eq!(Bf16Kernel::native(), want);
    assert_eq!(Bf16Kernel::best(), want.unwrap_or(Bf16Kernel::Portable));
    let auto = backend_kind(Device::Cpu, Precision::Auto)
        .unwrap()
        .precision();
    let want = match want {
        Some(_) => Precision::Bf16,
        None => Precision::Fp32,
    };
    assert_eq!(auto, want, "--precision auto on the CPU");
}

/// Q8_0 products: `vpdpbusd` where the CPU has AVX512_VNNI (with AVX512BW and F16C)
/// and the build the `avx512` feature, the portable loop elsewhere.
#[test]
fn q8_0_products_run_vnni_where_the_cpu_has_it() {
    let vnni = cfg!(all(target_arch = "x86_64", feature = "avx512"))
        && ["avx512_vnni", "avx512bw", "f16c"]
            .iter()
            .all(|f| cpu_has(f));
    eprintln!("q8_0 products: {}", q8::kernel_name());
    let want = match vnni {
        true => "AVX512_VNNI (vpdpbusd)",
        false => "portable (int8 values, i32 sums)",
    };
    assert_eq!(q8::kernel_name(), want);
}
