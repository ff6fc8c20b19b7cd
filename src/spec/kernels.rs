//! Host pack and unpack kernels: copy the elements of a strided tensor into a contiguous
//! buffer in logical row-major order ([`pack`]) and back ([`unpack`]).
//!
//! Both directions run one engine that copies between two strided layouts of the same shape
//! (the tensor's, and the packed buffer's compact row-major one), with every stride in bytes:
//!
//! 1. **Simplify.** Axes of extent 1 are dropped, axes contiguous with their inner neighbour on
//!    *both* sides are merged, and an innermost axis that is contiguous on both sides is folded
//!    into the element (a run of `k` elements of `n` bytes becomes one element of `k × n`
//!    bytes), so a contiguous tensor is one `memcpy` and short runs become wide elements.
//! 2. **Specialise by element size.** 1, 2, 3, 4, 6, 8, 12, 16 and 32 bytes copy as `[u8; N]`
//!    with unaligned loads and stores; other sizes copy with overlapping 4/8/16-byte moves (no
//!    call per element) and sizes from 64 bytes up with `copy_nonoverlapping`. A line of
//!    4-byte elements copied to a contiguous destination from every other element (step 2)
//!    or from a reversed axis moves four elements per 16-byte store (SSE2 shuffles).
//! 3. **Tile permuted axes.** When the innermost axis jumps far on one side (a transpose), the
//!    outer axis with the smallest stride on that side is paired with it and the pair is copied
//!    in square tiles, so the lines read on the far side are reused before they leave the cache.
//! 4. **Odometer.** The remaining outer axes are walked by an index odometer that adds and
//!    rewinds byte strides: no division, no allocation beyond one index per axis.
//!
//! The element order on the packed side is the one `layout::Plan::offsets` gives, so a packed
//! buffer holds exactly what a derived datatype over the same tensor would send (MPI-4.1
//! §5.1.11, "Pack and Unpack", defines the same logical order for `MPI_Pack`).
//!
//! Casts between `usize` and `isize` in this module are of element sizes (at most 64 bytes on
//! the specialised paths), indices below an axis extent, and tile sizes: `pack`/`unpack`
//! check that every axis's byte stride fits `isize` (and refuse the layout otherwise), and
//! every element they address lies in the tensor's byte span, which the caller's spec
//! checked to fit the address space (`layout::byte_span`), so an index times a byte stride
//! cannot wrap and no non-negative count loses a sign.
#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

use crate::layout::Axis;

/// Extent of the tiles (in elements, both axes) for an element of `elem_bytes` bytes: a tile
/// row spans 512 bytes (eight cache lines). Measured on the 4096 × 4096 f32 transpose (Xeon,
/// 48 KiB L1d, 2 MiB L2, 4 KiB pages): 8 × 8 tiles took 4.4× a `memcpy`, 32 × 32 2.8×, 128 ×
/// 128 2.4×, 256 × 256 no better; at a power-of-two row pitch the rows of a tile share one
/// L1 set anyway, so the tile only has to fit L2.
fn tile_elems(elem_bytes: usize) -> usize {
    (512 / elem_bytes.max(1)).clamp(16, 128)
}

/// Innermost strides (bytes, absolute) from which an axis is copied in tiles when a partner
/// axis with a smaller stride on the same side exists: beyond a cache line, each element of
/// the innermost axis touches a line of its own.
const TILE_MIN_STRIDE_BYTES: isize = 128;

/// Elements from this size (bytes) up are copied with `copy_nonoverlapping`.
const MEMCPY_MIN_BYTES: usize = 64;

