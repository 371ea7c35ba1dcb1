// vec_dot of several libggml-cpu builds, loaded side by side, interleaved: min time per build.
#include "ggml.h"
#include "ggml-cpu.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef const struct ggml_type_traits_cpu * (*traits_fn)(enum ggml_type);
int main(int argc,char**argv){
  enum ggml_type type = atoi(argv[1]); long rows = atol(argv[2]); int K = atoi(argv[3]); int reps = atoi(argv[4]);
  int nl = argc - 5; traits_fn tf[8];
  for (int l=0;l<nl;l++){ void*h=dlopen(argv[5+l],RTLD_NOW|RTLD_LOCAL); if(!h){printf("%s\n",dlerror());return 1;}
    ((void(*)(void))dlsym(h,"ggml_cpu_init"))(); tf[l]=(traits_fn)dlsym(h,"ggml_get_type_traits_cpu"); }
  const struct ggml_type_traits_cpu * tr = tf[0](type);
  size_t rs = ggml_row_size(type, K), ys = ggml_row_size(tr->vec_dot_type, K);
  float *w = malloc(sizeof(float)*K*1024), *x = malloc(sizeof(float)*K);
  srand(1); for (long i=0;i<(long)K*1024;i++) w[i]=(rand()/(float)RAND_MAX-0.5f);
  for (int i=0;i<K;i++) x[i]=(rand()/(float)RAND_MAX-0.5f);
  char *q = malloc(rs*rows);
  ggml_quantize_chunk(type, w, q, 0, 1024, K, NULL);
  for (long r=1024;r<rows;r+=1024) memcpy(q+r*rs, q, rs*(rows-r<1024?rows-r:1024));
  char *y = malloc(ys); tf[0](tr->vec_dot_type)->from_float(x, y, K);
  float *out = malloc(sizeof(float)*rows);
  double best[8]; for(int l=0;l<nl;l++) best[l]=1e9;
  for (int k=0;k<reps;k++) for (int l=0;l<nl;l++){ ggml_vec_dot_t vd = tf[l](type)->vec_dot; double t0=now(); for(long r=0;r<rows;r++) vd(K,&out[r],0,q+r*rs,0,y,0,1); double t=now()-t0; if(t<best[l])best[l]=t; }
  printf("type %d rows %ld K %d:", type, rows, K);
  for(int l=0;l<nl;l++) printf(" %.4f ms (%.3fx)", best[l]*1e3, best[0]/best[l]);
  printf("\n");
}
