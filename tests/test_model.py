"""The GEARS network: checkpoint format and outputs of the published model, and the
distinct-set computation equal to the per-cell one (outputs, gradients, running stats)."""

import contextlib
import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from model_fixtures import HIDDEN, N_GENES, N_PERTS, make_model, model_graphs, random_batch
from reference_package import import_reference

from gears_ddp.data.perturbation_sets import distinct_perturbation_sets
from gears_ddp.model import weighted_norm
from gears_ddp.model.network import PERT_EMB_LAMBDA, GEARSModel, renormalise


def _reference_model(uncertainty, graphs=None):
    """The published model on ``graphs`` ((co-expression edges, weights), (GO edges,
    weights)), by default those of ``make_model``'s model."""
    module = import_reference("gears.model")
    (coexpress, coexpress_weight), (go, go_weight) = graphs or model_graphs()
    args = dict(
        num_genes=N_GENES,
        num_perts=N_PERTS,
        hidden_size=HIDDEN,
        uncertainty=uncertainty,
        num_go_gnn_layers=1,
        num_gene_gnn_layers=1,
        decoder_hidden_size=16,
        no_perturb=False,
        G_coexpress=coexpress,
        G_coexpress_weight=coexpress_weight,
        G_go=go,
        G_go_weight=go_weight,
        device="cpu",
    )
    with contextlib.redirect_stdout(io.StringIO()):
        return module.GEARS_Model(args)


def _reference_batch(x, pert_idx):
    from torch_geometric.data import Batch, Data

    return Batch.from_data_list(
        [
            Data(x=x[i].reshape(-1, 1), pert_idx=[p for p in pert_idx[i].tolist() if p >= 0] or [-1])
            for i in range(len(x))
        ]
    )


def _trained_a_little(model, steps=3):
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        x, pert_idx = random_batch(seed=step + 10)
        out = model(x, pert_idx)
        loss = sum(o.square().mean() for o in (out if isinstance(out, tuple) else (out,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.zero_grad(set_to_none=True)  # deepcopy does not copy .grad: start copies equal
    return model.eval()


@pytest.mark.parametrize("uncertainty", [False, True])
def test_checkpoints_load_both_ways_and_initialisation_matches(uncertainty):
    ours = make_model(uncertainty)
    torch.manual_seed(0)
    theirs = _reference_model(uncertainty)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    trained = _trained_a_little(make_model(uncertainty))
    theirs.load_state_dict(trained.state_dict(), strict=True)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), trained.state_dict().values()))


@pytest.mark.parametrize("uncertainty", [False, True])
def test_outputs_equal_the_published_model_at_batch_size_one(uncertainty):
    ours = _trained_a_little(make_model(uncertainty))
    theirs = _reference_model(uncertainty)
    theirs.load_state_dict(ours.state_dict())
    theirs.eval()
    x, pert_idx = random_batch(batch_size=6, seed=4)
    with torch.no_grad():
        for i in range(len(x)):  # each cell alone
            mine, reference = (
                ours(x[i : i + 1], pert_idx[i : i + 1]),
                theirs(_reference_batch(x[i : i + 1], pert_idx[i : i + 1])),
            )
            for a, b in zip(*(o if uncertainty else (o,) for o in (mine, reference))):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        mine, reference = ours(x, pert_idx), theirs(_reference_batch(x, pert_idx))  # first cell of a batch
        for a, b in zip(*(o if uncertainty else (o,) for o in (mine, reference))):
            torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-5)


def test_training_step_equals_the_published_model_on_every_cell_without_coexpression_edges():
    """The published model gives only a batch's first cell the co-expression messages.
    Without co-expression edges the two are the same function for every cell: in training
    mode on a batch of 32, outputs, gradients and running statistics agree (float64)."""
    no_edges = (torch.zeros(2, 0, dtype=torch.long), torch.zeros(0))
    _, go = model_graphs()
    torch.manual_seed(0)
    ours = GEARSModel(N_GENES, N_PERTS, *no_edges, *go, hidden_size=HIDDEN).double().train()
    theirs = _reference_model(False, (no_edges, go))
    theirs.load_state_dict(ours.state_dict())
    theirs.double().train()
    x, pert_idx = random_batch(batch_size=32, seed=3)
    mine, reference = ours(x.double(), pert_idx), theirs(_reference_batch(x.double(), pert_idx))
    torch.testing.assert_close(mine, reference, rtol=1e-10, atol=1e-10)
    upstream = torch.randn_like(mine)
    (mine * upstream).sum().backward()
    (reference * upstream).sum().backward()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-11, msg=name)
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


