//! Lists of tensors as the fused collectives take them ([`TensorList`], [`TensorListMut`]):
//! a slice, `Vec` or array of guards ([`ManagedTensor`]), views ([`TensorView`]), or
//! references to either or to `dyn Tensor`, so that a list of guards goes to a fused
//! collective as it is, without a second list of `&mut dyn Tensor`.

use super::{ManagedTensor, Tensor, TensorView};

/// The argument that keeps [`TensorListMut::for_each_mut`] overridden by this crate's lists
/// only: its type cannot be named outside the crate.
pub(crate) mod sealed {
    /// See the module.
    #[derive(Debug, Clone, Copy)]
    pub struct Visit(pub(crate) ());
}

/// A list of tensors that are read, in order: what a fused collective sends (the send list
/// of [`crate::comm::TensorComm::all_reduce_tensors`], for example).
///
/// Implemented for slices, `Vec`s and arrays of [`ManagedTensor`], [`TensorView`], `&T` and
/// `&mut T` of either, `&dyn Tensor`, `&mut dyn Tensor` and `Box<dyn Tensor>`; members may
/// differ in dtype, shape and layout. Implement it for a type of your own (a model's
/// parameters, say) to pass that type as the list.
///
/// ```
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor, TensorList};
/// let (a, b) = (Owned::new(vec![1.0f32; 4]), Owned::new(vec![2u8; 3]));
/// let opts = AcquireOptions::default();
/// let guards = vec![acquire(&a, &opts)?, acquire(&b, &opts)?];
/// let counts: Vec<i64> = guards.tensors().iter().map(|t| t.num_elements()).collect();
/// assert_eq!(counts, [4, 3]);
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
pub trait TensorList {
    /// The members, in list order.
    fn tensors(&self) -> Vec<&dyn Tensor>;
}

/// A list of tensors that are written (or read and written), in order: what a fused
/// collective receives into or reduces in place (the list of
/// [`crate::comm::TensorComm::all_reduce_tensors_in_place`], for example).
///
/// Implemented for slices, `Vec`s and arrays of [`ManagedTensor`], [`TensorView`], `&mut T`
/// of either, `&mut dyn Tensor` and `Box<dyn Tensor>`; members may differ in dtype, shape
/// and layout.
///
/// ```
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor, TensorListMut};
/// let (a, b) = (Owned::new(vec![1.0f32; 4]), Owned::new(vec![2u8; 3]));
/// let opts = AcquireOptions::default();
/// let mut guards = [acquire(&a, &opts)?, acquire(&b, &opts)?];
/// assert!(guards.tensors_mut().iter().all(|t| !t.is_read_only()));
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
pub trait TensorListMut {
    /// The members, in list order.
    fn tensors_mut(&mut self) -> Vec<&mut dyn Tensor>;

    /// Calls `f` with each member's index and the member, in list order, and returns the
    /// number of members; without allocating for the slices, `Vec`s and arrays of this
    /// module (a plan compares its members so at each step after they were lent). The
    /// default goes through [`TensorListMut::tensors_mut`]; only this crate's lists
    /// override it (its last argument cannot be named outside the crate), since a plan's
    /// memory safety relies on what it visits.
    #[doc(hidden)]
    fn for_each_mut(
        &mut self,
        f: &mut dyn FnMut(usize, &mut dyn Tensor),
        _: sealed::Visit,
    ) -> usize {
        let members = self.tensors_mut();
        let n = members.len();
        for (i, t) in members.into_iter().enumerate() {
            f(i, t);
        }
        n
    }
}

/// [`TensorList`] for slices of references (and boxes) to tensors.
macro_rules! lists {
    ($([$($g:tt)*] $t:ty),* $(,)?) => {$(
        impl<$($g)*> TensorList for [$t] {
            fn tensors(&self) -> Vec<&dyn Tensor> {
                self.iter().map(|t| &**t as &dyn Tensor).collect()
            }
        }
    )*};
}

/// [`TensorListMut`] for slices of mutable references (and boxes) to tensors.
macro_rules! lists_mut {
    ($([$($g:tt)*] $t:ty),* $(,)?) => {$(
        impl<$($g)*> TensorListMut for [$t] {
            fn tensors_mut(&mut self) -> Vec<&mut dyn Tensor> {
                self.iter_mut().map(|t| &mut **t as &mut dyn Tensor).collect()
            }

            fn for_each_mut(
                &mut self,
                f: &mut dyn FnMut(usize, &mut dyn Tensor),
                _: sealed::Visit,
            ) -> usize {
                self.iter_mut().enumerate().for_each(|(i, t)| f(i, &mut **t));
                self.len()
            }
        }
    )*};
}

impl TensorList for [ManagedTensor<'_>] {
    fn tensors(&self) -> Vec<&dyn Tensor> {
        self.iter().map(|t| t as &dyn Tensor).collect()
    }
}

impl TensorList for [TensorView<'_>] {
    fn tensors(&self) -> Vec<&dyn Tensor> {
        self.iter().map(|t| t as &dyn Tensor).collect()
    }
}

