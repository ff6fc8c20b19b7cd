/* Run-time queries of the MPI library's GPU support, looked up by name so that one binary
 * works with any MPI library (and with none of these extensions). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <mpi.h>

/* Open MPI (mpi-ext.h, "cuda" extension): 1 when the library was built with CUDA support
 * and it is enabled at run time. */
typedef int (*ompi_query_fn)(void);
/* MPICH >= 4.0 (mpi_proto.h): *is_supported = 1 for gpu_type MPIX_GPU_SUPPORT_CUDA (0). */
typedef int (*mpich_query_fn)(int, int *);

/* Returns 1 (CUDA-aware), 0 (not) or -1 (the library has no such query); *source is set to
 * 1 for Open MPI's MPIX_Query_cuda_support, 2 for MPICH's MPIX_GPU_query_support, 3 for the
 * MPI-4.1 info key mpi_memory_alloc_kinds of MPI_INFO_ENV, 0 when none answered. Needs MPI
 * initialized for the info query; the symbol queries work before. */
int dlpack_mpi_query_cuda_aware(int *source)
{
    *source = 0;
    /* MPICH's query first: MPICH also exports MPIX_Query_cuda_support, Open MPI does not
     * export MPIX_GPU_query_support. */
    void *sym = dlsym(RTLD_DEFAULT, "MPIX_GPU_query_support");
    if (sym) {
        int supported = 0;
        *source = 2;
        if (((mpich_query_fn)sym)(0, &supported) != MPI_SUCCESS)
            return 0;
        return supported ? 1 : 0;
    }
    sym = dlsym(RTLD_DEFAULT, "MPIX_Query_cuda_support");
    if (sym) {
        *source = 1;
        return ((ompi_query_fn)sym)() ? 1 : 0;
    }
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
        char value[256];
        int flag = 0;
        memset(value, 0, sizeof value);
        if (MPI_Info_get(MPI_INFO_ENV, "mpi_memory_alloc_kinds", (int)sizeof value - 1, value,
                         &flag) == MPI_SUCCESS && flag) {
            *source = 3;
            return strstr(value, "cuda") ? 1 : 0;
        }
    }
    return -1;
}

/* The file of the loaded MPI library (the object that defines MPI_Init, as the dynamic
 * loader resolved it), or NULL where the loader cannot say. */
const char *dlpack_mpi_loaded_library(void)
{
    void *sym = dlsym(RTLD_DEFAULT, "MPI_Init");
    Dl_info info;
    if (!sym || !dladdr(sym, &info))
        return 0;
    return info.dli_fname;
}
