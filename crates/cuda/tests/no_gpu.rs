//! On a machine without the NVIDIA driver, `probe` and `CudaRunner::new` return an error
//! naming the library, never panic. (On a machine with a GPU, `probe` must succeed.)

use tandem_cuda::{probe, CudaError};

#[test]
fn probe_reports_the_missing_driver_or_lists_devices() {
    match probe() {
        Ok(info) => assert!(info.driver_version.0 >= 11, "{info:?}"),
        Err(CudaError::LibraryNotFound {
            library, searched, ..
        }) => {
            assert!(library.contains("libcuda"), "{library}");
            assert!(searched.contains("libcuda.so"), "{searched}");
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[test]
fn probe_error_message_names_the_library() {
    if let Err(e) = probe() {
        let msg = e.to_string();
        assert!(msg.contains("libcuda"), "{msg}");
    }
}