/// Copies the elements of a strided tensor into `out`, in logical row-major order.
///
/// `axes` are outermost first, with extents in elements and strides in elements relative to
/// the first element at `base` (a `layout::Plan`'s axes, or any axes: extents of 1 and
/// mergeable axes are accepted). Zero strides (broadcast) and negative strides are allowed.
/// `elem_bytes` is the size of one element in bytes (`bits × lanes / 8`, any value).
///
/// Returns `false`, and copies nothing, when `out.len()` is not the tensor's byte count
/// (product of the extents × `elem_bytes`; no axes means one element, or none when `out` is
/// empty, as a plan for an empty tensor has no axes), when an extent is negative, or when a
/// byte stride does not fit `isize`. Returns `true` after copying otherwise.
///
/// # Safety
/// Every element address `base + offset × elem_bytes` (offset in elements, the sum of index ×
/// stride over the axes, for every index inside the extents) is valid for reads of
/// `elem_bytes` bytes, and no element overlaps `out`. Also, the bytes between two
/// consecutive elements of one axis are readable and not written concurrently: the
/// step-2 path for 4-byte elements reads (and discards) them with 16-byte loads. They lie
/// inside the tensor's byte span, which DLPack places in one allocation.
pub unsafe fn pack(base: *const u8, axes: &[Axis], elem_bytes: usize, out: &mut [u8]) -> bool {
    let Some(job) = Job::new(axes, elem_bytes, out.len(), Side::Src) else {
        return false;
    };
    // SAFETY: the caller vouches for the tensor's elements (reads) and their disjointness from
    // `out`; `Job::new` checked that `out` holds exactly the packed elements (writes).
    unsafe { job.run(out.as_mut_ptr(), base) };
    true
}

/// Whether [`pack`] and [`unpack`] take `axes` with `elem_bytes`-byte elements and a
/// packed buffer of `packed_bytes` (the `true` they return, known before copying).
pub fn accepts(axes: &[Axis], elem_bytes: usize, packed_bytes: usize) -> bool {
    Job::new(axes, elem_bytes, packed_bytes, Side::Src).is_some()
}

/// Copies `data` (elements in logical row-major order) into the elements of a strided tensor:
/// the inverse of [`pack`], with the same `axes` and `elem_bytes` conventions and the same
/// `false` cases (then nothing is written).
///
/// Only the tensor's element bytes are written. When elements overlap (zero strides) the
/// value that lands is one of the candidates, which one is unspecified; receive tensors have
/// disjoint elements, so this does not arise in the project.
///
/// # Safety
/// Every element address `base + offset × elem_bytes` is valid for writes of `elem_bytes`
/// bytes and no element overlaps `data`.
pub unsafe fn unpack(data: &[u8], base: *mut u8, axes: &[Axis], elem_bytes: usize) -> bool {
    let Some(job) = Job::new(axes, elem_bytes, data.len(), Side::Dst) else {
        return false;
    };
    // SAFETY: the caller vouches for the tensor's elements (writes) and their disjointness
    // from `data`; `Job::new` checked that `data` holds exactly the packed elements (reads).
    unsafe { job.run(base, data.as_ptr()) };
    true
}

/// A strided copy checked and simplified once, to run many times without allocating
/// ([`pack`] and [`unpack`] build one per call): the fused collectives build one per
/// strided member, which a plan's steps then reuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared(Job);

impl Prepared {
    /// The copy [`pack`] makes of `axes` into a buffer of `packed_bytes`; `None` where
    /// [`pack`] returns `false`.
    pub fn pack(axes: &[Axis], elem_bytes: usize, packed_bytes: usize) -> Option<Prepared> {
        Job::new(axes, elem_bytes, packed_bytes, Side::Src).map(Prepared)
    }

    /// The copy [`unpack`] makes of a buffer of `packed_bytes` into `axes`; `None` where
    /// [`unpack`] returns `false`.
    pub fn unpack(axes: &[Axis], elem_bytes: usize, packed_bytes: usize) -> Option<Prepared> {
        Job::new(axes, elem_bytes, packed_bytes, Side::Dst).map(Prepared)
    }

