"""Macros that let one kernel body compile as CUDA C and as OpenCL C.

A template writes its kernel once against these names; the prelude of the chosen
dialect maps them onto the language, so the same body runs under pycuda/NVRTC and
pyopencl alike. CPU-class templates also use short-float-vector macros (VEC_T, VBCAST,
VLOAD, VSTORE, VFMA, VADD, VMAX, VELEM): OpenCL's floatN built-ins, a small struct
template in CUDA; VSTREAM, a store that skips the caches where the compiler can.
Quantized kernels use INT8_T (a signed byte) and DP4A(a, b, c), the
4-lane int8 dot product with int32 accumulation: CUDA's ``__dp4a`` on sm_61 and later,
AMD's ``v_dot4`` (``__builtin_amdgcn_sdot4``) where the ROCm device has it, sign-extended
byte arithmetic elsewhere.
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
// CUDA's launch bounds (see the CUDA prelude); nothing in OpenCL
#define LAUNCH_BOUNDS(threads)
// Short float vectors for CPU-class templates (n = 2, 4, 8 or 16 lanes):
// VEC_T(n) the type, VBCAST(n, x) x in every lane, VLOAD(n, i, p) lanes p[i*n .. i*n+n-1]
// (no alignment needed), VSTORE(n, x, i, p) x into p[i*n .. i*n+n-1], VFMA(a, b, c)
// a*b+c per lane, VADD(a, b) and VMAX(a, b) per lane, VELEM(v, e) lane e as a hex digit.
// VFMA is fma, not mad: PoCL 3.1 compiles mad to a multiply and an add, fma to one FMA
// instruction (1.02-1.79x on conv2d_NCHWc.x86 configs of a 1x1 layer, docs/BENCHMARKS.md).
// Under clang (PoCL, ROCm) VLOAD / VSTORE (p a GLOBAL float pointer) go through a vector
// type aligned to one float: one unaligned vector load or store in the IR, where vloadN /
// vstoreN are library calls whose lane-by-lane bodies LLVM must merge again in every copy
// of an unrolled loop (PoCL compiled vec=8/16 conv2d_NCHWc.x86 kernels with unroll_ci > 1
// 1.2-3.8x faster so, the same machine code: docs/BENCHMARKS.md "Overhead per trial").
#define VEC_T(n) float##n
#define VBCAST(n, x) ((float##n)(x))
#ifdef __clang__
typedef float tuner_float2u __attribute__((ext_vector_type(2), aligned(4)));
typedef float tuner_float4u __attribute__((ext_vector_type(4), aligned(4)));
typedef float tuner_float8u __attribute__((ext_vector_type(8), aligned(4)));
typedef float tuner_float16u __attribute__((ext_vector_type(16), aligned(4)));
#define VLOAD(n, i, p) (*(const GLOBAL tuner_float##n##u*)((p) + (i) * (n)))
// PREFETCH(p): a hint to bring p's cache line in (under clang: x86 prefetcht0 in PoCL,
// likely nothing on a ROCm GPU; OpenCL's own prefetch() is a no-op in PoCL 3.1); nothing
// in other OpenCL compilers nor in CUDA (the pointer evaluated and dropped: no unused
// variable warnings)
#define PREFETCH(p) __builtin_prefetch(p)
#define VSTORE(n, x, i, p) (*(GLOBAL tuner_float##n##u*)((p) + (i) * (n)) = (x))
// VSTREAM(n, x, i, p): VSTORE for data that will leave the caches before it is read (a
// non-temporal store: on x86 no read for ownership of the line); p + i*n must be aligned
// to n floats. No fence follows: a later kernel reads the data after the launch ends,
// and the driver's completion synchronisation (locked instructions on x86) drains the
// write-combining buffers. A plain VSTORE in other compilers and in CUDA.
#define VSTREAM(n, x, i, p) __builtin_nontemporal_store((x), (GLOBAL float##n*)((p) + (i) * (n)))
#else
#define VLOAD(n, i, p) vload##n((i), (p))
#define PREFETCH(p) ((void)(p))
#define VSTORE(n, x, i, p) vstore##n((x), (i), (p))
#define VSTREAM(n, x, i, p) VSTORE(n, x, i, p)
#endif
#define VFMA(a, b, c) fma((a), (b), (c))
#define VADD(a, b) ((a) + (b))
#define VMAX(a, b) fmax((a), (b))
#define VELEM(v, e) ((v).s##e)
// bool tensors (masks, comparisons): one byte, 0 or 1, as numpy's bool
#define BOOL_T unsigned char
// int8 kernels: INT8_T the signed byte; DP4A(a, b, c) = c + the sum over j of byte j of a
// times byte j of b, each sign-extended (4 int8 lanes packed little-endian in an int).
#define INT8_T char
#define INT8_LANE(x, j) (((((x) >> (8 * (j))) & 0xff) ^ 0x80) - 0x80)
// AMD GPUs with dot instructions (gfx906, CDNA, RDNA2 and later: the ROCm compiler
// knows the builtin only where the device has it) do DP4A in one v_dot4 instruction.
#if defined(__AMDGCN__) && defined(__has_builtin)
#if __has_builtin(__builtin_amdgcn_sdot4)
#define TUNER_SDOT4 1
#endif
#endif
#ifdef TUNER_SDOT4
#define DP4A(a, b, c) __builtin_amdgcn_sdot4((a), (b), (c), false)
#else
#define DP4A(a, b, c) ((c) + INT8_LANE(a, 0) * INT8_LANE(b, 0) + INT8_LANE(a, 1) * INT8_LANE(b, 1) \
    + INT8_LANE(a, 2) * INT8_LANE(b, 2) + INT8_LANE(a, 3) * INT8_LANE(b, 3))
#endif
"""

