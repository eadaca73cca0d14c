//! NCCL as the training step calls it, on one GPU: a communicator of one rank (the
//! most one GPU holds) takes the same calls as many ranks' — the gradient's
//! all-reduce; under ZeRO-1 an ncclReduce of each shard of the gradient and an
//! ncclBroadcast of each shard of the parameters and of their bf16 copy; the sum of
//! squares' all-reduce — and with one rank each leaves its values as they were, so a
//! training step through them ends with the loss and weights of a step without them,
//! bit for bit. Loads `libnccl.so.2` as a run on several GPUs does: the emulated one
//! in CI (`.ci/cuda_emu.sh`), the real one on a GPU machine (`bench/gpu.sh`); without
//! a GPU and NCCL every test fails with the reason, never skipped.
#![cfg(feature = "nccl")]

use tinylm::config::ModelConfig;
use tinylm::distributed::World;
use tinylm::kernels::cuda::Cuda;
use tinylm::kernels::Precision;
use tinylm::kernels::{AdamWParams, Allocator, Backend, BatchPart, BufKind, Buffer, Role};
use tinylm::Model;

const PRECISIONS: [Precision; 2] = [Precision::Fp32, Precision::Bf16];

fn gpu(precision: Precision) -> Cuda {
    Cuda::new(0, precision).unwrap_or_else(|e| panic!("the NCCL tests need a GPU: {e}"))
}

/// 4 steps of a small model on the GPU, with a one-rank communicator's all-reduce of
/// the gradient or without: each step's loss and the final weights.
fn four_steps(precision: Precision, through_nccl: bool) -> (Vec<f64>, Vec<f32>) {
    let config = ModelConfig {
        vocab_size: 256,
        context_length: 16,
        d_model: 32,
        num_layers: 2,
        num_heads: 2,
        d_ff: 64,
        ..ModelConfig::tinystories()
    };
    let cuda = gpu(precision);
    let world = World::single();
    let ranks = through_nccl
        .then(|| Backend::<f32>::collective(&cuda, &world).expect("an NCCL communicator"));
    let mut model = Model::init_with_backend(config, 7, cuda).unwrap();
    let n = model.layout().total;
    let mut opt = model.new_adamw_for(AdamWParams::default(), 0..n).unwrap();
    let (b, t) = (4, 16);
    let mut losses = Vec::new();
    for step in 0..4u32 {
        let ids: Vec<u32> = (0..(b * t) as u32)
            .map(|i| (i * 37 + step * 11) % 256)
            .collect();
        let targets: Vec<u32> = ids.iter().map(|&i| (i * 5 + 3) % 256).collect();
        model
            .accumulate_gradient(&ids, &targets, b, t, BatchPart::whole(b * t))
            .unwrap();
        model
            .optimizer_step(&mut opt, 1e-2, Some(1.0), ranks.as_deref())
            .unwrap();
        losses.push(model.step_stats().unwrap().loss);
    }
    (losses, model.download_params().unwrap())
}

#[test]
fn training_steps_through_a_one_rank_all_reduce_equal_steps_without_it() {
    for precision in PRECISIONS {
        let (losses, weights) = four_steps(precision, true);
        let (alone, alone_weights) = four_steps(precision, false);
        assert_eq!(losses, alone, "{precision:?}: the losses");
        assert!(
            weights == alone_weights,
            "{precision:?}: the weights differ"
        );
        assert!(
            losses[3] < losses[0],
            "{precision:?}: the loss did not fall: {losses:?}"
        );
    }
}

#[test]
fn a_one_rank_reduce_scatter_and_all_gather_leave_their_buffers_as_they_were() {
    for precision in PRECISIONS {
        let cuda = gpu(precision);
        let world = World::single();
        let ranks = Backend::<f32>::collective(&cuda, &world).expect("an NCCL communicator");
        let role = Role {
            name: "values",
            shape: "",
        };
        let values: Vec<f32> = (0..1001).map(|i| (i as f32 * 0.37).sin()).collect();
        for kind in [BufKind::Full, BufKind::Params] {
            let mut buf = Allocator::<f32>::alloc(&cuda, role, values.len(), kind).unwrap();
            Backend::<f32>::upload(&cuda, buf.all_mut(), &values).unwrap();
            if kind == BufKind::Full {
                ranks.reduce_scatter_sum(buf.all_mut()).unwrap();
                ranks.all_reduce_sum(buf.all_mut()).unwrap();
            } else {
                ranks.all_gather(buf.all_mut()).unwrap();
            }
            let mut got = vec![0.0; values.len()];
            Backend::<f32>::download(&cuda, buf.all(), &mut got).unwrap();
            assert!(got == values, "{precision:?}, {kind:?}: the values changed");
        }
    }
}
