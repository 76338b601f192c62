"""Compile a Triton kernel, specialised as a real launch would be, for GPUs this machine lacks.

Why: a CUDA-to-ROCm port rewrites custom operators in Triton, and a kernel that runs in Triton's
CPU interpreter (or on the NVIDIA reference) may still not compile for an AMD GPU: inline PTX,
CUDA-only libdevice calls, a shape the AMD backend rejects. Triton ships its compilers for both
vendors (ptxas for NVIDIA, an AMD LLVM and assembler), so a CPU-only CI machine can build the
kernel for gfx942 (MI300) and find out, without an AMD GPU. Compiling is not running: a kernel
that compiles may still compute differently, which is what the parity checks and the operator
fuzzing are for.

    from pytest_rocm_parity.fuzz.triton_targets import assert_compiles_for
    assert_compiles_for(my_kernel, x, y, n, BLOCK=128, targets=("gfx942", "gfx90a"))

The arguments are those of a launch (``my_kernel[grid](x, y, n, BLOCK=128)``): tensors give the
pointer dtypes, Python ints and floats the scalar types, ``tl.constexpr`` parameters their values.
For an autotuned kernel, pass one configuration's values as keywords: each is a separate build.
Each target compiles in a subprocess, which imports the kernel's module (or runs its file, for a
test module or a script): Triton's assembler reports on the process's stderr, and the user's
process may have Triton in interpreter mode (TRITON_INTERPRET=1), which compiles nothing.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import json
import numbers
import os
import re
import subprocess
import sys
import textwrap
import warnings
from typing import Any

from pytest_rocm_parity.errors import InvalidArgument, ParityError

# name -> (backend, arch, warp size) for triton.backends.compiler.GPUTarget, and the GPU it is
TARGETS: dict[str, tuple[str, Any, int, str]] = {
    "sm_80": ("cuda", 80, 32, "NVIDIA A100"),
    "sm_90": ("cuda", 90, 32, "NVIDIA H100/H200"),
    "sm_100": ("cuda", 100, 32, "NVIDIA B200"),
    "gfx90a": ("hip", "gfx90a", 64, "AMD MI250/MI210"),
    "gfx942": ("hip", "gfx942", 64, "AMD MI300X/MI300A/MI325X"),
    "gfx950": ("hip", "gfx950", 64, "AMD MI350X/MI355X"),
    "gfx1100": ("hip", "gfx1100", 32, "AMD Radeon RX 7900 / PRO W7900"),
}
DEFAULT_TARGETS = ("sm_90", "gfx942", "gfx90a")


# threads one block (workgroup) may have, on every GPU named here: CUDA's limit and HIP's
MAX_BLOCK_THREADS = 1024


# bytes of shared memory (LDS on AMD) one block may take, by NVIDIA compute capability (the opt-in
# maximum, which Triton's launcher requests); None where this check does not know the GPU
_NVIDIA_SHARED = {70: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448,
                  100: 232448, 120: 101376}


def shared_memory_limit(name: str) -> int | None:
    """Bytes of shared memory (LDS) a block of target ``name`` may have: 160 KiB on gfx950, 64 KiB on
    other AMD GPUs (CDNA's LDS, RDNA's per-workgroup share), NVIDIA's per-block maximum by arch."""
    backend, arch, _, _ = resolve_target(name)
    if backend == "hip":
        return 160 * 1024 if arch == "gfx950" else 64 * 1024
    return _NVIDIA_SHARED.get(int(arch))


def resolve_target(name: str) -> tuple[str, Any, int, str]:
    """(backend, arch, warp size, GPU) of a target: a name of TARGETS, or any "gfxNNNN" (wave64 on
    gfx9, wave32 on gfx10-12) or "sm_NN" (the doctor asks for the visible GPUs' own archs)."""
    from pytest_rocm_parity.migration.backend import infer_warp_size

    if name in TARGETS:
        return TARGETS[name]
    if re.fullmatch(r"gfx[0-9a-f]{3,4}", name):
        return "hip", name, infer_warp_size("rocm", name), f"AMD {name}"
    m = re.fullmatch(r"sm_(\d{2,3})a?", name)
    if m:
        return "cuda", int(m.group(1)), 32, f"NVIDIA {name}"
    raise InvalidArgument(f"target {name!r}: unknown; pass one of {sorted(TARGETS)}, a gfx arch (gfx1201) or "
                          f"an sm_ arch (sm_89)")

