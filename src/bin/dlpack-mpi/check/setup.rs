//! What every rank needs before the cases: rank 0's `--device`, `--transport` and
//! `--simulate-device` made every rank's (the ranks agreed on their arguments at the start,
//! `crate::agree`, so these are every rank's own too), the GPU runtime and each rank's
//! device (`--gpu`),
//! and the communicator, agreed by all ranks (one rank without a runtime, whose device is
//! refused, or whose MPI refuses `direct`, refuses the run for all).

use dlpack_mpi::transport::{DeviceComm, Transport};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{CheckArgs, DeviceChoice, TRANSPORTS};
use super::matrix::{placement_transport, Comm};
use super::placement::Placement;
use crate::launch::{agreed, select_gpu, Dev, DeviceArg, Gpu, NoGpu, DEVS};

/// The communicator the cases go through, the placements of the run with the transport
/// part of their names, and the GPU runtime.
pub(super) struct Setup<'c> {
    pub dc: Comm<'c>,
    pub placements: Vec<(Placement, String)>,
    pub gpu: Option<Gpu>,
}

/// The options that decide the devices, as rank 0 gave them.
struct Chosen {
    device: DeviceChoice,
    transport: Transport,
    simulate: bool,
}

/// The `--device` values of one memory, by the index rank 0 broadcasts.
const ONE: [DeviceArg; 5] = [
    DeviceArg::Cpu,
    DeviceArg::CudaHost,
    DeviceArg::Cuda,
    DeviceArg::CudaManaged,
    DeviceArg::All,
];

/// `--device` as three integers: its kind (one memory, a pair, `mpich-all`) and indices
/// into [`ONE`] or [`DEVS`] (`DEVS.len()`: `all`).
fn encode(choice: DeviceChoice) -> [i32; 3] {
    let side = |d: Option<Dev>| {
        d.and_then(|d| DEVS.iter().position(|x| *x == d))
            .unwrap_or(DEVS.len()) as i32
    };
    match choice {
        DeviceChoice::One(a) => [0, ONE.iter().position(|x| *x == a).unwrap_or(0) as i32, 0],
        DeviceChoice::Pair(s, r) => [1, side(s), side(r)],
        DeviceChoice::MpichAll => [2, 0, 0],
    }
}

/// The `--device` value [`encode`] made.
fn decode([kind, a, b]: [i32; 3]) -> DeviceChoice {
    let side = |i: i32| DEVS.get(i as usize).copied();
    match kind {
        1 => DeviceChoice::Pair(side(a), side(b)),
        2 => DeviceChoice::MpichAll,
        _ => DeviceChoice::One(ONE[(a as usize).min(ONE.len() - 1)]),
    }
}

/// Rank 0's `--device`, `--transport` and `--simulate-device` on every rank.
fn rank0_options(w: &SimpleCommunicator, args: &CheckArgs) -> Chosen {
    let [kind, a, b] = encode(args.device);
    let mut chosen = [
        kind,
        a,
        b,
        TRANSPORTS
            .iter()
            .position(|(t, _, _)| *t == args.transport)
            .unwrap_or(0) as i32,
        i32::from(args.simulate_device),
    ];
    w.process_at_rank(0).broadcast_into(&mut chosen[..]);
    Chosen {
        device: decode([chosen[0], chosen[1], chosen[2]]),
        transport: TRANSPORTS[chosen[3] as usize].0,
        simulate: chosen[4] != 0,
    }
}

/// Refusal of real managed memory: no producer makes it yet (`CudaExport` labels `kDLCUDA`).
const NO_MANAGED: &str = "device `cuda-managed` runs only with simulated memory for now \
                          (no managed-memory producer yet";

/// The GPU runtime and device every rank agrees on, when a selected placement needs one
/// (`None` when none does, or a sweep such as `all` finds no runtime and has placements
/// without one); else why the run is refused (a refused `--gpu` or `DLPACK_MPI_DEVICE`
/// refuses `all` too).
fn choose_gpu(
    w: &SimpleCommunicator,
    (c, args): (&Chosen, &CheckArgs),
    places: &[Placement],
) -> Result<Option<Gpu>, String> {
    if !places.iter().any(|p| p.needs_runtime()) {
        return Ok(None);
    }
    let managed = DeviceChoice::One(DeviceArg::CudaManaged);
    match select_gpu(w, c.simulate, args.gpu) {
        Ok(g) => Ok(Some(g)),
        Err(NoGpu::Refused(why)) => Err(why),
        // `all`: the GPU devices are left out.
        Err(NoGpu::NoRuntime(_))
            if c.device.is_sweep() && places.iter().any(|p| !p.needs_runtime()) =>
        {
            Ok(None)
        }
        Err(NoGpu::NoRuntime(_)) if c.device == managed && !c.simulate => Err(format!(
            "{NO_MANAGED}; add --simulate-device, or use `--device cuda`)"
        )),
        Err(NoGpu::NoRuntime(why)) => Err(format!(
            "device `{}` needs a GPU runtime: {why}",
            c.device.name()
        )),
    }
}

/// Rank 0's options made every rank's, then the GPU runtime and the communicator.
pub(super) fn setup<'c>(w: &'c SimpleCommunicator, args: &CheckArgs) -> Result<Setup<'c>, String> {
    let c = rank0_options(w, args);
    let mut places = Placement::of_choice(c.device);
    let gpu = choose_gpu(w, (&c, args), &places)?;
    let managed = |p: &Placement| p.devices().contains(&Dev::CudaManaged);
    match gpu {
        None => places.retain(|p| !p.needs_runtime()),
        // Real managed memory has no producer here yet (CudaExport labels kDLCUDA).
        Some(g) if !g.simulated => {
            if !c.device.is_sweep() && places.iter().any(managed) {
                return Err(format!("{NO_MANAGED}); use `--device cuda`"));
            }
            places.retain(|p| !managed(p));
        }
        Some(_) => {}
    }
    let gpu_selected = places.iter().any(|p| p.needs_runtime());
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
    let placements = places
        .iter()
        .map(|p| (*p, placement_transport(*p, &dc)))
        .collect();
    Ok(Setup {
        dc,
        placements,
        gpu,
    })
}
