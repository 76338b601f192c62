#!/usr/bin/env python3
"""Train the example model ``bytellama`` (a byte-level Llama) on Python stdlib source.

Three stages, all deterministic given the inputs:

1. Corpus (``--build-corpus``, or automatically when ``--corpus DIR`` is empty): every ``*.py``
   under the standard library of the running Python (``sysconfig`` "stdlib", or ``--stdlib``),
   sorted by relative path, excluding ``site-packages/``, test directories (``test/``,
   ``tests/``, ``idle_test/``) and ``encodings/`` (codec tables).  A file is *held out* when
   ``zlib.crc32(relpath) % 10 == 0``; held-out files are never trained on.  Written to DIR:
   ``train.bin`` (training files' bytes, concatenated), ``manifest.json`` (files, sizes,
   hashes), ``heldout_full.bin``; and the shipped sample ``heldout.txt`` (16 line-aligned
   ~4 KB slices from the middle of 16 held-out files, ~64 KB) into the model directory.
2. Training: ``LlamaForCausalLM`` from a fixed config, fixed seed, AdamW + linear warm-up +
   cosine decay, bf16 autocast on CUDA (fp32 on CPU), random windows of 513 tokens from the
   token stream ``BOS file-bytes EOS BOS file-bytes EOS ...``.  ``--steps N`` fixes the step
   count; otherwise ``--time-budget S`` picks it after timing the first steps (the chosen N is
   recorded, and ``--steps N`` reproduces the schedule).
3. Output (``--out``, default this folder): ``config.json``,
   ``model.safetensors`` (fp32) and ``TRAINING.json``; the held-out perplexity is measured in
   fp32 (TF32 off) on the shipped ``heldout.txt`` in 512-byte windows and printed.

Examples::

    python examples/bytellama/train.py --build-corpus --corpus .corpus       # here, once
    python examples/bytellama/train.py --corpus .corpus --device cuda --time-budget 270
    python examples/bytellama/train.py --corpus .corpus --device cpu --steps 20 --batch 4 \
        --out "$(mktemp -d)"                                           # CPU smoke test
    python examples/bytellama/train.py --eval-only --device cpu              # re-measure ppl
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
import zlib
from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent
REPO = MODEL_DIR.parents[1]
# Runs from a checkout without installing: the loader is the package of this folder (importable from
# the one above), and the plugin's package sits at the repository's root.
for _root in (MODEL_DIR.parent, REPO):
    if str(_root) not in sys.path:
        sys.path.insert(0, str(_root))

BOS, EOS, PAD, VOCAB = 256, 257, 258, 259

#: The architecture. fp32 weights: 1,969,920 params = 7.88 MB.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 256,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "use_cache": True,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": PAD,
}

EXCLUDE_DIRS = {"site-packages", "test", "tests", "idle_test", "encodings", "__pycache__"}
HELDOUT_MOD = 10
N_SAMPLE_FILES = 16
SLICE = 4096


# --------------------------------------------------------------------------- corpus
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _middle_slice(data: bytes, size: int = SLICE) -> bytes:
    """A line-aligned slice of at most ``size`` bytes from the middle of ``data``."""
    start = max(0, len(data) // 2 - size // 2)
    nl = data.find(b"\n", start)
    start = 0 if start == 0 else (nl + 1 if nl >= 0 else len(data))
    end = data.rfind(b"\n", start, start + size)
    return data[start : end + 1] if end >= start else b""


def build_corpus(stdlib: Path, corpus: Path, heldout_txt: Path) -> dict:
    files = []
    for p in sorted(stdlib.rglob("*.py")):
        rel = p.relative_to(stdlib).as_posix()
        if set(rel.split("/")[:-1]) & EXCLUDE_DIRS:
            continue
        data = p.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # none in 3.11.7's selection; keeps the corpus valid UTF-8
        files.append((rel, data))
    files.sort()
    train = [(r, d) for r, d in files if zlib.crc32(r.encode()) % HELDOUT_MOD != 0]
    held = [(r, d) for r, d in files if zlib.crc32(r.encode()) % HELDOUT_MOD == 0]

    # Shipped held-out sample: 16 files evenly spread over the held-out files of >= 6 KB.
    big = [(r, d) for r, d in held if len(d) >= 6000]
    picks = sorted({round(k * (len(big) - 1) / (N_SAMPLE_FILES - 1)) for k in range(N_SAMPLE_FILES)})
    sample_parts, sample_src = [], []
    for i in picks:
        rel, data = big[i]
        sl = _middle_slice(data)
        sample_parts.append(sl)
        sample_src.append({"file": rel, "bytes": len(sl)})
    sample = b"".join(sample_parts)

    corpus.mkdir(parents=True, exist_ok=True)
    train_bytes = b"".join(d for _, d in train)
    held_bytes = b"".join(d for _, d in held)
    (corpus / "train.bin").write_bytes(train_bytes)
    (corpus / "heldout_full.bin").write_bytes(held_bytes)
    heldout_txt.parent.mkdir(parents=True, exist_ok=True)
    heldout_txt.write_bytes(sample)
    manifest = {
        "python": platform.python_version(),
        "stdlib": str(stdlib),
        "selection": (
            "*.py under the stdlib, sorted by relative path, excluding directories "
            + ", ".join(sorted(EXCLUDE_DIRS))
            + "; held out when zlib.crc32(relpath) % 10 == 0"
        ),
        "n_files": len(files),
        "train": {
            "n_files": len(train),
            "bytes": len(train_bytes),
            "sha256": _sha256(train_bytes),
            "files": [[r, len(d)] for r, d in train],
        },
        "heldout": {
            "n_files": len(held),
            "bytes": len(held_bytes),
            "sha256": _sha256(held_bytes),
            "files": [[r, len(d)] for r, d in held],
        },
        "heldout_sample": {
            "path": "examples/bytellama/heldout.txt",
            "bytes": len(sample),
            "sha256": _sha256(sample),
            "sources": sample_src,
            "rule": "middle line-aligned <=4096-byte slice of 16 held-out files (>= 6000 bytes) "
            "evenly spaced in sorted order",
        },
    }
    (corpus / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def load_token_stream(corpus: Path, which: str = "train", exclude: frozenset = frozenset()):
    """``BOS file EOS BOS file EOS ...`` as an int64 tensor, from train.bin + manifest.json.

    Files named in ``exclude`` are left out of the stream.
    """
    import numpy as np
    import torch

    manifest = json.loads((corpus / "manifest.json").read_text())
    name = "train.bin" if which == "train" else "heldout_full.bin"
    raw = np.frombuffer((corpus / name).read_bytes(), dtype=np.uint8)
    info = manifest[which]
    if _sha256(raw.tobytes()) != info["sha256"]:
        raise SystemExit(f"{corpus / name}: sha256 does not match manifest.json")
    files = info["files"]
    keep = sum(n for r, n in files if r not in exclude)
    out = np.empty(keep + 2 * sum(r not in exclude for r, _ in files), dtype=np.int64)
    pos = src = 0
    for rel, n in files:
        if rel in exclude:
            src += n
            continue
        out[pos] = BOS
        out[pos + 1 : pos + 1 + n] = raw[src : src + n]
        out[pos + 1 + n] = EOS
        pos += n + 2
        src += n
    return torch.from_numpy(out), manifest


# --------------------------------------------------------------------------- model / eval
def make_model(attn: str | None = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = {k: v for k, v in CONFIG.items() if k != "architectures"}
    if attn:
        kw["attn_implementation"] = attn
    return LlamaForCausalLM(LlamaConfig(**kw))


def heldout_windows_from(path: Path, seq: int = 512):
    import torch

    data = path.read_bytes()
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long)
    n = ids.numel() // seq
    return ids[: n * seq].view(n, seq).clone()


def fp32_perplexity(model, windows, device) -> float:
    """Perplexity in fp32 with TF32 off (the recorded number)."""
    import torch

    from bytellama import perplexity

    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        was = next(model.parameters()).dtype
        model.float().eval()
        ppl = perplexity(model, windows.to(device), batch_size=32)
        model.to(was)
        return ppl
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def save_model(model, out: Path) -> int:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_config(out)
    return sum(v.numel() for v in state.values())


def write_config(out: Path) -> None:
    cfg = dict(CONFIG)
    cfg["_comment"] = (
        "bytellama: byte-level Llama; ids 0-255 = UTF-8 bytes, 256 BOS, 257 EOS, 258 PAD. "
        "Trained by examples/bytellama/train.py; see docs/model.md."
    )
    cfg["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# --------------------------------------------------------------------------- training
def train(args) -> None:
    import torch
    import torch.nn.functional as F

    corpus = Path(args.corpus)
    if not (corpus / "manifest.json").is_file():
        print(f"building corpus in {corpus} from {args.stdlib}", flush=True)
        build_corpus(Path(args.stdlib), corpus, Path(args.heldout))
    stream, manifest = load_token_stream(corpus, "train")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    model = make_model().to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params:,}  ({n_params * 4 / 1e6:.2f} MB fp32)  train tokens {stream.numel():,}",
          flush=True)
    stream = stream.to(device)
    heldout_win = heldout_windows_from(Path(args.heldout)).to(device)
    # Validation (for choosing the step count): held-out files NOT in the shipped sample.
    sample_files = frozenset(s["file"] for s in manifest["heldout_sample"]["sources"])
    val, _ = load_token_stream(corpus, "heldout", exclude=sample_files)
    nv = val.numel() // args.seq
    val_win = val[: nv * args.seq].view(nv, args.seq)
    val_sub = val_win[:: max(1, nv // 256)][:256].to(device)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}),
    )
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    T, B = args.seq, args.batch
    arange = torch.arange(T + 1, device=device)

    def batch():
        starts = torch.randint(0, stream.numel() - T - 1, (B,), generator=gen, device=device)
        w = stream[starts[:, None] + arange]
        return w[:, :-1], w[:, 1:]

    fwd = model
    compiled = False
    if cuda and args.compile:
        try:
            fwd = torch.compile(model)
            compiled = True
        except Exception as exc:  # pragma: no cover
            print(f"torch.compile unavailable ({exc}); eager", flush=True)

    def loss_fn(m, x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = m(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))

    total = args.steps or None  # None: picked from the time budget after timing
    warmup = args.warmup

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        n = total if total else 10**9
        prog = min(1.0, (step - warmup) / max(1, n - warmup))
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * prog)))

    log = []
    t0 = time.time()
    step = 0
    loss_acc, n_acc = None, 0  # mean training loss over each logging interval
    timing_start = None
    model.train()
    while total is None or step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = batch()
        opt.zero_grad(set_to_none=True)
        try:
            loss = loss_fn(fwd, x, y)
            loss.backward()
        except Exception as exc:
            if not compiled:
                raise
            print(f"compiled step failed ({type(exc).__name__}: {exc}); falling back to eager", flush=True)
            fwd, compiled = model, False
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(fwd, x, y)
            loss.backward()
        loss_acc = loss.detach() if loss_acc is None else loss_acc + loss.detach()
        n_acc += 1
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if total is None:
            if step == 30:
                if cuda:
                    torch.cuda.synchronize()
                timing_start = time.time()
            elif step == 130:
                if cuda:
                    torch.cuda.synchronize()
                per = (time.time() - timing_start) / 100
                left = args.time_budget - (time.time() - t0) - args.eval_reserve
                total = max(step + 100, (step + int(left / per)) // 100 * 100)
                print(f"step time {per * 1e3:.2f} ms -> total steps {total}", flush=True)
        if step % args.log_every == 0 or step == total:
            lv = loss_acc.item() / n_acc
            loss_acc, n_acc = None, 0
            rec = {"step": step, "loss": round(lv, 4), "lr": lr_at(step - 1), "t": round(time.time() - t0, 1)}
            if step % args.eval_every == 0 or step == total:
                model.eval()
                with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                    from bytellama import perplexity

                    rec["val_ppl_bf16" if cuda else "val_ppl_fp32"] = round(perplexity(model, val_sub, batch_size=64), 4)
                model.train()
                print(json.dumps(rec), flush=True)
            log.append(rec)
    if cuda:
        torch.cuda.synchronize()
    train_time = time.time() - t0

    # final train loss: mean over 20 fresh batches, no grad
    model.eval()
    with torch.no_grad():
        final_train_loss = sum(float(loss_fn(model, *batch())) for _ in range(20)) / 20
    out = Path(args.out)
    n_saved = save_model(model, out)
    # measure from the saved fp32 file, as users will load it
    from bytellama import load_bytellama

    reloaded = load_bytellama(device=device.type, path=out, attn_implementation="sdpa")
    ppl = fp32_perplexity(reloaded, heldout_win.cpu(), device)
    val_ppl = fp32_perplexity(reloaded, val_win, device)
    full_ppl = None
    if args.full_heldout:
        full, _ = load_token_stream(corpus, "heldout")
        n = full.numel() // T
        full_ppl = fp32_perplexity(reloaded, full[: n * T].view(n, T), device)

    dev_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine()
    record = {
        "model": "bytellama",
        "architecture": "LlamaForCausalLM",
        "params": n_saved,
        "weights_bytes": (out / "model.safetensors").stat().st_size,
        "vocab": "259 ids: 0-255 UTF-8 bytes, 256 BOS, 257 EOS, 258 PAD (unused in training)",
        "corpus": {
            "python_stdlib": manifest["python"],
            "selection": manifest["selection"],
            "train_files": manifest["train"]["n_files"],
            "train_bytes": manifest["train"]["bytes"],
            "train_sha256": manifest["train"]["sha256"],
            "train_tokens_with_bos_eos": int(stream.numel()),
            "heldout_files": manifest["heldout"]["n_files"],
            "heldout_bytes": manifest["heldout"]["bytes"],
            "heldout_sample": manifest["heldout_sample"],
            "validation": f"the {manifest['heldout']['n_files'] - len(sample_files)} held-out files not in "
            "the shipped sample (used only to choose the step count)",
        },
        "recipe": {
            "seed": args.seed,
            "optimizer": "AdamW(betas=(0.9, 0.95), eps=1e-8), weight decay on matrices except embeddings",
            "lr": args.lr,
            "weight_decay": args.weight_decay,
            "schedule": f"linear warm-up {warmup} steps, cosine to {args.min_lr_frac} x lr",
            "grad_clip": 1.0,
            "batch": B,
            "seq": T,
            "tokens_per_step": B * T,
            "precision": "bf16 autocast, fp32 master weights" if cuda else "fp32",
            "torch_compile": compiled,
            "sampling": "uniform random windows of seq+1 tokens from the BOS/EOS-delimited stream",
        },
        "steps": step,
        "tokens_seen": step * B * T,
        "train_seconds": round(train_time, 1),
        "device": dev_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": __import__("transformers").__version__,
        "python": platform.python_version(),
        "date": _dt.date.today().isoformat(),
        "final_train_loss": round(final_train_loss, 4),
        "heldout_eval": "shipped heldout.txt, consecutive 512-byte windows (tail dropped), "
        "exp(mean NLL of bytes 2..512 of each window); fp32, TF32 off",
        f"heldout_ppl_fp32_{device.type}": ppl,
        "log": log,
    }
    record[f"val_ppl_fp32_{device.type}"] = val_ppl
    if full_ppl is not None:
        record[f"heldout_full_ppl_fp32_{device.type}"] = full_ppl
    (out / "TRAINING.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"final train loss {final_train_loss:.4f}  val ppl {val_ppl:.5f}  held-out ppl fp32 ({device.type}) {ppl:.5f}"
          + (f"  full held-out {full_ppl:.5f}" if full_ppl else "")
          + f"  steps {step}  {train_time:.0f}s", flush=True)


def eval_only(args) -> None:
    """Re-measure the held-out perplexity of the model in --out; record it in TRAINING.json."""
    import torch

    from bytellama import load_bytellama

    out = Path(args.out)
    device = torch.device(args.device)
    model = load_bytellama(device=device.type, path=out)
    ppl = fp32_perplexity(model, heldout_windows_from(Path(args.heldout)), device)
    rec_path = out / "TRAINING.json"
    rec = json.loads(rec_path.read_text())
    rec[f"heldout_ppl_fp32_{device.type}"] = ppl
    rec[f"heldout_ppl_fp32_{device.type}_torch"] = torch.__version__
    rec_path.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"held-out ppl fp32 ({device.type}) {ppl:.6f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-corpus", action="store_true", help="build the corpus and heldout.txt, then exit")
    ap.add_argument("--eval-only", action="store_true", help="measure held-out ppl of the model in --out")
    ap.add_argument("--corpus", default=str(REPO / ".corpus"))
    ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--heldout", default=str(MODEL_DIR / "heldout.txt"))
    ap.add_argument("--out", default=str(MODEL_DIR))
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--steps", type=int, default=2000, help="fixed step count (the shipped model: 2000); 0 = pick from --time-budget")
    ap.add_argument("--time-budget", type=float, default=270.0, help="seconds for the training loop")
    ap.add_argument("--eval-reserve", type=float, default=10.0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--full-heldout", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=1000)
    args = ap.parse_args(argv)
    if args.build_corpus:
        m = build_corpus(Path(args.stdlib), Path(args.corpus), Path(args.heldout))
        print(json.dumps({k: m[k] for k in ("python", "n_files")}),
              {k: (m[k]["n_files"], m[k]["bytes"]) for k in ("train", "heldout")},
              "sample", m["heldout_sample"]["bytes"])
        return
    if args.eval_only:
        if args.device is None:
            args.device = "cpu"
        eval_only(args)
        return
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but CUDA is not available (use --device cpu)")
    train(args)


if __name__ == "__main__":
    main()
