/* Which derived datatype does Open MPI send fastest for a stride-2 f32 view of 64 MiB?
 * Rank 0 sends the 32 MiB of logical elements to rank 1 (which acks each message) as an
 * hvector (what dlpack-mpi builds), a vector, n x resized(float, extent 8), contiguous(n,
 * resized), after a hand-written pack loop, and as a contiguous send of the same bytes.
 * Build and run: mpicc -O2 benches/derived_types.c -o /tmp/dt && mpirun -n 2 /tmp/dt
 * (docs/PERFORMANCE.md, strided section; benches/README.md). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static double now(void){return MPI_Wtime();}
int main(int argc,char**argv){
  MPI_Init(&argc,&argv);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD,&rank);
  const int N = 16*1024*1024; /* floats in storage: 64 MiB */
  const int n = N/2;
  float *src = malloc((size_t)N*4), *dst = malloc((size_t)n*4), *packed = malloc((size_t)n*4);
  for (int i=0;i<N;i++) src[i]=i;
  MPI_Datatype hv, vec, res, resc;
  MPI_Type_create_hvector(n,1,8,MPI_FLOAT,&hv); MPI_Type_commit(&hv);
  MPI_Type_vector(n,1,2,MPI_FLOAT,&vec); MPI_Type_commit(&vec);
  MPI_Type_create_resized(MPI_FLOAT,0,8,&res); MPI_Type_commit(&res);
  MPI_Type_contiguous(n,res,&resc); MPI_Type_commit(&resc);
  int iters=10;
  if (rank==0) {
    const char* names[]={"hvector","vector","resized x n","contig(resized)","pack loop","contiguous"};
    for (int k=0;k<6;k++){
      double best=1e9;
      for (int r=0;r<5;r++){
        MPI_Barrier(MPI_COMM_WORLD);
        double t=now();
        for(int i=0;i<iters;i++){
          char ack;
          switch(k){
            case 0: MPI_Send(src,1,hv,1,0,MPI_COMM_WORLD);break;
            case 1: MPI_Send(src,1,vec,1,0,MPI_COMM_WORLD);break;
            case 2: MPI_Send(src,n,res,1,0,MPI_COMM_WORLD);break;
            case 3: MPI_Send(src,1,resc,1,0,MPI_COMM_WORLD);break;
            case 4: for(int j=0;j<n;j++) packed[j]=src[2*j]; MPI_Send(packed,n,MPI_FLOAT,1,0,MPI_COMM_WORLD);break;
            case 5: MPI_Send(src,n,MPI_FLOAT,1,0,MPI_COMM_WORLD);break;
          }
          MPI_Recv(&ack,1,MPI_CHAR,1,1,MPI_COMM_WORLD,MPI_STATUS_IGNORE);
        }
        double el=(now()-t)/iters*1e3; if(el<best)best=el;
      }
      printf("%-18s best %.2f ms per 32 MiB message\n",names[k],best);
    }
  } else {
    for (int k=0;k<6;k++) for (int r=0;r<5;r++){ MPI_Barrier(MPI_COMM_WORLD); for(int i=0;i<iters;i++){ char ack=0; MPI_Recv(dst,n,MPI_FLOAT,0,0,MPI_COMM_WORLD,MPI_STATUS_IGNORE); MPI_Send(&ack,1,MPI_CHAR,0,1,MPI_COMM_WORLD);} }
  }
  MPI_Finalize();
}
