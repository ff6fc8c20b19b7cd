//! Where a case's tensors are placed: on which memory each rank's send and receive tensors
//! live ([`Placement`], from `--device`; the device part of case names), how far past an
//! aligned address every tensor starts and through which DLPack field ([`Offset`], from
//! `--offset`; the last part of case names), and the guarded byte buffer an offset tensor's
//! storage sits in ([`Frame`]).
//!
//! **Placements.** `--device cpu` (and the other single memories) puts every tensor of every
//! rank on that memory, as before; `--device SEND:RECV` puts the send tensors on one and the
//! receive tensors on the other (a case that has one buffer per rank, the in-place
//! all-reduce and the broadcast, places it as a receive buffer); `--device mpich-all` is
//! MPICH's `-memtype=all` (its `test/mpi/testlist.gpu`: "even processes iterate every memory
//! type, odd processes on device"): a case per memory, even ranks' tensors on it, odd ranks'
//! on `cuda`.
//!
//! **Offsets.** An offset of `k` bytes starts each send and receive tensor's storage `k`
//! bytes past a 4096-byte aligned address (CUDA device memory: past its allocation, which
//! `cuMemAlloc` aligns to at least 256 bytes), in two forms, each its own case: `b`, as the
//! DLPack header asks, `data` the aligned address and `byte_offset` `k` (plus the first
//! element's place in the storage: the negative layout's last element); `p`, as NumPy,
//! PyTorch and CuPy export, `data` itself shifted by `k` and `byte_offset` only the first
//! element's place (NumPy points `data` at the first element, `byte_offset` 0). Guard bytes
//! fill the rest of the buffer, before and after the storage, and must be found unchanged.

use super::args::{DeviceChoice, OffsetArg};
use crate::launch::{Dev, DEVS};

/// The alignment an offset counts from (bytes): a page of the usual size, so that the
/// offsets `PAGE - 1` and `PAGE + 1` put a tensor across a page boundary.
pub(super) const PAGE: usize = 4096;

/// `--offset all`: every offset below an 8-byte element's size, and a page ± 1.
pub(super) const ALL_OFFSETS: [u64; 9] = [1, 2, 3, 4, 5, 6, 7, PAGE as u64 - 1, PAGE as u64 + 1];

/// Guard bytes after an offset tensor's storage (at least one element of every dtype).
const TAIL: usize = 64;

/// The value of every guard byte around an offset tensor's storage.
pub(super) const GUARD: u8 = 0xA5;

/// Where the tensors of a case live, on every rank (the device part of its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placement {
    /// Every tensor on one memory: `cpu`.
    Same(Dev),
    /// Send tensors on `send`, receive tensors (and the one buffer of an in-place case) on
    /// `recv`, on every rank: `cpu:cuda`.
    Split { send: Dev, recv: Dev },
    /// MPICH's `-memtype=all`: even ranks' tensors on `even`, odd ranks' on `odd`:
    /// `even-cpu+odd-cuda`.
    Parity { even: Dev, odd: Dev },
}

impl Placement {
    /// The device part of case names.
    pub(super) fn name(self) -> String {
        match self {
            Placement::Same(d) => d.name().to_string(),
            Placement::Split { send, recv } => format!("{}:{}", send.name(), recv.name()),
            Placement::Parity { even, odd } => {
                format!("even-{}+odd-{}", even.name(), odd.name())
            }
        }
    }

    /// The memories it uses, each once, in name order.
    pub(super) fn devices(self) -> Vec<Dev> {
        let (a, b) = match self {
            Placement::Same(d) => (d, d),
            Placement::Split { send, recv } => (send, recv),
            Placement::Parity { even, odd } => (even, odd),
        };
        if a == b {
            vec![a]
        } else {
            vec![a, b]
        }
    }

    /// Whether a rank needs the GPU runtime for it.
    pub(super) fn needs_runtime(self) -> bool {
        self.devices().iter().any(|d| d.needs_runtime())
    }

    /// Rank `r`'s memories: of its send tensors and of its receive tensors.
    pub(super) fn on_rank(self, r: i32) -> (Dev, Dev) {
        match self {
            Placement::Same(d) => (d, d),
            Placement::Split { send, recv } => (send, recv),
            Placement::Parity { even, .. } if r % 2 == 0 => (even, even),
            Placement::Parity { odd, .. } => (odd, odd),
        }
    }