_TORCH_TO_TRITON = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int8": "i8",
                    "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1",
                    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "float8_e4m3fnuz": "fp8e4b8",
                    "float8_e5m2fnuz": "fp8e5b16"}


class TritonTargetError(ParityError):
    """A Triton kernel does not compile for a GPU target."""


class TargetResourceWarning(UserWarning):
    """A kernel compiles for a target but spills registers there: it runs, slower."""


@dataclasses.dataclass
class TargetBuild:
    """What compiling for one target gave: ``ok``, or the compiler's error; and, where the backend
    reports it, the resources the kernel takes (AMD: registers, spills, LDS), which set occupancy."""

    target: str
    gpu: str
    ok: bool
    error: str = ""
    resources: dict[str, int] = dataclasses.field(default_factory=dict)
    # what compiled but costs at run time (register spills), said without failing the build
    notes: list[str] = dataclasses.field(default_factory=list)


def launch_signature(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """(signature, constexprs) of a launch of ``kernel`` with these arguments, in Triton's notation
    ("*fp32" for a float32 tensor, "i32"/"i64" for an int, "fp32" for a float, "constexpr")."""
    fn = _python_function(kernel)
    if fn is kernel:
        _refuse_host_function(fn)
    params = list(inspect.signature(fn).parameters.values())
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgument(f"arguments do not match {fn.__name__}{inspect.signature(fn)}: {exc}; pass them "
                              f"as to a launch, kernel[grid](...), without the grid") from None
    bound.apply_defaults()
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for p in params:
        value = bound.arguments.get(p.name)
        if _is_constexpr(p.annotation) or value is None:
            signature[p.name] = "constexpr"
            constexprs[p.name] = _constexpr_value(p.name, value)
        else:
            signature[p.name] = _type_of(p.name, value)
    return signature, constexprs


# set in the compile worker's environment: a compile_for reached from there is a script's top level
WORKER_MARK = "PYTEST_ROCM_PARITY_COMPILE_WORKER"


def compile_for(kernel: Any, *args: Any, targets: tuple[str, ...] | list[str] = DEFAULT_TARGETS,
                num_warps: int = 4, num_stages: int | None = None, timeout: float = 600.0,
                **kwargs: Any) -> list[TargetBuild]:
    """Compile ``kernel`` as launched with ``args``/``kwargs`` for each of ``targets`` (TARGETS' names)."""
    if os.environ.get(WORKER_MARK):
        # the worker is running a script to find its kernel, and the script compiles at its top level:
        # going on would start a worker per level, each waiting for the next
        raise InvalidArgument(f"compile_for was called while the compile worker loaded {os.environ[WORKER_MARK]}: "
                              f"that file calls it at its top level. Put the call under "
                              f"`if __name__ == \"__main__\":`, or define the kernel in a module of its own")
    if not targets:
        raise InvalidArgument(f"targets=(): name at least one of {sorted(TARGETS)}")
    for t in targets:
        resolve_target(t)
    signature, constexprs = launch_signature(kernel, args, kwargs)
    fn = _python_function(kernel)
    if inspect.getsourcefile(fn) is None or "<locals>" in fn.__qualname__:
        raise InvalidArgument(f"kernel {fn.__qualname__}: define it at the top level of a module file; the "
                              f"compile imports that module in a subprocess to find it")
    options: dict[str, Any] = {"num_warps": num_warps}
    if num_stages is not None:
        options["num_stages"] = num_stages
    job = {"module": fn.__module__, "file": inspect.getsourcefile(fn), "qualname": fn.__qualname__,
           "signature": signature, "constexprs": constexprs, "options": options, "targets": list(targets)}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[WORKER_MARK] = str(job["file"])
    paths = [p for p in sys.path if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env["PYTHONPATH"]] if env.get("PYTHONPATH") else paths)
    proc = subprocess.run([sys.executable, "-m", "pytest_rocm_parity.fuzz.triton_targets"], input=json.dumps(job),
                          capture_output=True, text=True, env=env, timeout=timeout)
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    try:
        rows = json.loads(last[0]) if last else None
    except ValueError:
        rows = None
    if proc.returncode != 0 or not isinstance(rows, list):
        raise TritonTargetError(f"could not compile {fn.__qualname__} (from {job['file']}) in a subprocess: "
                                f"{(proc.stderr or proc.stdout)[-1500:]}")
    return [TargetBuild(**r) for r in rows]


