//! One module per `tinylm` subcommand.

pub mod bench;
pub mod bpe;
pub mod eval;
pub mod forward;
pub mod generate;
pub mod info;
pub mod quickstart;
pub mod train;
