"""Five model families written as their torch code commonly is (a diffusion U-Net, a Conformer block, a top-k
mixture of experts, a ConvNeXt stage, a DETR head), each ported to graphc by its imports alone: ``port``
makes ``import torch`` / ``torch.nn`` / ``torch.nn.functional`` (and ``from torch.nn.X import``) graphc's (tests/test_port_model_families.py)."""

HEADER = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def port(source: str) -> str:
    """``source`` with graphc's torch-like modules imported under torch's names; nothing else changes."""
    return (source.replace("import torch.nn.functional as F", "import graphc.nn.functional as F")
            .replace("import torch.nn as nn", "import graphc.nn as nn")
            .replace("from torch.nn.", "from graphc.nn.")
            .replace("import torch\n", "import graphc as torch\n"))


UNET = HEADER + '''
def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=t.dtype) / half)
    args = t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(4, cout)
        self.dropout = nn.Dropout(0.1)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(t))[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return h + self.skip(x)


class AttnBlock(nn.Module):
    def __init__(self, ch, heads=2):
        super().__init__()
        self.norm = nn.GroupNorm(4, ch)
        self.qkv = nn.Conv2d(ch, ch * 3, 1)
        self.proj = nn.Conv2d(ch, ch, 1)
        self.heads = heads

    def forward(self, x):
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(B, 3, self.heads, C // self.heads, H * W).unbind(1)
        attn = torch.einsum("bhci,bhcj->bhij", q, k) * (C // self.heads) ** -0.5
        attn = attn.softmax(dim=-1)
        out = torch.einsum("bhij,bhcj->bhci", attn, v).reshape(B, C, H, W)
        q2 = q.transpose(-1, -2)
        out2 = F.scaled_dot_product_attention(q2, k.transpose(-1, -2), v.transpose(-1, -2))
        out = out + out2.transpose(-1, -2).reshape(B, C, H, W)
        return x + self.proj(out)


class Downsample(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class UNet(nn.Module):
    def __init__(self, ch=8, tdim=16):
        super().__init__()
        self.tdim = tdim
        self.time_mlp = nn.Sequential(nn.Linear(tdim, tdim * 4), nn.SiLU(), nn.Linear(tdim * 4, tdim * 4))
        self.inc = nn.Conv2d(3, ch, 3, padding=1)
        self.down = nn.ModuleList([ResBlock(ch, ch, tdim * 4), Downsample(ch), ResBlock(ch, ch * 2, tdim * 4)])
        self.mid = nn.ModuleList([ResBlock(ch * 2, ch * 2, tdim * 4), AttnBlock(ch * 2), ResBlock(ch * 2, ch * 2, tdim * 4)])
        self.up1 = ResBlock(ch * 4, ch * 2, tdim * 4)
        self.upsample = Upsample(ch * 2)
        self.up2 = ResBlock(ch * 3, ch, tdim * 4)
        self.out = nn.Sequential(nn.GroupNorm(4, ch), nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1))

    def forward(self, x, t):
        temb = self.time_mlp(timestep_embedding(t, self.tdim))
        h = self.inc(x)
        hs = [h]
        h = self.down[0](h, temb); hs.append(h)
        h = self.down[1](h)
        h = self.down[2](h, temb); hs.append(h)
        h = self.mid[0](h, temb)
        h = self.mid[1](h)
        h = self.mid[2](h, temb)
        h = self.up1(torch.cat([h, hs.pop()], dim=1), temb)
        h = self.upsample(h)
        h = self.up2(torch.cat([h, hs.pop()], dim=1), temb)
        return self.out(h)

Model = UNet
'''

CONFORMER = HEADER + '''
def rotate_half(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([-x2, x1], dim=-1).flatten(-2)


def apply_rotary(x, sin, cos):
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        T = x.shape[1]
        t = torch.arange(T, device=x.device).type_as(self.inv_freq)
        freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        freqs = torch.repeat_interleave(freqs, 2, dim=-1)
        return freqs.sin()[None, :, None, :], freqs.cos()[None, :, None, :]


class FeedForward(nn.Module):
    def __init__(self, d, mult=4, dropout=0.1):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d * mult), nn.SiLU(), nn.Dropout(dropout),
                                 nn.Linear(d * mult, d), nn.Dropout(dropout))

    def forward(self, x):
        return self.net(x)


class ConvModule(nn.Module):
    def __init__(self, d, kernel_size=7, dropout=0.1):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.glu = nn.GLU(dim=1)
        self.dw = nn.Conv1d(d, d, kernel_size, padding=kernel_size // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.act = nn.SiLU()
        self.pw2 = nn.Conv1d(d, d, 1)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = self.norm(x).transpose(1, 2)
        x = self.glu(self.pw1(x))
        x = self.act(self.bn(self.dw(x)))
        return self.drop(self.pw2(x)).transpose(1, 2)


class RotaryMHSA(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.heads = heads
        self.rotary = RotaryEmbedding(d // heads)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads) for t in (q, k, v))
        sin, cos = self.rotary(x)
        q, k = apply_rotary(q, sin, cos), apply_rotary(k, sin, cos)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(att.transpose(1, 2).reshape(B, T, D))


class ConformerBlock(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.ff1 = FeedForward(d)
        self.mhsa = RotaryMHSA(d, heads)
        self.conv = ConvModule(d)
        self.ff2 = FeedForward(d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x, lengths):
        mask = torch.arange(x.size(1), device=x.device)[None, :] < lengths[:, None]
        x = x + 0.5 * self.ff1(x)
        x = x + self.mhsa(x, mask[:, None, None, :])
        x = x + self.conv(x)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)

Model = ConformerBlock
'''

