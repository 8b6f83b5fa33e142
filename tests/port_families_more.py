"""Five more model families written as their torch code commonly is (a Mamba-style selective state-space block,
GCN and GAT layers, a WaveNet, a shifted-window Swin block, an LSTM encoder-decoder with attention), ported to
graphc by their imports alone (``port_families.port``; tests/test_port_more_families.py)."""

try:
    from port_families import HEADER
except ImportError:  # tests/ collected as a package
    from tests.port_families import HEADER

MAMBA = HEADER + '''
class MambaBlock(nn.Module):
    def __init__(self, d_model=8, d_state=4, d_conv=3, expand=2, parallel=False):
        super().__init__()
        d_inner = expand * d_model
        self.d_inner, self.d_state, self.parallel = d_inner, d_state, parallel
        self.dt_rank = math.ceil(d_model / 16)
        self.norm = nn.RMSNorm(d_model)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner)
        dt = torch.exp(torch.rand(d_inner) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(d_inner, 1)
        self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def scan(self, deltaA, deltaBx, C):
        h = torch.zeros_like(deltaBx[:, 0])
        ys = []
        for t in range(deltaA.shape[1]):
            h = deltaA[:, t].exp() * h + deltaBx[:, t]
            ys.append(torch.einsum("bdn,bn->bd", h, C[:, t]))
        return torch.stack(ys, dim=1)

    def parallel_scan(self, deltaA, deltaBx, C):
        L = deltaA.shape[1]
        S = torch.cumsum(deltaA, dim=1)
        seg = S.unsqueeze(2) - S.unsqueeze(1)
        causal = torch.tril(torch.ones(L, L, dtype=torch.bool, device=deltaA.device))
        seg = seg.masked_fill(~causal[None, :, :, None, None], float("-inf"))
        h = torch.einsum("btsdn,bsdn->btdn", torch.exp(seg), deltaBx)
        return torch.einsum("btdn,btn->btd", h, C)

    def forward(self, x):
        _, L, _ = x.shape
        x_in, z = self.in_proj(self.norm(x)).chunk(2, dim=-1)
        x_in = F.silu(self.conv1d(x_in.transpose(1, 2))[..., :L].transpose(1, 2))
        A = -torch.exp(self.A_log)
        delta, B, C = self.x_proj(x_in).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(delta))
        deltaA = torch.einsum("bld,dn->bldn", delta, A)
        deltaBx = torch.einsum("bld,bln,bld->bldn", delta, B, x_in)
        y = (self.parallel_scan if self.parallel else self.scan)(deltaA, deltaBx, C)
        y = (y + x_in * self.D) * F.silu(z)
        return x + self.out_proj(y)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(MambaBlock(), MambaBlock(parallel=True))
        self.norm_f = nn.RMSNorm(8, eps=1e-5)

    def forward(self, x):
        return self.norm_f(self.layers(x))
'''

GNN = HEADER + '''
class GCNConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x, edge_index):
        N = x.size(0)
        loops = torch.arange(N, device=x.device)
        src = torch.cat([edge_index[0], loops])
        dst = torch.cat([edge_index[1], loops])
        deg = torch.bincount(dst, minlength=N).to(x.dtype)
        norm = deg.pow(-0.5)
        weight = norm[src] * norm[dst]
        h = self.lin(x)
        msg = h.index_select(0, src) * weight.unsqueeze(-1)
        out = torch.zeros(N, h.size(1), dtype=x.dtype, device=x.device).index_add_(0, dst, msg)
        return out + self.bias


class GATConv(nn.Module):
    def __init__(self, in_channels, out_channels, heads=2, negative_slope=0.2):
        super().__init__()
        self.heads, self.out_channels, self.negative_slope = heads, out_channels, negative_slope
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = nn.Parameter(torch.randn(1, heads, out_channels) * 0.3)
        self.att_dst = nn.Parameter(torch.randn(1, heads, out_channels) * 0.3)

    def forward(self, x, edge_index):
        N, H, C = x.size(0), self.heads, self.out_channels
        h = self.lin(x).view(N, H, C)
        src, dst = edge_index
        alpha_src = (h * self.att_src).sum(dim=-1)
        alpha_dst = (h * self.att_dst).sum(dim=-1)
        e = F.leaky_relu(alpha_src[src] + alpha_dst[dst], self.negative_slope)
        index = dst.unsqueeze(-1).expand_as(e)
        e_max = torch.full((N, H), float("-inf"), dtype=e.dtype, device=e.device)
        e_max = e_max.scatter_reduce(0, index, e, reduce="amax", include_self=True)
        e = (e - e_max[dst]).exp()
        denom = torch.zeros(N, H, dtype=e.dtype, device=e.device).index_add_(0, dst, e)
        alpha = e / denom[dst]
        out = torch.zeros(N, H, C, dtype=x.dtype, device=x.device)
        out.index_add_(0, dst, h[src] * alpha.unsqueeze(-1))
        return out.mean(dim=1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = GCNConv(5, 8)
        self.conv2 = GATConv(8, 4)

    def forward(self, x, edge_index):
        N = x.size(0)
        x = F.relu(self.conv1(x, edge_index))
        loops = torch.arange(N, device=x.device).unsqueeze(0).repeat(2, 1)
        return self.conv2(x, torch.cat([edge_index, loops], dim=1))
'''

