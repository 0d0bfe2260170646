"""tensordd.torch: a torch device whose tensors live in the daemon.

Factories, host copies, views that alias the daemon storage, in-place updates, dtype
rules, the errors raised at the call (torch's meta checks, devices) and those that
surface at the first read, pipelining (no round trip before a value is read), and the
ports that used to break (manual_seed, DataLoader, .to(device), flatten,
clip_grad_norm_, view_as, save/load, state_dict pickling). Values are compared with
the same calls on torch's CPU tensors.
"""

from __future__ import annotations

import copy
import io
import pickle
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tensordd  # noqa: E402
import tensordd.torch as tt  # noqa: E402


@pytest.fixture(scope="module")
def dev(daemon):
    return tt.device(daemon.endpoint, "cpu:0")


@pytest.fixture(scope="module")
def dev1(daemon):
    return tt.device(daemon.endpoint, "cpu:1")


def close(a, b, rtol=1e-5, atol=1e-6):
    a = a.cpu() if isinstance(a, torch.Tensor) else torch.tensor(a)
    b = b.cpu() if isinstance(b, torch.Tensor) else torch.tensor(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- the device

def test_device_is_a_torch_device(dev, daemon):
    assert isinstance(dev, torch.device) and dev.type == "privateuseone"
    assert tt.device(daemon.endpoint, "cpu:0") == dev  # the same (endpoint, device): same N
    t = torch.ones(2, 3, device=dev)
    assert isinstance(t, tt.DaemonTensor) and isinstance(t, torch.Tensor)
    assert t.device == dev and t.shape == (2, 3) and t.dtype == torch.float32
    assert str(tt.daemon_device_of(t)) == "cpu:0"
    assert isinstance(tt.session_of(t), tensordd.Session)


def test_device_refuses_a_missing_daemon_device(daemon):
    with pytest.raises(ValueError, match="no device cuda:7"):
        tt.device(daemon.endpoint, "cuda:7")


def test_factories_and_host_copies(dev):
    close(torch.zeros(2, 3, device=dev), torch.zeros(2, 3))
    close(torch.ones(4, dtype=torch.int64, device=dev), torch.ones(4, dtype=torch.int64))
    close(torch.full((2, 2), 7.5, device=dev), torch.full((2, 2), 7.5))
    close(torch.tensor([[1, 2], [3, 4]], device=dev), torch.tensor([[1, 2], [3, 4]]))
    close(torch.zeros_like(torch.ones(3, device=dev)), torch.zeros(3))
    close(torch.ones(3, device=dev).new_full((2,), 3.0), torch.full((2,), 3.0))
    e = torch.empty(5, device=dev)
    e.fill_(2.0)
    close(e, torch.full((5,), 2.0))
    x = torch.randn(3, 4)
    d = x.to(dev)
    close(d, x)
    assert d.to(torch.float64).dtype == torch.float64
    close(d.to(torch.float64), x.double())
    close(d.double().cpu(), x.double())
    h = torch.zeros(3, 4)
    h.copy_(d)
    close(h, x)
    assert d.sum().item() == pytest.approx(x.sum().item(), rel=1e-5)
    assert bool((d > -100).all()) is True


def test_factories_given_the_device_equal_torchs(dev):
    """torch.arange(n, device=dev) & co. (positions in a transformer, eye for an identity)
    equal torch's own; randperm follows manual_seed as the client's CPU generator."""
    cases = [lambda d: torch.arange(5, device=d), lambda d: torch.arange(1.0, 4.0, device=d),
             lambda d: torch.arange(0, 10, 3, device=d, dtype=torch.int32),
             lambda d: torch.linspace(-1, 1, 7, device=d), lambda d: torch.logspace(0, 2, 3, device=d),
             lambda d: torch.eye(3, device=d), lambda d: torch.eye(2, 4, device=d),
             lambda d: torch.tril_indices(3, 3, device=d),
             lambda d: torch.triu_indices(3, 4, 1, device=d)]
    for make in cases:
        want, got = make("cpu"), make(dev)
        assert got.device == dev and got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.cpu(), want)
    torch.manual_seed(7)
    want = torch.randperm(20)
    torch.manual_seed(7)
    assert torch.equal(torch.randperm(20, device=dev).cpu(), want)


