"""A trained model on disk, in the published GEARS format.

A model folder holds ``config.pkl`` (the published keys: model options, graphs, sizes) and
``model.pt`` (the network's state dict), which the published package reads and writes, and
``vocabulary.json``, which records the gene and perturbation names so that loading a model
into other data fails clearly instead of silently mis-assigning genes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gears_ddp.data import io
from gears_ddp.model.network import NETWORK_OPTIONS, GEARSModel

CONFIG_FILE, WEIGHTS_FILE, VOCABULARY_FILE = "config.pkl", "model.pt", "vocabulary.json"
GRAPH_KEYS = ("G_go", "G_go_weight", "G_coexpress", "G_coexpress_weight")  # the config's graph tensors


def parameter_digest(model: nn.Module) -> str:
    """A digest of the model's parameters and buffers, the graphs' edges included (equal on
    ranks holding equal weights; different for the same weights on other graphs)."""
    digest = hashlib.blake2b(digest_size=16)
    tensors = {**model.state_dict(), **{f"buffer:{name}": buffer for name, buffer in model.named_buffers()}}
    for name, tensor in tensors.items():
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(tensor.detach().cpu().numpy()).data)
    return digest.hexdigest()


def model_from_config(config: dict) -> GEARSModel:
    """The network described by a published-format config dict (graphs included)."""
    return GEARSModel(
        config["num_genes"],
        config["num_perts"],
        config["G_coexpress"],
        config["G_coexpress_weight"],
        config["G_go"],
        config["G_go_weight"],
        **{name: config[name] for name in NETWORK_OPTIONS},
    )


def model_config(options: dict, pert_data, device, graphs: dict) -> dict:
    """The published config of a network on ``pert_data``: the model ``options``
    (``ModelOptions.as_dict``), its GO and co-expression graphs (``graphs`` holds those
    given as ``GRAPH_KEYS``; the others are built from the data with the options'
    thresholds), the device and the sizes."""
    graphs = dict(graphs)
    if graphs.get("G_coexpress") is None:
        graph = pert_data.coexpression_graph(
            options["coexpress_threshold"], options["num_similar_genes_co_express_graph"]
        )
        graphs["G_coexpress"], graphs["G_coexpress_weight"] = graph.edge_index, graph.edge_weight
    if graphs.get("G_go") is None:
        graph = pert_data.go_graph(options["num_similar_genes_go_graph"])
        graphs["G_go"], graphs["G_go_weight"] = graph.edge_index, graph.edge_weight
    return {
        **options,
        **{key: graphs.get(key) for key in GRAPH_KEYS},
        "device": str(device),
        "num_genes": len(pert_data.gene_names),
        "num_perts": len(pert_data.pert_names),
    }


def saved_model_options(path, options, gene_names, pert_names) -> dict:
    """The model options and graphs of the model folder ``path`` (its ``config.pkl``, whose
    option names must be among ``options``), once its vocabulary is checked against the
    data's ``gene_names`` and ``pert_names``."""
    config = read_config(path, [*options, *GRAPH_KEYS])
    check_vocabulary(path, config, gene_names, pert_names)
    return {key: value for key, value in config.items() if key not in ("device", "num_genes", "num_perts")}


def strip_module_prefix(state_dict: dict) -> dict:
    """Remove the ``module.`` prefix that DataParallel / DistributedDataParallel add."""
    return {(k[len("module.") :] if k.startswith("module.") else k): v for k, v in state_dict.items()}


