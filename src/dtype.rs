//! DLPack dtype → MPI element type, as a table.
//!
//! DLPack describes an element by `DLDataType { code, bits, lanes }` (dlpack.h, `DLDataType`
//! and `DLDataTypeCode`). This module maps each `(code, bits)` to one MPI predefined datatype
//! of **exactly** the element's size (MPI-4.1 §3.2.2, Table 3.2 for C types), and records
//! which reductions (MPI-4.1 §6.9.2) are correct for it:
//!
//! | DLPack `(code, bits)` | MPI datatype | reductions |
//! |---|---|---|
//! | Int (0) 8/16/32/64 | `MPI_INT{8,16,32,64}_T` | sum, prod, min, max, land, lor, lxor, band, bor, bxor |
//! | UInt (1) 8/16/32/64 | `MPI_UINT{8,16,32,64}_T` | same as Int |
//! | Float (2) 32/64 | `MPI_FLOAT`, `MPI_DOUBLE` | sum, prod, min, max |
//! | Float (2) 16 | `MPI_UINT16_T` (bits) | sum, prod, min, max through user-defined ops ([`crate::comm::halfops`]) |
//! | Bfloat (4) 16 | `MPI_UINT16_T` (bits) | sum, prod, min, max through user-defined ops |
//! | Complex (5) 64/128 | `MPI_C_FLOAT_COMPLEX`, `MPI_C_DOUBLE_COMPLEX` | sum, prod |
//! | Complex (5) 32 (complex half) | `MPI_UINT32_T` (transfer only) | none |
//! | Bool (6) 8 | `MPI_C_BOOL` | land, lor, lxor |
//! | Float8 family (7–14) 8 | `MPI_UINT8_T` (transfer only) | none |
//! | Bcomplex (18) 32 | `MPI_UINT32_T` (transfer only) | none |
//!
//! Refused with [`Error::UnsupportedDtype`]: the opaque handle (3), Float 128 (no MPI type is
//! guaranteed to match IEEE binary128), sub-byte types (Float6/Float4, codes 15–17, or any
//! `bits` not a multiple of 8: DLPack packs them, so an element has no byte address), `lanes
//! == 0`, and unknown codes.
//!
//! **Lanes** (C33, decided): a dtype with `lanes = L > 1` is a vector of `L` scalars stored
//! contiguously (dlpack.h: "float4(vectorized 4 float): type_code = 2, bits = 32, lanes = 4").
//! It is sent as `L` MPI units per element, so a transfer moves whole vectors and an
//! element-wise reduction reduces lane by lane, which is the meaning of vector arithmetic.
//! All counts in this crate's public API stay in DLPack elements; only
//! [`mpi::datatype::Collection::count`] on a spec is in MPI units (elements × lanes).

use std::fmt;

use mpi::collective::SystemOperation;
use mpi::datatype::{DatatypeRef, Equivalence};
use num_complex::{Complex32, Complex64};

use crate::error::{Error, Result};

/// DLPack type codes (`DLDataTypeCode`, dlpack.h v1.3).
pub mod code {
    /// Signed integer.
    pub const INT: u8 = 0;
    /// Unsigned integer.
    pub const UINT: u8 = 1;
    /// IEEE floating point.
    pub const FLOAT: u8 = 2;
    /// Opaque handle (never transferable).
    pub const OPAQUE_HANDLE: u8 = 3;
    /// bfloat16.
    pub const BFLOAT: u8 = 4;
    /// Complex (two floats of `bits / 2` each).
    pub const COMPLEX: u8 = 5;
    /// Boolean, stored in 8 bits.
    pub const BOOL: u8 = 6;
    /// First of the float8 codes (`kDLFloat8_e3m4`).
    pub const FLOAT8_FIRST: u8 = 7;
    /// Last of the float8 codes (`kDLFloat8_e8m0fnu`).
    pub const FLOAT8_LAST: u8 = 14;
    /// `kDLFloat6_e2m3fn`.
    pub const FLOAT6_E2M3FN: u8 = 15;
    /// `kDLFloat6_e3m2fn`.
    pub const FLOAT6_E3M2FN: u8 = 16;
    /// `kDLFloat4_e2m1fn`.
    pub const FLOAT4_E2M1FN: u8 = 17;
    /// Complex of two bfloat16 (`kDLBcomplex`).
    pub const BCOMPLEX: u8 = 18;
}

