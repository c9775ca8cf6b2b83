// Launches one of gpu/kernels' kernels on the CPU emulation, on arrays in raw files: the tests write the
// inputs and a launch.txt (the kernel's name, then its grid, block, shared bytes and scalar arguments as
// gpu/cuda_kernels.py computes them), run this, and read the outputs back.
//
// Built once per kernel file: -DATTENTION with paged_attention.cu as kernel.cu, -DSAMPLING with sampling.cu.
#include "cuda_on_cpu.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "kernel.cu"

static std::string dir;

static std::vector<unsigned char> read_file(const std::string& name) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

static void write_file(const std::string& name, const void* data, size_t bytes) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(static_cast<const char*>(data), bytes);
}

template <typename T>
static T* data_of(std::vector<unsigned char>& bytes) {
    return reinterpret_cast<T*>(bytes.data());
}

#ifdef ATTENTION
typedef void (*Decode)(void*, float*, float*, float*, const void*, long long, long long, const void*,
                       const void*, const int*, int, const int*, int, int, int, int, float, int, int);
typedef void (*Combine)(void*, const float*, const float*, const float*, int, int, int);

#define ENTRY(DTYPE, D) {#DTYPE "_d" #D, reinterpret_cast<Decode>(&paged_attention_decode_##DTYPE##_d##D)}
static const std::map<std::string, Decode> decoders = {
    ENTRY(bf16, 64), ENTRY(bf16, 128), ENTRY(bf16, 256), ENTRY(f16, 64),  ENTRY(f16, 128),
    ENTRY(f16, 256), ENTRY(f32, 64),   ENTRY(f32, 128),  ENTRY(f32, 256),
};
static const std::map<std::string, Combine> combiners = {
    {"bf16", reinterpret_cast<Combine>(&paged_attention_combine_bf16)},
    {"f16", reinterpret_cast<Combine>(&paged_attention_combine_f16)},
    {"f32", reinterpret_cast<Combine>(&paged_attention_combine_f32)},
};

static int run(std::istream& launch) {
    std::string dtype;
    dim3 grid, block;
    size_t shared;
    long long q_seq_stride, q_head_stride;
    int head_dim, table_stride, num_seqs, num_heads, num_kv_heads, block_size, window, partition, splits;
    float scale;
    launch >> dtype >> head_dim >> grid.x >> grid.y >> grid.z >> block.x >> shared >> q_seq_stride >>
        q_head_stride >> table_stride >> num_seqs >> num_heads >> num_kv_heads >> block_size >> window >>
        scale >> partition >> splits;
    auto q = read_file("q.bin"), k = read_file("k.bin"), v = read_file("v.bin");
    auto tables = read_file("tables.bin"), lens = read_file("lens.bin");
    const size_t item = dtype == "f32" ? 4 : 2;
    std::vector<unsigned char> out((size_t)num_seqs * num_heads * head_dim * item, 0xff);
    const size_t split_rows = (size_t)num_seqs * num_heads * splits;
    std::vector<float> split_out(split_rows * head_dim, NAN), split_max(split_rows, NAN), split_sum(split_rows, NAN);
    Decode decode = decoders.at(dtype + "_d" + std::to_string(head_dim));
    emu::launch(grid, block, shared, [&] {
        decode(out.data(), split_out.data(), split_max.data(), split_sum.data(), q.data(), q_seq_stride,
               q_head_stride, k.data(), v.data(), data_of<int>(tables), table_stride, data_of<int>(lens),
               num_heads, num_kv_heads, block_size, window, scale, partition, splits);
    });
    if (splits > 1) {
        Combine combine = combiners.at(dtype);
        emu::launch({(unsigned)num_heads, (unsigned)num_seqs, 1}, {128, 1, 1}, 0, [&] {
            combine(out.data(), split_out.data(), split_max.data(), split_sum.data(), num_heads, head_dim, splits);
        });
    }
    write_file("out.bin", out.data(), out.size());
    return 0;
}
#endif

#ifdef SAMPLING
static int run(std::istream& launch) {
    dim3 grid, block;
    size_t shared;
    long long row_stride;
    int vocab;
    launch >> grid.x >> block.x >> shared >> row_stride >> vocab;
    auto logits = read_file("logits.bin"), temperature = read_file("temperature.bin");
    auto top_k = read_file("top_k.bin"), top_p = read_file("top_p.bin"), min_p = read_file("min_p.bin");
    auto uniform = read_file("uniform.bin");
    std::vector<long long> tokens(grid.x, -1);
    emu::launch(grid, block, shared, [&] {
        sample_from_logits(tokens.data(), data_of<float>(logits), row_stride, vocab, data_of<float>(temperature),
                           data_of<int>(top_k), data_of<float>(top_p), data_of<float>(min_p),
                           data_of<float>(uniform));
    });
    write_file("tokens.bin", tokens.data(), tokens.size() * sizeof(long long));
    return 0;
}
#endif

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: driver DIR (with launch.txt and the inputs)\n";
        return 2;
    }
    dir = argv[1];
    std::ifstream launch(dir + "/launch.txt");
    return run(launch);
}
