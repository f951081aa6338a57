//! The device crate's own kernels: they prove the path from one HIP source to both targets, the
//! prelude's conversions, and the copy bandwidth that every memory-bound stage is measured against.

use crate::source::KernelSource;

/// `e4m3_all_codes`, `encode_f32`.
pub fn convert_source() -> KernelSource {
    KernelSource::new("convert.hip", include_str!("../kernels/convert.hip"))
}

/// `copy_16b`, `bump`, `shared_sum`.
pub fn copy_source() -> KernelSource {
    KernelSource::new("copy.hip", include_str!("../kernels/copy.hip"))
}

/// Every kernel source of this crate, for the build table.
pub fn sources() -> Vec<KernelSource> {
    vec![convert_source(), copy_source()]
}