def test_numpy_needs_cpu_first_as_with_cuda(dev):
    d = torch.arange(6.0).to(dev)
    with pytest.raises(TypeError):
        d.numpy()
    assert d.cpu().numpy().tolist() == [0, 1, 2, 3, 4, 5]


def test_random_fills_follow_manual_seed(dev):
    torch.manual_seed(5)
    a = torch.randn(4, 5, device=dev)
    b = torch.rand(3, device=dev)
    m = torch.empty(6, device=dev).bernoulli_(0.3)
    torch.manual_seed(5)
    close(a, torch.randn(4, 5))
    close(b, torch.rand(3))
    close(m, torch.empty(6).bernoulli_(0.3))


def test_repr_names_the_device(dev):
    text = repr(torch.tensor([1.5, 2.0], device=dev))
    assert "1.5000" in text and "privateuseone" in text


# ---------------------------------------------------------------- views and in-place

def test_views_alias_the_storage(dev):
    x = torch.arange(24.0).reshape(4, 6)
    d = x.to(dev)
    for f in (lambda t: t.view(6, 4), lambda t: t.t(), lambda t: t.transpose(0, 1)[1:3],
              lambda t: t[1:3, ::2], lambda t: t[2], lambda t: t[:, 4],
              lambda t: t.unsqueeze(0).expand(3, 4, 6), lambda t: t.as_strided((3, 3), (5, 1), 2),
              lambda t: t.reshape(2, 12).permute(1, 0), lambda t: t.split(2, dim=1)[1],
              lambda t: t.narrow(0, 1, 2), lambda t: t.flatten()):
        close(f(d), f(x))
    # writes through views reach the base and the other views
    v = d[:, 1:3]
    tr = d.t()
    v.mul_(10)
    x[:, 1:3].mul_(10)
    close(d, x)
    close(tr, x.t())
    d[1] = -1.0
    x[1] = -1.0
    close(d, x)
    close(v, x[:, 1:3])
    d.t()[0].add_(100)  # a strided view of a transposed view
    x.t()[0].add_(100)
    close(d, x)
    s = d[::2, ::3]
    s.zero_()
    x[::2, ::3].zero_()
    close(d, x)


def test_writing_an_expanded_view_is_refused(dev):
    e = torch.zeros(1, 3, device=dev).expand(4, 3)
    with pytest.raises(RuntimeError):
        e.add_(1)


def test_a_view_that_reinterprets_bytes_is_refused_naming_the_dtypes(dev):
    x = torch.arange(4.0).to(dev)
    with pytest.raises(NotImplementedError, match="float32 -> torch.int32"):
        x.view(torch.int32)
    assert x.view(torch.float32).cpu().tolist() == [0.0, 1.0, 2.0, 3.0]  # same dtype: a view


def test_inplace_ops_on_a_parameter_update_it(dev):
    p = nn.Parameter(torch.ones(3).to(dev))
    with torch.no_grad():
        p.add_(torch.full((3,), 2.0).to(dev), alpha=0.5)
        p.mul_(3)
        p.addcdiv_(torch.ones(3).to(dev), torch.full((3,), 4.0).to(dev), value=2)
        p.addcmul_(torch.ones(3).to(dev), torch.ones(3).to(dev), value=-1)
    close(p.detach(), torch.full((3,), 5.5))


# ---------------------------------------------------------------- dtype rules

