"""``nearshore gpu-check``: kernels against references, parity with llama.cpp, cross-talk, decode timing."""