def _naive_gene_embeddings(model, n_cells):
    """The per-gene part on the rows of every cell (n_cells x G x H), as the published model
    runs it, with the co-expression messages for every cell."""
    renormalise(model.gene_emb, model.emb_pos, model.pert_emb)
    positional = model._propagate(model.emb_pos.weight, model.layers_emb_pos, model.coexpress_graph)
    base = F.relu(model.bn_emb(model.gene_emb.weight.repeat(n_cells, 1)))
    return model.emb_trans_v2(base + PERT_EMB_LAMBDA * positional.repeat(n_cells, 1)).reshape(n_cells, N_GENES, -1)


def _naive_forward(model, x, pert_idx):
    """The per-cell computation: one row per cell (per cell and gene) through every
    BatchNorm, as the published model does."""
    n_cells = len(x)
    genes = _naive_gene_embeddings(model, n_cells)
    pert_emb = model.perturbation_embeddings()
    summed, rows = [], []
    for cell in range(n_cells):
        members = [p for p in pert_idx[cell].tolist() if p >= 0]
        if members:
            summed.append(pert_emb[members].sum(0))
            rows.append(cell)
    shift = torch.zeros(n_cells, HIDDEN, dtype=x.dtype)
    if rows:
        stacked = torch.stack(summed)
        fused = model.pert_fuse(stacked.repeat(2, 1))[:1] if len(rows) == 1 else model.pert_fuse(stacked)
        shift = shift.index_copy(0, torch.tensor(rows), fused)
    hidden = (genes + shift.unsqueeze(1)).reshape(n_cells * N_GENES, HIDDEN)
    hidden = F.relu(model.bn_pert_base(hidden))
    decoded = model.recovery_w(hidden).reshape(n_cells, N_GENES, HIDDEN)
    gene_out = (decoded.unsqueeze(-1) * model.indv_w1).sum(2) + model.indv_b1
    cross = model.cross_gene_state(gene_out.squeeze(2))
    joined = torch.cat([gene_out, cross.unsqueeze(1).expand(-1, N_GENES, -1)], 2)
    effect = (joined * model.indv_w2).sum(2) + model.indv_b2
    logvar = model.uncertainty_w(hidden).reshape(n_cells, N_GENES) if model.uncertainty else None
    return effect + x, logvar


def test_row_pieces_are_small_on_a_cpu_and_large_on_a_gpu():
    """A Norman-size batch's rows (25 sets x 5,000 genes): one set per piece on a CPU (in
    cache), all in one piece on a GPU (one launch per operation); every block in one piece."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    for device, expected in ((cpu, [slice(i, i + 1) for i in range(25)]), (gpu, [slice(0, 25)])):
        assert weighted_norm.block_slices(25, 5000, device) == expected
    assert weighted_norm.block_slices(22, 1000, cpu) == [slice(i, min(i + 4, 22)) for i in range(0, 22, 4)]


def _sums_as(monkeypatch, sums: str) -> None:
    """Sums over rows on a CPU as matrix-vector products (one thread) or as torch's
    reductions (several), whatever this process's thread count."""
    as_products = sums == "products"
    monkeypatch.setattr(
        weighted_norm, "sums_as_products", lambda device: weighted_norm.in_cache_pieces(device) and as_products
    )


def test_sums_over_rows_are_products_on_a_gpu_and_on_one_cpu_thread():
    threads = torch.get_num_threads()
    try:
        for n_threads, expected in ((1, True), (2, False)):
            torch.set_num_threads(n_threads)
            assert weighted_norm.sums_as_products(torch.device("cpu")) is expected
            assert weighted_norm.sums_as_products(torch.device("cuda"))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("sums", ["products", "reductions"])