    /// Runs the copy from `src` to `dst` (a pack's: the tensor's first element to the
    /// packed buffer; an unpack's: the other way).
    ///
    /// # Safety
    /// As [`pack`] (a pack's) or [`unpack`] (an unpack's) for the axes it was prepared
    /// from, with the packed buffer holding exactly the bytes it was prepared for.
    pub unsafe fn run(&self, dst: *mut u8, src: *const u8) {
        // SAFETY: forwarded.
        unsafe { self.0.run(dst, src) }
    }
}

/// Which side of the copy the strided tensor is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The tensor is read (pack); the packed buffer is written.
    Src,
    /// The tensor is written (unpack); the packed buffer is read.
    Dst,
}

/// One axis of a copy: `n` elements, `src`/`dst` bytes apart on the two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dim {
    /// Extent, in elements (≥ 2 after simplification).
    n: usize,
    /// Stride on the source side, in bytes.
    src: isize,
    /// Stride on the destination side, in bytes.
    dst: isize,
}

impl Dim {
    /// Stride on `side`, in bytes.
    fn on(self, side: Side) -> isize {
        match side {
            Side::Src => self.src,
            Side::Dst => self.dst,
        }
    }
}

/// A checked, simplified copy: `dims` outermost first, each element `elem_bytes` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Job {
    /// Axes left after simplification, outermost first (the last two possibly reordered for
    /// tiling; see [`Job::tiled`]).
    dims: Vec<Dim>,
    /// Bytes per (possibly widened) element; 0 when there is nothing to copy.
    elem_bytes: usize,
    /// Whether the last two dims are copied in tiles.
    tiled: bool,
}

impl Job {
    /// Checks `axes` against the packed length `packed_bytes` and builds the copy, with the
    /// tensor on `side`. `None` for a length mismatch, a negative extent or a stride
    /// overflow.
    fn new(axes: &[Axis], elem_bytes: usize, packed_bytes: usize, side: Side) -> Option<Job> {
        let nothing = Job {
            dims: Vec::new(),
            elem_bytes: 0,
            tiled: false,
        };
        if axes.is_empty() && packed_bytes == 0 {
            return Some(nothing); // the plan of an empty tensor, or a zero-byte element
        }
        let mut dims = Vec::with_capacity(axes.len());
        // Packed (compact row-major) stride of the current axis, in bytes, innermost first.
        let mut packed = elem_bytes;
        for a in axes.iter().rev() {
            let n = usize::try_from(a.extent).ok()?;
            let stride = isize::try_from(a.stride_elems).ok()?;
            let strided = stride.checked_mul(isize::try_from(elem_bytes).ok()?)?;
            let compact = isize::try_from(packed).ok()?;
            let (src, dst) = match side {
                Side::Src => (strided, compact),
                Side::Dst => (compact, strided),
            };
            dims.push(Dim { n, src, dst });
            packed = packed.checked_mul(n)?;
        }
        if packed != packed_bytes {
            return None;
        }
        if packed == 0 {
            return Some(nothing);
        }
        dims.reverse();
        let (dims, elem_bytes) = simplify(dims, elem_bytes);
        let (dims, tiled) = pair_for_tiles(dims);
        Some(Job {
            dims,
            elem_bytes,
            tiled,
        })
    }

    /// Runs the copy from `src` to `dst` (the first element on each side).
    ///
    /// # Safety
    /// Every element address on each side is valid (reads on `src`, writes on `dst`) and the
    /// two sides do not overlap.
    unsafe fn run(&self, dst: *mut u8, src: *const u8) {
        macro_rules! fixed {
            ($($n:literal)*) => {
                match self.elem_bytes {
                    0 => {}
                    $($n => drive(Fixed::<$n>, &self.dims, self.tiled, dst, src),)*
                    n => drive(Var(n), &self.dims, self.tiled, dst, src),
                }
            };
        }
        // SAFETY: forwarded contract; every copier moves exactly `elem_bytes` bytes.
        unsafe { fixed!(1 2 3 4 6 8 12 16 32) }
    }
}

