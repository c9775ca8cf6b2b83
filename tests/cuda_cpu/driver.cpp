// Launches gpu/kernels' kernels on the CPU emulation, as gpu/cuda_kernels.py's KernelCalls describe them:
// calls.txt holds one line per launch (kernel name, grid x y z, block x, shared bytes, then the scalar
// arguments in the kernel's order); each pointer argument is a raw file NAME.bin, written back after the
// launches. Each kernel is called directly, so the compiler checks the argument list against the kernel.
//
// Built once per kernel file: -DATTENTION with paged_attention.cu as kernel.cu, -DSAMPLING with sampling.cu.
#include "cuda_on_cpu.h"

#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernel.cu"

static std::string dir;
static std::map<std::string, std::vector<unsigned char>> buffers;

// The argument file NAME.bin, read once and kept (several launches share buffers).
template <typename T>
static T* buf(const std::string& name) {
    auto found = buffers.find(name);
    if (found == buffers.end()) {
        std::ifstream in(dir + "/" + name + ".bin", std::ios::binary);
        if (!in) throw std::runtime_error("missing " + name + ".bin");
        found = buffers.emplace(name, std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {})).first;
    }
    return reinterpret_cast<T*>(found->second.data());
}

template <typename T>
static T next(std::istream& in) {
    T v;
    if (!(in >> v)) throw std::runtime_error("calls.txt: an argument is missing");
    return v;
}

#ifdef ATTENTION
// Each entry reads its scalars and its buffers (before any thread runs: the buffer map is not thread-safe),
// and returns the body every thread of the launch runs.
#define DECODE(DTYPE, D, S)                                                                                 \
    {"paged_attention_decode_" #DTYPE "_d" #D, [](std::istream& in) -> std::function<void()> {            \
         auto q_seq_stride = next<long long>(in), q_head_stride = next<long long>(in);                      \
         auto table_stride = next<int>(in), num_heads = next<int>(in), num_kv_heads = next<int>(in);        \
         auto block_size = next<int>(in), window = next<int>(in);                                          \
         auto scale = next<float>(in);                                                                      \
         auto partition_tokens = next<int>(in), num_splits = next<int>(in);                                 \
         S *out = buf<S>("out"), *q = buf<S>("q"), *k = buf<S>("k_cache"), *v = buf<S>("v_cache");         \
         float *split_out = buf<float>("split_out"), *split_max = buf<float>("split_max");                 \
         float* split_sum = buf<float>("split_sum");                                                        \
         int *tables = buf<int>("block_tables"), *lens = buf<int>("seq_lens");                              \
         return [=] {                                                                                       \
             paged_attention_decode_##DTYPE##_d##D(out, split_out, split_max, split_sum, q, q_seq_stride,   \
                                                   q_head_stride, k, v, tables, table_stride, lens,         \
                                                   num_heads, num_kv_heads, block_size, window, scale,      \
                                                   partition_tokens, num_splits);                           \
         };                                                                                                 \
     }}
#define COMBINE(DTYPE, S)                                                                                   \
    {"paged_attention_combine_" #DTYPE, [](std::istream& in) -> std::function<void()> {                   \
         auto num_heads = next<int>(in), head_dim = next<int>(in), num_splits = next<int>(in);              \
         S* out = buf<S>("out");                                                                            \
         float *split_out = buf<float>("split_out"), *split_max = buf<float>("split_max");                 \
         float* split_sum = buf<float>("split_sum");                                                        \
         return [=] {                                                                                       \
             paged_attention_combine_##DTYPE(out, split_out, split_max, split_sum, num_heads, head_dim,    \
                                             num_splits);                                                   \
         };                                                                                                 \
     }}
typedef unsigned short U16;
static const std::map<std::string, std::function<std::function<void()>(std::istream&)>> kernels = {
    DECODE(bf16, 64, U16),  DECODE(bf16, 128, U16), DECODE(bf16, 256, U16), DECODE(f16, 64, U16),
    DECODE(f16, 128, U16),  DECODE(f16, 256, U16),  DECODE(f32, 64, float),  DECODE(f32, 128, float),
    DECODE(f32, 256, float), COMBINE(bf16, U16),    COMBINE(f16, U16),       COMBINE(f32, float),
};
#endif

#ifdef SAMPLING
static const std::map<std::string, std::function<std::function<void()>(std::istream&)>> kernels = {
    {"sample_from_logits", [](std::istream& in) -> std::function<void()> {
         auto row_stride = next<long long>(in);
         auto vocab = next<int>(in);
         long long* tokens = buf<long long>("tokens");
         float *logits = buf<float>("logits"), *temperature = buf<float>("temperature");
         float *top_p = buf<float>("top_p"), *min_p = buf<float>("min_p"), *uniform = buf<float>("uniform");
         int* top_k = buf<int>("top_k");
         return [=] {
             sample_from_logits(tokens, logits, row_stride, vocab, temperature, top_k, top_p, min_p, uniform);
         };
     }},
};
#endif

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: driver DIR (with calls.txt and the arguments' files)\n";
        return 2;
    }
    dir = argv[1];
    std::ifstream calls(dir + "/calls.txt");
    std::string line;
    while (std::getline(calls, line)) {
        std::istringstream in(line);
        std::string name;
        dim3 grid, block;
        size_t shared;
        in >> name >> grid.x >> grid.y >> grid.z >> block.x >> shared;
        auto body = kernels.at(name)(in);
        emu::launch(grid, block, shared, body);
    }
    for (auto& [name, bytes] : buffers) {
        std::ofstream out(dir + "/" + name + ".bin", std::ios::binary);
        out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    return 0;
}
