//! placeholder
pub use graph_runtime::*;
