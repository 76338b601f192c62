"""parity.check_lm on three transformers architectures, seeded configs, through the plugin."""
from __future__ import annotations

from typing import Any

import json

import pytest

pytest.importorskip("transformers")

LM_CONFTEST = '''
import os
import torch
import transformers as tf

def build(arch):
    torch.manual_seed(0)
    if arch == "llama":
        cfg = tf.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        m = tf.LlamaForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = tf.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        m = tf.GPT2LMHeadModel(cfg)
    else:
        cfg = tf.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        m = tf.Qwen2ForCausalLM(cfg)
    m.eval()
    if os.environ.get("BUG") == arch:
        # a kernel bug in layer 1's MLP activation only
        blocks = m.transformer.h if arch == "gpt2" else m.model.layers
        act = blocks[1].mlp.act if arch == "gpt2" else blocks[1].mlp.act_fn
        act.forward = lambda x: torch.nn.functional.gelu(x, approximate="tanh") * 1.05
    if os.environ.get("BUG") == f"{arch}-flip":
        # a gross bug in layer 1's MLP: the next-token choice changes where the reference is confident
        import types
        mlp = m.model.layers[1].mlp
        mlp.forward = types.MethodType(lambda self, x: type(self).forward(self, x) * 40.0, mlp)
    if os.environ.get("BUG") == f"{arch}-kv":
        # a decode kernel bug: layer 1's attention is off by 5% only when it attends one new token to
        # the cache, so a forward over the whole sequence never shows it
        import types
        attn = m.model.layers[1].self_attn
        def decode_bug(self, hidden_states, *a, **kw):
            out = type(self).forward(self, hidden_states, *a, **kw)
            return (out[0] * 1.05, *out[1:]) if hidden_states.shape[1] == 1 else out
        attn.forward = types.MethodType(decode_bug, attn)
    if os.environ.get("BUG") == f"{arch}-kvcrash":
        # a decode kernel that fails outright when one new token attends to the cache
        import types
        attn = m.model.layers[1].self_attn
        def decode_crash(self, hidden_states, *a, **kw):
            if hidden_states.shape[1] == 1:
                raise RuntimeError("HIP error: an illegal memory access was encountered")
            return type(self).forward(self, hidden_states, *a, **kw)
        attn.forward = types.MethodType(decode_crash, attn)
    return m

def ids():
    return torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
'''

LM_TEST = '''
import pytest
from conftest import build, ids

@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_lm(parity, arch):
    parity.check_lm(build(arch), ids(), name=f"lm-{arch}", dtypes=["bfloat16", "float32"], generate=3, drill=1)
'''


@pytest.fixture
def lm_project(parity_project: Any) -> pytest.Pytester:
    return parity_project(LM_CONFTEST, "BUG", test_lm=LM_TEST)


def test_three_architectures_capture_replay_and_blame(lm_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    lm_project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=3)
    manifest = json.loads((lm_project.path / "goldens" / "lm-llama" / "manifest.json").read_text())
    assert manifest["lm"]["generate"] == 3 and len(manifest["lm"]["continuation"][0]) == 3
    result = lm_project.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(passed=3)
    doc = json.loads((lm_project.path / "rep" / "parity-report.json").read_text())
    lm = next(c for c in doc["checks"] if c["name"] == "lm-gpt2" and c["dtype"] == "bfloat16")["extra"]["lm"]
    assert lm["top1_agreement"] == 1.0 and lm["confident_flips"] == 0
    assert lm["generation"]["first_divergent_step"] == [None, None]
    assert lm["ppl"] == pytest.approx(lm["ppl_ref"]) and lm["kl_mean"] == pytest.approx(0.0, abs=1e-12)
    monkeypatch.setenv("BUG", "qwen2")
    result = lm_project.runpytest("--rocm-parity", "-k", "qwen2")
    result.assert_outcomes(failed=1, deselected=2)
    # the KL verdict (budget: the propagated multiplier squared times the reference's own KL) fires too
    result.stdout.fnmatch_lines(["*culprit: model.layers.1.mlp*", "*lm: ppl *", "*KL(truth||cand) mean * > budget *"])


