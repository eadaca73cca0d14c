//! Where a model runs: `cpu`, `cuda`, `cuda:N` or `auto`, and in which precision
//! (`auto`: bf16 where the hardware multiplies bf16 natively). [`backend_kind`] is
//! the one place that says which [`BackendKind`] a device and a precision name on
//! this machine: the CLI, the Python package and the accounting all ask it.
//!
//! Every command that runs a model is written once, generic over the
//! [`Backend`](crate::kernels::Backend): [`AnyBackend::open`] opens the backend a
//! device names, and [`on_backend!`](crate::on_backend) runs
//! the generic code on whichever it is (compiled for each backend, chosen at run
//! time). The CUDA backend exists in builds with the cargo feature `cuda`; other
//! builds refuse `cuda` with a line that says how to get it.

use crate::distributed::World;
use crate::kernels::cpu::bf16::Bf16Kernel;
use crate::kernels::{BackendKind, Cpu, CpuMixed, Precision};
use crate::{Error, Model, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Whether this build has the CUDA backend (the cargo feature `cuda`).
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// A compute device, as written on the command line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Device {
    #[default]
    Cpu,
    /// GPU number `N` (`cuda` is `cuda:0`).
    Cuda(usize),
    /// CUDA when a usable GPU is present, else the CPU.
    Auto,
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "unknown device '{s}': expected cpu, cuda, cuda:N (N a GPU number) or auto"
            ))
        };
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            "auto" => Ok(Device::Auto),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(bad),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Auto => write!(f, "auto"),
        }
    }
}

impl TryFrom<String> for Device {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.to_string()
    }
}

/// A backend chosen at run time: the CPU in `f32` or in bf16 mixed precision, or
/// a GPU in builds with the cargo feature `cuda`. [`on_backend!`](crate::on_backend)
/// runs generic code on the one it holds.
pub enum AnyBackend {
    Cpu(Cpu),
    CpuMixed(CpuMixed),
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::kernels::cuda::Cuda>),
}

impl AnyBackend {
    /// The backend `device` names, in `precision` (the [`backend_kind`] they name).
    pub fn open(device: Device, precision: Precision) -> Result<Self> {
        let device = resolve(device)?;
        Ok(match backend_kind(device, precision)? {
            BackendKind::Cpu => AnyBackend::Cpu(Cpu),
            BackendKind::CpuBf16 => AnyBackend::CpuMixed(CpuMixed::new()),
            BackendKind::CpuQ8 => AnyBackend::CpuMixed(CpuMixed::q8()),
            BackendKind::Cuda(precision) => match device {
                Device::Cuda(ordinal) => open_cuda(ordinal, precision)?,
                _ => unreachable!("a GPU's kind is a GPU device's"),
            },
        })
    }

    /// [`AnyBackend::open`] for models that only run forward (generation,
    /// evaluation, a server): on the CPU under bf16 or q8_0, the weights kept in
    /// their copy alone ([`CpuMixed::forward_only`]).
    pub fn open_forward_only(device: Device, precision: Precision) -> Result<Self> {
        Ok(match AnyBackend::open(device, precision)? {
            AnyBackend::CpuMixed(mixed) => AnyBackend::CpuMixed(mixed.forward_only()),
            other => other,
        })
    }
}