/// A DLPack dtype, `DLDataType { code, bits, lanes }`, comparable and printable
/// (`float32`, `int64x4`, `code99_bits8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType {
    /// `DLDataType::code` (see [`code`]).
    pub code: u8,
    /// `DLDataType::bits`: bits per lane.
    pub bits: u8,
    /// `DLDataType::lanes`: scalars per element.
    pub lanes: u16,
}

impl DType {
    /// A dtype with one lane.
    pub const fn new(code: u8, bits: u8) -> Self {
        DType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// The same dtype with `lanes` lanes.
    pub const fn with_lanes(self, lanes: u16) -> Self {
        DType { lanes, ..self }
    }

    /// Size of one element in bytes (`bits × lanes / 8`), or `None` for sub-byte or zero
    /// sizes.
    pub fn size_bytes(self) -> Option<usize> {
        if self.bits == 0 || self.bits % 8 != 0 || self.lanes == 0 {
            return None;
        }
        Some(usize::from(self.bits / 8) * usize::from(self.lanes))
    }

    /// The dtype's name without lanes (`float32`, `bool`, …), `None` for unknown dtypes.
    pub(crate) fn base_name(self) -> Option<&'static str> {
        Some(match (self.code, self.bits) {
            (code::INT, 8) => "int8",
            (code::INT, 16) => "int16",
            (code::INT, 32) => "int32",
            (code::INT, 64) => "int64",
            (code::UINT, 8) => "uint8",
            (code::UINT, 16) => "uint16",
            (code::UINT, 32) => "uint32",
            (code::UINT, 64) => "uint64",
            (code::FLOAT, 16) => "float16",
            (code::FLOAT, 32) => "float32",
            (code::FLOAT, 64) => "float64",
            (code::FLOAT, 128) => "float128",
            (code::BFLOAT, 16) => "bfloat16",
            (code::COMPLEX, 32) => "complex32",
            (code::COMPLEX, 64) => "complex64",
            (code::COMPLEX, 128) => "complex128",
            (code::BOOL, 8) => "bool",
            (7, 8) => "float8_e3m4",
            (8, 8) => "float8_e4m3",
            (9, 8) => "float8_e4m3b11fnuz",
            (10, 8) => "float8_e4m3fn",
            (11, 8) => "float8_e4m3fnuz",
            (12, 8) => "float8_e5m2",
            (13, 8) => "float8_e5m2fnuz",
            (14, 8) => "float8_e8m0fnu",
            (code::FLOAT6_E2M3FN, 6) => "float6_e2m3fn",
            (code::FLOAT6_E3M2FN, 6) => "float6_e3m2fn",
            (code::FLOAT4_E2M1FN, 4) => "float4_e2m1fn",
            (code::BCOMPLEX, 32) => "bcomplex32",
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.base_name() {
            Some(n) => f.write_str(n)?,
            None => write!(f, "code{}_bits{}", self.code, self.bits)?,
        }
        if self.lanes != 1 {
            write!(f, "x{}", self.lanes)?;
        }
        Ok(())
    }
}

impl From<dlpack_rs::ffi::DLDataType> for DType {
    fn from(d: dlpack_rs::ffi::DLDataType) -> Self {
        DType {
            code: d.code,
            bits: d.bits,
            lanes: d.lanes,
        }
    }
}

impl From<DType> for dlpack_rs::ffi::DLDataType {
    fn from(d: DType) -> Self {
        dlpack_rs::ffi::DLDataType {
            code: d.code,
            bits: d.bits,
            lanes: d.lanes,
        }
    }
}

/// An MPI reduction operation (MPI-4.1 §6.9.2, predefined reduction operations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `MPI_SUM`.
    Sum,
    /// `MPI_PROD`.
    Product,
    /// `MPI_MIN`.
    Min,
    /// `MPI_MAX`.
    Max,
    /// `MPI_LAND`.
    LogicalAnd,
    /// `MPI_LOR`.
    LogicalOr,
    /// `MPI_LXOR`.
    LogicalXor,
    /// `MPI_BAND`.
    BitwiseAnd,
    /// `MPI_BOR`.
    BitwiseOr,
    /// `MPI_BXOR`.
    BitwiseXor,
}

impl ReduceOp {
    /// Every reduction, in table order.
    pub const ALL: [ReduceOp; 10] = [
        ReduceOp::Sum,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::LogicalAnd,
        ReduceOp::LogicalOr,
        ReduceOp::LogicalXor,
        ReduceOp::BitwiseAnd,
        ReduceOp::BitwiseOr,
        ReduceOp::BitwiseXor,
    ];

