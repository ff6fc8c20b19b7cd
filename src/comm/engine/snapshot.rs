//! What a plan ([`super::plan`]) or an exchange ([`super::exchange`]) was built from, member
//! by member ([`Snapshot`]), and the comparison after its lists were lent ([`changed`]): a
//! member replaced, moved, reshaped or relabelled is [`Error::PlanChanged`].

use crate::device::Device;
use crate::dlpack::{Tensor, TensorListMut};
use crate::dtype::DType;
use crate::error::Error;

/// What a plan or an exchange was built from, for one member: compared after its lists
/// were lent.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::comm) struct Snapshot {
    first: usize,
    dtype: DType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    device: Device,
}

impl Snapshot {
    /// The member `t` as it is now.
    pub(in crate::comm) fn of(t: &dyn Tensor) -> Snapshot {
        Snapshot {
            first: t.first_element_ptr() as usize,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            strides: t.strides_elems().map(<[i64]>::to_vec),
            device: t.device(),
        }
    }

    /// The first field in which `t` differs: `(field, planned, now)`.
    fn differs(&self, t: &dyn Tensor) -> Option<(&'static str, String, String)> {
        let first = t.first_element_ptr() as usize;
        if first != self.first {
            return Some((
                "data pointer",
                format!("{:#x}", self.first),
                format!("{first:#x}"),
            ));
        }
        if t.dtype() != self.dtype {
            return Some(("dtype", self.dtype.to_string(), t.dtype().to_string()));
        }
        if t.shape() != self.shape.as_slice() {
            return Some((
                "shape",
                format!("{:?}", self.shape),
                format!("{:?}", t.shape()),
            ));
        }
        if t.strides_elems() != self.strides.as_deref() {
            let s = |v: Option<&[i64]>| v.map_or("none (C order)".into(), |v| format!("{v:?}"));
            return Some(("strides", s(self.strides.as_deref()), s(t.strides_elems())));
        }
        if t.device() != self.device {
            return Some(("device", self.device.to_string(), t.device().to_string()));
        }
        None
    }
}

/// The first member of `now` that differs from `then` (the list's length first), as
/// [`Error::PlanChanged`], its index plus `base` (an exchange numbers its receive members
/// after its send members); `send`: a plan's send list (its fields are named so).
/// Allocates nothing unless a member differs ([`TensorListMut::for_each_mut`]).
pub(in crate::comm) fn changed<L: TensorListMut + ?Sized>(
    then: &[Snapshot],
    now: &mut L,
    (base, send): (usize, bool),
) -> Option<Error> {
    let name = |field: &'static str| -> &'static str {
        if !send {
            return field;
        }
        match field {
            "list length" => "send list length",
            "data pointer" => "send data pointer",
            "dtype" => "send dtype",
            "shape" => "send shape",
            "strides" => "send strides",
            _ => "send device",
        }
    };
    let mut first: Option<Error> = None;
    let visit = crate::dlpack::list::sealed::Visit(());
    let len = now.for_each_mut(
        &mut |index, t| {
            if first.is_some() {
                return;
            }
            let Some(s) = then.get(index) else { return };
            if let Some((field, planned, now)) = s.differs(&*t) {
                first = Some(Error::PlanChanged {
                    index: base + index,
                    field: name(field),
                    planned,
                    now,
                });
            }
        },
        visit,
    );
    if len != then.len() {
        return Some(Error::PlanChanged {
            index: base + len.min(then.len()),
            field: name("list length"),
            planned: then.len().to_string(),
            now: len.to_string(),
        });
    }
    first
}
