// Shared by the kernels: storage types without CUDA headers, so NVRTC needs no include path on any
// machine (the pip wheels ship no cuda_fp16.h). Values are read into fp32 and accumulated in fp32.
#pragma once

#define NS_INF __int_as_float(0x7f800000)

// A storage type: how one element of a tensor is read as fp32 and written back.
struct F32 {
    typedef float storage;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float f) { return f; }
};

struct Bf16 {
    typedef unsigned short storage;
    static __device__ __forceinline__ float load(unsigned short x) {
        return __uint_as_float(((unsigned int)x) << 16);
    }
    // Round to nearest even, as torch's float -> bfloat16; a NaN stays a (quiet) NaN.
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned int u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (unsigned short)(u >> 16);
    }
};

struct F16 {
    typedef unsigned short storage;
#ifdef __CUDA_ARCH__
    static __device__ __forceinline__ float load(unsigned short x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
        return f;
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
#else  // the CPU emulation the tests run the kernels in (tests/cuda_cpu)
    static float load(unsigned short x) { return emu_half_to_float(x); }
    static unsigned short store(float f) { return emu_float_to_half(f); }
#endif
};

// N consecutive elements read as fp32 with the widest loads their size allows (16-byte aligned when N * size
// is a multiple of 16): a warp reading one row of a head moves whole 128-byte lines. The words are unpacked
// with shifts, never through a local array's address, so nothing lands in local memory.
template <int WORDS>
__device__ __forceinline__ void load_words(const void* __restrict__ src, unsigned int* w) {
    if constexpr (WORDS % 4 == 0) {
#pragma unroll
        for (int i = 0; i < WORDS / 4; ++i) {
            const uint4 v = reinterpret_cast<const uint4*>(src)[i];
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    } else if constexpr (WORDS % 2 == 0) {
#pragma unroll
        for (int i = 0; i < WORDS / 2; ++i) {
            const uint2 v = reinterpret_cast<const uint2*>(src)[i];
            w[2 * i] = v.x;
            w[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < WORDS; ++i) w[i] = reinterpret_cast<const unsigned int*>(src)[i];
    }
}

template <typename T, int N>
__device__ __forceinline__ void load_row(const typename T::storage* __restrict__ src, float* dst) {
    static_assert(sizeof(typename T::storage) == 4 || N % 2 == 0, "16-bit rows are read two per word");
    constexpr int WORDS = N * (int)sizeof(typename T::storage) / 4;
    unsigned int w[WORDS];
    load_words<WORDS>(src, w);
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
        if constexpr (sizeof(typename T::storage) == 4) {
            dst[i] = __uint_as_float(w[i]);
        } else {
            dst[2 * i] = T::load((unsigned short)(w[i] & 0xffffu));
            dst[2 * i + 1] = T::load((unsigned short)(w[i] >> 16));
        }
    }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}
