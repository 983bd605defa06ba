"""The graph convolution equals torch_geometric's SGConv(K=1), which the published GEARS
uses: outputs, gradients, parameter names and initialisation, in both of its forms (the
CPU's sparse product and the gather that a GPU runs)."""

import copy
import pickle

import pytest
import torch
from reference_package import import_reference

from gears_ddp.model.graph_conv import NormalisedAdjacency, SimpleGraphConv

N_NODES, CHANNELS = 30, 8


def _graph(seed: int):
    """Random weighted edges with duplicates, several self-loops (one of weight 0, on a node
    with no other edge, so its degree is 0) and nodes without any edge."""
    generator = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, N_NODES - 5, (2, 120), generator=generator)
    edge_weight = torch.rand(120, generator=generator, dtype=torch.float64)
    loops = torch.tensor([[2, 7, N_NODES - 1], [2, 7, N_NODES - 1]])
    edge_index = torch.cat([edge_index, loops], dim=1)
    edge_weight = torch.cat([edge_weight, torch.tensor([0.3, 2.5, 0.0], dtype=torch.float64)])
    return edge_index, edge_weight


def _pair(seed: int = 0):
    sg_conv = import_reference("torch_geometric.nn").SGConv
    torch.manual_seed(seed)
    ours = SimpleGraphConv(CHANNELS, CHANNELS)
    torch.manual_seed(seed)
    theirs = sg_conv(CHANNELS, CHANNELS, 1)
    return ours, theirs


def test_same_parameter_names_and_initialisation():
    ours, theirs = _pair()
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["lin.weight", "lin.bias"]
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name


def _form(monkeypatch, form: str) -> None:
    """Run whole products on this CPU as the sparse product ('sparse', the default here) or
    as the gather a GPU runs ('gather')."""
    from gears_ddp.model import graph_conv

    assert graph_conv.uses_sparse_product(torch.zeros(1))
    if form == "gather":
        monkeypatch.setattr(graph_conv, "uses_sparse_product", lambda x: False)


