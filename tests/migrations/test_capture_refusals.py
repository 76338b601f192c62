"""Capture refuses, naming the module and the fix, what would make a golden judge nothing."""
from __future__ import annotations

import tempfile

import pytest
import torch
from torch import nn

from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.errors import CaptureError
from pytest_rocm_parity.golden.store import GoldenStore


class Float64Only(nn.Module):
    """A kernel whose float64 path misbehaves: ``mode`` says how."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.dtype == torch.float64:
            if self.mode == "raise":
                raise RuntimeError("no float64 kernel for this op")
            return y / 0.0
        return y


class Net(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), Float64Only(mode), nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("mode, says", [("raise", "float64 truth run failed in blocks.1"),
                                        ("nan", "float64 truth of blocks.1")])
def test_a_module_without_a_float64_truth_is_named_and_nothing_is_written(mode: str, says: str) -> None:
    torch.manual_seed(0)
    store = GoldenStore(tempfile.mkdtemp())
    with pytest.raises(CaptureError, match=says) as err:
        capture(Net(mode), torch.randn(2, 8), CheckSpec(name="n", dtypes=["float32"], drill=0), store, "cpu")
    assert "Fix" in str(err.value) or "capture with" in str(err.value)
    if mode == "raise":   # the whole model runs in float64: selecting fewer layers is no fix
        assert "whatever layers= selects" in str(err.value) and "select fewer layers" not in str(err.value)
    if mode == "raise":   # the model's own line that raised, not torch's
        assert "test_capture_refusals.py:" in str(err.value) and "raise RuntimeError" in str(err.value)
    assert not store.exists("n")


def test_nan_at_padded_positions_of_the_truth_is_not_refused() -> None:
    """Left padding with eager attention: the float64 truth of a fully masked row is NaN there,
    which is not judged; the capture succeeds."""
    from parity_models import llama, tokens

    store = GoldenStore(tempfile.mkdtemp())
    capture(llama("eager"), tokens("left"), CheckSpec(name="l", dtypes=["float32"]), store, "cpu")
    assert store.exists("l")


def _lora_patched() -> nn.Module:
    """A LoRA-style patch made by assigning a closure to an instance's forward: the closure holds
    the original module, so a float64 copy of the model still runs its float32 weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    lora = nn.Linear(8, 8, bias=False)
    base = model[0].forward
    model[0].forward = lambda x: base(x) + lora(x)
    return model


def test_a_forward_patched_on_the_instance_is_named_when_the_float64_truth_fails() -> None:
    from pytest_rocm_parity.runner.train import capture_train

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="patched", dtypes=["float32"])
    with pytest.raises(CaptureError, match=r"the float64 truth run failed in 0: .*0 has a forward assigned on the "
                                           r"instance: .*make the patch a module"):
        capture(_lora_patched(), x, spec, GoldenStore(tempfile.mkdtemp()), "cpu")
    with pytest.raises(CaptureError, match=r"has a forward assigned on the instance"):   # check_train: wrapped too
        capture_train(_lora_patched(), x, spec, GoldenStore(tempfile.mkdtemp()), "cpu",
                      loss=lambda out: out.square().mean())


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(h + 0.1 * torch.rand_like(h))   # noise in eval mode: no two runs agree


@pytest.mark.parametrize("sketch", [None, 4])
def test_a_forward_that_draws_random_numbers_is_refused(sketch: int | None) -> None:
    """Its reference error against a truth with other noise is the noise itself: every judgement
    would pass a real bug (a 5% error in the parent's code passed)."""
    torch.manual_seed(0)
    store = GoldenStore(tempfile.mkdtemp())
    with pytest.raises(CaptureError, match="drew random numbers.*CPU generator.*pass it in as an input"):
        capture(Noisy().eval(), torch.randn(16, 8), CheckSpec(name="n", dtypes=["float32"], drill=0, sketch=sketch),
                store, "cpu")
    assert not store.exists("n")


def test_dropout_in_eval_mode_draws_nothing_and_captures() -> None:
    torch.manual_seed(0)
    store = GoldenStore(tempfile.mkdtemp())
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.Linear(8, 8)).train()   # judged in eval mode
    capture(model, torch.randn(16, 8), CheckSpec(name="n", dtypes=["float32"], drill=0), store, "cpu")
    assert store.exists("n")


