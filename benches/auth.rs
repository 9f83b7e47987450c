//! Token benchmarks (being written).
fn main() {}
