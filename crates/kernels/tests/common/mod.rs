//! Helpers shared by the kernel tests.

use proptest::prelude::*;

/// Fails the property unless `a` and `b` hold the same f32 bits, element by element; `what`
/// names the variant in the failure.
pub fn assert_bits(a: &[f32], b: &[f32], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        prop_assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{}: element {}: {} vs {}",
            what,
            i,
            x,
            y
        );
    }
    Ok(())
}
