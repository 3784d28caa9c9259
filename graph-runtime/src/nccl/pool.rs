//! Peer access to a GPU's memory pool for the other GPUs of an NCCL group.

use std::ffi::c_int;
use std::mem::MaybeUninit;

use crate::gpu::Device;
use crate::Error;

/// Lets the other GPUs of the group read and write memory that this rank allocates from
/// its GPU's current memory pool: where `cuMemAllocAsync`, so cudarc (when the GPU
/// supports it), allocates. That is the default pool unless the program made another one
/// current (`cuDeviceSetMemPool`, as some libraries do). NCCL reads and writes the stage
/// buffers of a peer in the same process directly over P2P, and pool memory, unlike
/// `cuMemAlloc`'s, is not open to peers until its pool says so.
///
/// A pool made current after the group's launch is not covered: its memory is closed to
/// the peers.
pub(super) fn share_pool_with_peers(device: &Device, devices: &[usize]) -> Result<(), Error> {
    use cudarc::driver::sys as cu;
    let me = device.ordinal();
    if !device.context().has_async_alloc() || devices.iter().all(|&d| d == me) {
        return Ok(());
    }
    let check = |call: &'static str, r: cu::CUresult| {
        r.result().map_err(|e| crate::gpu::driver_error(call, e))
    };
    // SAFETY: plain driver calls with out-pointers to locals; the context of `device` is
    // current on this thread (`Device::new` bound it), and every ordinal is a GPU that
    // `Nccl::new` checked exists.
    unsafe {
        let mut pool = MaybeUninit::uninit();
        check(
            "cuDeviceGetMemPool",
            cu::cuDeviceGetMemPool(pool.as_mut_ptr(), device.context().cu_device()),
        )?;
        let pool = pool.assume_init();
        for &peer in devices.iter().filter(|&&d| d != me) {
            let mut peer_dev = MaybeUninit::uninit();
            check(
                "cuDeviceGet",
                cu::cuDeviceGet(peer_dev.as_mut_ptr(), peer as c_int),
            )?;
            let peer_dev = peer_dev.assume_init();
            let mut can = 0;
            check(
                "cuDeviceCanAccessPeer",
                cu::cuDeviceCanAccessPeer(&mut can, peer_dev, device.context().cu_device()),
            )?;
            if can == 0 {
                // No P2P between the two: NCCL goes through its own buffers instead.
                continue;
            }
            let desc = cu::CUmemAccessDesc {
                location: cu::CUmemLocation {
                    type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: peer_dev,
                },
                flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            check("cuMemPoolSetAccess", cu::cuMemPoolSetAccess(pool, &desc, 1))?;
        }
    }
    Ok(())
}