    const fn bit(self) -> u16 {
        1 << (self as u16)
    }

    /// Short lower-case name (`sum`, `prod`, `min`, `max`, `land`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Product => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::LogicalAnd => "land",
            ReduceOp::LogicalOr => "lor",
            ReduceOp::LogicalXor => "lxor",
            ReduceOp::BitwiseAnd => "band",
            ReduceOp::BitwiseOr => "bor",
            ReduceOp::BitwiseXor => "bxor",
        }
    }

    /// The rsmpi predefined operation.
    pub fn system_operation(self) -> SystemOperation {
        match self {
            ReduceOp::Sum => SystemOperation::sum(),
            ReduceOp::Product => SystemOperation::product(),
            ReduceOp::Min => SystemOperation::min(),
            ReduceOp::Max => SystemOperation::max(),
            ReduceOp::LogicalAnd => SystemOperation::logical_and(),
            ReduceOp::LogicalOr => SystemOperation::logical_or(),
            ReduceOp::LogicalXor => SystemOperation::logical_xor(),
            ReduceOp::BitwiseAnd => SystemOperation::bitwise_and(),
            ReduceOp::BitwiseOr => SystemOperation::bitwise_or(),
            ReduceOp::BitwiseXor => SystemOperation::bitwise_xor(),
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`ReduceOp`]s, as a bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reductions(u16);

impl Reductions {
    /// No reduction (transfer-only types).
    pub const NONE: Reductions = Reductions(0);
    /// Arithmetic, ordering, logical and bitwise: C integer types (MPI-4.1 §6.9.2).
    pub const INTEGER: Reductions = Reductions(
        ReduceOp::Sum.bit()
            | ReduceOp::Product.bit()
            | ReduceOp::Min.bit()
            | ReduceOp::Max.bit()
            | ReduceOp::LogicalAnd.bit()
            | ReduceOp::LogicalOr.bit()
            | ReduceOp::LogicalXor.bit()
            | ReduceOp::BitwiseAnd.bit()
            | ReduceOp::BitwiseOr.bit()
            | ReduceOp::BitwiseXor.bit(),
    );
    /// Arithmetic and ordering: floating point.
    pub const FLOAT: Reductions = Reductions(
        ReduceOp::Sum.bit() | ReduceOp::Product.bit() | ReduceOp::Min.bit() | ReduceOp::Max.bit(),
    );
    /// Arithmetic only: complex (no ordering).
    pub const COMPLEX: Reductions = Reductions(ReduceOp::Sum.bit() | ReduceOp::Product.bit());
    /// Logical only: `MPI_C_BOOL`.
    pub const LOGICAL: Reductions = Reductions(
        ReduceOp::LogicalAnd.bit() | ReduceOp::LogicalOr.bit() | ReduceOp::LogicalXor.bit(),
    );

    /// Whether `op` is in the set.
    pub const fn contains(self, op: ReduceOp) -> bool {
        self.0 & op.bit() != 0
    }

    /// The members, in [`ReduceOp::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = ReduceOp> {
        ReduceOp::ALL
            .into_iter()
            .filter(move |op| self.contains(*op))
    }
}

