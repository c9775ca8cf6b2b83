// Decode attention over a paged KV cache: one query token per sequence, its keys read through the block table.
//
// q [S, num_heads, D]; k/v caches [num_blocks, block_size, num_kv_heads, D] (contiguous); out [S, num_heads, D].
// The query is the sequence's last token (position seq_len - 1), so every key below seq_len is visible, or
// on a sliding layer those at positions >= seq_len - window.
//
// One block of 4 warps per (sequence, kv head, split): the block computes every query head of the kv head's
// group (GQA: each key is read once for the whole group), over one split of at most partition_tokens keys.
// Three phases, with the split's scores in shared memory rather than an online softmax: (1) each warp takes
// keys in turn, its lanes holding D / 32 elements each, and writes one score per head; (2) one warp per head
// turns its scores into exp(s - max) and their sum; (3) each warp accumulates p * v over its keys, and the
// warps' sums are added in a fixed order. With one split the block writes the output; with several it writes
// (max, sum, unnormalised output) and paged_attention_combine merges the splits (flash-decoding).
#include "common.cuh"

#define ATTN_WARPS 4
#define ATTN_THREADS (ATTN_WARPS * 32)
// Blocks per SM the register allocation must allow; it also steers ptxas away from the odd few-byte spills
// it chose with the thread count alone.
#define ATTN_MIN_BLOCKS 4
// Query heads one block computes (its registers hold GROUP_MAX * HEAD_DIM / 32 sums per lane); a kv head with
// a larger group gets several blocks. gpu/cuda_kernels.py's attention_group_max must agree.
__host__ __device__ constexpr int group_max(int head_dim) { return head_dim <= 128 ? 8 : 4; }

template <typename T, int HEAD_DIM>
__device__ __forceinline__ void paged_attention_decode(
    typename T::storage* __restrict__ out,       // [S, H, D], written when num_splits == 1
    float* __restrict__ split_out,               // [S, H, num_splits, D], unnormalised
    float* __restrict__ split_max,               // [S, H, num_splits]
    float* __restrict__ split_sum,               // [S, H, num_splits]
    const typename T::storage* __restrict__ q,   // [S, H, D], last dimension contiguous
    long long q_seq_stride, long long q_head_stride,
    const typename T::storage* __restrict__ k_cache,
    const typename T::storage* __restrict__ v_cache,
    const int* __restrict__ block_tables,        // [S, max_blocks]
    int block_table_stride,
    const int* __restrict__ seq_lens,            // [S]
    int num_heads, int num_kv_heads, int block_size, int window, float scale,
    int partition_tokens, int num_splits) {
    constexpr int E = HEAD_DIM / 32;  // elements per lane
    constexpr int GROUP_MAX = group_max(HEAD_DIM);
    extern __shared__ float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int seq = blockIdx.y, split = blockIdx.z;
    const int group = num_heads / num_kv_heads;
    const int chunks = (group + GROUP_MAX - 1) / GROUP_MAX;
    const int kv_head = blockIdx.x / chunks;
    const int head0 = kv_head * group + (blockIdx.x % chunks) * GROUP_MAX;
    const int heads = min(GROUP_MAX, kv_head * group + group - head0);
    const int seq_len = seq_lens[seq];
    const int begin = (window > 0 ? max(0, seq_len - window) : 0) + split * partition_tokens;
    const int count = max(min(partition_tokens, seq_len - begin), 0);  // this split's keys

    float* scores = smem;                               // [heads][partition_tokens]
    float* merged = scores + heads * partition_tokens;    // [heads][HEAD_DIM]
    float* stats = merged + heads * HEAD_DIM;           // [heads][2]: max, sum
    const int* table = block_tables + (long long)seq * block_table_stride;
    const long long token_stride = (long long)num_kv_heads * HEAD_DIM;
    const long long head_offset = (long long)kv_head * HEAD_DIM + lane * E;

    // (1) scores: q . k * scale, for each head of the group.
    float qv[GROUP_MAX][E];
#pragma unroll
    for (int g = 0; g < GROUP_MAX; ++g) {
        if (g < heads) {
            load_row<T, E>(q + seq * q_seq_stride + (head0 + g) * q_head_stride + lane * E, qv[g]);
#pragma unroll
            for (int e = 0; e < E; ++e) qv[g][e] *= scale;
        }
    }
    // Unrolled so that several keys' loads are in flight at once.
#pragma unroll 4
    for (int i = warp; i < count; i += ATTN_WARPS) {
        const int pos = begin + i;
        const long long slot = (long long)table[pos / block_size] * block_size + pos % block_size;
        float kf[E];
        load_row<T, E>(k_cache + slot * token_stride + head_offset, kf);
#pragma unroll
        for (int g = 0; g < GROUP_MAX; ++g) {
            if (g < heads) {
                float s = 0.f;
#pragma unroll
                for (int e = 0; e < E; ++e) s = fmaf(qv[g][e], kf[e], s);
                s = warp_sum(s);
                if (lane == 0) scores[g * partition_tokens + i] = s;
            }
        }
    }
    __syncthreads();

    // (2) softmax numerators in place, and per head its max and sum.
    for (int g = warp; g < heads; g += ATTN_WARPS) {
        float* row = scores + g * partition_tokens;
        float m = -NS_INF;
        for (int i = lane; i < count; i += 32) m = fmaxf(m, row[i]);
        m = warp_max(m);
        float l = 0.f;
        for (int i = lane; i < count; i += 32) {
            const float p = expf(row[i] - m);
            row[i] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) {
            stats[2 * g] = m;
            stats[2 * g + 1] = l;
        }
    }
    __syncthreads();

    // (3) sum of p * v, each warp over its keys, then the warps' sums added in order.
    float acc[GROUP_MAX][E];
#pragma unroll
    for (int g = 0; g < GROUP_MAX; ++g)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = 0.f;
#pragma unroll 4
    for (int i = warp; i < count; i += ATTN_WARPS) {
        const int pos = begin + i;
        const long long slot = (long long)table[pos / block_size] * block_size + pos % block_size;
        float vf[E];
        load_row<T, E>(v_cache + slot * token_stride + head_offset, vf);
#pragma unroll
        for (int g = 0; g < GROUP_MAX; ++g) {
            if (g < heads) {
                const float p = scores[g * partition_tokens + i];
#pragma unroll
                for (int e = 0; e < E; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
            }
        }
    }
    for (int w = 0; w < ATTN_WARPS; ++w) {
        if (warp == w) {
#pragma unroll
            for (int g = 0; g < GROUP_MAX; ++g) {
                if (g < heads) {
#pragma unroll
                    for (int e = 0; e < E; ++e) {
                        float* cell = merged + g * HEAD_DIM + lane * E + e;
                        *cell = (w == 0 ? 0.f : *cell) + acc[g][e];
                    }
                }
            }
        }
        __syncthreads();
    }

    for (int idx = threadIdx.x; idx < heads * HEAD_DIM; idx += ATTN_THREADS) {
        const int g = idx / HEAD_DIM, d = idx % HEAD_DIM;
        const long long row = (long long)seq * num_heads + head0 + g;
        if (num_splits == 1) {
            const float l = count > 0 ? stats[2 * g + 1] : 0.f;
            out[row * HEAD_DIM + d] = T::store(l > 0.f ? merged[idx] / l : 0.f);
        } else {
            split_out[(row * num_splits + split) * HEAD_DIM + d] = count > 0 ? merged[idx] : 0.f;
            if (d == 0) {
                split_max[row * num_splits + split] = count > 0 ? stats[2 * g] : -NS_INF;
                split_sum[row * num_splits + split] = count > 0 ? stats[2 * g + 1] : 0.f;
            }
        }
    }
}

// Merges the splits of each (sequence, head): weights exp(max_s - max) on each split's sum and output.
template <typename T>
__device__ __forceinline__ void paged_attention_combine(
    typename T::storage* __restrict__ out, const float* __restrict__ split_out,
    const float* __restrict__ split_max, const float* __restrict__ split_sum,
    int num_heads, int head_dim, int num_splits) {
    const long long row = (long long)blockIdx.y * num_heads + blockIdx.x;
    const float* maxes = split_max + row * num_splits;
    const float* sums = split_sum + row * num_splits;
    float m = -NS_INF;
    for (int s = 0; s < num_splits; ++s) m = fmaxf(m, maxes[s]);
    float denominator = 0.f;
    for (int s = 0; s < num_splits; ++s)
        if (sums[s] > 0.f) denominator += expf(maxes[s] - m) * sums[s];
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float numerator = 0.f;
        for (int s = 0; s < num_splits; ++s)
            if (sums[s] > 0.f) numerator += expf(maxes[s] - m) * split_out[(row * num_splits + s) * head_dim + d];
        out[row * head_dim + d] = T::store(denominator > 0.f ? numerator / denominator : 0.f);
    }
}

