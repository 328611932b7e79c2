"""The zoo's LLaMAs against transformers' own implementation, and the offline real-text corpus."""

from __future__ import annotations

import math

import pytest
import torch

from arcsim.models import MODELS, count_params
from arcsim.models.datasets import data_spec, make_dataset
from arcsim.models.llama import LLAMA_SHAPES, Llama, LlamaShape
from arcsim.models.text import HELD_OUT_EVERY, VOCAB, corpus_files

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", list(LLAMA_SHAPES))
def test_parameter_counts_equal_transformers_llama_of_the_galore_config(name):
    shape = LLAMA_SHAPES[name]
    config = transformers.LlamaConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                                      num_attention_heads=shape.heads, num_hidden_layers=shape.layers,
                                      vocab_size=shape.vocab, rms_norm_eps=shape.norm_eps, tie_word_embeddings=False)
    with torch.device("meta"):
        reference = transformers.LlamaForCausalLM(config)
        ours = MODELS[name].build(data_spec("python-text"))
    assert count_params(ours) == count_params(reference) == MODELS[name].reference_params
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in reference.named_parameters()]


def test_same_weights_give_transformers_logits():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=172, num_attention_heads=4,
                                      num_hidden_layers=2, vocab_size=500, rms_norm_eps=1e-6,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    ours = Llama(LlamaShape(64, 172, 4, 2, vocab=500)).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    tokens = torch.randint(500, (3, 17))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), reference(tokens).logits, rtol=1e-5, atol=1e-5)


def test_python_text_is_real_windows_of_a_held_out_split():
    data = make_dataset("python-text", 32)
    assert data.spec.kind == "tokens" and data.spec.classes == VOCAB and not data.synthetic
    files = corpus_files()
    assert data.about["files"] == len(files) and data.about["held_out_files"] == len(files) // HELD_OUT_EVERY
    assert int(data.train_ids.max()) < VOCAB and len(data.train_ids) > 1_000_000
    x, y = data.draw(8, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 32) and torch.equal(x[:, 1:], y[:, :-1])  # next-token targets
    again, _ = data.draw(8, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)
    hx, hy = data.held_out()
    assert hx.shape == (64, 32) and torch.equal(hx[:, 1:], hy[:, :-1])
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(data.tokenizer_path))
    text = tokenizer.decode(x[0].tolist())
    assert tokenizer.encode(text).ids[:8] == x[0, :8].tolist()  # the windows are the tokenizer's own tokens
    assert "Python" in data.description and "held out" in data.description


def test_train_scores_token_data_by_next_token_accuracy():
    from torch import nn

    from arcsim.models.source import ModelSource
    from arcsim.train.loop import evaluate

    class CopyNext(nn.Module):  # predicts each token's successor from the input itself: right but at the end
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.one_hot(torch.roll(x, -1, dims=1), VOCAB).float()

    data = make_dataset("python-text", 16)
    accuracy, loss = evaluate(CopyNext(), ModelSource("llama_60m"), data)  # the zoo's rule: cross-entropy
    assert abs(accuracy - 15 / 16) < 0.01
    # one-hot logits: probability e / (e + V − 1) on the right token, 1 / (e + V − 1) on the rest
    right, wrong = -math.log(math.e / (math.e + VOCAB - 1)), -math.log(1 / (math.e + VOCAB - 1))
    assert loss == pytest.approx(15 / 16 * right + 1 / 16 * wrong, rel=0.01)
    assert MODELS["llama_60m"].optimizer == "adamw"  # TrainingRun and capture give the LLaMAs AdamW
