// CHECK(call): runs a CUDA runtime call and exits with its file, line and error string if it
// fails. For the stand-alone benches under scripts/ (built with nvcc on the GPU machine).
#pragma once
#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        cudaError_t e = (call);                                                           \
        if (e != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));     \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
