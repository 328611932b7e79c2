"""A model of the user's own, named by import path from a file outside the project: captured with AdamW,
priced on a GPU topology with the device model, deterministically; and every way it can be wrong."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from arcsim.models.dataspec import DataSpec
from arcsim.models.source import ModelError, ModelSource, UserBatches, parse_args
from arcsim.traces.capture import CaptureConfig, capture
from arcsim.traces.format import open_trace

MODEL_FILE = textwrap.dedent('''
    import torch
    from torch import nn


    class Decoder(nn.Module):
        def __init__(self, vocab, width, depth):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = x + torch.tanh(block(x))
            return self.head(x)


    def build(vocab=32000, width=32, depth=2):
        return Decoder(vocab, width, depth)


    class Regression(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(16, 1)

        def forward(self, x, y):
            return nn.functional.mse_loss(self.net(x).squeeze(-1), y)


    def regression():
        return Regression()


    def batches(batch_size, seed):
        g = torch.Generator().manual_seed(seed)
        while True:
            x = torch.randn(batch_size, 16, generator=g)
            yield x, x.sum(-1)


    def raises(**kw):
        raise RuntimeError("out of coffee")


    def not_a_module():
        return 42


    def no_loss():
        return nn.Linear(16, 4)


    def few(batch_size, seed):
        yield torch.randn(batch_size, 16), torch.randn(batch_size)


    class Nano(nn.Module):  # nanoGPT's contract: forward(idx, targets=None) -> (logits, loss or None)
        def __init__(self, vocab):
            super().__init__()
            self.embed, self.head = nn.Embedding(vocab, 16), nn.Linear(16, vocab)

        def forward(self, idx, targets=None):
            logits = self.head(self.embed(idx))
            loss = None if targets is None else nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            return logits, loss


    def nano(vocab=32000):
        return Nano(vocab)


    def token_batches(batch_size, seed):
        g = torch.Generator().manual_seed(seed)
        while True:
            idx = torch.randint(64, (batch_size, 8), generator=g)
            yield idx, idx


    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(16, 4)

        def forward(self, idx):
            raise ValueError("the head wants 16 features")


    def broken():
        return Broken()


    def wrong_output():
        return nn.Embedding(32000, 8)  # 8 features per token, not 32000 logits


    class LastOnly(nn.Module):  # a generator's forward: the next token's logits only, and no way to give targets
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(32000, 8), nn.Linear(8, 32000)

        def forward(self, idx):
            return self.head(self.embed(idx))[:, [-1], :]


    def last_only():
        return LastOnly()
''')


@pytest.fixture()
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "mine.py").write_text(MODEL_FILE)
    return tmp_path


def test_a_file_model_with_adamw_is_real_data_parallel_training(user_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(user_dir)
    path = capture(CaptureConfig(model="mine.py:build", model_args=("width=16",), dataset="python-text",
                                 input_size=16, workers=2, steps=2, batch=2, dtype="fp32", out=user_dir / "t.npz"))
    trace = open_trace(path)
    meta = trace.meta
    assert meta["model"] == "mine:build" and meta["optimizer"].startswith("AdamW lr 0.001")
    assert meta["model_source"] == {"ref": f"{user_dir / 'mine.py'}:build", "args": {"width": 16}}
    assert trace.elements == 32000 * 16 * 2 + 2 * (16 * 16 + 16) + 32000 == meta["params"]
    # the same steps by hand: same seed, disjoint shards, AdamW on the mean
    from arcsim.models.datasets import make_dataset

    data = make_dataset("python-text", 16)
    torch.manual_seed(0)
    model = ModelSource("mine.py:build", (("width", 16),)).build(None)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for (_, theirs) in trace.steps_iter():
        x, y = data.draw(4, gen)
        grads = []
        for xw, yw in zip(x.chunk(2), y.chunk(2), strict=True):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(xw).reshape(-1, 32000), yw.reshape(-1)).backward()
            grads.append(torch.cat([params[la.name].grad.reshape(-1) for la in trace.layers]))
        torch.testing.assert_close(theirs, torch.stack(grads), rtol=1e-4, atol=1e-5)  # AdamW: sums in another order
        mean = torch.stack(grads).mean(0)
        for la in trace.layers:
            params[la.name].grad = mean[la.offset:la.offset + la.numel].view(la.shape).clone()
        opt.step()


def test_user_batches_and_a_forward_that_returns_the_loss(user_dir: Path):
    out = user_dir / "r.npz"
    r = run_cli("trace", "capture", "--model", "mine.py:regression", "--data", "mine.py:batches", "-w", "4",
                "-s", "1", "-o", str(out), cwd=str(user_dir))
    assert r.returncode == 0, r.stderr
    trace = open_trace(out)
    assert trace.elements == 17 and trace.meta["dataset"] == f"{user_dir / 'mine.py'}:batches"
    stream = UserBatches(f"{user_dir / 'mine.py'}:batches", 4 * 8, 0)
    shards = stream.shards(stream.next(), 4)
    assert [s[0].shape[0] for s in shards] == [8] * 4  # disjoint quarters of one global batch


def test_run_prices_a_users_model_on_a_gpu_topology_from_another_folder_deterministically(user_dir: Path):
    trace = user_dir / "t.npz"
    r = run_cli("trace", "capture", "--model", "mine.py:build", "--dataset", "python-text", "--input-size", "16",
                "-w", "2", "-s", "1", "-b", "2", "-o", str(trace), cwd=str(user_dir))
    assert r.returncode == 0, r.stderr
    elsewhere = user_dir / "elsewhere"
    elsewhere.mkdir()
    answers = []
    for _ in range(2):
        r = run_cli("run", "--trace", str(trace), "-t", "4x8-eth25-a100", "-c", "dense,topk", "--policy", "none",
                    "--json", "-", cwd=str(elsewhere))
        assert r.returncode == 0, r.stderr
        answers.append(json.loads(r.stdout))
    compute = [[c["compute_s"] for c in a["candidates"]] for a in answers]
    assert compute[0] == compute[1] and compute[0][0] > 0
    assert any("compute: modelled on NVIDIA A100" in line for line in answers[0]["assumptions"])


@pytest.mark.parametrize(("args", "phrase"), [
    (["--model", "nowhere.py:build"], "no such file nowhere.py"),
    (["--model", "mine.py:missing"], "has no callable 'missing'"),
    (["--model", "no_such_pkg.models:build"], "no module 'no_such_pkg'"),
    (["--model", "mine.py:raises", "--dataset", "digits"], "raised RuntimeError: out of coffee"),
    (["--model", "mine.py:not_a_module", "--dataset", "digits"], "returned int, not a torch.nn.Module"),
    (["--model", "mine.py:no_loss", "--data", "mine.py:batches"], "rejected a batch"),
    (["--model", "mine.py:regression", "--data", "mine.py:few", "-s", "3"], "ran out after 1 batches"),
    (["--model", "mine.py:build"], "give --dataset"),
    (["--model", "mine.py:build", "--model-arg", "width"], "write key=value"),
    (["--model", "cnn", "--model-arg", "width=3"], "is a zoo model"),
    (["--model", "mine.py:build", "--dataset", "digits"], "rejected a batch of image data"),
])
def test_bad_user_models_are_one_line_and_leave_nothing(user_dir: Path, args: list[str], phrase: str):
    r = run_cli("trace", "capture", *args, "-w", "2", "-o", str(user_dir / "x.npz"), cwd=str(user_dir))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and phrase in lines[0], r.stderr[-1500:]
    assert not (user_dir / "x.npz").exists()


# nanoGPT as Karpathy wrote it, in its structure (written for this test): token and position embeddings, pre-norm
# blocks of causal self-attention and an MLP, a final norm, an lm_head tied to the token embedding; forward(idx,
# targets=None) returns (logits, loss), and without targets the logits of the LAST position only, (B, 1, V).
NANOGPT = textwrap.dedent('''
    import math
    from dataclasses import dataclass

    import torch
    from torch import nn
    from torch.nn import functional as F


    @dataclass
    class GPTConfig:
        block_size: int = 16
        vocab_size: int = 32000
        n_layer: int = 2
        n_head: int = 2
        n_embd: int = 16
        dropout: float = 0.0
        bias: bool = True


    class CausalSelfAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
            self.n_head, self.n_embd = config.n_head, config.n_embd

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x)))


    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(config.n_embd), CausalSelfAttention(config)
            self.ln_2, self.mlp = nn.LayerNorm(config.n_embd), MLP(config)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))


    class GPT(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            ))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

        def forward(self, idx, targets=None):
            b, t = idx.size()
            assert t <= self.config.block_size, f"cannot forward a sequence of {t}: block size {self.config.block_size}"
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            if targets is not None:
                logits = self.lm_head(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            else:
                logits = self.lm_head(x[:, [-1], :])  # inference: the last position only
                loss = None
            return logits, loss


    def build(**overrides):
        return GPT(GPTConfig(**overrides))
''')


def test_a_faithful_nanogpt_captures_from_the_readme_command_with_its_own_loss(user_dir: Path):
    """Its forward without targets gives the last position's logits, (B, 1, V): arcsim passes the dataset's next
    tokens as ``targets`` and trains on the loss the model computes (it had failed on a shape error)."""
    (user_dir / "my_gpt.py").write_text(NANOGPT)
    out = user_dir / "t.npz"
    r = run_cli("trace", "capture", "--model", "my_gpt.py:build", "--dataset", "python-text", "--input-size", "16",
                "-w", "2", "-s", "1", "-b", "2", "--dtype", "fp32", "-o", str(out), cwd=str(user_dir))
    assert r.returncode == 0, r.stderr[-1500:]
    trace = open_trace(out)
    from arcsim.models.datasets import make_dataset

    torch.manual_seed(0)  # the capture's model and batch, by hand
    model = ModelSource(f"{user_dir / 'my_gpt.py'}:build").build(None)
    params = dict(model.named_parameters())
    assert trace.elements == sum(p.numel() for p in params.values())  # the tied lm_head once
    x, y = make_dataset("python-text", 16).draw(4, torch.Generator().manual_seed(0))
    grads = []
    for xw, yw in zip(x.chunk(2), y.chunk(2), strict=True):
        model.zero_grad()
        model(xw, targets=yw)[1].backward()
        grads.append(torch.cat([params[la.name].grad.reshape(-1) for la in trace.layers]))
    (_, recorded), = trace.steps_iter()
    torch.testing.assert_close(recorded, torch.stack(grads), rtol=1e-4, atol=1e-6)


def test_a_nanogpt_style_model_returning_logits_and_loss_trains_on_user_batches_and_a_dataset(user_dir: Path):
    r = run_cli("trace", "capture", "--model", "mine.py:nano", "--model-arg", "vocab=64", "--data",
                "mine.py:token_batches", "-w", "2", "-s", "1", "-b", "2", "-o", str(user_dir / "n.npz"),
                cwd=str(user_dir))
    assert r.returncode == 0, r.stderr
    assert open_trace(user_dir / "n.npz").elements == 64 * 16 + 16 * 64 + 64
    spec = DataSpec("tokens", (8,), 64)  # on a built-in dataset it gets model(x, targets=y): (logits, loss)
    source = ModelSource(f"{user_dir / 'mine.py'}:nano", (("vocab", 64),))
    model, x = source.build(spec), torch.randint(64, (2, 8))
    loss = source.loss(model, (x, x), spec)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(model(x)[0].flatten(0, 1), x.flatten()))


@pytest.mark.parametrize(("model", "phrase"), [
    ("mine.py:broken", "rejected a batch of tokens data, shape (2, 16): ValueError: the head wants 16 features"),
    ("mine.py:wrong_output", "returned logits of shape (2, 16, 8), over 8 classes where the tokens data has 32000"),
    ("mine.py:last_only", "returned logits of shape (2, 1, 32000) for targets of shape (2, 16): return logits of "
                          "shape (2, 16, 32000) from forward(x), or take the targets as forward(idx, targets=None)"),
])
def test_a_wrong_model_is_refused_before_any_text_is_prepared(user_dir: Path, model: str, phrase: str):
    cache = user_dir / "cache"
    r = run_cli("trace", "capture", "--model", model, "--dataset", "python-text", "--input-size", "16", "-w", "2",
                "-o", str(user_dir / "x.npz"), cwd=str(user_dir), env={"ARCSIM_CACHE_DIR": str(cache)})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and phrase in lines[0], r.stderr[-1500:]
    assert not list(cache.rglob("tokenizer.json")) and not (user_dir / "x.npz").exists()


def test_model_args_are_read_as_yaml_scalars():
    assert parse_args(["depth=4", "rate=0.1", "tied=true", "name=small"]) == (
        ("depth", 4), ("rate", 0.1), ("tied", True), ("name", "small"))
    with pytest.raises(ModelError, match="twice"):
        parse_args(["a=1", "a=2"])


def test_a_huggingface_config_is_built_by_transformers_and_trained_on_real_text(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
              "num_hidden_layers": 1, "vocab_size": 32000, "tie_word_embeddings": False}
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    out = tmp_path / "hf.npz"
    r = run_cli("trace", "capture", "--model", "hf:tiny.json", "--dataset", "python-text", "--input-size", "16",
                "-w", "2", "-s", "1", "-b", "2", "-o", str(out), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    trace = open_trace(out)
    reference = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    assert trace.elements == sum(p.numel() for p in reference.parameters())
    assert trace.meta["model"] == "hf:tiny" and trace.meta["model_source"]["ref"] == f"hf:{tmp_path / 'tiny.json'}"
    by_type = ModelSource("hf:llama", tuple(parse_args([f"{k}={v}" for k, v in config.items() if k != "model_type"])))
    assert sum(p.numel() for p in by_type.build(None).parameters()) == trace.elements


@pytest.mark.parametrize(("ref", "phrase"), [("hf:missing.json", "no such config file"),
                                             ("hf:no_such_type", "transformers cannot read it")])
def test_bad_huggingface_models(tmp_path: Path, ref: str, phrase: str):
    pytest.importorskip("transformers")
    r = run_cli("trace", "capture", "--model", ref, "--dataset", "python-text", "-o", str(tmp_path / "x.npz"),
                cwd=str(tmp_path))
    assert r.returncode == 2 and phrase in r.stderr.strip().splitlines()[-1], r.stderr[-800:]