@pytest.mark.parametrize("form", ["sparse", "gather"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outputs_and_gradients_equal_sgconv(seed, form, monkeypatch):
    _form(monkeypatch, form)
    ours, theirs = _pair(seed)
    ours.double(), theirs.double()
    edge_index, edge_weight = _graph(seed)
    x = torch.randn(N_NODES, CHANNELS, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ours = ours(x_ours, NormalisedAdjacency(edge_index, edge_weight, N_NODES))
    out_theirs = theirs(x_theirs, edge_index, edge_weight)
    torch.testing.assert_close(out_ours, out_theirs, rtol=1e-12, atol=1e-12)
    upstream = torch.randn_like(out_ours)
    (out_ours * upstream).sum().backward()
    (out_theirs * upstream).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-12, atol=1e-12)
    for name, parameter in theirs.named_parameters():
        torch.testing.assert_close(dict(ours.named_parameters())[name].grad, parameter.grad, rtol=1e-12, atol=1e-12)
    # a node whose only edge is a zero-weight self-loop receives nothing: its output is the bias
    torch.testing.assert_close(out_ours[N_NODES - 1], ours.lin.bias)


@pytest.mark.parametrize("form", ["sparse", "gather"])
def test_selected_rows_equal_those_of_the_whole_product(form, monkeypatch):
    """Rows asked for, in any order and repeated, cost only their own edges (a gather) and
    equal the same rows of the whole ``A_hat @ x`` in either form, gradients included."""
    _form(monkeypatch, form)
    edge_index, edge_weight = _graph(4)
    adjacency = NormalisedAdjacency(edge_index, edge_weight, N_NODES)
    x = torch.randn(N_NODES, CHANNELS, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    rows = torch.tensor([7, 0, N_NODES - 1, 7, N_NODES - 2])  # the last two: no edge but their self-loop
    x_whole, x_rows = x.clone().requires_grad_(), x.clone().requires_grad_()
    whole, selected = adjacency(x_whole)[rows], adjacency(x_rows, rows)
    torch.testing.assert_close(selected, whole, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(selected[2]) == 0  # a self-loop of weight 0
    torch.testing.assert_close(selected[4], x[N_NODES - 2])  # a self-loop of weight 1 only
    upstream = torch.randn_like(whole)
    (whole * upstream).sum().backward()
    (selected * upstream).sum().backward()
    torch.testing.assert_close(x_rows.grad, x_whole.grad, rtol=1e-12, atol=1e-12)


def test_gathers_in_pieces_equal_one_gather(monkeypatch):
    """On a CPU the gather runs a piece of nodes at a time (``MESSAGE_BYTES_PER_PIECE``): the
    same outputs and gradients as one gather of every node, and each piece is that small."""
    from gears_ddp.model import graph_conv

    _form(monkeypatch, "gather")
    edge_index, edge_weight = _graph(5)
    adjacency = NormalisedAdjacency(edge_index, edge_weight, N_NODES)
    x = torch.randn(N_NODES, CHANNELS, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    x_whole, x_pieces = x.clone().requires_grad_(), x.clone().requires_grad_()
    whole = adjacency(x_whole)
    gathered = []
    aggregated = graph_conv._aggregated
    monkeypatch.setattr(
        graph_conv,
        "_aggregated",
        lambda x, sources, weights: gathered.append(len(sources)) or aggregated(x, sources, weights),
    )
    node_bytes = adjacency.sources.shape[1] * CHANNELS * 8
    monkeypatch.setattr(graph_conv, "MESSAGE_BYTES_PER_PIECE", 4 * node_bytes)
    pieces = adjacency(x_pieces)
    assert gathered == [4] * (N_NODES // 4) + [N_NODES % 4]
    torch.testing.assert_close(pieces, whole, rtol=0, atol=0)
    upstream = torch.randn_like(whole)
    (whole * upstream).sum().backward()
    (pieces * upstream).sum().backward()
    torch.testing.assert_close(x_pieces.grad, x_whole.grad, rtol=1e-12, atol=1e-12)


def test_sparse_product_equals_the_gather_in_float32_and_under_bfloat16_autocast(monkeypatch):
    """The model's own precision: the sparse product (float32 at least, outside autocast,
    whose CPU kernel has no bfloat16) gives the gather's outputs and gradients in float32,
    and under CPU bfloat16 autocast the float32 result, cast."""
    from gears_ddp.model import graph_conv

    edge_index, edge_weight = _graph(6)
    adjacency = NormalisedAdjacency(edge_index, edge_weight.float(), N_NODES)
    x = torch.randn(N_NODES, CHANNELS, generator=torch.Generator().manual_seed(6))
    # bfloat16 values, so that a bfloat16 output's gradient is this same upstream gradient
    upstream = torch.randn(N_NODES, CHANNELS, generator=torch.Generator().manual_seed(7)).bfloat16().float()

    def run(x):
        x = x.clone().requires_grad_()
        out = adjacency(x)
        (out.float() * upstream).sum().backward()
        return out, x.grad

    sparse = run(x)
    half_out, half_grad = run(x.bfloat16())
    monkeypatch.setattr(graph_conv, "uses_sparse_product", lambda x: False)
    gathered = run(x)
    for ours, theirs in zip(sparse, gathered):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert half_out.dtype == half_grad.dtype == torch.bfloat16
    x_rounded = x.bfloat16().float()
    monkeypatch.setattr(graph_conv, "uses_sparse_product", lambda x: True)
    exact_out, exact_grad = run(x_rounded)
    torch.testing.assert_close(half_out, exact_out.bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(half_grad, exact_grad.bfloat16(), rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast_out, _ = run(x)
    assert autocast_out.dtype == torch.float32  # float32 in, float32 out: nothing cast to bfloat16
    torch.testing.assert_close(autocast_out, sparse[0], rtol=0, atol=0)


def test_sparse_matrices_move_copy_and_pickle_with_the_module():
    """The CSR arrays are buffers: ``.double()`` converts their values, a deep copy and a
    pickled copy carry them, and the state_dict leaves them out."""
    edge_index, edge_weight = _graph(8)
    adjacency = NormalisedAdjacency(edge_index, edge_weight.float(), N_NODES)
    x = torch.randn(N_NODES, CHANNELS, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    expected = NormalisedAdjacency(edge_index, edge_weight, N_NODES)(x)
    doubled = copy.deepcopy(adjacency).double()
    assert doubled.values.dtype == doubled.values_t.dtype == torch.float64
    assert adjacency.values.dtype == torch.float32
    torch.testing.assert_close(doubled(x), expected, rtol=1e-6, atol=1e-6)
    restored = pickle.loads(pickle.dumps(adjacency))
    torch.testing.assert_close(restored(x.float()), adjacency(x.float()), rtol=0, atol=0)
    assert adjacency.state_dict() == {}
    # the transpose holds the same edges, and a repeated edge is kept as each of its weights
    layered = torch.sparse_csr_tensor(
        adjacency.crow, adjacency.col, adjacency.values, (len(adjacency.crow) - 1, N_NODES), check_invariants=True
    ).to_dense()
    layered_t = torch.sparse_csr_tensor(
        adjacency.crow_t,
        adjacency.col_t,
        adjacency.values_t,
        (len(adjacency.crow_t) - 1, N_NODES),
        check_invariants=True,
    ).to_dense()
    layers = layered.view(-1, N_NODES, N_NODES)
    assert len(layers) > 1  # _graph repeats edges
    torch.testing.assert_close(layered_t.view(-1, N_NODES, N_NODES), layers.transpose(1, 2), rtol=0, atol=0)
    kept = torch.sort(layers[layers != 0]).values
    expected = torch.sort(adjacency.weights[adjacency.weights != 0]).values
    torch.testing.assert_close(kept, expected, rtol=0, atol=0)


def test_a_hub_s_outgoing_edges_fill_several_rows_of_the_backward_table(device, monkeypatch):
    """The whole product's backward pass gathers each node's outgoing edges from a table as
    wide as the forward pass's (the most incoming edges): a hub with more outgoing edges
    than that takes several rows, whose sums are added up. Its gradients are ``A_hat.T @
    grad`` (the dense matrix, float64), on each of the suite's devices (a GPU gathers
    anyway); with no hub every node takes one row and the backward pass scatters nothing
    (no ``index_add``)."""
    from gears_ddp.runtime.dispatch_count import DispatchCount

    _form(monkeypatch, "gather")
    hub = torch.stack([torch.zeros(N_NODES - 1, dtype=torch.long), torch.arange(1, N_NODES)])  # 0 -> every node
    ring = torch.stack([torch.arange(N_NODES), (torch.arange(N_NODES) + 1) % N_NODES])
    for edge_index, several_rows in ((torch.cat([hub, ring], 1), True), (ring, False)):
        edge_weight = torch.rand(edge_index.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(6))
        adjacency = NormalisedAdjacency(edge_index, edge_weight, N_NODES)
        dense = torch.zeros(N_NODES, N_NODES, dtype=torch.float64)
        nodes = torch.arange(N_NODES).view(-1, 1).expand_as(adjacency.sources)
        entries = (nodes.reshape(-1), adjacency.sources.reshape(-1))
        dense.index_put_(entries, adjacency.weights.reshape(-1), accumulate=True)
        assert (adjacency.nodes_t is not None) is several_rows
        if several_rows:  # the hub's N_NODES + 1 outgoing edges (the ring's, its self-loop) in rows 3 wide
            width = adjacency.sources.shape[1]
            assert width == 3 and len(adjacency.sources_t) == N_NODES - 1 + -(-(N_NODES + 1) // width)
        adjacency.to(device)
        x = torch.randn(N_NODES, CHANNELS, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
        x_on_device = x.to(device).requires_grad_()
        out = adjacency(x_on_device)
        torch.testing.assert_close(out.cpu(), dense @ x, rtol=1e-12, atol=1e-12)
        upstream = torch.randn_like(x)
        with DispatchCount() as count:
            out.backward(upstream.to(device))
        torch.testing.assert_close(x_on_device.grad.cpu(), dense.T @ upstream, rtol=1e-12, atol=1e-12)
        assert ("aten.index_add_.default" in count.operators) is several_rows