def test_first_confident_flip_names_the_layer(lm_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    lm_project.runpytest("--rocm-parity", "--parity-mode=capture", "-k", "llama").assert_outcomes(passed=1, deselected=2)
    monkeypatch.setenv("BUG", "llama-flip")
    result = lm_project.runpytest("--rocm-parity", "-k", "llama", "--parity-report=rep")
    result.assert_outcomes(failed=1, deselected=2)
    result.stdout.fnmatch_lines(["*confident top-1 flip(s)*", "*layer that diverged first there: model.layers.1*"])
    doc = json.loads((lm_project.path / "rep" / "parity-report.json").read_text())
    lm = next(c for c in doc["checks"] if c["dtype"] == "float32")["extra"]["lm"]
    assert lm["confident_flips"] > 0
    gen = lm["generation"]
    diverged = sum(1 for j in gen["first_divergent_step"] if j is not None)
    assert diverged >= gen["confident_divergences"] > 0
    # the count and the list of sequences agree: how many diverged, and how many of them confidently
    result.stdout.fnmatch_lines([f"*greedy generation diverged in {diverged} of 2 sequences, "
                                 f"{gen['confident_divergences']} of them at a confident step*"])
    assert lm["first_confident_disagreement"]["layer"].startswith("model.layers.1")


BAD_INPUT = '''
import torch
from conftest import build

def test_bad(parity):
    m = build("llama")
    {call}
'''


@pytest.mark.parametrize("call,message", [
    ("parity.check_lm(m, torch.tensor([[1, 2, 500]]))", "*InputError: input_ids: token id 500 at index (0, 2) is outside the model's vocabulary [[]0, 96)*"),
    # parity.check holds token ids to the same rule, before its default depth runs the model on meta
    ("parity.check(m, {'input_ids': torch.tensor([[1, 2, 500]]), 'use_cache': False})",
     "*InputError: input_ids: token id 500 at index (0, 2) is outside the model's vocabulary [[]0, 96)*"),
    ("parity.check_lm(m, torch.zeros((1, 0), dtype=torch.long))", "*InputError: input_ids: empty sequence*"),
    ("parity.check_lm(m, torch.ones((2, 4), dtype=torch.long), attention_mask=torch.ones((2, 5)))", "*attention_mask: shape (2, 5) does not match input_ids (2, 4)*"),
    ("m.config.pad_token_id = 0; parity.check_lm(m, torch.tensor([[5, 6, 0, 0], [1, 2, 3, 4]]))", "*batch contains padding (pad_token_id=0) but no attention_mask*"),
    ("parity.check_lm(m, torch.randn(2, 4))", "*expected integer token ids*"),
    ("parity.check_lm(m, torch.ones((2, 4), dtype=torch.long), attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]))",
     "*InputError: attention_mask: row 1 has fewer than 2 real tokens*"),
    ("parity.check_lm(m, torch.ones((1, 4), dtype=torch.long), top_k=0)",
     "*InvalidArgument: check_lm: top_k=0 must be a positive integer*"),
    ("parity.check_lm(m, torch.ones((1, 4), dtype=torch.long), top_k=96)",
     "*InvalidArgument: check_lm: top_k=96 is not below the model's vocabulary of 96 tokens*"),
    # learned positions (OPT) have no row past max_position_embeddings
    ("import transformers as tf; parity.check_lm(tf.OPTForCausalLM(tf.OPTConfig(vocab_size=96, hidden_size=16, "
     "num_hidden_layers=1, ffn_dim=32, num_attention_heads=2, word_embed_proj_dim=16, "
     "max_position_embeddings=12)), torch.ones((1, 10), dtype=torch.long), generate=4)",
     "*InputError: generate=4: the prompt's 10 tokens and 4 generated ones run past the model's "
     "max_position_embeddings=12*give a prompt of at most 8 tokens or generate at most 2*"),
    # an encoder-decoder's logits are its decoder's: no next-token perplexity over input_ids
    ("import transformers as tf; parity.check_lm(tf.BartForConditionalGeneration(tf.BartConfig(vocab_size=96, "
     "d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, "
     "encoder_ffn_dim=32, decoder_ffn_dim=32)), torch.ones((1, 4), dtype=torch.long))",
     "*InvalidArgument: check_lm: BartForConditionalGeneration is an encoder-decoder*parity.check(model, "
     "{'input_ids': ..., 'decoder_input_ids': ...})*"),
    # a speech one is judged on its own input, which is not input_ids
    ("import transformers as tf; parity.check_lm(tf.WhisperForConditionalGeneration(tf.WhisperConfig(vocab_size=96, "
     "num_mel_bins=8, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, "
     "decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=8, "
     "max_target_positions=16, pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2)), "
     "torch.ones((1, 4), dtype=torch.long))",
     "*InvalidArgument: check_lm: WhisperForConditionalGeneration is an encoder-decoder*parity.check(model, "
     "{'input_features': ..., 'decoder_input_ids': ...})*"),
    # a base model without its LM head: refused when captured, not when the golden is replayed
    ("parity.check_lm(m.model, torch.ones((1, 4), dtype=torch.long))",
     "*InvalidArgument: check_lm: the model returned BaseModelOutputWithPast; expected logits*"),
])
def test_bad_inputs_are_clear(lm_project: pytest.Pytester, call: str, message: str) -> None:
    lm_project.makepyfile(test_lm=BAD_INPUT.format(call=call))
    result = lm_project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str()


def test_a_bug_only_in_kv_cache_decoding_is_caught(lm_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The continuation is decoded again with the KV cache, one token a step, teacher-forced, and its
    logits judged against the float64 truth of the same positions by the outputs' rule. A correct
    model's cached decode passes; a decode-only bug fails, named at the float32 rung, where it stands
    far above the rounding (at bf16 this one, 5% on one layer's attention output of a model with small
    weights, is within the outputs' budget at the logits: docs/lm.md measures what the cached decode
    catches, and the per-layer wrapper that names such a bug)."""
    lm_project.runpytest("--rocm-parity", "--parity-mode=capture", "-k", "llama").assert_outcomes(passed=1, deselected=2)
    ok = lm_project.runpytest("--rocm-parity", "-k", "llama", "--parity-report=rep")
    ok.assert_outcomes(passed=1, deselected=2)
    doc = json.loads((lm_project.path / "rep" / "parity-report.json").read_text())
    for c in doc["checks"]:
        cached = c["extra"]["lm"]["cached_decode"]
        assert cached["steps"] == 3 and cached["ratio"] <= cached["budget"], c["dtype"]
    monkeypatch.setenv("BUG", "llama-kv")
    bad = lm_project.runpytest("--rocm-parity", "-k", "llama", "--parity-report=rep")
    bad.assert_outcomes(failed=1, deselected=2)
    bad.stdout.fnmatch_lines(["*lm: KV-cache decoding (the continuation's 3 steps, one token each with the cache): "
                              "propagated error *x the reference's (budget 3x)*"])
    # the headline says what failed and where to look, not "the outputs differ after the last module"
    bad.stdout.fnmatch_lines(["*culprit: none among the modules, each within bounds with the model's outputs: "
                              "KV-cache decoding*Only decoding with the cache fails*single-query or paged attention*",
                              "*FAIL * [[]float32[]]*KV-cache decoding out of bounds; the full forward within them*"])
    assert "the outputs differ after the last of them" not in bad.stdout.str()
    doc = json.loads((lm_project.path / "rep" / "parity-report.json").read_text())
    fp32 = next(c for c in doc["checks"] if c["dtype"] == "float32")
    assert not fp32["passed"] and fp32["extra"]["lm"]["cached_decode"]["ratio"] > 1000
    # step by step: this bug is in every decode step, so the first over budget is the first
    assert len(fp32["extra"]["lm"]["cached_decode"]["step_ratios"]) == 3
    bad.stdout.fnmatch_lines(["*KV-cache decoding*step by step the first over budget is step 0 of 0-2 (*x)*"])
    # a decode path that raises is a failure of the check, named, not an error of the plugin
    monkeypatch.setenv("BUG", "llama-kvcrash")
    crash = lm_project.runpytest("--rocm-parity", "-k", "llama")
    crash.assert_outcomes(failed=1, deselected=2)
    crash.stdout.fnmatch_lines(["*lm: KV-cache decoding raised RuntimeError: HIP error: an illegal memory access*"])


def test_generate_on_a_model_with_no_kv_cache_says_its_cached_decoding_is_not_judged(
        lm_project: pytest.Pytester) -> None:
    """RWKV returns a recurrent `state`, no KV cache: its step-by-step decoding cannot be replayed
    against the golden, and the result says so instead of passing in silence."""
    lm_project.makepyfile(test_lm='''
import torch
import transformers as tf

def test_rwkv(parity):
    torch.manual_seed(0)
    cfg = tf.RwkvConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                        intermediate_size=64, context_length=64)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    parity.check_lm(tf.RwkvForCausalLM(cfg).eval(), ids, name="rwkv", dtypes=["float32"], generate=3)
''')
    lm_project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    result = lm_project.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(passed=1)
    doc = json.loads((lm_project.path / "rep" / "parity-report.json").read_text())
    assert any("generate=3: the golden holds no cached decoding" in n for n in doc["checks"][0]["notes"]), doc


def test_cached_decoding_names_the_cache_argument_of_a_wrapped_or_compiled_forward() -> None:
    """A port that wraps the instance's forward in (*args, **kwargs) hides its argument names: the
    cached decode still passes the cache under the class's name, not the deprecated one."""
    import warnings

    import torch

    from parity_models import llama
    from pytest_rocm_parity.llm.lm import cache_argument, decode_with_cache

    model = llama("sdpa")
    own = model.forward
    model.forward = lambda *a, **kw: own(*a, **kw)
    ids = torch.randint(3, 60, (1, 6), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        logits = decode_with_cache(model, ids[:, :4], None, ids[:, 4:])
    assert logits is not None and logits.shape[:2] == (1, 2)
    # torch.compile's OptimizedModule takes (*args) too (the deprecation warning does not reach the
    # caller from inside Dynamo's trace, so the name is asserted)
    assert cache_argument(torch.compile(llama("sdpa"), backend="eager")) == cache_argument(llama("sdpa"))
