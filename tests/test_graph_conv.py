"""The graph convolution equals torch_geometric's SGConv(K=1), which the published GEARS
uses: outputs, gradients, parameter names and initialisation."""
import pytest
import torch

from gears_ddp.model.graph_conv import NormalisedAdjacency, SimpleGraphConv
from reference_package import import_reference

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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outputs_and_gradients_equal_sgconv(seed):
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


def test_selected_rows_equal_those_of_the_whole_product():
    """Rows asked for, in any order and repeated, cost only their own edges and equal the
    same rows of the whole ``A_hat @ x``, gradients included."""
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

    edge_index, edge_weight = _graph(5)
    adjacency = NormalisedAdjacency(edge_index, edge_weight, N_NODES)
    x = torch.randn(N_NODES, CHANNELS, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    x_whole, x_pieces = x.clone().requires_grad_(), x.clone().requires_grad_()
    whole = adjacency(x_whole)
    gathered = []
    aggregated = graph_conv._aggregated
    monkeypatch.setattr(graph_conv, "_aggregated", lambda x, sources, weights: gathered.append(len(sources))
                        or aggregated(x, sources, weights))
    node_bytes = adjacency.sources.shape[1] * CHANNELS * 8
    monkeypatch.setattr(graph_conv, "MESSAGE_BYTES_PER_PIECE", 4 * node_bytes)
    pieces = adjacency(x_pieces)
    assert gathered == [4] * (N_NODES // 4) + [N_NODES % 4]
    torch.testing.assert_close(pieces, whole, rtol=0, atol=0)
    upstream = torch.randn_like(whole)
    (whole * upstream).sum().backward()
    (pieces * upstream).sum().backward()
    torch.testing.assert_close(x_pieces.grad, x_whole.grad, rtol=1e-12, atol=1e-12)