/// Drops extent-1 axes, merges axes contiguous on both sides and folds an innermost axis
/// contiguous on both sides into the element. Returns the axes and the element size (bytes).
fn simplify(dims: Vec<Dim>, mut elem_bytes: usize) -> (Vec<Dim>, usize) {
    let mut out: Vec<Dim> = Vec::with_capacity(dims.len());
    for d in dims.into_iter().rev().filter(|d| d.n != 1) {
        if let Some(inner) = out.last_mut() {
            let n = isize::try_from(inner.n).ok();
            let merges = n.and_then(|n| inner.src.checked_mul(n)) == Some(d.src)
                && n.and_then(|n| inner.dst.checked_mul(n)) == Some(d.dst);
            if let (true, Some(n)) = (merges, inner.n.checked_mul(d.n)) {
                inner.n = n;
                continue;
            }
        }
        out.push(d);
    }
    out.reverse();
    while let Some(&last) = out.last() {
        let wide = elem_bytes.checked_mul(last.n);
        let elem = isize::try_from(elem_bytes).ok();
        match wide {
            Some(wide) if Some(last.src) == elem && Some(last.dst) == elem => {
                elem_bytes = wide;
                out.pop();
            }
            _ => break,
        }
    }
    (out, elem_bytes)
}

/// Decides whether the innermost axis is copied in tiles. It is when its stride on one side
/// is at least [`TILE_MIN_STRIDE_BYTES`] and another axis has a smaller stride on that side;
/// the axis with the smallest such stride is then moved next to the innermost one. (Moving
/// an axis changes the visiting order, never which element goes where.)
fn pair_for_tiles(mut dims: Vec<Dim>) -> (Vec<Dim>, bool) {
    let Some((&inner, outer)) = dims.split_last() else {
        return (dims, false);
    };
    let far = if inner.src.unsigned_abs() >= inner.dst.unsigned_abs() {
        Side::Src
    } else {
        Side::Dst
    };
    if inner.on(far).unsigned_abs() < TILE_MIN_STRIDE_BYTES.unsigned_abs() {
        return (dims, false);
    }
    let partner = outer
        .iter()
        .enumerate()
        .min_by_key(|(_, d)| d.on(far).unsigned_abs())
        .filter(|(_, d)| d.on(far).unsigned_abs() < inner.on(far).unsigned_abs())
        .map(|(i, _)| i);
    match partner {
        Some(i) => {
            let d = dims.remove(i);
            let at = dims.len() - 1;
            dims.insert(at, d);
            (dims, true)
        }
        None => (dims, false),
    }
}

/// Copies one element of a fixed size.
trait Copier: Copy {
    /// Size of the element, in bytes.
    fn bytes(self) -> usize;

    /// Copies one element from `src` to `dst`.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of [`Copier::bytes`] bytes, and the two
    /// do not overlap.
    unsafe fn copy(self, dst: *mut u8, src: *const u8);

    /// Whether [`Copier::transpose4`] moves blocks through registers.
    const BLOCKS: bool = false;

    /// Copies a leading part of the line that [`line`] is asked to copy (`n` elements,
    /// `dst_step`/`src_step` bytes apart) with wide moves, when this element size and these
    /// steps have a fast path; returns how many elements it copied (0: none, the default).
    ///
    /// # Safety
    /// As [`line`].
    #[inline(always)]
    unsafe fn line_head(
        self,
        _n: usize,
        _dst: *mut u8,
        _dst_step: isize,
        _src: *const u8,
        _src_step: isize,
    ) -> usize {
        0
    }

    /// Copies a 4 × 4 block of elements whose source columns are `src_col` bytes apart with
    /// the four elements of each column consecutive, to destination rows `dst_row` bytes
    /// apart with the four elements of each row consecutive (so element `(i, j)` moves from
    /// `src + j × src_col + i × bytes` to `dst + i × dst_row + j × bytes`).
    ///
    /// # Safety
    /// Every element address of the block is valid on its side; the sides do not overlap.
    #[inline(always)]
    unsafe fn transpose4(self, dst: *mut u8, dst_row: isize, src: *const u8, src_col: isize) {
        let n = self.bytes();
        for i in 0..4 {
            let d = dst.wrapping_offset(dst_row.wrapping_mul(i));
            let s = src.wrapping_add(n * i as usize);
            // SAFETY: row `i` of the block (forwarded).
            unsafe { line(self, 4, d, n as isize, s, src_col) };
        }
    }
}

