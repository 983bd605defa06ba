"""The GEARS network: tensors in, tensors out (no I/O, no devices, no ranks).

Parameter names, shapes and initialisation are those of the published ``GEARS_Model``, so
state dicts load both ways with ``strict=True``. The mathematics is the same; the work is
not: the per-gene part and the GO GNN are computed once per batch, not on B x G repeated
rows (so every cell, not only a batch's first, receives the co-expression messages: the
model the paper describes); everything before ``+ x`` is computed once per distinct
perturbation set in the batch (found by the loaders, ``gears_ddp.data.perturbation_sets``),
with every BatchNorm given the per-cell statistics; in training mode the per-gene decoder
is one autograd function (``gears_ddp.model.set_decoder``; ``fused_decoder = False`` runs
the plain module chain, a test holds the two equal). A training step never makes the host
wait for the device (``tests/test_device_work.py``), and the graphs' normalised
adjacencies are computed once, when the model is built.

docs/differences.md says what is the same as the published model and what is not, and why.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from gears_ddp.data.perturbation_sets import PerturbationSets
from gears_ddp.model.graph_conv import NormalisedAdjacency, SimpleGraphConv
from gears_ddp.model.linear import linear
from gears_ddp.model.model_options import ModelOptions
from gears_ddp.model.set_decoder import RowBuffers, decode_sets
from gears_ddp.model.weighted_norm import WeightedBatchNorm1d, running_statistics_together

PERT_EMB_LAMBDA = 0.2  # weight of the co-expression (positional) embedding
DEFAULTS = ModelOptions.defaults()  # the network's options default to the model options' one definition
NETWORK_OPTIONS = (
    "hidden_size",
    "num_go_gnn_layers",
    "num_gene_gnn_layers",
    "decoder_hidden_size",
    "uncertainty",
    "no_perturb",
)  # the model options the network itself takes


class MLP(nn.Module):
    """``network`` = per step Linear, BatchNorm1d, ReLU, without the final ReLU (the
    published module layout, so the ``network.{i}`` names match)."""

    def __init__(self, sizes: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(n_in, n_out), WeightedBatchNorm1d(n_out), nn.ReLU()]
        self.network = nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor, set_counts: torch.Tensor | int | None = None) -> torch.Tensor:
        """Each (BatchNorm, ReLU, Linear) step through ``WeightedBatchNorm1d.relu_linear``;
        ``set_counts`` weight the BatchNorms' rows (see ``WeightedBatchNorm1d``)."""
        return self._after_first(linear(x, self.linear_layer(0)), set_counts)

    def per_cell(self, x: torch.Tensor, cells: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        """The layers with one row per cell: the first Linear on ``x``'s rows (one per set),
        the rest on those rows repeated for each cell (``cells``: the row of ``x`` of each
        cell), so that each BatchNorm's own kernel computes the per-cell statistics; returns
        the result's rows ``picked`` (one per set)."""
        return self._after_first(linear(x, self.linear_layer(0)).index_select(0, cells), None).index_select(0, picked)

    def _after_first(self, x: torch.Tensor, set_counts) -> torch.Tensor:
        layers = list(self.network)
        for step in range(1, len(layers) - 1, 3):
            x = self.norm_layer(step).relu_linear(x, set_counts, self.linear_layer(step + 2))
        return layers[-1](x, set_counts)

    def linear_layer(self, i: int) -> nn.Linear:
        """Layer ``i`` of ``network``, one of its Linears (``__init__`` lays them out)."""
        return cast(nn.Linear, self.network[i])

    def norm_layer(self, i: int) -> WeightedBatchNorm1d:
        """Layer ``i`` of ``network``, one of its BatchNorms (``__init__`` lays them out)."""
        return cast(WeightedBatchNorm1d, self.network[i])

    def synchronizing(self) -> bool:
        """Whether its BatchNorms' statistics are those of all ranks (``sync_batchnorm``)."""
        return self.norm_layer(1).synchronizing()


def renormalise(*embeddings: nn.Embedding) -> None:
    """Renormalise ``max_norm`` embedding tables in place, as looking up all their rows does.

    Looking up a row of ``nn.Embedding(max_norm=...)`` rescales it, in place and without
    gradient, to ``max_norm / (norm + 1e-7)`` times itself when its norm exceeds
    ``max_norm``; ``Tensor.renorm_`` does the same to every row of a table in one operation.
    It runs outside ``torch.compile``'s graphs: their inductor backend gives wrong gradients
    for a parameter changed in place within a compiled forward pass. (``torch.compiler.disable``
    is applied when a graph is traced, not when this module is imported: applying it imports
    the compiler and sympy, seconds added to every command that imports the library.)
    """
    if torch.compiler.is_compiling():
        # made here, as the graph is traced (dynamo traces this call and breaks the graph at the
        # disabled function); a cache around it would be traced through all the same
        torch.compiler.disable(_renormalise)(*embeddings)
    else:
        _renormalise(*embeddings)


def _renormalise(*embeddings: nn.Embedding) -> None:
    with torch.no_grad():
        for embedding in embeddings:
            if embedding.max_norm is not None:  # a lookup rescales rows only under a max_norm
                embedding.weight.renorm_(embedding.norm_type, 0, embedding.max_norm)


class GEARSModel(nn.Module):
    """GEARS: predicts a cell's expression after perturbing a set of genes.

    ``forward(x, pert_idx)``: ``x`` (B x G) control expression, ``pert_idx`` (B x 2) indices
    in the perturbation vocabulary, -1 padded. Returns the prediction (B x G), and with
    ``uncertainty`` also the log-variance (B x G).
    """

    def __init__(
        self,
        num_genes: int,
        num_perts: int,
        coexpress_edge_index: torch.Tensor,
        coexpress_edge_weight: torch.Tensor,
        go_edge_index: torch.Tensor,
        go_edge_weight: torch.Tensor,
        hidden_size: int = DEFAULTS["hidden_size"],
        num_go_gnn_layers: int = DEFAULTS["num_go_gnn_layers"],
        num_gene_gnn_layers: int = DEFAULTS["num_gene_gnn_layers"],
        decoder_hidden_size: int = DEFAULTS["decoder_hidden_size"],
        uncertainty: bool = DEFAULTS["uncertainty"],
        no_perturb: bool = DEFAULTS["no_perturb"],
    ):
        super().__init__()
        self.num_genes, self.num_perts = num_genes, num_perts
        self.uncertainty, self.no_perturb = uncertainty, no_perturb
        self.fused_decoder = True  # training decodes with set_decoder.decode_sets (else the module chain)
        self.decoder_buffers = RowBuffers()  # its row buffers, kept from step to step while training
        self.decoder_hidden_size = decoder_hidden_size  # kept in the config; unused, as in the reference
        h = hidden_size
        # Modules are created in the published order with the published initialisation,
        # so the same torch seed gives the same initial weights.
        self.pert_w = nn.Linear(1, h)  # unused in forward; part of the checkpoint format
        self.gene_emb = nn.Embedding(num_genes, h, max_norm=True)
        self.pert_emb = nn.Embedding(num_perts, h, max_norm=True)
        self.emb_trans_v2 = MLP([h, h, h])
        self.pert_fuse = MLP([h, h, h])
        self.emb_pos = nn.Embedding(num_genes, h, max_norm=True)
        self.layers_emb_pos = nn.ModuleList(SimpleGraphConv(h, h) for _ in range(num_gene_gnn_layers))
        self.sim_layers = nn.ModuleList(SimpleGraphConv(h, h) for _ in range(num_go_gnn_layers))
        self.recovery_w = MLP([h, 2 * h, h])
        self.indv_w1 = nn.Parameter(torch.rand(num_genes, h, 1))
        self.indv_b1 = nn.Parameter(torch.rand(num_genes, 1))
        nn.init.xavier_normal_(self.indv_w1)
        nn.init.xavier_normal_(self.indv_b1)
        self.cross_gene_state = MLP([num_genes, h, h])
        self.indv_w2 = nn.Parameter(torch.rand(1, num_genes, h + 1))
        self.indv_b2 = nn.Parameter(torch.rand(1, num_genes))
        nn.init.xavier_normal_(self.indv_w2)
        nn.init.xavier_normal_(self.indv_b2)
        self.bn_emb = WeightedBatchNorm1d(h)
        self.bn_pert_base = WeightedBatchNorm1d(h)
        self.bn_pert_base_trans = WeightedBatchNorm1d(h)  # unused in forward; part of the checkpoint format
        if uncertainty:
            self.uncertainty_w = MLP([h, 2 * h, h, 1])
        # never used in forward: no gradients (DistributedDataParallel would wait for them)
        self.pert_w.requires_grad_(False)
        self.bn_pert_base_trans.requires_grad_(False)
        # the graphs' normalised adjacencies: they move with the module, outside the checkpoint
        self.coexpress_graph = NormalisedAdjacency(coexpress_edge_index, coexpress_edge_weight.float(), num_genes)
        self.go_graph = NormalisedAdjacency(go_edge_index, go_edge_weight.float(), num_perts)

    @staticmethod
    def _propagate(h, layers, adjacency, rows: torch.Tensor | None = None):
        """Graph convolutions with ReLU between them (not after the last); with ``rows``,
        only those rows of the result (the last convolution computes only them)."""
        if not len(layers):
            return h if rows is None else h[rows]
        for layer in layers[:-1]:
            h = layer(h, adjacency).relu()
        return layers[-1](h, adjacency, rows)

    def gene_embeddings(self, n_cells: int) -> torch.Tensor:
        """Per-gene base embedding (G x H) from the renormalised tables (``renormalise``), the
        same for every cell of a batch of ``n_cells``. Its BatchNorms count the G rows
        ``n_cells`` times, as the published model runs them on the rows of every cell: the
        batch statistics are those of G rows, the running variance's unbiased correction that
        of n_cells x G."""
        base = F.relu(self.bn_emb(self.gene_emb.weight, n_cells))
        positional = self._propagate(self.emb_pos.weight, self.layers_emb_pos, self.coexpress_graph)
        return self.emb_trans_v2(torch.add(base, positional, alpha=PERT_EMB_LAMBDA), n_cells)

    def perturbation_embeddings(self, genes: torch.Tensor | None = None) -> torch.Tensor:
        """GO-propagated embedding of every vocabulary gene (P x H), or of ``genes`` only,
        from the renormalised table (``renormalise``: all of it, as the published model looks
        it all up)."""
        return self._propagate(self.pert_emb.weight, self.sim_layers, self.go_graph, genes)

    def renormalise_embeddings(self) -> None:
        """Renormalise the embedding tables a forward pass looks up (``renormalise``), as a
        forward pass does first. A rank that runs no forward pass in an evaluation calls it,
        so that its weights stay those of the ranks that do."""
        if not self.no_perturb:
            renormalise(self.gene_emb, self.emb_pos, self.pert_emb)

    def set_effects(self, sets: PerturbationSets):
        """Predicted change from control (S x G) for each of ``sets.sets``, and the
        log-variance (S x G) in uncertainty mode (else None). In training mode the sets are
        a batch's distinct sets (``PerturbationSets.of``), whose ``counts`` weight BatchNorm;
        in evaluation mode any sets (``PerturbationSets.each_once``). With ``no_perturb``
        the change is zero. The running statistics of the BatchNorms that this model
        weights are updated together at the end."""
        self.renormalise_embeddings()
        with running_statistics_together():
            return self._set_effects(sets)

    def _set_effects(self, sets: PerturbationSets):
        codes, counts = sets.sets, sets.counts
        n_sets, n_genes = codes.shape[0], self.num_genes
        if self.no_perturb:
            zeros = self.indv_b2.new_zeros(n_sets, n_genes)
            return zeros, (zeros if self.uncertainty else None)
        present = codes >= 0
        members = self.perturbation_embeddings(codes.clamp(min=0).view(-1))  # (padding reads gene 0)
        summed = (members.view(*codes.shape, -1) * present.unsqueeze(-1)).sum(1)
        if self.training and sets.padded:
            # pert_fuse's BatchNorm sees the perturbed cells only, as in the published model: the
            # sets weighted by their cells, the unperturbed set and the padding by none
            perturbed = present.any(1)
            shift = self.pert_fuse(summed, sets.counts * perturbed) * perturbed.unsqueeze(1)
        elif self.training:
            # the same; the unperturbed set, if any, sorts first
            first = sets.n_unperturbed
            shift = F.pad(self._per_set_rows(self.pert_fuse, summed, sets, perturbed_only=True), (0, 0, first, 0))
        else:  # rows are independent: fuse every set, then zero the unperturbed ones
            shift = self.pert_fuse(summed) * present.any(1, keepdim=True)

        genes = self.gene_embeddings(sets.n_cells)
        if self.training and not self.uncertainty and self.fused_decoder:
            gene_out = decode_sets(
                genes,
                shift,
                counts,
                sets.n_cells,
                self.bn_pert_base,
                self.recovery_w,
                self.indv_w1[:, :, 0],
                self.indv_b1[:, 0],
                self.bn_pert_base.synchronizing(),
                self.decoder_buffers,
            )
            logvar = None
        else:
            hidden = (genes.unsqueeze(0) + shift.unsqueeze(1)).reshape(n_sets * n_genes, -1)  # (S * G) x H
            hidden = F.relu(self.bn_pert_base(hidden, counts))  # both heads read it
            logvar = self.uncertainty_w(hidden, counts).reshape(n_sets, n_genes) if self.uncertainty else None
            decoded = self.recovery_w(hidden, counts).reshape(n_sets, n_genes, -1)
            gene_out = (decoded * self.indv_w1[:, :, 0]).sum(-1) + self.indv_b1[:, 0]
        if self.training:
            cross = self._per_set_rows(self.cross_gene_state, gene_out, sets)  # S x H
        else:
            cross = self.cross_gene_state(gene_out)
        w2 = self.indv_w2[0]
        effect = gene_out * w2[:, 0] + cross @ w2[:, 1:].T + self.indv_b2[0]
        return effect, logvar

    @staticmethod
    def _per_set_rows(mlp: MLP, rows: torch.Tensor, sets: PerturbationSets, perturbed_only: bool = False):
        """Training-mode ``mlp`` on the rows of the sets (``rows``: one per set), or of the
        perturbed sets only, with the BatchNorm statistics of their cells' rows, as the
        published model computes it: on the rows repeated for each cell, or, synchronised
        across ranks, on rows weighted by their cells. A lone row is repeated (BatchNorm's
        kernel needs two rows; the statistics are the same), as the published model repeats it."""
        first = sets.n_unperturbed if perturbed_only else 0
        if first == len(rows):
            return rows[first:]
        if mlp.synchronizing():
            return mlp(rows[first:], sets.counts[first:])
        cells, picked = (
            (sets.perturbed_cells_by_set, sets.first_perturbed_cell)
            if perturbed_only
            else (sets.cells_by_set, sets.first_cell)
        )
        return mlp.per_cell(rows, cells.expand(2) if len(cells) == 1 else cells, picked)

    def train(self, mode: bool = True) -> "GEARSModel":
        """As ``nn.Module.train``; leaving training mode frees the decoder's kept row buffers, so
        that evaluation does not hold them."""
        if not mode:
            self.decoder_buffers.release()
        return super().train(mode)

    def forward(self, x: torch.Tensor, pert_idx: torch.Tensor, sets: PerturbationSets | None = None):
        """``sets``: the batch's distinct perturbation sets, found on the host by the loaders;
        without them they are found here (on a GPU the host then waits for the device)."""
        if self.no_perturb:
            return x
        if sets is None:
            sets = PerturbationSets.of(pert_idx, self.num_perts)
        effect, logvar = self.set_effects(sets)
        prediction = effect.index_select(0, sets.cell_set) + x
        return (prediction, logvar.index_select(0, sets.cell_set)) if self.uncertainty else prediction