def assert_compiles_for(kernel: Any, *args: Any, targets: tuple[str, ...] | list[str] = DEFAULT_TARGETS,
                        **kwargs: Any) -> list[TargetBuild]:
    """compile_for, raising TritonTargetError that names every target that failed, the compiler's
    message and what to change; returns the builds when all compiled."""
    builds = compile_for(kernel, *args, targets=targets, **kwargs)
    bad = [b for b in builds if not b.ok]
    if bad:
        name = _python_function(kernel).__qualname__
        source = inspect.getsource(_python_function(kernel))
        lines = [f"Triton kernel {name} does not compile for {', '.join(f'{b.target} ({b.gpu})' for b in bad)}; "
                 f"it does for {', '.join(b.target for b in builds if b.ok) or 'none of the targets'}."]
        for b in bad:
            lines.append(f"  {b.target}: {b.error}")
        lines.append(f"Fix: {_advice(source, builds)}")
        raise TritonTargetError("\n".join(lines))
    for b in builds:
        for note in b.notes:
            warnings.warn(TargetResourceWarning(f"{_python_function(kernel).__qualname__} on {b.target} ({b.gpu}): "
                                                f"{note}"), stacklevel=2)
    return builds


def block_threads_error(name: str, num_warps: int) -> str:
    """Why a launch of ``num_warps`` warps cannot run on target ``name``, or "" where it can.

    Why here: Triton compiles any num_warps and only the GPU's loader refuses a block over 1024
    threads, so a CPU-only check would pass a kernel whose every launch fails. The warp is the
    target's: 64 lanes on gfx9 (CDNA), where num_warps=32 tuned on NVIDIA makes 2048 threads.
    """
    _, _, warp, gpu = resolve_target(name)
    threads = num_warps * warp
    if threads <= MAX_BLOCK_THREADS:
        return ""
    return (f"num_warps={num_warps} makes {threads} threads per block on {name} ({gpu}), whose wavefront is "
            f"{warp} lanes: over the {MAX_BLOCK_THREADS} threads a block may have, so Triton compiles it and "
            f"every launch fails on the GPU. Pass num_warps <= {MAX_BLOCK_THREADS // warp} for {name} "
            f"(num_warps x {warp} <= {MAX_BLOCK_THREADS})")


def shared_memory_error(name: str, used: int) -> str:
    """Why a block taking ``used`` bytes of shared memory (LDS) cannot launch on ``name``, or "".

    Why here: as with the threads of a block, the compiler builds it and only the loader refuses, so
    a tile or num_stages sized for an H100's 227 KiB passes a CPU-only compile for a 64 KiB MI300.
    """
    limit = shared_memory_limit(name)
    if limit is None or used <= limit:
        return ""
    _, _, _, gpu = resolve_target(name)
    memory = "LDS" if name.startswith("gfx") else "shared memory"
    return (f"the kernel takes {used} bytes of {memory} per block on {name} ({gpu}), which has {limit} "
            f"({limit // 1024} KiB): Triton compiles it and every launch fails on the GPU (out of resources). "
            f"Lower num_stages (each stage holds its own copy of the tiles) or the tile sizes (BLOCK_*)")


def _spill_notes(resources: dict[str, int]) -> list[str]:
    """The register spills of an AMD build, in words: they compile and run, so they fail nothing,
    yet a kernel spilling hundreds of VGPRs to scratch memory may run several times slower."""
    vgpr, sgpr = resources.get("vgpr_spills", 0), resources.get("sgpr_spills", 0)
    if not vgpr and not sgpr:
        return []
    said = " and ".join(f"{n} {kind}s" for n, kind in ((vgpr, "VGPR"), (sgpr, "SGPR")) if n)
    scratch = resources.get("scratch_bytes", 0)
    return [f"{said} spill ({resources.get('vgprs', 0)} VGPRs in use; {scratch} bytes of scratch memory per "
            f"lane): it runs, slower, as each spilled VGPR goes through memory. Smaller tiles (BLOCK_*), fewer "
            f"num_stages, or more warps for the same tile (within 1024 threads a block) lower the registers "
            f"each lane needs"]


