"""A user's own GPT and their own torchrun training script (AdamW, bf16 autocast, batch 4 per rank) that records
its steps with arcsim's hook: written into a folder of the user's by tests/test_recording.py and by
tests/install_check.py (the same job priced from the wheel)."""

USER_GPT = '''
import torch
from torch import nn
from torch.nn import functional as F


class GPT(nn.Module):  # nanoGPT's contract: forward(idx, targets) -> (logits, loss)
    def __init__(self, vocab=512, width=64, depth=2, heads=4, block=32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(block, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
        logits = self.head(self.blocks(x, mask=mask, is_causal=True))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss


def build(**kwargs):
    return GPT(**kwargs)
'''

USER_JOB = '''
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from arcsim.hooks import RecordingState, recording_hook
from my_gpt import build

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(build())
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
state = RecordingState.for_model(model, steps=(0, 1), optimizer=opt)
model.register_comm_hook(state, recording_hook)
gen = torch.Generator().manual_seed(rank)
for _ in range(2):
    idx = torch.randint(512, (4, 32), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx, targets=idx)
    opt.zero_grad()
    loss.backward()
    opt.step()
state.save(f"rank{rank}.pt")
dist.destroy_process_group()
'''


def write_users_job(where) -> None:  # type: ignore[no-untyped-def]
    """The model and the training script, as files in ``where``."""
    (where / "my_gpt.py").write_text(USER_GPT)
    (where / "train.py").write_text(USER_JOB)


def token_batches(vocab: int, tokens: int) -> str:
    """A user's data.py: ``batches(batch_size, seed)`` of random token ids in [0, ``vocab``), ``tokens`` per example,
    as the dicts the user's GPT takes (its own targets)."""
    return f'''
import torch
def batches(batch_size, seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        idx = torch.randint({vocab}, (batch_size, {tokens}), generator=g)
        yield {{"idx": idx, "targets": idx}}
'''
