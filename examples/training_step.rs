//! One data-parallel training step with the fused collectives: every rank holds a copy of
//! a model's parameters, computes gradients on its own data, all-reduces them, and applies
//! the same averaged SGD update, so the copies stay equal.
//!
//! The model is ResNet-50's parameter list (torchvision's `named_parameters()` order: 161
//! tensors, the shapes of `benches/data/gradients-resnet50.txt`, built by [`resnet50`]
//! and checked against that file's totals) at a quarter of its widths: every dimension of
//! 64 or more is divided by [`SCALE`] (the full model's 25.6 M elements become 1.6 M, 6.1
//! MiB of `f32` gradients), so that it runs at 1–4 ranks on 2 cores in a few seconds, well
//! within `scripts/examples.sh`'s timeout.
//!
//! 1. **Start equal**: rank 0's parameters go to every rank in one
//!    [`TensorComm::broadcast_tensors`] over the whole list.
//! 2. **Backward pass**: gradients are written one parameter at a time, last layer first,
//!    into preallocated buffers. They form four groups, in the order the backward pass
//!    finishes them (`fc` and `layer4`, `layer3`, `layer2`, `layer1` and the stem); as soon
//!    as a group's last gradient is written, its members are exported and its in-place sum
//!    is posted with [`TensorComm::immediate_all_reduce_tensors_in_place`], while the backward pass
//!    goes on with the next group. Every pending request is tested
//!    ([`TensorRequest::test`]) after every gradient: a test that finds a group's agreement
//!    complete posts the group's buckets, and later tests let MPI progress them and unpack
//!    each bucket as it lands. Every rank posts the groups in the same order (MPI-4.1
//!    §6.12).
//! 3. [`wait_all`] completes the groups still in flight; then the update
//!    `p ← p − LR · g / size`, and a check of every element of every gradient and every
//!    parameter.
//!
//! Some gradients are strided, as a framework hands them over: `fc.weight`'s is a
//! transposed view (a linear layer's weight gradient computed as `xᵀ·dy`), `conv1.weight`'s
//! and those of `layer4`'s 3×3 convolutions are channels-last (NHWC). The buckets take their
//! elements in logical row-major order and write the sums back in place, layout unchanged.
//!
//! A posted list stays borrowed until the scope ends, so each group's DLPack guards and its
//! list of `&mut dyn Tensor` live outside the scope (empty, one slot per group) and are
//! filled inside it, once the group's gradients are written.
//!
//! Values: rank `r` of `size` holds gradient `base + (2r − size + 1)/4`, whose sum over the
//! ranks is `size · base`, and `base` a multiple of 1/8 in [−8, 8); every partial sum is a
//! multiple of 1/8 below 2^6, so the sums are exact in any order, the average is `base`
//! exactly, and with `LR` = 1/8 the updated parameters (multiples of 1/64) are exact too.
//! A rank that finds a wrong value names the parameter and the element; every rank then
//! exits non-zero.
//!
//! ```text
//! cargo build --examples
//! mpirun -n 4 target/debug/examples/training_step
//! ```
//!
//! The bucket sizes are the library's defaults unless `DLPACK_MPI_BUCKET_BYTES` /
//! `DLPACK_MPI_FIRST_BUCKET_BYTES` are set (to the same values on every rank).

use dlpack_mpi::comm::{wait_all, TensorComm, TensorRequest};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Owned, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use mpi::collective::SystemOperation;
use mpi::request::Scope;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Every dimension of 64 or more is divided by this (1: the full model).
const SCALE: i64 = 4;
/// The learning rate, a power of two so that the update is exact.
const LR: f32 = 0.125;
const ROOT: i32 = 0;
/// The full model's totals, as `benches/data/gradients-resnet50.txt` states them.
const RESNET50_TENSORS: usize = 161;
const RESNET50_ELEMENTS: i64 = 25_557_032;
/// The groups, in the order the backward pass finishes them, by the first component of
/// the parameter names they hold.
const GROUPS: [&[&str]; 4] = [
    &["fc", "layer4"],
    &["layer3"],
    &["layer2"],
    &["layer1", "conv1", "bn1"],
];
/// Wrong values reported per rank, at most.
const REPORTED: usize = 8;

/// How a gradient's elements are laid out in its storage.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// Compact row-major.
    RowMajor,
    /// A `[rows, cols]` matrix stored as its `cols × rows` transpose: strides `[1, rows]`.
    Transposed,
    /// A `[O, I, H, W]` convolution weight stored as `O × H × W × I`.
    ChannelsLast,
}