def _advice(source: str, builds: list[TargetBuild]) -> str:
    """What to change, from which targets failed: a kernel no target builds is wrong for every GPU
    (its code or the launch's constants), so AMD-specific advice would mislead there."""
    bad = [b for b in builds if not b.ok]
    if all("threads per block" in b.error for b in bad):
        limits: dict[int, list[str]] = {}
        for b in bad:
            limits.setdefault(MAX_BLOCK_THREADS // resolve_target(b.target)[2], []).append(b.target)
        said = "; ".join(f"<= {n} for {', '.join(t)}" for n, t in sorted(limits.items()))
        return (f"lower num_warps ({said}): a warp is 64 lanes on gfx9 (CDNA) and 32 on NVIDIA and RDNA, so a "
                f"num_warps tuned on NVIDIA can overrun an AMD block; give AMD its own autotune configs (triton.runtime.driver.active.get_current_target()"
                f".arch says which GPU runs).")
    if all("of LDS per block" in b.error or "of shared memory per block" in b.error for b in bad):
        return (f"lower num_stages or the tile sizes for {', '.join(b.target for b in bad)}: a block's shared "
                f"memory is 64 KiB of LDS on gfx90a/gfx942 and 160 KiB on gfx950, where an H100 has 227 KiB, so "
                f"a configuration tuned on NVIDIA can overrun an AMD GPU; give AMD its own autotune configs.")
    if all("per block on" in b.error for b in bad):
        return "each message above names the limit a block overruns and what to lower."
    amd = [b for b in bad if b.target.startswith("gfx")]
    if len(bad) == len(builds) and len(amd) < len(bad):
        return ("the kernel does not compile for any target, NVIDIA's included, so the cause is in the kernel or "
                "the launch's arguments (a constexpr such as a non-power-of-2 BLOCK), not in the port to AMD: "
                "correct what the compiler's message above names.")
    if "inline_asm" in source and amd:
        return ("inline assembly is written for one instruction set (PTX is not AMDGCN): use tl ops, or give "
                "each backend its own asm, chosen by triton.runtime.driver.active.get_current_target().backend.")
    if ("extra.cuda" in source or "libdevice" in source) and amd:
        return "call tl.extra.libdevice (it dispatches per backend) or tl.math instead of CUDA's libdevice."
    if amd and len(amd) == len(bad) and len(bad) < len(builds):
        return ("read the compiler message above; AMD wavefronts are 64 lanes on gfx9 (CDNA), so shapes that "
                "assume 32 lanes per warp, and num_warps tuned for NVIDIA, are the usual suspects.")
    if amd and len(bad) == len(builds):
        return ("read the compiler message above; only AMD targets were named, so add an NVIDIA one (sm_90) to "
                "tell a kernel bug (fails there too) from an AMD-specific one.")
    return "read the compiler message above."


_MESSAGE_CHARS = 700


def _compiler_message(exc: BaseException) -> str:
    """The compiler's refusal on one bounded line, with its cause.

    Triton's frontend errors read "at L:C:", the kernel's source, a caret, then the cause; a failing
    call into a @triton.jit helper carries the helper's error as __cause__. Each level gives its
    location and offending source line, the innermost its cause (arange's range must be a power of 2).
    Other errors keep every non-empty line; past the bound the middle goes, since the cause is last.
    """
    where: list[str] = []
    cause = ""
    err: BaseException | None = exc
    for _ in range(8):
        if err is None:
            break
        lines = [ln.rstrip() for ln in str(err).strip().splitlines()]
        caret = next((i for i in range(len(lines) - 1, 0, -1)
                      if lines[i].strip() and set(lines[i].strip()) <= set("^~")), None)
        if not (lines and re.fullmatch(r"at \d+:\d+:", lines[0].strip()) and caret is not None):
            text = " | ".join(ln.strip() for ln in lines if ln.strip())
            cause = text if err is exc or not where else f"{type(err).__name__}: {text}"
            break
        defs = [m.group(1) for ln in lines[1:caret] for m in [re.match(r"\s*def\s+(\w+)", ln)] if m]
        where.append(f"{'in ' + defs[0] + ' ' if defs else ''}{lines[0].strip()[:-1]} `{lines[caret - 1].strip()}`")
        cause = " ".join(ln.strip() for ln in lines[caret + 1:] if ln.strip())
        if cause:
            break
        err = err.__cause__ or err.__context__
    message = f"{type(exc).__name__}: " + " -> ".join(where) + (": " if where and cause else "") + cause
    if len(message) > _MESSAGE_CHARS:
        half = (_MESSAGE_CHARS - len(" ... ")) // 2
        message = f"{message[:half]} ... {message[-half:]}"
    return message


def _python_function(kernel: Any) -> Any:
    """The plain Python function behind a triton.jit kernel (a JITFunction, or an InterpretedFunction
    when TRITON_INTERPRET=1, under any @triton.autotune / @triton.heuristics wrappers), or the
    function itself (a kernel kept undecorated, as triton_stats' are)."""
    fn = kernel
    for _ in range(8):
        if inspect.isfunction(fn) or not hasattr(fn, "fn"):
            break
        fn = fn.fn
    if not inspect.isfunction(fn):
        raise InvalidArgument(f"kernel={kernel!r}: expected a @triton.jit function")
    return fn


def _is_kernel_object(obj: Any) -> bool:
    """A @triton.jit kernel (JITFunction, InterpretedFunction, under autotune/heuristics wrappers)."""
    return type(obj).__module__.startswith("triton") and hasattr(obj, "fn")


def _resolve(fn: Any, node: ast.expr) -> Any:
    """The object a Name or dotted Attribute in ``fn``'s body refers to, or None where it is not static."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    scope = {**fn.__globals__, **inspect.getclosurevars(fn).nonlocals}
    obj = scope.get(node.id, getattr(builtins, node.id, None))
    for name in reversed(names):
        obj = getattr(obj, name, None)
    return obj


def _host_calls(fn: Any, depth: int = 3) -> tuple[list[str], list[str]]:
    """(kernels launched as ``kernel[grid](...)``, host functions called) by ``fn``; the launches are
    followed ``depth`` calls deep into host functions, so a wrapper of a wrapper names the kernel too."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return [], []
    launched: list[str] = []
    called: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Subscript):
            target = _resolve(fn, node.func.value)
            if _is_kernel_object(target):
                launched.append(f"{_python_function(target).__module__}.{_python_function(target).__qualname__}")
            continue
        target = _resolve(fn, node.func)
        root = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        # torch's C functions carry no __module__: the module their name is looked up in says it
        module = getattr(target, "__module__", None) or getattr(_resolve(fn, root), "__name__", None) or ""
        if target is None or _is_kernel_object(target) or module.startswith("triton") or module == "builtins":
            continue
        if inspect.isfunction(target) or module.split(".")[0] in ("torch", "numpy"):
            called.append(ast.unparse(node.func) if not inspect.isfunction(target) else
                          f"{module}.{target.__qualname__}")
            if inspect.isfunction(target) and depth > 1:
                launched += _host_calls(target, depth - 1)[0]
    return list(dict.fromkeys(launched)), list(dict.fromkeys(called))


