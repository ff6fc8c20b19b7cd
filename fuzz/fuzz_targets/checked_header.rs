//! Fuzz target: the checked protocol's header decoding (`dlpack_mpi::checked::Header`),
//! the words a peer sends before a checked message's payload. No MPI call is made.
//!
//! Inputs are either raw words (any bytes, 8 at a time, little-endian) or a header built
//! field by field with the magic, version and `ndim` word each right or wrong, so that most
//! inputs get past the first checks. Checked on every input, beyond "no panic, no sanitizer
//! report":
//! - an `Err` is `Error::BadHeader` naming one of the documented fields;
//! - an `Ok` header has `ndim` = its word 3 = the number of shape words, every extent
//!   ≤ `i64::MAX`, and encodes back to exactly the words it came from (when within
//!   `MAX_NDIM` axes);
//! - what a receiver derives from a header before it allocates (the element count, the
//!   dtype's row, the byte size) is a value or a typed error, never a panic or an
//!   allocation: nothing here allocates more than the input's own words.
#![no_main]

use arbitrary::Arbitrary;
use dlpack_mpi::checked::{Header, MAGIC, MAX_NDIM, PROTOCOL_VERSION};
use dlpack_mpi::{dtype, layout, Error};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any words.
    Raw(Vec<u64>),
    /// A header built field by field.
    Fields {
        magic_ok: bool,
        version_ok: bool,
        ndim_ok: bool,
        magic: u64,
        version: u64,
        dtype: u64,
        ndim: u64,
        shape: Vec<u64>,
    },
}

impl Input {
    fn words(self) -> Vec<u64> {
        match self {
            Input::Raw(w) => w,
            Input::Fields {
                magic_ok,
                version_ok,
                ndim_ok,
                magic,
                version,
                dtype,
                ndim,
                shape,
            } => {
                let mut w = vec![
                    if magic_ok { MAGIC } else { magic },
                    if version_ok { PROTOCOL_VERSION } else { version },
                    dtype,
                    if ndim_ok { shape.len() as u64 } else { ndim },
                ];
                w.extend(shape);
                w
            }
        }
    }
}

const FIELDS: [&str; 6] = ["length", "magic", "version", "dtype", "ndim", "shape"];

fuzz_target!(|input: Input| {
    let words = input.words();
    match Header::decode(&words) {
        Err(Error::BadHeader { field, .. }) => {
            assert!(FIELDS.contains(&field), "undocumented field {field:?}");
        }
        Err(other) => panic!("decode returned a non-BadHeader error: {other:?}"),
        Ok(h) => {
            assert!(words.len() >= 4);
            assert_eq!(words[0], MAGIC);
            assert_eq!(words[1], PROTOCOL_VERSION);
            assert_eq!(h.shape.len() as u64, words[3]);
            assert_eq!(h.shape.len(), words.len() - 4);
            assert!(h.shape.iter().all(|&x| x >= 0));
            if h.shape.len() <= MAX_NDIM {
                assert_eq!(h.encode().expect("a decoded header encodes"), words);
            } else {
                assert!(h.encode().is_err(), "more than MAX_NDIM axes encoded");
            }
            // What recv_new computes before allocating: each a value or a typed error.
            if let (Ok(element), Ok(n)) = (dtype::lookup(h.dtype), h.len_elems()) {
                assert!(n >= 0);
                let _ = layout::byte_span(n, element.size_bytes());
            }
        }
    }
});