MOE = HEADER + '''
class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.w1 = nn.Linear(d, h)
        self.w2 = nn.Linear(h, d)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class MoE(nn.Module):
    def __init__(self, d=8, h=16, num_experts=4, k=2):
        super().__init__()
        self.router = nn.Linear(d, num_experts, bias=False)
        self.experts = nn.ModuleList([Expert(d, h) for _ in range(num_experts)])
        self.k, self.num_experts = k, num_experts

    def forward(self, x):
        B, T, D = x.shape
        tokens = x.reshape(-1, D)
        logits = self.router(tokens)
        probs = F.softmax(logits, dim=-1)
        topv, topi = torch.topk(probs, self.k, dim=-1)
        topv = topv / topv.sum(dim=-1, keepdim=True)
        # dense one-hot combine weights [tokens, experts]
        combine = torch.zeros_like(probs).scatter_add_(1, topi, topv)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            out = out + combine[:, e:e + 1] * expert(tokens)
        # index_add_ dispatch of the top-1 expert's output, as sparse implementations do
        out2 = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = (topi[:, 0] == e).type_as(topv)
            out2.index_add_(0, torch.arange(tokens.shape[0]), sel[:, None] * topv[:, :1] * expert(tokens))
        # Switch-style load-balancing loss
        mask = F.one_hot(topi[:, 0], self.num_experts).type_as(probs)
        frac = mask.mean(dim=0)
        prob = probs.mean(dim=0)
        aux = self.num_experts * torch.sum(frac * prob)
        return (out + out2).view(B, T, D), aux

Model = MoE
'''

CONVNEXT = HEADER + '''
def drop_path(x, drop_prob: float = 0.0, training: bool = False):
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = keep_prob + torch.rand(shape, dtype=x.dtype, device=x.device)
    random_tensor.floor_()
    return x.div(keep_prob) * random_tensor


class DropPath(nn.Module):
    def __init__(self, drop_prob=None):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training)


class LayerNorm(nn.Module):
    def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps
        self.data_format = data_format
        self.normalized_shape = (normalized_shape,)

    def forward(self, x):
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class Block(nn.Module):
    def __init__(self, dim, drop_path=0.0, layer_scale_init_value=1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale_init_value * torch.ones((dim)),
                                  requires_grad=True) if layer_scale_init_value > 0 else None
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x):
        inp = x
        x = self.dwconv(x)
        x = x.permute(0, 2, 3, 1)
        x = self.norm(x)
        x = self.pwconv1(x)
        x = self.act(x)
        x = self.pwconv2(x)
        if self.gamma is not None:
            x = self.gamma * x
        x = x.permute(0, 3, 1, 2)
        return inp + self.drop_path(x)


class Stage(nn.Module):
    def __init__(self, cin=4, dim=8, depth=2, dp_rates=(0.0, 0.2)):
        super().__init__()
        self.downsample = nn.Sequential(LayerNorm(cin, eps=1e-6, data_format="channels_first"),
                                        nn.Conv2d(cin, dim, kernel_size=2, stride=2))
        self.blocks = nn.Sequential(*[Block(dim, drop_path=dp_rates[j], layer_scale_init_value=0.5) for j in range(depth)])
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(m.weight, std=0.2)
            nn.init.constant_(m.bias, 0)

    def forward(self, x):
        return self.blocks(self.downsample(x))

Model = Stage
'''

DETR = HEADER + '''
class MLP(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, num_layers):
        super().__init__()
        h = [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(n, k) for n, k in zip([input_dim] + h, h + [output_dim]))
        self.num_layers = num_layers

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x)) if i < self.num_layers - 1 else layer(x)
        return x


class DETRHead(nn.Module):
    def __init__(self, d_model=16, nhead=2, num_layers=2, num_queries=5, num_classes=3):
        super().__init__()
        layer = nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward=32, dropout=0.1)
        self.decoder = nn.TransformerDecoder(layer, num_layers, norm=nn.LayerNorm(d_model))
        self.query_embed = nn.Embedding(num_queries, d_model)
        self.class_embed = nn.Linear(d_model, num_classes + 1)
        self.bbox_embed = MLP(d_model, d_model, 4, 3)

    def forward(self, memory, targets):
        # memory: [S, B, d] (sequence first, as DETR's transformer)
        B = memory.shape[1]
        query_pos = self.query_embed.weight.unsqueeze(1).repeat(1, B, 1)
        tgt = torch.zeros_like(query_pos)
        hs = self.decoder(tgt + query_pos, memory)
        hs = hs.transpose(0, 1)
        logits = self.class_embed(hs)
        boxes = self.bbox_embed(hs).sigmoid()
        cost = torch.cdist(boxes, targets, p=1) - logits.softmax(-1)[..., :1]
        return cost

Model = DETRHead
'''
