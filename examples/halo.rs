//! A halo exchange planned once: a solver's grid split by columns over the ranks (a
//! periodic ring), whose boundary columns go to the neighbours' ghost columns at every
//! iteration through `plan_exchange`. The columns of a row-major grid are strided views,
//! sent as they are (packed in chunks that overlap the wire, `docs/GUIDE.md`, "Exchanges");
//! the exchange is matched and checked once, at the build, and each step posts every
//! receive and send with no agreement and no allocation. After 20 Jacobi iterations every
//! rank compares its block with the whole grid computed alone: the result is asserted.
//!
//! The grid is one allocation of the solver's own, as a C or Fortran code has it; its
//! columns are DLPack views made from raw `DLTensor`s (`TensorView::from_raw`), which is
//! why this example has `unsafe` blocks (each says what it relies on).
//!
//! ```text
//! cargo build --examples && mpirun -n 4 target/debug/examples/halo
//! ```
use dlpack_mpi::dlpack::{DLDataType, DLDevice, DLTensor, TensorView};
use dlpack_mpi::prelude::*;

/// Rows of the grid, interior columns per rank (each rank has two ghost columns more).
const ROWS: usize = 48;
const COLS: usize = 6;
const WIDTH: usize = COLS + 2;

/// The initial value at (row, global column): small integers, so that every average of
/// the iterations below is exact in `f32`.
fn initial(row: usize, col: usize) -> f32 {
    ((row * 7 + col * 3) % 16) as f32
}

/// `steps` Jacobi iterations along the rows (each interior value becomes the average of
/// its left and right neighbours) of a periodic grid of `ROWS × cols` from `u`.
fn jacobi(u: &mut [f32], cols: usize, rows: usize, width: usize, ghosts: usize) {
    let mut next = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let at = |k: usize| u[r * width + k];
            next[r * cols + c] = (at(c + ghosts - 1) + at(c + ghosts + 1)) / 2.0;
        }
    }
    for r in 0..rows {
        for c in 0..cols {
            u[r * width + c + ghosts] = next[r * cols + c];
        }
    }
}

/// A column of the grid at `base` (row-major, `WIDTH` columns), as a DLPack tensor:
/// `ROWS` float32 elements, `WIDTH` apart. The shape and stride arrays live in the box.
struct Column {
    dl: DLTensor,
    shape: [i64; 1],
    stride: [i64; 1],
}

fn column(base: *mut f32, c: usize) -> Box<Column> {
    let mut col = Box::new(Column {
        dl: DLTensor {
            data: base.cast(),
            device: DLDevice {
                device_type: 1, // kDLCPU
                device_id: 0,
            },
            ndim: 1,
            dtype: DLDataType {
                code: 2, // kDLFloat
                bits: 32,
                lanes: 1,
            },
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: (c * 4) as u64,
        },
        shape: [ROWS as i64],
        stride: [WIDTH as i64],
    });
    col.dl.shape = col.shape.as_mut_ptr();
    col.dl.strides = col.stride.as_mut_ptr();
    col
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, n) = (world.rank(), world.size());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    // This rank's block of the grid (interior columns 1..=COLS, ghosts 0 and COLS + 1).
    let first = rank as usize * COLS;
    let mut storage: Vec<f32> = (0..ROWS * WIDTH)
        .map(|j| match j % WIDTH {
            0 | WIDTH_MINUS_1 => 0.0,
            c => initial(j / WIDTH, first + c - 1),
        })
        .collect();
    // From here on the grid is reached through `base` alone (the views and the loop).
    let base = storage.as_mut_ptr();
    // First interior column to the left (tag 1), last to the right (tag 2); the ghosts
    // receive the neighbours' (from the right with tag 1, from the left with tag 2).
    let mut cols = [
        column(base, 1),
        column(base, COLS),
        column(base, WIDTH - 1),
        column(base, 0),
    ];
    let mut views = Vec::new();
    for c in cols.iter_mut() {
        // SAFETY: a column of the grid's storage, which outlives the views (dropped at the
        // end of `main`, after them); the box keeps its shape and stride in place.
        views.push(unsafe { TensorView::from_raw(&mut c.dl) }?);
    }
    let (mut sends, mut recvs) = (views, Vec::new());
    recvs.extend(sends.drain(2..));
    let mut halo = world.plan_exchange(
        &mut sends,
        &[(left, 1), (right, 2)],
        &mut recvs,
        &[(right, 1), (left, 2)],
    )?;
    for _ in 0..20 {
        halo.run()?; // the ghost columns now hold the neighbours' boundary columns
                     // SAFETY: the grid's storage, not in use by MPI between steps (`run` completed).
        let grid = unsafe { std::slice::from_raw_parts_mut(base, ROWS * WIDTH) };
        jacobi(grid, COLS, ROWS, WIDTH, 1);
    }
    drop(halo);
    // The whole periodic grid, computed alone, the same number of iterations.
    let total = COLS * n as usize;
    let mut whole: Vec<f32> = (0..ROWS * (total + 2))
        .map(|j| {
            let c = j % (total + 2);
            initial(j / (total + 2), (c + total - 1) % total)
        })
        .collect();
    for _ in 0..20 {
        for r in 0..ROWS {
            whole[r * (total + 2)] = whole[r * (total + 2) + total];
            whole[r * (total + 2) + total + 1] = whole[r * (total + 2) + 1];
        }
        jacobi(&mut whole, total, ROWS, total + 2, 1);
    }
    // SAFETY: as in the loop; the exchange was dropped.
    let grid = unsafe { std::slice::from_raw_parts(base, ROWS * WIDTH) };
    for r in 0..ROWS {
        for c in 1..=COLS {
            assert_eq!(grid[r * WIDTH + c], whole[r * (total + 2) + first + c]);
        }
    }
    drop(storage);
    if rank == 0 {
        println!("halo: OK on {n} ranks, 20 iterations of a {ROWS} x {total} grid");
    }
    Ok(())
}

/// The last column of a rank's block (its right ghost).
const WIDTH_MINUS_1: usize = WIDTH - 1;