def test_a_forward_patched_on_the_instance_is_named_when_a_rungs_copy_fails() -> None:
    """The bf16 rung runs a copy of the model: a patch's closure still holds the float32 module."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    first = model[0]
    first.forward = lambda x: torch.nn.functional.linear(x, first.weight) * 1.01   # type: ignore[method-assign]
    store = GoldenStore(tempfile.mkdtemp())
    with pytest.raises(CaptureError, match=r"bfloat16 recording run.*0 has a forward assigned on the instance.*"
                                           r"make the patch a module"):
        capture(model, torch.randn(4, 8), CheckSpec(name="n", dtypes=["bfloat16"], drill=0), store, "cpu")
    assert not store.exists("n")


class Spectrum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(self.fc(x), dim=-1).abs()


def test_an_operator_without_a_kernel_in_the_rungs_dtype_is_named_with_the_fix() -> None:
    """torch.fft has no bfloat16 kernel: the reference's bf16 run raised torch's bare RuntimeError."""
    store = GoldenStore(tempfile.mkdtemp())
    with pytest.raises(CaptureError, match=r"the bfloat16 recording run of Spectrum failed: RuntimeError: Unsupported "
                                           r"dtype BFloat16 \(at .*test_capture_refusals.py:\d+: return torch.fft.rfft"
                                           r".*model is in float32.*leave bfloat16 out of dtypes="):
        capture(Spectrum(), torch.randn(2, 16), CheckSpec(name="n", dtypes=["bfloat16"]), store, "cpu")
    assert not store.exists("n")


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_a_torchscript_module_is_refused_by_name() -> None:
    """Its submodules run inside one graph, where no hook sees them (the walk crashed with KeyError: 0)."""
    from pytest_rocm_parity.errors import InvalidArgument
    from pytest_rocm_parity.runner.replay import replay

    x = torch.randn(3, 8)
    store = GoldenStore(tempfile.mkdtemp())
    spec = CheckSpec(name="m", dtypes=["float32"])
    capture(Pair().eval(), x, spec, store, "cpu")
    traced = torch.jit.trace(Pair().eval(), (x,))
    with pytest.raises(InvalidArgument, match=r"TorchScript module \(TopLevelTracedModule\).*Check the eager model"):
        replay(traced, x, spec, store, "cpu")
    with pytest.raises(InvalidArgument, match="TorchScript"):
        capture(traced, x, CheckSpec(name="t", dtypes=["float32"]), store, "cpu")
    # a scripted model refuses get_submodule: the message names its class from the module itself
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    with pytest.raises(InvalidArgument, match=r"model: the model is a TorchScript module \(RecursiveScriptModule\)"):
        capture(scripted, x, CheckSpec(name="s", dtypes=["float32"]), store, "cpu")


def test_an_exported_module_is_judged_where_its_tree_is_the_eager_models() -> None:
    """torch.export's module refuses eval(): the mode it was exported in is in its graph."""
    from pytest_rocm_parity.runner.replay import replay

    x = torch.randn(3, 8)
    store = GoldenStore(tempfile.mkdtemp())
    spec = CheckSpec(name="m", dtypes=["float32"])
    capture(Pair().eval(), x, spec, store, "cpu")
    assert replay(torch.export.export(Pair().eval(), (x,)).module(), x, spec, store, "cpu")[0].passed


class HFWrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import transformers

        torch.manual_seed(0)
        self.m = transformers.BertModel(transformers.BertConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids).last_hidden_state


def test_an_exported_module_of_another_tree_says_why_not_to_regenerate() -> None:
    from pytest_rocm_parity.errors import GoldenStale
    from pytest_rocm_parity.runner.replay import replay

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tempfile.mkdtemp())
    spec = CheckSpec(name="m", dtypes=["float32"])
    capture(HFWrapped().eval(), ids, spec, store, "cpu")
    exported = torch.export.export(HFWrapped().eval(), (ids,)).module()
    with pytest.raises(GoldenStale, match="torch.export program's module") as info:
        replay(exported, ids, spec, store, "cpu")
    assert "Regenerate" not in str(info.value)


def test_a_scripted_part_is_refused_by_name_in_the_fixture(pytester: pytest.Pytester) -> None:
    """The fixture's default depth walks the model before capture: a TorchScript part crashed that
    walk with KeyError: 0."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_ts='''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.jit.script(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.inner(x))

def test_ts(parity):
    parity.check(Net().eval(), torch.randn(3, 8), name="ts", dtypes=["float32"])
''')
    result = pytester.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*InvalidArgument: model: its module inner is a TorchScript module*"])


def test_an_exported_module_is_refused_at_capture() -> None:
    from pytest_rocm_parity.errors import InvalidArgument

    x = torch.randn(3, 8)
    with pytest.raises(InvalidArgument, match="Capture the eager model it was exported from"):
        capture(torch.export.export(Pair().eval(), (x,)).module(), x, CheckSpec(name="m", dtypes=["float32"]),
                GoldenStore(tempfile.mkdtemp()), "cpu")