@pytest.mark.parametrize("rows_per_pass", [4096, 50])
def test_weighted_row_sums_weight_every_row_by_its_block_share(sums, rows_per_pass, monkeypatch):
    """``RowShares`` against the sums written out in float64: of all blocks and of a slice of
    them, of the rows and of their squares, one row per block or many, in one piece or many."""
    _sums_as(monkeypatch, sums)
    monkeypatch.setattr(weighted_norm, "ROWS_PER_PASS", rows_per_pass)
    generator = torch.Generator().manual_seed(3)
    for n_blocks, rows_per_block in ((7, 1), (5, 30)):
        shares = torch.rand(n_blocks, generator=generator, dtype=torch.float64)
        x = torch.randn(n_blocks * rows_per_block, 6, generator=generator, dtype=torch.float64)
        per_row = shares.repeat_interleave(rows_per_block).view(-1, 1)
        weights = weighted_norm.RowShares(shares, rows_per_block)
        torch.testing.assert_close(weights.sum(x).view(-1), (per_row * x).sum(0), rtol=1e-12, atol=0)
        torch.testing.assert_close(weights.sum_of_squares(x).view(-1), (per_row * x * x).sum(0), rtol=1e-12, atol=0)
        part = slice(1, 3)
        rows = slice(rows_per_block, 3 * rows_per_block)
        torch.testing.assert_close(
            weights.sum(x[rows], part).view(-1), (per_row[rows] * x[rows]).sum(0), rtol=1e-12, atol=0
        )
    torch.testing.assert_close(weighted_norm.first_dim_sum(x), x.sum(0), rtol=1e-12, atol=0)


