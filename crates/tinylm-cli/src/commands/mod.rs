//! One module per `tinylm` subcommand.

pub mod bpe;