/// An element of `N` bytes, moved as one `[u8; N]` (unaligned).
#[derive(Debug, Clone, Copy)]
struct Fixed<const N: usize>;

impl<const N: usize> Copier for Fixed<N> {
    const BLOCKS: bool = cfg!(target_arch = "x86_64") && (N == 4 || N == 8);

    #[inline(always)]
    unsafe fn line_head(
        self,
        n: usize,
        dst: *mut u8,
        dst_step: isize,
        src: *const u8,
        src_step: isize,
    ) -> usize {
        #[cfg(target_arch = "x86_64")]
        if N == 4 && dst_step == 4 {
            // SAFETY: forwarded contract; the element size is 4 and the destination is
            // contiguous, as `sse2::line4` requires.
            return unsafe { sse2::line4(n, dst, src, src_step) };
        }
        let _ = (n, dst, dst_step, src, src_step);
        0
    }

    #[inline(always)]
    fn bytes(self) -> usize {
        N
    }

    #[inline(always)]
    unsafe fn copy(self, dst: *mut u8, src: *const u8) {
        // SAFETY: the caller guarantees `N` readable bytes at `src`, `N` writable bytes at
        // `dst`, no overlap; unaligned accesses have no alignment requirement.
        unsafe {
            dst.cast::<[u8; N]>()
                .write_unaligned(src.cast::<[u8; N]>().read_unaligned())
        }
    }

    #[inline(always)]
    unsafe fn transpose4(self, dst: *mut u8, dst_row: isize, src: *const u8, src_col: isize) {
        #[cfg(target_arch = "x86_64")]
        if N == 4 || N == 8 {
            // SAFETY: forwarded contract; `N` selects the matching lane width.
            unsafe { sse2::transpose4(N, dst, dst_row, src, src_col) };
            return;
        }
        let n = N as isize;
        for i in 0..4isize {
            let d = dst.wrapping_offset(dst_row.wrapping_mul(i));
            let s = src.wrapping_offset(n * i);
            // SAFETY: row `i` of the block (forwarded).
            unsafe { line(self, 4, d, n, s, src_col) };
        }
    }
}

