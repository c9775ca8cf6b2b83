// Fused sampling: temperature, top-k, top-p and min-p, then an inverse-CDF draw from one uniform per row,
// choosing the token gpu/sampler.py's draw() chooses for the same inputs (exact ties aside), without sorting
// the vocabulary.
//
// One block per row. With e_i = exp(x_i / T - max), the filters keep a prefix of the tokens in descending
// order, which is the set {e_i >= tau} for a threshold tau:
//   top-k keeps e_i >= the k-th largest value; top-p keeps tokens up to the first whose inclusive cumulative
//   mass reaches top_p, i.e. e_i >= max{t : M(t) >= top_p * Z} with M(t) = sum of e_i >= t; min-p keeps
//   e_i >= min_p (e_max = 1); the most likely token always stays.
// The draw is another threshold: the token whose descending cumulative mass first exceeds u * M(tau) has
// value max{t : M(t) > u * M(tau)}. Both are "the largest t where a monotone predicate of (count, mass of
// e_i >= t) holds", found by a radix search over the bits of t (positive floats order as their bits): four
// passes over the row, each a 256-bin histogram of count and mass in shared memory. Masses are summed in
// 40-bit fixed point with integer atomics, so a row's result never depends on the order threads add in.
#include "common.cuh"

#define SAMPLE_THREADS 1024
#define RADIX_BINS 256
#define FIXED_ONE 1099511627776.0f  // 2^40: e in [0, 1] as an integer; a 2^24-token row cannot overflow

struct SampleShared {
    unsigned int count[RADIX_BINS];
    unsigned long long mass[RADIX_BINS];
    unsigned long long scratch[32];
    unsigned long long total;  // Z, the row's whole mass
    unsigned long long above_mass;
    unsigned int above_count;
    unsigned int prefix;
    int found;
};

struct Row {
    const float* __restrict__ logits;
    int vocab;
    float temperature;
    float max_scaled;
    // The same expression, with no contraction, in every pass: a token's weight is bit-identical each time.
    __device__ __forceinline__ float weight(int i) const {
        return expf(__fsub_rn(__fdiv_rn(logits[i], temperature), max_scaled));
    }
};

__device__ __forceinline__ unsigned long long fixed_point(float e) {
    return __float2ull_rz(__fmul_rn(e, FIXED_ONE));
}

template <typename V, typename Op>
__device__ V block_reduce(V v, Op op, V identity, SampleShared& sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    V* scratch = reinterpret_cast<V*>(sh.scratch);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? scratch[lane] : identity;
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    const V result = scratch[0];
    __syncthreads();
    return result;
}

struct MaxF { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct MinU { __device__ unsigned int operator()(unsigned int a, unsigned int b) const { return min(a, b); } };
struct MinI { __device__ int operator()(int a, int b) const { return min(a, b); } };
struct SumU64 {
    __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a + b; }
};

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(FULL_MASK, x, offset);
    return x;
}

// Adds the warp's participating lanes to the histogram. A row's long tail shares few bins (its exponents),
// so up to four bins shared by several lanes are added once per warp; the rest lane by lane. Called by
// whole warps (the ballots must see every lane).
__device__ __forceinline__ void add_to_histogram(bool in, unsigned int bin, unsigned long long mass,
                                                 SampleShared& sh) {
    const int lane = threadIdx.x % 32;
    unsigned int todo = __ballot_sync(FULL_MASK, in);
#pragma unroll 1
    for (int round = 0; round < 4 && __popc(todo) > 1; ++round) {
        const int leader = __ffs(todo) - 1;
        const unsigned int shared_bin = __shfl_sync(FULL_MASK, bin, leader);
        const bool mine = in && bin == shared_bin;
        const unsigned int same = __ballot_sync(FULL_MASK, mine);
        const unsigned long long sum = warp_sum_u64(mine ? mass : 0ull);
        if (lane == leader) {
            atomicAdd(&sh.count[shared_bin], (unsigned int)__popc(same));
            atomicAdd(&sh.mass[shared_bin], sum);
        }
        todo &= ~same;
    }
    if (todo & (1u << lane)) {
        atomicAdd(&sh.count[bin], 1u);
        atomicAdd(&sh.mass[bin], mass);
    }
}

// The largest bit pattern t for which pred(count of e_i >= t, mass of e_i >= t, Z) holds, pred being true
// for small t and false for large; false when it holds for no t. Each round, warp 0 finds the bin: lane L
// owns bins 8L..8L+7, a suffix scan over lanes gives what lies above each lane's bins.
template <typename Pred>
__device__ bool radix_search(const Row& row, Pred pred, unsigned int& result, SampleShared& sh) {
    const int lane = threadIdx.x % 32;
    unsigned int prefix = 0, above_count = 0;
    unsigned long long above_mass = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < RADIX_BINS; b += blockDim.x) {
            sh.count[b] = 0;
            sh.mass[b] = 0;
        }
        __syncthreads();
        const unsigned int high = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        for (int base = threadIdx.x - lane; base < row.vocab; base += blockDim.x) {
            const int i = base + lane;
            const float e = i < row.vocab ? row.weight(i) : 0.f;
            const unsigned int bits = __float_as_uint(e);
            const bool in = i < row.vocab && (bits & high) == prefix;
            add_to_histogram(in, (bits >> shift) & (RADIX_BINS - 1), fixed_point(e), sh);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            unsigned int lane_count = 0;
            unsigned long long lane_mass = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                lane_count += sh.count[8 * lane + j];
                lane_mass += sh.mass[8 * lane + j];
            }
            const unsigned long long total = shift == 24 ? warp_sum_u64(lane_mass) : sh.total;
            unsigned int count_from = lane_count;  // bins of this lane and the lanes above
            unsigned long long mass_from = lane_mass;