impl fmt::Display for Reductions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(ReduceOp::name).collect();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(", "))
        }
    }
}

/// An MPI predefined datatype used as the unit of a DLPack element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MpiUnit {
    /// `MPI_INT8_T`.
    Int8,
    /// `MPI_INT16_T`.
    Int16,
    /// `MPI_INT32_T`.
    Int32,
    /// `MPI_INT64_T`.
    Int64,
    /// `MPI_UINT8_T`.
    Uint8,
    /// `MPI_UINT16_T`.
    Uint16,
    /// `MPI_UINT32_T`.
    Uint32,
    /// `MPI_UINT64_T`.
    Uint64,
    /// `MPI_FLOAT`.
    Float,
    /// `MPI_DOUBLE`.
    Double,
    /// `MPI_C_BOOL`.
    CBool,
    /// `MPI_C_FLOAT_COMPLEX`.
    CFloatComplex,
    /// `MPI_C_DOUBLE_COMPLEX`.
    CDoubleComplex,
}

impl MpiUnit {
    /// The MPI handle (a predefined datatype; valid before `MPI_Init` for Open MPI and MPICH,
    /// used only after it).
    #[inline]
    pub fn datatype(self) -> DatatypeRef<'static> {
        match self {
            MpiUnit::Int8 => i8::equivalent_datatype(),
            MpiUnit::Int16 => i16::equivalent_datatype(),
            MpiUnit::Int32 => i32::equivalent_datatype(),
            MpiUnit::Int64 => i64::equivalent_datatype(),
            MpiUnit::Uint8 => u8::equivalent_datatype(),
            MpiUnit::Uint16 => u16::equivalent_datatype(),
            MpiUnit::Uint32 => u32::equivalent_datatype(),
            MpiUnit::Uint64 => u64::equivalent_datatype(),
            MpiUnit::Float => f32::equivalent_datatype(),
            MpiUnit::Double => f64::equivalent_datatype(),
            MpiUnit::CBool => bool::equivalent_datatype(),
            MpiUnit::CFloatComplex => Complex32::equivalent_datatype(),
            MpiUnit::CDoubleComplex => Complex64::equivalent_datatype(),
        }
    }

    /// Size in bytes the C type has (what `MPI_Type_size` must report).
    #[inline]
    pub const fn size_bytes(self) -> usize {
        // u8 → usize: lossless.
        self.size_bytes_u8() as usize
    }

    /// [`Self::size_bytes`] as a `u8` (at most 16), for lossless conversion to any integer.
    #[inline]
    pub(crate) const fn size_bytes_u8(self) -> u8 {
        match self {
            MpiUnit::Int8 | MpiUnit::Uint8 | MpiUnit::CBool => 1,
            MpiUnit::Int16 | MpiUnit::Uint16 => 2,
            MpiUnit::Int32 | MpiUnit::Uint32 | MpiUnit::Float => 4,
            MpiUnit::Int64 | MpiUnit::Uint64 | MpiUnit::Double | MpiUnit::CFloatComplex => 8,
            MpiUnit::CDoubleComplex => 16,
        }
    }

    /// The MPI name (`MPI_INT32_T`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            MpiUnit::Int8 => "MPI_INT8_T",
            MpiUnit::Int16 => "MPI_INT16_T",
            MpiUnit::Int32 => "MPI_INT32_T",
            MpiUnit::Int64 => "MPI_INT64_T",
            MpiUnit::Uint8 => "MPI_UINT8_T",
            MpiUnit::Uint16 => "MPI_UINT16_T",
            MpiUnit::Uint32 => "MPI_UINT32_T",
            MpiUnit::Uint64 => "MPI_UINT64_T",
            MpiUnit::Float => "MPI_FLOAT",
            MpiUnit::Double => "MPI_DOUBLE",
            MpiUnit::CBool => "MPI_C_BOOL",
            MpiUnit::CFloatComplex => "MPI_C_FLOAT_COMPLEX",
            MpiUnit::CDoubleComplex => "MPI_C_DOUBLE_COMPLEX",
        }
    }
}