    /// The transport part of case names: each memory's (`part`: `host`, `managed`,
    /// `direct`, `staged`), in name order, each once, joined by `+` (`cpu:cuda` →
    /// `host+staged`).
    pub(super) fn transport(self, part: impl Fn(Dev) -> &'static str) -> String {
        let mut parts: Vec<&str> = Vec::new();
        for d in self.devices() {
            if !parts.contains(&part(d)) {
                parts.push(part(d));
            }
        }
        parts.join("+")
    }

    /// The placements of a `--device` choice, in the order the matrix runs them.
    pub(super) fn of_choice(choice: DeviceChoice) -> Vec<Placement> {
        let side = |s: Option<Dev>| s.map_or_else(|| DEVS.to_vec(), |d| vec![d]);
        match choice {
            DeviceChoice::One(arg) => arg.devices().into_iter().map(Placement::Same).collect(),
            DeviceChoice::Pair(send, recv) => side(send)
                .into_iter()
                .flat_map(|s| {
                    side(recv).into_iter().map(move |r| match s == r {
                        true => Placement::Same(s),
                        false => Placement::Split { send: s, recv: r },
                    })
                })
                .collect(),
            DeviceChoice::MpichAll => DEVS
                .iter()
                .map(|&even| Placement::Parity {
                    even,
                    odd: Dev::Cuda,
                })
                .collect(),
        }
    }
}

/// How an offset tensor's offset reaches DLPack (the last letter of the name part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// `b`: `data` aligned, the offset in `byte_offset`.
    ByteOffset,
    /// `p`: `data` itself shifted by the offset.
    Pointer,
}

/// How far past an aligned address a case's tensors start (`bytes` 0: today's tensors,
/// aligned for their element type, and no name part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Offset {
    pub bytes: u64,
    pub form: Form,
}

impl Offset {
    /// No offset: the tensors of a case without `--offset`.
    pub(super) const NONE: Offset = Offset {
        bytes: 0,
        form: Form::ByteOffset,
    };

    /// Whether the tensors start at an offset (then they sit in a [`Frame`]).
    pub(super) fn is_some(self) -> bool {
        self.bytes > 0
    }

    /// The last part of case names: `off3b`, `off3p`; `None` without an offset.
    pub(super) fn name_part(self) -> Option<String> {
        let letter = match self.form {
            Form::ByteOffset => 'b',
            Form::Pointer => 'p',
        };
        self.is_some().then(|| format!("off{}{letter}", self.bytes))
    }

    /// As two integers, for rank 0's broadcast of the case list.
    pub(super) fn encode(self) -> [i64; 2] {
        [self.bytes as i64, i64::from(self.form == Form::Pointer)]
    }

    /// The offset [`Offset::encode`] made.
    pub(super) fn decode([bytes, form]: [i64; 2]) -> Offset {
        Offset {
            bytes: bytes.max(0) as u64,
            form: if form == 1 {
                Form::Pointer
            } else {
                Form::ByteOffset
            },
        }
    }

    /// The offsets of `--offset`, in its order, each once: 0 as [`Offset::NONE`], any
    /// other in both forms (`b` first).
    pub(super) fn of_args(args: &[OffsetArg]) -> Vec<Offset> {
        let mut bytes: Vec<u64> = Vec::new();
        for a in args {
            let more = match a {
                OffsetArg::Bytes(b) => vec![*b],
                OffsetArg::All => ALL_OFFSETS.to_vec(),
            };
            for b in more {
                if !bytes.contains(&b) {
                    bytes.push(b);
                }
            }
        }
        bytes
            .into_iter()
            .flat_map(|b| match b {
                0 => vec![Offset::NONE],
                _ => [Form::ByteOffset, Form::Pointer]
                    .map(|form| Offset { bytes: b, form })
                    .to_vec(),
            })
            .collect()
    }
}

/// What one rank's tensors of a case are placed as: its send and receive memories, the
/// case's offset, its rank, and whether any rank of the case uses GPU memory.
#[derive(Debug, Clone, Copy)]
pub(super) struct Here {
    pub send: Dev,
    pub recv: Dev,
    pub offset: Offset,
    pub rank: i32,
    /// The case's placement needs the GPU runtime on some rank (then every rank takes the
    /// `DeviceComm` forms where the host ones differ, as `isend-irecv` does).
    pub device_case: bool,
}