#pragma unroll
            for (int offset = 1; offset < 32; offset <<= 1) {
                const unsigned int c = __shfl_down_sync(FULL_MASK, count_from, offset);
                const unsigned long long m = __shfl_down_sync(FULL_MASK, mass_from, offset);
                if (lane + offset < 32) {
                    count_from += c;
                    mass_from += m;
                }
            }
            unsigned int c = above_count + count_from - lane_count;
            unsigned long long m = above_mass + mass_from - lane_mass;
            int digit = -1;
            for (int j = 7; j >= 0; --j) {
                c += sh.count[8 * lane + j];
                m += sh.mass[8 * lane + j];
                if (pred(c, m, total)) {
                    digit = 8 * lane + j;
                    break;
                }
            }
            const unsigned int hits = __ballot_sync(FULL_MASK, digit >= 0);
            // pred is monotone: the highest lane with a hit holds the largest bin.
            if (lane == (hits ? 31 - __clz(hits) : 0)) {
                sh.found = hits != 0;
                if (shift == 24) sh.total = total;
                if (hits) {
                    sh.prefix = prefix | ((unsigned int)digit << shift);
                    sh.above_count = c - sh.count[digit];
                    sh.above_mass = m - sh.mass[digit];
                }
            }
        }
        __syncthreads();
        if (!sh.found) return false;
        prefix = sh.prefix;
        above_count = sh.above_count;
        above_mass = sh.above_mass;
    }
    result = prefix;
    return true;
}

// tokens[row] for each row of logits [rows, vocab] (fp32, after penalties); temperature <= 0 is greedy
// (the first index of the maximum, as torch.argmax); top_k <= 0 or >= vocab, top_p >= 1, min_p <= 0 are off.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1) sample_from_logits(
    long long* __restrict__ tokens, const float* __restrict__ logits, long long row_stride, int vocab,
    const float* __restrict__ temperature, const int* __restrict__ top_k, const float* __restrict__ top_p,
    const float* __restrict__ min_p, const float* __restrict__ uniform) {
    __shared__ SampleShared sh;
    const int r = blockIdx.x;
    Row row{logits + r * row_stride, vocab, temperature[r], 0.f};

    float max_logit = -NS_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) max_logit = fmaxf(max_logit, row.logits[i]);
    max_logit = block_reduce(max_logit, MaxF(), -NS_INF, sh);
    if (!(row.temperature > 0.f)) {
        int first = vocab;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            if (row.logits[i] == max_logit) first = min(first, i);
        first = block_reduce(first, MinI(), vocab, sh);
        if (threadIdx.x == 0) tokens[r] = first < vocab ? first : 0;
        return;
    }
    row.max_scaled = __fdiv_rn(max_logit, row.temperature);  // division by t > 0 keeps the order

    // The filters' threshold tau, as float bits.
    const int k = top_k[r];
    const float p = top_p[r];
    const bool use_k = k > 0 && k < vocab, use_p = p < 1.f;
    unsigned int tau = 0;
    if (use_k || use_p) {
        auto keeps = [=](unsigned int c, unsigned long long m, unsigned long long total) {
            return (use_k && c >= (unsigned int)k) || (use_p && (double)m >= (double)p * (double)total);
        };
        unsigned int found;
        if (radix_search(row, keeps, found, sh)) tau = found;
    }
    if (min_p[r] > 0.f) tau = max(tau, __float_as_uint(min_p[r]));
    tau = min(tau, __float_as_uint(1.f));  // e_max == 1: the most likely token stays
    tau = max(tau, 1u);  // a token of weight 0 (a grammar forbids it, or it underflowed) is never kept

    unsigned long long kept = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float e = row.weight(i);
        if (__float_as_uint(e) >= tau) kept += fixed_point(e);
    }
    kept = block_reduce(kept, SumU64(), 0ull, sh);

    // The draw: the value where the descending cumulative mass first exceeds u * kept.
    const double target = (double)uniform[r] * (double)kept;
    auto past = [=](unsigned int, unsigned long long m, unsigned long long) { return (double)m > target; };
    unsigned int pick;
    if (!radix_search(row, past, pick, sh) || pick < tau) {
        // u rounded to 1: the least likely kept token, as draw() clamps to the last kept one.
        pick = 0xffffffffu;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const unsigned int bits = __float_as_uint(row.weight(i));
            if (bits >= tau) pick = min(pick, bits);
        }
        pick = block_reduce(pick, MinU(), 0xffffffffu, sh);
    }
    int token = vocab;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (__float_as_uint(row.weight(i)) == pick) token = min(token, i);
    token = block_reduce(token, MinI(), vocab, sh);
    if (threadIdx.x == 0) tokens[r] = token < vocab ? token : 0;  // none only for a row of NaN
}
