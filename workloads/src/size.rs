//! Byte sizes as people write them (`512`, `4KiB`, `1.5GiB`): the `units` crate, which
//! policy options share with traces.

pub use units::{format_size_exact, format_size_human, parse_size};
