//! On a machine without a GPU driver, opening a device is an error that says what to do, not a panic.

#[test]
fn open_without_a_driver_is_a_clear_error() {
    let has_driver = unsafe { cudarc::driver::sys::is_culib_present() };
    if has_driver {
        eprintln!("a CUDA driver is present here; this test is about machines without one");
        return;
    }
    let err = match device::Device::open(0) {
        Ok(_) => panic!("a device opened although no driver is present"),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(
        matches!(err, device::DeviceError::NoDriver { .. }),
        "{text}"
    );
    assert!(
        text.contains("libcuda.so")
            && text.contains("MONO_BACKEND=host")
            && text.contains("CPU reference step"),
        "{text}"
    );
}
