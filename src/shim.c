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

/* Runs `hook` at the start of MPI_Finalize: MPI-4.1 §9.5.1 says MPI_Finalize first deletes
 * the attributes of MPI_COMM_SELF, calling their delete callbacks while MPI still works.
 * Returns MPI_SUCCESS or the MPI error code. */
static void (*finalize_hook)(void) = 0;

static int run_finalize_hook(MPI_Comm comm, int keyval, void *attribute, void *extra)
{
    (void)comm;
    (void)keyval;
    (void)attribute;
    (void)extra;
    if (finalize_hook)
        finalize_hook();
    return MPI_SUCCESS;
}

int dlpack_mpi_on_finalize(void (*hook)(void))
{
    int keyval = MPI_KEYVAL_INVALID;
    int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, run_finalize_hook, &keyval, 0);
    if (rc != MPI_SUCCESS)
        return rc;
    finalize_hook = hook;
    return MPI_Comm_set_attr(MPI_COMM_SELF, keyval, 0);
}

/* The MPI library this build was compiled against, from its mpi.h: "Open MPI 5.0.11",
 * "MPICH 4.0.2", or "" when mpi.h names neither (another MPI: nothing is compared). */
#define DLPACK_MPI_STR2(x) #x
#define DLPACK_MPI_STR(x) DLPACK_MPI_STR2(x)
const char *dlpack_mpi_built_library(void)
{
#if defined(OMPI_MAJOR_VERSION)
    return "Open MPI " DLPACK_MPI_STR(OMPI_MAJOR_VERSION) "." DLPACK_MPI_STR(
        OMPI_MINOR_VERSION) "." DLPACK_MPI_STR(OMPI_RELEASE_VERSION);
#elif defined(MPICH_VERSION)
    return "MPICH " MPICH_VERSION;
#else
    return "";
#endif
}

/* MPICH >= 5's predefined half-precision datatypes (MPIX_C_FLOAT16 for float16,
 * MPIX_BFLOAT16 for bfloat16), which its predefined operations reduce; MPI_DATATYPE_NULL
 * where this mpi.h has none. `which`: 0 float16, 1 bfloat16. */
MPI_Datatype dlpack_mpi_native_half(int which)
{
#if defined(MPIX_C_FLOAT16) && defined(MPIX_BFLOAT16)
    return which ? MPIX_BFLOAT16 : MPIX_C_FLOAT16;
#else
    (void)which;
    return MPI_DATATYPE_NULL;
#endif
}

/* MPI-4 persistent collectives (MPI-4.1 §6.13): MPI_Allreduce_init and its kin, declared
 * by MPI-4 headers (MPICH >= 4) and by Open MPI >= 5 (whose MPI_VERSION is still 3). Each
 * wrapper returns MPI_ERR_OTHER, and writes no request, where this build's mpi.h has none
 * (dlpack_mpi_has_persistent_collectives says which). */
#if MPI_VERSION >= 4 || (defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5)
#define HAVE_PERSISTENT_COLLECTIVES 1
/* Weak references: a binary built against an MPI that has them still loads, and refuses
 * with its own words (the library check), when an older release of the same soname is
 * loaded in its place (Debian's Open MPI 4.1 libmpi.so.40 under an Open MPI 5 build); the
 * functions are then NULL and never called. */
#pragma weak MPI_Allreduce_init
#pragma weak MPI_Bcast_init
#pragma weak MPI_Reduce_scatter_block_init
#pragma weak MPI_Allgather_init
#else
#define HAVE_PERSISTENT_COLLECTIVES 0
#endif

int dlpack_mpi_has_persistent_collectives(void)
{
#if HAVE_PERSISTENT_COLLECTIVES
    return MPI_Allreduce_init != 0 && MPI_Bcast_init != 0 && MPI_Reduce_scatter_block_init != 0
        && MPI_Allgather_init != 0;
#else
    return 0;
#endif
}

int dlpack_mpi_allreduce_init(const void *send, void *recv, int count, MPI_Datatype type,
                              MPI_Op op, MPI_Comm comm, MPI_Request *request)
{
#if HAVE_PERSISTENT_COLLECTIVES
    if (!dlpack_mpi_has_persistent_collectives())
        return MPI_ERR_OTHER;
    return MPI_Allreduce_init(send, recv, count, type, op, comm, MPI_INFO_NULL, request);
#else
    (void)send; (void)recv; (void)count; (void)type; (void)op; (void)comm; (void)request;
    return MPI_ERR_OTHER;
#endif
}

int dlpack_mpi_bcast_init(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
                          MPI_Request *request)
{
#if HAVE_PERSISTENT_COLLECTIVES
    if (!dlpack_mpi_has_persistent_collectives())
        return MPI_ERR_OTHER;
    return MPI_Bcast_init(buf, count, type, root, comm, MPI_INFO_NULL, request);
#else
    (void)buf; (void)count; (void)type; (void)root; (void)comm; (void)request;
    return MPI_ERR_OTHER;
#endif
}

int dlpack_mpi_reduce_scatter_block_init(const void *send, void *recv, int count,
                                         MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                                         MPI_Request *request)
{
#if HAVE_PERSISTENT_COLLECTIVES
    if (!dlpack_mpi_has_persistent_collectives())
        return MPI_ERR_OTHER;
    return MPI_Reduce_scatter_block_init(send, recv, count, type, op, comm, MPI_INFO_NULL,
                                         request);
#else
    (void)send; (void)recv; (void)count; (void)type; (void)op; (void)comm; (void)request;
    return MPI_ERR_OTHER;
#endif
}

int dlpack_mpi_allgather_init(const void *send, int send_count, MPI_Datatype send_type,
                              void *recv, int recv_count, MPI_Datatype recv_type,
                              MPI_Comm comm, MPI_Request *request)
{
#if HAVE_PERSISTENT_COLLECTIVES
    if (!dlpack_mpi_has_persistent_collectives())
        return MPI_ERR_OTHER;
    return MPI_Allgather_init(send, send_count, send_type, recv, recv_count, recv_type, comm,
                              MPI_INFO_NULL, request);
#else
    (void)send; (void)send_count; (void)send_type; (void)recv; (void)recv_count;
    (void)recv_type; (void)comm; (void)request;
    return MPI_ERR_OTHER;
#endif
}