#define ATTENTION_PARAMS(S)                                                                              \
    S* __restrict__ out, float* __restrict__ split_out, float* __restrict__ split_max,                 \
        float* __restrict__ split_sum, const S* __restrict__ q, long long q_seq_stride,                 \
        long long q_head_stride, const S* __restrict__ k_cache, const S* __restrict__ v_cache,           \
        const int* __restrict__ block_tables, int block_table_stride, const int* __restrict__ seq_lens, \
        int num_heads, int num_kv_heads, int block_size, int window, float scale, int partition_tokens,   \
        int num_splits
#define ATTENTION_ARGS                                                                                  \
    out, split_out, split_max, split_sum, q, q_seq_stride, q_head_stride, k_cache, v_cache,            \
        block_tables, block_table_stride, seq_lens, num_heads, num_kv_heads, block_size, window, scale, \
        partition_tokens, num_splits

// One entry point per (storage type, head dim): paged_attention_decode_<dtype>_d<head_dim>.
#define DEFINE_DECODE(DTYPE, T, D)                                                                       \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS)                        \
        paged_attention_decode_##DTYPE##_d##D(ATTENTION_PARAMS(T::storage)) {                           \
        paged_attention_decode<T, D>(ATTENTION_ARGS);                                                   \
    }
#define DEFINE_COMBINE(DTYPE, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) paged_attention_combine_##DTYPE(         \
        T::storage* __restrict__ out, const float* __restrict__ split_out,                              \
        const float* __restrict__ split_max, const float* __restrict__ split_sum, int num_heads,        \
        int head_dim, int num_splits) {                                                                 \
        paged_attention_combine<T>(out, split_out, split_max, split_sum, num_heads, head_dim, num_splits); \
    }

#define DEFINE_DTYPE(DTYPE, T) \
    DEFINE_DECODE(DTYPE, T, 64)  \
    DEFINE_DECODE(DTYPE, T, 128) \
    DEFINE_DECODE(DTYPE, T, 256) \
    DEFINE_COMBINE(DTYPE, T)

DEFINE_DTYPE(bf16, Bf16)
DEFINE_DTYPE(f16, F16)
DEFINE_DTYPE(f32, F32)