def test_dtype_promotion_matches_torch(dev):
    i = torch.tensor([1, 2, 3])
    di = i.to(dev)
    close(di + 2, i + 2)  # int64 stays int64
    close(di * 3 - 1, i * 3 - 1)
    close(di / 2, i / 2)  # true division: float32
    close(di + 0.5, i + 0.5)
    close(di // 2, i // 2)
    close((di > 1).sum(), (i > 1).sum())  # bool sum: int64
    close(di.float().mean(), i.float().mean())
    close(torch.ones(3, dtype=torch.float64, device=dev) * di, torch.ones(3, dtype=torch.float64) * i)
    close(di.argmax(), i.argmax())


def test_elementwise_reductions_and_matmul(dev):
    torch.manual_seed(0)
    x, y = torch.randn(5, 4), torch.randn(4, 3)
    dx, dy = x.to(dev), y.to(dev)
    for f in (lambda a, b: a @ b, lambda a, b: torch.addmm(b[0], a, b),
              lambda a, b: (a.exp() + a.abs().sqrt()).sum(1),
              lambda a, b: a.softmax(-1), lambda a, b: a.log_softmax(0),
              lambda a, b: a.var(0), lambda a, b: a.std(1, keepdim=True),
              lambda a, b: a.amax(1), lambda a, b: a.max(0)[1], lambda a, b: a.norm(),
              lambda a, b: torch.cat([a, a * 2], 1), lambda a, b: torch.stack([a, a], 0),
              lambda a, b: torch.where(a > 0, a, torch.zeros_like(a)),
              lambda a, b: a.clamp(-0.5, 0.5), lambda a, b: F.gelu(a), F_relu6,
              lambda a, b: a.masked_fill(a < 0, 3.0), lambda a, b: a.cumsum(0),
              lambda a, b: a.tril(), lambda a, b: F.pad(a, (1, 2)),
              lambda a, b: a.topk(2, dim=1)[0], lambda a, b: a.sort(1)[0]):
        close(f(dx, dy), f(x, y), rtol=1e-4, atol=1e-5)
    close(dx.t().mm(dx), x.t().mm(x), rtol=1e-4, atol=1e-5)


def F_relu6(a, b):
    return F.relu6(a)


def test_backward_matches_torch(dev):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1, groups=1)
    bn = nn.BatchNorm2d(4)
    lin = nn.Linear(4 * 4 * 4, 5)
    ln = nn.LayerNorm(5)
    emb = nn.Embedding(7, 5)
    cpu = nn.ModuleList([conv, bn, lin, ln, emb])
    onto = copy.deepcopy(cpu).to(dev)
    x = torch.randn(2, 3, 8, 8)
    idx = torch.tensor([[1, 2], [6, 1]])

    def run(m, x, idx, target):
        h = F.max_pool2d(F.relu(m[1](m[0](x))), 1)
        h = m[3](m[2](h.flatten(1)))
        h = h + m[4](idx).sum(1)
        return F.cross_entropy(h, target)

    target = torch.tensor([1, 3])
    loss_c = run(cpu, x, idx, target)
    loss_d = run(onto, x.to(dev), idx.to(dev), target.to(dev))
    loss_c.backward()
    loss_d.backward()
    assert loss_d.item() == pytest.approx(loss_c.item(), rel=1e-5)
    for (name, pc), pd in zip(cpu.named_parameters(), onto.parameters()):
        assert pd.grad is not None and pd.grad.device == dev, name
        close(pd.grad, pc.grad, rtol=1e-4, atol=1e-5)
    close(onto[1].running_mean, cpu[1].running_mean)
    close(onto[1].running_var, cpu[1].running_var)