/// 4 × 4 block transposes with SSE2 (part of the x86_64 baseline, so always available).
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_castps_si128, _mm_castsi128_ps, _mm_loadu_si128, _mm_shuffle_epi32,
        _mm_shuffle_ps, _mm_storeu_si128, _mm_unpackhi_epi32, _mm_unpackhi_epi64,
        _mm_unpacklo_epi32, _mm_unpacklo_epi64,
    };

    /// The leading part of a line of 4-byte elements `src_step` bytes apart copied to a
    /// contiguous destination, 16 bytes per store, for the two steps that have a fast path;
    /// returns how many elements were copied (a multiple of 4; 0 for other steps).
    ///
    /// - `src_step == 8` (every other element, e.g. a step-2 view of f32): two 16-byte loads
    ///   and one shuffle per four elements. The loads also read the four-byte gap after each
    ///   element; only groups followed by at least one more element of the line are done
    ///   this way, so every byte read lies between two elements of the line, inside the
    ///   tensor's byte span. The gap bytes are read, never written, and discarded.
    /// - `src_step == -4` (a reversed axis): one 16-byte load and one shuffle per four
    ///   elements; only element bytes are read.
    ///
    /// Bit patterns move unchanged (`_mm_shuffle_ps` only selects lanes).
    ///
    /// # Safety
    /// As [`super::line`] with 4-byte elements and `dst_step == 4`; for `src_step == 8`
    /// also: the bytes between two elements of the line are readable (they are, in a
    /// tensor's byte span, which one allocation holds) and not written concurrently.
    #[inline(always)]
    pub(super) unsafe fn line4(n: usize, dst: *mut u8, src: *const u8, src_step: isize) -> usize {
        let mut k = 0;
        // SAFETY: each load and store below lies in the bytes described in the doc comment;
        // SSE2 is enabled on every x86_64 target; the shuffles touch registers only.
        unsafe {
            if src_step == 8 {
                while k + 5 <= n {
                    let s = src.add(8 * k);
                    let a = _mm_castsi128_ps(_mm_loadu_si128(s.cast::<__m128i>()));
                    let b = _mm_castsi128_ps(_mm_loadu_si128(s.add(16).cast::<__m128i>()));
                    let v = _mm_castps_si128(_mm_shuffle_ps::<0b10_00_10_00>(a, b));
                    _mm_storeu_si128(dst.add(4 * k).cast::<__m128i>(), v);
                    k += 4;
                }
            } else if src_step == -4 {
                while k + 4 <= n {
                    // Elements k + 3 … k, ascending in memory.
                    let s = src.wrapping_offset(-4 * (k as isize + 3));
                    let v = _mm_loadu_si128(s.cast::<__m128i>());
                    let v = _mm_shuffle_epi32::<0b00_01_10_11>(v);
                    _mm_storeu_si128(dst.add(4 * k).cast::<__m128i>(), v);
                    k += 4;
                }
            }
        }
        k
    }

    /// [`super::Copier::transpose4`] for elements of `n` = 4 or 8 bytes.
    ///
    /// # Safety
    /// As [`super::Copier::transpose4`]; `n` is 4 or 8.
    #[inline(always)]
    pub(super) unsafe fn transpose4(
        n: usize,
        dst: *mut u8,
        dst_row: isize,
        src: *const u8,
        src_col: isize,
    ) {
        let col = |j: isize, half: usize| {
            src.wrapping_offset(src_col.wrapping_mul(j))
                .wrapping_add(16 * half)
        };
        let row = |i: isize, half: usize| {
            dst.wrapping_offset(dst_row.wrapping_mul(i))
                .wrapping_add(16 * half)
        };
        let load = |p: *const u8| {
            // SAFETY: the 16 bytes lie inside one column of the block (source); SSE2 is
            // enabled on every x86_64 target.
            unsafe { _mm_loadu_si128(p.cast::<__m128i>()) }
        };
        let store = |p: *mut u8, v: __m128i| {
            // SAFETY: the 16 bytes lie inside one row of the block (destination).
            unsafe { _mm_storeu_si128(p.cast::<__m128i>(), v) }
        };
        // SAFETY: register-only SSE2 shuffles.
        unsafe {
            if n == 4 {
                let (c0, c1, c2, c3) = (
                    load(col(0, 0)),
                    load(col(1, 0)),
                    load(col(2, 0)),
                    load(col(3, 0)),
                );
                let (t0, t1) = (_mm_unpacklo_epi32(c0, c1), _mm_unpacklo_epi32(c2, c3));
                let (t2, t3) = (_mm_unpackhi_epi32(c0, c1), _mm_unpackhi_epi32(c2, c3));
                store(row(0, 0), _mm_unpacklo_epi64(t0, t1));
                store(row(1, 0), _mm_unpackhi_epi64(t0, t1));
                store(row(2, 0), _mm_unpacklo_epi64(t2, t3));
                store(row(3, 0), _mm_unpackhi_epi64(t2, t3));
            } else {
                for h in 0..2 {
                    let (c0, c1, c2, c3) = (
                        load(col(0, h)),
                        load(col(1, h)),
                        load(col(2, h)),
                        load(col(3, h)),
                    );
                    let i = 2 * h as isize;
                    store(row(i, 0), _mm_unpacklo_epi64(c0, c1));
                    store(row(i, 1), _mm_unpacklo_epi64(c2, c3));
                    store(row(i + 1, 0), _mm_unpackhi_epi64(c0, c1));
                    store(row(i + 1, 1), _mm_unpackhi_epi64(c2, c3));
                }
            }
        }
    }
}