@pytest.mark.parametrize("sums", ["products", "reductions"])
@pytest.mark.parametrize("rows_per_pass", [4096, 50])
@pytest.mark.parametrize("uncertainty", [False, True])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_distinct_sets_equal_per_cell_computation(mode, uncertainty, rows_per_pass, sums, monkeypatch):
    """In float64, so that equality is tested well below float32 rounding. The naive path
    runs autograd's unfused BatchNorm, ReLU and Linear; the fast one the fused blocks, in
    one piece of rows or (50 rows per pass) a set of genes at a time, its sums over rows as
    products or as reductions (``weighted_norm.sums_as_products``)."""
    monkeypatch.setattr(weighted_norm, "ROWS_PER_PASS", rows_per_pass)
    _sums_as(monkeypatch, sums)
    fast = make_model(uncertainty=uncertainty)
    fast = (_trained_a_little(fast) if mode == "eval" else fast.train()).double()
    naive = copy.deepcopy(fast)
    x, pert_idx = random_batch(batch_size=16, seed=7)
    x = x.double()
    out = fast(x, pert_idx)
    pred, logvar = out if uncertainty else (out, torch.zeros(()))
    pred_naive, logvar_naive = _naive_forward(naive, x, pert_idx)
    logvar_naive = torch.zeros(()) if logvar_naive is None else logvar_naive
    torch.testing.assert_close(pred, pred_naive, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logvar, logvar_naive, rtol=1e-10, atol=1e-10)
    weights = torch.rand_like(pred)
    ((pred * weights).sum() + logvar.square().sum()).backward()
    ((pred_naive * weights).sum() + logvar_naive.square().sum()).backward()
    # one absolute scale for all: a bias that feeds a BatchNorm has a gradient of zero up to rounding
    scale = max(float(p.grad.abs().max()) for p in naive.parameters() if p.grad is not None)
    for (name, a), b in zip(fast.named_parameters(), naive.parameters()):
        if a.grad is None:
            assert b.grad is None or torch.count_nonzero(b.grad) == 0, name
        else:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-9 * scale, msg=name)
    for (name, a), b in zip(fast.named_buffers(), naive.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


def test_fused_and_plain_decoders_compute_the_same_training_step(device, monkeypatch):
    """``fused_decoder = False`` runs the module chain instead of ``set_decoder.decode_sets``:
    the same outputs, parameter gradients and running statistics (float64)."""
    import gears_ddp.model.network as model_module

    calls = []
    decode_sets = model_module.decode_sets
    monkeypatch.setattr(model_module, "decode_sets", lambda *args: calls.append(1) or decode_sets(*args))
    fused = make_model().train().double().to(device)
    plain = copy.deepcopy(fused)
    plain.fused_decoder = False
    x, pert_idx = random_batch(batch_size=16, seed=7)
    x, pert_idx = x.double().to(device), pert_idx.to(device)
    weights = torch.rand(16, N_GENES, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    outputs = []
    for model, expected_calls in ((fused, 1), (plain, 1)):
        out = model(x, pert_idx)
        (out * weights).sum().backward()
        outputs.append(out.detach())
        assert len(calls) == expected_calls  # the fused path called decode_sets, the plain one did not
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-10, atol=1e-10)
    scale = max(float(p.grad.abs().max()) for p in plain.parameters() if p.grad is not None)
    for (name, a), b in zip(fused.named_parameters(), plain.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-7, atol=1e-9 * scale, msg=name)
    for (name, a), b in zip(fused.named_buffers(), plain.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


def test_the_decoder_keeps_its_row_buffers_between_steps_and_lends_them_to_one_pass_at_a_time():
    """The fused decoder's row buffers are the same memory from step to step; a second pass
    before the first one's backward gets its own (both give the gradients each gives alone);
    evaluation mode and copies of the network hold none."""
    from gears_ddp.model.set_decoder import RowBuffers, decode_sets

    model = make_model().train().double()
    pointers = []
    for seed in (3, 4):
        model(
            *[t.double() if t.is_floating_point() else t for t in random_batch(batch_size=12, seed=seed)]
        ).square().sum().backward()
        pointers.append({name: buffer.data_ptr() for name, buffer in model.decoder_buffers._buffers.items()})
        assert not model.decoder_buffers.borrowed
    assert set(pointers[0]) == {"centred1", "centred2", "grad_a1"} and pointers[1] == pointers[0]
    assert copy.deepcopy(model).decoder_buffers._buffers == {}
    assert pickle.loads(pickle.dumps(model)).decoder_buffers._buffers == {}

    generator = torch.Generator().manual_seed(0)
    inputs = [
        (
            torch.randn(N_GENES, HIDDEN, dtype=torch.float64, generator=generator).requires_grad_(),
            torch.randn(3, HIDDEN, dtype=torch.float64, generator=generator).requires_grad_(),
        )
        for _ in range(2)
    ]
    counts = torch.tensor([2, 1, 3])

    def decoded(genes, shifts, buffers):
        return decode_sets(
            genes,
            shifts,
            counts,
            6,
            model.bn_pert_base,
            model.recovery_w,
            model.indv_w1[:, :, 0],
            model.indv_b1[:, 0],
            False,
            buffers,
        )

    alone = []
    for genes, shifts in inputs:
        decoded(genes, shifts, RowBuffers()).square().sum().backward()
        alone.append((genes.grad.clone(), shifts.grad.clone()))
        genes.grad = shifts.grad = None
    kept = RowBuffers()
    outputs = [decoded(genes, shifts, kept) for genes, shifts in inputs]  # both before either backward
    sum(out.square().sum() for out in outputs).backward()
    for (genes, shifts), (genes_grad, shifts_grad) in zip(inputs, alone):
        torch.testing.assert_close(genes.grad, genes_grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(shifts.grad, shifts_grad, rtol=1e-12, atol=1e-12)
    assert not kept.borrowed and set(kept._buffers) == {"centred1", "centred2", "grad_a1"}
    model.eval()
    assert model.decoder_buffers._buffers == {}


def test_fused_and_plain_decoders_are_alike_accurate_under_bfloat16_autocast(device, monkeypatch):
    """Under bfloat16 autocast the fused decoder runs its products in bfloat16 on inputs it
    keeps for the backward pass (``set_decoder._inputs_buffer``), and its other arithmetic in
    float32, as autocast runs the module chain. Each is measured against the float64 step
    (no autocast): the fused decoder's error in the outputs, every parameter gradient and the
    running statistics is at most twice the module chain's, give or take 2**-9 of the
    largest value. (The two are not compared with each other: each is within bfloat16
    rounding of the truth, but a GPU's bfloat16 products may round at other points for the
    two paths' product shapes, so their difference can reach the sum of both errors; and
    a decoder computing something else would be far less accurate than the chain.)"""
    import gears_ddp.model.network as model_module

    calls = []
    decode_sets = model_module.decode_sets
    monkeypatch.setattr(model_module, "decode_sets", lambda *args: calls.append(1) or decode_sets(*args))
    model = make_model().train()
    x, pert_idx = random_batch(batch_size=16, seed=7)
    weights = torch.rand(16, N_GENES, generator=torch.Generator().manual_seed(2))

    def step(fused: bool, dtype: torch.dtype, autocast: bool):
        """Output, parameter gradients and buffers of one training-mode step, in float64 on the host."""
        network = copy.deepcopy(model).to(device, dtype)
        network.fused_decoder = fused
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = network(x.to(device, dtype), pert_idx.to(device))
        (out.to(dtype) * weights.to(device, dtype)).sum().backward()
        values = {"output": out}
        values.update({f"{name}.grad": p.grad for name, p in network.named_parameters() if p.grad is not None})
        values.update({name: b for name, b in network.named_buffers() if b.is_floating_point()})
        return {name: value.detach().double().cpu() for name, value in values.items()}

    truth = step(True, torch.float64, False)
    fused, plain = step(True, torch.float32, True), step(False, torch.float32, True)
    assert len(calls) == 2  # the float64 and the autocast fused steps called decode_sets, the plain one did not
    assert fused.keys() == plain.keys() == truth.keys()
    scale = {"grad": max(float(v.abs().max()) for k, v in truth.items() if k.endswith(".grad"))}
    for name, expected in truth.items():
        largest = scale["grad"] if name.endswith(".grad") else float(expected.abs().max())
        fused_error = float((fused[name] - expected).abs().max())
        plain_error = float((plain[name] - expected).abs().max())
        assert fused_error <= 2 * plain_error + 2**-9 * largest, (
            f"{name}: the fused decoder is off the float64 step by {fused_error:.3g}, the module chain by "
            f"{plain_error:.3g} (largest value {largest:.3g})"
        )


def test_a_single_perturbed_cell_in_training_mode_works():
    """The published model feeds ``pert_fuse`` that one row twice; a weighted single row is
    the same BatchNorm, running statistics included. Zero variance amplifies rounding by
    1/sqrt(eps), hence float64."""
    model = make_model().train().double()
    naive = copy.deepcopy(model)
    x, _ = random_batch(batch_size=3)
    pert_idx = torch.tensor([[-1, -1], [4, -1], [-1, -1]])
    pred_naive, _ = _naive_forward(naive, x.double(), pert_idx)
    torch.testing.assert_close(model(x.double(), pert_idx), pred_naive, rtol=1e-8, atol=1e-8)
    # a row's unbiased variance is its (zero) variance, as that of the two equal rows
    for (name, ours), theirs in zip(model.named_buffers(), naive.buffers()):
        torch.testing.assert_close(ours, theirs, rtol=1e-8, atol=1e-8, msg=name)


@pytest.mark.parametrize("columns", [1, 2, 3])
def test_distinct_sets_are_the_sorted_unique_rows(columns):
    """The integer keys give what unique over rows gives: the same sets in the same order
    (which fixes the order of the per-set rows), each cell's set and the counts; a pair and
    its swap are one set."""
    generator = torch.Generator().manual_seed(columns)
    n_perts = 7
    pert_idx = torch.randint(-1, n_perts, (200, columns), generator=generator)
    pert_idx[:20] = n_perts - 1  # the largest index in every column
    pert_idx[20:40] = -1
    sets, cell_set, counts = distinct_perturbation_sets(pert_idx, n_perts)
    expected = torch.unique(torch.sort(pert_idx, dim=1)[0], dim=0, return_inverse=True, return_counts=True)
    for got, want in zip((sets, cell_set, counts), expected):
        assert torch.equal(got, want)
    if columns == 2:
        swapped, _, _ = distinct_perturbation_sets(pert_idx.flip(1), n_perts)
        assert torch.equal(swapped, sets)


def test_no_perturb_returns_the_input():
    model = make_model()
    model.no_perturb = True
    x, pert_idx = random_batch()
    assert torch.equal(model(x, pert_idx), x)


def test_positional_weight_is_the_published_constant():
    assert PERT_EMB_LAMBDA == 0.2


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("counts_as", ["a count per block", "one count for every row"])
def test_weighted_batchnorm_is_batchnorm_of_the_expanded_rows_running_statistics_too(momentum, counts_as):
    """Rows weighted by counts normalise, and move the running statistics (an exponential
    average, or with ``momentum=None`` the cumulative one), as ``BatchNorm1d`` does on each
    row repeated its count of times, over three batches; evaluation then uses them alike."""
    from gears_ddp.model.weighted_norm import WeightedBatchNorm1d

    generator = torch.Generator().manual_seed(0)
    weighted = WeightedBatchNorm1d(4, momentum=momentum).double().train()
    plain = torch.nn.BatchNorm1d(4, momentum=momentum).double().train()
    for n_rows in (5, 7, 3):
        x = torch.randn(n_rows, 4, generator=generator, dtype=torch.float64) * 2 + 1
        if counts_as == "a count per block":
            counts = torch.randint(1, 4, (n_rows,), generator=generator)
            expanded = x.repeat_interleave(counts, dim=0)
            out = weighted(x, counts)
            torch.testing.assert_close(out.repeat_interleave(counts, dim=0), plain(expanded))
        else:
            out = weighted(x, 3)
            torch.testing.assert_close(out, plain(x.repeat_interleave(3, dim=0))[::3])
    torch.testing.assert_close(weighted.running_mean, plain.running_mean)
    torch.testing.assert_close(weighted.running_var, plain.running_var)
    assert int(weighted.num_batches_tracked) == int(plain.num_batches_tracked) == 3
    probe = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(weighted.eval()(probe), plain.eval()(probe))


def test_weighted_batchnorm_keeps_half_precision_inputs_finite():
    """Under mixed precision the statistics are computed in float32 (as autocast does for
    BatchNorm): float16 sums over 20,000 rows of values around 40 would overflow."""
    from gears_ddp.model.weighted_norm import WeightedBatchNorm1d

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(20000, 8, generator=generator) * 3 + 40
    weights = torch.randint(1, 5, (20000,), generator=generator)
    expected = WeightedBatchNorm1d(8).double().train()(x.double(), weights)
    for dtype in (torch.float16, torch.bfloat16):
        half = x.to(dtype).requires_grad_()
        out = WeightedBatchNorm1d(8).train()(half, weights)
        out.sum().backward()
        assert out.dtype == torch.float32 and half.grad.dtype == dtype and bool(torch.isfinite(half.grad).all())
        torch.testing.assert_close(
            out.double(), WeightedBatchNorm1d(8).double().train()(half.detach().double(), weights), rtol=1e-3, atol=1e-3
        )  # float32 statistics over 20,000 rows
        assert float((out.double() - expected).abs().max().detach()) < 0.2  # only the input's own rounding


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_batchnorm_relu_linear_equals_the_unfused_modules(autocast):
    """``relu_linear`` (training mode, row weights) against BatchNorm1d on the expanded rows,
    ReLU and Linear through autograd: outputs, every gradient and the running statistics;
    in float64, and under bfloat16 autocast within bfloat16 rounding."""
    from gears_ddp.model.weighted_norm import WeightedBatchNorm1d

    generator = torch.Generator().manual_seed(3)
    dtype = torch.float32 if autocast else torch.float64
    x = torch.randn(50, 6, generator=generator, dtype=dtype) * 2 + 1
    counts = torch.randint(1, 4, (50,), generator=generator)
    norm, linear = WeightedBatchNorm1d(6).to(dtype), torch.nn.Linear(6, 4).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=generator)
        norm.bias.uniform_(-0.5, 0.5, generator=generator)
    plain_norm, plain_linear = copy.deepcopy(norm), copy.deepcopy(linear)
    upstream = torch.randn(50, 4, generator=generator, dtype=dtype)
    x_fused, x_plain = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        fused = norm.relu_linear(x_fused, counts, linear)
        expanded = plain_linear(F.relu(torch.nn.BatchNorm1d.forward(plain_norm, x_plain.repeat_interleave(counts, 0))))
        plain = expanded[torch.cumsum(counts, 0) - 1]  # the rows of a weighted row are identical
    assert fused.dtype == plain.dtype
    # a weighted row's gradient is the sum of its copies' gradients
    (fused.to(dtype) * upstream * counts.unsqueeze(1)).sum().backward()
    (expanded.to(dtype) * upstream.repeat_interleave(counts, 0)).sum().backward()

    def assert_close(actual, expected, name):
        # bfloat16 keeps 8 bits: sums in a different order differ by a few units of the largest value
        scale = 2e-2 * float(expected.detach().abs().max()) if autocast else 1e-10
        torch.testing.assert_close(actual, expected, rtol=0, atol=scale, msg=name)

    assert_close(fused, plain, "output")
    assert_close(x_fused.grad, x_plain.grad, "input gradient")
    for a, b in ((norm, plain_norm), (linear, plain_linear)):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert p.grad.dtype == q.grad.dtype, name
            assert_close(p.grad, q.grad, name)
    for (name, p), q in zip(norm.named_buffers(), plain_norm.buffers()):
        assert_close(p, q, name)
