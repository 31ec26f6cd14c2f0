//! The process-wide ISA choice: forcing the scalar kernels at start-up sticks, and a later,
//! different choice is rejected. (Its own test binary: the choice is per process.)

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use tandem_kernels::isa::{active, set_forced, IsaError};
use tandem_kernels::{matmul, DType, Isa, ThreadPool, WeightView};

#[test]
fn forcing_scalar_before_first_use_sticks() {
    assert_eq!(set_forced(Isa::Scalar), Ok(()));
    let pool = ThreadPool::new(1);
    let data = vec![0u8; 34];
    let w = WeightView::new(DType::Q8_0, 1, 32, &data).unwrap();
    let mut y = [f32::NAN];
    matmul(&pool, &w, &[1.0; 32], &mut y, 1);
    assert_eq!(y, [0.0]);
    assert_eq!(active(), Isa::Scalar);
    assert_eq!(set_forced(Isa::Scalar), Ok(()));
    for other in Isa::available().into_iter().skip(1) {
        assert_eq!(set_forced(other), Err(IsaError::AlreadyChosen(Isa::Scalar)));
    }
    for missing in Isa::ALL.into_iter().filter(|i| !i.is_available()) {
        assert_eq!(set_forced(missing), Err(IsaError::Unavailable(missing)));
    }
}