def test_grouped_and_1d_convolution_grads(dev):
    torch.manual_seed(1)
    for conv, shape in ((nn.Conv2d(4, 6, 3, padding=1, groups=2, dilation=1), (2, 4, 5, 5)),
                        (nn.Conv2d(3, 3, 3, stride=2, groups=3), (1, 3, 7, 7)),
                        (nn.Conv1d(2, 3, 3, stride=2, padding=1), (2, 2, 9))):
        x = torch.randn(*shape, requires_grad=True)
        xd = x.detach().to(dev).requires_grad_()
        cd = copy.deepcopy(conv).to(dev)
        conv(x).square().sum().backward()
        cd(xd).square().sum().backward()
        close(xd.grad, x.grad, rtol=1e-4, atol=1e-5)
        close(cd.weight.grad, conv.weight.grad, rtol=1e-4, atol=1e-4)
        close(cd.bias.grad, conv.bias.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_embedding_max_norm_renormalizes_the_table_in_place_as_torch(dev, norm_type):
    # torch scales each looked-up row over max_norm in the table itself (embedding_renorm_)
    # before the lookup; rows not looked up keep their bits. The scale is computed in f32
    # here and in double by torch, one rounding apart: a few ulps of float32.
    eps = torch.finfo(torch.float32).eps
    torch.manual_seed(2)
    local = nn.Embedding(7, 5, max_norm=1.5, norm_type=norm_type)
    with torch.no_grad():
        local.weight[0] *= 0.1  # one row under max_norm, looked up
    start = local.weight.detach().clone()
    remote = copy.deepcopy(local).to(dev)
    opt_l = torch.optim.SGD(local.parameters(), lr=0.5)
    opt_r = torch.optim.SGD(remote.parameters(), lr=0.5)
    for idx in (torch.tensor([[1, 3, 3], [0, 5, 1]]), torch.tensor([2, 3])):
        g = torch.randn(*idx.shape, 5)
        out_l, out_r = local(idx), remote(idx.to(dev))
        close(out_r, out_l, rtol=8 * eps, atol=8 * eps)
        close(remote.weight.detach(), local.weight.detach(), rtol=8 * eps, atol=8 * eps)
        (out_l * g).sum().backward()
        (out_r * g.to(dev)).sum().backward()
        close(remote.weight.grad, local.weight.grad, rtol=8 * eps, atol=8 * eps)
        opt_l.step(), opt_r.step()
        opt_l.zero_grad(), opt_r.zero_grad()
    w = remote.weight.detach().cpu()
    assert torch.equal(w[[4, 6]], start[[4, 6]])  # never looked up, never stepped
    assert (torch.linalg.vector_norm(start[[1, 3, 5]], norm_type, dim=1) > 1.5).all()


# ---------------------------------------------------------------- errors

def test_unmapped_op_raises_naming_it_at_the_call(dev):
    with pytest.raises(NotImplementedError, match="aten.erf"):
        torch.erf(torch.ones(2, device=dev))


def test_local_errors_raise_at_the_call(dev):
    a, b = torch.ones(2, 3, device=dev), torch.ones(4, device=dev)
    with pytest.raises(RuntimeError, match="size of tensor"):
        a + b
    with pytest.raises(RuntimeError):
        a @ torch.ones(2, 2, device=dev)
    with pytest.raises(RuntimeError):
        a.view(5)


def test_daemon_errors_surface_typed_at_the_first_read(dev):
    x = torch.arange(3.0, device="cpu").to(dev)
    bad = torch.index_select(x, 0, torch.tensor([7]).to(dev))  # torch cannot know it here
    y = bad * 2
    with pytest.raises(tensordd.Error):
        y.item()
    # the session carries on
    assert torch.ones(2, device=dev).sum().item() == 2.0


def test_device_checks(dev, dev1):
    p = nn.Parameter(torch.ones(3).to(dev))
    with pytest.raises(RuntimeError, match="different type|device"):
        p.grad = torch.ones(3)  # torch's own check: another backend
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device=dev) + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device=dev) + torch.ones(3, device=dev1)
    close(torch.ones(3, device=dev) + torch.tensor(2.0), torch.full((3,), 3.0))  # host scalar
    moved = torch.arange(4.0, device="cpu").to(dev).to(dev1)
    assert moved.device == dev1
    close(moved, torch.arange(4.0))


# ---------------------------------------------------------------- pipelining