/// One row of the table: a DLPack `(code, bits)` and its MPI unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// DLPack type code.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// The MPI predefined type of the same size.
    pub unit: MpiUnit,
    /// Whether the MPI type only carries the bits (no arithmetic meaning for MPI): such a
    /// row's reductions, if any, go through user-defined operations.
    pub transfer_only: bool,
    /// The reductions that are correct for this type.
    pub reductions: Reductions,
}

const fn row(code: u8, bits: u8, unit: MpiUnit, reductions: Reductions) -> Row {
    Row {
        code,
        bits,
        unit,
        transfer_only: false,
        reductions,
    }
}

const fn raw(code: u8, bits: u8, unit: MpiUnit) -> Row {
    Row {
        code,
        bits,
        unit,
        transfer_only: true,
        reductions: Reductions::NONE,
    }
}

/// Half-precision rows: the bits travel as `MPI_UINT16_T`; sum, product, min and max go
/// through user-defined operations ([`crate::comm::halfops`]).
const fn half(code: u8, bits: u8) -> Row {
    Row {
        code,
        bits,
        unit: MpiUnit::Uint16,
        transfer_only: true,
        reductions: Reductions::FLOAT,
    }
}

/// The dtype table (see the module docs). Data, not code: tests walk it.
pub const TABLE: &[Row] = &[
    row(code::INT, 8, MpiUnit::Int8, Reductions::INTEGER),
    row(code::INT, 16, MpiUnit::Int16, Reductions::INTEGER),
    row(code::INT, 32, MpiUnit::Int32, Reductions::INTEGER),
    row(code::INT, 64, MpiUnit::Int64, Reductions::INTEGER),
    row(code::UINT, 8, MpiUnit::Uint8, Reductions::INTEGER),
    row(code::UINT, 16, MpiUnit::Uint16, Reductions::INTEGER),
    row(code::UINT, 32, MpiUnit::Uint32, Reductions::INTEGER),
    row(code::UINT, 64, MpiUnit::Uint64, Reductions::INTEGER),
    half(code::FLOAT, 16),
    row(code::FLOAT, 32, MpiUnit::Float, Reductions::FLOAT),
    row(code::FLOAT, 64, MpiUnit::Double, Reductions::FLOAT),
    half(code::BFLOAT, 16),
    raw(code::COMPLEX, 32, MpiUnit::Uint32),
    row(
        code::COMPLEX,
        64,
        MpiUnit::CFloatComplex,
        Reductions::COMPLEX,
    ),
    row(
        code::COMPLEX,
        128,
        MpiUnit::CDoubleComplex,
        Reductions::COMPLEX,
    ),
    row(code::BOOL, 8, MpiUnit::CBool, Reductions::LOGICAL),
    raw(7, 8, MpiUnit::Uint8),
    raw(8, 8, MpiUnit::Uint8),
    raw(9, 8, MpiUnit::Uint8),
    raw(10, 8, MpiUnit::Uint8),
    raw(11, 8, MpiUnit::Uint8),
    raw(12, 8, MpiUnit::Uint8),
    raw(13, 8, MpiUnit::Uint8),
    raw(14, 8, MpiUnit::Uint8),
    raw(code::BCOMPLEX, 32, MpiUnit::Uint32),
];

/// A dtype resolved against the table: what a spec needs to talk to MPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct ElementType {
    /// The table row of its lane type.
    pub row: &'static Row,
    /// The DLPack dtype.
    pub dtype: DType,
}

impl ElementType {
    /// Size of one DLPack element in bytes (unit size × lanes).
    #[inline]
    pub fn size_bytes(&self) -> usize {
        self.row.unit.size_bytes() * usize::from(self.dtype.lanes)
    }

    /// MPI units per DLPack element (= lanes).
    #[inline]
    pub fn units_per_element(&self) -> usize {
        usize::from(self.dtype.lanes)
    }