impl Here {
    /// Rank `rank`'s placement of a case placed as `place` at `offset`.
    pub(super) fn of(place: Placement, offset: Offset, rank: i32) -> Here {
        let (send, recv) = place.on_rank(rank);
        Here {
            send,
            recv,
            offset,
            rank,
            device_case: place.needs_runtime(),
        }
    }

    /// The memory of this rank's receive (`recv`) or send tensors.
    pub(super) fn dev(&self, recv: bool) -> Dev {
        if recv {
            self.recv
        } else {
            self.send
        }
    }
}

/// An offset tensor's storage of `len` bytes in a byte buffer of `total` bytes: `pad` bytes
/// to the first [`PAGE`]-aligned address (0 on CUDA device memory: its allocation's own
/// alignment), `offset` more, the storage, and guard bytes ([`GUARD`]) in all the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frame {
    pub pad: usize,
    pub offset: usize,
    pub len: usize,
    pub total: usize,
    /// The rank whose tensor it is (for a written guard's message).
    pub rank: i32,
}

impl Frame {
    /// The buffer's size for `len` storage bytes at `offset`: room for any `pad`, and a
    /// whole number of `elem_bytes`-byte elements (so it can be exported as the dtype).
    pub(super) fn total(len: usize, offset: u64, elem_bytes: usize) -> usize {
        let bytes = PAGE + offset as usize + len + TAIL;
        bytes.div_ceil(elem_bytes.max(1)) * elem_bytes.max(1)
    }

    /// The frame of a buffer of `total` bytes ([`Frame::total`]) whose first byte is at
    /// `address` (0: take it as aligned).
    pub(super) fn at(address: usize, len: usize, offset: u64, total: usize, rank: i32) -> Frame {
        Frame {
            pad: (PAGE - address % PAGE) % PAGE,
            offset: offset as usize,
            len,
            total,
            rank,
        }
    }

    /// Where the storage starts in the buffer.
    pub(super) fn start(&self) -> usize {
        self.pad + self.offset
    }

    /// The exported tensor's `data` (bytes into the buffer) and `byte_offset` in `form`,
    /// for a first element `first_bytes` into the storage.
    pub(super) fn view(&self, form: Form, first_bytes: u64) -> (usize, u64) {
        match form {
            Form::ByteOffset => (self.pad, self.offset as u64 + first_bytes),
            Form::Pointer => (self.start(), first_bytes),
        }
    }

    /// `buffer` (of [`Frame::total`] bytes) as guard bytes around `storage`.
    pub(super) fn fill(&self, buffer: &mut [u8], storage: &[u8]) {
        buffer.fill(GUARD);
        buffer[self.start()..self.start() + self.len].copy_from_slice(storage);
    }

