"""How often a correct MoE migration fails: eager against SDPA attention, both ways, in tiny
Hugging Face MoE models, at each drill depth and replay route (docs/migrations.md, "MoE routing";
docs/judging.md, "Choices inside an isolated call").

    python bench/moe_migrations.py --seeds 2 --drills 0,1

Each case: a model built from a config with seeded weights (2 layers, hidden 64, 4 experts, top-2),
captured on the CPU with one attention implementation, replayed with the other on 2 x 8 or 4 x 32
tokens at bf16. Prints a JSON row per failing case and one per family (cases, failures, cases with
a token scored as the reference's, the routers the golden watches), then the totals.
"""
from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from typing import Any

import torch
import transformers as T

from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay

COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILIES: dict[str, Any] = {
    "mixtral": lambda: (T.MixtralConfig(intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, **COMMON),
                        T.MixtralForCausalLM),
    "qwen2_moe": lambda: (T.Qwen2MoeConfig(intermediate_size=128, moe_intermediate_size=64,
                                           shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                                           decoder_sparse_step=1, **COMMON), T.Qwen2MoeForCausalLM),
    "qwen3_moe": lambda: (T.Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=64, num_experts=4,
                                           num_experts_per_tok=2, decoder_sparse_step=1, head_dim=16, **COMMON),
                          T.Qwen3MoeForCausalLM),
    "olmoe": lambda: (T.OlmoeConfig(intermediate_size=64, num_experts=4, num_experts_per_tok=2, **COMMON),
                      T.OlmoeForCausalLM),
    # multi-head latent attention: as many key/value heads as query heads
    "deepseek_v3": lambda: (T.DeepseekV3Config(intermediate_size=128, moe_intermediate_size=64, n_routed_experts=4,
                                               num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0,
                                               kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                                               qk_nope_head_dim=8, v_head_dim=16, n_shared_experts=1,
                                               **{**COMMON, "num_key_value_heads": 4}), T.DeepseekV3ForCausalLM),
}


def build(family: str, attn: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg, cls = FAMILIES[family]()
    m = cls(cfg).eval()
    m.set_attn_implementation(attn)
    return m


def case(family: str, seed: int, ref: str, cand: str, route: str, drill: int, shape: tuple[int, int]) -> dict[str, Any]:
    ids = {"input_ids": torch.randint(3, 128, shape, generator=torch.Generator().manual_seed(seed + 1)),
           "use_cache": False}
    spec = CheckSpec(name="m", dtypes=["bfloat16"], drill=drill, replay=route)
    store = GoldenStore(tempfile.mkdtemp(prefix="moe-migrations-"))
    capture(build(family, ref, seed), ids, spec, store, "cpu")
    watched = len(store.read_manifest("m")["rungs"]["bfloat16"].get("watch", []))
    (r,) = replay(build(family, cand, seed), ids, spec, store, "cpu")
    return {"family": family, "seed": seed, "reference": ref, "route": route, "drill": drill, "tokens": list(shape),
            "passed": r.passed, "culprit": r.culprit, "watched": watched,
            "scored_as_reference": any("took other choices" in n for n in r.notes),
            "failing": [f"{l.name}: {l.reason}" for l in r.layers if not l.passed][:2]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--drills", default="0,1,2")
    a = ap.parse_args(argv)
    drills = [int(d) for d in a.drills.split(",")]
    total = fails = 0
    for family in a.families.split(","):
        rows = [case(family, seed, ref, cand, route, drill, shape) for seed, (ref, cand), route, drill, shape in
                itertools.product(range(a.seeds), [("eager", "sdpa"), ("sdpa", "eager")], ["fast", "full"], drills,
                                  [(2, 8), (4, 32)])]
        for r in rows:
            if not r["passed"]:
                print(json.dumps(r), flush=True)
        bad = sum(not r["passed"] for r in rows)
        print(json.dumps({"family": family, "cases": len(rows), "failures": bad,
                          "scored_as_reference": sum(r["scored_as_reference"] for r in rows),
                          "watched": sorted({r["watched"] for r in rows})}), flush=True)
        total, fails = total + len(rows), fails + bad
    print(json.dumps({"cases": total, "failures": fails}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
