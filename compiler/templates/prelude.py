"""Macros that let one kernel body compile as CUDA C and as OpenCL C.

A template writes its kernel once against these names; the prelude of the chosen
dialect maps them onto the language, so the same body runs under pycuda/NVRTC and
pyopencl alike.
"""

from __future__ import annotations

_OPENCL = """\
#define KERNEL __kernel
#define GLOBAL __global
#define LOCAL __local
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#define THREAD_X ((int)get_local_id(0))
#define THREAD_Y ((int)get_local_id(1))
#define THREAD_Z ((int)get_local_id(2))
#define BLOCK_X ((int)get_group_id(0))
#define BLOCK_Y ((int)get_group_id(1))
#define BLOCK_Z ((int)get_group_id(2))
#define RESTRICT restrict
"""

_CUDA = """\
#define KERNEL extern "C" __global__
#define GLOBAL
#define LOCAL __shared__
#define BARRIER() __syncthreads()
#define THREAD_X ((int)threadIdx.x)
#define THREAD_Y ((int)threadIdx.y)
#define THREAD_Z ((int)threadIdx.z)
#define BLOCK_X ((int)blockIdx.x)
#define BLOCK_Y ((int)blockIdx.y)
#define BLOCK_Z ((int)blockIdx.z)
#define RESTRICT __restrict__
"""

PRELUDES = {"opencl": _OPENCL, "cuda": _CUDA}


def with_prelude(body: str, dialect: str) -> str:
    return f"// generated for {dialect}\n{PRELUDES[dialect]}\n{body}"
