// Runs CUDA kernel source on the CPU, for tests on machines without a GPU: one OS thread per CUDA thread,
// blocks one after another, __syncthreads as a barrier of the block's threads and each warp intrinsic as an
// exchange between the warp's 32 threads. Slow, and only as faithful as these few definitions (fp32 maths
// from the C library, not CUDA's), but it executes the kernels' own indexing, barriers and reductions.
// Only what gpu/kernels uses is defined.
#pragma once

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct uint2 {
    unsigned int x, y;
};
struct uint4 {
    unsigned int x, y, z, w;
};

inline thread_local dim3 threadIdx;
inline dim3 blockIdx, blockDim, gridDim;

namespace emu {
inline std::unique_ptr<std::barrier<>> block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<uint64_t> exchange;  // [warp][lane]
inline std::vector<unsigned char> dynamic_shared_bytes;

template <typename T>
T* dynamic_shared() {
    return reinterpret_cast<T*>(dynamic_shared_bytes.data());
}

// Every lane of the warp publishes a value; each reads the one at `src_lane`.
template <typename T>
T warp_exchange(T v, int src_lane) {
    static_assert(sizeof(T) <= 8);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    exchange[warp * 32 + lane] = bits;
    warp_barriers[warp]->arrive_and_wait();
    const uint64_t got = exchange[warp * 32 + src_lane];
    warp_barriers[warp]->arrive_and_wait();
    T out;
    std::memcpy(&out, &got, sizeof(T));
    return out;
}

// Runs `body` as the kernel's threads, block after block.
template <typename Body>
void launch(dim3 grid, dim3 block, size_t shared_bytes, Body body) {
    const unsigned int threads = block.x * block.y * block.z;
    gridDim = grid;
    blockDim = block;
    dynamic_shared_bytes.assign(shared_bytes + 16, 0xff);  // garbage, as on a device
    for (unsigned int z = 0; z < grid.z; ++z)
        for (unsigned int y = 0; y < grid.y; ++y)
            for (unsigned int x = 0; x < grid.x; ++x) {
                blockIdx = {x, y, z};
                block_barrier = std::make_unique<std::barrier<>>(threads);
                warp_barriers.clear();
                for (unsigned int w = 0; w < threads / 32; ++w)
                    warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
                exchange.assign(threads, 0);
                std::vector<std::thread> pool;
                for (unsigned int t = 0; t < threads; ++t)
                    pool.emplace_back([t, &body] {
                        threadIdx = {t, 0, 0};
                        body();
                    });
                for (auto& th : pool) th.join();
            }
}
}  // namespace emu

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

template <typename T>
T __shfl_xor_sync(unsigned int, T v, int offset) {
    return emu::warp_exchange(v, (threadIdx.x % 32) ^ offset);
}
template <typename T>
T __shfl_down_sync(unsigned int, T v, int offset) {
    const int lane = threadIdx.x % 32;
    return emu::warp_exchange(v, lane + offset < 32 ? lane + offset : lane);
}
template <typename T>
T __shfl_sync(unsigned int, T v, int src_lane) {
    return emu::warp_exchange(v, src_lane);
}
inline unsigned int __ballot_sync(unsigned int, bool predicate) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    emu::exchange[warp * 32 + lane] = predicate;
    emu::warp_barriers[warp]->arrive_and_wait();
    unsigned int bits = 0;
    for (int l = 0; l < 32; ++l) bits |= (emu::exchange[warp * 32 + l] ? 1u : 0u) << l;
    emu::warp_barriers[warp]->arrive_and_wait();
    return bits;
}

inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __ffs(unsigned int x) { return __builtin_ffs((int)x); }
inline int __clz(unsigned int x) { return x ? __builtin_clz(x) : 32; }

inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    return std::atomic_ref<unsigned int>(*p).fetch_add(v);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}

inline float __uint_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int i) { return __uint_as_float((unsigned int)i); }
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    return u;
}
// Compiled with -ffp-contract=off: each is one rounded operation, as the _rn intrinsics are.
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline unsigned long long __float2ull_rz(float f) { return f > 0.f ? (unsigned long long)f : 0ull; }

template <typename T>
T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
T max(T a, T b) {
    return a < b ? b : a;
}

inline float emu_half_to_float(unsigned short x) {
    _Float16 h;
    std::memcpy(&h, &x, 2);
    return (float)h;
}
inline unsigned short emu_float_to_half(float f) {
    const _Float16 h = (_Float16)f;
    unsigned short x;
    std::memcpy(&x, &h, 2);
    return x;
}
