"""Issue 12's "done means": a PyTorch model file (a ResNet block, an LSTM tagger, a GPT block)
ports by replacing ``torch`` with ``gc`` (``import torch`` -> ``import graphc as gc``,
``torch.`` -> ``gc.``) and nothing else; the torch model loads our ``state_dict`` (strict) and its
outputs equal ours."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

HEADER = "import math\nimport torch\nnn = torch.nn\nF = torch.nn.functional\n"

RESNET_BLOCK = HEADER + '''
class BasicBlock(nn.Module):
    def __init__(self, inp=4, out=8, stride=2):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or inp != out:
            self.shortcut = nn.Sequential(nn.Conv2d(inp, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))

Model = BasicBlock
'''

LSTM_TAGGER = HEADER + '''
class LSTMTagger(nn.Module):
    def __init__(self, embedding_dim=8, hidden_dim=6, vocab_size=20, tagset_size=5):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, num_layers=2, batch_first=True, bidirectional=True)
        self.hidden2tag = nn.Linear(2 * hidden_dim, tagset_size)

    def forward(self, sentence):
        embeds = self.word_embeddings(sentence)
        lstm_out, _ = self.lstm(embeds)
        tag_space = self.hidden2tag(lstm_out)
        return F.log_softmax(tag_space, dim=-1)

Model = LSTMTagger
'''

GPT_BLOCK = HEADER + '''
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, n_embd=16, n_head=2):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd), act=nn.GELU(approximate="tanh"),
                                      c_proj=nn.Linear(4 * n_embd, n_embd)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.c_proj(m.act(m.c_fc(self.ln_2(x))))

Model = Block
'''

R = np.random.default_rng(21)
CASES = {
    "resnet_block": (RESNET_BLOCK, R.standard_normal((2, 4, 8, 8)).astype(np.float32)),
    "lstm_tagger": (LSTM_TAGGER, R.integers(0, 20, (3, 7))),
    "gpt_block": (GPT_BLOCK, R.standard_normal((2, 5, 16)).astype(np.float32)),
}


def _port(source: str) -> str:
    return source.replace("import torch\n", "import graphc as gc\n").replace("torch.", "gc.")


@pytest.mark.parametrize("name", sorted(CASES))
def test_pytorch_file_ports_by_renaming_torch_to_gc(name):
    torch = pytest.importorskip("torch")
    source, x = CASES[name]
    ours_ns, theirs_ns = {}, {}
    exec(compile(_port(source), f"<{name} ported>", "exec"), ours_ns)  # noqa: S102 - the sources above
    exec(compile(source, f"<{name}>", "exec"), theirs_ns)  # noqa: S102
    ours, theirs = ours_ns["Model"](), theirs_ns["Model"]()
    ours.init_parameters(seed=3)
    state = ours.state_dict()
    if name == "resnet_block":  # running statistics that matter
        for k in state:
            if k.endswith("running_mean"):
                state[k] = R.standard_normal(state[k].shape).astype(np.float32) * 0.1
            elif k.endswith("running_var"):
                state[k] = (R.random(state[k].shape) + 0.5).astype(np.float32)
        ours.load_state_dict(state)
    assert list(state) == list(theirs.state_dict())
    theirs.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    model = gc.capture(ours, x=x, seed=3)
    with torch.no_grad():
        want = theirs.eval()(torch.from_numpy(x)).numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=backend)