def save_model_folder(path, config: dict, state_dict: dict, gene_names, pert_names, trained: bool = True) -> None:
    """The published model files plus the vocabularies, each written atomically; a model
    never trained nor loaded (``trained`` False: ``train(epochs=0)`` of a new model) says so
    in ``vocabulary.json``, so that, loaded again, it refuses to predict as it did here
    (``weights_origin``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    io.write_pickle({**config, "device": str(config["device"])}, path / CONFIG_FILE)
    with io.atomic_path(path / WEIGHTS_FILE) as tmp:
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, tmp)
    vocabulary: dict[str, object] = {"genes": list(gene_names), "perturbations": list(pert_names)}
    if not trained:
        vocabulary["trained"] = False
    with io.atomic_path(path / VOCABULARY_FILE) as tmp:
        tmp.write_text(json.dumps(vocabulary))


def weights_origin(path) -> str | None:
    """Where the weights of the model folder ``path`` come from, as ``GEARS.weights_from``
    holds it: the folder, or None for random initial weights saved as they were (its
    ``vocabulary.json`` says ``"trained": false``), which a model refuses to predict with."""
    saved = Path(path) / VOCABULARY_FILE
    untrained = saved.exists() and json.loads(saved.read_text(encoding="utf-8")).get("trained") is False
    return None if untrained else str(path)


def read_config(path, options=()) -> dict:
    """The ``config.pkl`` of a model folder: a dict with ``num_genes``, ``num_perts`` and
    model options, each of which must be one of ``options`` when they are given."""
    file = Path(path) / CONFIG_FILE
    config = io.read_pickle(file, "GEARS model config")
    if not isinstance(config, dict) or not {"num_genes", "num_perts"} <= set(config):
        raise ValueError(
            f"{file} is not a GEARS model config: it holds "
            + (
                f"a dict without {sorted({'num_genes', 'num_perts'} - set(config))}"
                if isinstance(config, dict)
                else f"a {type(config).__name__}, not a dict"
            )
        )
    unknown = sorted(set(config) - set(options) - {"device", "num_genes", "num_perts"}) if options else []
    if unknown:
        raise ValueError(f"{file} is not a GEARS model config: unknown option(s) {unknown}")
    return config


def read_weights(path) -> dict:
    """The state dict of a model folder (a ``module.`` prefix removed)."""
    weights = Path(path) / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in the model folder {path}")
    state = io.read_torch_file(weights, "model weights")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{weights} holds a {type(state).__name__}, not model weights (a dict of tensors)")
    return strip_module_prefix(state)


def load_weights(model: torch.nn.Module, path) -> None:
    """Load the weights of the model folder ``path`` into ``model``, refusing, with the file
    named, weights of another network (other parameter names or shapes)."""
    weights, expected = read_weights(path), model.state_dict()
    problems = [
        f"{what} {names[:5]}{' ...' if len(names) > 5 else ''}"
        for what, names in (
            ("missing", sorted(set(expected) - set(weights))),
            ("unexpected", sorted(set(weights) - set(expected))),
            (
                "of another shape",
                sorted(name for name in set(expected) & set(weights) if weights[name].shape != expected[name].shape),
            ),
        )
        if names
    ]
    if problems:
        raise ValueError(
            f"{Path(path) / WEIGHTS_FILE} does not hold the weights of the network its {CONFIG_FILE} "
            f"describes: tensors {'; '.join(problems)}"
        )
    model.load_state_dict(weights)


def read_vocabulary(path) -> dict[str, list[str]] | None:
    """The ``'genes'`` and ``'perturbations'`` of the model folder ``path`` (its
    ``vocabulary.json``); None for a folder without one (the published GEARS's)."""
    saved = Path(path) / VOCABULARY_FILE
    if not saved.exists():
        return None
    try:
        vocabulary = json.loads(saved.read_text(encoding="utf-8"))
        return {key: [str(name) for name in vocabulary[key]] for key in ("genes", "perturbations")}
    except (ValueError, KeyError, TypeError) as err:  # not JSON, not text, or other content
        raise ValueError(
            f"{saved} is not a model's vocabulary (JSON with lists 'genes' and 'perturbations'): "
            f"{type(err).__name__}: {err}"
        ) from None


def check_vocabulary(path, config: dict, gene_names, pert_names) -> None:
    """Refuse a model whose gene or perturbation vocabulary differs from the data's."""
    vocabulary = read_vocabulary(path)
    if vocabulary is not None:
        for what, theirs, ours in (
            ("gene", vocabulary["genes"], list(gene_names)),
            ("perturbation", vocabulary["perturbations"], list(pert_names)),
        ):
            if theirs != ours:
                differ = sorted(set(theirs) ^ set(ours))
                raise ValueError(
                    f"checkpoint {path} was trained on another {what} vocabulary "
                    f"({len(theirs)} vs {len(ours)} names in the data"
                    + (f"; differing: {differ[:10]}" if differ else "; same names, other order")
                    + ")"
                )
    elif (config["num_genes"], config["num_perts"]) != (len(gene_names), len(pert_names)):
        raise ValueError(
            f"checkpoint {path} has {config['num_genes']} genes and {config['num_perts']} "
            f"perturbation genes; the data has {len(gene_names)} and {len(pert_names)}"
        )
