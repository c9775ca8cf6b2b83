"""Compiles the CUDA kernels (gpu/kernels) with NVRTC and assembles them with ptxas, with or without a GPU.

NVRTC and ptxas need no GPU and no driver: the `nvidia-cuda-nvrtc-cu12` and `nvidia-cuda-nvcc-cu12` wheels
(the `dev` extra) carry them, so a CPU machine can check that every kernel compiles for its target
architectures and that none spills registers or runs out of shared memory. NVRTC is loaded with ctypes
(no CuPy needed). On a GPU, gpu/cuda_kernels.py compiles the same sources, from :func:`source`, through CuPy.

``python -m gpu.kernel_build`` prints each kernel's registers, spills and shared memory for sm_80 and sm_90.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

KERNEL_DIR = Path(__file__).parent / "kernels"
SOURCES = {"paged_attention": "paged_attention.cu", "sampling": "sampling.cu"}
# The options every build uses, here and through CuPy on a GPU: the same source must give the same code.
COMPILE_OPTIONS = ("--std=c++17",)
ARCHITECTURES = ("sm_80", "sm_90")
_INCLUDE = re.compile(r'^#include "([\w.]+)"\s*$', re.MULTILINE)


class KernelBuildError(RuntimeError):
    """A compiler or assembler failed; the message carries its log."""


class CompilerUnavailable(KernelBuildError):
    """NVRTC or ptxas cannot be found or loaded on this machine."""


@dataclass(frozen=True, slots=True)
class KernelResources:
    """What ptxas reports for one kernel on one architecture."""

    name: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    shared_bytes: int  # static shared memory; dynamic shared memory is the launcher's (cuda_kernels)


@dataclass(frozen=True, slots=True)
class Built:
    arch: str
    ptx: str
    cubin: bytes
    resources: dict[str, KernelResources]


def source(name: str) -> str:
    """The kernel file ``SOURCES[name]`` with its local includes inlined, so it compiles with no include path
    (and CuPy's cache, keyed by the source text, sees a change to a shared header)."""
    path = KERNEL_DIR / SOURCES[name]
    seen: set[str] = set()

    def inline(match: re.Match[str]) -> str:
        header = match.group(1)
        if header in seen:
            return ""
        seen.add(header)
        return _INCLUDE.sub(inline, (KERNEL_DIR / header).read_text())

    return _INCLUDE.sub(inline, path.read_text())


def _wheel_path(*parts: str) -> Path | None:
    """A file inside the `nvidia` namespace package of the NVIDIA pip wheels, if installed."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root, *parts)
        if candidate.exists():
            return candidate
    return None


@cache
def _nvrtc() -> ctypes.CDLL:
    candidates = [_wheel_path("cuda_nvrtc", "lib", "libnvrtc.so.12"), ctypes.util.find_library("nvrtc")]
    errors = []
    for candidate in filter(None, candidates):
        try:
            return ctypes.CDLL(str(candidate))
        except OSError as exc:
            errors.append(str(exc))
    raise CompilerUnavailable(f"NVRTC not found (pip install nvidia-cuda-nvrtc-cu12): {errors}")


def nvrtc_available() -> bool:
    try:
        _nvrtc()
    except CompilerUnavailable:
        return False
    return True


def nvrtc_version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def ptxas_path() -> Path | None:
    found = _wheel_path("cuda_nvcc", "bin", "ptxas") or shutil.which("ptxas")
    return Path(found) if found else None


def _read(lib: ctypes.CDLL, prog: ctypes.c_void_p, what: str) -> bytes:
    size = ctypes.c_size_t()
    getattr(lib, f"nvrtcGet{what}Size")(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    getattr(lib, f"nvrtcGet{what}")(prog, buf)
    return buf.raw[: size.value]


def compile_ptx(
    code: str, arch: str = "sm_90", filename: str = "kernel.cu", options: tuple[str, ...] = COMPILE_OPTIONS
) -> str:
    """PTX for the virtual architecture of ``arch`` (sm_90 -> compute_90); raises with the compiler's log."""
    lib = _nvrtc()
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    prog = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), filename.encode(), 0, None, None)
    if status:
        raise KernelBuildError(f"nvrtcCreateProgram: {lib.nvrtcGetErrorString(status).decode()}")
    try:
        argv = [f"-arch={arch.replace('sm_', 'compute_')}", *options]
        array = (ctypes.c_char_p * len(argv))(*(a.encode() for a in argv))
        status = lib.nvrtcCompileProgram(prog, len(argv), array)
        log = _read(lib, prog, "ProgramLog").rstrip(b"\0").decode(errors="replace")
        if status:
            raise KernelBuildError(f"{filename} for {arch} failed to compile:\n{log}")
        return _read(lib, prog, "PTX").rstrip(b"\0").decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


_FUNCTION = re.compile(r"Compiling entry function '(\w+)' for")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse_ptxas_log(log: str) -> dict[str, KernelResources]:
    """Per-kernel figures from ``ptxas -v`` output."""
    out: dict[str, KernelResources] = {}
    name, stack = None, (0, 0, 0)
    for line in log.splitlines():
        if m := _FUNCTION.search(line):
            name, stack = m.group(1), (0, 0, 0)
        elif (m := _STACK.search(line)) and name:
            stack = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and name:
            out[name] = KernelResources(
                name=name,
                registers=int(m.group(1)),
                stack_bytes=stack[0],
                spill_store_bytes=stack[1],
                spill_load_bytes=stack[2],
                shared_bytes=int(m.group(2) or 0),
            )
    return out


def assemble(ptx: str, arch: str = "sm_90") -> tuple[bytes, dict[str, KernelResources]]:
    """A cubin for ``arch`` from PTX with ``ptxas -v``, and what it reports per kernel."""
    ptxas = ptxas_path()
    if ptxas is None:
        raise CompilerUnavailable("ptxas not found (pip install nvidia-cuda-nvcc-cu12)")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        src.write_text(ptx)
        done = subprocess.run(
            [str(ptxas), f"-arch={arch}", "-v", str(src), "-o", str(dst)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode:
            raise KernelBuildError(f"ptxas -arch={arch} failed:\n{done.stderr}")
        return dst.read_bytes(), parse_ptxas_log(done.stderr + done.stdout)


def build(name: str, archs: tuple[str, ...] = ARCHITECTURES) -> dict[str, Built]:
    """Compile and assemble kernel file ``name`` for each architecture."""
    code = source(name)
    built = {}
    for arch in archs:
        ptx = compile_ptx(code, arch, SOURCES[name])
        cubin, resources = assemble(ptx, arch)
        built[arch] = Built(arch, ptx, cubin, resources)
    return built


def main() -> None:
    print(f"NVRTC {'.'.join(map(str, nvrtc_version()))}, ptxas {ptxas_path()}")
    for name in SOURCES:
        for arch, result in build(name).items():
            for r in result.resources.values():
                print(
                    f"{arch} {r.name}: {r.registers} registers, spills {r.spill_store_bytes}/"
                    f"{r.spill_load_bytes} B, stack {r.stack_bytes} B, static smem {r.shared_bytes} B"
                )


if __name__ == "__main__":
    main()