/// One parameter tensor of the model.
#[derive(Debug)]
struct Param {
    name: String,
    shape: Vec<i64>,
    /// The layout of its gradient (the parameter itself is row-major).
    grad_layout: Layout,
}

impl Param {
    fn elements(&self) -> usize {
        self.shape.iter().product::<i64>() as usize
    }

    /// The strides (elements) of its gradient.
    fn grad_strides(&self) -> Vec<i64> {
        let s = &self.shape;
        match self.grad_layout {
            Layout::RowMajor => {
                let mut out = vec![1i64; s.len()];
                for k in (0..s.len().saturating_sub(1)).rev() {
                    out[k] = out[k + 1] * s[k + 1];
                }
                out
            }
            Layout::Transposed => vec![1, s[0]],
            Layout::ChannelsLast => vec![s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]],
        }
    }

    /// The group that holds its gradient.
    fn group(&self) -> usize {
        let head = self.name.split('.').next().unwrap_or("");
        GROUPS
            .iter()
            .position(|g| g.contains(&head))
            .unwrap_or(GROUPS.len() - 1)
    }
}

/// Builds a parameter list, every dimension of 64 or more divided by `scale`.
struct Builder {
    scale: i64,
    params: Vec<Param>,
}

impl Builder {
    fn add(&mut self, name: String, shape: &[i64], grad_layout: Layout) {
        let shape = shape
            .iter()
            .map(|&n| if n >= 64 { n / self.scale } else { n })
            .collect();
        self.params.push(Param {
            name,
            shape,
            grad_layout,
        });
    }

    /// A batch norm's weight and bias.
    fn norm(&mut self, prefix: &str, channels: i64) {
        self.add(format!("{prefix}.weight"), &[channels], Layout::RowMajor);
        self.add(format!("{prefix}.bias"), &[channels], Layout::RowMajor);
    }
}

/// ResNet-50's parameters (He et al. 2015; torchvision's layout: bottleneck blocks
/// [3, 4, 6, 3] of widths 64–512, expansion 4, a projection in each stage's first block),
/// every dimension of 64 or more divided by `scale`.
fn resnet50(scale: i64) -> Vec<Param> {
    use Layout::{ChannelsLast, RowMajor, Transposed};
    let mut m = Builder {
        scale,
        params: Vec::new(),
    };
    m.add("conv1.weight".into(), &[64, 3, 7, 7], ChannelsLast);
    m.norm("bn1", 64);
    let mut inputs = 64;
    for (stage, blocks, width) in [(1, 3, 64), (2, 4, 128), (3, 6, 256), (4, 3, 512)] {
        let outputs = 4 * width;
        // layer4's 3×3 convolutions have channels-last gradients.
        let conv2 = if stage == 4 { ChannelsLast } else { RowMajor };
        for b in 0..blocks {
            let p = format!("layer{stage}.{b}");
            m.add(
                format!("{p}.conv1.weight"),
                &[width, inputs, 1, 1],
                RowMajor,
            );
            m.norm(&format!("{p}.bn1"), width);
            m.add(format!("{p}.conv2.weight"), &[width, width, 3, 3], conv2);
            m.norm(&format!("{p}.bn2"), width);
            m.add(
                format!("{p}.conv3.weight"),
                &[outputs, width, 1, 1],
                RowMajor,
            );
            m.norm(&format!("{p}.bn3"), outputs);
            if b == 0 {
                let w = format!("{p}.downsample.0.weight");
                m.add(w, &[outputs, inputs, 1, 1], RowMajor);
                m.norm(&format!("{p}.downsample.1"), outputs);
            }
            inputs = outputs;
        }
    }
    m.add("fc.weight".into(), &[1000, 2048], Transposed);
    m.add("fc.bias".into(), &[1000], RowMajor);
    m.params
}

/// The storage index of each logical (row-major) element of a tensor of `shape` and
/// `strides` (elements, all positive).
fn storage_indices(shape: &[i64], strides: &[i64]) -> Vec<usize> {
    let mut out = vec![0usize];
    for (&n, &s) in shape.iter().zip(strides) {
        out = out
            .iter()
            .flat_map(|&base| (0..n as usize).map(move |k| base + k * s as usize))
            .collect();
    }
    out
}

/// Rank 0's initial value of parameter `p`'s element `i`: a multiple of 1/64 in [−2, 2).
fn initial(p: usize, i: usize) -> f64 {
    ((p * 31 + i) % 256) as f64 / 64.0 - 2.0
}