impl TensorListMut for [ManagedTensor<'_>] {
    fn tensors_mut(&mut self) -> Vec<&mut dyn Tensor> {
        self.iter_mut().map(|t| t as &mut dyn Tensor).collect()
    }

    fn for_each_mut(
        &mut self,
        f: &mut dyn FnMut(usize, &mut dyn Tensor),
        _: sealed::Visit,
    ) -> usize {
        self.iter_mut().enumerate().for_each(|(i, t)| f(i, t));
        self.len()
    }
}

impl TensorListMut for [TensorView<'_>] {
    fn tensors_mut(&mut self) -> Vec<&mut dyn Tensor> {
        self.iter_mut().map(|t| t as &mut dyn Tensor).collect()
    }

    fn for_each_mut(
        &mut self,
        f: &mut dyn FnMut(usize, &mut dyn Tensor),
        _: sealed::Visit,
    ) -> usize {
        self.iter_mut().enumerate().for_each(|(i, t)| f(i, t));
        self.len()
    }
}

lists!(
    ['x, 'e] &'x ManagedTensor<'e>,
    ['x, 'e] &'x mut ManagedTensor<'e>,
    ['x, 'e] &'x TensorView<'e>,
    ['x, 'e] &'x mut TensorView<'e>,
    ['x, 'y] &'x (dyn Tensor + 'y),
    ['x, 'y] &'x mut (dyn Tensor + 'y),
    ['y] Box<dyn Tensor + 'y>,
);

lists_mut!(
    ['x, 'e] &'x mut ManagedTensor<'e>,
    ['x, 'e] &'x mut TensorView<'e>,
    ['x, 'y] &'x mut (dyn Tensor + 'y),
    ['y] Box<dyn Tensor + 'y>,
);

impl<T> TensorList for Vec<T>
where
    [T]: TensorList,
{
    fn tensors(&self) -> Vec<&dyn Tensor> {
        self.as_slice().tensors()
    }
}

impl<T> TensorListMut for Vec<T>
where
    [T]: TensorListMut,
{
    fn tensors_mut(&mut self) -> Vec<&mut dyn Tensor> {
        self.as_mut_slice().tensors_mut()
    }

    fn for_each_mut(
        &mut self,
        f: &mut dyn FnMut(usize, &mut dyn Tensor),
        v: sealed::Visit,
    ) -> usize {
        self.as_mut_slice().for_each_mut(f, v)
    }
}

impl<T, const N: usize> TensorList for [T; N]
where
    [T]: TensorList,
{
    fn tensors(&self) -> Vec<&dyn Tensor> {
        self.as_slice().tensors()
    }
}

impl<T, const N: usize> TensorListMut for [T; N]
where
    [T]: TensorListMut,
{
    fn tensors_mut(&mut self) -> Vec<&mut dyn Tensor> {
        self.as_mut_slice().tensors_mut()
    }

    fn for_each_mut(
        &mut self,
        f: &mut dyn FnMut(usize, &mut dyn Tensor),
        v: sealed::Visit,
    ) -> usize {
        self.as_mut_slice().for_each_mut(f, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{acquire, AcquireOptions, Owned};

    /// Every kind of list gives its members in order, the same tensors.
    #[test]
    fn lists_give_their_members_in_order() {
        let (a, b) = (Owned::new(vec![1.0f32; 4]), Owned::new(vec![2i64; 3]));
        let opts = AcquireOptions::default();
        let mut guards = vec![acquire(&a, &opts).unwrap(), acquire(&b, &opts).unwrap()];
        let counts = |l: Vec<&dyn Tensor>| l.iter().map(|t| t.num_elements()).collect::<Vec<_>>();
        assert_eq!(counts(guards.tensors()), [4, 3]);
        assert_eq!(counts(guards[..].tensors()), [4, 3]);
        let firsts: Vec<usize> = guards
            .iter()
            .map(|t| t.first_element_ptr() as usize)
            .collect();
        let muts: Vec<usize> = guards
            .tensors_mut()
            .iter()
            .map(|t| t.first_element_ptr() as usize)
            .collect();
        assert_eq!(firsts, muts);
        let mut visited = Vec::new();
        let n = guards.for_each_mut(
            &mut |i, t| visited.push((i, t.first_element_ptr() as usize)),
            sealed::Visit(()),
        );
        assert_eq!((n, visited), (2, vec![(0, firsts[0]), (1, firsts[1])]));
        let (x, y) = guards.split_at_mut(1);
        let mut refs = [&mut x[0], &mut y[0]];
        assert_eq!(refs.tensors_mut().len(), 2);
        let [p, q] = refs;
        let mut dyns: Vec<&mut dyn Tensor> = vec![q, p];
        assert_eq!(
            dyns.tensors_mut()
                .iter()
                .map(|t| t.num_elements())
                .collect::<Vec<_>>(),
            [3, 4]
        );
        assert_eq!(counts(dyns.tensors()), [3, 4]);
        let mut sizes = Vec::new();
        assert_eq!(
            dyns.for_each_mut(&mut |_, t| sizes.push(t.num_elements()), sealed::Visit(())),
            2
        );
        assert_eq!(sizes, [3, 4]);
        let shared: [&dyn Tensor; 1] = [&*dyns[0]];
        assert_eq!(counts(shared.tensors()), [3]);
    }
}