def _refuse_host_function(fn: Any) -> None:
    """Refuse a plain function that launches kernels or calls host code: a wrapper, not a kernel.

    Why: an undecorated kernel is accepted (triton_stats keeps its own so), so a wrapper passed by
    mistake would reach Triton's compiler, whose "Unsupported function referenced" names no fix.
    """
    launched, called = _host_calls(fn)
    if not launched and not called:
        return
    name = f"{fn.__module__}.{fn.__qualname__}"
    if launched:
        kernel = launched[0].rsplit(".", 1)[-1]
        raise InvalidArgument(
            f"kernel={name} is not a @triton.jit kernel: it is a Python function that launches "
            f"{', '.join(launched)}. Pass the kernel it launches, with that launch's arguments without the grid: "
            f"for `{kernel}[grid](x, y, n, BLOCK=128)`, assert_compiles_for({kernel}, x, y, n, BLOCK=128, targets=...)")
    raise InvalidArgument(
        f"kernel={name} is not a @triton.jit kernel: it calls {', '.join(called[:3])}, which a Triton kernel "
        f"cannot call. Pass the @triton.jit kernel itself (for a wrapper, the `kernel` of its `kernel[grid](...)` "
        f"launch, with that launch's arguments without the grid)")


def _is_constexpr(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.split(".")[-1] == "constexpr"
    return getattr(annotation, "__name__", "") == "constexpr"


def _constexpr_value(name: str, value: Any) -> Any:
    """A constexpr as the worker gets it (JSON): numbers, strings, None, or a Triton dtype by name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ == "dtype" and type(value).__module__.startswith("triton"):
        return {"tl_dtype": str(value)}
    raise InvalidArgument(f"constexpr {name}={value!r}: only numbers, strings, None and Triton dtypes (tl.float16) "
                          f"can be passed to the compiler here")


def _type_of(name: str, value: Any) -> str:
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):   # Python's or numpy's
        return "i1"
    if isinstance(value, numbers.Integral):      # Python and numpy ints
        return "i32" if -2**31 <= int(value) < 2**31 else "i64"
    if isinstance(value, numbers.Real):
        return "fp32"
    dtype = getattr(value, "dtype", None)
    if dtype is not None and hasattr(value, "data_ptr"):
        code = _TORCH_TO_TRITON.get(str(dtype).replace("torch.", ""))
        if code is None:
            raise InvalidArgument(f"argument {name}: a tensor of {dtype}, which Triton kernels do not take; "
                                  f"pass one of {sorted(_TORCH_TO_TRITON)}")
        return "*" + code
    raise InvalidArgument(f"argument {name}={value!r}: a launch takes tensors, ints, floats, bools or "
                          f"constexpr values; pass what kernel[grid](...) would get")


_RESOURCES = {"vgpr_count": "vgprs", "sgpr_count": "sgprs", "vgpr_spill_count": "vgpr_spills",
              "sgpr_spill_count": "sgpr_spills", "group_segment_fixed_size": "lds_bytes",
              "private_segment_fixed_size": "scratch_bytes"}


def _worker() -> None:
    """Compile the job on stdin for each target; one JSON line of TargetBuild fields on stdout."""
    import importlib
    import importlib.util
    import tempfile

    job = json.loads(sys.stdin.read())
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    try:
        if job["module"] == "__main__":
            raise ImportError("a script: load it from its file")
        module = importlib.import_module(job["module"])
    except Exception:   # a test module or a script: load it from its file (top-level code runs, as on import)
        spec = importlib.util.spec_from_file_location(f"_parity_kernel_{os.getpid()}", job["file"])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    obj: Any = module
    for part in job["qualname"].split("."):
        obj = getattr(obj, part)
    fn = _python_function(obj)
    # a module that set TRITON_INTERPRET itself holds interpreted functions: the compiler needs jitted
    # ones, for the kernel and for the device functions it calls (looked up in its globals)
    for k, v in list(fn.__globals__.items()):
        if type(v).__name__ == "InterpretedFunction":
            fn.__globals__[k] = JITFunction(v.fn)
    kernel = JITFunction(fn)
    constexprs = {k: triton.language.dtype(v["tl_dtype"]) if isinstance(v, dict) else v
                  for k, v in job["constexprs"].items()}
    rows = []
    for name in job["targets"]:
        backend, arch, warp, gpu = resolve_target(name)
        row: dict[str, Any] = {"target": name, "gpu": gpu, "ok": False, "error": "", "resources": {}}
        too_many = block_threads_error(name, int(job["options"].get("num_warps", 4)))
        if too_many:
            row["error"] = too_many
            rows.append(row)
            continue
        with tempfile.TemporaryFile(mode="w+") as err:
            saved = os.dup(2)
            os.dup2(err.fileno(), 2)
            try:
                built = triton.compile(ASTSource(kernel, job["signature"], constexprs),
                                       target=GPUTarget(backend, arch, warp), options=job["options"])
                row["ok"] = True
                # Triton allocates its shared memory dynamically and reports it here; the code object's
                # group_segment_fixed_size counts only static LDS, which Triton kernels leave at 0
                shared = int(getattr(built.metadata, "shared", 0) or 0)
                if backend == "hip":
                    asm = built.asm.get("amdgcn", "")
                    for key, label in _RESOURCES.items():
                        m = re.search(rf"\.{key}:\s+(\d+)", asm)
                        if m:
                            row["resources"][label] = int(m.group(1))
                    row["resources"]["lds_bytes"] = max(row["resources"].get("lds_bytes", 0), shared)
                    row["notes"] = _spill_notes(row["resources"])
                else:
                    row["resources"]["shared_bytes"] = shared
                over = shared_memory_error(name, row["resources"].get("lds_bytes", shared))
                if over:
                    row["ok"], row["error"] = False, over
            except Exception as exc:   # the compiler's refusal is the result
                row["error"] = _compiler_message(exc)
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
            err.seek(0)
            text = err.read().splitlines()
            # the assembler's "error: ..." line and the offending instruction under it
            said = [" ".join(x.strip() for x in text[i:i + 2]) for i, ln in enumerate(text) if "error" in ln.lower()]
            if not row["ok"] and said:
                row["error"] += " | " + " | ".join(said[:3])[:400]
        rows.append(row)
    print(json.dumps(rows))


if __name__ == "__main__":
    _worker()