/// The average gradient of parameter `p`'s element `i`: a multiple of 1/8 in [−8, 8).
fn base(p: usize, i: usize) -> f64 {
    ((p * 17 + i * 5) % 128) as f64 / 8.0 - 8.0
}

/// Rank `r`'s gradient of parameter `p`'s element `i`, at `size` ranks: the terms
/// `(2r − size + 1)/4` sum to 0 over the ranks.
fn gradient(r: i32, size: i32, p: usize, i: usize) -> f32 {
    (base(p, i) + f64::from(2 * r - size + 1) / 4.0) as f32
}

/// The backward pass's work for one parameter: its gradient at this rank, written into
/// its storage (`at`: the storage index of each logical element).
fn backward(rank: i32, size: i32, p: usize, at: &[usize], storage: &mut [f32]) {
    for (i, &s) in at.iter().enumerate() {
        storage[s] = gradient(rank, size, p, i);
    }
}

/// Tests every pending request once; `done[g]` becomes the number of gradients written
/// when group `g`'s test found it complete.
fn test_pending<'a, Sc: Scope<'a>>(
    pending: &mut [Option<TensorRequest<'a, Sc>>],
    written: usize,
    done: &mut [Option<usize>],
) -> dlpack_mpi::Result<()> {
    for (g, slot) in pending.iter_mut().enumerate() {
        if let Some(request) = slot.take() {
            match request.test() {
                Ok(outcome) => {
                    outcome?;
                    done[g] = Some(written);
                }
                Err(still_pending) => *slot = Some(still_pending),
            }
        }
    }
    Ok(())
}

/// Wrong values found by the checks, and how many.
#[derive(Default)]
struct Wrong {
    first: Vec<String>,
    count: usize,
}

impl Wrong {
    /// Records element `i` of `what` if `got` is not `want` (`want` is exact in `f32`).
    fn check(&mut self, what: impl FnOnce() -> String, i: usize, got: f32, want: f64) {
        if f64::from(got) != want {
            if self.first.len() < REPORTED {
                self.first.push(format!(
                    "{}: element {i}: expected {want}, got {got}",
                    what()
                ));
            }
            self.count += 1;
        }
    }
}

/// Step 1: rank 0 initializes the parameters (the others hold NaN) and one fused broadcast
/// gives every rank its values.
fn start_equal(world: &SimpleCommunicator, model: &[Param]) -> dlpack_mpi::Result<Vec<Vec<f32>>> {
    let params: Vec<Owned<f32>> = model
        .iter()
        .enumerate()
        .map(|(p, param)| {
            let values: Vec<f32> = (0..param.elements())
                .map(|i| {
                    if world.rank() == ROOT {
                        initial(p, i) as f32
                    } else {
                        f32::NAN
                    }
                })
                .collect();
            Owned::new(values).with_shape(&param.shape)
        })
        .collect::<Result<_, _>>()?;
    {
        let opts = AcquireOptions::default();
        let mut guards: Vec<ManagedTensor> = params
            .iter()
            .map(|p| acquire(p, &opts))
            .collect::<Result<_, _>>()?;
        let mut list: Vec<&mut dyn Tensor> =
            guards.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        world.broadcast_tensors(&mut list, ROOT)?;
    }
    Ok(params.into_iter().map(Owned::into_vec).collect())
}

/// Step 2: the backward pass writes the gradients of group after group (`order`: each
/// group's parameters, in the order written; `grads`: their buffers) and posts each
/// group's all-reduce as soon as it is written, testing the pending ones after every
/// gradient; `wait_all` completes the rest. Returns, per group, the number of gradients
/// written when a test found it complete (`None`: completed by `wait_all`).
fn backward_pass(
    world: &SimpleCommunicator,
    order: &[Vec<usize>],
    at: &[Vec<usize>],
    grads: &mut [Vec<Owned<f32>>],
) -> dlpack_mpi::Result<Vec<Option<usize>>> {
    let (rank, size) = (world.rank(), world.size());
    let opts = AcquireOptions::default();
    let mut done = vec![None; order.len()];
    // One slot per group for its guards and its list, filled when it is posted: the
    // requests borrow them until the scope ends.
    let mut guards: Vec<Vec<ManagedTensor>> = order.iter().map(|_| Vec::new()).collect();
    let mut lists: Vec<Vec<&mut dyn Tensor>> = order.iter().map(|_| Vec::new()).collect();
    mpi::request::scope(|scope| -> dlpack_mpi::Result<()> {
        let mut pending = Vec::with_capacity(order.len());
        let mut written = 0;
        let slots = guards.iter_mut().zip(lists.iter_mut());
        for ((members, storage), (guards, list)) in order.iter().zip(grads).zip(slots) {
            for (&p, owned) in members.iter().zip(storage.iter_mut()) {
                backward(rank, size, p, &at[p], owned.as_mut_slice());
                written += 1;
                test_pending(&mut pending, written, &mut done)?;
            }
            // The group is ready: export its gradients and post their sum.
            for owned in storage.iter() {
                guards.push(acquire(owned, &opts)?);
            }
            list.extend(guards.iter_mut().map(|t| t as &mut dyn Tensor));
            let request =
                world.immediate_all_reduce_tensors_in_place(scope, list, ReduceOp::Sum)?;
            pending.push(Some(request));
        }
        // Step 3: whatever is still in flight.
        for outcome in wait_all(pending.into_iter().flatten()) {
            outcome?;
        }
        Ok(())
    })?;
    // The lists and guards drop on return, after every request completed: the deleters
    // run then.
    Ok(done)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());

    let full = resnet50(1);
    let total: i64 = full.iter().map(|p| p.shape.iter().product::<i64>()).sum();
    if (full.len(), total) != (RESNET50_TENSORS, RESNET50_ELEMENTS) {
        return Err(format!("resnet50(): {} tensors, {total} elements", full.len()).into());
    }
    let model = resnet50(SCALE);
    let at: Vec<Vec<usize>> = model
        .iter()
        .map(|p| storage_indices(&p.shape, &p.grad_strides()))
        .collect();
    let mut wrong = Wrong::default();

    let mut params = start_equal(&world, &model)?;
    for (p, values) in params.iter().enumerate() {
        for (i, &x) in values.iter().enumerate() {
            let what = || format!("broadcast {}", model[p].name);
            wrong.check(what, i, x, initial(p, i));
        }
    }

    // Each group's parameters in the order the backward pass writes their gradients (last
    // parameter first, as DDP's buckets), and a gradient buffer for each, in its layout.
    let mut order: Vec<Vec<usize>> = vec![Vec::new(); GROUPS.len()];
    for p in (0..model.len()).rev() {
        order[model[p].group()].push(p);
    }
    let mut grads: Vec<Vec<Owned<f32>>> = order
        .iter()
        .map(|members| {
            members
                .iter()
                .map(|&p| {
                    let param = &model[p];
                    Owned::new(vec![f32::NAN; param.elements()]).with_layout(
                        &param.shape,
                        Some(&param.grad_strides()),
                        0,
                    )
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let done = backward_pass(&world, &order, &at, &mut grads)?;

    // The update, from each gradient's storage in its layout, and the checks.
    let n = size as f32;
    for (members, storage) in order.iter().zip(&mut grads) {
        for (&p, owned) in members.iter().zip(storage.iter_mut()) {
            let g = owned.as_slice();
            for (i, &s) in at[p].iter().enumerate() {
                let what = || format!("summed gradient of {}", model[p].name);
                wrong.check(what, i, g[s], f64::from(size) * base(p, i));
                params[p][i] -= LR * (g[s] / n);
            }
        }
    }
    for (p, values) in params.iter().enumerate() {
        for (i, &x) in values.iter().enumerate() {
            let want = initial(p, i) - f64::from(LR) * base(p, i);
            wrong.check(|| format!("updated {}", model[p].name), i, x, want);
        }
    }

    for w in &wrong.first {
        eprintln!("training_step: rank {rank}: {w}");
    }
    if wrong.count > wrong.first.len() {
        eprintln!(
            "training_step: rank {rank}: {} wrong values in all",
            wrong.count
        );
    }
    // Every rank learns whether any rank saw a wrong value, so all exit non-zero together.
    let mine = i32::from(wrong.count > 0);
    let mut anywhere = 0i32;
    world.all_reduce_into(&mine, &mut anywhere, SystemOperation::max());
    if anywhere != 0 {
        return Err(format!("rank {rank}: a rank saw a wrong result (messages above)").into());
    }

    if rank == 0 {
        let elements: usize = model.iter().map(Param::elements).sum();
        let strided = model
            .iter()
            .filter(|p| p.grad_layout != Layout::RowMajor)
            .count();
        let early = done.iter().filter(|d| d.is_some()).count();
        println!(
            "training_step: OK on {size} ranks (ResNet-50 at 1/{SCALE} width: {} gradients, \
             {strided} strided, {:.1} MiB, in {} groups; at rank 0, {early} completed during \
             the backward pass, the rest by wait_all)",
            model.len(),
            (elements * 4) as f64 / f64::from(1 << 20),
            GROUPS.len(),
        );
    }
    Ok(())
}