/// The backend that `device` and `precision` name on this machine — the one place
/// that decides it. `auto` on a CPU is bf16 where the CPU multiplies bf16 natively
/// (AVX512_BF16, Arm BF16, [`Bf16Kernel::native`]) and fp32 elsewhere; on a GPU bf16
/// from compute capability 8.0, asking the GPU where this build and machine have
/// one, else bf16 (what a memory estimate for a GPU elsewhere assumes). `q8_0` runs
/// on the CPU only. A `cuda` device counts as a GPU in any build (the accounting's
/// estimates); opening one checks that it exists.
pub fn backend_kind(device: Device, precision: Precision) -> Result<BackendKind> {
    let device = match device {
        Device::Auto => resolve(Device::Auto)?,
        device => device,
    };
    Ok(match (device, precision) {
        (Device::Cuda(_), Precision::Q8_0) => {
            return Err(Error::Device(
                "q8_0 weights run on the CPU: use --device cpu (or bf16 on the GPU)".into(),
            ))
        }
        (Device::Cuda(ordinal), Precision::Auto) => BackendKind::Cuda(gpu_auto(ordinal)),
        (Device::Cuda(_), precision) => BackendKind::Cuda(precision),
        (_, Precision::Auto) if Bf16Kernel::native().is_some() => BackendKind::CpuBf16,
        (_, Precision::Bf16) => BackendKind::CpuBf16,
        (_, Precision::Q8_0) => BackendKind::CpuQ8,
        (_, Precision::Auto | Precision::Fp32) => BackendKind::Cpu,
    })
}

/// What `auto` is on GPU `ordinal`: bf16 from compute capability 8.0, else fp32;
/// bf16 where the GPU cannot be asked.
#[cfg(feature = "cuda")]
fn gpu_auto(ordinal: usize) -> Precision {
    use crate::kernels::cuda::Cuda;
    let capability = Cuda::is_available()
        .then(|| Cuda::compute_capability(ordinal).ok())
        .flatten();
    match capability {
        Some((major, _)) if major < 8 => Precision::Fp32,
        _ => Precision::Bf16,
    }
}

#[cfg(not(feature = "cuda"))]
fn gpu_auto(_ordinal: usize) -> Precision {
    Precision::Bf16
}

/// What `asked` means on `device` (resolved), in words for a run's first line and
/// `tinylm info`: "bf16 (auto: this CPU multiplies bf16 natively, AVX512_BF16
/// (vdpbf16ps))", "fp32 (auto: this CPU has no native bf16 products)".
pub fn describe_precision(device: Device, asked: Precision) -> String {
    let auto = asked == Precision::Auto;
    let Ok(kind) = backend_kind(device, asked) else {
        return asked.to_string();
    };
    match (kind, kind.precision()) {
        (BackendKind::CpuBf16, _) => {
            let kernel = Bf16Kernel::best();
            match (auto, Bf16Kernel::native().is_some()) {
                (true, _) => format!(
                    "bf16 (auto: this CPU multiplies bf16 natively, {})",
                    kernel.name()
                ),
                (false, true) => format!("bf16 ({})", kernel.name()),
                (false, false) => format!(
                    "bf16 ({}: this CPU has no native bf16 products, fp32 is faster)",
                    kernel.name()
                ),
            }
        }
        (BackendKind::Cpu, _) if auto => "fp32 (auto: this CPU has no native bf16 products)".into(),
        (BackendKind::Cuda(_), precision) if auto => format!(
            "{precision} (auto: bf16 on a GPU of compute capability 8.0 or newer, else fp32)"
        ),
        (_, precision) => precision.to_string(),
    }
}

/// A model on the backend [`AnyBackend`] chose, held between calls (the Python
/// package's models): from a model built in [`on_backend!`](crate::on_backend) by
/// `AnyModel::from`; [`on_model!`](crate::on_model) runs generic code on it.
pub enum AnyModel {
    Cpu(Box<Model>),
    CpuMixed(Box<Model<f32, CpuMixed>>),
    #[cfg(feature = "cuda")]
    Cuda(Box<Model<f32, crate::kernels::cuda::Cuda>>),
}

impl From<Model> for AnyModel {
    fn from(model: Model) -> Self {
        AnyModel::Cpu(Box::new(model))
    }
}

impl From<Model<f32, CpuMixed>> for AnyModel {
    fn from(model: Model<f32, CpuMixed>) -> Self {
        AnyModel::CpuMixed(Box::new(model))
    }
}

#[cfg(feature = "cuda")]
impl From<Model<f32, crate::kernels::cuda::Cuda>> for AnyModel {
    fn from(model: Model<f32, crate::kernels::cuda::Cuda>) -> Self {
        AnyModel::Cuda(Box::new(model))
    }
}

