"""The example model (examples/bytellama): its files, loader, tokenizer, held-out perplexity."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import bytellama as models  # noqa: E402
from pytest_rocm_parity.errors import InputError, ParityError  # noqa: E402

MB = 1_000_000


@pytest.fixture(scope="module")
def model():
    return models.load_bytellama()


@pytest.fixture(scope="module")
def record():
    return models.training_record()


def test_shipped_files_and_size(record):
    d = models.BYTELLAMA_DIR
    for name in ("config.json", "model.safetensors", "heldout.txt", "TRAINING.json"):
        assert (d / name).is_file(), name
    size = (d / "model.safetensors").stat().st_size
    total = sum((d / n).stat().st_size for n in ("config.json", "model.safetensors", "heldout.txt", "TRAINING.json"))
    assert size <= 9 * MB
    assert total <= 10 * MB
    assert record["weights_bytes"] == size
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["vocab_size"] == models.VOCAB_SIZE == 259
    assert cfg["num_attention_heads"] > cfg["num_key_value_heads"]  # GQA
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0


def test_loads_as_llama_fp32(model, record):
    from transformers import LlamaForCausalLM

    assert isinstance(model, LlamaForCausalLM)
    assert not model.training
    n = sum(p.numel() for p in model.parameters())
    assert n == record["params"] == 1_969_920
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config.num_key_value_heads == 2 and model.config.num_attention_heads == 8
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_dtype_cast_keeps_rope_fp32():
    m = models.load_bytellama(dtype=torch.bfloat16)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    inv = [b for n, b in m.named_buffers() if n.endswith("inv_freq")]
    assert inv and all(b.dtype == torch.float32 for b in inv)


def test_heldout_perplexity_matches_record(model, record):
    ppl = models.heldout_perplexity(model)
    ref = record["heldout_ppl_fp32_cuda"]
    assert abs(ppl - ref) / ref < 0.01, (ppl, ref)
    # it is a trained model: far below the uniform-byte perplexity (256)
    assert ppl < 5.0


def test_encode_decode_round_trip():
    text = "def f(x):\n    return x ** 2  # é, ünïcode, 漢字\n"
    ids = models.encode(text)
    assert ids.dtype == torch.long and ids.dim() == 1
    assert ids.numel() == len(text.encode("utf-8"))
    assert int(ids.max()) < 256
    assert models.decode(ids) == text
    assert models.decode(ids.tolist()) == text
    wrapped = models.encode(text, bos=True, eos=True)
    assert int(wrapped[0]) == models.BOS_ID and int(wrapped[-1]) == models.EOS_ID
    assert models.decode(wrapped) == text
    assert models.encode("").numel() == 0
    held = models.heldout_text()
    assert models.decode(models.encode(held)) == held
    with pytest.raises(InputError):
        models.decode([0, 300])


def test_eval_batch_deterministic():
    a = models.eval_batch()
    b = models.eval_batch()
    assert a.shape == (2, 128) and a.dtype == torch.long
    assert torch.equal(a, b)
    ids = models.heldout_ids()
    step = (ids.numel() - 128) // 2
    assert torch.equal(a[1], ids[step : step + 128])
    c = models.eval_batch(batch=4, seq=64)
    assert c.shape == (4, 64)
    assert len({tuple(r.tolist()) for r in c}) == 4
    with pytest.raises(InputError):
        models.eval_batch(seq=10_000)


def test_perplexity_input_validation(model):
    with pytest.raises(InputError):
        models.perplexity(model, torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(InputError):
        models.perplexity(model, torch.zeros(2, 8))


def test_missing_transformers_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ParityError, match=r"pip install 'pytest-rocm-parity\[lm\]'"):
        models.load_bytellama()
    with pytest.raises(ImportError):
        models.load_bytellama()


def test_the_model_lives_outside_the_package():
    """The wheel carries the plugin, not an example model: no weights inside the package, and the
    package root does not offer the loader."""
    import pytest_rocm_parity

    pkg = models.BYTELLAMA_DIR.parents[1] / "pytest_rocm_parity"
    assert pkg.is_dir() and pkg not in models.BYTELLAMA_DIR.parents
    assert not list(pkg.rglob("*.safetensors"))
    assert "load_bytellama" not in pytest_rocm_parity.__all__
    with pytest.raises(AttributeError):
        pytest_rocm_parity.load_bytellama