_CUDA = """\
#define KERNEL extern "C" __global__
// the most threads a block of the kernel has (added by codegen, as TVM does): ptxas then
// keeps registers x threads within the SM's register file. One block per SM asked for:
// bare __launch_bounds__ let ptxas trade registers for occupancy (CUDA 13, a 392-thread
// conv: 48 registers and 1.9 KB of spills, against 128 and 0.4 KB with 1)
#define LAUNCH_BOUNDS(threads) __launch_bounds__(threads, 1)
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
#define PREFETCH(p) ((void)(p))
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
#define VSTREAM(n, x, i, p) VSTORE(n, x, i, p)
#define VFMA(a, b, c) vec_fma((a), (b), (c))
#define VADD(a, b) vec_add((a), (b))
#define VMAX(a, b) vec_max((a), (b))
#define VELEM(v, e) ((v).s[0x##e])
// int8 kernels (see the OpenCL prelude): DP4A is the dp4a instruction from sm_61 on.
#define INT8_T signed char
#define BOOL_T unsigned char
#define INT8_LANE(x, j) (((((x) >> (8 * (j))) & 0xff) ^ 0x80) - 0x80)
__device__ __forceinline__ int tuner_dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
  return __dp4a(a, b, c);
#else
  return c + INT8_LANE(a, 0) * INT8_LANE(b, 0) + INT8_LANE(a, 1) * INT8_LANE(b, 1)
      + INT8_LANE(a, 2) * INT8_LANE(b, 2) + INT8_LANE(a, 3) * INT8_LANE(b, 3);
#endif
}
#define DP4A(a, b, c) tuner_dp4a((a), (b), (c))
"""

PRELUDES = {"opencl": _OPENCL, "cuda": _CUDA}


def with_prelude(body: str, dialect: str) -> str:
    # guarded, so several kernels can share one translation unit (one nvcc call)
    return (f"// generated for {dialect}\n#ifndef TUNER_PRELUDE\n#define TUNER_PRELUDE\n"
            f"{PRELUDES[dialect]}#endif\n\n{body}")
