//! Resource accounting (SPEC §2): parameters by component and the FLOPs of every
//! matrix product ([`flops`]), and the memory of training and inference — the
//! buffers the model declares, counted by the same declarations ([`memory`]).

pub mod flops;
pub mod memory;

pub use flops::{forward_flops, forward_matmuls, training_flops, ParamCounts, Product};
pub use memory::{
    largest_fitting, largest_micro_batch, step_buffers, Entry, InferenceMemory, Memory, Part,
    Planned, Planner, Recorder, RunMemory, RunShape,
};