/// An element of any size, in bytes.
#[derive(Debug, Clone, Copy)]
struct Var(usize);

impl Copier for Var {
    #[inline(always)]
    fn bytes(self) -> usize {
        self.0
    }

    #[inline(always)]
    unsafe fn copy(self, dst: *mut u8, src: *const u8) {
        let n = self.0;
        // SAFETY: every move lies inside the `n` bytes the caller vouches for on both sides:
        // chunks start at 0 or end at `n`, and overlap each other only on the same side,
        // which merely writes the same bytes twice.
        unsafe {
            if n >= MEMCPY_MIN_BYTES {
                std::ptr::copy_nonoverlapping(src, dst, n)
            } else if n >= 16 {
                let mut at = 0;
                while at + 16 < n {
                    Fixed::<16>.copy(dst.add(at), src.add(at));
                    at += 16;
                }
                Fixed::<16>.copy(dst.add(n - 16), src.add(n - 16))
            } else if n >= 8 {
                Fixed::<8>.copy(dst, src);
                Fixed::<8>.copy(dst.add(n - 8), src.add(n - 8))
            } else if n >= 4 {
                Fixed::<4>.copy(dst, src);
                Fixed::<4>.copy(dst.add(n - 4), src.add(n - 4))
            } else {
                std::ptr::copy_nonoverlapping(src, dst, n)
            }
        }
    }
}

/// Copies `n` elements `dst_step`/`src_step` bytes apart.
///
/// # Safety
/// Every element address reached is valid on its side, and the sides do not overlap.
#[inline(always)]
unsafe fn line<C: Copier>(
    c: C,
    n: usize,
    dst: *mut u8,
    dst_step: isize,
    src: *const u8,
    src_step: isize,
) {
    // SAFETY: forwarded contract.
    let head = unsafe { c.line_head(n, dst, dst_step, src, src_step) };
    let at = |p: isize| p.wrapping_mul(head as isize);
    let (mut d, mut s) = (
        dst.wrapping_offset(at(dst_step)),
        src.wrapping_offset(at(src_step)),
    );
    for _ in head..n {
        // SAFETY: `d` and `s` are element addresses (forwarded contract).
        unsafe { c.copy(d, s) };
        d = d.wrapping_offset(dst_step);
        s = s.wrapping_offset(src_step);
    }
}

/// Copies the 2-D block spanned by dims `a` × `b` in tiles of `tile` × `tile` elements.
///
/// Inside a tile the inner loop runs along the dim with the smaller destination stride, so
/// stores are sequential (strided stores cost a read-for-ownership per line and were 2–3×
/// slower here than strided loads); successive tiles advance along the other dim, so the
/// source lines of one tile are next to those of the previous one.
///
/// # Safety
/// As [`line`], for every element of the block.
#[inline(always)]
unsafe fn tiles<C: Copier>(c: C, a: Dim, b: Dim, tile: usize, dst: *mut u8, src: *const u8) {
    let (row, col) = if b.dst.unsigned_abs() <= a.dst.unsigned_abs() {
        (a, b)
    } else {
        (b, a)
    };
    let at = |p: isize, i: usize| p.wrapping_mul(i as isize);
    let mut c0 = 0;
    while c0 < col.n {
        let cn = tile.min(col.n - c0);
        let mut r0 = 0;
        while r0 < row.n {
            let rn = tile.min(row.n - r0);
            let d = dst.wrapping_offset(at(row.dst, r0).wrapping_add(at(col.dst, c0)));
            let s = src.wrapping_offset(at(row.src, r0).wrapping_add(at(col.src, c0)));
            // SAFETY: the tile `(r0.., c0..)` lies inside the block (forwarded).
            unsafe { tile_body(c, Dim { n: rn, ..row }, Dim { n: cn, ..col }, d, s) };
            r0 += tile;
        }
        c0 += tile;
    }
}