WAVENET = HEADER + '''from torch.nn.utils.parametrizations import weight_norm


class CausalConv1d(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1):
        super().__init__()
        self.left = (kernel_size - 1) * dilation
        self.conv = weight_norm(nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation))

    def forward(self, x):
        return self.conv(F.pad(x, (self.left, 0)))


class ResidualLayer(nn.Module):
    def __init__(self, channels, skip_channels, kernel_size, dilation):
        super().__init__()
        self.dilated = CausalConv1d(channels, 2 * channels, kernel_size, dilation)
        self.res = nn.Conv1d(channels, channels, 1)
        self.skip = nn.Conv1d(channels, skip_channels, 1)

    def forward(self, x):
        a, b = self.dilated(x).chunk(2, dim=1)
        h = torch.tanh(a) * torch.sigmoid(b)
        return x + self.res(h), self.skip(h)


class Model(nn.Module):
    def __init__(self, in_channels=1, channels=8, skip_channels=6, n_layers=4, kernel_size=2, n_classes=16):
        super().__init__()
        self.input = nn.utils.weight_norm(nn.Conv1d(in_channels, channels, 1))
        self.layers = nn.ModuleList(
            [ResidualLayer(channels, skip_channels, kernel_size, 2 ** i) for i in range(n_layers)])
        self.head = nn.Sequential(nn.ReLU(), nn.Conv1d(skip_channels, skip_channels, 1), nn.ReLU(),
                                  nn.Conv1d(skip_channels, n_classes, 1))

    def forward(self, x):
        x = self.input(x)
        skips = 0
        for layer in self.layers:
            x, s = layer(x)
            skips = skips + s
        return F.log_softmax(self.head(skips), dim=1)
'''

SWIN = HEADER + '''
def window_partition(x, window_size):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows, window_size, H, W):
    B = int(windows.shape[0] / (H * W / window_size / window_size))
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim, window_size, num_heads):
        super().__init__()
        self.window_size, self.num_heads = window_size, num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size), indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]
        relative_coords = relative_coords.permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += window_size - 1
        relative_coords[:, :, 1] += window_size - 1
        relative_coords[:, :, 0] *= 2 * window_size - 1
        self.register_buffer("relative_position_index", relative_coords.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = self.softmax(attn)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, C))


class SwinBlock(nn.Module):
    def __init__(self, dim=8, resolution=(4, 4), num_heads=2, window_size=2, shift_size=0, mlp_ratio=2.0):
        super().__init__()
        self.resolution, self.window_size, self.shift_size = resolution, window_size, shift_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window_size, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))
        if shift_size > 0:
            H, W = resolution
            img_mask = torch.zeros((1, H, W, 1))
            cnt = 0
            for h in (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None)):
                for w in (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None)):
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mask_windows = window_partition(img_mask, window_size).view(-1, window_size * window_size)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H, W = self.resolution
        B, L, C = x.shape
        ws, shift = self.window_size, self.shift_size
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if shift > 0:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        windows = window_partition(x, ws).view(-1, ws * ws, C)
        windows = self.attn(windows, mask=self.attn_mask).view(-1, ws, ws, C)
        x = window_reverse(windows, ws, H, W)
        if shift > 0:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(SwinBlock(shift_size=0), SwinBlock(shift_size=1))

    def forward(self, x):
        return self.blocks(x)
'''

SEQ2SEQ = HEADER + '''
class Encoder(nn.Module):
    def __init__(self, vocab, emb, hid):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb, padding_idx=0)
        self.rnn = nn.LSTM(emb, hid, batch_first=True, bidirectional=True)
        self.fc_h = nn.Linear(2 * hid, hid)
        self.fc_c = nn.Linear(2 * hid, hid)

    def forward(self, src):
        outputs, (h, c) = self.rnn(self.embedding(src))
        h = torch.tanh(self.fc_h(torch.cat((h[-2], h[-1]), dim=1)))
        c = torch.tanh(self.fc_c(torch.cat((c[-2], c[-1]), dim=1)))
        return outputs, (h, c)


class BahdanauAttention(nn.Module):
    def __init__(self, enc_dim, dec_dim, att_dim):
        super().__init__()
        self.W_enc = nn.Linear(enc_dim, att_dim, bias=False)
        self.W_dec = nn.Linear(dec_dim, att_dim)
        self.v = nn.Linear(att_dim, 1, bias=False)

    def forward(self, query, keys, mask):
        scores = self.v(torch.tanh(self.W_enc(keys) + self.W_dec(query).unsqueeze(1))).squeeze(-1)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        return torch.bmm(weights.unsqueeze(1), keys).squeeze(1), weights


class Decoder(nn.Module):
    def __init__(self, vocab, emb, hid):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb, padding_idx=0)
        self.attention = BahdanauAttention(2 * hid, hid, hid)
        self.cell = nn.LSTMCell(emb + 2 * hid, hid)
        self.out = nn.Linear(hid + 2 * hid + emb, vocab)

    def forward(self, token, state, enc_out, mask):
        emb = self.embedding(token)
        context, _ = self.attention(state[0], enc_out, mask)
        h, c = self.cell(torch.cat([emb, context], dim=1), state)
        return self.out(torch.cat([h, context, emb], dim=1)), (h, c)


class Model(nn.Module):
    def __init__(self, vocab=12, emb=6, hid=5):
        super().__init__()
        self.encoder = Encoder(vocab, emb, hid)
        self.decoder = Decoder(vocab, emb, hid)

    def forward(self, src, src_lengths, tgt):
        enc_out, state = self.encoder(src)
        mask = torch.arange(src.size(1), device=src.device)[None, :] < src_lengths[:, None]
        token = tgt[:, 0]
        logits = []
        for t in range(1, tgt.size(1)):
            step, state = self.decoder(token, state, enc_out, mask)
            logits.append(step)
            token = tgt[:, t] if self.training else step.argmax(dim=1)
        log_probs = F.log_softmax(torch.stack(logits, dim=1), dim=-1)
        loss = F.nll_loss(log_probs.reshape(-1, log_probs.size(-1)), tgt[:, 1:].reshape(-1), ignore_index=0)
        return log_probs, loss
'''