impl AnyModel {
    pub fn config(&self) -> &crate::ModelConfig {
        crate::on_model!(self, m => m.config())
    }

    pub fn layout(&self) -> &crate::params::ParamLayout {
        crate::on_model!(self, m => m.layout())
    }
}

/// `on_model!(any, m => body)`: `body` with `m` bound to the model (boxed) the
/// [`AnyModel`] `any` holds, as [`on_backend!`](crate::on_backend) does for a
/// backend.
#[cfg(feature = "cuda")]
#[macro_export]
macro_rules! on_model {
    ($any:expr, $m:ident => $body:expr) => {
        match $any {
            $crate::device::AnyModel::Cpu($m) => $body,
            $crate::device::AnyModel::CpuMixed($m) => $body,
            $crate::device::AnyModel::Cuda($m) => $body,
        }
    };
}

/// `on_model!(any, m => body)`: `body` with `m` bound to the model (boxed) the
/// [`AnyModel`] `any` holds (on the CPU: this build has no GPU).
#[cfg(not(feature = "cuda"))]
#[macro_export]
macro_rules! on_model {
    ($any:expr, $m:ident => $body:expr) => {
        match $any {
            $crate::device::AnyModel::Cpu($m) => $body,
            $crate::device::AnyModel::CpuMixed($m) => $body,
        }
    };
}

/// `on_backend!(any, backend => body)`: `body` with `backend` bound to the backend
/// the [`AnyBackend`] `any` holds. The body is generic code compiled once per
/// backend (a [`Model`](crate::Model)`<f32, B>` of either); the match picks one at
/// run time.
#[cfg(feature = "cuda")]
#[macro_export]
macro_rules! on_backend {
    ($any:expr, $backend:ident => $body:expr) => {
        match $any {
            $crate::device::AnyBackend::Cpu($backend) => $body,
            $crate::device::AnyBackend::CpuMixed($backend) => $body,
            $crate::device::AnyBackend::Cuda(cuda) => {
                let $backend = *cuda;
                $body
            }
        }
    };
}

/// `on_backend!(any, backend => body)`: `body` with `backend` bound to the backend
/// the [`AnyBackend`] `any` holds (the CPU, in `f32` or bf16: this build has no
/// GPU).
#[cfg(not(feature = "cuda"))]
#[macro_export]
macro_rules! on_backend {
    ($any:expr, $backend:ident => $body:expr) => {
        match $any {
            $crate::device::AnyBackend::Cpu($backend) => $body,
            $crate::device::AnyBackend::CpuMixed($backend) => $body,
        }
    };
}

/// The device of this process as one rank of `world`: `device` resolved, and with
/// several ranks on GPUs the GPU of its local rank (`cuda` and `cuda:N` alike: one
/// GPU per rank).
pub fn rank_device(device: Device, world: &World) -> Result<Device> {
    match (resolve(device)?, world.ranks()) {
        (Device::Cuda(_), 2..) => Ok(Device::Cuda(world.local_rank())),
        (device, _) => Ok(device),
    }
}

/// A device's memory in bytes: what is free for a new run, of the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// The host's `MemAvailable` (free memory and the caches the kernel can drop),
    /// or the GPU's free memory.
    pub available: u64,
    pub total: u64,
}

/// The memory of `device` (resolved): the host's from `/proc/meminfo` for the CPU,
/// the driver's count for a GPU; `None` where the system does not say.
pub fn memory(device: Device) -> Result<Option<DeviceMemory>> {
    match resolve(device)? {
        Device::Cuda(ordinal) => gpu_memory(ordinal).map(Some),
        _ => Ok(host_memory()),
    }
}