    /// [`Self::size_bytes`] as an `i64`, for arithmetic with DLPack's `i64` counts (lossless:
    /// at most 16 bytes × 65 535 lanes).
    #[inline]
    pub(crate) fn size_bytes_i64(&self) -> i64 {
        i64::from(self.row.unit.size_bytes_u8()) * i64::from(self.dtype.lanes)
    }

    /// [`Self::units_per_element`] as an `i64` (lossless: lanes is a `u16`).
    #[inline]
    pub(crate) fn units_per_element_i64(&self) -> i64 {
        i64::from(self.dtype.lanes)
    }

    /// Checks that `op` is correct for this dtype.
    ///
    /// # Errors
    /// [`Error::UnsupportedReduction`] naming the op, the dtype and what it allows.
    #[inline]
    pub fn check_reduction(&self, op: ReduceOp) -> Result<()> {
        if self.row.reductions.contains(op) {
            Ok(())
        } else {
            Err(Error::UnsupportedReduction {
                op,
                dtype: self.dtype,
                allowed: self.row.reductions.to_string(),
            })
        }
    }
}

/// Position of `(code, bits)` in [`TABLE`] (a match, so lookups cost no scan; a unit test
/// checks it against the table).
#[inline]
const fn row_index(code: u8, bits: u8) -> Option<usize> {
    Some(match (code, bits) {
        (code::INT, 8) => 0,
        (code::INT, 16) => 1,
        (code::INT, 32) => 2,
        (code::INT, 64) => 3,
        (code::UINT, 8) => 4,
        (code::UINT, 16) => 5,
        (code::UINT, 32) => 6,
        (code::UINT, 64) => 7,
        (code::FLOAT, 16) => 8,
        (code::FLOAT, 32) => 9,
        (code::FLOAT, 64) => 10,
        (code::BFLOAT, 16) => 11,
        (code::COMPLEX, 32) => 12,
        (code::COMPLEX, 64) => 13,
        (code::COMPLEX, 128) => 14,
        (code::BOOL, 8) => 15,
        (c @ code::FLOAT8_FIRST..=code::FLOAT8_LAST, 8) => 16 + (c - code::FLOAT8_FIRST) as usize,
        (code::BCOMPLEX, 32) => 24,
        _ => return None,
    })
}

/// Resolves a DLPack dtype to its MPI element type.
///
/// # Errors
/// [`Error::UnsupportedDtype`] naming the dtype when it has no MPI type of exactly its size
/// (see the module docs for the refused kinds).
#[inline]
pub fn lookup(dtype: DType) -> Result<ElementType> {
    if dtype.lanes != 0 {
        if let Some(index) = row_index(dtype.code, dtype.bits) {
            return Ok(ElementType {
                dtype,
                row: &TABLE[index],
            });
        }
    }
    refuse(dtype)
}

#[cold]
fn refuse(dtype: DType) -> Result<ElementType> {
    let refuse = |reason| Err(Error::UnsupportedDtype { dtype, reason });
    if dtype.lanes == 0 {
        return refuse("lanes is 0");
    }
    match dtype.code {
        code::OPAQUE_HANDLE => refuse("opaque handles (code 3) have no agreed meaning to transfer"),
        code::FLOAT6_E2M3FN | code::FLOAT6_E3M2FN | code::FLOAT4_E2M1FN => {
            refuse("sub-byte types are packed; an element has no byte address")
        }
        code::FLOAT if dtype.bits == 128 => {
            refuse("no MPI datatype is guaranteed to be IEEE binary128")
        }
        c if c <= code::BCOMPLEX => {
            if dtype.bits % 8 != 0 {
                refuse("sub-byte element width; an element has no byte address")
            } else {
                refuse("this bit width is not defined for this type code")
            }
        }
        _ => refuse("unknown DLPack type code"),
    }
}

