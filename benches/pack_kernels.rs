//! The host pack kernels alone (`dlpack_mpi::spec::kernels::pack`), against a `memcpy` of
//! the packed bytes: the step-2 view of 64 MiB f32 (32 MiB packed), the 4096 × 4096 f32
//! transpose (64 MiB) and the 64 MiB f32 storage reversed. Issue 13's targets: step 2 at most
//! 2× the `memcpy`, the transpose at most 3×. No MPI: one process, buffers touched before
//! timing (no page faults timed); median and best of the runs, ms.
//!
//! `"$(bench_binary pack_kernels)" [runs, default 15]` (benches/README.md); an argument that
//! is not a number (`--bench`, which `cargo bench` passes) leaves the default.

use std::time::Instant;

use dlpack_mpi::layout::Axis;
use dlpack_mpi::spec::kernels::pack;

/// Elements of the storage (64 MiB of f32).
const STORAGE: usize = 1 << 24;

/// Median and best of `runs` timings of `f`, ms.
fn time(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    f(); // warm-up
    let mut v: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(15);
    let src: Vec<u32> = (0..STORAGE as u32).collect();
    let mut out = vec![0u8; STORAGE * 4];
    let n = STORAGE as i64;
    let d = 4096i64;
    // (name, axes, first element, packed elements)
    let cases: [(&str, Vec<Axis>, usize, usize); 3] = [
        (
            "step 2",
            vec![Axis {
                extent: n / 2,
                stride_elems: 2,
            }],
            0,
            STORAGE / 2,
        ),
        (
            "transpose",
            vec![
                Axis {
                    extent: d,
                    stride_elems: 1,
                },
                Axis {
                    extent: d,
                    stride_elems: d,
                },
            ],
            0,
            STORAGE,
        ),
        (
            "reversed",
            vec![Axis {
                extent: n,
                stride_elems: -1,
            }],
            STORAGE - 1,
            STORAGE,
        ),
    ];
    println!(
        "case        packed   memcpy med  best |     pack med  best |   pack/memcpy med  best"
    );
    for (name, axes, first, packed) in cases {
        let bytes = packed * 4;
        let (mm, mb) = time(runs, || {
            let (dst, from) = (&mut out[..bytes], bytemuck_u8(&src[..packed]));
            dst.copy_from_slice(from);
            std::hint::black_box(&mut out);
        });
        let (gm, gb) = time(runs, || {
            let base = src[first..].as_ptr().cast::<u8>();
            // SAFETY: every element of the view lies in `src` (the axes' reach from `first`
            // stays inside 0..STORAGE), and `out` is a separate buffer.
            let ok = unsafe { pack(base, &axes, 4, &mut out[..bytes]) };
            assert!(ok);
            std::hint::black_box(&mut out);
        });
        println!(
            "{name:<10} {:>4} MiB   {mm:>8.2} {mb:>6.2} | {gm:>8.2} {gb:>6.2} | {:>14.2} {:>5.2}",
            bytes >> 20,
            gm / mm,
            gb / mb
        );
    }
    // The values, once: the packed step-2 view holds every other storage element.
    let view = bytemuck_u8(&src[..STORAGE / 2]).len();
    let axes = [Axis {
        extent: n / 2,
        stride_elems: 2,
    }];
    // SAFETY: as above.
    assert!(unsafe { pack(src.as_ptr().cast(), &axes, 4, &mut out[..view]) });
    let ok = out[..view]
        .chunks_exact(4)
        .enumerate()
        .all(|(i, c)| u32::from_ne_bytes(c.try_into().unwrap()) == 2 * i as u32);
    println!(
        "verification (step 2, every element): {}",
        if ok { "passed" } else { "FAILED" }
    );
    assert!(ok);
}

/// The bytes of `v`.
fn bytemuck_u8(v: &[u32]) -> &[u8] {
    // SAFETY: `u32` has no padding and every byte pattern is a valid `u8`; the length is
    // the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}
