//! What the CPU running the tests says it has, apart from the program's own
//! detection, and the kernels that calls for.

use tinylm::kernels::cpu::bf16::Bf16Kernel;

/// Whether the CPU running the tests has `feature`, as Linux's `/proc/cpuinfo`
/// spells it (`avx512_bf16`, `avx512_vnni`, `fma` on x86-64; `bf16`, `asimd` on
/// Arm): what the CPU says of itself, apart from the program's own detection.
/// Under qemu-user, which shows the host's `/proc/cpuinfo`, `TINYLM_CPU_FEATURES`
/// lists the emulated CPU's features instead (CI sets it for each CPU it emulates).
pub fn cpu_has(feature: &str) -> bool {
    let listed = |text: &str| text.split_whitespace().any(|f| f == feature);
    if let Ok(features) = std::env::var("TINYLM_CPU_FEATURES") {
        return listed(&features);
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo")
        .expect("/proc/cpuinfo, or TINYLM_CPU_FEATURES naming the CPU's features");
    let flags = (cpuinfo.lines())
        .find(|line| line.starts_with("flags") || line.starts_with("Features"))
        .and_then(|line| line.split_once(':'))
        .map_or("", |(_, flags)| flags);
    listed(flags)
}

/// The native bf16 kernel the CPU's features call for in this build: AVX512_BF16's
/// `vdpbf16ps` (built with the `avx512` feature) or Arm's `bfdot`; `None` on a CPU
/// without them.
pub fn expected_native_bf16() -> Option<Bf16Kernel> {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    return cpu_has("avx512_bf16").then_some(Bf16Kernel::Avx512Bf16);
    #[cfg(target_arch = "aarch64")]
    return cpu_has("bf16").then_some(Bf16Kernel::ArmBf16);
    #[allow(unreachable_code)]
    None
}
