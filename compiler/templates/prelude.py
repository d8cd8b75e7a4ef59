"""Macros that let one kernel body compile as CUDA C and as OpenCL C.

A template writes its kernel once against these names; the prelude of the chosen
dialect maps them onto the language, so the same body runs under pycuda/NVRTC and
pyopencl alike. CPU-class templates also use short-float-vector macros (VEC_T, VBCAST,
VLOAD, VSTORE, VFMA, VADD, VMAX, VELEM): OpenCL's floatN built-ins, a small struct
template in CUDA.
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
// Short float vectors for CPU-class templates (n = 2, 4, 8 or 16 lanes):
// VEC_T(n) the type, VBCAST(n, x) x in every lane, VLOAD(n, i, p) lanes p[i*n .. i*n+n-1]
// (no alignment needed), VSTORE(n, x, i, p) x into p[i*n .. i*n+n-1], VFMA(a, b, c)
// a*b+c per lane, VADD(a, b) and VMAX(a, b) per lane, VELEM(v, e) lane e as a hex digit.
#define VEC_T(n) float##n
#define VBCAST(n, x) ((float##n)(x))
#define VLOAD(n, i, p) vload##n((i), (p))
#define VSTORE(n, x, i, p) vstore##n((x), (i), (p))
#define VFMA(a, b, c) mad((a), (b), (c))
#define VADD(a, b) ((a) + (b))
#define VMAX(a, b) fmax((a), (b))
#define VELEM(v, e) ((v).s##e)
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
// Short float vectors (see the OpenCL prelude): an array of n floats in a struct that
// registers hold once the constant-index loops below are unrolled.
template <int N> struct VecF { float s[N]; };
template <int N> __device__ __forceinline__ VecF<N> vec_bcast(float x) {
  VecF<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.s[k] = x;
  return r;
}
template <int N> __device__ __forceinline__ VecF<N> vec_load(int i, const float* p) {
  VecF<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.s[k] = p[i * N + k];
  return r;
}
template <int N> __device__ __forceinline__ void vec_store(VecF<N> x, int i, float* p) {
#pragma unroll
  for (int k = 0; k < N; ++k) p[i * N + k] = x.s[k];
}
template <int N> __device__ __forceinline__ VecF<N> vec_fma(VecF<N> a, VecF<N> b, VecF<N> c) {
  VecF<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.s[k] = fmaf(a.s[k], b.s[k], c.s[k]);
  return r;
}
template <int N> __device__ __forceinline__ VecF<N> vec_add(VecF<N> a, VecF<N> b) {
  VecF<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.s[k] = a.s[k] + b.s[k];
  return r;
}
template <int N> __device__ __forceinline__ VecF<N> vec_max(VecF<N> a, VecF<N> b) {
  VecF<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.s[k] = fmaxf(a.s[k], b.s[k]);
  return r;
}
#define VEC_T(n) VecF<n>
#define VBCAST(n, x) vec_bcast<n>(x)
#define VLOAD(n, i, p) vec_load<n>((i), (p))
#define VSTORE(n, x, i, p) vec_store<n>((x), (i), (p))
#define VFMA(a, b, c) vec_fma((a), (b), (c))
#define VADD(a, b) vec_add((a), (b))
#define VMAX(a, b) vec_max((a), (b))
#define VELEM(v, e) ((v).s[0x##e])
"""

PRELUDES = {"opencl": _OPENCL, "cuda": _CUDA}


def with_prelude(body: str, dialect: str) -> str:
    # guarded, so several kernels can share one translation unit (one nvcc call)
    return (f"// generated for {dialect}\n#ifndef TUNER_PRELUDE\n#define TUNER_PRELUDE\n"
            f"{PRELUDES[dialect]}#endif\n\n{body}")
