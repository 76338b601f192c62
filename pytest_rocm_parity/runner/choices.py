"""The discrete choices a module makes on its activations (a MoE router's top-k), compared inside an
isolated call of an ancestor with the golden's, and the unselected modules whose choices a golden
keeps for that (docs/judging.md, "Choices inside an isolated call")."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.runner.engine import hook_sensitive_kinds
from pytest_rocm_parity.runner.padding import Padding
from pytest_rocm_parity.runner.selection import Selected
from pytest_rocm_parity.runner.tree import aligned_leaves, tensor_leaves


def scores_of(choices: Any, leaves: dict[str, Any]) -> Any:
    """Among a call's output ``leaves``, the scores its ``choices`` (an integer (..., k) top-k) were
    made from: the first floating leaf over the same tokens with more than k candidates (a router's
    logits); None where there is none."""
    k = int(choices.shape[-1]) if choices.dim() >= 2 else 0
    if k == 0:
        return None
    n = choices.numel() // k
    return next((g for g in leaves.values() if g.is_floating_point() and g.dim() >= 2 and g.shape[-1] > k
                 and g.numel() // g.shape[-1] == n), None)


def choice_like(leaves: dict[str, Any]) -> bool:
    """Whether a call's output leaves hold choices beside their scores, as Decisions compares them
    (a router's top-k indices and its logits)."""
    return any(scores_of(c, leaves) is not None for c in leaves.values()
               if not (c.is_floating_point() or c.is_complex()))


def watch_entry(e: dict[str, Any]) -> dict[str, Any]:
    """A rung's ``watch`` entry for call entry ``e``: what Decisions reads of it, its outputs."""
    keep = ("key", "name", "level", "primary", "out", "fields")
    return {k: e[k] for k in keep if k in e}


def unselected_inside(model: Any, selected: list[Selected]) -> list[Selected]:
    """The modules inside selected ones that are not selected themselves, as Hooks can watch them
    (none inside a fused-path module, whose hooks would take it off that path), each with its
    level (its selected ancestors) and primary (the outermost)."""
    chosen = {s.name: s for s in selected}
    kinds = hook_sensitive_kinds()
    found: list[Selected] = []

    def visit(mod: Any, name: str, ancestors: list[Selected]) -> None:
        for part, child in mod._modules.items():
            if child is None or isinstance(child, kinds):
                continue
            full = f"{name}.{part}" if name else part
            sel = chosen.get(full)
            if sel is None and ancestors:
                found.append(Selected(name=full, level=len(ancestors), primary=ancestors[0].name))
            visit(child, full, ancestors + [sel] if sel is not None else ancestors)
    if not isinstance(model, kinds):
        visit(model, "", [chosen[""]] if "" in chosen else [])
    return found


def present(model: Any, watch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``watch`` entries whose modules ``model`` has: a port that made its router part of
    another module has none there to watch, and its ancestors are judged on every token."""
    def has(name: str) -> bool:
        try:
            model.get_submodule(name)
        except AttributeError:
            return False
        return True
    return [e for e in watch if has(e["name"])]


# A token's choice moved inside an ancestor's isolated call is a near-tie where the reference's own
# scores of its last chosen and first unchosen candidates lie within this many roundings of its RMS
# score: what the rounding of the ancestor's children (an attention's, a norm's) moves them by. A
# fault that changes the token (a residual add gone wrong) moves scores much further, and that token
# stays judged.
NEAR_TIE_ROUNDINGS = 8.0


class Decisions:
    """The discrete choices (a MoE router's top-k) that modules made inside an isolated call of one
    of their ancestors, against the golden's: selected modules, and the unselected ones whose
    choices the golden keeps (``watch``).

    Why: an ancestor judged on golden inputs runs its router on its own children's outputs, which
    differ from the reference's by rounding; a token at a near-tie of the router's scores goes to
    other experts, and its output differs whole, as on a correct backend. Such tokens are scored as
    the reference's in the ancestor's isolated verdict (and named in a note), up to half its tokens:
    a token whose choice differs where the reference's own scores do not nearly tie stays judged,
    so a fault of the router or of the ancestor's own code that moves tokens shows, as it does on
    the tokens routed alike; a selected router is judged on its own golden inputs besides.
    """

    def __init__(self, layers: dict[str, dict[str, Any]], selected: list[Selected], reader: RungReader,
                 u: float, watch: Sequence[dict[str, Any]] = (), padding: Padding | None = None) -> None:
        self.layers = {**layers, **{e["key"]: {**e, "decides": True} for e in watch}}
        self.reader, self.u = reader, u
        # a padded token's choice is made on what the candidate computes at a padded position (another
        # attention implementation's may be anything): it is neither counted nor judged
        self.padding = padding
        names = {e["name"] for e in layers.values() if e.get("decides")}
        # ``watch``: the rung's unselected modules that made choices (capture.recording_pass), hooked
        # for their outputs alone
        self.extra = list({e["name"]: Selected(name=e["name"], level=int(e["level"]), primary=str(e["primary"]))
                           for e in watch}.values())
        self.watched = [s for s in selected if s.name in names] + self.extra
        self.flips: dict[str, Any] = {}       # decider call -> (rows,) bool, where its choice differs at a near-tie
        self.unexplained: dict[str, Any] = {}  # decider call -> (rows,) bool, where it differs with no near-tie
        self.real: dict[str, Any] = {}         # decider call -> (rows,) bool, its unpadded tokens
        # judged call -> (rows scored as the reference's, deciders, its unpadded tokens)
        self.dropped: dict[str, tuple[Any, list[str], Any]] = {}
        # judged call -> (rows moved with no near-tie, deciders, its unpadded tokens)
        self.untied_in: dict[str, tuple[Any, list[str], Any]] = {}

    def deeper(self, level: int) -> list[Selected]:
        """The watched modules below ``level``: those an isolated call at ``level`` runs in context."""
        return [s for s in self.watched if s.level > level]

    def saw(self, key: str, out: Any) -> None:
        """A watched call's output in an isolated run of an ancestor: its exact leaves (choices, a
        token's along the last dim) against the golden's, token by token, with no wait for the device."""
        import torch

        e = self.layers.get(key)
        if e is None or not e.get("decides"):
            return
        got = {"0": out} if isinstance(out, torch.Tensor) else aligned_leaves(tensor_leaves(out), e)
        rows = off = real = None
        for p, gk in e["out"].items():
            c = got.get(p)
            found = None if c is None else self._choices(key, c, self.reader.get(gk))
            if found is None:
                continue
            real = self._real(key, p, c, found[0])
            moved, other = found[0] & found[1] & real, found[0] & ~found[1] & real
            rows = moved if rows is None or rows.shape != moved.shape else rows | moved
            off = other if off is None or off.shape != other.shape else off | other
        if rows is not None:
            self.flips[key] = rows
            self.unexplained[key] = off
            self.real[key] = real

    def _real(self, key: str, leaf: str, c: Any, rows: Any) -> Any:
        """The (tokens,) bool of ``rows``' unpadded tokens, for output ``leaf`` (``c``) of call ``key``."""
        import torch

        pad = self.padding.padded(key, leaf, c) if self.padding is not None else None
        if pad is not None and pad.shape[-1] == 1 and pad.numel() == rows.numel():
            return ~pad.to(rows.device).reshape(-1)
        return torch.ones_like(rows)

    def untied(self, key: str, leaf: str, c: Any, ref: Any) -> int:
        """How many unpadded tokens' choices in ``c`` (output ``leaf`` of call ``key``) differ from
        the golden ``ref`` (a (..., k) top-k) where the reference's own scores for them do not nearly
        tie (0 where the call returns no scores). One wait for the device."""
        found = self._choices(key, c, ref)
        if found is None:
            return 0
        differs, tied = found
        return int((differs & ~tied & self._real(key, leaf, c, differs)).sum())

    def _choices(self, key: str, c: Any, ref: Any) -> tuple[Any, Any] | None:
        """Per token of call ``key``'s exact output ``ref`` (a (..., k) top-k): whether ``c`` chose
        otherwise, and whether the reference's own scores nearly tie (_tied); None where ``ref`` is
        no such output or the call returns no scores for it."""
        if ref.is_floating_point() or ref.is_complex() or ref.dim() < 2:
            return None
        if tuple(c.shape) != tuple(ref.shape):
            # another number of choices per token (top-1 for top-2) over the same tokens: every
            # token chose otherwise, and no near-tie makes a router choose fewer
            if c.is_floating_point() or c.is_complex() or c.dim() != ref.dim() or c.shape[:-1] != ref.shape[:-1]:
                return None
            import torch

            n = ref.numel() // ref.shape[-1]
            return torch.ones(n, dtype=torch.bool, device=ref.device), torch.zeros(n, dtype=torch.bool, device=ref.device)
        tied = self._tied({p: self.reader.get(gk) for p, gk in self.layers[key]["out"].items()}, ref)
        # the last dim holds a token's top-k, in any order: the same experts listed otherwise (two
        # near-tied scores among the chosen) weigh the same outputs
        differs = (c.to(ref.device).sort(-1).values != ref.sort(-1).values).any(-1).reshape(-1)
        return None if tied is None or tied.shape != differs.shape else (differs, tied)

    def _tied(self, golden: dict[str, Any], choices: Any) -> Any:
        """Per token, whether the reference's own scores for ``choices`` (a (..., k) top-k) hold a
        near-tie: a float output of the call over the same tokens and more than k candidates (a
        router's logits) whose k-th and (k+1)-th largest lie within NEAR_TIE_ROUNDINGS roundings of
        the token's RMS score. None where the call returns no such scores: its choices are then
        taken as made, and the ancestor judged on every token."""
        g = scores_of(choices, golden)
        if g is None:
            return None
        k = int(choices.shape[-1])
        s = g.reshape(choices.numel() // k, -1).double()
        top = s.topk(k + 1, dim=-1).values
        margin = top[:, k - 1] - top[:, k]
        return margin <= NEAR_TIE_ROUNDINGS * self.u * s.square().mean(-1).sqrt()

    def take(self, key: str) -> Any:
        """The (tokens,) rows that the choices inside call ``key`` sent elsewhere in this run (none
        where more than half did: not near-ties, judged whole); None where no watched call ran in it."""
        name = self.layers[key]["name"] + "."
        inside = [d for d in self.flips if self.layers[d]["name"].startswith(name)]
        rows: Any = None
        off: Any = None
        real: Any = None
        for d in inside:
            r, o, t = self.flips.pop(d), self.unexplained.pop(d, None), self.real.pop(d)
            if rows is None:
                rows, real = r, t
            elif rows.shape == r.shape:
                rows, real = rows | r, real | t
            if o is not None:
                off = o if off is None else (off | o if off.shape == o.shape else off)
        if rows is None:
            return None
        if off is not None:
            self.untied_in[key] = (off, inside, real)
        rows = rows & (rows.sum() * 2 <= real.sum())
        self.dropped[key] = (rows, inside, real)
        return rows

    @staticmethod
    def scored_as_reference(rows: Any, c: Any, ref: Any) -> Any:
        """``c`` with the tokens ``rows`` set to the reference's values, where ``c`` runs over the
        tokens ((tokens, ...) or (batch, seq, ...)); ``c`` itself elsewhere."""
        import torch

        n = rows.numel()
        if c.dim() >= 1 and c.shape[0] == n:
            shape = (n,) + (1,) * (c.dim() - 1)
        elif c.dim() >= 2 and c.shape[0] * c.shape[1] == n:
            shape = (c.shape[0], c.shape[1]) + (1,) * (c.dim() - 2)
        else:
            return c
        return torch.where(rows.to(c.device).reshape(shape), ref.to(c.device, c.dtype), c)

    def run_done(self) -> None:
        """The choices of one isolated run are its own: the next run's ancestors see the next run's."""
        self.flips.clear()
        self.unexplained.clear()
        self.real.clear()

    def forget(self, keys: Any) -> None:
        """Drop what was recorded for the judged calls ``keys`` (a run of them that is done again)."""
        self.dropped = {k: v for k, v in self.dropped.items() if k not in keys}
        self.untied_in = {k: v for k, v in self.untied_in.items() if k not in keys}

    def moved_without_tie(self) -> dict[str, tuple[int, int, list[str]]]:
        """Per judged call, the tokens that the choices inside it sent elsewhere where the reference's
        own scores do not nearly tie: (how many, of how many, the deciders' names); one wait. No
        near-tie explains them, so its error there is no correct backend's (judge.fail_moved_choices)."""
        import torch

        keys = list(self.untied_in)
        if not keys:
            return {}
        counts = torch.stack([torch.stack([self.untied_in[k][0].sum(), self.untied_in[k][2].sum()]).cpu()
                              for k in keys]).tolist()
        return {k: (int(n), int(of), [self.layers[d]["name"] for d in self.untied_in[k][1]])
                for k, (n, of) in zip(keys, counts) if n}

    def notes(self) -> list[str]:
        """One note per judged call some of whose tokens were scored as the reference's (one wait)."""
        import torch

        if not self.dropped:
            return []
        keys = list(self.dropped)
        counts = torch.stack([torch.stack([self.dropped[k][0].sum(), self.dropped[k][2].sum()]).cpu()
                              for k in keys]).tolist()
        out = []
        for key, (n, of) in zip(keys, counts):
            if n:
                inside = self.dropped[key][1]
                out.append(f"{key}: {n} of {of} tokens took other choices at "
                           f"{', '.join(self.layers[d]['name'] for d in inside[:2])} inside it than the reference's "
                           f"on its golden inputs (near-ties of the choice's scores, moved by its children's "
                           f"rounding): scored as the reference's in its isolated verdict")
        more = len(out) - 3
        return out[:3] + ([f"... and {more} more call{'s' if more > 1 else ''} so"] if more > 0 else [])


def expert_errors(c: Any, ref: Any, truth: Any, routed: Any) -> list[tuple[int, float, int]]:
    """``(expert, ratio without it, tokens)`` for each expert that tokens were routed to, the one
    whose tokens hold the excess first: the candidate's error against the float64 ``truth`` over
    the reference's, on the output rows of every token that ``routed`` (an integer (tokens, k) top-k)
    did not send to that expert. A token's row mixes its k experts' outputs, so the error of a fault
    in one expert is on its tokens only: leaving them out leaves the reference's error."""
    import torch

    rows = c.reshape(-1, c.shape[-1]).to(torch.float64)
    t = truth.reshape(-1, truth.shape[-1]).to(rows.device, torch.float64)
    r = ref.reshape(-1, ref.shape[-1]).to(rows.device, torch.float64)
    idx = routed.reshape(rows.shape[0], -1).to(rows.device)
    err_c, err_r = ((rows - t) ** 2).sum(-1), ((r - t) ** 2).sum(-1)
    out = []
    for e in torch.unique(idx).tolist():
        off = ~(idx == e).any(-1)
        base = float(err_r[off].sum())
        ratio = (float(err_c[off].sum()) / base) ** 0.5 if base > 0 else (0.0 if not off.any() else float("inf"))
        out.append((int(e), ratio, int((~off).sum())))
    return sorted(out, key=lambda x: x[1])
