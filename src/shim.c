/* MPI constants that rsmpi's bindings do not expose, read from the MPI library's own mpi.h. */
#include <mpi.h>

/* MPI_IN_PLACE (MPI-4.1 §6.9.3): Open MPI defines it as (void *) 1, MPICH as (void *) -1. */
void *const dlpack_mpi_in_place = MPI_IN_PLACE;
