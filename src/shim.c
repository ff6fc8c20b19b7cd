/* MPI constants that rsmpi's bindings do not expose, read from the MPI library's own mpi.h. */
#include <mpi.h>

/* MPI_IN_PLACE (MPI-4.1 §6.9.3): Open MPI defines it as (void *) 1, MPICH as (void *) -1. */
void *const dlpack_mpi_in_place = MPI_IN_PLACE;

/* MPI_TAG_UB (MPI-4.1 §9.1.2): the largest tag of MPI_COMM_WORLD; -1 if unavailable. */
int dlpack_mpi_tag_ub(void)
{
    int *value = 0;
    int flag = 0;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
        return -1;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
    return flag && value ? *value : -1;
}
