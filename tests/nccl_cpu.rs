//! The NCCL backend's behaviour that needs no GPU: what a machine without CUDA gets, and
//! host tensors through the device API. (GPU behaviour: tests/nccl_gpu.rs.)
#![cfg(feature = "nccl")]

use actorgraph::nccl::{current_device, device_count, Device, Nccl};
use actorgraph::prelude::*;

/// Whether this machine lacks the CUDA driver; GPU machines skip the no-driver checks.
fn no_driver() -> bool {
    match device_count() {
        Err(Error::LibraryMissing { .. }) => true,
        other => {
            eprintln!("skipped: the CUDA driver is present here ({other:?})");
            false
        }
    }
}

#[test]
fn without_a_driver_the_backend_and_devices_are_clear_errors() {
    if !no_driver() {
        return;
    }
    for err in [
        Nccl::new([0]).err(),
        Nccl::all().err(),
        Device::new(0).err(),
    ] {
        let err = err.expect("no driver, yet it worked");
        assert!(
            matches!(&err, Error::LibraryMissing { library, searched, .. }
                if library.contains("libcuda") && searched.iter().any(|s| s.contains("cuda"))),
            "{err}"
        );
        assert!(
            err.to_string().contains("install the NVIDIA driver"),
            "{err}"
        );
    }
}

struct Probe;

#[actor]
impl Probe {
    fn device(&mut self) -> String {
        match current_device() {
            Ok(d) => format!("gpu {}", d.ordinal()),
            Err(e) => e.to_string(),
        }
    }
}

graph! {
    Where(probes: [Probe]) {
        probes.device()
    }
}

#[test]
fn an_actor_on_the_cpu_backend_has_no_device() {
    let mut g = Where::launch(vec![Probe, Probe], Cpu).unwrap();
    for msg in g.execute().unwrap() {
        assert!(msg.contains("no GPU on this thread"), "{msg}");
    }
    assert!(matches!(current_device(), Err(Error::Placement(_))));
}

#[test]
fn host_tensors_through_the_device_api() {
    let t = Tensor::from_vec(vec![1u8, 2, 3, 4], [2, 2]).unwrap();
    assert!(t.is_host());
    assert!(t.device_view().is_none());
    assert_eq!(t.device_ordinal(), None);
    let h = t.to_host().unwrap();
    assert!(h.shares_storage(&t), "a host tensor's host copy is itself");
    assert_eq!(h, t);
}