/// A Rust element type with a DLPack dtype: the element types of the built-in exporters.
///
/// # Safety
/// `DTYPE.size_bytes()` must equal `size_of::<Self>()` and the type's layout must be exactly
/// that DLPack type's layout.
pub unsafe trait Element: Copy + 'static {
    /// The DLPack dtype of one `Self`.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $code:expr, $bits:expr;)*) => {$(
        // SAFETY: each row pairs a primitive with the DLPack dtype of the same size and layout.
        unsafe impl Element for $t {
            const DTYPE: DType = DType::new($code, $bits);
        }
    )*};
}

element! {
    i8 => code::INT, 8;
    i16 => code::INT, 16;
    i32 => code::INT, 32;
    i64 => code::INT, 64;
    u8 => code::UINT, 8;
    u16 => code::UINT, 16;
    u32 => code::UINT, 32;
    u64 => code::UINT, 64;
    f32 => code::FLOAT, 32;
    f64 => code::FLOAT, 64;
    Complex32 => code::COMPLEX, 64;
    Complex64 => code::COMPLEX, 128;
    half::f16 => code::FLOAT, 16;
    half::bf16 => code::BFLOAT, 16;
}

// SAFETY: bool is one byte, `_Bool`'s layout (MPI_C_BOOL). It is not `AnyBits`: a peer may
// deliver any byte, so bool storage is only exported read-only.
unsafe impl Element for bool {
    const DTYPE: DType = DType::new(code::BOOL, 8);
}

/// An [`Element`] for which every bit pattern is a valid value, so MPI may write any bytes
/// into it: every element type but `bool`. Writable exports ([`crate::dlpack::Owned`],
/// [`crate::dlpack::SliceMut`]) require it; receive booleans into `u8` storage with the bool
/// dtype instead ([`crate::dlpack::Owned::with_dtype`]).
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid `Self`.
pub unsafe trait AnyBits: Element {}

macro_rules! any_bits {
    ($($t:ty),*) => {$(
        // SAFETY: integers, IEEE floats and pairs of them accept every bit pattern.
        unsafe impl AnyBits for $t {}
    )*};
}

any_bits!(
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    f32,
    f64,
    Complex32,
    Complex64,
    half::f16,
    half::bf16
);

#[cfg(target_pointer_width = "64")]
any_bits!(isize, usize);

#[cfg(target_pointer_width = "64")]
element! {
    isize => code::INT, 64;
    usize => code::UINT, 64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_exact_unit_size() {
        for r in TABLE {
            let d = DType::new(r.code, r.bits);
            assert_eq!(
                d.size_bytes(),
                Some(r.unit.size_bytes()),
                "row {d} maps to {}",
                r.unit.name()
            );
        }
    }

    #[test]
    fn row_index_agrees_with_table() {
        for (i, r) in TABLE.iter().enumerate() {
            assert_eq!(row_index(r.code, r.bits), Some(i), "{:?}", r);
        }
        let mut found = 0;
        for code in 0..=255u8 {
            for bits in 0..=255u8 {
                if let Some(i) = row_index(code, bits) {
                    assert_eq!((TABLE[i].code, TABLE[i].bits), (code, bits));
                    found += 1;
                }
            }
        }
        assert_eq!(found, TABLE.len());
    }

    #[test]
    fn display_names() {
        assert_eq!(DType::new(2, 32).to_string(), "float32");
        assert_eq!(DType::new(2, 32).with_lanes(4).to_string(), "float32x4");
        assert_eq!(DType::new(99, 8).to_string(), "code99_bits8");
    }

    #[test]
    fn element_dtypes_have_rust_size() {
        fn check<T: Element>() {
            assert_eq!(T::DTYPE.size_bytes(), Some(std::mem::size_of::<T>()));
            assert!(lookup(T::DTYPE).is_ok());
        }
        check::<i8>();
        check::<i16>();
        check::<i32>();
        check::<i64>();
        check::<u8>();
        check::<u16>();
        check::<u32>();
        check::<u64>();
        check::<f32>();
        check::<f64>();
        check::<bool>();
        check::<Complex32>();
        check::<Complex64>();
        check::<half::f16>();
        check::<half::bf16>();
        check::<usize>();
        check::<isize>();
    }
}