/// Copies one tile, `row` × `col` (extents are the tile's), rows outer. When rows are
/// contiguous in the source and columns in the destination (a transpose of dense data),
/// 4 × 4 blocks move through registers: four loads, a shuffle, four stores.
///
/// # Safety
/// As [`line`], for every element of the tile.
#[inline(always)]
unsafe fn tile_body<C: Copier>(c: C, row: Dim, col: Dim, dst: *mut u8, src: *const u8) {
    let n = c.bytes() as isize;
    let at = |p: isize, i: usize| p.wrapping_mul(i as isize);
    let mut r = 0;
    if row.src == n && col.dst == n && C::BLOCKS {
        while r + 4 <= row.n {
            let (d, s) = (
                dst.wrapping_offset(at(row.dst, r)),
                src.wrapping_offset(at(n, r)),
            );
            let mut k = 0;
            while k + 4 <= col.n {
                let (dk, sk) = (
                    d.wrapping_offset(at(n, k)),
                    s.wrapping_offset(at(col.src, k)),
                );
                // SAFETY: rows `r..r + 4` × columns `k..k + 4` lie inside the tile.
                unsafe { c.transpose4(dk, row.dst, sk, col.src) };
                k += 4;
            }
            for i in r..r + 4 {
                let d = dst.wrapping_offset(at(row.dst, i).wrapping_add(at(n, k)));
                let s = src.wrapping_offset(at(n, i).wrapping_add(at(col.src, k)));
                // SAFETY: row `i`, columns `k..col.n` lie inside the tile.
                unsafe { line(c, col.n - k, d, n, s, col.src) };
            }
            r += 4;
        }
    }
    for i in r..row.n {
        let (d, s) = (
            dst.wrapping_offset(at(row.dst, i)),
            src.wrapping_offset(at(row.src, i)),
        );
        // SAFETY: row `i` lies inside the tile.
        unsafe { line(c, col.n, d, col.dst, s, col.src) };
    }
}

/// Runs the copy: the innermost one or two dims (two when `tiled`) by a kernel, the others by
/// an odometer.
///
/// # Safety
/// As [`Job::run`].
unsafe fn drive<C: Copier>(c: C, dims: &[Dim], tiled: bool, dst: *mut u8, src: *const u8) {
    let k = if tiled { 2 } else { dims.len().min(1) };
    let (outer, inner) = dims.split_at(dims.len().saturating_sub(k));
    let tile = tile_elems(c.bytes());
    let body = |d: *mut u8, s: *const u8| {
        // SAFETY: `d`/`s` are the first element of one kernel block (forwarded contract).
        unsafe {
            match *inner {
                [a, b] => tiles(c, a, b, tile, d, s),
                [b] => line(c, b.n, d, b.dst, s, b.src),
                _ => c.copy(d, s),
            }
        }
    };
    odometer(outer, dst, src, body);
}

/// Calls `body` with the first element of every block of the `outer` dims, in row-major
/// order, by adding each dim's stride and rewinding it by `stride × (extent − 1)` on wrap.
/// The pointers are only formed (wrapping), never read: `body` does the accesses.
fn odometer(outer: &[Dim], dst: *mut u8, src: *const u8, mut body: impl FnMut(*mut u8, *const u8)) {
    let mut index = vec![0usize; outer.len()];
    let (mut d, mut s) = (dst, src);
    loop {
        body(d, s);
        let mut k = outer.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            let dim = outer[k];
            if index[k] + 1 < dim.n {
                index[k] += 1;
                d = d.wrapping_offset(dim.dst);
                s = s.wrapping_offset(dim.src);
                break;
            }
            let back = (dim.n - 1) as isize;
            index[k] = 0;
            d = d.wrapping_offset(dim.dst.wrapping_mul(back).wrapping_neg());
            s = s.wrapping_offset(dim.src.wrapping_mul(back).wrapping_neg());
        }
    }
}

#[cfg(test)]
#[path = "kernels_tests.rs"]
mod tests;
