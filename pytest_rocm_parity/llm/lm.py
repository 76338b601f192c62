"""Causal-LM parity: what the model says, tied back to the layer that made it say otherwise.

On top of per-layer parity (engine.py) this judges perplexity (two-sided, against
the golden and the float64 truth), top-1 agreement that ignores near-ties,
mutual top-k containment, KL divergence, and greedy generation: the first
divergent step, then a teacher-forced continuation so one flip does not cascade.
At the first confident disagreement it names the layer that diverged first at
that position.  docs/lm.md gives the rule's numbers.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.quant.allowance import differing_modules
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import OUTPUT
from pytest_rocm_parity.runner.replay import load_truth, replay
from pytest_rocm_parity.runner.wrappers import unwrap
from pytest_rocm_parity.judging.assertion import steps_text
from pytest_rocm_parity.judging.logits import judge_logits
from pytest_rocm_parity.errors import InputError, InvalidArgument
from pytest_rocm_parity.progress import progress

def _logits(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise InvalidArgument(f"check_lm: the model returned {type(out).__name__}; expected logits, a tuple starting "
                          f"with logits, a dict with 'logits', or an object with .logits")


def _require_logits(model: Any, args: Any, kwargs: Any) -> None:
    """InvalidArgument unless the model returns next-token logits: (batch, tokens, vocabulary), the
    vocabulary its config states where it has one (a base model's hidden states are not logits)."""
    import torch

    with torch.inference_mode():
        out = model(*args, **kwargs)
        logits = _logits(out)
    _require_recorded(model, out, logits)
    vocab = vocab_size(model) if _is_hf(model) else None   # a plain module's first embedding may be another
    if not (logits.is_floating_point() and logits.dim() == 3 and (vocab is None or logits.shape[-1] == vocab)):
        raise InvalidArgument(
            f"check_lm: {type(model).__name__} returned {tuple(logits.shape)} {logits.dtype} where next-token logits "
            f"(batch, tokens, {vocab if vocab is not None else 'vocabulary'}) belong: not a language model's head. "
            f"Pass the model with its LM head (e.g. AutoModelForCausalLM), or use parity.check for other models")


def _logits_path(paths: Any) -> str | None:
    """Which of an output's tensor leaves (their paths, in order) holds the logits: 'logits' (a
    ModelOutput, a dict, a dataclass), else the first (a tensor, a tuple starting with them)."""
    paths = list(paths)
    return "logits" if "logits" in paths else (paths[0] if paths else None)


def _require_recorded(model: Any, out: Any, logits: Any) -> None:
    """InvalidArgument unless the logits are among the output leaves the golden records: an object
    the engine does not walk (a SimpleNamespace) has a .logits that check_lm reads but no leaf a
    replay could compare, so the golden would be written and every replay fail."""
    from pytest_rocm_parity.runner.tree import tensor_leaves

    leaves = tensor_leaves(out)
    path = _logits_path(leaves)
    if path is None or leaves[path] is not logits:
        raise InvalidArgument(
            f"check_lm: {type(model).__name__} returned a {type(out).__name__}, whose logits the golden cannot "
            f"record (an output's tensors are recorded from a tensor, a tuple or list, a dict, a dataclass or a "
            f"transformers ModelOutput); return the logits, a tuple starting with them, a dict with 'logits', or "
            f"transformers.modeling_outputs.CausalLMOutputWithPast(logits=..., past_key_values=...)")


@contextlib.contextmanager
def _positions_past_the_model(model: Any, prompt_len: int, generate: int) -> Iterator[None]:
    """An InputError where greedy decoding fails past the model's max_position_embeddings: a
    learned position table (OPT, GPT-2) has no row for them, and its IndexError says nothing of it."""
    try:
        yield
    except (IndexError, RuntimeError) as exc:
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if not isinstance(limit, int) or prompt_len + generate <= limit:
            raise
        raise InputError(f"generate={generate}: the prompt's {prompt_len} tokens and {generate} generated ones "
                         f"run past the model's max_position_embeddings={limit}, where decoding failed "
                         f"({type(exc).__name__}: {str(exc)[:120]}); give a prompt of at most "
                         f"{limit - generate} tokens or generate at most {max(0, limit - prompt_len)}") from exc


def _encoder_input(model: Any) -> str:
    """The name of the encoder's input in an encoder-decoder's forward: input_ids for text, the speech
    or image one where the model takes no token ids (Whisper's input_features)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "input_ids"
    return next((n for n in ("input_ids", "input_features", "input_values", "pixel_values") if n in params),
                "input_ids")


def _is_hf(model: Any) -> bool:
    return hasattr(model, "config") and hasattr(model.config, "vocab_size")


def vocab_size(model: Any) -> int | None:
    if _is_hf(model):
        return int(model.config.vocab_size)
    import torch.nn as nn

    embs = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    return int(embs[0].num_embeddings) if embs else None


def validate(model: Any, input_ids: Any, attention_mask: Any, generate: Any) -> tuple[Any, Any]:
    """Clear errors for bad LM inputs instead of a crash deep inside the model."""
    import torch

    if not isinstance(input_ids, torch.Tensor):
        raise InputError(f"input_ids: expected a torch.LongTensor of token ids, got {type(input_ids).__name__}")
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise InputError(f"input_ids: expected integer token ids, got dtype {input_ids.dtype}; pass ids, not embeddings")
    if _is_hf(model) and getattr(model.config, "is_encoder_decoder", False):
        # its logits at position t predict the decoder's token t from the encoder's whole input, so
        # the causal next-token perplexity and generation check_lm judges would measure nothing
        raise InvalidArgument(
            f"check_lm: {type(model).__name__} is an encoder-decoder (config.is_encoder_decoder): its logits are "
            f"the decoder's, not next-token predictions over input_ids. Judge it with parity.check(model, "
            f"{{{_encoder_input(model)!r}: ..., 'decoder_input_ids': ...}}), which compares every layer and the "
            f"logits")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
        if attention_mask is not None and attention_mask.dim() == 1:
            attention_mask = attention_mask.unsqueeze(0)
    if input_ids.dim() != 2:
        raise InputError(f"input_ids: expected shape (batch, seq), got {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise InputError(f"input_ids: empty sequence (shape {tuple(input_ids.shape)}); give at least 2 tokens per row")
    if input_ids.shape[1] < 2:
        raise InputError("input_ids: perplexity needs at least 2 tokens per row")
    from pytest_rocm_parity.guards import require_token_ids

    require_token_ids({"input_ids": input_ids}, vocab_size(model))
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
            raise InputError(f"attention_mask: shape {shape} does not match input_ids {tuple(input_ids.shape)}")
        if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise InputError("attention_mask: values must be 0 or 1")
        short = (attention_mask.sum(dim=1) < 2).nonzero().flatten().tolist()
        if short:
            raise InputError(f"attention_mask: row{'s' if len(short) > 1 else ''} {', '.join(map(str, short[:5]))} "
                             f"{'have' if len(short) > 1 else 'has'} fewer than 2 real tokens (mask 1), so nothing "
                             f"of {'them' if len(short) > 1 else 'it'} would be judged; drop such rows or give each "
                             f"at least 2 tokens")
    elif _is_hf(model):
        pad = getattr(model.config, "pad_token_id", None)
        if pad is not None and input_ids.shape[0] > 1 and bool((input_ids == pad).any()):
            raise InputError(f"input_ids: the batch contains padding (pad_token_id={pad}) but no attention_mask was "
                             f"given; pass attention_mask=(input_ids != {pad}).long()")
    if not isinstance(generate, int) or isinstance(generate, bool) or generate < 0:
        raise InvalidArgument(f"generate={generate!r}: must be a non-negative int (greedy steps)")
    if generate and attention_mask is not None and bool((attention_mask[:, -1] == 0).any()):
        raise InputError("generate: right-padded rows cannot be continued; pad on the left (tokenizer.padding_side='left')")
    return input_ids, attention_mask


def _inputs(model: Any, ids: Any, mask: Any) -> Any:
    if _is_hf(model):
        kw: dict[str, Any] = {"input_ids": ids, "use_cache": False}
        if mask is not None:
            kw["attention_mask"] = mask
        return kw
    return {"input_ids": ids, "attention_mask": mask} if mask is not None else (ids,)


def greedy(model: Any, ids: Any, mask: Any, steps: int) -> tuple[Any, Any]:
    """Greedy tokens and the top-1/top-2 margin at each step (full recompute: works for any module)."""
    import torch

    toks, margins = [], []
    with torch.inference_mode():
        for _ in range(steps):
            out = _inputs(model, ids, mask)
            lg = _logits(model(**out) if isinstance(out, dict) else model(*out))[:, -1].double()
            top2 = lg.topk(2, dim=-1)
            nxt = top2.indices[:, :1]
            toks.append(nxt)
            margins.append(top2.values[:, :1] - top2.values[:, 1:2])
            ids = torch.cat([ids, nxt.to(ids.dtype)], dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    b = ids.shape[0]
    if not toks:
        return ids.new_zeros((b, 0)), torch.zeros((b, 0), dtype=torch.float64)
    return torch.cat(toks, 1), torch.cat(margins, 1)


def cache_argument(model: Any) -> str:
    """The name the model's forward takes its KV cache under: transformers 5.2x names it ``cache``,
    earlier ones ``past_key_values`` (now deprecated). Read from the class's forward under the
    wrappers: a port that wraps the instance's forward in (*args, **kwargs), and torch.compile's
    OptimizedModule, hide the names."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(unwrap(model)).forward).parameters else "past_key_values"


def decode_with_cache(model: Any, prompt: Any, mask: Any, cont: Any) -> Any | None:
    """The logits at the continuation's positions, (batch, N, vocab), from KV-cache decoding: the
    prompt in one forward, then one token of ``cont`` (batch, N) per step with the cache, teacher-forced.
    Why beside the full recompute: a served model decodes this way, through kernels of its own (a
    paged or single-query attention) that a forward over the whole sequence never calls. None where
    the model keeps no cache (cached_decode says why)."""
    return cached_decode(model, prompt, mask, cont)[0]


def _cache_of(out: Any) -> Any:
    """The KV cache a forward returned (under transformers' names), None where it returned none."""
    for key in ("cache", "past_key_values"):
        found = out.get(key) if isinstance(out, dict) else getattr(out, key, None)
        if found is not None:
            return found
    return None


def cached_decode(model: Any, prompt: Any, mask: Any, cont: Any) -> tuple[Any | None, str]:
    """decode_with_cache's logits, or None and why not. Whether a model decodes with a cache is
    decided by what it returns (a cache under ``past_key_values`` or ``cache``, passed back to it the
    next step), not by whether it is a Hugging Face model: a serving team's own decoder returning
    its cache is decoded this way too."""
    import inspect

    import torch

    if cont is None or cont.shape[1] == 0:
        return None, "no continuation to decode (generate=0)"
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(type(unwrap(model)).forward).parameters
    except (TypeError, ValueError):
        params = {}
    any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    arg = cache_argument(model)
    hf = _is_hf(model)
    if not (hf or any_kw or arg in params):
        return None, "its forward takes no past_key_values (or cache) argument to decode with"
    flag = {"use_cache": True} if hf or any_kw or "use_cache" in params else {}

    with torch.inference_mode():
        kw: dict[str, Any] = {"input_ids": prompt, **flag}
        if mask is not None:
            kw["attention_mask"] = mask
        past = _cache_of(model(**kw))
        steps = []
        for t in range(cont.shape[1]):
            if past is None:
                return None, (f"it returned no KV cache (past_key_values or cache) "
                              f"{'from the prompt' if t == 0 else f'at decode step {t - 1}'}"
                              f"{' when called with use_cache=True' if flag else ''}: a recurrent state such as "
                              f"RWKV's, or a cache kept inside the model")
            kw = {"input_ids": cont[:, t:t + 1].to(prompt.dtype), arg: past, **flag}
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                kw["attention_mask"] = mask
            out = model(**kw)
            past = _cache_of(out)
            steps.append(_logits(out)[:, -1])
    return torch.stack(steps, 1), ""


def _rms(x: Any) -> float:
    """RMS of ``x`` (0.0 when it holds no element: a leaf left empty once its non-finite values are set aside)."""
    return float(x.square().mean().sqrt()) if x.numel() else 0.0


def _rows_text(rows: list[int], of: int, padded: list[int]) -> str:
    """'; it fails only in batch rows 0, 3 of 0-3' where some rows fail and others pass ('' where all do):
    a decode kernel that mishandles padding fails exactly the padded rows."""
    if not rows or len(rows) == of:
        return ""
    text = f"; it fails only in batch row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows[:8]))}" \
           f"{' ...' if len(rows) > 8 else ''} of 0-{of - 1}"
    if padded and rows == padded:
        text += (f", exactly the row{'s' if len(rows) > 1 else ''} with padding in the prompt (attention_mask 0): a "
                 f"decode kernel that ignores the padding mask, or counts positions from the padded start")
    return text


def _judge_cached(rung: str, tol: Any, cand: Any, ref: Any, truth: Any, noise: float = 0.0,
                  padded: list[int] | None = None) -> tuple[dict[str, Any], str]:
    """The cached decode's logits judged as the model's outputs are (Dynamo's rule, judge.Rule):
    the candidate's error against the float64 truth of the same positions within ``k`` times the
    reference's cached decode's, or within ``quant_noise`` times ``noise``, the activation-quantization
    noise of an FP8 candidate in another format (docs/fp8.md), where that is larger. A non-finite
    candidate value where the reference and the truth are finite fails, as in the full forward: a
    NaN error is never over any budget, so the errors are measured where all three are finite and the
    non-finite ones counted apart. A failure names the batch rows it is in where others pass
    (``padded``: the rows with padding in the prompt). Returns the metrics and the failure ('' when
    it passes)."""
    import torch

    from pytest_rocm_parity.judging.judge import Rule
    from pytest_rocm_parity.judging.records import LeafMetrics

    rule = Rule.of(tol, rung)
    ref, cand = ref.to(truth.device, torch.float64), cand.to(truth.device, torch.float64)
    finite_ref = torch.isfinite(ref) & torch.isfinite(truth)
    bad = finite_ref & ~torch.isfinite(cand)
    keep = finite_ref & torch.isfinite(cand)

    def judged(sel: Any) -> LeafMetrics:
        k = keep[sel]
        c, r, t = cand[sel][k], ref[sel][k], truth[sel][k]
        m = LeafMetrics("cached_logits", int(t.numel()), err_cand=_rms(c - t), err_ref=_rms(r - t), rms_truth=_rms(t))
        m.ratio = rule.propagated_ratio(m)
        m.allow_noise(noise)
        return m

    steps = int(truth.shape[1])
    m = judged((slice(None),))
    why = rule.failure(m, isolated=False)
    # step by step: a cache written wrong shows from the step after the token it was written for
    per_step = [judged((slice(None), s)) for s in range(steps)]
    metrics = {"steps": steps, "err": m.err_cand, "err_ref": m.err_ref, "ratio": m.ratio,
               "budget": rule.quant_noise if m.noise > m.err_ref else rule.k, "quant_noise": m.noise,
               "step_ratios": [s.ratio for s in per_step], "nonfinite": int(bad.sum())}
    what = f"KV-cache decoding (the continuation's {steps} steps, one token each with the cache)"
    batch, padded = int(truth.shape[0]), sorted(padded or [])
    if metrics["nonfinite"]:
        b, s, v = (int(x) for x in bad.nonzero()[0])
        metrics["first_nonfinite"] = [b, s, v]
        rows = [r for r in range(batch) if bool(bad[r].any())]
        return metrics, (f"{what}: {metrics['nonfinite']} non-finite candidate value(s) where the reference is "
                         f"finite; first at batch row {b}, step {s} of 0-{steps - 1}, vocabulary index {v}"
                         f"{_rows_text(rows, batch, padded)}")
    if not why:
        return metrics, ""
    per_row = [judged((r,)) for r in range(batch)]
    metrics["row_ratios"] = [r.ratio for r in per_row]
    rows = [r for r, m_r in enumerate(per_row) if rule.failure(m_r, isolated=False)]
    first = next((i for i, s in enumerate(per_step) if rule.failure(s, isolated=False)), None)
    where = "" if first is None else (
        f"; step by step the first over budget is step {first} of 0-{steps - 1} ({per_step[first].ratio:.3g}x"
        + (f", after step{'s' if first > 1 else ''} 0{f'-{first - 1}' if first > 1 else ''} within it: a cache "
           f"entry written wrong, or a position past the prompt" if first > 0 else "") + ")")
    return metrics, f"{what}: {why}{where}{_rows_text(rows, batch, padded)}"


def _nonfinite_logits(lc: Any, lr: Any, lt: Any, valid: Any) -> tuple[int, list[int] | None]:
    """Non-finite candidate logits at ``valid`` positions where the reference's and the truth's are
    finite, and the first (batch, position, vocabulary index): the perplexity, KL and top-1 metrics
    over them are NaN, which no budget comparison fails."""
    import torch

    bad = torch.isfinite(lr) & torch.isfinite(lt) & ~torch.isfinite(lc) & valid.unsqueeze(-1)
    n = int(bad.sum())
    return n, ([int(x) for x in bad.nonzero()[0]] if n else None)


def check_lm(parity: Any, model: Any, input_ids: Any, *, name: str | None = None, dtypes: Any = None,
             attention_mask: Any = None, generate: int = 0, layers: Any = None, tolerance: Any = None,
             drill: int | None = None, top_k: int = 5, ladder: bool | None = None) -> list[Any]:
    """See Parity.check_lm."""
    __tracebackhide__ = True
    from pytest_rocm_parity.guards import require_inputs, require_model

    with parity.refusing(name, dtypes):
        require_model(model)
        require_inputs({"input_ids": input_ids, "attention_mask": attention_mask})
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise InvalidArgument(f"check_lm: top_k={top_k!r} must be a positive integer: the k of the mutual top-k "
                                  f"containment of the candidate's and the reference's tokens (default 5)")
        if (v := vocab_size(model)) is not None and top_k >= v:
            raise InvalidArgument(f"check_lm: top_k={top_k} is not below the model's vocabulary of {v} tokens, so "
                                  f"every token would be in the top k and the containment would judge nothing; "
                                  f"give a k below {v} (default 5)")
        input_ids, attention_mask = validate(model, input_ids, attention_mask, generate)
        spec = parity._spec(model, name, dtypes, layers, tolerance, drill, ladder=ladder,
                            inputs={"input_ids": input_ids, "attention_mask": attention_mask})
    session = parity._session
    prompt_len = int(input_ids.shape[1])

    def full_inputs(cont: Any) -> tuple[Any, Any]:
        import torch

        if cont is None or cont.shape[1] == 0:
            return input_ids, attention_mask
        ids = torch.cat([input_ids, cont.to(input_ids.dtype)], 1)
        mask = None if attention_mask is None else torch.cat([attention_mask, torch.ones_like(cont)], 1)
        return ids, mask

    def do_capture() -> Any:
        import torch

        from pytest_rocm_parity.runner.engine import home_device, numerics, prepare_model

        cont = None
        if generate:
            m32 = prepare_model(model, parity.device, torch.float32).eval()
            home = home_device(m32, parity.device)
            with numerics("float32"), _positions_past_the_model(model, prompt_len, generate):
                cont, _ = greedy(m32, input_ids.to(home),
                                 None if attention_mask is None else attention_mask.to(home), generate)
            cont = cont.cpu()
            del m32
        ids, mask = full_inputs(cont)
        spec.positions = (int(ids.shape[0]), int(ids.shape[1]))
        spec.manifest_extra = {"lm": {"prompt_len": prompt_len, "generate": generate,
                                      "continuation": [] if cont is None else cont.tolist()}}

        def extra(rung: str, m: Any, args: Any, kwargs: Any) -> Any:
            _require_logits(m, args, kwargs)   # before a golden is written that no replay could judge
            dev = home_device(m, parity.device)
            pm = None if attention_mask is None else attention_mask.to(dev)
            toks, margins = greedy(m, input_ids.to(dev), pm, generate)
            tensors = {"gen_tokens": toks, "gen_margins": margins}
            try:
                cached, why_not = cached_decode(m, input_ids.to(dev), pm, None if cont is None else cont.to(dev))
            except Exception as exc:   # a model that takes no cache this way: its decoding is not recorded
                cached, why_not = None, f"decoding with it raised {type(exc).__name__}: {str(exc)[:200]}"
            meta: dict[str, Any] = {"generate": generate}
            if cached is not None:
                tensors["cached_logits"] = cached
            elif generate:
                progress(f"{rung}: KV-cache decoding not recorded ({why_not})", verbose=1)
                meta["cached_decode_not_recorded"] = why_not   # the replay's note and warning say why
            return meta, tensors

        spec.extra_capture = extra
        return capture(model, _inputs(model, ids, mask), spec, session.store, parity.device,
                       overwrite=session.store.exists(spec.name), env=session.env)

    def do_replay() -> Any:
        import torch

        manifest = session.store.read_manifest(spec.name)
        lm = manifest.get("lm", {})
        cont_list = lm.get("continuation") or []
        cont = torch.tensor(cont_list, dtype=torch.long) if cont_list else None
        if int(lm.get("generate", 0)) != generate or int(lm.get("prompt_len", prompt_len)) != prompt_len:
            from pytest_rocm_parity.errors import GoldenStale
            from pytest_rocm_parity.runner.engine import golden_regen_command

            raise GoldenStale(f"stale golden for {spec.name!r}: captured with generate={lm.get('generate')} and a "
                              f"{lm.get('prompt_len')}-token prompt, asked generate={generate} on {prompt_len}. "
                              f"Regenerate: {golden_regen_command(manifest, spec)}", session.store.manifest_path(spec.name))
        ids, mask = full_inputs(cont)
        spec.positions = (int(ids.shape[0]), int(ids.shape[1]))
        spec.extra_judge = _judge(prompt_len, generate, top_k, ids, mask, spec.tolerance, spec.name)
        return replay(model, _inputs(model, ids, mask), spec, session.store, parity.device, env=session.env)

    results = parity._run(spec, do_capture, do_replay, kind="lm")
    return results


def _judge(prompt_len: int, generate: int, top_k: int, ids_cpu: Any, mask_cpu: Any, tol: Any, name: str) -> Any:
    warned: set[str] = set()   # one warning per reason, not one per rung

    def judge(rung: str, m: Any, args: Any, kwargs: Any, out: Any, reader: Any, meta: Any, result: Any) -> None:
        import torch

        dev = reader.get(meta["outputs"]["out"][_logits_leaf(meta)]).device
        lc = _logits(out).to(dev, torch.float64)
        lr = reader.get(meta["outputs"]["out"][_logits_leaf(meta)]).to(torch.float64)
        lt = load_truth(reader, f"gtruth/{OUTPUT}/{_logits_leaf(meta)}", reader.get(meta["outputs"]["out"][_logits_leaf(meta)]))
        ids = ids_cpu.to(dev)
        valid = torch.ones(ids.shape, dtype=torch.bool, device=dev) if mask_cpu is None else mask_cpu.to(dev).bool()
        u = dt.UNIT_ROUNDOFF[rung] if not (rung == "float32" and meta.get("tf32")) else dt.UNIT_ROUNDOFF["tf32"]
        # a candidate quantizing its activations in another FP8 format carries that format's noise:
        # the truth with activation quantization off (lq) measures it (docs/fp8.md)
        qkey = f"qnoise/{OUTPUT}/{_logits_leaf(meta)}"
        lq = (lt + reader.get(qkey).to(dev, torch.float64)
              if qkey in reader.keys and differing_modules(meta, m) else None)
        logits = judge_logits(lc, lr, lt, ids, valid, prompt_len, u, tol.propagated_for(rung), tol.quant_noise, top_k, lq)
        metrics, fails, delta = logits.metrics, logits.fails, logits.near_tie_margin
        nonfinite: dict[str, int] = {}
        n_bad, at = _nonfinite_logits(lc, lr, lt, valid)
        if n_bad and at is not None:
            nonfinite["forward"] = n_bad
            fails.insert(0, f"{n_bad} non-finite candidate logit(s) where the reference's are finite; first at batch "
                            f"row {at[0]}, position {at[1]}, vocabulary index {at[2]} (the perplexity, KL and top-1 "
                            f"metrics over them are NaN)")
        else:
            # finite logits whose metrics are not (an overflow inside the softmax): NaN passes any budget
            for cand_key, ref_key, what in (("log_ppl_err", "log_ppl_err_ref", "log-perplexity error"),
                                            ("kl_truth_cand_mean", "kl_truth_ref_mean", "KL(truth||cand) mean")):
                if not math.isfinite(metrics[cand_key]) and math.isfinite(metrics[ref_key]):
                    fails.append(f"{what} is {metrics[cand_key]} where the reference's is {metrics[ref_key]:.3g}")
        flips, confident, margin = logits.flips, logits.confident, logits.margin
        a_r, a_c = logits.ref_top1, logits.cand_top1
        def not_judged(why: str) -> None:
            """A note, and a warning: a passing check shows no notes, and must not hide that its
            decoding with the cache was not judged."""
            text = (f"{why}, so decoding step by step with a KV cache is not judged; the full forward and greedy "
                    f"generation (a full forward each step) are")
            result.notes.append(f"lm: {text}")
            if text not in warned:
                warned.add(text)
                warnings.warn(f"rocm-parity: {name}: {text}", stacklevel=2)

        first = None
        if bool(confident.any()):
            b, s = (int(x) for x in confident.nonzero()[0])
            first = {"batch": b, "position": s, "ref_token": int(a_r[b, s]), "cand_token": int(a_c[b, s]),
                     "ref_margin": float(margin[b, s]), "layer": _first_layer_at(result, b, s)}
            metrics["first_confident_disagreement"] = first

        # generation: free-running first divergence, then teacher-forced continuation
        if generate:
            gold = reader.get("extra/gen_tokens").to(dev)
            gmarg = reader.get("extra/gen_margins").to(dev, torch.float64)
            pm = None if mask_cpu is None else mask_cpu[:, :prompt_len].to(dev)
            cand_toks, cand_marg = greedy(m, ids[:, :prompt_len], pm, generate)
            diverged = cand_toks.to(dev) != gold
            # a non-finite logit makes the step's top-1/top-2 margin non-finite, where the reference's is not
            gen_bad = (torch.isfinite(gmarg) & ~torch.isfinite(cand_marg.to(dev))).nonzero()
            if gen_bad.numel():
                nonfinite["generation"] = int(gen_bad.shape[0])
                fails.append(f"greedy generation: non-finite candidate logits at {gen_bad.shape[0]} step(s) where the "
                             f"reference's are finite; first at batch row {int(gen_bad[0, 0])}, step "
                             f"{int(gen_bad[0, 1])}")
            steps = []
            conf_div = 0
            for b in range(gold.shape[0]):
                idx = diverged[b].nonzero()
                j = int(idx[0]) if idx.numel() else None
                steps.append(j)
                if j is not None and float(gmarg[b, j]) > delta:
                    conf_div += 1
            tf = slice(prompt_len - 1, prompt_len - 1 + generate)
            tf_flips = flips[:, tf]
            metrics["generation"] = {
                "steps": generate, "first_divergent_step": steps,
                "exact_match_rows": sum(1 for j in steps if j is None),
                "confident_divergences": conf_div,
                "teacher_forced_agreement": 1.0 - float(tf_flips.float().mean()) if tf_flips.numel() else 1.0,
                "teacher_forced_confident_flips": int(confident[:, tf].sum()),
            }
            if "extra/cached_logits" in reader.keys:
                span = slice(prompt_len, prompt_len + generate)
                try:
                    cached, why_not = cached_decode(m, ids[:, :prompt_len], pm, ids[:, span])
                except Exception as exc:   # the reference decoded this way: the candidate must too
                    fails.append(f"KV-cache decoding raised {type(exc).__name__}: {exc} (the reference's "
                                 f"decoded the continuation with its cache)")
                else:
                    if cached is None:
                        not_judged(f"the reference decoded with a KV cache and the candidate does not ({why_not})")
                    else:
                        qn = float((lq - lt)[:, span].square().mean().sqrt()) if lq is not None else 0.0
                        padded = ([] if pm is None else
                                  [int(r) for r in (pm == 0).any(dim=1).nonzero().flatten().tolist()])
                        metrics["cached_decode"], why = _judge_cached(rung, tol, cached,
                                                                      reader.get("extra/cached_logits"), lt[:, span], qn,
                                                                      padded)
                        if metrics["cached_decode"]["nonfinite"]:
                            nonfinite["cached_decode"] = metrics["cached_decode"]["nonfinite"]
                        if why:
                            fails.append(why)
            else:
                why_not = (meta.get("extra") or {}).get("cached_decode_not_recorded") or (
                    "the golden predates the record of why: capture it again to see the reason")
                not_judged(f"generate={generate}: the golden holds no cached decoding ({why_not})")
            if conf_div:
                n_div = sum(1 for j in steps if j is not None)
                fails.append(f"greedy generation diverged in {n_div} of {len(steps)} sequences, {conf_div} of them "
                             f"at a confident step (first divergent step: {steps_text(steps)})")
        if nonfinite:
            metrics["nonfinite"] = nonfinite
        metrics["fails"] = list(fails)
        result.extra["lm"] = metrics
        if fails:
            result.passed = False
            result.notes.extend(f"lm: {f}" for f in fails)
            if first is not None:
                result.notes.append(f"lm: first confident disagreement at batch {first['batch']} position "
                                    f"{first['position']}; layer that diverged first there: "
                                    f"{first['layer'] or 'none beyond its budget at that position'}")
        result.kind = "lm"

    return judge


def _logits_leaf(meta: dict[str, Any]) -> str:
    path = _logits_path(meta["outputs"]["out"])
    if path is None:   # a golden written before capture refused such outputs
        from pytest_rocm_parity.errors import GoldenStale

        raise GoldenStale("check_lm: the golden records no output tensor, so there are no logits to judge: the "
                          "model returned an object whose tensors are not recorded (a SimpleNamespace). Return the "
                          "logits, a tuple starting with them, a dict with 'logits' or a transformers ModelOutput, "
                          "and capture the golden again")
    return path


def _first_layer_at(result: Any, b: int, s: int) -> str | None:
    """First layer (execution order) whose propagated error at (b, s) exceeds its budget there,
    against the reference's error or the FP8 activation-quantization noise the layer's verdict
    allows (LeafMetrics.allow_noise), whichever is larger, as the verdict judges it."""
    pos = result.extra.get("_pos_err", {})
    for rec in result.layers:
        e = pos.get(rec.name)
        if e is None:
            continue
        ec, er = float(e[0][b, s]), float(e[1][b, s])
        if ec > rec.prop_budget * max(er, rec.prop.noise if rec.prop is not None else 0.0) + 1e-30:
            return rec.name
    return None
