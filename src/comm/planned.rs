//! The plans of [`super::TensorComm`]'s collectives, declared by one macro inside the
//! trait (as the nonblocking twins are, `twins.rs`): each plans its unplanned collective of
//! the same name without `plan_`, over the same members and with the same checks, built
//! once and run step after step by [`super::Plan`] (`engine/plan.rs`; the batches are the
//! fused collectives' and, for the all-gather, `ops/gathered.rs`).

/// The `plan_*` methods of [`TensorComm`], one block inside the trait.
macro_rules! plans {
    () => {
        /// Plans [`TensorComm::all_reduce_tensors_in_place`] over `tensors`: built
        /// collectively, once (every check and the full agreement, the buckets and their
        /// buffers), then each [`Plan::run`] or [`Plan::start`] reduces the members' current
        /// values with no agreement, no check and no allocation, on a duplicate of this
        /// communicator that its plans share (so a step never meets an unplanned collective).
        /// The plan borrows the list; write the members between steps through
        /// [`Plan::tensors_mut`]. What a step finds when the ranks' steps differ:
        /// [`Plan::checks`] and [`Plan`]'s docs (`DLPACK_MPI_PLAN_CHECK=each` agrees in full
        /// before each step). A device list on a `DeviceComm` is packed on the device at
        /// each step with the copies planned at the build, and crosses to the host once
        /// each way per bucket when staged (its buckets carry no identity).
        ///
        /// # Errors
        /// At the build, on every rank: as [`TensorComm::all_reduce_tensors_in_place`]. At
        /// a step: [`Error::PlanMismatch`], [`Error::PlanChanged`]; a device copy's.
        fn plan_all_reduce_tensors_in_place<'a, L>(
            &'a self,
            tensors: &'a mut L,
            op: ReduceOp,
        ) -> Result<Plan<'a, L>>
        where
            L: TensorListMut + ?Sized,
        {
            fused::plan_all_reduce::<_, L, L>(self, None, tensors, op)
        }

        /// Plans [`TensorComm::all_reduce_tensors`] (from `send`'s members into `recv`'s), as
        /// [`TensorComm::plan_all_reduce_tensors_in_place`] plans its reduction; write the
        /// send members between steps through [`Plan::send_tensors_mut`].
        ///
        /// # Errors
        /// As [`TensorComm::all_reduce_tensors`] and
        /// [`TensorComm::plan_all_reduce_tensors_in_place`].
        fn plan_all_reduce_tensors<'a, S, L>(
            &'a self,
            send: &'a mut S,
            recv: &'a mut L,
            op: ReduceOp,
        ) -> Result<Plan<'a, L, S>>
        where
            S: TensorListMut + ?Sized,
            L: TensorListMut + ?Sized,
        {
            fused::plan_all_reduce(self, Some(send), recv, op)
        }

        /// Plans [`TensorComm::broadcast_tensors`] over `tensors` from `root`, as
        /// [`TensorComm::plan_all_reduce_tensors_in_place`] plans its reduction: each step
        /// broadcasts the root's current values into the other ranks' members.
        ///
        /// # Errors
        /// As [`TensorComm::broadcast_tensors`] and
        /// [`TensorComm::plan_all_reduce_tensors_in_place`].
        fn plan_broadcast_tensors<'a, L>(
            &'a self,
            tensors: &'a mut L,
            root: Rank,
        ) -> Result<Plan<'a, L>>
        where
            L: TensorListMut + ?Sized,
        {
            fused::plan_broadcast(self, tensors, root)
        }

        /// Plans [`TensorComm::reduce_scatter_block_tensors`], as
        /// [`TensorComm::plan_all_reduce_tensors`] plans its reduction (a reduce-scatter's
        /// step carries no identity: [`Plan::checks`] is `None`).
        ///
        /// # Errors
        /// As [`TensorComm::reduce_scatter_block_tensors`] and
        /// [`TensorComm::plan_all_reduce_tensors_in_place`], and [`Error::UnsupportedDevice`]
        /// for a device list on a `DeviceComm` (a planned device reduce-scatter: not yet).
        fn plan_reduce_scatter_block_tensors<'a, S, L>(
            &'a self,
            send: &'a mut S,
            recv: &'a mut L,
            op: ReduceOp,
        ) -> Result<Plan<'a, L, S>>
        where
            S: TensorListMut + ?Sized,
            L: TensorListMut + ?Sized,
        {
            fused::plan_reduce_scatter_block(self, send, recv, op)
        }

        /// Plans [`TensorComm::all_reduce_tensor_in_place`]: the plan of a list of one
        /// (`tensor`, read and written through `plan.tensors_mut()[0]`).
        ///
        /// # Errors
        /// As [`TensorComm::plan_all_reduce_tensors_in_place`].
        fn plan_all_reduce_tensor_in_place<'a, T>(
            &'a self,
            tensor: &'a mut T,
            op: ReduceOp,
        ) -> Result<Plan<'a, [T; 1]>>
        where
            [T]: TensorListMut,
        {
            self.plan_all_reduce_tensors_in_place(std::array::from_mut(tensor), op)
        }

        /// Plans [`TensorComm::all_reduce_tensor`]: the plan of lists of one.
        ///
        /// # Errors
        /// As [`TensorComm::plan_all_reduce_tensors`].
        fn plan_all_reduce_tensor<'a, T, U>(
            &'a self,
            send: &'a mut T,
            recv: &'a mut U,
            op: ReduceOp,
        ) -> Result<Plan<'a, [U; 1], [T; 1]>>
        where
            [T]: TensorListMut,
            [U]: TensorListMut,
        {
            let (send, recv) = (std::array::from_mut(send), std::array::from_mut(recv));
            self.plan_all_reduce_tensors(send, recv, op)
        }

        /// Plans [`TensorComm::broadcast_tensor`]: the plan of a list of one.
        ///
        /// # Errors
        /// As [`TensorComm::plan_broadcast_tensors`].
        fn plan_broadcast_tensor<'a, T>(
            &'a self,
            tensor: &'a mut T,
            root: Rank,
        ) -> Result<Plan<'a, [T; 1]>>
        where
            [T]: TensorListMut,
        {
            self.plan_broadcast_tensors(std::array::from_mut(tensor), root)
        }

        /// Plans [`TensorComm::reduce_scatter_block_tensor`]: the plan of lists of one.
        ///
        /// # Errors
        /// As [`TensorComm::plan_reduce_scatter_block_tensors`].
        fn plan_reduce_scatter_block_tensor<'a, T, U>(
            &'a self,
            send: &'a mut T,
            recv: &'a mut U,
            op: ReduceOp,
        ) -> Result<Plan<'a, [U; 1], [T; 1]>>
        where
            [T]: TensorListMut,
            [U]: TensorListMut,
        {
            let (send, recv) = (std::array::from_mut(send), std::array::from_mut(recv));
            self.plan_reduce_scatter_block_tensors(send, recv, op)
        }

        /// Plans [`TensorComm::all_gather_tensor`] (`recv` holds `size` × `send`'s elements),
        /// as [`TensorComm::plan_all_reduce_tensors_in_place`] plans its reduction. A block
        /// under 256 KiB, or a strided tensor, goes through the plan's own buffers and carries
        /// the plan's identity after each rank's block; a contiguous pair of larger blocks is
        /// gathered in place and carries none ([`Plan::checks`]).
        ///
        /// # Errors
        /// As [`TensorComm::all_gather_tensor`] (on every rank, at the build). At a step:
        /// [`Error::PlanMismatch`], [`Error::PlanChanged`].
        fn plan_all_gather_tensor<'a, T, U>(
            &'a self,
            send: &'a mut T,
            recv: &'a mut U,
        ) -> Result<Plan<'a, [U; 1], [T; 1]>>
        where
            [T]: TensorListMut,
            [U]: TensorListMut,
        {
            let (send, recv) = (std::array::from_mut(send), std::array::from_mut(recv));
            ops::gathered::plan_all_gather(self, send, recv)
        }
    };
}
