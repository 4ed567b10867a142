// scripts/cuda_call_counter.c — an LD_PRELOAD counter of CUDA runtime calls: how many of each
// and the host time spent in them, printed to stderr when the program exits.
//
//   gcc -O2 -shared -fPIC -o /tmp/libcudacount.so scripts/cuda_call_counter.c -ldl
//   LD_PRELOAD=/tmp/libcudacount.so ./train_gpt_cuda --device cuda ...
//
// Why: on a GPU machine without Nsight Systems, a step far slower than its kernels (ncu's
// gpu__time_duration summed to a sixth of the step) is usually host-side API traffic. This found
// the 2.4 million cudaMemcpy2DAsync calls of per-slab box copies (docs/benchmarks.md, "Third
// session"). It needs the program to link libcudart dynamically (CMake's default for dtensor's
// targets: check with `ldd`); kernel launches are not counted (ncu counts those).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>
#include <time.h>
typedef int cudaError_t; typedef void* cudaStream_t;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
enum {M2D,M1D,MSET,SYNC,MALLOC,FREE,N};
static const char* names[N]={"cudaMemcpy2DAsync","cudaMemcpyAsync","cudaMemsetAsync","cudaStreamSynchronize","cudaMallocAsync","cudaFreeAsync"};
static long cnt[N]; static double tim[N]; static long small2d, rows2d_hist[8];
#define WRAP(idx, ret, name, params, args) ret name params { static ret (*f) params; if(!f) f=dlsym(RTLD_NEXT,#name); double t0=now(); ret r=f args; tim[idx]+=now()-t0; cnt[idx]++; return r; }
cudaError_t cudaMemcpy2DAsync(void* d,size_t dp,const void* s,size_t sp,size_t w,size_t h,int k,cudaStream_t st){
  static cudaError_t (*f)(void*,size_t,const void*,size_t,size_t,size_t,int,cudaStream_t); if(!f) f=dlsym(RTLD_NEXT,"cudaMemcpy2DAsync");
  double t0=now(); cudaError_t r=f(d,dp,s,sp,w,h,k,st); tim[M2D]+=now()-t0; cnt[M2D]++; if(w*h<4096) small2d++;
  int b=0; size_t x=w*h; while(x>=16 && b<7){x/=16;b++;} rows2d_hist[b]++; return r; }
WRAP(M1D, cudaError_t, cudaMemcpyAsync, (void* d,const void* s,size_t n,int k,cudaStream_t st),(d,s,n,k,st))
WRAP(MSET, cudaError_t, cudaMemsetAsync, (void* d,int v,size_t n,cudaStream_t st),(d,v,n,st))
WRAP(SYNC, cudaError_t, cudaStreamSynchronize, (cudaStream_t st),(st))
WRAP(MALLOC, cudaError_t, cudaMallocAsync, (void** p,size_t n,cudaStream_t st),(p,n,st))
WRAP(FREE, cudaError_t, cudaFreeAsync, (void* p,cudaStream_t st),(p,st))
__attribute__((destructor)) static void report(void){
  fprintf(stderr,"shim: CUDA runtime calls (count, host seconds):\n");
  for(int i=0;i<N;i++) fprintf(stderr,"  %-24s %10ld %8.3f s\n",names[i],cnt[i],tim[i]);
  fprintf(stderr,"  memcpy2D under 4 KiB: %ld; bytes histogram by 16x: ",small2d);
  for(int b=0;b<8;b++) fprintf(stderr,"%ld ",rows2d_hist[b]);
  fprintf(stderr,"\n");
}