/// `MemAvailable` and `MemTotal` of `/proc/meminfo` (Linux), within the limit of
/// the process's control group when it has one (a container's: cgroup v2's
/// `memory.max`, v1's `memory.limit_in_bytes`, less what the group uses).
fn host_memory() -> Option<DeviceMemory> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let value = line[key.len()..].trim().trim_end_matches("kB").trim();
        value.parse::<u64>().ok().map(|k| k << 10)
    };
    let mut memory = DeviceMemory {
        available: kib("MemAvailable:")?,
        total: kib("MemTotal:")?,
    };
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    let group = [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ]
    .into_iter()
    .find_map(|(limit, used)| Some((read(limit)?, read(used)?)));
    if let Some((limit, used)) = group.filter(|&(limit, _)| limit < memory.total) {
        memory.total = limit;
        memory.available = memory.available.min(limit.saturating_sub(used));
    }
    Some(memory)
}

#[cfg(feature = "cuda")]
fn gpu_memory(ordinal: usize) -> Result<DeviceMemory> {
    let (available, total) = crate::kernels::cuda::Cuda::device_memory(ordinal)?;
    Ok(DeviceMemory { available, total })
}

#[cfg(not(feature = "cuda"))]
fn gpu_memory(ordinal: usize) -> Result<DeviceMemory> {
    Err(no_cuda(ordinal))
}

/// `auto` becomes `cuda:0` when a usable GPU is present, else `cpu`; `cuda` in a
/// build without CUDA support is an error right away (before any work is done).
pub fn resolve(device: Device) -> Result<Device> {
    match device {
        Device::Auto if cuda_available() => Ok(Device::Cuda(0)),
        Device::Auto => Ok(Device::Cpu),
        Device::Cuda(ordinal) if !cfg!(feature = "cuda") => Err(no_cuda(ordinal)),
        d => Ok(d),
    }
}

/// The error for a CUDA device in a build without the `cuda` feature.
fn no_cuda(ordinal: usize) -> Error {
    Error::Device(format!(
        "device cuda:{ordinal}: this tinylm was built without CUDA support; \
         rebuild it with `cargo build --release --features cuda`"
    ))
}

#[cfg(feature = "cuda")]
fn cuda_available() -> bool {
    crate::kernels::cuda::Cuda::is_available()
}

#[cfg(not(feature = "cuda"))]
fn cuda_available() -> bool {
    false
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize, precision: Precision) -> Result<AnyBackend> {
    let cuda = crate::kernels::cuda::Cuda::new(ordinal, precision)?;
    Ok(AnyBackend::Cuda(Box::new(cuda)))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(ordinal: usize, _: Precision) -> Result<AnyBackend> {
    Err(no_cuda(ordinal))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        for (text, device) in [
            ("cpu", Device::Cpu),
            ("cuda", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
            ("auto", Device::Auto),
        ] {
            assert_eq!(text.parse::<Device>().unwrap(), device);
        }
        assert_eq!(Device::Cuda(0).to_string(), "cuda:0");
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", ""] {
            let err = bad.parse::<Device>().unwrap_err().to_string();
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
        assert_eq!("fp32".parse::<Precision>().unwrap(), Precision::Fp32);
        assert_eq!("auto".parse::<Precision>().unwrap(), Precision::default());
        assert!("fp16".parse::<Precision>().is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        let err = AnyBackend::open(Device::Cuda(1), Precision::Bf16)
            .err()
            .unwrap();
        assert!(err.to_string().contains("--features cuda"), "{err}");
        let auto = AnyBackend::open(Device::Auto, Precision::Bf16).unwrap();
        let (b, t) = (2, 4);
        let config = crate::ModelConfig {
            vocab_size: 16,
            context_length: t,
            d_model: 8,
            num_layers: 1,
            num_heads: 2,
            d_ff: 16,
            ..crate::ModelConfig::tinystories()
        };
        let ids = vec![1; b * t];
        let logits = crate::on_backend!(auto, backend => {
            let mut model = crate::Model::init_with_backend(config, 0, backend).unwrap();
            model.forward(&ids, b, t).unwrap().len()
        });
        assert_eq!(logits, b * t * 16);
    }
}
