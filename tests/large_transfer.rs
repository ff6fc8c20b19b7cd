//! One real transfer above 2^31 bytes (issue: large counts), at 2 or more ranks: rank 0 sends
//! 2^31 + 4099 bytes to rank 1 through `send_tensor`/`recv_tensor`; the count beyond MPI's
//! `int` goes as one large-count derived datatype, never a truncated or negative count.
//! Needs about 2.2 GB per rank. At 1 rank (`cargo test`) it reports itself ignored.

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::spec::SendSpec;
use mpi::collective::SystemOperation;
use mpi::traits::*;

const BYTES: usize = (1 << 31) + 4099;

/// Bytes `i % 251`, with marker bytes around the 2^31 boundary and at the end, built by
/// block copies (fast in debug builds too).
fn expected() -> Vec<u8> {
    let block: Vec<u8> = (0..251 * 4096).map(|i| (i % 251) as u8).collect();
    let mut v = Vec::with_capacity(BYTES);
    while v.len() < BYTES {
        let n = (BYTES - v.len()).min(block.len());
        v.extend_from_slice(&block[..n]);
    }
    for (at, marker) in MARKERS {
        v[at] = marker;
    }
    v
}

const MARKERS: [(usize, u8); 4] = [
    ((1 << 31) - 1, 0xAA),
    (1 << 31, 0xBB),
    ((1 << 31) + 1, 0xCC),
    (BYTES - 1, 0xDD),
];

fn main() {
    let universe = mpi::initialize().expect("MPI initializes once");
    let w = universe.world();
    if w.size() < 2 {
        println!("test large_transfer_above_2_gib ... ignored (needs 2 ranks)");
        println!("\ntest result: ok. 0 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out");
        return;
    }
    let mut ok = true;
    if w.rank() == 0 {
        let data = Owned::new(expected()).read_only();
        let t = acquire(&data, &AcquireOptions::default()).expect("acquire");
        let spec = SendSpec::new(&t).expect("large spec");
        ok &= spec.is_derived() && spec.mpi_count() == 1;
        w.send_tensor(&t, 1, 5).expect("send");
    } else if w.rank() == 1 {
        let data = Owned::new(vec![0u8; BYTES]);
        {
            let mut t = acquire(&data, &AcquireOptions::default()).expect("acquire");
            // An empty receive is refused, and the error holds the message.
            let short = Owned::new(vec![0u8; 1]).with_shape(&[0]).expect("empty");
            let mut s = acquire(&short, &AcquireOptions::default()).expect("acquire");
            let err = w.recv_tensor(&mut s, 0, 5).unwrap_err();
            match err.mismatch() {
                dlpack_mpi::Error::CountMismatch { expected: 0, .. } => {}
                other => {
                    eprintln!("short receive: {other:?}");
                    ok = false;
                }
            }
            let held = err.unreceived().expect("the error holds the message");
            ok &= held.len_bytes() == BYTES as u64;
            held.recv_into(&mut t).expect("receive through the error");
        }
        let got = data.into_vec();
        let want = expected();
        for (k, (g, e)) in got.chunks(1 << 20).zip(want.chunks(1 << 20)).enumerate() {
            if g != e {
                let i = g.iter().zip(e).position(|(a, b)| a != b).unwrap_or(0);
                eprintln!(
                    "byte {}: expected {}, got {}",
                    k * (1 << 20) + i,
                    e[i],
                    g[i]
                );
                ok = false;
                break;
            }
        }
        ok &= MARKERS.iter().all(|&(at, m)| got[at] == m);
    }
    let mine = i32::from(!ok);
    let mut any = 0;
    w.all_reduce_into(&mine, &mut any, SystemOperation::max());
    if w.rank() == 0 {
        println!(
            "test large_transfer_above_2_gib ... {}",
            if any == 0 { "ok" } else { "FAILED" }
        );
        println!(
            "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; 0 filtered out",
            if any == 0 { "ok" } else { "FAILED" },
            i32::from(any == 0),
            i32::from(any != 0)
        );
    }
    drop(universe);
    if any != 0 {
        std::process::exit(1);
    }
}