def test_a_training_step_waits_for_nothing_until_a_read(dev, monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(5, 8).to(dev), torch.tensor([0, 1, 2, 3, 0]).to(dev)
    s = tt.session_of(x)
    s.sync()
    trips = []
    real_roundtrip, real_download = s._roundtrip, s._download

    def roundtrip(*a, **k):
        trips.append("roundtrip")
        return real_roundtrip(*a, **k)

    def download(*a, **k):
        trips.append("download")
        return real_download(*a, **k)

    s._roundtrip, s._download = roundtrip, download
    monkeypatch.setattr(sys.modules["tensordd.tensor"], "_numpy_c", None)  # (s._download)
    try:
        for _ in range(2):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        assert trips == []
        loss.item()
        assert trips == ["download"]
    finally:
        del s._roundtrip, s._download


# ---------------------------------------------------------------- the ports that broke

def test_port_manual_seed_and_plain_torch_device_calls(dev):
    torch.manual_seed(3)
    a = nn.Linear(4, 2).to(dev)
    torch.manual_seed(3)
    b = nn.Linear(4, 2)
    close(a.weight.detach(), b.weight.detach())
    assert next(a.parameters()).device == dev  # no tensordd.cuda: the torch device itself


def test_port_dataloader_collate_and_to_device(dev):
    ds = torch.utils.data.TensorDataset(torch.arange(20.0).reshape(10, 2),
                                        torch.arange(10))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    seen = []
    for data, target in loader:
        data, target = data.to(dev), target.to(dev)
        assert data.device == dev and target.dtype == torch.int64
        seen.append(torch.flatten(data * 1).sum().item())
    assert seen == [28.0, 92.0, 70.0]


def test_port_clip_grad_norm_and_view_as(dev):
    torch.manual_seed(0)
    m = nn.Linear(6, 3)
    md = copy.deepcopy(m).to(dev)
    x = torch.randn(4, 6)
    m(x).pow(2).sum().backward()
    md(x.to(dev)).pow(2).sum().backward()
    nc = nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    nd = nn.utils.clip_grad_norm_(md.parameters(), 0.5)
    assert nd.item() == pytest.approx(nc.item(), rel=1e-5)
    close(md.weight.grad, m.weight.grad, rtol=1e-4, atol=1e-6)
    t = torch.tensor([[1], [2]]).to(dev)
    close(torch.tensor([1, 2]).to(dev).view_as(t), t)


def test_port_save_load_and_state_dict_pickling(dev, tmp_path):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(dev)
    sd = m.state_dict()
    restored = pickle.loads(pickle.dumps(sd))
    assert all(v.device.type == "cpu" for v in restored.values())
    for k in sd:
        close(restored[k], sd[k].cpu())
    path = tmp_path / "m.pt"
    torch.save(m.state_dict(), path)
    m2 = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(dev)
    m2.load_state_dict(torch.load(path))
    for k, v in m2.state_dict().items():
        assert v.device == dev
        close(v, sd[k])
    buf = io.BytesIO()
    torch.save(torch.ones(2, device=dev), buf)
    buf.seek(0)
    close(torch.load(buf), torch.ones(2))
    clone = copy.deepcopy(m)
    assert next(clone.parameters()).device == dev


def test_coverage_table_is_generated_and_matches_the_docs():
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, "docs", "torch_coverage.md"), encoding="utf-8") as f:
        doc = f.read()
    table = tt.coverage_table()
    assert table in doc, "docs/torch_coverage.md is stale: make docs (python -m tensordd.torch)"
    rows = {r[0]: r for r in tt.coverage()}
    assert rows["aten.convolution_backward.default"][1] == "mapped"
    assert rows["aten.t.default"][1] == "view"
    assert rows["aten.add_.Tensor"][1] == "in-place"


def test_resnet18_in_float64_is_exact(dev):
    """In float64 the mappings' rounding vanishes: torchvision's resnet18 after two SGD
    steps equals local PyTorch to 1e-12 (the float32 runs of test_torch_device_models.py
    differ only by float32 rounding, which small-batch batch norm amplifies)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10).double()
    md = copy.deepcopy(m).to(dev)
    x = torch.randn(4, 3, 64, 64, dtype=torch.float64)
    y = torch.tensor([3, 7, 0, 9])
    runs = ((m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), x, y),
            (md, torch.optim.SGD(md.parameters(), lr=0.01, momentum=0.9), x.to(dev), y.to(dev)))
    for _ in range(2):
        for model, opt, xs, ys in runs:
            opt.zero_grad()
            F.cross_entropy(model(xs), ys).backward()
            opt.step()
    for (name, pc), pd in zip(m.named_parameters(), md.parameters()):
        close(pd.detach(), pc.detach(), rtol=0, atol=1e-12)
    for (name, bc), bd in zip(m.named_buffers(), md.buffers()):
        close(bd, bc, rtol=0, atol=1e-12)


def test_activation_and_loss_backwards_including_decomposed_ones(dev):
    """Backward ops mapped directly (sigmoid, tanh, mse_loss) and through torch's own
    decompositions (silu, leaky_relu, hardtanh) give torch's gradients."""
    torch.manual_seed(2)
    x = torch.randn(4, 5)
    target = torch.randn(4, 5)
    cases = (lambda t, y: torch.sigmoid(t), lambda t, y: torch.tanh(t),
             lambda t, y: F.silu(t), lambda t, y: F.leaky_relu(t, 0.2),
             lambda t, y: F.hardtanh(t, -0.5, 0.5), lambda t, y: F.mse_loss(t, y),
             lambda t, y: F.softplus(t))
    for f in cases:
        xc = x.clone().requires_grad_()
        xd = x.to(dev).requires_grad_()
        (f(xc, target) * 1.5).sum().backward()
        (f(xd, target.to(dev)) * 1.5).sum().backward()
        close(xd.grad, xc.grad, rtol=1e-4, atol=1e-5)
