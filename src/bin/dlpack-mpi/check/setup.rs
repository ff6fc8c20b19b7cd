//! What every rank needs before the cases: rank 0's `--device`, `--transport` and
//! `--simulate-device` made every rank's, the GPU runtime and each rank's device (`--gpu`),
//! and the communicator, agreed by all ranks (one rank without a runtime, whose device is
//! refused, or whose MPI refuses `direct`, refuses the run for all).

use dlpack_mpi::transport::{DeviceComm, Transport};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{CheckArgs, TRANSPORTS};
use super::matrix::{transport_part, Comm};
use crate::launch::{agreed, select_gpu, Dev, DeviceArg, Gpu, NoGpu};

/// The communicator the cases go through, the devices of the run with the transport part
/// of their names, and the GPU runtime.
pub(super) struct Setup<'c> {
    pub dc: Comm<'c>,
    pub devices: Vec<(Dev, &'static str)>,
    pub gpu: Option<Gpu>,
}

/// The options that decide the devices, as rank 0 gave them.
struct Chosen {
    device: DeviceArg,
    transport: Transport,
    simulate: bool,
}

/// Rank 0's `--device`, `--transport` and `--simulate-device` on every rank.
fn rank0_options(w: &SimpleCommunicator, args: &CheckArgs) -> Chosen {
    use DeviceArg as A;
    const ARGS: [A; 5] = [A::Cpu, A::CudaHost, A::Cuda, A::CudaManaged, A::All];
    let mut chosen = [
        ARGS.iter().position(|a| *a == args.device).unwrap_or(0) as i32,
        TRANSPORTS
            .iter()
            .position(|(t, _, _)| *t == args.transport)
            .unwrap_or(0) as i32,
        i32::from(args.simulate_device),
    ];
    w.process_at_rank(0).broadcast_into(&mut chosen[..]);
    Chosen {
        device: ARGS[chosen[0] as usize],
        transport: TRANSPORTS[chosen[1] as usize].0,
        simulate: chosen[2] != 0,
    }
}

/// Refusal of real managed memory: no producer makes it yet (`CudaExport` labels `kDLCUDA`).
const NO_MANAGED: &str = "device `cuda-managed` runs only with simulated memory for now \
                          (no managed-memory producer yet";

/// The GPU runtime and device every rank agrees on, when a selected device needs one
/// (`None` when none does, or `all` finds no runtime); else why the run is refused (a
/// refused `--gpu` or `DLPACK_MPI_DEVICE` refuses `all` too).
fn choose_gpu(
    w: &SimpleCommunicator,
    (c, args): (&Chosen, &CheckArgs),
    devs: &[Dev],
) -> Result<Option<Gpu>, String> {
    if !devs.iter().any(|d| d.needs_runtime()) {
        return Ok(None);
    }
    match select_gpu(w, c.simulate, args.gpu) {
        Ok(g) => Ok(Some(g)),
        Err(NoGpu::Refused(why)) => Err(why),
        // `all`: the GPU devices are left out.
        Err(NoGpu::NoRuntime(_)) if c.device == DeviceArg::All => Ok(None),
        Err(NoGpu::NoRuntime(_)) if c.device == DeviceArg::CudaManaged && !c.simulate => Err(
            format!("{NO_MANAGED}; add --simulate-device, or use `--device cuda`)"),
        ),
        Err(NoGpu::NoRuntime(why)) => Err(format!(
            "device `{}` needs a GPU runtime: {why}",
            c.device.name()
        )),
    }
}

/// Rank 0's options made every rank's, then the GPU runtime and the communicator.
pub(super) fn setup<'c>(w: &'c SimpleCommunicator, args: &CheckArgs) -> Result<Setup<'c>, String> {
    let c = rank0_options(w, args);
    let mut devs = c.device.devices();
    let gpu = choose_gpu(w, (&c, args), &devs)?;
    match gpu {
        None => devs.retain(|d| !d.needs_runtime()),
        // Real managed memory has no producer here yet (CudaExport labels kDLCUDA).
        Some(g) if !g.simulated => {
            if c.device == DeviceArg::CudaManaged {
                return Err(format!("{NO_MANAGED}); use `--device cuda`"));
            }
            devs.retain(|d| *d != Dev::CudaManaged);
        }
        Some(_) => {}
    }
    let gpu_selected = devs.iter().any(|d| d.needs_runtime());
    if c.transport != Transport::Auto && !gpu_selected {
        return Err(format!(
            "transport `{}` applies to CUDA device memory, and no CUDA device is selected \
             (host tensors always go to MPI directly)",
            c.transport
        ));
    }
    // Agreed: `--gpu` is each rank's own (rank 0's options above are every rank's).
    let stray_gpu = match args.gpu.ordinal.filter(|_| !gpu_selected) {
        Some(n) => Err(format!(
            "--gpu {n} applies to CUDA device memory, and no CUDA device is selected"
        )),
        None => Ok(()),
    };
    agreed(w, stray_gpu)?;
    let dc = match gpu.filter(|_| gpu_selected) {
        Some(g) => agreed(
            w,
            DeviceComm::new(w, Some(g.runtime), c.transport).map_err(|err| err.to_string()),
        )?,
        // Host memory only: no runtime, no CUDA-awareness query; tensors pass through.
        None => DeviceComm::new(w, None, Transport::Staged).map_err(|err| err.to_string())?,
    };
    let devices = devs.iter().map(|d| (*d, transport_part(*d, &dc))).collect();
    Ok(Setup { dc, devices, gpu })
}
