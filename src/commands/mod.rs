//! One module per subcommand: thin glue over the library crates.

pub mod bench;
pub mod check;
pub mod compare;
pub mod convert;
pub mod diff;
pub mod export;
pub mod fidelity;
pub mod fit;
pub mod generate;
pub mod gpu;
pub mod gpus;
pub mod plot;
pub mod policies;
pub mod replay;
pub mod sweep;