    /// The storage in `buffer`, once every guard byte is found unchanged.
    ///
    /// # Errors
    /// The first written guard byte, in words (a failure's message).
    pub(super) fn take<'b>(&self, buffer: &'b [u8]) -> Result<&'b [u8], String> {
        let (start, end) = (self.start(), self.start() + self.len);
        if buffer.len() < end {
            return Err(format!(
                "rank {}: read back {} bytes of an offset tensor's buffer, expected {}",
                self.rank,
                buffer.len(),
                self.total
            ));
        }
        // The written guard byte nearest the storage, before it, else after it.
        let before = (0..start).rev().find(|&i| buffer[i] != GUARD);
        let after = (end..buffer.len()).find(|&i| buffer[i] != GUARD);
        let hit = match (before, after) {
            (Some(i), _) => Some((i, start - i, "before its first byte")),
            (None, Some(i)) => Some((i, i + 1 - end, "after its last byte")),
            (None, None) => None,
        };
        if let Some((at, k, place)) = hit {
            return Err(format!(
                "rank {}: a guard byte {k} byte{} {place} (storage at offset {} past an \
                 aligned address) was written: expected {GUARD:#04x}, got {:#04x}",
                self.rank,
                if k == 1 { "" } else { "s" },
                self.offset,
                buffer[at]
            ));
        }
        Ok(&buffer[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::DeviceArg;

    #[test]
    fn names_of_placements_and_offsets() {
        assert_eq!(Placement::Same(Dev::Cpu).name(), "cpu");
        let split = Placement::Split {
            send: Dev::Cpu,
            recv: Dev::CudaHost,
        };
        assert_eq!(split.name(), "cpu:cuda-host");
        let parity = Placement::Parity {
            even: Dev::CudaManaged,
            odd: Dev::Cuda,
        };
        assert_eq!(parity.name(), "even-cuda-managed+odd-cuda");
        assert_eq!(parity.on_rank(0), (Dev::CudaManaged, Dev::CudaManaged));
        assert_eq!(parity.on_rank(3), (Dev::Cuda, Dev::Cuda));
        let part = |d: Dev| if d == Dev::Cuda { "staged" } else { "host" };
        assert_eq!(split.transport(part), "host");
        assert_eq!(parity.transport(part), "host+staged");
        let off = |bytes, form| Offset { bytes, form };
        assert_eq!(
            off(3, Form::ByteOffset).name_part().as_deref(),
            Some("off3b")
        );
        assert_eq!(
            off(4097, Form::Pointer).name_part().as_deref(),
            Some("off4097p")
        );
        assert_eq!(Offset::NONE.name_part(), None);
        for o in [
            off(7, Form::Pointer),
            off(1, Form::ByteOffset),
            Offset::NONE,
        ] {
            assert_eq!(Offset::decode(o.encode()), o);
        }
    }

    #[test]
    fn choices_expand_to_placements() {
        use DeviceChoice as C;
        assert_eq!(
            Placement::of_choice(C::One(DeviceArg::Cuda)),
            [Placement::Same(Dev::Cuda)]
        );
        assert_eq!(Placement::of_choice(C::One(DeviceArg::All)).len(), 4);
        let pairs = Placement::of_choice(C::Pair(None, None));
        assert_eq!(pairs.len(), 16);
        assert_eq!(pairs.iter().filter(|p| p.devices().len() == 1).count(), 4);
        assert_eq!(
            Placement::of_choice(C::Pair(Some(Dev::Cuda), Some(Dev::Cpu))),
            [Placement::Split {
                send: Dev::Cuda,
                recv: Dev::Cpu
            }]
        );
        let mpich = Placement::of_choice(C::MpichAll);
        assert_eq!(mpich.len(), 4);
        assert!(mpich.iter().all(|p| p.on_rank(1) == (Dev::Cuda, Dev::Cuda)));
        let evens: Vec<Dev> = mpich.iter().map(|p| p.on_rank(2).0).collect();
        assert_eq!(evens, DEVS);
    }

    #[test]
    fn offsets_of_the_arguments() {
        let o = Offset::of_args(&[OffsetArg::Bytes(0), OffsetArg::Bytes(3), OffsetArg::All]);
        assert_eq!(o[0], Offset::NONE);
        assert_eq!(o.len(), 1 + 2 * 9);
        let named: Vec<String> = o.iter().filter_map(|o| o.name_part()).collect();
        assert_eq!(named[..4], ["off3b", "off3p", "off1b", "off1p"]);
        assert!(named.contains(&"off4095b".to_string()) && named.contains(&"off4097p".into()));
    }

    /// The frame puts the storage `offset` bytes past the aligned address, the two forms
    /// export it from there, and a written guard byte is named with its distance.
    #[test]
    fn frames_place_and_guard_the_storage() {
        let total = Frame::total(12, 3, 8);
        assert_eq!(total % 8, 0);
        let f = Frame::at(0x1000 + 10, 12, 3, total, 1);
        assert_eq!((f.pad, f.start()), (4086, 4089));
        assert_eq!(f.view(Form::ByteOffset, 8), (4086, 11));
        assert_eq!(f.view(Form::Pointer, 8), (4089, 8));
        let mut buf = vec![0u8; total];
        let storage: Vec<u8> = (1..=12).collect();
        f.fill(&mut buf, &storage);
        assert_eq!(f.take(&buf), Ok(&storage[..]));
        buf[f.start() - 2] = 0;
        let err = f.take(&buf).unwrap_err();
        assert!(
            err.starts_with("rank 1: a guard byte 2 bytes before its first byte"),
            "{err}"
        );
        buf[f.start() - 2] = GUARD;
        buf[f.start() + 12] = 7;
        let err = f.take(&buf).unwrap_err();
        assert!(
            err.contains("guard byte 1 byte after its last byte"),
            "{err}"
        );
        assert!(err.ends_with("got 0x07"), "{err}");
        assert_eq!(Frame::at(0, 12, 3, total, 0).pad, 0);
    }
}
